"""`Area`: the one registry owner of the segmentation and embedding dense area."""

from __future__ import annotations

from collections.abc import Callable

from pyspk.candidate.framework import BoundaryId, BroadEvidence, Coverage, Fp16Policy
from pyspk.candidate.segdense.selection import (
    BROAD_EVIDENCE,
    DRIVER_COVERAGE,
    SegdensePin,
    Site,
)
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.kernels import KernelModule
from pyspk.cuda.math import CudaMath
from pyspk.cuda.tier import PtxTier


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
        return DRIVER_COVERAGE

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
        return SegdensePin.select(Site.from_boundary(boundary), batch, math, tier, device, fp16)

    tuning_fp32_pin = _tuning_pin(SegdensePin.select_fp32)
    tuning_tf32_pin = _tuning_pin(SegdensePin.select_tuning_tf32)
