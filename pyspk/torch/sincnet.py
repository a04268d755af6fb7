"""`PlannedSincFront`: SincNet's first stage (pyannote's `sincnet.conv1d[0]`, an asteroid
`Encoder` over a `ParamSincFB` of 80 filters of 251 taps at stride 10, then `abs`, then
`sincnet.pool1d[0]`, a MaxPool1d(3, 3)) as one launch of the sincnet area's kernel.

The filters are computed once, by the filterbank itself, when the plan is made (the
stock module computes them again at every call); `replan` after a change. In FP32 math
the sums are FP32 fused multiply-adds in tap order (the library's FP32 error, on the
H200 its bits); in TF32 math FP16 tensor-core products of split operands, about 22
significant bits a product (`pyspk.candidate.sincnet`). The pyannote integration plans
the FP32 form in both maths. Inference only."""

from __future__ import annotations

import torch
from torch import nn

from pyspk.candidate.errors import GeometryUnimplemented
from pyspk.candidate.sincnet import SINC_FILTERS, SINC_TAPS, SincFrontPlan, plan_sinc_front
from pyspk.candidate.sincnet.plan import (
    HALVES_KERNEL,
    KERNEL,
    SINC_POOL,
    SINC_STRIDE,
    sinc_pooled,
)
from pyspk.cuda.errors import ClosedError
from pyspk.cuda.math import CudaMath
from pyspk.torch import (
    _OnePlan,
    _ordinal,
    check_planned_call,
    library_math,
    shared_runtime,
    tensor_state,
)

__all__ = ["PlannedSincFront", "sinc_front_unsupported"]

CONTEXT = "pyspk PlannedSincFront"


def sinc_front_unsupported(encoder: nn.Module, pool: nn.Module) -> str | None:
    """Why `encoder` and `pool` are not the stage the kernel runs, or None."""
    from asteroid_filterbanks import Encoder, ParamSincFB
    from asteroid_filterbanks.enc_dec import Filterbank

    if not isinstance(encoder, Encoder) or not isinstance(encoder.filterbank, ParamSincFB):
        return f"conv1d[0] is a {type(encoder).__name__}, not an Encoder over a ParamSincFB"
    bank = encoder.filterbank
    found = (bank.n_filters, bank.kernel_size, bank.stride, encoder.padding)
    if found != (SINC_FILTERS, SINC_TAPS, SINC_STRIDE, 0):
        return (
            f"the filterbank has (filters, taps, stride, padding) {found}, not "
            f"({SINC_FILTERS}, {SINC_TAPS}, {SINC_STRIDE}, 0)"
        )
    if encoder.is_pinv or not encoder.as_conv1d:
        return "the encoder is a pseudo-inverse or not conv1d-shaped"
    for name in ("pre_analysis", "post_analysis"):  # the identity in asteroid's Filterbank
        if getattr(type(bank), name) is not getattr(Filterbank, name):
            return f"the filterbank overrides {name}"
    found_pool = (
        (pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)
        if isinstance(pool, nn.MaxPool1d)
        else None
    )
    if found_pool != (SINC_POOL, SINC_POOL, 0, 1, False) or pool.return_indices:
        return f"pool1d[0] is {pool}, not MaxPool1d({SINC_POOL}, stride={SINC_POOL})"
    return None


class PlannedSincFront(_OnePlan):
    """`forward(x)` of `[batch, 1, samples]` float32 returns `pool(abs(encoder(x)))`,
    `[batch, 80, frames]`, in `math`. Refuses, with `GeometryUnimplemented`, another stage.
    `served_batches`, when set, names the batch sizes the plan serves; a call of another
    size takes the library stage (as where only the sizes whose bits were compared with
    the library's may run on the plan)."""

    def __init__(
        self, encoder: nn.Module, pool: nn.Module, math: CudaMath | str = CudaMath.FP32
    ) -> None:
        super().__init__()
        self.math = CudaMath.parse(math)
        reason = sinc_front_unsupported(encoder, pool)
        if reason is not None:
            raise GeometryUnimplemented(CONTEXT, reason)
        self.encoder, self.pool = encoder, pool
        self.served_batches: frozenset[int] | None = None
        self._plan: SincFrontPlan | None = None
        self.replan()

    def replan(self) -> None:
        """Computes and uploads the filters again (after a weight change or a move)."""
        self.close()
        parameters = list(self.encoder.parameters())
        if parameters[0].dtype is not torch.float32:
            raise GeometryUnimplemented(
                CONTEXT, f"the filterbank is {parameters[0].dtype}; the plan takes float32"
            )
        if parameters[0].device.type != "cuda":
            raise GeometryUnimplemented(CONTEXT, "the plan takes a filterbank on a CUDA device")
        self._ordinal = _ordinal(parameters[0].device)
        # in FP32 math whatever the caller's switches: asteroid makes them with a matmul
        with torch.no_grad(), library_math(CudaMath.FP32):
            filters = self.encoder.get_filters()  # type: ignore[operator]
        weights = filters.detach().reshape(SINC_FILTERS, SINC_TAPS).to(torch.float32).cpu()
        self._plan = plan_sinc_front(shared_runtime(self._ordinal), weights.numpy(), self.math)
        self._state = tensor_state(parameters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan = self._plan
        if plan is None:
            raise ClosedError(f"{CONTEXT}: closed; nothing was launched (replan() reopens it)")
        parameters = list(self.encoder.parameters())
        check_planned_call(
            CONTEXT,
            [x, *parameters],
            tensor_state(parameters) == self._state,
            "the filterbank's parameters changed since the plan was made; call replan()",
        )
        if (
            x.dim() != 3
            or x.shape[1] != 1
            or x.dtype is not torch.float32
            or x.get_device() != self._ordinal
            or not sinc_pooled(x.shape[2])
        ):
            raise GeometryUnimplemented(
                CONTEXT,
                f"x must be [batch, 1, samples >= {SINC_TAPS + 2 * SINC_STRIDE}] float32 on "
                f"cuda:{self._ordinal}, not {list(x.shape)} {x.dtype} on {x.device}",
            )
        items, _, samples = x.shape
        if self.served_batches is not None and items not in self.served_batches:
            return self.library(x)
        y = torch.empty(
            items, SINC_FILTERS, sinc_pooled(samples), device=x.device, dtype=torch.float32
        )
        if items:
            stream = torch.cuda.current_stream(x.device).cuda_stream
            plan.enqueue(x.contiguous(), y, items=items, samples=samples, stream=stream)
        return y

    def library(self, x: torch.Tensor) -> torch.Tensor:
        """The library path: the stock stage's encoder, `abs` and pool."""
        return self.pool(torch.abs(self.encoder(x)))

    def entries(self) -> str:
        return HALVES_KERNEL if self.math is CudaMath.TF32 else KERNEL
