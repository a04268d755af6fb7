"""`Area`: the one registry owner of the segmentation and embedding dense area, and the
front door `plan` that goes through it: site, batch, math and weights in, a plan out,
its entry picked from the runtime's own tier and device."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspk.candidate.errors import GeometryUnimplemented
from pyspk.candidate.framework import (
    BOUNDARIES,
    Batches,
    BoundaryId,
    BroadEvidence,
    Coverage,
    CoverageEntry,
    DenseSite,
    DenseSpec,
    Fp16Policy,
    Maths,
    Scratch,
    SegConvSite,
    SegConvSpec,
)
from pyspk.candidate.segdense.candidates import DenseOxide, SegConvOxide
from pyspk.candidate.segdense.selection import Hardware, SegdensePin, Site
from pyspk.candidate.segdense.shapes import BATCHES, BROAD_EVIDENCE, CONTEXT
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.math import CudaMath
from pyspk.cuda.tier import PtxTier

if TYPE_CHECKING:
    from pyspk.cuda.runtime import CudaRuntime


def _tuning_pin(select: Callable[..., SegdensePin | None]) -> classmethod:
    """`Area`'s tuning pin on `select` (a `SegdensePin` selector, whose docstring it
    takes): the boundary's site, then the selector's own arguments."""

    def pin(
        cls: type,
        boundary: BoundaryId,
        batch: int,
        math: CudaMath,
        device: DeviceAttributes,
        tier: PtxTier,
    ) -> SegdensePin | None:
        return select(Site.from_boundary(boundary), batch, math, tier, device)

    pin.__doc__ = select.__doc__
    return classmethod(pin)


class Area:
    """Routes the six boundaries to their segdense pins; needs no GPU."""

    AREA = KernelModule.SEGDENSE

    @classmethod
    def driver_coverage(cls, tier: PtxTier, device: DeviceAttributes, fp16: Fp16Policy) -> Coverage:
        """The boundaries, batches and maths the device rule gives a pin for on the
        module `tier` and `device` under `fp16`, one coverage entry per batch and math."""
        hardware = Hardware.of(device)
        entries = []
        for batch in BATCHES:
            for math in CudaMath:
                layers = [
                    site.value
                    for site in Site
                    if site.rule_choice(batch, math, tier, hardware, fp16) is not None
                ]
                if layers:
                    entries.append(CoverageEntry(layers, Batches.of(batch), Maths(math.value)))
        return Coverage(entries)

    @classmethod
    def broad_evidence(cls) -> BroadEvidence | None:
        return BROAD_EVIDENCE

    @classmethod
    def driver_pin(
        cls,
        boundary: BoundaryId,
        batch: int,
        math: CudaMath,
        device: DeviceAttributes,
        tier: PtxTier,
        fp16: Fp16Policy,
    ) -> SegdensePin:
        """The device rule's pin for `boundary` at `batch` in `math` on the module `tier`
        and `device` under `fp16`; `GeometryUnimplemented` where the area's coverage
        there has none (another boundary, or a batch the kernels are not compiled for)."""
        if not cls.driver_coverage(tier, device, fp16).covers(boundary, batch, math):
            raise GeometryUnimplemented(
                CONTEXT,
                f"{boundary} batch {batch} {math} is not covered: the kernels compile "
                f"batches {' and '.join(map(str, BATCHES))} of {', '.join(BOUNDARIES)}",
            )
        return SegdensePin.select(Site.from_boundary(boundary), batch, math, tier, device, fp16)

    tuning_fp32_pin = _tuning_pin(SegdensePin.select_fp32)
    tuning_tf32_pin = _tuning_pin(SegdensePin.select_tuning_tf32)

    @classmethod
    def plan(
        cls,
        runtime: CudaRuntime,
        site: Site | DenseSite | SegConvSite | BoundaryId,
        batch: int,
        math: CudaMath,
        weight: object,
        bias: object | None = None,
        *,
        pin: SegdensePin | None = None,
        scratch: Scratch | None = None,
        fp16: Fp16Policy = Fp16Policy.ALLOW,
    ) -> DenseOxide | SegConvOxide:
        """A plan of the boundary `site` (any of the vocabulary's names for it) at `batch`
        in `math`, from `weight` and, for the dense sites, `bias` (device buffers: pyspk
        `DeviceBuffer`s or `__cuda_array_interface__` objects, in the layouts the README
        gives). The entry is the device rule's pick for the runtime's loaded tier and
        device under `fp16`, or `pin` where given (tests and tuning). `scratch` holds a
        split-K plan's partial planes instead of a buffer of its own.

        Raises `GeometryUnimplemented` for a batch the kernels are not compiled for
        (take the library call), `GeometryInvalid` for a bias given to a convolution or
        missing for a dense site."""
        area_site = Site.of(site)
        framework_site = area_site.framework_site()
        kernels = runtime.load_kernels(cls.AREA)
        boundary = framework_site.boundary()
        if pin is None:
            pin = cls.driver_pin(boundary, batch, math, runtime.device, kernels.tier, fp16)
        conv = isinstance(framework_site, SegConvSite)
        # the producer refuses a bias given to a convolution or missing for a dense site
        spec = (
            SegConvSpec(framework_site, batch, math)
            if isinstance(framework_site, SegConvSite)
            else DenseSpec(framework_site, batch, math)
        )
        candidate = SegConvOxide if conv else DenseOxide
        return candidate.plan_pinned(runtime, kernels, spec, weight, bias, pin, scratch)


plan = Area.plan
"""The front door (`Area.plan`): a plan of one boundary, its entry picked by the device
rule for the runtime's tier and device."""
