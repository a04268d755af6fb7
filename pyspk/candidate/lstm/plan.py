"""The lstm area's plan: the recurrence of one bidirectional LSTM layer of hidden size
128 (segmentation-3.0's four layers each), both directions at once, `items` sequences of
`steps` steps a launch (`ptx/src/lstm/lstm.cu`).

The input projections are the caller's GEMM (`gx = x W_ih^T + b_ih + b_hh`, both
directions' rows stacked); the plan runs the steps that depend on each other. Its
weights, W_hh, are scaled by a power of two per direction and held as their FP16 values
and the FP16 values of their rests; h is split the same way in the kernel, and the three
products above FP32's resolution run on FP16 tensor cores with FP32 sums (22 significant
bits an operand). Needs the sm80 tier; below it planning raises `DeviceUnsupported`."""

from __future__ import annotations

import numpy as np

from pyspk.candidate.errors import DeviceUnsupported, GeometryInvalid, WeightsOutOfContract
from pyspk.candidate.framework import launchable_kernels
from pyspk.cuda.buffers import INT32, source_and_target
from pyspk.cuda.errors import InvalidArgument
from pyspk.cuda.kernels import buffer_params
from pyspk.cuda.lifetime import PlanLifetime
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.runtime import CudaRuntime, free_after_error
from pyspk.cuda.tier import PtxTier

__all__ = [
    "LSTM_HIDDEN",
    "LstmRecurrencePlan",
    "pack_recurrent",
    "plan_lstm_recurrence",
]

CONTEXT = "lstm plan"
KERNEL = "spk_lstm_recurrence"
LSTM_HIDDEN = 128
LSTM_GATES = 4 * LSTM_HIDDEN
# sequences a block and threads a block (the kernel's LSTM_ROWS, LSTM_THREADS)
LSTM_ROWS = 16
LSTM_THREADS = 256
# words of one direction's W_hh rest in fragment order (the kernel's LSTM_REST_WORDS):
# 8 warps x 8 tiles x 8 k-steps x 32 lanes x 2; its bytes are the launch's dynamic
# shared memory
LSTM_REST_WORDS = 8 * 8 * 8 * 32 * 2
RECURRENCE_SIGNATURE = (
    *buffer_params("gx"),
    *buffer_params("w"),
    *buffer_params("w_rest"),
    *buffer_params("y"),
    ("items", "u32"),
    ("steps", "u32"),
    ("inverse0", "u32"),
    ("inverse1", "u32"),
)


def pack_recurrent(w_hh: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """Both directions' W_hh (`[2, 512, 128]`, PyTorch's gate order) as the kernel reads
    them: each scaled by the power of two that puts its largest magnitude in
    [2^14, 2^15), rounded to FP16 (ties to even) and paired along k into 32-bit words
    (`[2, 512, 64]`, low half first); the FP16 pairs of the rests (scaled value minus its
    FP16 value, exact in FP32) in the kernel's B-fragment order
    (`[2, LSTM_REST_WORDS]`); and each direction's 1 / scale."""
    weights = np.asarray(w_hh, dtype=np.float32)
    if weights.shape != (2, LSTM_GATES, LSTM_HIDDEN):
        raise GeometryInvalid(
            CONTEXT, f"w_hh must be [2, {LSTM_GATES}, {LSTM_HIDDEN}], not {list(weights.shape)}"
        )
    if not np.isfinite(weights).all():
        raise WeightsOutOfContract(
            CONTEXT, "w_hh holds non-finite values; plans take finite weights"
        )
    halves, rests, inverses = [], [], []
    for direction in weights:
        largest = float(np.abs(direction).max())
        exponent = int(np.frexp(largest)[1]) - 1 if largest > 0 else 0
        shift = min(max(14 - exponent, -113), 126)
        scaled = direction * np.float32(2.0**shift)
        halves.append(scaled.astype(np.float16))
        rests.append((scaled - halves[-1].astype(np.float32)).astype(np.float16))
        inverses.append(float(2.0**-shift))
    words = np.ascontiguousarray(np.stack(halves)).view(np.uint32)
    rest_words = np.ascontiguousarray(np.stack(rests)).view(np.uint32)
    shape = (2, LSTM_GATES, LSTM_HIDDEN // 2)
    rows, columns = _FRAGMENT_ORDER
    in_order = rest_words.reshape(shape)[:, rows, columns]
    return words.reshape(shape), in_order, (inverses[0], inverses[1])


def _fragment_order() -> tuple[np.ndarray, np.ndarray]:
    """(row, pair column) of W_hh for each word of a direction's rest in the kernel's
    order [warp][tile][k][lane][register]: tile 2 g + half holds gate g's units
    warp*16 + half*8 + lane/4; register r the pair k*8 + 4 r + lane % 4."""
    warp, tile, k, lane, register = np.meshgrid(
        *(np.arange(n) for n in (8, 8, 8, 32, 2)), indexing="ij"
    )
    rows = (tile >> 1) * LSTM_HIDDEN + warp * 16 + (tile & 1) * 8 + (lane >> 2)
    return rows.reshape(-1), (k * 8 + register * 4 + (lane & 3)).reshape(-1)


_FRAGMENT_ORDER = _fragment_order()


class LstmRecurrencePlan(PlanLifetime):
    """One layer's recurrence: `enqueue(gx, y, items=n, steps=t)` reads the projections
    gx `[n, t, 2, 512]` and writes the layer's output y `[n, t, 256]` (forward units,
    then backward), float32 on the plan's device. Owns only its packed W_hh, so enqueues
    on any streams may overlap."""

    def __init__(self, runtime: CudaRuntime, w_hh: np.ndarray) -> None:
        kernels = runtime.load_kernels(KernelModule.LSTM)
        if kernels.tier < PtxTier.SM80:
            raise DeviceUnsupported(
                f"{CONTEXT}: the LSTM kernel needs the sm80 tier (tensor cores); the loaded "
                f"{kernels.tier} tier takes the library path"
            )
        words, rest, inverses = pack_recurrent(w_hh)
        self.inverses = inverses
        # W_hh's rest in dynamic shared memory: 128 KiB, which sm_86, sm_89 and sm_120
        # blocks (99 KiB) cannot have
        (self._kernel,) = launchable_kernels(runtime.device, kernels, [KERNEL], LSTM_REST_WORDS * 4)
        self._weights = runtime.upload(words.view(np.int32), INT32)
        try:
            self._rest = runtime.upload(rest.view(np.int32), INT32)
        except BaseException:
            free_after_error([self._weights])
            raise
        super().__init__(runtime, [self._weights, self._rest], CONTEXT)
        self._inverse_bits = [int(np.float32(value).view(np.uint32)) for value in inverses]

    def enqueue(
        self, gx: object, y: object, *, items: int, steps: int, stream: int | None = None
    ) -> None:
        """Queues the recurrence of `items` sequences of `steps` steps on `stream` (an int
        handle) or the runtime's."""
        if not 1 <= items < 1 << 31 or not 1 <= steps < 1 << 31:
            raise InvalidArgument(
                f"{CONTEXT}: items and steps must be positive, not {items}, {steps}"
            )
        ordinal = self.runtime.ordinal
        gx_len, y_len = items * steps * 2 * LSTM_GATES, items * steps * 2 * LSTM_HIDDEN
        # read and written as float pairs: a misaligned pair faults
        gx_at, y_at = source_and_target(CONTEXT, ordinal, ("gx", gx, gx_len), ("y", y, y_len), 8)
        grid = (-(-items // LSTM_ROWS), 2, 1)
        self._acquire()
        try:
            self._check_open()
            self.runtime.note_capture_user(self)
            values = [
                gx_at,
                gx_len,
                self._weights.ptr,
                len(self._weights),
                self._rest.ptr,
                len(self._rest) // 4,  # in the kernel's 16-byte units
                y_at,
                y_len,
                items,
                steps,
                *self._inverse_bits,
            ]
            shared = LSTM_REST_WORDS * 4
            launch = self._kernel.launch(grid, LSTM_THREADS, shared, RECURRENCE_SIGNATURE, values)
            launch.enqueue(self.runtime.stream if stream is None else stream)
        finally:
            self._release()


def plan_lstm_recurrence(runtime: CudaRuntime, w_hh: np.ndarray) -> LstmRecurrencePlan:
    """A plan of one bidirectional layer's recurrence from both directions' W_hh
    (`[2, 512, 128]`: the forward's `weight_hh_l{k}`, then `weight_hh_l{k}_reverse`)."""
    return LstmRecurrencePlan(runtime, w_hh)
