"""Where the accelerated pipeline's GPU time goes: one synthetic recording through the
agglomerative pipeline under `accelerate_pipeline`, its kernels traced by PyTorch's
profiler (CUPTI, which also sees the driver-API launches and the kernels of CUDA-graph
replays), summed per kernel name and per family.

    PYTHONPATH=. python3 tools/gpu_profile.py [--length 600] [--math fp32 tf32]
        [--segmentation-batch 128 512] [--out FILE]

The GPU part of a run is the same in both pipeline shapes (they differ after the
embeddings), so one shape is traced. The trace adds host overhead, so its wall time is
not a benchmark figure; the kernels' own durations are what it reports. "busy" is the
union of the kernels' intervals: the two streams overlap, so the per-kernel sums exceed it;
a family's time alone (no other family's kernel running) is what it adds to the busy time.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import time
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")

FAMILIES = [
    ("pyspk fbank, pool", r"spk_trunk_(fbank|log_mel|mel_centre|stats_pool)"),
    ("trunk", r"spk_trunk"),
    ("pyspk lstm", r"spk_lstm"),
    ("pyspk sincnet", r"spk_sinc"),
    ("pyspk cluster", r"spk_linkage|spk_pdist"),
    ("pyspk segdense", r"spk_"),
    ("cudnn lstm", r"(?i)lstm|rnn|elemWise|persist"),
    ("normalization", r"(?i)bn_fw|batch_norm|instance_norm"),
    ("fft", r"(?i)fft|regular_fft|vector_fft"),
    ("gemm", r"(?i)gemm|sgemm|cutlass|xmma|ampere|sm90|nvjet"),
    ("convolution", r"(?i)conv|implicit|winograd|cudnn"),
    ("reduction", r"(?i)reduce|norm|softmax"),
    ("elementwise/copy", r"(?i)elementwise|vectorized|copy|fill|memcpy|memset|index|cat"),
]


def family(name: str) -> str:
    for label, pattern in FAMILIES:
        if re.search(pattern, name):
            return label
    return "other"


def kernel_intervals(prof: object) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every device kernel the profiler saw."""
    import torch

    found = []
    for event in prof.events():  # type: ignore[attr-defined]
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        found.append((event.name, event.time_range.start, event.time_range.end))
    return found


def busy(intervals: list[tuple[str, float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for _, start, end in sorted(intervals, key=lambda item: item[1]):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def alone(intervals: list[tuple[str, float, float]]) -> dict[str, float]:
    """Per family, the µs in which its kernels ran and no other family's did: what the
    family adds to the busy time, where the "sum" counts time shared with the other
    stream's kernels too."""
    edges: list[tuple[float, int, str]] = []
    for name, start, end in intervals:
        edges += [(start, 1, family(name)), (end, -1, family(name))]
    edges.sort(key=lambda edge: (edge[0], edge[1]))
    running: dict[str, int] = defaultdict(int)
    found: dict[str, float] = defaultdict(float)
    last = 0.0
    for time_us, change, label in edges:
        active = [name for name, count in running.items() if count > 0]
        if len(active) == 1:
            found[active[0]] += time_us - last
        running[label] += change
        last = time_us
    return found


def launch_shapes(prof: object) -> dict[str, str]:
    """Each kernel's grid and block as the trace records them (the first launch's)."""
    import json
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)  # type: ignore[attr-defined]
        events = json.loads(Path(trace.name).read_text()).get("traceEvents", [])
    shapes: dict[str, str] = {}
    for event in events:
        fields = event.get("args", {})
        if event.get("cat") == "kernel" and "grid" in fields:
            shapes.setdefault(event["name"], f"grid {fields['grid']} block {fields.get('block')}")
    return shapes


def report(
    label: str,
    intervals: list[tuple[str, float, float]],
    top: int,
    shapes: dict[str, str] | None = None,
) -> list[str]:
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    per_family: dict[str, float] = defaultdict(float)
    for name, start, end in intervals:
        per_name[name][0] += end - start
        per_name[name][1] += 1
        per_family[family(name)] += end - start
    total = sum(value[0] for value in per_name.values())
    lines = [
        f"## {label}",
        f"kernels {len(intervals)}, their sum {total / 1e3:.1f} ms, "
        f"the GPU busy (union) {busy(intervals) / 1e3:.1f} ms",
        "",
        "family: ms (share of the sum), ms with no other family's kernel running",
    ]
    solo = alone(intervals)
    for name, value in sorted(per_family.items(), key=lambda item: -item[1]):
        lines.append(
            f"  {name:18s} {value / 1e3:9.1f}  ({value / total:6.1%})  {solo[name] / 1e3:9.1f}"
        )
    lines += ["", f"top {top} kernels: ms, launches, name (launch shape)"]
    for name, (value, count) in sorted(per_name.items(), key=lambda item: -item[1][0])[:top]:
        shape = f"  ({shapes[name]})" if shapes and name in shapes else ""
        lines.append(f"  {value / 1e3:9.1f} {int(count):7d}  {name[:100]}{shape}")
    return [*lines, ""]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=float, default=600)
    parser.add_argument("--math", nargs="+", default=["fp32", "tf32"])
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--segmentation-batch",
        type=int,
        nargs="+",
        default=[None],
        help="chunks a segmentation forward, one traced run each (default: the engine's)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    warnings.simplefilter("ignore")
    import pyspk.pyannote as pa
    from pyspk.cuda import CudaMath
    from pyspk.pyannote import offline
    from pyspk.testing.synthetic import recording

    device = torch.device("cuda")
    fit = recording(400, seed=11)
    segmentation = offline.segmentation_3_0(seed=0, fit_to=fit, device=device)
    embedding = offline.wespeaker_resnet34(seed=1)
    pipeline = offline.offline_pipeline(segmentation, embedding).to(device)
    file = recording(args.length, seed=0).as_file("profiled")
    warm_file = recording(60, seed=100).as_file("warm")
    lines = [f"# GPU kernels of one {args.length:g} s recording, accelerated, agglomerative", ""]
    for name, batch in itertools.product(args.math, args.segmentation_batch):
        math = CudaMath.parse(name)
        acceleration = pa.accelerate_pipeline(pipeline, math, segmentation_batch=batch)
        pipeline(warm_file)
        pipeline(file)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            output = pipeline(file)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - started
        run = acceleration.engine.last_run
        assert run is not None
        label = (
            f"{math}, segmentation batch {acceleration.engine.segmentation_batch}: "
            f"traced run {seconds:.2f} s, engine steps "
            + ", ".join(f"{key} {value:.3f}" for key, value in run.steps.items())
            + f"; speakers {len(output.speaker_diarization.labels())}"
        )
        lines += report(label, kernel_intervals(prof), args.top, launch_shapes(prof))
        print("\n".join(lines[-args.top - 20 :]), flush=True)
        acceleration.undo()
    text = "\n".join(lines)
    if args.out is not None:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
