#!/usr/bin/env python3
"""The LSTM's benchmark of record: segmentation-3.0's LSTM (input 60, hidden 128, four
bidirectional layers, 589 steps a chunk; PyTorch's default initialization, seeded) on
pyspk's recurrence plans (`PlannedLSTM`: each layer's input projection one TF32 GEMM,
then the plan) against cuDNN through PyTorch in FP32 and TF32 math, per batch of chunks,
in one process on one GPU.

Method: every arm at every batch is captured as a CUDA graph of one forward after an
eager warm-up; rounds replay the arms in turn (interleaved), timed with CUDA events; the
median over rounds / batch is the per-chunk time. "recurrence" is the plans alone on
precomputed projections. Errors: four chunks of random N(0, 1) inputs against float64
truth (`pyspk.reference.bilstm`), as max |error| / max |truth| and norm-wise.

    PYTHONPATH=. python3 tools/lstm_bench.py [--batches 128 512 2048] [--rounds 15]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = 589


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    args = parser.parse_args(argv)

    import torch

    from pyspk.cuda import CudaMath
    from pyspk.testing import graph_replay_ms, lstm_truth, relative_errors, torch_graph
    from pyspk.torch import library_math
    from pyspk.torch.lstm import PlannedLSTM

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(60, 128, 4, batch_first=True, bidirectional=True).cuda().eval()
    planned = PlannedLSTM(lstm)
    maths = {
        "cudnn_fp32": CudaMath.FP32,
        "cudnn_tf32": CudaMath.TF32,
        "pyspk": CudaMath.TF32,
        "pyspk_fp32": CudaMath.FP32,  # the projections in FP32 math
    }
    sample = torch.randn(4, STEPS, 60, generator=torch.Generator().manual_seed(1)).cuda()
    truth = lstm_truth(lstm, sample)  # once: float64 over all the steps takes seconds
    errors = {}
    with torch.inference_mode():
        for arm, math in maths.items():
            with library_math(math):
                y = (planned if arm.startswith("pyspk") else lstm)(sample)[0]
            errors[arm] = relative_errors(y.cpu().numpy(), truth)
    print("(max, norm-wise) relative error:", errors, flush=True)

    rows = []
    for batch in args.batches:
        x = torch.randn(batch, STEPS, 60, device="cuda")
        graphs = {}
        with torch.inference_mode():
            for arm, math in maths.items():
                with library_math(math):
                    module = planned if arm.startswith("pyspk") else lstm
                    graphs[arm] = torch_graph(torch, functools.partial(module, x))[0]
            # the plans alone, on each layer's projections made once
            gxs = [torch.randn(batch, STEPS, 1024, device="cuda") for _ in planned._plans]
            ys = [torch.empty(batch, STEPS, 256, device="cuda") for _ in planned._plans]

            def recurrence(gxs: list = gxs, ys: list = ys, batch: int = batch) -> None:
                stream = torch.cuda.current_stream().cuda_stream
                for plan, gx, y in zip(planned._plans, gxs, ys, strict=True):
                    plan.enqueue(gx, y, items=batch, steps=STEPS, stream=stream)

            graphs["recurrence"] = torch_graph(torch, recurrence)[0]
        times = graph_replay_ms(torch, graphs, args.rounds)
        row = {
            "batch": batch,
            **{f"{arm}_ms_per_chunk": statistics.median(t) / batch for arm, t in times.items()},
        }
        rows.append(row)
        print(
            f"batch {batch:5d}: "
            + ", ".join(f"{arm} {row[f'{arm}_ms_per_chunk']:.4f}" for arm in times)
            + " ms a chunk",
            flush=True,
        )
        del graphs, gxs, ys, x
        torch.cuda.empty_cache()

    device = torch.cuda.get_device_name()
    report = {
        "device": device,
        "steps": STEPS,
        "layers": 4,
        "hidden": 128,
        "input": 60,
        "rounds": args.rounds,
        "errors": errors,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "h200-lstm.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# segmentation-3.0's LSTM: pyspk's recurrence plans against cuDNN",
        "",
        f"`tools/lstm_bench.py` on the {device}, one process; per chunk of 589 steps, the",
        f"median of {args.rounds} interleaved graph replays / batch. `pyspk` is the whole",
        "`PlannedLSTM` (each layer's projection a TF32 GEMM, then the plan), `pyspk FP32`",
        "the same with the projections in FP32 math; `recurrence` the plans alone.",
        "",
        "| batch | cuDNN FP32 | cuDNN TF32 | pyspk | pyspk FP32 | recurrence |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['batch']} | {row['cudnn_fp32_ms_per_chunk']:.4f} ms "
            f"| {row['cudnn_tf32_ms_per_chunk']:.4f} ms | {row['pyspk_ms_per_chunk']:.4f} ms "
            f"| {row['pyspk_fp32_ms_per_chunk']:.4f} ms | {row['recurrence_ms_per_chunk']:.4f} ms |"
        )
    lines += [
        "",
        "Error against float64 (`pyspk.reference.bilstm`), four chunks of N(0, 1) inputs,",
        "as max |error| / max |truth| and ||error|| / ||truth||: "
        + ", ".join(f"{arm} {high:.3g} and {norm:.3g}" for arm, (high, norm) in errors.items())
        + ".",
    ]
    (args.out / "h200-lstm.md").write_text("\n".join(lines) + "\n")
    planned.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
