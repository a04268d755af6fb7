"""The two candidates of the segdense area, as the plan framework names them:
`DenseOxide` (the dense heads and the embedding) and `SegConvOxide` (the convolutions),
each a `Producer` with the pin the device rule gives its spec."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, TypeVar

from pyspk.candidate.framework import Coverage, DenseSpec, Scratch, SegConvSpec, SpecialValues
from pyspk.candidate.segdense.producer import Producer
from pyspk.candidate.segdense.selection import SegdensePin, Site
from pyspk.candidate.segdense.shapes import DENSE_COVERAGE, SEGCONV_COVERAGE, SPECIAL_VALUES

if TYPE_CHECKING:
    from pyspk.cuda.device import DeviceAttributes
    from pyspk.cuda.kernels import LoadedKernels
    from pyspk.cuda.runtime import CudaRuntime
    from pyspk.cuda.tier import PtxTier

__all__ = ["DenseOxide", "SegConvOxide"]


_OxideT = TypeVar("_OxideT", bound="_Oxide")


class _Oxide:
    """What both candidates share: the pin the rule gives a spec, and a producer's
    enqueue and close."""

    SPECIAL_VALUES: ClassVar[SpecialValues] = SPECIAL_VALUES

    enqueue: Callable[..., None]
    """`Producer.enqueue` of this plan's producer, bound: one call layer less on the hot
    path."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.enqueue = producer.enqueue

    @classmethod
    def implemented_pin(
        cls, spec: DenseSpec | SegConvSpec, tier: PtxTier, device: DeviceAttributes
    ) -> SegdensePin:
        return SegdensePin.select(Site.of(spec.site()), spec.batch(), spec.math(), tier, device)

    @classmethod
    def plan_pinned(
        cls: type[_OxideT],
        runtime: CudaRuntime,
        kernels: LoadedKernels,
        spec: DenseSpec | SegConvSpec,
        weight: object,
        bias: object | None,
        pin: SegdensePin,
        scratch: Scratch | None = None,
    ) -> _OxideT:
        """What both candidates' `plan` does: the pin checked against the spec and the
        loaded module, then the producer planned."""
        pin.check(Site.of(spec.site()), spec.batch(), spec.math(), kernels.tier)
        return cls(Producer.plan(runtime, kernels, weight, bias, pin, scratch))

    @property
    def runtime(self) -> CudaRuntime:
        return self.producer.runtime

    @property
    def closed(self) -> bool:
        return self.producer.closed

    def close(self) -> None:
        self.producer.close()

    def __enter__(self: _OxideT) -> _OxideT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DenseOxide(_Oxide):
    """Segmentation linear0, linear1 and classifier, and embedding seg_1, with their
    bias, LeakyReLU or log-softmax epilogues fused."""

    COVERAGE: ClassVar[Coverage] = DENSE_COVERAGE

    @classmethod
    def plan(
        cls,
        runtime: CudaRuntime,
        kernels: LoadedKernels,
        spec: DenseSpec,
        weight: object,
        bias: object,
        pin: SegdensePin,
        scratch: Scratch | None = None,
    ) -> DenseOxide:
        return cls.plan_pinned(runtime, kernels, spec, weight, bias, pin, scratch)


class SegConvOxide(_Oxide):
    """The two raw segmentation convolutions; the caller's pooling stage adds the bias."""

    COVERAGE: ClassVar[Coverage] = SEGCONV_COVERAGE

    @classmethod
    def plan(
        cls,
        runtime: CudaRuntime,
        kernels: LoadedKernels,
        spec: SegConvSpec,
        weight: object,
        pin: SegdensePin,
    ) -> SegConvOxide:
        return cls.plan_pinned(runtime, kernels, spec, weight, None, pin)
