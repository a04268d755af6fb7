"""The plan framework: specs, coverage, boundaries, evidence, contracts, the PlanError
family and phases. Expected values are computed by hand from the sites' sizes, rows per
batch item x columns x reduction: linear0 589 x 128 x 256, linear1 589 x 128 x 128, the
classifier (linear2) 589 x 7 x 128 and the embedding (resnet.seg_1) 3 x 256 x 5120; the
convolutions have 60 output channels of five taps over 80 (conv1) or 60 (conv2) input
channels of 5325 or 1773 samples."""

from __future__ import annotations

import math as pymath

import numpy as np
import pytest

import pyspk
import pyspk.errors
from pyspk.candidate import (
    PASS_THROUGH,
    AbsoluteSum,
    ArchitectureSpeed,
    Batches,
    BoundaryId,
    BroadEvidence,
    Coverage,
    CoverageEntry,
    DenseSite,
    DenseSpec,
    InfinityContract,
    Maths,
    NanContract,
    Op,
    PassThroughPhases,
    Phases,
    SegConvSite,
    SegConvSpec,
    SignedZeroContract,
    SpecialValues,
)
from pyspk.cuda import ComputeCapability, CudaMath, PtxTier
from pyspk.errors import (
    DeviceUnsupported,
    GeometryError,
    GeometryInvalid,
    GeometryUnimplemented,
    PlanError,
    WeightsOutOfContract,
)

FP32 = CudaMath.FP32
TF32 = CudaMath.TF32
FLT_MAX = float(np.finfo(np.float32).max)
LIMIT = 2**31

# --- specs -----------------------------------------------------------------------

# site -> batch -> (m, input, weight, bias, output); m = batch * rows, input m * k,
# weight n * k, bias n, output m * n (rows, n and k as the module docstring gives them)
DENSE = {
    DenseSite.LINEAR0: {
        1: (589, 150784, 32768, 128, 75392),
        32: (18848, 4825088, 32768, 128, 2412544),
    },
    DenseSite.LINEAR1: {
        1: (589, 75392, 16384, 128, 75392),
        32: (18848, 2412544, 16384, 128, 2412544),
    },
    DenseSite.CLASSIFIER: {
        1: (589, 75392, 896, 7, 4123),
        32: (18848, 2412544, 896, 7, 131936),
    },
    DenseSite.EMBEDDING: {
        1: (3, 15360, 1310720, 256, 768),
        32: (96, 491520, 1310720, 256, 24576),
    },
}
# site -> batch -> (cin, input b*cin*L, weight 60*k, output b*60*(L-4))
CONV = {
    SegConvSite.CONV1: {1: (80, 426000, 24000, 319260), 32: (80, 13632000, 24000, 10216320)},
    SegConvSite.CONV2: {1: (60, 106380, 18000, 106140), 32: (60, 3404160, 18000, 3396480)},
}


def test_dense_site_names_and_dimensions() -> None:
    assert {site.value for site in DenseSite} == {"linear0", "linear1", "linear2", "resnet.seg_1"}
    assert DenseSite.CLASSIFIER.value == "linear2"
    assert DenseSite.LINEAR0.dimensions() == (589, 128, 256)
    assert DenseSite.LINEAR1.dimensions() == (589, 128, 128)
    assert DenseSite.CLASSIFIER.dimensions() == (589, 7, 128)
    assert DenseSite.EMBEDDING.dimensions() == (3, 256, 5120)
    assert DenseSite.EMBEDDING.boundary() == BoundaryId.named("resnet.seg_1")


def test_conv_site_names_and_dimensions() -> None:
    assert {site.value for site in SegConvSite} == {"sincnet.conv1", "sincnet.conv2"}
    assert SegConvSite.CONV1.dimensions() == (5321, 60, 400, 5325)
    assert SegConvSite.CONV2.dimensions() == (1769, 60, 300, 1773)
    assert SegConvSite.CONV2.boundary() == BoundaryId.named("sincnet.conv2")


@pytest.mark.parametrize("math", [FP32, TF32])
@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("site", list(DenseSite))
def test_dense_spec_lengths(site: DenseSite, batch: int, math: CudaMath) -> None:
    spec = DenseSpec(site=site, batch=batch, math=math)
    m, x, w, b, y = DENSE[site][batch]
    assert (spec.site(), spec.batch(), spec.math()) == (site, batch, math)
    assert spec.rows() == m
    assert (spec.input_len(), spec.weight_len(), spec.bias_len(), spec.output_len()) == (x, w, b, y)


@pytest.mark.parametrize("math", [FP32, TF32])
@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("site", list(SegConvSite))
def test_conv_spec_lengths(site: SegConvSite, batch: int, math: CudaMath) -> None:
    spec = SegConvSpec(site=site, batch=batch, math=math)
    cin, x, w, y = CONV[site][batch]
    assert (spec.site(), spec.batch(), spec.math()) == (site, batch, math)
    assert spec.input_channels() == cin
    assert (spec.input_len(), spec.weight_len(), spec.output_len()) == (x, w, y)


BAD_BATCHES = [0, -1, -32, True, False, 1.0, 32.0, "1", None]


@pytest.mark.parametrize("batch", BAD_BATCHES, ids=repr)
def test_specs_refuse_bad_batches(batch: object) -> None:
    for site in DenseSite:
        with pytest.raises(GeometryInvalid):
            DenseSpec(site=site, batch=batch, math=FP32)
    for site in SegConvSite:
        with pytest.raises(GeometryInvalid):
            SegConvSpec(site=site, batch=batch, math=TF32)


def test_spec_batches_other_than_1_and_32_are_valid_geometry() -> None:
    # the area, not the spec, limits batches to 1 and 32
    assert DenseSpec(site=DenseSite.LINEAR0, batch=2, math=FP32).output_len() == 2 * 75392
    assert SegConvSpec(site=SegConvSite.CONV2, batch=3, math=FP32).input_len() == 3 * 106380


# the largest buffer per batch item is the input; the smallest batch whose input
# reaches 2**31 elements (no per-item size divides 2**31, so "reaches" is "passes")
CROSSING = [
    (DenseSite.LINEAR0, 150784, 14243),
    (DenseSite.LINEAR1, 75392, 28485),
    (DenseSite.CLASSIFIER, 75392, 28485),
    (DenseSite.EMBEDDING, 15360, 139811),
    (SegConvSite.CONV1, 426000, 5042),
    (SegConvSite.CONV2, 106380, 20187),
]


@pytest.mark.parametrize(
    ("site", "per_item", "batch"), CROSSING, ids=[row[0].name for row in CROSSING]
)
def test_specs_refuse_buffers_past_32_bit_indexing(
    site: DenseSite | SegConvSite, per_item: int, batch: int
) -> None:
    assert (batch - 1) * per_item < LIMIT < batch * per_item
    spec_class = DenseSpec if isinstance(site, DenseSite) else SegConvSpec
    below = spec_class(site=site, batch=batch - 1, math=FP32)
    assert below.input_len() == (batch - 1) * per_item
    with pytest.raises(GeometryUnimplemented):
        spec_class(site=site, batch=batch, math=FP32)
    with pytest.raises(GeometryUnimplemented):
        spec_class(site=site, batch=10**9, math=TF32)


def test_geometry_refusals_are_not_interchangeable() -> None:
    with pytest.raises(GeometryError) as caught:
        DenseSpec(site=DenseSite.EMBEDDING, batch=0, math=FP32)
    assert not isinstance(caught.value, GeometryUnimplemented)
    with pytest.raises(GeometryError) as caught:
        DenseSpec(site=DenseSite.EMBEDDING, batch=139811, math=FP32)
    assert not isinstance(caught.value, GeometryInvalid)


# --- coverage ----------------------------------------------------------------------


def test_batches() -> None:
    only = Batches.of(1, 32)
    assert only.covers(1)
    assert only.covers(32)
    for batch in (0, 2, 16, 31, 33, 64):
        assert not only.covers(batch)
    every = Batches.all()
    for batch in (1, 2, 32, 1000):
        assert every.covers(batch)
    assert Batches.of(4).covers(4)
    assert not Batches.of(4).covers(1)


def test_maths() -> None:
    assert Maths.ALL.covers(FP32)
    assert Maths.ALL.covers(TF32)
    assert Maths.FP32.covers(FP32)
    assert not Maths.FP32.covers(TF32)
    assert Maths.TF32.covers(TF32)
    assert not Maths.TF32.covers(FP32)


def test_coverage_entry_and_union() -> None:
    dense = CoverageEntry(("linear0", "linear1"), Batches.of(1, 32), Maths.TF32)
    assert dense.covers("linear0", 32, TF32)
    assert not dense.covers("linear0", 32, FP32)
    assert not dense.covers("linear0", 2, TF32)
    assert not dense.covers("linear2", 1, TF32)
    conv = CoverageEntry(("sincnet.conv1",), Batches.all(), Maths.FP32)
    coverage = Coverage((dense, conv))
    assert coverage.covers("linear1", 1, TF32)
    assert coverage.covers("sincnet.conv1", 7, FP32)
    assert not coverage.covers("sincnet.conv1", 7, TF32)
    assert not coverage.covers("sincnet.conv2", 1, FP32)
    assert coverage.covers(BoundaryId.named("linear1"), 32, TF32)
    assert not coverage.covers(BoundaryId.named("linear1"), 32, FP32)
    assert not Coverage(()).covers("linear0", 1, FP32)


# --- boundaries --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["sincnet.conv1", "sincnet.conv2", "linear0", "linear1", "linear2", "resnet.seg_1"]
)
def test_boundary_named(name: str) -> None:
    boundary = BoundaryId.named(name)
    assert boundary.name() == name
    assert str(boundary) == name
    assert boundary == BoundaryId.named(name)
    assert hash(boundary) == hash(BoundaryId.named(name))


def test_boundaries_differ_by_name() -> None:
    assert BoundaryId.named("linear0") != BoundaryId.named("linear1")


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Linear0",
        "RESNET.SEG_1",
        "1linear",
        ".linear0",
        "linear0.",
        "resnet..seg_1",
        "resnet seg_1",
        "seg-1",
        " linear0",
        "linear0\n",
    ],
)
def test_boundary_bad_names(name: str) -> None:
    with pytest.raises(ValueError):
        BoundaryId.named(name)


# --- evidence ------------------------------------------------------------------------


def _speed(major: int, minor: int, milli: int) -> ArchitectureSpeed:
    return ArchitectureSpeed(ComputeCapability(major, minor), milli)


def _evidence(*speeds: ArchitectureSpeed) -> BroadEvidence:
    return BroadEvidence.with_limits(speeds, "note", ComputeCapability(8, 0), PtxTier.SM80)


def test_broad_evidence_accepts() -> None:
    evidence = _evidence(_speed(8, 9, 1050), _speed(12, 0, 1300))
    assert [speed.minimum_speedup_milli for speed in evidence.architectures] == [1050, 1300]
    assert evidence.note == "note"
    assert evidence.minimum_capability == ComputeCapability(8, 0)
    assert evidence.tier is PtxTier.SM80
    assert (
        len(_evidence(_speed(8, 0, 2000), _speed(8, 6, 1051), _speed(8, 9, 1050)).architectures)
        == 3
    )
    # 8.0 and 8.9 are distinct capabilities
    _evidence(_speed(8, 0, 1100), _speed(8, 9, 1100))


def test_broad_evidence_refuses_too_few() -> None:
    with pytest.raises(ValueError):
        _evidence()
    with pytest.raises(ValueError):
        _evidence(_speed(8, 9, 1500))


def test_broad_evidence_refuses_slow() -> None:
    with pytest.raises(ValueError):
        _evidence(_speed(8, 9, 1049), _speed(12, 0, 1060))
    with pytest.raises(ValueError):
        _evidence(_speed(8, 9, 1060), _speed(12, 0, 1049))
    with pytest.raises(ValueError):
        _evidence(_speed(8, 9, 1060), _speed(12, 0, 900))


def test_broad_evidence_refuses_a_repeated_capability() -> None:
    with pytest.raises(ValueError):
        _evidence(_speed(8, 9, 1060), _speed(8, 9, 1100))
    with pytest.raises(ValueError):
        _evidence(_speed(8, 9, 1060), _speed(12, 0, 1100), _speed(8, 9, 1070))


# --- numerics contracts --------------------------------------------------------------


def test_absolute_sum_bound() -> None:
    contract = AbsoluteSum(headroom=2)
    half = FLT_MAX / 2
    assert contract.bound() == half
    assert contract.holds([half])
    assert contract.holds([0.0, 1.0, half])
    assert contract.holds(np.array([[half, 3.0], [0.0, 1e30]]))
    above = pymath.nextafter(half, pymath.inf)
    assert above > half
    assert not contract.holds([above])
    assert not contract.holds([0.0, above])
    assert not contract.holds([FLT_MAX])
    assert AbsoluteSum(headroom=4).holds([FLT_MAX / 4])
    assert not AbsoluteSum(headroom=4).holds([FLT_MAX / 2])


def test_special_values() -> None:
    values = SpecialValues(
        finite=AbsoluteSum(headroom=2),
        nan=NanContract.UNSPECIFIED,
        infinity=InfinityContract.UNSPECIFIED,
        signed_zero=SignedZeroContract.UNSPECIFIED,
    )
    assert values.finite.holds([FLT_MAX / 2])
    assert values == SpecialValues(
        AbsoluteSum(2),
        NanContract.UNSPECIFIED,
        InfinityContract.UNSPECIFIED,
        SignedZeroContract.UNSPECIFIED,
    )


# --- errors --------------------------------------------------------------------------


def test_plan_error_hierarchy() -> None:
    assert issubclass(GeometryInvalid, GeometryError)
    assert issubclass(GeometryUnimplemented, GeometryError)
    assert issubclass(GeometryError, PlanError)
    assert issubclass(DeviceUnsupported, PlanError)
    assert issubclass(WeightsOutOfContract, PlanError)
    assert not issubclass(GeometryInvalid, GeometryUnimplemented)
    assert not issubclass(GeometryUnimplemented, GeometryInvalid)
    assert not issubclass(DeviceUnsupported, GeometryError)
    assert not issubclass(WeightsOutOfContract, GeometryError)


def test_plan_errors_from_pyspk_errors() -> None:
    for name in (
        "PlanError",
        "GeometryError",
        "GeometryInvalid",
        "GeometryUnimplemented",
        "DeviceUnsupported",
        "WeightsOutOfContract",
    ):
        assert getattr(pyspk.errors, name) is globals()[name]
    assert pyspk.PlanError is PlanError


def test_plan_error_messages() -> None:
    error = GeometryUnimplemented("segdense plan", "linear0 batch 2")
    assert "segdense plan" in str(error)
    assert "linear0 batch 2" in str(error)
    assert "needs the sm80" in str(DeviceUnsupported("x needs the sm80 module"))
    weights = WeightsOutOfContract("segdense plan", "column 3 is infinite")
    assert "column 3 is infinite" in str(weights)


# --- phases --------------------------------------------------------------------------


def test_pass_through_phases() -> None:
    calls: list[int] = []
    sentinel = object()

    def launch() -> object:
        calls.append(1)
        return sentinel

    for op in Op:
        calls.clear()
        assert PASS_THROUGH.op(op, launch) is sentinel
        assert calls == [1]
    assert PassThroughPhases().op(Op.REDUCE, lambda: 7) == 7
    assert isinstance(PASS_THROUGH, Phases)
    assert {op.name for op in Op} == {"MAIN", "REDUCE"}


def test_pass_through_phases_propagates_errors() -> None:
    def launch() -> None:
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError, match="launch failed"):
        PASS_THROUGH.op(Op.MAIN, launch)
