"""The trunk area's statistics pooling (`spk_trunk_stats_pool` in `ptx/src/trunk/trunk.cu`):
pyannote's `StatsPool` with per-speaker weights over the trunk's output, one launch for
every chunk and speaker of a batch.

For chunk i, speaker s and feature row r of x `[items, features, frames]` with weights
w `[items, speakers, frames]`, y `[items, speakers, 2 features]` holds the weighted mean
of the row, then its deviation, `sqrt(sum w (x - mean)^2 / (v1 - sum w^2 / v1 + 1e-8))`
with `v1 = sum w + 1e-8`. The two data sums are FP64 in a fixed order (the same bits on
every run); v1 and the denominator are the library's FP32 expressions over the weights'
sums, exact for 0/1 weights; the mean is rounded to FP32 before the centring, as the
library's is. Any tier: the kernel needs no tensor cores."""

from __future__ import annotations

from pyspk.candidate.framework import launchable_kernels
from pyspk.cuda.buffers import kernel_addresses
from pyspk.cuda.errors import InvalidArgument
from pyspk.cuda.kernels import buffer_params
from pyspk.cuda.lifetime import PlanLifetime
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.runtime import CudaRuntime

__all__ = [
    "POOL_MAX_FRAMES",
    "POOL_MAX_SPEAKERS",
    "StatsPoolPlan",
    "plan_stats_pool",
    "pool_takes",
]

CONTEXT = "trunk stats pool plan"
POOL_KERNEL = "spk_trunk_stats_pool"
POOL_THREADS = 256
POOL_ROWS = 64  # feature rows a block
POOL_MAX_FRAMES = 128  # four a lane
POOL_MAX_SPEAKERS = 8
SIGNATURE = (
    *buffer_params("x"),
    *buffer_params("w"),
    *buffer_params("y"),
    ("items", "u32"),
    ("speakers", "u32"),
    ("features", "u32"),
    ("frames", "u32"),
)


def pool_takes(items: int, speakers: int, features: int, frames: int) -> bool:
    """Whether the kernel takes a launch of this size (its grid and indices)."""
    return (
        1 <= items < 1 << 16
        and 1 <= speakers <= POOL_MAX_SPEAKERS
        and 1 <= features < 1 << 24
        and 1 <= frames <= POOL_MAX_FRAMES
    )


class StatsPoolPlan(PlanLifetime):
    """`enqueue(x, w, y, items=, speakers=, features=, frames=)`: float32 buffers on the
    plan's device, laid out as the module docstring says. Owns no buffers, so enqueues on
    any streams may overlap."""

    def __init__(self, runtime: CudaRuntime) -> None:
        kernels = runtime.load_kernels(KernelModule.TRUNK)
        (self._kernel,) = launchable_kernels(runtime.device, kernels, [POOL_KERNEL], 0)
        super().__init__(runtime, [], CONTEXT)

    def enqueue(
        self,
        x: object,
        w: object,
        y: object,
        *,
        items: int,
        speakers: int,
        features: int,
        frames: int,
        stream: int | None = None,
    ) -> None:
        """Queues the pooling of `items` chunks on `stream` (an int handle) or the
        runtime's."""
        if not pool_takes(items, speakers, features, frames):
            raise InvalidArgument(
                f"{CONTEXT}: needs 1 <= items < 65536, 1 <= speakers <= {POOL_MAX_SPEAKERS}, "
                f"1 <= features < 2^24 and 1 <= frames <= {POOL_MAX_FRAMES}, not items={items}, "
                f"speakers={speakers}, features={features}, frames={frames}"
            )
        ordinal = self.runtime.ordinal
        x_len, w_len = items * features * frames, items * speakers * frames
        y_len = items * speakers * 2 * features
        x_at, w_at, y_at = kernel_addresses(
            CONTEXT, ordinal, [("x", x, x_len), ("w", w, w_len)], [("y", y, y_len)], 4
        )
        grid = (-(-features // POOL_ROWS), items, 1)
        self._acquire()
        try:
            self._check_open()
            self.runtime.note_capture_user(self)
            values = [x_at, x_len, w_at, w_len, y_at, y_len, items, speakers, features, frames]
            launch = self._kernel.launch(grid, POOL_THREADS, 0, SIGNATURE, values)
            launch.enqueue(self.runtime.stream if stream is None else stream)
        finally:
            self._release()


def plan_stats_pool(runtime: CudaRuntime) -> StatsPoolPlan:
    """A plan of the trunk's statistics pooling on `runtime`'s device."""
    return StatsPoolPlan(runtime)
