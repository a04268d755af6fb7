"""Soak: many plan/close cycles and many graph replays, with device memory (cuMemGetInfo)
and host RSS read before and after each phase, so a leak shows as growth.

    PYTHONPATH=. python3 tools/soak.py [--cycles 10000] [--replays 100000] [--json FILE]

Phase 1 plans and closes the batch-1 embedding (packed weight and bias copies, launches
prepared) `--cycles` times, enqueueing each plan once. Phase 2 captures one graph of a
split-K plan (main and reduction launches) and replays it `--replays` times, reading the
output's bits every 10,000 replays. Growth is the after-minus-before of each figure, read
after a warm-up of the same work and a synchronize."""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pyspk.candidate import DenseSite, DenseSpec
from pyspk.candidate.segdense import DenseOxide, Entry, SegdensePin
from pyspk.cuda import CudaMath, CudaRuntime, driver
from pyspk.cuda.manifest import KernelModule


def _rss_kib() -> int:
    """Resident set size of this process now, in KiB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _device_used(runtime: CudaRuntime) -> int:
    runtime.synchronize()
    free, total = driver.call("cuMemGetInfo")
    return int(total) - int(free)


def _measured(runtime: CudaRuntime, work: Callable[[], dict[str, object]]) -> dict[str, object]:
    """Seconds `work` takes, and device memory and host RSS after it less before it
    (read after a synchronize); `work`'s own figures join the result."""
    before = (_device_used(runtime), _rss_kib())
    start = time.perf_counter()
    figures = work()
    seconds = round(time.perf_counter() - start, 2)
    after = (_device_used(runtime), _rss_kib())
    return {
        **figures,
        "seconds": seconds,
        "device_bytes_growth": after[0] - before[0],
        "host_rss_kib_growth": after[1] - before[1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--replays", type=int, default=100_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    report: dict[str, object] = {}
    with CudaRuntime(0) as runtime:
        kernels = runtime.load_kernels(KernelModule.SEGDENSE)
        device = runtime.device
        weight = runtime.upload(rng.standard_normal(256 * 5120).astype(np.float32) / 70)
        bias = runtime.upload(np.zeros(256, np.float32))
        x1 = runtime.upload(rng.standard_normal(3 * 5120).astype(np.float32))
        y1 = runtime.alloc_zeros(3 * 256)
        spec1 = DenseSpec(DenseSite.EMBEDDING, 1, CudaMath.FP32)
        pin1 = SegdensePin.forced(Entry.EMBED_B1, CudaMath.FP32, kernels.tier, device)

        def cycle() -> None:
            oxide = DenseOxide.plan(runtime, kernels, spec1, weight, bias, pin1)
            oxide.enqueue(x1, y1)
            oxide.close()

        for _ in range(100):
            cycle()

        def cycles() -> dict[str, object]:
            for _ in range(args.cycles):
                cycle()
            return {"cycles": args.cycles}

        report["plan_close"] = _measured(runtime, cycles)

        spec32 = DenseSpec(DenseSite.EMBEDDING, 32, CudaMath.FP32)
        pin32 = SegdensePin.forced(Entry.EMBED_B32, CudaMath.FP32, kernels.tier, device)
        oxide = DenseOxide.plan(runtime, kernels, spec32, weight, bias, pin32)
        x32 = runtime.upload(rng.standard_normal(96 * 5120).astype(np.float32))
        y32 = runtime.alloc_zeros(96 * 256)
        oxide.enqueue(x32, y32)
        reference = runtime.download(y32).view(np.uint32).copy()
        graph = runtime.capture(lambda: oxide.enqueue(x32, y32))
        for _ in range(1000):
            graph.replay()

        def replays() -> dict[str, object]:
            identical = True
            for index in range(args.replays):
                graph.replay()
                if (index + 1) % 10_000 == 0:
                    bits = runtime.download(y32).view(np.uint32)
                    identical &= bool(np.array_equal(bits, reference))
            return {"replays": args.replays, "bits_identical_every_10000": identical}

        report["graph_replay"] = _measured(runtime, replays)
        graph.close()
        oxide.close()
        report["device"] = device.name
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
