"""The lstm area's plan: the recurrence of one bidirectional LSTM layer of hidden size
128 (segmentation-3.0's four layers each), both directions at once, `items` sequences of
`steps` steps a launch (`ptx/src/lstm/lstm.cu`).

The input projections are the caller's GEMM (`gx = x W_ih^T + b_ih + b_hh`, both
directions' rows stacked); the plan runs the steps that depend on each other. Its
weights, W_hh, are held as FP16 scaled by a power of two per direction, the operands of
FP16 tensor cores with FP32 sums: 11 significant bits, as TF32 math rounds them. Needs the
sm80 tier; below it planning raises `DeviceUnsupported`."""

from __future__ import annotations

import numpy as np

from pyspk.candidate.errors import DeviceUnsupported, GeometryInvalid, WeightsOutOfContract
from pyspk.cuda.buffers import INT32, device_address
from pyspk.cuda.errors import InvalidArgument
from pyspk.cuda.kernels import buffer_params
from pyspk.cuda.lifetime import PlanLifetime
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.runtime import CudaRuntime
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
RECURRENCE_SIGNATURE = (
    *buffer_params("gx"),
    *buffer_params("w"),
    *buffer_params("y"),
    ("items", "u32"),
    ("steps", "u32"),
    ("inverse0", "u32"),
    ("inverse1", "u32"),
)


def pack_recurrent(w_hh: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
    """Both directions' W_hh (`[2, 512, 128]`, PyTorch's gate order) as the kernel reads
    them: each scaled by the power of two that puts its largest magnitude in
    [2^14, 2^15), rounded to FP16 (ties to even) and paired along k into 32-bit words
    (`[2, 512, 64]`, low half first); and each direction's 1 / scale."""
    weights = np.asarray(w_hh, dtype=np.float32)
    if weights.shape != (2, LSTM_GATES, LSTM_HIDDEN):
        raise GeometryInvalid(
            CONTEXT, f"w_hh must be [2, {LSTM_GATES}, {LSTM_HIDDEN}], not {list(weights.shape)}"
        )
    if not np.isfinite(weights).all():
        raise WeightsOutOfContract(
            CONTEXT, "w_hh holds non-finite values; plans take finite weights"
        )
    halves, inverses = [], []
    for direction in weights:
        largest = float(np.abs(direction).max())
        exponent = int(np.frexp(largest)[1]) - 1 if largest > 0 else 0
        shift = min(max(14 - exponent, -113), 126)
        halves.append((direction * np.float32(2.0**shift)).astype(np.float16))
        inverses.append(float(2.0**-shift))
    words = np.ascontiguousarray(np.stack(halves)).view(np.uint32)
    return words.reshape(2, LSTM_GATES, LSTM_HIDDEN // 2), (inverses[0], inverses[1])


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
        words, inverses = pack_recurrent(w_hh)
        self.inverses = inverses
        self._kernel = kernels.function(KERNEL)
        self._weights = runtime.upload(words.view(np.int32), INT32)
        super().__init__(runtime, [self._weights], CONTEXT)
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
        gx_at = device_address(gx, gx_len, CONTEXT, "gx", ordinal)
        y_at = device_address(y, y_len, CONTEXT, "y", ordinal, writable=True)
        if gx_at < y_at + 4 * y_len and y_at < gx_at + 4 * gx_len:
            raise InvalidArgument(
                f"{CONTEXT}: y shares bytes with gx; the kernel does not work in place"
            )
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
                y_at,
                y_len,
                items,
                steps,
                *self._inverse_bits,
            ]
            launch = self._kernel.launch(grid, LSTM_THREADS, 0, RECURRENCE_SIGNATURE, values)
            launch.enqueue(self.runtime.stream if stream is None else stream)
        finally:
            self._release()


def plan_lstm_recurrence(runtime: CudaRuntime, w_hh: np.ndarray) -> LstmRecurrencePlan:
    """A plan of one bidirectional layer's recurrence from both directions' W_hh
    (`[2, 512, 128]`: the forward's `weight_hh_l{k}`, then `weight_hh_l{k}_reverse`)."""
    return LstmRecurrencePlan(runtime, w_hh)
