#!/usr/bin/env python3
"""SincNet's first stage: pyspk's fused kernels (`PlannedSincFront`: the sinc
convolution, |y| and MaxPool1d(3, 3) in one launch, the filters made once; in FP32 math
FP32 fused multiply-adds, in TF32 math FP16 tensor-core products of split operands)
against the stock stage through PyTorch (asteroid's `Encoder` over segmentation-3.0's
`ParamSincFB`, which remakes the filters at every call, then `torch.abs` and the pool;
cuDNN), per batch of 10 s chunks, in one process on one GPU.

Method: each arm at each batch is captured as a CUDA graph of one forward after an
eager warm-up; rounds replay the arms in turn, timed with CUDA events; the median over
rounds / batch is the per-chunk time. The stock arm runs in FP32 and in TF32 math.
Errors: three chunks of N(0, 1) samples against float64 (`pyspk.reference.sinc_front`),
as max |error| / max |truth| and norm-wise.

    PYTHONPATH=. python3 tools/sinc_bench.py [--batches 32 128 512] [--rounds 15]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = 160000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    args = parser.parse_args(argv)

    import torch
    from asteroid_filterbanks import Encoder, ParamSincFB

    from pyspk import reference
    from pyspk.cuda import CudaMath
    from pyspk.testing import graph_replay_ms, relative_errors, torch_graph
    from pyspk.testing.benchmark import device_slug
    from pyspk.torch import library_math
    from pyspk.torch.sincnet import PlannedSincFront

    torch.manual_seed(0)
    encoder = Encoder(ParamSincFB(80, 251, stride=10, min_low_hz=50, min_band_hz=50)).cuda()
    pool = torch.nn.MaxPool1d(3, stride=3)
    front = PlannedSincFront(encoder, pool)
    front_tf32 = PlannedSincFront(encoder, pool, CudaMath.TF32)

    def stock(x: torch.Tensor) -> torch.Tensor:
        return pool(torch.abs(encoder(x)))

    arms: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], CudaMath]] = {
        "stock_fp32": (stock, CudaMath.FP32),
        "stock_tf32": (stock, CudaMath.TF32),
        "pyspk": (front, CudaMath.TF32),
        "pyspk_tf32": (front_tf32, CudaMath.TF32),
    }
    sample = torch.randn(3, 1, SAMPLES, generator=torch.Generator().manual_seed(1)).cuda()
    filters = encoder.get_filters().detach().reshape(80, 251).cpu().numpy()
    truth = reference.sinc_front(sample[:, 0].cpu().numpy(), filters)
    errors = {}
    with torch.inference_mode():
        for arm, (call, math) in arms.items():
            with library_math(math):
                errors[arm] = relative_errors(call(sample).cpu().numpy(), truth)
    print("(max, norm-wise) relative error:", errors, flush=True)

    rows = []
    for batch in args.batches:
        x = torch.randn(batch, 1, SAMPLES, device="cuda")
        graphs = {}
        with torch.inference_mode():
            for arm, (call, math) in arms.items():
                with library_math(math):
                    graphs[arm] = torch_graph(torch, functools.partial(call, x))[0]
        times = graph_replay_ms(torch, graphs, args.rounds)
        row: dict[str, float | bool] = {"batch": batch}
        for arm, measured in times.items():
            row[f"{arm}_us_per_chunk"] = 1e3 * statistics.median(measured) / batch
        with torch.inference_mode(), library_math(CudaMath.FP32):
            row["bits_equal_stock_fp32"] = bool(torch.equal(front(x), stock(x)))
        rows.append(row)
        print(
            f"batch {batch:4d}: "
            + ", ".join(f"{arm} {row[f'{arm}_us_per_chunk']:.2f}" for arm in times)
            + f" us a chunk; bits equal to stock FP32: {row['bits_equal_stock_fp32']}",
            flush=True,
        )
        del graphs, x
        torch.cuda.empty_cache()

    device = torch.cuda.get_device_name()
    report = {"device": device, "samples": SAMPLES, "rounds": args.rounds}
    report |= {"errors": errors, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{device_slug(device)}-sincnet"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# SincNet's first stage: pyspk's fused kernel against the stock stage",
        "",
        f"`tools/sinc_bench.py` on the {device}, one process; per 10 s chunk, the median of",
        f"{args.rounds} interleaved graph replays / batch. Stock: asteroid's Encoder (the",
        "filters remade each call), `torch.abs`, MaxPool1d(3, 3); pyspk: one launch.",
        "",
        "| batch | stock FP32 | stock TF32 | pyspk FP32 | pyspk TF32 | FP32: x stock FP32 |"
        " TF32: x stock TF32 | pyspk FP32 bits = stock FP32 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        fp32, tf32, ours, ours_tf32 = (row[f"{arm}_us_per_chunk"] for arm in arms)
        cells = [f"{value:.2f} us" for value in (fp32, tf32, ours, ours_tf32)]
        same = "yes" if row["bits_equal_stock_fp32"] else "no"
        lines.append(
            f"| {row['batch']} | {' | '.join(cells)} | {fp32 / ours:.2f}x | "
            f"{tf32 / ours_tf32:.2f}x | {same} |"
        )
    lines += [
        "",
        "Error against float64 (`pyspk.reference.sinc_front`), three chunks of N(0, 1)",
        "samples, as max |error| / max |truth| and ||error|| / ||truth||: "
        + ", ".join(f"{arm} {high:.3g} and {norm:.3g}" for arm, (high, norm) in errors.items())
        + ".",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    front.close()
    front_tf32.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
