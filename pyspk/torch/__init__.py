"""pyspk plans built from PyTorch modules, enqueued on the stream PyTorch is using.

`PlannedDense` wraps an `nn.Linear` at a dense boundary together with the epilogue that
follows it there (LeakyReLU after linear0 and linear1, log-softmax after the classifier,
nothing after seg_1); `PlannedConv1d` wraps an `nn.Conv1d` at sincnet.conv1 or conv2.
Each plans batch 1 and batch 32 from the module's own weights when it is built (the
linears' weights are transposed to pyspk's `[k, n]` layout then; seg_1's `[n, k]` and the
convolutions' `[60, cin, 5]` are pyspk's layouts already). A batch of 64, 96, 128 or any
other multiple of 32 runs as consecutive batch-32 enqueues on its items in order, so it
gives the bits of that many batch-32 calls. A call that one of those plans serves is
enqueued on `torch.cuda.current_stream()` at call time, so it is ordered
with the caller's PyTorch work eagerly, on user streams and inside `torch.cuda.graph`
capture; any other call (another batch or length, a CPU or non-float32 tensor, a closed
wrapper) takes the module's own library path, so a wrapper accepts every input the
module did. The wrappers keep the module's parameters under the same names, so a state
dict loads into either.

Plans are inference-only: a call while autograd records (`torch.is_grad_enabled()` with
an input or parameter that requires grad) raises `InferenceOnlyError`; run under
`torch.inference_mode()` or `torch.no_grad()`. The plans hold a copy of the weights made
at planning: a call after the parameters changed (an optimizer step, `load_state_dict`,
`.to()`) raises `WeightsChangedError`; `replan()` plans again from the current weights.
The check reads each parameter's identity, storage and version counter, which writes
through `param.data` (`param.data.copy_(...)`, `param.data.add_(...)`) do not advance:
after such a write the plans keep the weights they copied, so call `replan()` (checking
the values themselves on every call would cost more than the call).
A graph captured with `torch.cuda.graph` holds the plans' packed weights by address:
keep the wrapper open (not `close()`d) while such a graph lives.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from pyspk import reference
from pyspk.candidate import DenseSite, SegConvSite
from pyspk.candidate.framework import CONV_TAPS
from pyspk.candidate.segdense import BATCHES, Area, DenseOxide, SegConvOxide
from pyspk.cuda import CudaMath, CudaRuntime
from pyspk.cuda.errors import InvalidArgument
from pyspk.cuda.lifetime import PlanLifetime
from pyspk.errors import (
    ClosedError,
    GeometryInvalid,
    GeometryUnimplemented,
    InferenceOnlyError,
    WeightsChangedError,
)
from pyspk.torch._math import library_math

__all__ = [
    "BATCHES",
    "PIECE",
    "InferenceOnlyError",
    "PlannedConv1d",
    "PlannedDense",
    "PlannedModule",
    "WeightsChangedError",
    "epilogue",
    "library_math",
    "planned_modules",
    "shared_runtime",
]


PIECE = BATCHES[-1]
"""The batch of one enqueue when a larger multiple of it is served piece by piece."""


_RUNTIMES: dict[int, CudaRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()


def shared_runtime(device: torch.device | int | None = None) -> CudaRuntime:
    """The runtime `pyspk.torch` plans on for a CUDA device (default: the current one),
    made once per device and shared, with the segdense module loaded. Its own stream
    only packs weights at planning; enqueues go to PyTorch's current stream."""
    ordinal = _ordinal(device)
    with _RUNTIMES_LOCK:
        if ordinal not in _RUNTIMES:
            with torch.cuda.device(ordinal):  # PyTorch makes the primary context first
                runtime = CudaRuntime(ordinal)
                runtime.load_kernels(Area.AREA)
                _RUNTIMES[ordinal] = runtime
        return _RUNTIMES[ordinal]


def check_planned_call(
    context: str, tensors: list[torch.Tensor], unchanged: bool, changed: str
) -> None:
    """What every planned module checks before it enqueues: no autograd recording
    through `tensors` (the input and the parameters), `InferenceOnlyError`; the weights
    still those it planned from (`unchanged`), else `WeightsChangedError` saying
    `changed`."""
    if torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors):
        raise InferenceOnlyError(
            f"{context}: pyspk plans are inference-only; call under "
            "torch.inference_mode() or torch.no_grad()"
        )
    if not unchanged:
        raise WeightsChangedError(f"{context}: {changed}")


def tensor_state(tensors: Iterable[torch.Tensor]) -> tuple[int, ...]:
    """What a parameter change alters: each tensor's identity and storage, and its
    version counter (inference tensors keep none); a plan compares it before each call."""
    state: list[int] = []
    for tensor in tensors:
        state += (id(tensor), tensor.data_ptr(), -1 if tensor.is_inference() else tensor._version)
    return tuple(state)


def _ordinal(device: torch.device | int | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise InvalidArgument(f"pyspk plans run on CUDA devices, not {device}")
    return torch.cuda.current_device() if device.index is None else device.index


def _current_stream_handle(ordinal: int) -> int:
    return torch.cuda.current_stream(ordinal).cuda_stream


# streams whose split-K partial planes a wrapper keeps (beyond: all are dropped)
_KEPT_PARTIALS = 16

# the raw handle without building a torch.cuda.Stream (what compiled PyTorch code calls)
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _current_stream_handle)


def epilogue(site: DenseSite) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What a model applies after the `nn.Linear` at `site`, which the plans fuse:
    LeakyReLU(0.01) after linear0 and linear1, log-softmax after the classifier, nothing
    (None) after seg_1."""
    if site in (DenseSite.LINEAR0, DenseSite.LINEAR1):
        return _leaky_relu
    if site is DenseSite.CLASSIFIER:
        return _log_softmax
    return None


def _leaky_relu(y: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(y, reference.LEAKY_SLOPE)


def _log_softmax(y: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(y, dim=-1)


class PlannedModule(nn.Module):
    """The base of every pyspk module wrapper, the ones of `pyspk.torch`'s submodules
    too (`planned_modules` finds them)."""

    def entries(self) -> object:
        """The kernels the wrapper runs."""
        raise NotImplementedError

    def close(self) -> None:
        """Frees the wrapper's plans (idempotent)."""
        raise NotImplementedError


class _OnePlan(PlannedModule):
    """A wrapper over one plan, `_plan` (None once closed)."""

    _plan: PlanLifetime | None

    @property
    def closed(self) -> bool:
        return self._plan is None

    def close(self) -> None:
        """Frees the plan (idempotent)."""
        plan, self._plan = self._plan, None
        if plan is not None:
            plan.close()


class _Planned(PlannedModule):
    """What both wrappers share: the module's parameters under their own names, plans
    per served shape, the inference-only and stale-weight checks, and `replan`/`close`."""

    _context: str
    site: DenseSite | SegConvSite
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(
        self, module: nn.Linear | nn.Conv1d, math: CudaMath | str, name: str | None
    ) -> None:
        super().__init__()
        if name is not None:
            self._context += f" ({name})"
        self.weight = module.weight
        self.bias = module.bias
        self.math = CudaMath.parse(math)
        self._plans: dict[object, DenseOxide | SegConvOxide] = {}
        self._planned_state: tuple[int, ...] = ()
        self._stream_partials: dict[tuple[int, int], torch.Tensor] = {}
        self.replan()

    # -- planning --------------------------------------------------------------------

    def replan(self) -> None:
        """Plans every served shape again from the current parameters, on their device
        (after a weight change or a move, or to reopen a closed wrapper)."""
        self.close()
        self._check_dtypes()
        self._ordinal = self._weight_ordinal()
        runtime = shared_runtime(self._ordinal)
        with torch.no_grad(), torch.cuda.device(self._ordinal):
            weight, bias = self._plan_operands()
            # the plans pack on the runtime's stream: the weights, and the layout copies
            # just made of them, must have landed on PyTorch's
            torch.cuda.current_stream().synchronize()
            plans = {}
            try:
                for batch in BATCHES:
                    plans[self._shape_key(batch)] = self._plan(runtime, batch, weight, bias)
            except BaseException:
                for plan in plans.values():
                    with contextlib.suppress(Exception):  # keep the planning error
                        plan.close()
                raise
        self._plans = plans
        self._planned_state = self._state()

    def _check_dtypes(self) -> None:
        for name, parameter in (("weight", self.weight), ("bias", self.bias)):
            if parameter is not None and parameter.dtype is not torch.float32:
                # a half or double module keeps its library path (a fallback, not a bug)
                raise GeometryUnimplemented(
                    self._context,
                    f"the {name} is {parameter.dtype}; pyspk plans take float32 modules",
                )

    def _weight_ordinal(self) -> int:
        device = self.weight.device
        if device.type != "cuda":
            raise InvalidArgument(
                f"{self._context}: the weight is on {device}; move the module to a CUDA "
                "device before planning"
            )
        return _ordinal(device)

    def close(self) -> None:
        """Frees the plans (idempotent); later calls take the library path."""
        plans, self._plans = self._plans, {}
        self._stream_partials.clear()
        for plan in plans.values():
            plan.close()

    @property
    def planned(self) -> bool:
        return bool(self._plans)

    def entries(self) -> dict[int, str]:
        """The entry each batch's plan runs, e.g. {1: "LINEAR0_B1", 32: "LINEAR0_B32"}."""
        return {
            batch: self._plans[self._shape_key(batch)].producer.pin.entry().name
            for batch in BATCHES
            if self._shape_key(batch) in self._plans
        }

    def _state(self) -> tuple[int, ...]:
        return tensor_state(p for p in (self.weight, self.bias) if p is not None)

    # -- calling ---------------------------------------------------------------------

    def _served(self, x: torch.Tensor) -> tuple[DenseOxide | SegConvOxide, int] | None:
        """The plan for `x` and how many pieces it runs in (1, or the batch-32 pieces of
        a multiple of 32), checked; None where the library path serves it. A call a plan
        would serve is refused while autograd records or after the parameters changed;
        the library path serves whatever the module did."""
        if not self._plans or x.dtype is not torch.float32 or x.get_device() != self._ordinal:
            return None
        key, pieces = self._key_of(x)
        plan = self._plans.get(key)
        if plan is None:
            return None
        parameters = [self.weight] if self.bias is None else [self.weight, self.bias]
        check_planned_call(
            self._context,
            [x, *parameters],
            self._state() == self._planned_state,
            "the parameters changed after planning (an in-place update, load_state_dict, a "
            "new Parameter or .to()); call replan() to plan from the new weights",
        )
        return plan, pieces

    def _enqueue(
        self,
        served: tuple[DenseOxide | SegConvOxide, int],
        x: torch.Tensor,
        output: torch.Tensor,
    ) -> None:
        """Enqueues the plan on `x` (contiguous) into `output`, piece after piece: each
        piece is a contiguous run of whole items, on the stream in order (one split-K
        scratch serves them all)."""
        plan, pieces = served
        workspace = plan.producer.workspace_len
        stream = _current_raw_stream(self._ordinal)
        partials = self._partials(stream, workspace, x) if workspace else None
        xs, outputs = _pieces(x, pieces), _pieces(output, pieces)
        if torch.cuda.current_device() == self._ordinal:
            for piece, out in zip(xs, outputs, strict=True):
                plan.enqueue(piece, out, stream=stream, partials=partials)
            return
        with torch.cuda.device(self._ordinal):  # the plan's context current for the launch
            for piece, out in zip(xs, outputs, strict=True):
                plan.enqueue(piece, out, stream=stream, partials=partials)

    def _partials(self, stream: int, workspace: int, x: torch.Tensor) -> torch.Tensor:
        """Scratch for a split-K call's partial planes that no other stream uses: while
        `stream` captures, a new buffer from the graph's own pool (replays on any stream
        never share it); otherwise one buffer kept per stream, which the stream's calls
        use in its order (as PyTorch keeps cuBLAS workspaces per stream), so an eager
        call does not pay for an allocation."""
        if torch.cuda.is_current_stream_capturing():
            return x.new_empty(workspace)
        key = (stream, workspace)
        kept = self._stream_partials.get(key)
        if kept is None:
            if len(self._stream_partials) >= _KEPT_PARTIALS:
                # freed to the caching allocator's pool of its stream, reused in its order
                self._stream_partials.clear()
            kept = self._stream_partials[key] = x.new_empty(workspace)
        return kept

    # -- per wrapper -----------------------------------------------------------------

    def _plan_operands(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError

    def _shape_key(self, batch: int) -> object:
        raise NotImplementedError

    def _key_of(self, x: torch.Tensor) -> tuple[object, int]:
        """The plan key serving `x` and in how many pieces."""
        raise NotImplementedError

    def _plan(
        self, runtime: CudaRuntime, batch: int, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> DenseOxide | SegConvOxide:
        """The rule's pick for this site, batch and math on the device, planned."""
        return Area.plan(runtime, self.site, batch, self.math, weight, bias)


_EPILOGUE_NAMES = {
    DenseSite.LINEAR0: f"LeakyReLU({reference.LEAKY_SLOPE})",
    DenseSite.LINEAR1: f"LeakyReLU({reference.LEAKY_SLOPE})",
    DenseSite.CLASSIFIER: "log-softmax",
    DenseSite.EMBEDDING: "none",
}


class PlannedDense(_Planned):
    """`epilogue(linear(x))` at a dense boundary: pyspk plans for `x` of `(..., k)` whose
    rows are those of batch 1 or 32 (589 or 18,848 for the segmentation heads, 3 or 96
    for seg_1), the module's library path otherwise."""

    site: DenseSite
    bias: torch.Tensor  # a Linear without one is refused

    def __init__(
        self,
        linear: nn.Linear,
        site: DenseSite,
        math: CudaMath | str = CudaMath.FP32,
        name: str | None = None,
    ) -> None:
        self.site = site
        self._context = f"pyspk.torch {site.value}"
        self._epilogue = epilogue(site)
        self._rows, self._n, self._k = site.dimensions()
        if (linear.in_features, linear.out_features) != (self._k, self._n):
            raise GeometryInvalid(
                self._context,
                f"{site.value} is Linear({self._k}, {self._n}), not "
                f"Linear({linear.in_features}, {linear.out_features})",
            )
        if linear.bias is None:
            raise GeometryInvalid(self._context, f"{site.value} takes a bias; the module has none")
        super().__init__(linear, math, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        served = self._served(x)
        if served is None:
            return self.library(x)
        output = x.new_empty((*x.shape[:-1], self._n))
        try:
            self._enqueue(served, x.contiguous(), output)
        except ClosedError:  # closed (or re-planned) by another thread meanwhile
            return self.library(x)
        return output

    def library(self, x: torch.Tensor) -> torch.Tensor:
        """The library path: the module's `F.linear` and the epilogue."""
        y = F.linear(x, self.weight, self.bias)
        return y if self._epilogue is None else self._epilogue(y)

    def extra_repr(self) -> str:
        return (
            f"{self.site.value}, Linear({self._k}, {self._n}) then {_EPILOGUE_NAMES[self.site]}, "
            f"math={self.math}, plans={self.entries()}"
        )

    def _plan_operands(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight = self.weight.detach()
        # the linears take [k, n] (nn.Linear keeps [n, k]); seg_1 takes nn.Linear's layout
        weight = weight if self.site is DenseSite.EMBEDDING else weight.t()
        return weight.contiguous(), self.bias.detach().contiguous()

    def _shape_key(self, batch: int) -> object:
        return batch * self._rows

    def _key_of(self, x: torch.Tensor) -> tuple[object, int]:
        if x.dim() < 2 or x.shape[-1] != self._k:
            return None, 0
        rows, piece = x.numel() // self._k, PIECE * self._rows
        if rows > piece and rows % piece == 0:
            return piece, rows // piece
        return rows, 1


class PlannedConv1d(_Planned):
    """A valid five-tap `nn.Conv1d` at sincnet.conv1 (80 -> 60 channels) or conv2
    (60 -> 60): pyspk plans for `(1 or 32, cin, L)` inputs of the boundary's length L
    (5325, 1773), the module's library path otherwise.

    pyspk's convolutions have no bias. `bias="add"` adds the module's bias after the
    plan (one more elementwise kernel); `bias="drop"` leaves it out, which is exact only
    where what follows cancels a per-channel constant (in PyanNet a max-pool and then an
    InstanceNorm, which subtracts each channel's mean); the library path then drops it
    too, so both paths compute the same function."""

    site: SegConvSite

    def __init__(
        self,
        conv: nn.Conv1d,
        site: SegConvSite,
        math: CudaMath | str = CudaMath.FP32,
        bias: Literal["add", "drop"] = "add",
        name: str | None = None,
    ) -> None:
        self.site = site
        self._context = f"pyspk.torch {site.value}"
        _, self._n, k, self._length = site.dimensions()
        self._cin = k // CONV_TAPS
        shape = (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride)
        fixed = (conv.padding, conv.dilation, conv.groups, conv.padding_mode)
        if shape != (self._cin, self._n, (5,), (1,)) or fixed != ((0,), (1,), 1, "zeros"):
            raise GeometryInvalid(
                self._context,
                f"{site.value} is a valid Conv1d({self._cin}, {self._n}, 5) with stride 1, "
                f"not {conv}",
            )
        if bias not in ("add", "drop"):
            raise InvalidArgument(f"{self._context}: bias must be 'add' or 'drop', not {bias!r}")
        self.bias_mode = bias
        super().__init__(conv, math, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        served = self._served(x)
        if served is None:
            return self.library(x)
        output = x.new_empty((x.shape[0], self._n, self._length - 4))
        try:
            self._enqueue(served, x.contiguous(), output)
        except ClosedError:  # closed (or re-planned) by another thread meanwhile
            return self.library(x)
        if self.bias_mode == "add" and self.bias is not None:
            output += self.bias.view(1, -1, 1)
        return output

    def library(self, x: torch.Tensor) -> torch.Tensor:
        """The library path: the module's convolution, with the bias unless dropped."""
        return F.conv1d(x, self.weight, self.bias if self.bias_mode == "add" else None)

    def extra_repr(self) -> str:
        return (
            f"{self.site.value}, Conv1d({self._cin}, {self._n}, 5), bias={self.bias_mode}, "
            f"math={self.math}, plans={self.entries()}"
        )

    def _plan_operands(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.weight.detach().contiguous(), None

    def _shape_key(self, batch: int) -> object:
        return (batch, self._cin, self._length)

    def _key_of(self, x: torch.Tensor) -> tuple[object, int]:
        shape = tuple(x.shape)
        if len(shape) == 3 and shape[0] > PIECE and shape[0] % PIECE == 0:
            return (PIECE, *shape[1:]), shape[0] // PIECE
        return shape, 1


def _pieces(tensor: torch.Tensor, pieces: int) -> list[torch.Tensor] | tuple[torch.Tensor, ...]:
    """`tensor` (contiguous) as `pieces` equal runs of whole items: split along its
    first dimension where that divides, else along its rows of the last dimension."""
    if pieces == 1:
        return (tensor,)
    if tensor.shape[0] % pieces == 0:
        return tensor.chunk(pieces)
    return tensor.view(pieces, -1, tensor.shape[-1]).unbind()


def planned_modules(module: nn.Module) -> Iterator[tuple[str, PlannedModule]]:
    """(name, wrapper) for every pyspk module wrapper inside `module`."""
    for name, child in module.named_modules():
        if isinstance(child, PlannedModule):
            yield name, child
