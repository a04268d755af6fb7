"""`PlannedLSTM`: an `nn.LSTM` of segmentation-3.0's shape (hidden 128, bidirectional,
batch first, any input size and layer count) on the lstm area's recurrence plans, one
per layer; each layer's input projection is one GEMM of both directions at once
(`torch.addmm`, in the caller's math: TF32 inside `library_math(TF32)`).

The recurrence keeps each operand (h and W_hh) as an FP16 value and its rest, 22
significant bits: with the projections in TF32 math its error against float64 is
cuDNN TF32's; in FP32 math, below cuDNN FP32's (`benchmarks/h200-lstm.md`). The engine
runs it in TF32 math, and in FP32 math only when asked (`accelerate(..., lstm=True)`):
its FP32 roundings differ from cuDNN's, and so may the annotation. Inference only; the
weights are packed at construction (`replan` after a change)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from pyspk.candidate.errors import GeometryUnimplemented
from pyspk.candidate.lstm import LSTM_HIDDEN, LstmRecurrencePlan, plan_lstm_recurrence
from pyspk.cuda.errors import ClosedError
from pyspk.torch import (
    PlannedModule,
    _ordinal,
    check_planned_call,
    shared_runtime,
    tensor_state,
)

__all__ = ["PlannedLSTM"]

CONTEXT = "pyspk PlannedLSTM"


class PlannedLSTM(PlannedModule):
    """`forward(x)` of `[batch, steps, input]` returns `(y, None)`, y `[batch, steps,
    256]` as the wrapped `nn.LSTM(x)[0]`; the states are not returned (a caller that reads
    them keeps the `nn.LSTM`). Refuses, with `GeometryUnimplemented`, an LSTM of another
    shape than the plans'."""

    def __init__(self, lstm: nn.LSTM) -> None:
        super().__init__()
        shape = (lstm.hidden_size, lstm.bidirectional, lstm.batch_first, lstm.proj_size)
        if shape != (LSTM_HIDDEN, True, True, 0) or not lstm.bias:
            raise GeometryUnimplemented(
                CONTEXT,
                "the plans run bidirectional, batch-first LSTMs of hidden size "
                f"{LSTM_HIDDEN} with biases and no projection",
            )
        if lstm.weight_ih_l0.dtype is not torch.float32 or lstm.weight_ih_l0.device.type != "cuda":
            raise GeometryUnimplemented(CONTEXT, "the plans take float32 weights on a CUDA device")
        self.lstm = lstm
        self.layers = lstm.num_layers
        self._plans: list[LstmRecurrencePlan] = []
        self.replan()

    def _parameters_of(self, layer: int) -> list[torch.Tensor]:
        return [
            getattr(self.lstm, f"{kind}_l{layer}{suffix}")
            for suffix in ("", "_reverse")
            for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        ]

    def replan(self) -> None:
        """Packs every layer's weights again (after a weight change or a move)."""
        self.close()
        self._ordinal = _ordinal(self._parameters_of(0)[0].device)
        runtime = shared_runtime(self._ordinal)
        projections, plans = [], []
        with torch.no_grad(), torch.cuda.device(self._ordinal):
            try:
                for layer in range(self.layers):
                    ih, hh, b_ih, b_hh, ih_r, hh_r, b_ih_r, b_hh_r = self._parameters_of(layer)
                    weight = torch.cat([ih, ih_r]).t().contiguous()  # [input, 1024]
                    bias = torch.cat([b_ih + b_hh, b_ih_r + b_hh_r]).contiguous()
                    projections.append((weight, bias))
                    recurrent = torch.stack([hh, hh_r]).cpu().numpy().astype(np.float32)
                    plans.append(plan_lstm_recurrence(runtime, recurrent))
            except BaseException:
                for plan in plans:
                    plan.close()
                raise
        self._projections, self._plans = projections, plans
        self._state = tensor_state(self.lstm.parameters())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if self.closed:
            raise ClosedError(f"{CONTEXT}: closed; nothing was launched (replan() reopens it)")
        check_planned_call(
            CONTEXT,
            [x, *self.lstm.parameters()],
            tensor_state(self.lstm.parameters()) == self._state,
            "the LSTM's weights changed since they were packed; call replan()",
        )
        if self.lstm.training and self.lstm.dropout > 0:
            return self.lstm(x)  # dropout between layers, as the module in training mode
        if x.dim() != 3 or x.dtype is not torch.float32 or x.get_device() != self._ordinal:
            raise GeometryUnimplemented(
                CONTEXT,
                f"x must be [batch, steps, input] float32 on cuda:{self._ordinal}, "
                f"not {list(x.shape)} {x.dtype} on {x.device}",
            )
        items, steps, _ = x.shape
        stream = torch.cuda.current_stream(x.device).cuda_stream
        y = x.contiguous()
        for (weight, bias), plan in zip(self._projections, self._plans, strict=True):
            gx = torch.addmm(bias, y.reshape(items * steps, -1), weight)
            y = torch.empty(items, steps, 2 * LSTM_HIDDEN, device=x.device, dtype=torch.float32)
            plan.enqueue(gx, y, items=items, steps=steps, stream=stream)
        return y, None

    def entries(self) -> str:
        return f"{self.layers} layers of spk_lstm_recurrence"

    @property
    def closed(self) -> bool:
        return not self._plans

    def close(self) -> None:
        """Frees every layer's plan (idempotent); `replan()` makes them again."""
        plans, self._plans = self._plans, []
        for plan in plans:
            plan.close()
