#!/usr/bin/env python3
"""The embedding's statistics pooling: pyspk's kernel (`PlannedStatsPool`: every chunk
and speaker of a batch in one launch, FP64 sums) against the stock pool (pyannote's
TSTP over `StatsPool`: a dozen tensor passes per speaker), per batch of chunks with
three speakers' masks each, in one process on one GPU.

Method: each arm at each batch is captured as a CUDA graph of one call after an eager
warm-up; rounds replay the arms in turn, timed with CUDA events; the median over rounds
/ batch is the per-chunk time. Inputs: trunk-shaped outputs (256 x 10 x 125, rectified
N(0, 1), a quarter of the rows lifted by 8) and 0/1 masks of 589 frames, interpolated
to 125 by both arms. Errors against the same pool in float64, as max |error| / max
|truth| and norm-wise.

    PYTHONPATH=. python3 tools/pool_bench.py [--batches 32 128] [--rounds 15]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (256, 10, 125)
MASK_FRAMES = 589


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    args = parser.parse_args(argv)

    import torch
    from pyannote.audio.models.embedding.wespeaker.resnet import TSTP

    from pyspk.testing import graph_replay_ms, relative_errors, torch_graph
    from pyspk.torch.resnet import PlannedStatsPool

    stock = TSTP(in_dim=SHAPE[0] * SHAPE[1])
    planned = PlannedStatsPool(stock)
    arms = {"stock": stock, "pyspk": planned}

    def inputs(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        x = torch.relu(torch.randn(batch, *SHAPE, generator=generator))
        x[:, ::4] += 8.0
        w = (torch.rand(batch, 3, MASK_FRAMES, generator=generator) > 0.4).float()
        return x.cuda(), w.cuda()

    errors = {}
    x, w = inputs(32, seed=1)
    with torch.inference_mode():
        truth = stock(x.double(), weights=w.double()).cpu().numpy()
        for arm, call in arms.items():
            errors[arm] = relative_errors(call(x, weights=w).cpu().numpy(), truth)
    print("(max, norm-wise) relative error:", errors, flush=True)

    rows = []
    for batch in args.batches:
        x, w = inputs(batch, seed=2)
        with torch.inference_mode():
            graphs = {
                arm: torch_graph(torch, functools.partial(call, x, weights=w))[0]
                for arm, call in arms.items()
            }
        times = graph_replay_ms(torch, graphs, args.rounds)
        row: dict[str, float] = {"batch": batch}
        for arm, measured in times.items():
            row[f"{arm}_us_per_chunk"] = 1e3 * statistics.median(measured) / batch
        rows.append(row)
        print(
            f"batch {batch:4d}: "
            + ", ".join(f"{arm} {row[f'{arm}_us_per_chunk']:.2f}" for arm in times)
            + " us a chunk",
            flush=True,
        )
        del graphs, x, w
        torch.cuda.empty_cache()

    device = torch.cuda.get_device_name()
    report = {"device": device, "shape": SHAPE, "speakers": 3, "rounds": args.rounds}
    report |= {"errors": errors, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "h200-stats-pool.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# The embedding's statistics pooling: pyspk's kernel against the stock pool",
        "",
        f"`tools/pool_bench.py` on the {device}, one process; per chunk (the trunk's",
        "256 x 10 x 125 output, three speakers' masks of 589 frames), the median of",
        f"{args.rounds} interleaved graph replays / batch. Stock: pyannote's TSTP over",
        "`StatsPool`; pyspk: `PlannedStatsPool`, one launch after the masks' interpolation.",
        "",
        "| batch | stock | pyspk | speed-up |",
        "|---|---|---|---|",
    ]
    for row in rows:
        theirs, ours = row["stock_us_per_chunk"], row["pyspk_us_per_chunk"]
        lines.append(f"| {row['batch']} | {theirs:.2f} us | {ours:.2f} us | {theirs / ours:.1f}x |")
    lines += [
        "",
        "Error against the same pool in float64, 32 chunks, as max |error| / max |truth| and",
        "||error|| / ||truth||: "
        + ", ".join(f"{arm} {high:.3g} and {norm:.3g}" for arm, (high, norm) in errors.items())
        + ".",
    ]
    (args.out / "h200-stats-pool.md").write_text("\n".join(lines) + "\n")
    planned.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
