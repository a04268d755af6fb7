"""The trunk area's fbank (`ptx/src/trunk/trunkfbank.cuh`): WeSpeaker's Kaldi fbank in
three launches around a real FFT of 512 points (one before it, two after), many chunks
a launch.

`FbankFramesPlan` turns x `[items, samples]` (16 kHz waveforms) into the transform's
input `[items, frames, 512]`: frames of 400 samples every 160 (`fbank_frames`), each
scaled by 2^15, its mean removed (an FP64 sum), pre-emphasised by 0.97, windowed by the
plan's 400 weights and zero-padded, each FP32 step rounded in the library's order.
`LogMelPlan` turns the transform `[items, frames, 257]` (complex, as float pairs) into
`[items, frames, 80]`: each mel bin's filter (at most 16 bins) over the power spectrum
summed in FP64, the log of the sum (floored at FP32's epsilon), less the chunk's mean of
that bin over its frames (FP64 sums, blocks of 32 frames added in order, kept in a
float64 scratch the caller gives: `mel_sums_len`). Any tier: the kernels need no tensor
cores."""

from __future__ import annotations

import numpy as np

from pyspk.candidate.errors import GeometryInvalid, GeometryUnimplemented, WeightsOutOfContract
from pyspk.candidate.framework import launchable_kernels
from pyspk.cuda.buffers import FLOAT32, FLOAT64, INT32, kernel_addresses, source_and_target
from pyspk.cuda.errors import InvalidArgument
from pyspk.cuda.kernels import buffer_params
from pyspk.cuda.lifetime import PlanLifetime
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.runtime import CudaRuntime, free_after_error

__all__ = [
    "FBANK_PADDED",
    "FBANK_WINDOW",
    "MEL_BINS",
    "FbankFramesPlan",
    "LogMelPlan",
    "fbank_frames",
    "fbank_takes",
    "mel_sums_len",
    "plan_fbank_frames",
    "plan_log_mel",
]

CONTEXT = "trunk fbank plan"
FRAMES_KERNEL = "spk_trunk_fbank_frames"
LOG_MEL_KERNEL = "spk_trunk_log_mel"
CENTRE_KERNEL = "spk_trunk_mel_centre"
FBANK_WINDOW = 400
FBANK_SHIFT = 160
FBANK_PADDED = 512
FBANK_THREADS = 256  # a warp a frame
MEL_BINS = 80
MEL_THREADS = 256
MEL_FRAMES = 32  # frames a block
MEL_MAX_TERMS = 16  # bins a filter
CENTRE_THREADS = 256
CENTRE_SPAN = 4096  # outputs a block
FFT_BINS = FBANK_PADDED // 2 + 1
FBANK_FLOOR = float(np.finfo(np.float32).eps)
FRAMES_SIGNATURE = (
    *buffer_params("x"),
    *buffer_params("w"),
    *buffer_params("y"),
    ("items", "u32"),
    ("samples", "u32"),
)
LOG_MEL_SIGNATURE = (
    *buffer_params("spectrum"),
    *buffer_params("banks"),
    *buffer_params("ranges"),
    *buffer_params("y"),
    *buffer_params("sums"),
    ("items", "u32"),
    ("frames", "u32"),
)
CENTRE_SIGNATURE = (
    *buffer_params("y"),
    *buffer_params("sums"),
    ("items", "u32"),
    ("frames", "u32"),
)


def fbank_frames(samples: int) -> int:
    """Frames of a chunk of `samples` samples (0 when shorter than one window)."""
    return (samples - FBANK_WINDOW) // FBANK_SHIFT + 1 if samples >= FBANK_WINDOW else 0


def mel_sums_len(items: int, frames: int) -> int:
    """float64 values of `LogMelPlan.enqueue`'s scratch for `items` chunks of `frames`."""
    return items * -(-frames // MEL_FRAMES) * MEL_BINS


def fbank_takes(items: int, frames: int) -> bool:
    """Whether the kernels take a launch of `items` chunks of `frames` (their grids)."""
    return 1 <= items < 1 << 16 and 1 <= frames < 1 << 20


def _checked_items(items: int, frames: int, what: str) -> None:
    if not fbank_takes(items, frames):
        raise InvalidArgument(
            f"{CONTEXT}: needs 1 <= items < 65536 and 1 <= frames < 2^20 ({what}), not "
            f"items={items}, frames={frames}"
        )


class FbankFramesPlan(PlanLifetime):
    """`enqueue(x, y, items=, samples=)`: x `[items, samples]`, y `[items,
    fbank_frames(samples), 512]`, float32 on the plan's device. Owns its window."""

    def __init__(self, runtime: CudaRuntime, window: np.ndarray) -> None:
        weights = np.asarray(window, dtype=np.float32)
        if weights.shape != (FBANK_WINDOW,):
            raise GeometryInvalid(
                CONTEXT, f"the window must be [{FBANK_WINDOW}], not {list(weights.shape)}"
            )
        if not np.isfinite(weights).all():
            raise WeightsOutOfContract(CONTEXT, "the window holds non-finite values")
        kernels = runtime.load_kernels(KernelModule.TRUNK)
        (self._kernel,) = launchable_kernels(runtime.device, kernels, [FRAMES_KERNEL], 0)
        self._window = runtime.upload(weights, FLOAT32)
        super().__init__(runtime, [self._window], CONTEXT)

    def enqueue(
        self, x: object, y: object, *, items: int, samples: int, stream: int | None = None
    ) -> None:
        """Queues the frames of `items` chunks on `stream` (an int handle) or the
        runtime's."""
        frames = fbank_frames(samples)
        _checked_items(items, frames, f"samples={samples} >= {FBANK_WINDOW}")
        x_len, y_len = items * samples, items * frames * FBANK_PADDED
        x_at, y_at = source_and_target(
            CONTEXT, self.runtime.ordinal, ("x", x, x_len), ("y", y, y_len), 4
        )
        grid = (-(-frames // (FBANK_THREADS // 32)), items, 1)
        self._acquire()
        try:
            self._check_open()
            self.runtime.note_capture_user(self)
            values = [x_at, x_len, self._window.ptr, FBANK_WINDOW, y_at, y_len, items, samples]
            launch = self._kernel.launch(grid, FBANK_THREADS, 0, FRAMES_SIGNATURE, values)
            launch.enqueue(self.runtime.stream if stream is None else stream)
        finally:
            self._release()


def mel_ranges(banks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The filters of `banks` `[257, 80]` (transform bin, mel bin) packed: each mel bin's
    weights from its first to its last non-zero bin, one after another, and
    `[80, 3]` (first bin, count, offset into the weights)."""
    weights: list[np.ndarray] = []
    ranges, packed = np.zeros((MEL_BINS, 3), np.int32), 0
    for m in range(MEL_BINS):
        nonzero = np.flatnonzero(banks[:, m])
        first, count = (
            (int(nonzero[0]), int(nonzero[-1] - nonzero[0] + 1)) if nonzero.size else (0, 0)
        )
        ranges[m] = first, count, packed
        weights.append(banks[first : first + count, m])
        packed += count
    return np.concatenate(weights).astype(np.float32), ranges


class LogMelPlan(PlanLifetime):
    """`enqueue(spectrum, y, sums, items=, frames=)`: spectrum `[items, frames, 257, 2]`
    (a complex transform as float pairs) and y `[items, frames, 80]` float32, sums
    `mel_sums_len(items, frames)` float64 (scratch), on the plan's device. Owns its mel
    filters, packed; refuses (`GeometryUnimplemented`) a filter of more than 16 bins."""

    def __init__(self, runtime: CudaRuntime, banks: np.ndarray) -> None:
        dense = np.asarray(banks, dtype=np.float32)
        if dense.shape != (FFT_BINS, MEL_BINS):
            raise GeometryInvalid(
                CONTEXT, f"the mel banks must be [{FFT_BINS}, {MEL_BINS}], not {list(dense.shape)}"
            )
        if not np.isfinite(dense).all():
            raise WeightsOutOfContract(CONTEXT, "the mel banks hold non-finite values")
        weights, ranges = mel_ranges(dense)
        if ranges[:, 1].max() > MEL_MAX_TERMS:
            raise GeometryUnimplemented(
                CONTEXT,
                f"a mel filter spans {ranges[:, 1].max()} bins; the kernel takes {MEL_MAX_TERMS}",
            )
        kernels = runtime.load_kernels(KernelModule.TRUNK)
        self._kernel, self._centre = launchable_kernels(
            runtime.device, kernels, [LOG_MEL_KERNEL, CENTRE_KERNEL], 0
        )
        self._weights = runtime.upload(weights, FLOAT32)
        try:  # the kernel reads the ranges as u32: all are small and non-negative
            self._ranges = runtime.upload(ranges.reshape(-1), INT32)
        except BaseException:
            free_after_error([self._weights])
            raise
        super().__init__(runtime, [self._weights, self._ranges], CONTEXT)

    def enqueue(
        self,
        spectrum: object,
        y: object,
        sums: object,
        *,
        items: int,
        frames: int,
        stream: int | None = None,
    ) -> None:
        """Queues the log-mel features of `items` chunks on `stream` (an int handle) or
        the runtime's."""
        _checked_items(items, frames, "frames of the transform")
        s_len, y_len = items * frames * FFT_BINS * 2, items * frames * MEL_BINS
        sums_len = mel_sums_len(items, frames)
        s_at, y_at, sums_at = kernel_addresses(
            CONTEXT,
            self.runtime.ordinal,
            [("spectrum", spectrum, s_len)],
            [("y", y, y_len), ("sums", sums, sums_len, FLOAT64)],
            8,
        )
        self._acquire()
        try:
            self._check_open()
            self.runtime.note_capture_user(self)
            values = [s_at, s_len, self._weights.ptr, len(self._weights), self._ranges.ptr]
            values += [len(self._ranges), y_at, y_len, sums_at, sums_len, items, frames]
            grid = (-(-frames // MEL_FRAMES), items, 1)
            handle = self.runtime.stream if stream is None else stream
            self._kernel.launch(grid, MEL_THREADS, 0, LOG_MEL_SIGNATURE, values).enqueue(handle)
            grid = (-(-(frames * MEL_BINS) // CENTRE_SPAN), items, 1)
            values = [y_at, y_len, sums_at, sums_len, items, frames]
            self._centre.launch(grid, CENTRE_THREADS, 0, CENTRE_SIGNATURE, values).enqueue(handle)
        finally:
            self._release()


def plan_fbank_frames(runtime: CudaRuntime, window: np.ndarray) -> FbankFramesPlan:
    """A plan of the fbank's frames with `window` (400 weights)."""
    return FbankFramesPlan(runtime, window)


def plan_log_mel(runtime: CudaRuntime, banks: np.ndarray) -> LogMelPlan:
    """A plan of the fbank's log-mel features with `banks` `[257, 80]`."""
    return LogMelPlan(runtime, banks)
