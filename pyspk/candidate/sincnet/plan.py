"""The sincnet area's plan: SincNet's first stage (`ptx/src/sincnet/sincnet.cu`), the 80
sinc filters of 251 taps at stride 10 over one input channel, |y|, and MaxPool1d(3, 3),
for `items` chunks of `samples` samples a launch, in one of two kernels by the math:

- FP32 (`spk_sinc_front`): each output the largest of three FP32 sums of 251 fused
  multiply-adds in tap order; on the H200 the bits of cuDNN's FP32 convolution
  (`benchmarks/h200-sincnet.md`), whose order is its own to choose elsewhere.
- TF32 (`spk_sinc_front_f16x3`): FP16 tensor-core products of split operands (high part
  and the residual's, three products a multiply-add: about 22 significant bits, against
  TF32's 11), FP32 sums. The filters are packed here, each with its power-of-two scale;
  the kernel scales each tile's samples by its own.

The plan owns the packed filters; its blocks are persistent (as many as the
multiprocessors hold at once, at most two each) and walk tiles of 64 pooled outputs.
Needs the sm80 tier; below it planning raises `DeviceUnsupported`."""

from __future__ import annotations

import numpy as np

from pyspk.candidate.errors import DeviceUnsupported, GeometryInvalid, WeightsOutOfContract
from pyspk.candidate.framework import launchable_kernels
from pyspk.candidate.segdense.packing import f16_bits, half_scale
from pyspk.cuda.buffers import FLOAT32, source_and_target
from pyspk.cuda.errors import InvalidArgument
from pyspk.cuda.kernels import buffer_params
from pyspk.cuda.lifetime import PlanLifetime
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.math import CudaMath
from pyspk.cuda.runtime import CudaRuntime
from pyspk.cuda.tier import PtxTier

__all__ = [
    "SINC_FILTERS",
    "SINC_TAPS",
    "SincFrontPlan",
    "pack_sinc_halves",
    "plan_sinc_front",
    "sinc_pooled",
]

CONTEXT = "sincnet plan"
KERNEL = "spk_sinc_front"
HALVES_KERNEL = "spk_sinc_front_f16x3"
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
# the tensor-core kernel's: 8 warps; the taps padded to whole k16 steps; its packed
# filter words, then a tile's sample pairs (high and low FP16 pairs, 8 bytes), padded to
# whole rounds of the block
SINC_HALF_THREADS = 256
SINC_K = 256
SINC_HALF_WORDS = SINC_K // 16 * (SINC_FILTERS // 8) * 32 * 4
_HALF_PAIRS = (_SPAN - SINC_TAPS + SINC_K) // 2
SINC_HALF_SHARED_BYTES = SINC_HALF_WORDS * 4 + -(-_HALF_PAIRS // SINC_HALF_THREADS) * (
    SINC_HALF_THREADS * 8
)
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


def resident_blocks(shared_optin_bytes: int, shared_bytes: int = SINC_SHARED_BYTES) -> int:
    """Blocks of a kernel taking `shared_bytes` a multiprocessor holds at once, given the
    device's opt-in shared memory a block (a multiprocessor has 1 KiB more): for the FP32
    kernel two on an sm_90 (227 KiB), one on an sm_80 (163 KiB) or sm_86 (99 KiB).
    Persistent blocks beyond these would wait for the first ones' whole walk."""
    per_block = shared_bytes + _RESERVED_SHARED
    return max(1, min(BLOCKS_PER_SM, (shared_optin_bytes + _RESERVED_SHARED) // per_block))


def pack_sinc_halves(filters: np.ndarray) -> np.ndarray:
    """The tensor-core kernel's filters from `[80, 251]` float32 ones: float32 words of
    length SINC_HALF_WORDS + 80. Each filter is scaled by `half_scale` of its largest
    magnitude and split into high = FP16(w s) and low = FP16(w s - high), the taps padded
    with zeros to SINC_K; word `((step * 10 + tile) * 32 + lane) * 4 + i` holds, for
    filter 8 tile + lane / 4 and taps k = 16 step + 2 (lane % 4) (+ 8 for odd i), the FP16
    pair (k, k + 1) of the high (i < 2) or low part, low half first: the mma's b fragment.
    Then each filter's `1 / s`."""
    weights = np.zeros((SINC_FILTERS, SINC_K), np.float32)
    weights[:, :SINC_TAPS] = filters
    largest = np.asarray(np.fmax.reduce(np.abs(weights), axis=1, initial=np.float32(0.0)))
    scale, inverse = half_scale(largest)
    scaled = weights * scale[:, None]  # a power of two: exact
    high = f16_bits(scaled)
    low = f16_bits(scaled - high.view(np.float16).astype(np.float32))
    words = []
    for part in (high, low):  # [80, 128] pairs (k, k + 1), low half first
        pairs = part[:, 0::2].astype(np.uint32) | part[:, 1::2].astype(np.uint32) << 16
        # [filter][step][lane % 4][+8 taps] -> [step][tile][lane / 4][lane % 4][+8 taps]
        grouped = pairs.reshape(SINC_FILTERS // 8, 8, SINC_K // 16, 2, 4)
        words.append(grouped.transpose(2, 0, 1, 4, 3))
    packed = np.stack(words, axis=-2).reshape(-1)  # [step][tile][g][t][high, low][b0, b1]
    return np.concatenate([packed.view(np.float32), inverse.astype(np.float32)])


class SincFrontPlan(PlanLifetime):
    """`enqueue(x, y, items=n, samples=s)` reads x `[n, s]` and writes y `[n, 80,
    sinc_pooled(s)]`, float32 on the plan's device, in the plan's `math`. Owns only its
    filters, so enqueues on any streams may overlap."""

    def __init__(
        self, runtime: CudaRuntime, filters: np.ndarray, math: CudaMath = CudaMath.FP32
    ) -> None:
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
        self.math = CudaMath.parse(math)
        halves = self.math is CudaMath.TF32
        name, self._threads, self._shared = (
            (HALVES_KERNEL, SINC_HALF_THREADS, SINC_HALF_SHARED_BYTES)
            if halves
            else (KERNEL, SINC_THREADS, SINC_SHARED_BYTES)
        )
        (self._kernel,) = launchable_kernels(runtime.device, kernels, [name], self._shared)
        packed = pack_sinc_halves(weights) if halves else np.ascontiguousarray(weights.T)
        self._filters = runtime.upload(packed, FLOAT32)
        super().__init__(runtime, [self._filters], CONTEXT)
        self._blocks = resident_blocks(runtime.device.shared_optin_bytes, self._shared) * (
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
                grid, self._threads, self._shared, SIGNATURE, [*values, items, samples]
            )
            launch.enqueue(self.runtime.stream if stream is None else stream)
        finally:
            self._release()


def plan_sinc_front(
    runtime: CudaRuntime, filters: np.ndarray, math: CudaMath | str = CudaMath.FP32
) -> SincFrontPlan:
    """A plan of SincNet's first stage from its filters (`[80, 251]`: the filterbank's
    `filters()` without the channel axis) in `math`."""
    return SincFrontPlan(runtime, filters, CudaMath.parse(math))
