"""A WeSpeaker ResNet34's trunk on trunk plans (`pyspk.candidate.trunk`).

`trunk_weights(resnet)` folds the trunk's BatchNorms (running statistics, read once)
into its convolutions in float64. `PlannedTrunk(resnet, math)` is a `forward_frames`
for that module: fbank `(B, 998, 80)` float32 on the plan's device runs in pieces of 16
chunks that alternate between two trunk plans, the first on PyTorch's current stream,
the second on a private side stream that forks from it and joins it again, so one plan's kernels
fill the last partial wave of the other's and the call can be captured in a CUDA graph
(`streams=1`: pieces of 32 on one plan; up to four plans, in pieces of `piece`). Each
chunk's output has the same bits either way. Any other input takes the module's own
`forward_frames`.
Like `pyspk.torch`'s wrappers it is inference-only (`InferenceOnlyError` while autograd
records) and refuses a call after the parameters changed (`WeightsChangedError`).

`PlannedStatsPool(pool, device)` stands for the model's `pool` (pyannote's TSTP over a
`StatsPool`) where it is given weights: the trunk area's pooling kernel
(`pyspk.candidate.trunk.pooling`), one launch for every chunk and speaker, in place of
the library's dozen passes per speaker. Without weights, or for shapes the kernel does
not take, the library's pool runs."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from pyspk.candidate.errors import GeometryUnimplemented
from pyspk.candidate.trunk import (
    OUTPUT_SHAPE,
    TRUNK_BATCH,
    TRUNK_BINS,
    TRUNK_BLOCKS,
    TRUNK_FRAMES,
    BatchNorm,
    Block,
    FoldedConv,
    TrunkPlan,
    TrunkSite,
    TrunkWeights,
    plan_trunk,
)
from pyspk.candidate.trunk.pooling import StatsPoolPlan, plan_stats_pool, pool_takes
from pyspk.cuda import CudaRuntime
from pyspk.cuda.errors import ClosedError, InvalidArgument
from pyspk.cuda.math import CudaMath
from pyspk.torch import (
    _OnePlan,
    _ordinal,
    check_planned_call,
    shared_runtime,
    tensor_state,
)
from pyspk.torch._streams import STREAMS

__all__ = ["PlannedStatsPool", "PlannedTrunk", "trunk_weights"]

CONTEXT = "pyspk.torch.resnet"


def _norm(module: object) -> BatchNorm:
    if not isinstance(module, nn.BatchNorm2d) or module.running_mean is None:
        raise InvalidArgument(f"{CONTEXT}: expected a BatchNorm2d with running statistics")

    def host(tensor: torch.Tensor | None, default: float) -> Any:
        if tensor is None:  # affine=False
            return torch.full((module.num_features,), default, dtype=torch.float64).numpy()
        return tensor.detach().to("cpu", torch.float64).numpy()

    return BatchNorm(
        host(module.weight, 1.0),
        host(module.bias, 0.0),
        host(module.running_mean, 0.0),
        host(module.running_var, 1.0),
        float(module.eps),
    )


def _fold(site: TrunkSite, conv: object, norm: object) -> FoldedConv:
    if not isinstance(conv, nn.Conv2d) or conv.bias is not None:
        raise InvalidArgument(f"{CONTEXT}: {site} expects a Conv2d without bias")
    shape = site.shape
    if conv.stride != (shape.stride, shape.stride) or conv.padding != (shape.pad, shape.pad):
        raise InvalidArgument(
            f"{CONTEXT}: {site} expects stride {shape.stride} and padding {shape.pad}, "
            f"not {conv.stride} and {conv.padding}"
        )
    weight = conv.weight.detach().to("cpu", torch.float64).numpy()
    return FoldedConv.fold(site, weight, _norm(norm))


def trunk_weights(resnet: nn.Module) -> TrunkWeights:
    """The trunk of a WeSpeaker ResNet34 (`model.resnet`: conv1, bn1, layer1..layer4 of
    BasicBlocks) folded; `GeometryInvalid` or `InvalidArgument` for another shape."""
    blocks = []
    for layer, count in enumerate(TRUNK_BLOCKS, start=1):
        modules = getattr(resnet, f"layer{layer}", None)
        if modules is None or len(modules) != count:
            raise InvalidArgument(f"{CONTEXT}: layer{layer} must hold {count} BasicBlocks")
        for index, module in enumerate(modules):
            first, second, shortcut = TrunkSite.of_block(layer, index)
            projection = None
            if shortcut is not None:
                if len(module.shortcut) != 2:
                    raise InvalidArgument(f"{CONTEXT}: layer{layer}[0] needs a 1x1 shortcut")
                projection = _fold(shortcut, module.shortcut[0], module.shortcut[1])
            elif len(module.shortcut) != 0:
                raise InvalidArgument(f"{CONTEXT}: layer{layer}[{index}] has a projection")
            blocks.append(
                Block(
                    _fold(first, module.conv1, module.bn1),
                    _fold(second, module.conv2, module.bn2),
                    projection,
                )
            )
    stem = _fold(TrunkSite.STEM, resnet.conv1, resnet.bn1)
    return TrunkWeights(stem, tuple(blocks))


class PlannedTrunk:
    """`forward_frames` of `resnet` on `streams` (1 to MAX_STREAMS) trunk plans, a call's
    chunks in pieces of `piece` (default: TRUNK_BATCH split evenly over the plans), on
    `runtime` (default: the device's shared one; another one to pick a PTX tier);
    `halves`, `middles` and `stream16` as `plan_trunk` takes them; `close()` frees them."""

    MAX_STREAMS = 4

    def __init__(
        self,
        resnet: nn.Module,
        math: CudaMath | str = CudaMath.FP32,
        streams: int = 2,
        runtime: CudaRuntime | None = None,
        halves: bool | None = None,
        piece: int | None = None,
        middles: bool | None = None,
        stream16: bool | None = None,
    ) -> None:
        if streams not in range(1, self.MAX_STREAMS + 1):
            raise InvalidArgument(
                f"{CONTEXT}: streams must be 1 to {self.MAX_STREAMS}, not {streams!r}"
            )
        self.piece = -(-TRUNK_BATCH // streams) if piece is None else piece
        if isinstance(self.piece, bool) or self.piece not in range(1, TRUNK_BATCH + 1):
            raise InvalidArgument(f"{CONTEXT}: piece must be 1 to {TRUNK_BATCH}, not {piece!r}")
        self.resnet = resnet
        self.math = CudaMath.parse(math)
        # the class's forward_frames (a WeSpeaker ResNet's; nn.Module declares none)
        stock = cast(Any, type(resnet)).forward_frames
        self._library: Callable[[torch.Tensor], torch.Tensor] = stock.__get__(resnet)
        device = next(resnet.parameters()).device
        if device.type != "cuda":
            raise InvalidArgument(f"{CONTEXT}: the model is on {device}, not a CUDA device")
        self._ordinal = _ordinal(device)
        weights = trunk_weights(resnet)
        self._planned_state = self._state()
        if runtime is None:
            runtime = shared_runtime(self._ordinal)
        elif runtime.ordinal != self._ordinal:
            raise InvalidArgument(
                f"{CONTEXT}: the runtime is on device {runtime.ordinal}, "
                f"the model on {self._ordinal}"
            )
        self.plans: list[TrunkPlan] = []
        self._sides: list[torch.cuda.Stream] = []
        try:
            for _ in range(streams):
                self.plans.append(
                    plan_trunk(
                        runtime,
                        self.math,
                        weights,
                        halves=halves,
                        middles=middles,
                        stream16=stream16,
                    )
                )
            # private streams: one of PyTorch's pooled streams can be another thread's,
            # and its work would join a capture that forks to it (`_streams.private_stream`)
            if streams > 1:
                self._sides = STREAMS.take(device, streams - 1)
                self._give_back = weakref.finalize(self, STREAMS.give_back, self._sides)
        except BaseException:
            self.close()
            raise
        self.plan = self.plans[0]

    def _state(self) -> tuple[int, ...]:
        return tensor_state([*self.resnet.parameters(), *self.resnet.buffers()])

    def __call__(self, fbank: torch.Tensor) -> torch.Tensor:
        if (
            self.closed
            or fbank.dim() != 3
            or tuple(fbank.shape[1:]) != (TRUNK_FRAMES, TRUNK_BINS)
            or fbank.dtype is not torch.float32
            or fbank.get_device() != self._ordinal
            or fbank.shape[0] == 0
        ):
            return self._library(fbank)
        check_planned_call(
            CONTEXT,
            [fbank, *self.resnet.parameters()],
            self._state() == self._planned_state,
            "the trunk's parameters or statistics changed after planning; plan again",
        )
        fbank = fbank.contiguous()
        chunks = fbank.shape[0]
        output = torch.empty((chunks, *OUTPUT_SHAPE), device=fbank.device, dtype=torch.float32)
        # pieces go to the plans in turn, the first on this stream, the others on the
        # side streams; the joins order the caller's later work (and the allocator's
        # reuse of fbank and output) after all of them
        main = torch.cuda.current_stream(self._ordinal)
        streams = [main, *self._sides]
        piece = self.piece
        for side in self._sides:
            side.wait_stream(main)
        for index, start in enumerate(range(0, chunks, piece)):
            stop = min(start + piece, chunks)
            which = index % len(streams)
            self.plans[which].enqueue(
                fbank[start:stop],
                output[start:stop],
                items=stop - start,
                stream=streams[which].cuda_stream,
            )
        for side in self._sides:
            main.wait_stream(side)
        return output

    @property
    def closed(self) -> bool:
        return not self.plans or any(plan.closed for plan in self.plans)

    def close(self) -> None:
        for plan in self.plans:
            plan.close()
        if self._sides:
            self._give_back()

    def entries(self) -> str:
        return f"trunk {self.math}"

    def __repr__(self) -> str:
        return f"PlannedTrunk({self.math}, streams={len(self.plans)}, closed={self.closed})"


class PlannedStatsPool(_OnePlan):
    """`forward(features, weights)` of a WeSpeaker ResNet's `pool`: features `(B, D, C,
    T)` and weights `(B, speakers, frames)` (or `(B, frames)`) float32 on `device` give
    `(B, speakers, 2 D C)` (or `(B, 2 D C)`), the weights first interpolated to T frames
    as the library does; refuses, with `GeometryUnimplemented`, a pool that is not
    TSTP over pyannote's `StatsPool`."""

    def __init__(self, pool: nn.Module, device: torch.device | int | None = None) -> None:
        super().__init__()
        from pyannote.audio.models.blocks.pooling import StatsPool
        from pyannote.audio.models.embedding.wespeaker.resnet import TSTP

        if type(pool) is not TSTP or type(getattr(pool, "stats_pool", None)) is not StatsPool:
            raise GeometryUnimplemented(
                "pyspk PlannedStatsPool", f"the pool is a {type(pool).__name__}, not TSTP"
            )
        self.pool = pool
        self._ordinal = _ordinal(device)
        self._plan: StatsPoolPlan | None = plan_stats_pool(shared_runtime(self._ordinal))

    def _served(self, features: torch.Tensor, weights: torch.Tensor | None) -> bool:
        return (
            weights is not None
            and features.dim() == 4
            and weights.dim() in (2, 3)
            and features.dtype is torch.float32
            and weights.dtype is torch.float32
            and features.get_device() == self._ordinal
            and weights.get_device() == self._ordinal
            and features.shape[0] == weights.shape[0]
            and weights.shape[-1] > 0
            and pool_takes(
                features.shape[0],
                1 if weights.dim() == 2 else weights.shape[1],
                features.shape[1] * features.shape[2],
                features.shape[3],
            )
        )

    def forward(self, features: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        plan = self._plan
        if plan is None:
            raise ClosedError(
                "pyspk PlannedStatsPool: closed; nothing was launched (make another, or "
                "accelerate the model again)"
            )
        if weights is None or not self._served(features, weights):
            return self.pool(features, weights=weights)
        check_planned_call("pyspk PlannedStatsPool", [features, weights], True, "")
        items, dimension, channels, frames = features.shape
        x = features.reshape(items, dimension * channels, frames).contiguous()
        w = weights.unsqueeze(1) if weights.dim() == 2 else weights
        if w.shape[2] != frames:  # as StatsPool.forward does
            w = F.interpolate(w, size=frames, mode="nearest")
        w = w.contiguous()
        speakers, rows = w.shape[1], x.shape[1]
        y = torch.empty((items, speakers, 2 * rows), device=x.device, dtype=torch.float32)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        plan.enqueue(
            x, w, y, items=items, speakers=speakers, features=rows, frames=frames, stream=stream
        )
        return y[:, 0] if weights.dim() == 2 else y

    def entries(self) -> str:
        return "spk_trunk_stats_pool"
