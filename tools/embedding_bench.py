#!/usr/bin/env python3
"""The embedding's stages around the trunk: pyspk's kernels against the stock operations,
per batch of 10 s chunks, in one process on one GPU.
- fbank: `PlannedFbank` (three launches around cuFFT's real FFT) against `Fbank`
  (WeSpeaker's fbank as tensor operations, its bits); inputs N(0, 0.1) noise with a
  tone and a near-silent stretch;
- pool: `PlannedStatsPool` (every chunk and speaker in one launch, FP64 sums) against
  pyannote's TSTP over `StatsPool` (a dozen passes per speaker); inputs trunk-shaped
  outputs (256 x 10 x 125, rectified N(0, 1), a quarter of the rows lifted by 8) and
  three speakers' 0/1 masks of 589 frames, interpolated to 125 by both arms.

Method: each arm at each batch is captured as a CUDA graph of one call after an eager
warm-up; rounds replay the arms in turn, timed with CUDA events; the median over rounds
/ batch is the per-chunk time. Errors against float64 (`pyspk.reference.kaldi_fbank`;
the pool in float64), as max |error| / max |truth| and norm-wise.

    PYTHONPATH=. python3 tools/embedding_bench.py [--batches 32 128] [--rounds 15]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = 160_000
SHAPE = (256, 10, 125)
MASK_FRAMES = 589


def stages(torch: Any) -> dict[str, dict[str, Any]]:
    """Per stage: its two arms, a maker of its inputs (batch, seed) -> args, and its
    float64 truth of those args."""
    from pyannote.audio.models.embedding.wespeaker.resnet import TSTP

    from pyspk import reference
    from pyspk.pyannote.fbank import Fbank, PlannedFbank
    from pyspk.pyannote.offline import wespeaker_resnet34
    from pyspk.torch.resnet import PlannedStatsPool

    model = wespeaker_resnet34(seed=1).cuda()
    fbank = Fbank(model, torch.device("cuda"))
    pool = TSTP(in_dim=SHAPE[0] * SHAPE[1])

    def audio(batch: int, seed: int) -> tuple:
        generator = torch.Generator().manual_seed(seed)
        x = 0.1 * torch.randn(batch, 1, SAMPLES, generator=generator)
        x += 0.3 * torch.sin(2 * torch.pi * 440 * torch.arange(SAMPLES) / 16000)
        x[:, :, SAMPLES // 3 : SAMPLES // 2] *= 1e-3
        return (x.cuda(),)

    def trunk_outputs(batch: int, seed: int) -> tuple:
        generator = torch.Generator().manual_seed(seed)
        x = torch.relu(torch.randn(batch, *SHAPE, generator=generator))
        x[:, ::4] += 8.0
        w = (torch.rand(batch, 3, MASK_FRAMES, generator=generator) > 0.4).float()
        return x.cuda(), w.cuda()

    return {
        "fbank": {
            "arms": {"stock": fbank, "pyspk": PlannedFbank(model, torch.device("cuda"))},
            "inputs": audio,
            "truth": lambda x: reference.kaldi_fbank(
                x[:, 0].cpu().numpy(), fbank.window[0].cpu().numpy(), fbank.banks.cpu().numpy()
            ),
        },
        "pool": {
            "arms": {"stock": pool, "pyspk": PlannedStatsPool(pool)},
            "inputs": trunk_outputs,
            "truth": lambda x, w: pool(x.double(), w.double()).cpu().numpy(),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    args = parser.parse_args(argv)

    import torch

    from pyspk.testing import graph_replay_ms, relative_errors, torch_graph

    warnings.simplefilter("ignore")  # pyannote's notices about optional decoders
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "rounds": args.rounds}
    with torch.inference_mode():
        measured = stages(torch)
        for name, stage in measured.items():
            arms: dict[str, Callable] = stage["arms"]
            sample = stage["inputs"](4, 1)
            truth = stage["truth"](*sample)
            errors = {
                arm: relative_errors(call(*sample).cpu().numpy(), truth)
                for arm, call in arms.items()
            }
            print(f"{name} (max, norm-wise) relative error:", errors, flush=True)
            rows = []
            for batch in args.batches:
                inputs = stage["inputs"](batch, 2)
                graphs = {
                    arm: torch_graph(torch, functools.partial(call, *inputs))[0]
                    for arm, call in arms.items()
                }
                times = graph_replay_ms(torch, graphs, args.rounds)
                row = {"batch": batch} | {
                    f"{arm}_us_per_chunk": 1e3 * statistics.median(ms) / batch
                    for arm, ms in times.items()
                }
                rows.append(row)
                print(
                    f"{name} batch {batch:4d}: "
                    + ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "batch"),
                    flush=True,
                )
                del graphs, inputs
                torch.cuda.empty_cache()
            report[name] = {"errors": errors, "rows": rows}
            arms["pyspk"].close()

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "h200-embedding-stages.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# The embedding's fbank and statistics pooling: pyspk's kernels against stock",
        "",
        f"`tools/embedding_bench.py` on the {report['device']}, one process; per 10 s chunk,",
        f"the median of {args.rounds} interleaved graph replays / batch (the inputs: the",
        "tool's docstring).",
        "Stock: `Fbank` (WeSpeaker's fbank as tensor operations) and pyannote's TSTP over",
        "`StatsPool`; pyspk: `PlannedFbank` and `PlannedStatsPool`.",
        "",
        "| stage | batch | stock | pyspk | speed-up |",
        "|---|---|---|---|---|",
    ]
    for name in measured:
        for row in report[name]["rows"]:
            theirs, ours = row["stock_us_per_chunk"], row["pyspk_us_per_chunk"]
            cells = f"{theirs:.2f} us | {ours:.2f} us | {theirs / ours:.1f}x"
            lines.append(f"| {name} | {row['batch']} | {cells} |")
    lines += [
        "",
        "Error against float64, 4 chunks, as max |error| / max |truth| and ||error|| / ||truth||:",
    ]
    for name in measured:
        errors = report[name]["errors"]
        lines.append(
            f"- {name}: "
            + ", ".join(f"{arm} {high:.3g} and {norm:.3g}" for arm, (high, norm) in errors.items())
        )
    (args.out / "h200-embedding-stages.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
