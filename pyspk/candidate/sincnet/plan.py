"""The sincnet area's plan: SincNet's first stage (`ptx/src/sincnet/sincnet.cu`), the 80
sinc filters of 251 taps at stride 10 over one input channel, |y|, and MaxPool1d(3, 3),
for `items` chunks of `samples` samples a launch.

Each output is the largest of three FP32 sums of 251 fused multiply-adds in tap order:
on the H200 the bits of cuDNN's FP32 convolution (`benchmarks/h200-sincnet.md`), whose
order is its own to choose elsewhere. The plan owns the filters, tap-major; its blocks
are persistent (as many as the multiprocessors hold at once, at most two each) and walk
tiles of 64 pooled outputs. Needs the sm80 tier; below it planning raises
`DeviceUnsupported`."""

from __future__ import annotations

import numpy as np

from pyspk.candidate.errors import DeviceUnsupported, GeometryInvalid, WeightsOutOfContract
from pyspk.candidate.framework import launchable_kernels
from pyspk.cuda.buffers import FLOAT32, source_and_target
from pyspk.cuda.errors import InvalidArgument
from pyspk.cuda.kernels import buffer_params
from pyspk.cuda.lifetime import PlanLifetime
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.runtime import CudaRuntime
from pyspk.cuda.tier import PtxTier

__all__ = [
    "SINC_FILTERS",
    "SINC_TAPS",
    "SincFrontPlan",
    "plan_sinc_front",
    "sinc_pooled",
]

CONTEXT = "sincnet plan"
KERNEL = "spk_sinc_front"
SINC_FILTERS = 80
SINC_TAPS = 251
SINC_STRIDE = 10
SINC_POOL = 3
SINC_THREADS = 320
SINC_TILE = 64  # pooled outputs a tile
# the kernel's SINC_SHARED_BYTES: the filters, then a tile's input samples (padded to 16
# bytes); the launch's dynamic shared memory
_SPAN = SINC_STRIDE * SINC_POOL * (SINC_TILE - 1) + SINC_STRIDE * (SINC_POOL - 1) + SINC_TAPS
SINC_SHARED_BYTES = (SINC_TAPS * SINC_FILTERS + -(-_SPAN // 4) * 4) * 4
# blocks a multiprocessor may hold (the kernel's launch bounds, 320 threads at 96
# registers); the shared memory may allow fewer
BLOCKS_PER_SM = 2
# shared memory the driver keeps per block beside the kernel's own
_RESERVED_SHARED = 1024
SIGNATURE = (
    *buffer_params("x"),
    *buffer_params("w"),
    *buffer_params("y"),
    ("items", "u32"),
    ("samples", "u32"),
)


def sinc_pooled(samples: int) -> int:
    """Pooled outputs of a chunk of `samples` samples (0 when too short for one):
    MaxPool1d(3, 3) over the (samples - 251) // 10 + 1 convolution positions."""
    if samples < SINC_TAPS:
        return 0
    return ((samples - SINC_TAPS) // SINC_STRIDE + 1) // SINC_POOL


def resident_blocks(shared_optin_bytes: int) -> int:
    """Blocks of the kernel a multiprocessor holds at once, given the device's opt-in
    shared memory a block (a multiprocessor has 1 KiB more): two on an sm_90 (227 KiB),
    one on an sm_80 (163 KiB) or sm_86 (99 KiB). Persistent blocks beyond these would
    wait for the first ones' whole walk."""
    per_block = SINC_SHARED_BYTES + _RESERVED_SHARED
    return max(1, min(BLOCKS_PER_SM, (shared_optin_bytes + _RESERVED_SHARED) // per_block))


class SincFrontPlan(PlanLifetime):
    """`enqueue(x, y, items=n, samples=s)` reads x `[n, s]` and writes y `[n, 80,
    sinc_pooled(s)]`, float32 on the plan's device. Owns only its filters, so enqueues on
    any streams may overlap."""

    def __init__(self, runtime: CudaRuntime, filters: np.ndarray) -> None:
        kernels = runtime.load_kernels(KernelModule.SINCNET)
        if kernels.tier < PtxTier.SM80:
            raise DeviceUnsupported(
                f"{CONTEXT}: the sinc front needs the sm80 tier; the loaded {kernels.tier} "
                "tier takes the library path"
            )
        weights = np.asarray(filters, dtype=np.float32)
        if weights.shape != (SINC_FILTERS, SINC_TAPS):
            raise GeometryInvalid(
                CONTEXT,
                f"filters must be [{SINC_FILTERS}, {SINC_TAPS}], not {list(weights.shape)}",
            )
        if not np.isfinite(weights).all():
            raise WeightsOutOfContract(
                CONTEXT, "the filters hold non-finite values; plans take finite weights"
            )
        (self._kernel,) = launchable_kernels(runtime.device, kernels, [KERNEL], SINC_SHARED_BYTES)
        self._filters = runtime.upload(np.ascontiguousarray(weights.T), FLOAT32)
        super().__init__(runtime, [self._filters], CONTEXT)
        self._blocks = resident_blocks(runtime.device.shared_optin_bytes) * (
            runtime.device.multiprocessors
        )

    def enqueue(
        self, x: object, y: object, *, items: int, samples: int, stream: int | None = None
    ) -> None:
        """Queues the front of `items` chunks of `samples` samples on `stream` (an int
        handle) or the runtime's."""
        pooled = sinc_pooled(samples)
        if not 1 <= items < 1 << 31 or not pooled or samples >= 1 << 31:
            raise InvalidArgument(
                f"{CONTEXT}: needs 1 <= items < 2^31 and {SINC_TAPS + 2 * SINC_STRIDE} <= "
                f"samples < 2^31, not items={items}, samples={samples}"
            )
        ordinal = self.runtime.ordinal
        x_len, y_len = items * samples, items * SINC_FILTERS * pooled
        x_at, y_at = source_and_target(CONTEXT, ordinal, ("x", x, x_len), ("y", y, y_len), 4)
        tiles = items * -(-pooled // SINC_TILE)
        grid = (min(tiles, self._blocks), 1, 1)
        self._acquire()
        try:
            self._check_open()
            self.runtime.note_capture_user(self)
            values = [x_at, x_len, self._filters.ptr, len(self._filters), y_at, y_len]
            launch = self._kernel.launch(
                grid, SINC_THREADS, SINC_SHARED_BYTES, SIGNATURE, [*values, items, samples]
            )
            launch.enqueue(self.runtime.stream if stream is None else stream)
        finally:
            self._release()


def plan_sinc_front(runtime: CudaRuntime, filters: np.ndarray) -> SincFrontPlan:
    """A plan of SincNet's first stage from its filters (`[80, 251]`: the filterbank's
    `filters()` without the channel axis)."""
    return SincFrontPlan(runtime, filters)
