"""Plans of the segdense embedding with zero weights, for the plan lifetime and
reliability tests on the fake driver: batch 1 (EMBED_B1) and split-K batch 32
(EMBED_B32)."""

from __future__ import annotations

import numpy as np

from pyspk.candidate import DenseSite, DenseSpec
from pyspk.candidate.segdense import DenseOxide, Entry, SegdensePin
from pyspk.cuda import CudaMath, CudaRuntime
from pyspk.cuda.kernels import LoadedKernels
from pyspk.cuda.manifest import KernelModule

SPEC = DenseSpec(DenseSite.EMBEDDING, 1, CudaMath.FP32)
# the batch-1 embedding kernel as the fake driver names its function handle
KERNEL = "fn:spk_segdense_embed_b1"


def embed_b1_plan(runtime: CudaRuntime, kernels: LoadedKernels | None = None) -> DenseOxide:
    kernels = kernels or runtime.load_kernels(KernelModule.SEGDENSE)
    pin = SegdensePin.forced(Entry.EMBED_B1, CudaMath.FP32, kernels.tier, runtime.device)
    weight = runtime.upload(np.zeros(256 * 5120, np.float32))
    bias = runtime.upload(np.zeros(256, np.float32))
    return DenseOxide.plan(runtime, kernels, SPEC, weight, bias, pin)


def embed_b32_plan(runtime: CudaRuntime, weight=None, bias=None, scratch=None) -> DenseOxide:
    kernels = runtime.load_kernels(KernelModule.SEGDENSE)
    pin = SegdensePin.forced(Entry.EMBED_B32, CudaMath.FP32, kernels.tier, runtime.device)
    spec = DenseSpec(DenseSite.EMBEDDING, 32, CudaMath.FP32)
    weight = weight if weight is not None else runtime.upload(np.zeros(256 * 5120, np.float32))
    bias = bias if bias is not None else runtime.upload(np.zeros(256, np.float32))
    return DenseOxide.plan(runtime, kernels, spec, weight, bias, pin, scratch)
