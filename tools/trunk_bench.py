#!/usr/bin/env python3
"""The trunk's benchmark of record: WeSpeaker ResNet34's trunk (`resnet.forward_frames`)
at batch 32 chunks on pyspk's trunk plans against the library (cuDNN through PyTorch,
the stock module with its BatchNorms) in FP32 and TF32 math, and optionally against
`torch.compile` (FP32, default mode), in one process on one GPU. Where the device loads
a trunk tier above sm80 (sm90's wgmma strips on an H100 or H200), the sm80 tier's plans
run as arms of their own beside it; on the sm90 tier, so do plans in both maths with the
strips of layers 2 to 4 in the form the default plans do not run (strips or halves), with
layer1's middle activations in FP32 where the default plans keep them in 16 bits ("fp32
middles"), in TF32 math with layer1's residual stream in the form the default plans do
not keep it (FP16 planes, "stream16", or FP32, "stream32"), and where
the strips stage by the async copy engine, arms with them staged by the threads' copies
("threads' copies") too.

Method: every arm is captured as a CUDA graph of `--repeats` forwards after an eager
warm-up; rounds replay the arms in turn (interleaved), timed with CUDA events; the
median per forward / 32 is the per-chunk time. Errors: the first two chunks of the same
input against float64 truth (`pyspk.reference.trunk` on the folded weights), as
max |error| / max |truth| and the norm-wise relative error; the plans' graph replay is
checked bit for bit against their eager output.

    PYTHONPATH=. python3 tools/trunk_bench.py [--rounds 15] [--compile] [--out benchmarks]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any


def randomize_norms(torch: Any, resnet: Any, seed: int) -> None:
    """Random running statistics and affine parameters, so the fold is not trivial."""
    generator = torch.Generator().manual_seed(seed)
    for module in resnet.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            n = module.num_features
            module.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
            module.weight.data.copy_(torch.rand(n, generator=generator) + 0.5)
            module.bias.data.copy_(torch.randn(n, generator=generator) * 0.1)


def errors(np: Any, output: Any, truth: Any) -> dict[str, float]:
    got = output.detach().to("cpu").double().numpy()
    diff = got - truth
    return {
        "max_abs_over_max": float(np.abs(diff).max() / np.abs(truth).max()),
        "rel_l2": float(np.linalg.norm(diff) / np.linalg.norm(truth)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=4, help="forwards per graph")
    parser.add_argument("--compile", action="store_true", help="add torch.compile (FP32)")
    parser.add_argument("--out", type=Path, default=None, help="write <device>-trunk.md/json")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
    warnings.simplefilter("ignore")
    import numpy as np
    import torch

    import pyspk.pyannote as pa
    from pyspk import reference
    from pyspk.candidate.trunk import TRUNK_BATCH, trunk_macs
    from pyspk.cuda import CudaMath, CudaRuntime, KernelModule, PtxTier
    from pyspk.testing import graph_replay_ms, torch_graph
    from pyspk.testing.benchmark import device_slug
    from pyspk.torch import library_math
    from pyspk.torch.resnet import PlannedTrunk, trunk_weights

    torch.manual_seed(0)
    model = pa.wespeaker_resnet34(seed=1).cuda()
    resnet = model.resnet
    randomize_norms(torch, resnet, seed=2)
    fbank = torch.randn(TRUNK_BATCH, 998, 80, device="cuda") * 2.0
    t0 = time.perf_counter()
    truth = reference.trunk(fbank[:2].cpu().numpy(), trunk_weights(resnet))
    print(f"float64 truth of 2 chunks: {time.perf_counter() - t0:.1f} s", flush=True)

    arms: dict[str, tuple[CudaMath, Any]] = {}
    own = {math: PlannedTrunk(resnet, math) for math in CudaMath}
    tier = own[CudaMath.FP32].plan.tier
    sm80 = None
    if tier > PtxTier.SM80:  # the device's own tier beside sm80's, each named
        sm80 = CudaRuntime(torch.cuda.current_device(), ptx_tier=PtxTier.SM80)
        sm80.load_kernels(KernelModule.TRUNK)
        planned = {f"pyspk {math} {tier}": plan for math, plan in own.items()}
        if tier is PtxTier.SM90:  # the strips of layers 2 to 4 in the other form
            for math in CudaMath:
                halves = not own[math].plan.halves
                name = f"pyspk {math} {tier} {'halves' if halves else 'strips'}"
                planned[name] = PlannedTrunk(resnet, math, halves=halves)
        if own[CudaMath.TF32].plan.middles:  # layer1's residual stream in the other form
            stream16 = not own[CudaMath.TF32].plan.stream16
            name = f"pyspk tf32 {tier} {'stream16' if stream16 else 'stream32'}"
            planned[name] = PlannedTrunk(resnet, CudaMath.TF32, stream16=stream16)
        if own[CudaMath.FP32].plan.middles:  # layer1's middle activations in FP32 too
            for math in CudaMath:
                planned[f"pyspk {math} {tier} fp32 middles"] = PlannedTrunk(
                    resnet, math, middles=False
                )
        if own[CudaMath.FP32].plans[0].strips_by_tma:  # the strips' copies both ways
            for math in CudaMath:
                threads = PlannedTrunk(resnet, math)
                for plan in threads.plans:
                    plan.stage_strips_by_tma(False)
                planned[f"pyspk {math} {tier} threads' copies"] = threads
        planned.update(
            {f"pyspk {math} sm80": PlannedTrunk(resnet, math, runtime=sm80) for math in CudaMath}
        )
    else:
        planned = {f"pyspk {math}": plan for math, plan in own.items()}
    stock = type(resnet).forward_frames.__get__(resnet)
    arms["cudnn fp32"] = (CudaMath.FP32, stock)
    arms["cudnn tf32"] = (CudaMath.TF32, stock)
    for name, plan in planned.items():
        arms[name] = (plan.math, plan)
    if args.compile:
        t0 = time.perf_counter()
        compiled = torch.compile(stock)
        with torch.inference_mode(), library_math(CudaMath.FP32):
            compiled(fbank)
        torch.cuda.synchronize()
        print(f"torch.compile: {time.perf_counter() - t0:.1f} s to compile", flush=True)
        arms["torch.compile fp32"] = (CudaMath.FP32, compiled)

    results: dict[str, dict[str, Any]] = {}
    graphs = {}
    with torch.inference_mode():
        for name, (math, forward) in arms.items():
            with library_math(math):
                eager = forward(fbank)
                torch.cuda.synchronize()
                results[name] = {"math": str(math), **errors(np, eager[:2], truth)}
                graph, out = torch_graph(
                    torch, lambda f=forward: [f(fbank) for _ in range(args.repeats)]
                )
                graph.replay()
                torch.cuda.synchronize()
                results[name]["replay_bits_equal"] = bool(torch.equal(out[-1], eager))
                graphs[name] = graph
            print(f"{name}: {results[name]}", flush=True)
        for _ in range(2):
            for graph in graphs.values():
                graph.replay()
        times = {
            name: [ms / args.repeats / TRUNK_BATCH for ms in measured]
            for name, measured in graph_replay_ms(torch, graphs, args.rounds).items()
        }
    flop = 2 * trunk_macs()
    for name in arms:
        per_chunk = statistics.median(times[name])
        results[name]["ms_per_chunk"] = per_chunk
        results[name]["tflops"] = flop / (per_chunk * 1e-3) / 1e12
    for name in arms:
        if name.startswith("pyspk"):
            library = results[f"cudnn {results[name]['math']}"]
            results[name]["speedup_vs_cudnn_same_math"] = (
                library["ms_per_chunk"] / results[name]["ms_per_chunk"]
            )
            results[name]["speedup_vs_cudnn_fp32"] = (
                results["cudnn fp32"]["ms_per_chunk"] / results[name]["ms_per_chunk"]
            )

    device = torch.cuda.get_device_name()
    lines = [
        f"# The ResNet34 trunk at batch 32 on {device}",
        "",
        f"`tools/trunk_bench.py`: {args.rounds} interleaved rounds, each arm a CUDA graph of "
        f"{args.repeats} forwards of 32 chunks (fbank 998 x 80); median per chunk; "
        f"{flop / 1e9:.1f} GFLOP per chunk. Errors on the first two chunks against float64 "
        "(`pyspk.reference.trunk`): max |error| / max |truth| and norm-wise relative. "
        f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}.",
        "",
        "| arm | ms per chunk | TFLOP/s | x cuDNN same math | x cuDNN FP32 | max err / max "
        "| rel l2 | replay bits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        same = row.get("speedup_vs_cudnn_same_math")
        fp32 = row.get("speedup_vs_cudnn_fp32")
        lines.append(
            f"| {name} | {row['ms_per_chunk']:.3f} | {row['tflops']:.1f} | "
            f"{'' if same is None else f'{same:.2f}x'} | "
            f"{'' if fp32 is None else f'{fp32:.2f}x'} | "
            f"{row['max_abs_over_max']:.2e} | {row['rel_l2']:.2e} | {row['replay_bits_equal']} |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"{device_slug(device)}-trunk"
        (args.out / f"{stem}.md").write_text(report)
        (args.out / f"{stem}.json").write_text(
            json.dumps({"device": device, "arms": results}, indent=2) + "\n"
        )
    for plan in planned.values():
        plan.close()
    if sm80 is not None:
        sm80.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
