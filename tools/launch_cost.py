"""Host cost of one enqueue: a pyspk plan against a bare `cuLaunchKernel` of the same
kernel from cuda-bindings, on the same stream, in one process.

Each sample queues CHUNK launches and times only the queueing (perf_counter_ns), then
synchronizes outside the timed region, so the GPU never holds the host back (CHUNK stays
well under the driver's pending-launch queue). Reports the median microseconds per launch
over SAMPLES chunks, as markdown and as JSON.

    PYTHONPATH=. python3 tools/launch_cost.py [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import numpy as np

from pyspk.candidate import DenseSite, DenseSpec
from pyspk.candidate.segdense import Entry, SegdensePin
from pyspk.candidate.segdense.candidates import DenseOxide
from pyspk.cuda import CudaMath, driver
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.runtime import CudaRuntime
from pyspk.testing import CHUNK, SAMPLES, per_launch_us


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args()

    with CudaRuntime(0) as runtime:
        kernels = runtime.load_kernels(KernelModule.SEGDENSE)
        rng = np.random.default_rng(0)
        spec = DenseSpec(DenseSite.EMBEDDING, 1, CudaMath.FP32)
        pin = SegdensePin.forced(Entry.EMBED_B1, CudaMath.FP32, kernels.tier, runtime.device)
        weight = runtime.upload(rng.standard_normal(256 * 5120).astype(np.float32) / 70)
        bias = runtime.upload(np.zeros(256, np.float32))
        oxide = DenseOxide.plan(runtime, kernels, spec, weight, bias, pin)
        x = runtime.upload(rng.standard_normal(3 * 5120).astype(np.float32))
        y = runtime.alloc_zeros(3 * 256)

        api = driver.api()
        function = kernels.function("spk_segdense_embed_b1").handle
        stream = runtime.stream
        values = [x.ptr, len(x), weight.ptr, len(weight), bias.ptr, len(bias), y.ptr, len(y)]
        # the binding's own argument form: values and their ctypes, converted every call
        typed = (tuple(values), (ctypes.c_void_p, ctypes.c_uint64) * 4)
        # the cheapest form the binding takes: a prepared void*[] address
        cells = [ctypes.c_uint64(value) for value in values]
        pointers = (ctypes.c_void_p * len(cells))(*(ctypes.addressof(c) for c in cells))
        address = ctypes.addressof(pointers)

        def bare_prepared() -> object:
            return api.cuLaunchKernel(function, 128, 1, 1, 256, 1, 1, 0, stream, address, 0)

        def bare_typed() -> object:
            return api.cuLaunchKernel(function, 128, 1, 1, 256, 1, 1, 0, stream, typed, 0)

        figures = {
            "bare cuLaunchKernel, prepared void** params": per_launch_us(runtime, bare_prepared),
            "bare cuLaunchKernel, (values, types) params": per_launch_us(runtime, bare_typed),
            "DenseOxide.enqueue, pyspk buffers": per_launch_us(
                runtime, lambda: oxide.enqueue(x, y)
            ),
        }
        try:
            import torch

            tx = torch.from_numpy(runtime.download(x)).cuda()
            ty = torch.zeros(3 * 256, device="cuda")
            torch.cuda.synchronize()
            figures["DenseOxide.enqueue, PyTorch tensors"] = per_launch_us(
                runtime, lambda: oxide.enqueue(tx, ty)
            )
        except ImportError:
            pass
        device = runtime.device

    print(
        f"host cost per launch of spk_segdense_embed_b1 on {device.name}, "
        f"median of {SAMPLES} chunks of {CHUNK}"
    )
    print("| launch | us |\n|---|---|")
    for name, value in figures.items():
        print(f"| {name} | {value:.2f} |")
    if args.json:
        report = {
            "device": device.name,
            "chunk": CHUNK,
            "samples": SAMPLES,
            "microseconds_per_launch": figures,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
