"""The segdense `Area`: its driver and tuning pins, coverages, broad evidence, the
driver-candidate protocol, special values and public names (no GPU)."""

from __future__ import annotations

import itertools

import pytest

import pyspk
from pyspk.candidate.errors import GeometryUnimplemented
from pyspk.candidate.framework import (
    ArchitectureSpeed,
    BoundaryId,
    DriverCandidate,
    Fp16Policy,
    InfinityContract,
    NanContract,
    SignedZeroContract,
)
from pyspk.candidate.segdense import (
    DENSE_COVERAGE,
    SEGCONV_COVERAGE,
    SPECIAL_VALUES,
    Area,
    Choice,
    Entry,
    SegdensePin,
    Site,
)
from pyspk.candidate.segdense.selection import Products
from pyspk.cuda import ComputeCapability, CudaMath
from tests.segdense_expected import BOUNDARY_SITES, MATHS, SM75, SM80, TF32, K, device

# --- Area ----------------------------------------------------------------------------

AREA_DEVICES = [
    device(8, 0, 108, 163 * K),
    device(8, 9, 34),
    device(12, 0, 36),
    device(12, 0, 30),
    device(11, 0, 20),
]


def test_area_driver_pin() -> None:
    for dev, (name, site), batch, math, tier, fp16 in itertools.product(
        AREA_DEVICES, BOUNDARY_SITES.items(), (1, 32), MATHS, (SM75, SM80), Fp16Policy
    ):
        got = Area.driver_pin(BoundaryId.named(name), batch, math, dev, tier, fp16)
        assert got == SegdensePin.select(Site[site], batch, math, tier, dev, fp16)
        if fp16 is Fp16Policy.ALLOW:
            assert got == SegdensePin.select(Site[site], batch, math, tier, dev)


def test_fp16_forbid_picks_no_fp16_products_anywhere() -> None:
    """FORBID: the FP16 embedding takes its TF32 alternative, the other FP16 entries the
    kernel FP32 math picks; every other tuple keeps its pick."""
    replaced = 0
    for dev, site, batch, math, tier in itertools.product(
        AREA_DEVICES, Site, (1, 32), MATHS, (SM75, SM80)
    ):
        allowed = SegdensePin.select(site, batch, math, tier, dev)
        forbidden = SegdensePin.select(site, batch, math, tier, dev, Fp16Policy.FORBID)
        assert forbidden.entry().products() is not Products.FP16
        assert forbidden.math is math and forbidden.entry().site() is site
        if allowed.entry().products() is not Products.FP16:
            assert forbidden == allowed
            continue
        replaced += 1
        if allowed.entry() is Entry.EMBED_B32_F16:
            assert forbidden.entry() in (Entry.EMBED_B32_TF32, Entry.EMBED_B32_TF32_K2)
        else:
            fp32 = SegdensePin.select(site, batch, CudaMath.FP32, tier, dev)
            assert forbidden.choice == fp32.choice
    assert replaced > 0


def test_area_driver_pin_refusals() -> None:
    dev = device(8, 9, 34)
    with pytest.raises(GeometryUnimplemented):
        Area.driver_pin(BoundaryId.named("linear3"), 32, TF32, dev, SM80, Fp16Policy.ALLOW)
    with pytest.raises(GeometryUnimplemented, match=r"batch 8\b"):
        Area.driver_pin(BoundaryId.named("linear0"), 8, TF32, dev, SM80, Fp16Policy.ALLOW)


def test_area_tuning_pins() -> None:
    for dev, (name, site), batch, math, tier in itertools.product(
        AREA_DEVICES, BOUNDARY_SITES.items(), (1, 32), MATHS, (SM75, SM80)
    ):
        boundary = BoundaryId.named(name)
        assert Area.tuning_fp32_pin(boundary, batch, math, dev, tier) == (
            SegdensePin.select_fp32(Site[site], batch, math, tier, dev)
        )
        assert Area.tuning_tf32_pin(boundary, batch, math, dev, tier) == (
            SegdensePin.select_tuning_tf32(Site[site], batch, math, tier, dev)
        )
    ada = device(8, 9, 34)
    seg = BoundaryId.named("resnet.seg_1")
    assert Area.tuning_tf32_pin(seg, 32, TF32, ada, SM80) == SegdensePin(
        Choice(Entry.EMBED_B32_TF32, 34), TF32, SM80
    )
    assert Area.tuning_fp32_pin(seg, 32, TF32, ada, SM80) == SegdensePin(
        Choice(Entry.EMBED_B32, 34), TF32, SM80
    )
    assert Area.tuning_tf32_pin(seg, 2, TF32, ada, SM80) is None
    with pytest.raises(GeometryUnimplemented):
        Area.tuning_fp32_pin(seg, 2, TF32, ada, SM80)
    for method in (Area.tuning_fp32_pin, Area.tuning_tf32_pin):
        with pytest.raises(GeometryUnimplemented):
            method(BoundaryId.named("resnet.seg_2"), 32, TF32, ada, SM80)


def test_area_driver_coverage() -> None:
    coverage = Area.driver_coverage(SM80, device(8, 9, 34), Fp16Policy.ALLOW)
    names = [
        *BOUNDARY_SITES,
        "linear3",
        "resnet.seg_2",
        "sincnet.conv3",
        "conv1",
        "resnet",
        "seg_1",
    ]
    for name, batch, math in itertools.product(names, (0, 1, 2, 16, 31, 32, 33, 64), MATHS):
        want = name in BOUNDARY_SITES and batch in (1, 32)
        assert coverage.covers(name, batch, math) is want, (name, batch, math)
        assert coverage.covers(BoundaryId.named(name), batch, math) is want
    for tier, fp16 in itertools.product((SM75, SM80), Fp16Policy):
        assert Area.driver_coverage(tier, device(12, 0, 36), fp16) == coverage


def test_plan_coverages() -> None:
    # DenseOxide covers linear0, linear1, linear2 and resnet.seg_1, SegConvOxide the two
    # sincnet convolutions, each at batches 1 and 32 and every math
    dense = {"linear0", "linear1", "linear2", "resnet.seg_1"}
    conv = {"sincnet.conv1", "sincnet.conv2"}
    for name, batch, math in itertools.product(BOUNDARY_SITES, (1, 2, 32), MATHS):
        assert DENSE_COVERAGE.covers(name, batch, math) is (name in dense and batch != 2)
        assert SEGCONV_COVERAGE.covers(name, batch, math) is (name in conv and batch != 2)


def test_area_broad_evidence() -> None:
    evidence = Area.broad_evidence()
    assert evidence is not None
    assert list(evidence.architectures) == [
        ArchitectureSpeed(ComputeCapability(8, 9), 1060),
        ArchitectureSpeed(ComputeCapability(12, 0), 1060),
    ]
    assert evidence.minimum_capability == ComputeCapability(8, 0)
    assert evidence.tier is SM80
    assert evidence.note.startswith("segdense sm80")
    assert ">=1.06x" in evidence.note


def test_area_provides_the_driver_candidate_protocol() -> None:
    # the Rust Area declares `const AREA: KernelModule = KernelModule::Segdense`;
    # framework.DriverCandidate declares AREA too
    wanted = set(DriverCandidate.__annotations__) | {
        name for name in vars(DriverCandidate) if not name.startswith("_")
    }
    missing = sorted(name for name in wanted if not hasattr(Area, name))
    assert missing == []
    assert "segdense" in str(getattr(Area.AREA, "value", Area.AREA)).lower()


def test_special_values() -> None:
    # the reference's special-value contract: finite inputs with a headroom of 2, and
    # NaN, infinity and signed zero unspecified
    assert SPECIAL_VALUES.finite.headroom == 2
    assert SPECIAL_VALUES.nan is NanContract.UNSPECIFIED
    assert SPECIAL_VALUES.infinity is InfinityContract.UNSPECIFIED
    assert SPECIAL_VALUES.signed_zero is SignedZeroContract.UNSPECIFIED


def test_public_names() -> None:
    assert pyspk.Site is Site
    assert pyspk.Entry is Entry
    assert pyspk.SegdensePin is SegdensePin
    assert pyspk.plan == Area.plan
