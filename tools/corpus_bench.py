"""The corpus benchmark: many files through one pipeline on one GPU, one after another
(stock and accelerated) and in corpus mode (`diarize_corpus`: files decoded ahead, two
accelerated engines taking them in turn), in one process.

    PYTHONPATH=. python3 tools/corpus_bench.py [--hours 1] [--out benchmarks]
        [--shape community-1] [--math fp32 tf32]

The corpus: synthetic conversations (`pyspk.testing.synthetic.recording`, 4 voices each,
heard by neither calibration) written as WAV files, lengths drawn like VoxConverse's
(log-normal, median 5 minutes, clipped to 30 s .. 20 min) until they add up to --hours.
The pipelines are the diarization benchmark's (`tools/diarize_bench.py`). Each arm reads
the WAV files from disk and writes RTTM files; the stock arm runs in FP32 math only (it
switches TF32 off whatever the caller asks). Each run records whether every annotation
(the RTTM text) equals the stock one. Writes <device>-corpus.md and .json into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--shape", choices=["agglomerative", "community-1"], default="community-1")
    parser.add_argument("--math", nargs="+", default=["fp32", "tf32"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-stock",
        action="store_true",
        help="leave out the stock arm; agreement is then taken against the accelerated "
        "FP32 run one file after another",
    )
    return parser.parse_args(argv)


def lengths(hours: float, seed: int) -> list[float]:
    """File lengths in seconds, drawn like VoxConverse's, adding up to `hours`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    drawn: list[float] = []
    while sum(drawn) < hours * 3600:
        drawn.append(float(np.clip(rng.lognormal(np.log(300.0), 0.8), 30.0, 1200.0)))
    drawn[-1] -= sum(drawn) - hours * 3600
    if drawn[-1] < 30.0:
        drawn.pop()
    return [round(length, 1) for length in drawn]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import soundfile
    import torch

    warnings.simplefilter("ignore")
    import pyspk.pyannote as pa
    from pyspk.pyannote.corpus import diarize_file
    from pyspk.testing.benchmark import device_slug
    from pyspk.testing.synthetic import recording
    from tools.diarize_bench import _pipelines

    device = torch.device("cuda")
    work = Path(tempfile.mkdtemp(prefix="pyspk-corpus-"))
    bench_args = argparse.Namespace(shapes=[args.shape], fit_seed=11, plda_seed=12)
    pipeline = _pipelines(bench_args, work, device)[args.shape]
    clustering = "vbx" if args.shape == "community-1" else "agglomerative"
    folder = work / "audio"
    folder.mkdir()
    drawn = lengths(args.hours, args.seed)
    for index, seconds in enumerate(drawn):
        made = recording(seconds, seed=1000 + index)
        soundfile.write(folder / f"file{index:03d}.wav", made.waveform, 16000)
    files = sorted(folder.glob("*.wav"))
    audio_seconds = sum(drawn)
    print(f"{len(files)} files, {audio_seconds / 3600:.2f} h, written", flush=True)

    def rttms(out: Path) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted(out.glob("*.rttm"))}

    def sequential(label: str) -> tuple[float, list[dict]]:
        out = work / label
        out.mkdir()
        torch.cuda.synchronize()
        started = time.perf_counter()
        entries = [diarize_file(pipeline, path, None, out) for path in files]
        return time.perf_counter() - started, entries

    runs: list[dict] = []

    def record(path: str, math: str, seconds: float, out: Path, entries: list[dict]) -> None:
        same = rttms(out) == stock_rttms
        runs.append(
            {
                "path": path,
                "math": math,
                "gpus": 1,
                "clustering": clustering,
                "audio_seconds": audio_seconds,
                "files": len(files),
                "seconds": seconds,
                "rtfx": audio_seconds / seconds,
                "identical_to_stock": same,
                "failed": sum(entry["status"] != "done" for entry in entries),
                "per_file": [
                    {k: entry.get(k) for k in ("path", "audio_seconds", "seconds", "speakers")}
                    for entry in entries
                ],
            }
        )
        print(
            f"{path} {math}: {seconds:.2f} s, {audio_seconds / seconds:.0f}x, identical to "
            f"stock {same}",
            flush=True,
        )

    warm = {"waveform": torch.from_numpy(recording(60, seed=99).waveform)[None],
            "sample_rate": 16000, "uri": "warm"}  # fmt: skip
    pipeline(warm)
    stock_rttms: dict[str, str] = {}
    if not args.no_stock:
        seconds, entries = sequential("stock")
        stock_rttms = rttms(work / "stock")
        record("stock", "fp32", seconds, work / "stock", entries)
    for math in args.math:
        with pa.accelerate_pipeline(pipeline, math):
            pipeline(warm)
            seconds, entries = sequential(f"sequential-{math}")
        if not stock_rttms:  # --no-stock: the accelerated FP32 run stands for it
            stock_rttms = rttms(work / f"sequential-{math}")
        record("sequential", math, seconds, work / f"sequential-{math}", entries)
        out = work / f"corpus-{math}"
        torch.cuda.synchronize()
        started = time.perf_counter()
        run = pa.diarize_corpus(pipeline, [folder], out, math=math, progress=None)
        seconds = time.perf_counter() - started
        manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
        record("corpus", math, seconds, out, manifest)
        runs[-1]["engines"] = 2
        runs[-1]["setup_seconds"] = run.setup_seconds
        runs[-1]["rtfx_after_setup"] = audio_seconds / (seconds - run.setup_seconds)
    slug = device_slug(torch.cuda.get_device_name())
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": torch.cuda.get_device_name(),
        "shape": args.shape,
        "lengths": drawn,
        "agreement_with": "accelerated fp32 sequential" if args.no_stock else "stock",
    }
    (args.out / f"{slug}-corpus.json").write_text(
        json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n"
    )
    table = [
        f"# Corpus benchmark: {meta['device']}",
        "",
        f"`tools/corpus_bench.py --hours {args.hours:g} --shape {args.shape}`: {len(files)} "
        f"WAV files, {audio_seconds / 3600:.2f} h (lengths {min(drawn):.0f} to "
        f"{max(drawn):.0f} s, median {sorted(drawn)[len(drawn) // 2]:.0f} s), read from "
        "disk, RTTM files written; one process, one GPU. Corpus mode: `diarize_corpus`, "
        "two engines, files decoded ahead.",
        "",
        "| path | math | seconds | x real time | of it, setup (s) | x real time after setup "
        f"| identical to {'the accelerated FP32 run' if args.no_stock else 'stock'} | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        table.append(
            f"| {run['path']} | {run['math']} | {run['seconds']:.2f} | {run['rtfx']:.0f} | "
            f"{run.get('setup_seconds', 0.0):.2f} | "
            f"{run.get('rtfx_after_setup', run['rtfx']):.0f} | "
            f"{'yes' if run['identical_to_stock'] else 'no'} | {run['failed']} |"
        )
    (args.out / f"{slug}-corpus.md").write_text("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
