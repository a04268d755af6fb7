#!/usr/bin/env python3
"""Per-kernel durations of the trunk under ncu, for each PTX tier the device runs.

    PYTHONPATH=. python3 tools/trunk_kernels.py [--out FILE]

Runs ncu (`--clock-control none`, `gpu__time_duration.sum`, the spk_trunk kernels) on
this script's `forward` mode: one TrunkPlan forward of TrunkWeights.random(3) on a random
fbank at batch 32 per math and tier (sm80, and the device's own where that is higher).
Prints, and writes to FILE, each kernel's launches, total and per-launch microseconds per
tier and math (on sm90, both maths with the halves form too, and whether its output has
the strip form's bits): the breakdown of where a forward's time goes, not the trunk's
time (`tools/trunk_bench.py` measures that).
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ERROR_CHUNKS = 2  # the chunks `forward` saves, and whose float64 truth `errors` takes


def forward(tier_name: str, math_name: str, save: Path | None = None, halves: bool = False) -> None:
    """One trunk forward in `math_name` on a runtime of `tier_name`, under the profiler;
    prints the artifacts it loaded (folder and file) and the output's SHA-256 (the same
    weights and fbank every run: builds whose outputs are the same bits print the same
    digest). With `save`, writes the first ERROR_CHUNKS chunks' output there (.npy);
    `halves` plans the strips of layers 2 to 4 in their halves form (sm90)."""
    import hashlib

    import numpy as np

    from pyspk.candidate.trunk import TRUNK_BATCH, TrunkWeights
    from pyspk.candidate.trunk.plan import OUTPUT_ITEM, OUTPUT_SHAPE, plan_trunk
    from pyspk.cuda import CudaRuntime, KernelModule, PtxTier
    from pyspk.cuda.manifest import artifact_dir

    fbank = forward_fbank()
    with CudaRuntime(0, ptx_tier=PtxTier.parse(tier_name)) as runtime:
        loaded = runtime.load_kernels(KernelModule.TRUNK).artifact
        print(f"artifacts {artifact_dir().resolve()}: {loaded}")
        x = runtime.upload(fbank)
        with plan_trunk(runtime, math_name, TrunkWeights.random(3), halves=halves) as plan:
            y = runtime.alloc_zeros(TRUNK_BATCH * OUTPUT_ITEM)
            plan.enqueue(x, y)
            runtime.synchronize()
            output = runtime.download(y)
    print(f"output sha256 {hashlib.sha256(output.tobytes()).hexdigest()}")
    if save is not None:
        np.save(save, output[: ERROR_CHUNKS * OUTPUT_ITEM].reshape(ERROR_CHUNKS, *OUTPUT_SHAPE))


def forward_fbank() -> Any:
    """The fbank every `forward` runs: N(0, 2), seeded, one batch."""
    import numpy as np

    from pyspk.candidate.trunk import TRUNK_BATCH, TRUNK_BINS, TRUNK_FRAMES

    rng = np.random.default_rng(0)
    return rng.normal(0, 2, (TRUNK_BATCH, TRUNK_FRAMES, TRUNK_BINS)).astype(np.float32)


def errors(outputs: dict[Any, Path]) -> dict[Any, tuple[float, float]]:
    """For each saved `forward` output, its error against float64 (`pyspk.reference.trunk`
    of the same weights and the first ERROR_CHUNKS chunks of the same fbank), as
    max |error| / max |truth| and the norm-wise relative error; the truth made once."""
    import numpy as np

    from pyspk import reference
    from pyspk.candidate.trunk import TrunkWeights

    truth = reference.trunk(forward_fbank()[:ERROR_CHUNKS], TrunkWeights.random(3))
    found = {}
    for key, path in outputs.items():
        diff = np.load(path).astype(np.float64) - truth
        found[key] = (
            float(np.abs(diff).max() / np.abs(truth).max()),
            float(np.linalg.norm(diff) / np.linalg.norm(truth)),
        )
    return found


def kernel_times(
    tier: str,
    math: str,
    script: Path = Path(__file__),
    env: dict[str, str] | None = None,
    save: Path | None = None,
    halves: bool = False,
) -> tuple[dict[str, list[float]], str, str]:
    """Each spk_trunk kernel's launch durations (us) in one forward under ncu
    (`--clock-control none`), run as `script --forward tier math` in `env` (with `save`,
    the forward saves its first chunks there; with `halves`, in the halves form); the
    forward's output digest and the artifacts it loaded. A run without them raises with
    the tail of its output."""
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    command = [
        ncu, "--clock-control", "none", "--csv", "--metrics", "gpu__time_duration.sum",
        "-k", "regex:spk_trunk", sys.executable, str(script), "--forward", tier, math,
    ]  # fmt: skip
    if save is not None:
        command += ["--save", str(save)]
    if halves:
        command.append("--halves")
    result = subprocess.run(command, capture_output=True, text=True, env=env or dict(os.environ))
    lines = result.stdout.splitlines()
    digest = [line.split()[-1] for line in lines if line.startswith("output sha256")]
    loaded = [line.removeprefix("artifacts ") for line in lines if line.startswith("artifacts")]
    if result.returncode != 0 or not digest or '"ID"' not in result.stdout:
        raise RuntimeError(
            f"{' '.join(command)} exited {result.returncode}:\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        )
    table = result.stdout[result.stdout.index('"ID"') :]
    times: dict[str, list[float]] = collections.defaultdict(list)
    for row in csv.DictReader(io.StringIO(table)):
        times[row["Kernel Name"]].append(float(row["Metric Value"].replace(",", "")) / 1e3)
    return dict(times), digest[0], loaded[0] if loaded else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forward", nargs=2, metavar=("TIER", "MATH"), help=argparse.SUPPRESS)
    parser.add_argument("--save", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--halves", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.forward:
        forward(*args.forward, save=args.save, halves=args.halves)
        return 0

    from pyspk.cuda import DeviceAttributes, PtxTier
    from pyspk.cuda.tier import module_tiers

    capability = DeviceAttributes.query(0).capability
    own = PtxTier.highest_for(capability, module_tiers("trunk"))
    tiers = sorted({PtxTier.SM80} | ({own} if own is not None else set()))
    lines = [
        "# Per-kernel durations of one trunk forward at batch 32 (TrunkWeights.random(3)),",
        "# ncu --clock-control none, gpu__time_duration.sum; a kernel's launches summed.",
        f"# {capability} device; tiers {', '.join(str(t) for t in tiers)}.",
        "",
        f"{'tier math kernel':<48} {'launches':>8} {'total us':>10} {'us each':>9}",
    ]
    # each tier's forms: both maths, and on sm90 with the halves form too
    forms = [(tier, math, False) for tier in tiers for math in ("fp32", "tf32")]
    forms += [(PtxTier.SM90, math, True) for math in ("fp32", "tf32") if PtxTier.SM90 in tiers]
    digests: dict[tuple[PtxTier, str, bool], str] = {}
    for tier, math, halves in forms:
        totals, digests[(tier, math, halves)], _ = kernel_times(str(tier), math, halves=halves)
        name = f"{tier} {math}{' halves' if halves else ''}"
        grand = 0.0
        for kernel, times in totals.items():
            grand += sum(times)
            lines.append(
                f"{f'{name} {kernel}':<48} {len(times):>8} "
                f"{sum(times):>10.1f} {sum(times) / len(times):>9.1f}"
            )
        lines.append(f"{f'{name} all, per chunk':<48} {'':>8} {grand / 32:>10.1f}")
    if PtxTier.SM90 in tiers:
        for math in ("fp32", "tf32"):
            same = digests[(PtxTier.SM90, math, True)] == digests[(PtxTier.SM90, math, False)]
            lines.append(f"sm90 {math}: the halves form's output the strip form's bits: {same}")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
