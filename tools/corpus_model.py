"""A model of corpus mode on one GPU: how busy engines that alternate GPU work and host
work keep the GPU, with their files side by side on it or in turns. It predicts; the
corpus benchmark (`tools/corpus_bench.py`) measures.

    python3 tools/corpus_model.py --gpu-per-hour 1.03 --host-per-hour 0.52 \\
        [--host-per-file 0.0136] [--engines 2] [--corpus benchmarks/h200-corpus.json]

Each file takes gpu_per_hour x its hours of GPU work, then host_per_hour x its hours plus
host_per_file on the host; the first free engine takes the longest file left. Side by
side, the files in their GPU work share the GPU equally (processor sharing); in turns,
the file queued first has it all (first come, first served). The lengths are the corpus
benchmark's (its JSON's `meta.lengths`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class _File:
    gpu: float  # seconds of GPU work left
    host: float  # seconds of host work after it
    queued: float  # when its GPU work was queued


def makespan(gpu: Sequence[float], host: Sequence[float], engines: int, turns: bool) -> float:
    """Seconds until the last file's host work ends; files given longest first (`gpu`
    and `host` per file, in the order engines take them)."""
    waiting = list(zip(gpu, host, strict=True))
    running: list[_File | None] = [None] * engines
    now = 0.0
    while True:
        for engine, file in enumerate(running):
            if file is None and waiting:
                work, after = waiting.pop(0)
                running[engine] = _File(work, after, now)
        files = [file for file in running if file is not None]
        if not files:
            return now
        on_gpu = [file for file in files if file.gpu > 0]
        served = on_gpu[:0]
        if on_gpu:
            served = [min(on_gpu, key=lambda f: f.queued)] if turns else on_gpu
        share = 1.0 / len(served) if served else 0.0
        # the next event: a served file's GPU work or a file's host work ends
        steps = [file.gpu / share for file in served]
        steps += [file.host for file in files if file.gpu <= 0]
        step = min(steps)
        now += step
        for engine, file in enumerate(running):
            if file is None:
                continue
            if file.gpu > 0:
                if file in served:
                    file.gpu = max(0.0, file.gpu - step * share)
            else:
                file.host -= step
                if file.host <= 1e-12:
                    running[engine] = None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-per-hour", type=float, required=True)
    parser.add_argument("--host-per-hour", type=float, required=True)
    parser.add_argument("--host-per-file", type=float, default=0.0)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--corpus", type=Path, default=ROOT / "benchmarks" / "h200-corpus.json")
    args = parser.parse_args(argv)
    lengths = sorted(json.loads(args.corpus.read_text())["meta"]["lengths"], reverse=True)
    gpu = [args.gpu_per_hour * seconds / 3600 for seconds in lengths]
    host = [args.host_per_hour * seconds / 3600 + args.host_per_file for seconds in lengths]
    audio = sum(lengths)
    print(
        f"{len(lengths)} files, {audio / 3600:.2f} h: GPU work {sum(gpu):.2f} s, host work "
        f"{sum(host):.2f} s, {args.engines} engines"
    )
    for turns in (False, True):
        seconds = makespan(gpu, host, args.engines, turns)
        print(
            f"{'in turns' if turns else 'side by side'}: {seconds:.2f} s, "
            f"{audio / seconds:.0f}x real time, GPU busy {sum(gpu) / seconds:.1%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
