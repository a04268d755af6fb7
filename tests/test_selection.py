"""The segdense device rule, checked without a GPU against values derived by hand from
reference/segdense.rs (its match arms, consts and formulas), never from the code under
test. Line references name reference/segdense.rs."""

from __future__ import annotations

import itertools

import pytest

import pyspk
from pyspk.candidate.errors import (
    DeviceUnsupported,
    GeometryError,
    GeometryInvalid,
    GeometryUnimplemented,
)
from pyspk.candidate.framework import (
    ArchitectureSpeed,
    BoundaryId,
    DenseSite,
    DriverCandidate,
    Fp16Policy,
    InfinityContract,
    NanContract,
    SegConvSite,
    SignedZeroContract,
)
from pyspk.candidate.segdense import (
    BATCHES,
    DEFAULT_SHARED,
    DENSE_COVERAGE,
    EMBED_MAX_SPLITS,
    FLAT_MAX_SPLITS,
    HALF_MIN_SPLITS,
    HALF_SHARED,
    HALF_SLICE,
    HALF_STAGE,
    SEGCONV_COVERAGE,
    SELECT_ROWS,
    SPECIAL_VALUES,
    Area,
    Choice,
    Classifier,
    Config,
    Conv,
    Entry,
    Fragments,
    Gemm,
    Gemv,
    Hardware,
    Reduction,
    ReductionShape,
    SegdensePin,
    Site,
    Split,
    SplitWeights,
    TensorConv,
)
from pyspk.candidate.segdense.selection import Products
from pyspk.cuda import ComputeCapability, CudaMath, DeviceAttributes, PtxTier

FP32 = CudaMath.FP32
TF32 = CudaMath.TF32
SM75 = PtxTier.SM75
SM80 = PtxTier.SM80
MATHS = (FP32, TF32)
K = 1024

# HALF_SHARED by hand from the const block (segdense.rs lines 66-70):
# ring = 96 * (320 / 2 + 4) + 3 * (32 / 2) * (128 + 8) = 15744 + 6528 = 22272
# reduction = 192 * 32 * 64 / 32 = 12288; 4 * (96 + 22272) = 89472
HAND_HALF_SHARED = 4 * (
    96 + max(96 * (320 // 2 + 4) + 3 * (32 // 2) * (128 + 8), 192 * 32 * 64 // 32)
)
# HALF_MIN_SPLITS (line 62): (5120 / 32).div_ceil(320 / 32) = 160.div_ceil(10) = 16
HAND_HALF_MIN_SPLITS = 16

# Entries documented "sm80 tier:" (lines 341-377); LINEAR1_B1_TF32 is SIMT on sm75
SM80_ONLY = {
    "CONV1_B32_TC",
    "CONV1_B32_X3",
    "CONV2_B32_TC",
    "CONV2_B32_X3",
    "LINEAR0_B1_TF32",
    "LINEAR0_B32_SELECT",
    "LINEAR1_B32_TF32",
    "EMBED_B32_TF32",
    "EMBED_B32_TF32_K2",
    "EMBED_B32_TF32_E64",
    "EMBED_B32_X3",
    "EMBED_B32_F16",
}
# Entries whose products are TF32 or FP16 (the rule pairs them only with TF32 math)
REDUCED_PRODUCTS = {
    "CONV1_B32_TC",
    "CONV2_B32_TC",
    "LINEAR0_B1_TF32",
    "LINEAR0_B32_SELECT",
    "LINEAR1_B1_TF32",
    "LINEAR1_B32_TF32",
    "EMBED_B32_TF32",
    "EMBED_B32_TF32_K2",
    "EMBED_B32_TF32_E64",
    "EMBED_B32_F16",
}
SPLIT_ENTRIES = {
    "EMBED_B32",
    "EMBED_B32_TF32",
    "EMBED_B32_TF32_K2",
    "EMBED_B32_TF32_E64",
    "EMBED_B32_X3",
    "EMBED_B32_F16",
}


def device(major: int, minor: int, sms: int, optin: int = 99 * K) -> DeviceAttributes:
    return DeviceAttributes(
        ComputeCapability(major, minor), multiprocessors=sms, shared_optin_bytes=optin
    )


def hardware(major: int, minor: int, sms: int, optin: int = 99 * K) -> Hardware:
    return Hardware(ComputeCapability(major, minor), sms, optin)


# --- consts --------------------------------------------------------------------------


def test_consts_match_the_rust() -> None:
    assert HAND_HALF_SHARED == 89472
    assert HALF_SHARED == 89472
    assert HALF_MIN_SPLITS == HAND_HALF_MIN_SPLITS
    assert (HALF_STAGE, HALF_SLICE, SELECT_ROWS) == (32, 320, 16)
    assert (EMBED_MAX_SPLITS, FLAT_MAX_SPLITS) == (128, 40)
    assert DEFAULT_SHARED == 48 * 1024
    assert tuple(BATCHES) == (1, 32)


# --- Hardware ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sms", "tiles", "resident", "expected"),
    [
        # (multiprocessors * resident / tiles).clamp(1, 128), line 131
        (1, 2, 2, 1),
        (1, 2, 1, 1),  # 1 * 1 / 2 = 0 -> 1
        (1, 4, 2, 1),  # 1 * 2 / 4 = 0 -> 1
        (3, 4, 2, 1),  # 6 / 4 = 1
        (132, 2, 2, 128),  # 132 capped
        (132, 2, 1, 66),
        (132, 4, 2, 66),
        (108, 2, 2, 108),
        (108, 2, 1, 54),
        (108, 4, 2, 54),
        (34, 2, 2, 34),
        (34, 2, 1, 17),
        (34, 4, 2, 17),
        (36, 2, 2, 36),
        (36, 2, 1, 18),
        (36, 4, 2, 18),
        (31, 2, 1, 15),
        (32, 2, 1, 16),
        (128, 2, 2, 128),
        (129, 2, 2, 128),
        (256, 2, 1, 128),
        (257, 2, 1, 128),
        (1000, 4, 2, 128),
    ],
)
def test_hardware_splits(sms: int, tiles: int, resident: int, expected: int) -> None:
    assert hardware(8, 9, sms).splits(tiles, resident) == expected


def test_hardware_of_device() -> None:
    dev = device(12, 0, 36, 101376)
    assert Hardware.of(dev) == Hardware(ComputeCapability(12, 0), 36, 101376)
    got = Hardware.of(dev)
    assert (got.capability, got.multiprocessors, got.shared_optin) == (
        ComputeCapability(12, 0),
        36,
        101376,
    )


@pytest.mark.parametrize(
    ("major", "minor", "heavy"),
    [
        (8, 0, True),
        (9, 0, True),
        (10, 0, True),
        (7, 5, False),
        (8, 6, False),
        (8, 7, False),
        (8, 9, False),
        (9, 1, False),
        (10, 3, False),
        (11, 0, False),
        (12, 0, False),
        (12, 1, False),
        (13, 0, False),
    ],
)
def test_tensor_heavy(major: int, minor: int, heavy: bool) -> None:
    assert hardware(major, minor, 100).tensor_heavy() is heavy


@pytest.mark.parametrize(
    ("sms", "optin", "fits"),
    [
        (32, HAND_HALF_SHARED, True),  # splits(2, 1) = 16 at the edge
        (31, 99 * K, False),  # 15 slices
        (32, 99 * K, True),
        (34, HAND_HALF_SHARED - 1, False),
        (34, HAND_HALF_SHARED, True),
        (1, 227 * K, False),
        (256, 48 * K, False),
    ],
)
def test_half_split_fits(sms: int, optin: int, fits: bool) -> None:
    assert hardware(8, 9, sms, optin).half_split_fits() is fits
    assert hardware(12, 0, sms, optin).half_split_fits() is fits


# --- the device rule, branch by branch -----------------------------------------------

# sm75 tier on any device: (site, batch, math) -> entry; the batch-32 embedding is
# EMBED_B32 with splits(2, 2) (lines 235-258)
SCALAR_TABLE = {
    ("CONV1", 1, "FP32"): "CONV1_B1",
    ("CONV1", 1, "TF32"): "CONV1_B1",
    ("CONV1", 32, "FP32"): "CONV1_B32",
    ("CONV1", 32, "TF32"): "CONV1_B32",
    ("CONV2", 1, "FP32"): "CONV2_B1",
    ("CONV2", 1, "TF32"): "CONV2_B1",
    ("CONV2", 32, "FP32"): "CONV2_B32",
    ("CONV2", 32, "TF32"): "CONV2_B32",
    ("LINEAR0", 1, "FP32"): "LINEAR0_B1",
    ("LINEAR0", 1, "TF32"): "LINEAR0_B1",
    ("LINEAR0", 32, "FP32"): "LINEAR0_B32",
    ("LINEAR0", 32, "TF32"): "LINEAR0_B32",
    ("LINEAR1", 1, "FP32"): "LINEAR1_B1",
    ("LINEAR1", 1, "TF32"): "LINEAR1_B1_TF32",
    ("LINEAR1", 32, "FP32"): "LINEAR1_B32",
    ("LINEAR1", 32, "TF32"): "LINEAR1_B32",
    ("LINEAR2", 1, "FP32"): "CLASSIFIER_B1",
    ("LINEAR2", 1, "TF32"): "CLASSIFIER_B1",
    ("LINEAR2", 32, "FP32"): "CLASSIFIER_B32",
    ("LINEAR2", 32, "TF32"): "CLASSIFIER_B32",
    ("EMBEDDING", 1, "FP32"): "EMBED_B1",
    ("EMBEDDING", 1, "TF32"): "EMBED_B1",
    ("EMBEDDING", 32, "FP32"): "EMBED_B32",
    ("EMBEDDING", 32, "TF32"): "EMBED_B32",
}
# sm80 tier, every device (lines 273-278); the TF32 embedding is per device
SM80_OVERRIDES = {
    ("LINEAR0", 1, "TF32"): "LINEAR0_B1_TF32",
    ("LINEAR0", 32, "TF32"): "LINEAR0_B32_SELECT",
    ("LINEAR1", 32, "TF32"): "LINEAR1_B32_TF32",
}
# sm80 tier, tensor-heavy devices only (lines 269-272); the FP32 embedding is X3
SM80_HEAVY_OVERRIDES = {
    ("CONV1", 32, "TF32"): "CONV1_B32_TC",
    ("CONV1", 32, "FP32"): "CONV1_B32_X3",
    ("CONV2", 32, "TF32"): "CONV2_B32_TC",
    ("CONV2", 32, "FP32"): "CONV2_B32_X3",
}

E64 = "EMBED_B32_TF32_E64"
F16 = "EMBED_B32_F16"
K2 = "EMBED_B32_TF32_K2"
TF = "EMBED_B32_TF32"

# (name, capability, SMs, opt-in, heavy, splits(2, 2), splits(4, 2), TF32 embedding pick)
DEVICES = [
    ("a100", (8, 0), 108, 163 * K, True, 108, 54, (E64, 54)),
    ("h200", (9, 0), 132, 227 * K, True, 128, 66, (E64, 66)),
    ("b200", (10, 0), 148, 227 * K, True, 128, 74, (E64, 74)),
    ("heavy-1sm", (8, 0), 1, 163 * K, True, 1, 1, (E64, 1)),
    ("heavy-34sm", (9, 0), 34, 227 * K, True, 34, 17, (E64, 17)),
    ("rtx3090", (8, 6), 82, 99 * K, False, 82, None, (F16, 41)),
    ("orin", (8, 7), 16, 163 * K, False, 16, None, (TF, 16)),
    ("rtx4060ti", (8, 9), 34, 99 * K, False, 34, None, (F16, 17)),
    ("ada-32sm", (8, 9), 32, 99 * K, False, 32, None, (F16, 16)),
    ("ada-31sm", (8, 9), 31, 99 * K, False, 31, None, (TF, 31)),
    ("ada-shared-at", (8, 9), 34, 89472, False, 34, None, (F16, 17)),
    ("ada-shared-below", (8, 9), 34, 89471, False, 34, None, (TF, 34)),
    ("ada-1sm", (8, 9), 1, 99 * K, False, 1, None, (TF, 1)),
    ("ada-256sm", (8, 9), 256, 99 * K, False, 128, None, (F16, 128)),
    ("rtx5060ti", (12, 0), 36, 99 * K, False, 36, None, (F16, 18)),
    ("bw-30sm", (12, 0), 30, 99 * K, False, 30, None, (K2, 15)),
    ("bw-48k", (12, 0), 36, 48 * K, False, 36, None, (K2, 18)),
    ("bw-32sm", (12, 0), 32, 99 * K, False, 32, None, (F16, 16)),
    ("bw-31sm", (12, 0), 31, 99 * K, False, 31, None, (K2, 15)),
    ("bw-shared-at", (12, 0), 36, 89472, False, 36, None, (F16, 18)),
    ("bw-shared-below", (12, 0), 36, 89471, False, 36, None, (K2, 18)),
    ("bw-1sm", (12, 0), 1, 99 * K, False, 1, None, (K2, 1)),
    ("bw-256sm-48k", (12, 0), 256, 48 * K, False, 128, None, (K2, 128)),
    ("bw-12.1-fits", (12, 1), 48, 99 * K, False, 48, None, (F16, 24)),
    ("bw-12.1-small", (12, 1), 20, 99 * K, False, 20, None, (K2, 10)),
    ("b300-10.3", (10, 3), 148, 227 * K, False, 128, None, (F16, 74)),
    ("cc11-small", (11, 0), 20, 99 * K, False, 20, None, (TF, 20)),
    ("cc11-fits", (11, 0), 40, 99 * K, False, 40, None, (F16, 20)),
    ("cc13-48k", (13, 0), 36, 48 * K, False, 36, None, (TF, 36)),
    ("cc13-fits", (13, 0), 36, 99 * K, False, 36, None, (F16, 18)),
]


def _expected(row: tuple, site: str, batch: int, math: str, tier: PtxTier) -> tuple[str, int]:
    _, _, _, _, heavy, s22, s42, tf32_embedding = row
    entry = SCALAR_TABLE[site, batch, math]
    if tier is not SM75:
        entry = SM80_OVERRIDES.get((site, batch, math), entry)
        if heavy:
            entry = SM80_HEAVY_OVERRIDES.get((site, batch, math), entry)
        if (site, batch) == ("EMBEDDING", 32):
            if math == "TF32":
                return tf32_embedding
            if heavy:
                return ("EMBED_B32_X3", s42)
    if (site, batch) == ("EMBEDDING", 32):
        return ("EMBED_B32", s22)
    return (entry, 0)


@pytest.mark.parametrize("tier", [SM75, SM80])
@pytest.mark.parametrize("row", DEVICES, ids=[row[0] for row in DEVICES])
def test_select_every_branch(row: tuple, tier: PtxTier) -> None:
    _, (major, minor), sms, optin, *_ = row
    dev = device(major, minor, sms, optin)
    wrong = []
    for site, batch, math in itertools.product(Site, (1, 32), MATHS):
        pin = SegdensePin.select(site, batch, math, tier, dev)
        want = _expected(row, site.name, batch, math.name, tier)
        got = (pin.entry().name, pin.choice.splits)
        if got != want or pin.math is not math or pin.tier is not tier:
            wrong.append((site.name, batch, math.name, got, want))
        choice = site.choice(batch, math, tier, Hardware.of(dev))
        if choice != pin.choice:
            wrong.append((site.name, batch, math.name, "choice", choice, pin.choice))
    assert wrong == []


@pytest.mark.parametrize("tier", [PtxTier.SM90, PtxTier.SM120])
@pytest.mark.parametrize(
    "row",
    DEVICES[:3] + DEVICES[7:8] + DEVICES[14:15],
    ids=["a100", "h200", "b200", "rtx4060ti", "rtx5060ti"],
)
def test_tiers_above_sm80_choose_as_sm80(row: tuple, tier: PtxTier) -> None:
    _, (major, minor), sms, optin, *_ = row
    dev = device(major, minor, sms, optin)
    for site, batch, math in itertools.product(Site, (1, 32), MATHS):
        pin = SegdensePin.select(site, batch, math, tier, dev)
        want = _expected(row, site.name, batch, math.name, SM80)
        assert (pin.entry().name, pin.choice.splits) == want
        assert pin.tier is tier


@pytest.mark.parametrize("row", DEVICES, ids=[row[0] for row in DEVICES])
def test_sm75_never_yields_sm80_only_entries(row: tuple) -> None:
    _, (major, minor), sms, optin, *_ = row
    dev = device(major, minor, sms, optin)
    for site, batch, math in itertools.product(Site, (1, 32), MATHS):
        pin = SegdensePin.select(site, batch, math, SM75, dev)
        assert pin.entry().name not in SM80_ONLY


@pytest.mark.parametrize("batch", [0, 2, 16, 31, 33, 64])
@pytest.mark.parametrize("site", list(Site))
@pytest.mark.parametrize("tier", [SM75, SM80])
def test_other_batches_are_unimplemented(site: Site, batch: int, tier: PtxTier) -> None:
    for math in MATHS:
        with pytest.raises(GeometryUnimplemented, match=rf"batch {batch}\b"):
            SegdensePin.select(site, batch, math, tier, device(8, 0, 108))
        assert site.choice(batch, math, tier, hardware(8, 0, 108)) is None


def test_measured_pins() -> None:
    ada = SegdensePin.measured_rtx4060ti_embedding()
    assert ada.entry() is Entry.EMBED_B32_F16
    assert ada.splits() == 17
    assert (ada.math, ada.tier) == (TF32, SM80)
    blackwell = SegdensePin.measured_rtx5060ti_embedding()
    assert blackwell.entry() is Entry.EMBED_B32_F16
    assert blackwell.splits() == 18
    assert (blackwell.math, blackwell.tier) == (TF32, SM80)


def test_rule_reproduces_measured_pins() -> None:
    rtx4060ti = device(8, 9, 34, 99 * K)
    rtx5060ti = device(12, 0, 36, 99 * K)
    assert SegdensePin.select(Site.EMBEDDING, 32, TF32, SM80, rtx4060ti) == (
        SegdensePin.measured_rtx4060ti_embedding()
    )
    assert SegdensePin.select(Site.EMBEDDING, 32, TF32, SM80, rtx5060ti) == (
        SegdensePin.measured_rtx5060ti_embedding()
    )


# --- entries and configs -------------------------------------------------------------

SHARED_TC = 4 * max(3 * (8 * (128 + 16) + 2560 * 1), 64 * (128 + 8))  # lines 500-513
SHARED_X3 = 4 * max(3 * (8 * (128 + 16) + 2560 * 2), 64 * (128 + 8))


def _split(
    kernel: str, cols: int, splits: int, block: int, fragments: Fragments | None = None
) -> Config:
    return Config(
        kernel=kernel,
        kind=Split(
            rows=96, cols=cols, splits=splits, weights=SplitWeights.FP32, fragments=fragments
        ),
        block=block,
        shared=0,
    )


# name -> (site, batch, config for `splits` slices), from lines 379-460; the tensor-core
# GEMMs' `fragments` (their weights packed as mma fragments) are pyspk's own
ENTRY_TABLE = {
    "CONV1_B1": (
        "CONV1",
        1,
        lambda s: Config(
            kernel="spk_segdense_conv1_b1", kind=Conv(positions=64), block=256, shared=0
        ),
    ),
    "CONV1_B32": (
        "CONV1",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv1_b32", kind=Conv(positions=128), block=128, shared=0
        ),
    ),
    "CONV1_B32_TC": (
        "CONV1",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv1_b32_tc",
            kind=TensorConv(positions=128, cin_pad=80, planes=1),
            block=128,
            shared=SHARED_TC,
        ),
    ),
    "CONV1_B32_X3": (
        "CONV1",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv1_b32_x3",
            kind=TensorConv(positions=128, cin_pad=80, planes=2),
            block=256,
            shared=SHARED_X3,
        ),
    ),
    "CONV2_B1": (
        "CONV2",
        1,
        lambda s: Config(
            kernel="spk_segdense_conv2_b1", kind=Conv(positions=32), block=256, shared=0
        ),
    ),
    "CONV2_B32": (
        "CONV2",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv2_b32", kind=Conv(positions=128), block=128, shared=0
        ),
    ),
    "CONV2_B32_TC": (
        "CONV2",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv2_b32_tc",
            kind=TensorConv(positions=128, cin_pad=64, planes=1),
            block=128,
            shared=SHARED_TC,
        ),
    ),
    "CONV2_B32_X3": (
        "CONV2",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv2_b32_x3",
            kind=TensorConv(positions=128, cin_pad=64, planes=2),
            block=256,
            shared=SHARED_X3,
        ),
    ),
    "LINEAR0_B1": (
        "LINEAR0",
        1,
        lambda s: Config(
            kernel="spk_segdense_linear0_b1",
            kind=Gemm(rows=16, cols=32, select=0),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR0_B1_TF32": (
        "LINEAR0",
        1,
        lambda s: Config(
            kernel="spk_segdense_linear0_b1_tf32",
            kind=Gemm(rows=32, cols=32, select=0, fragments=Fragments(planes=1, paired=True)),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR0_B32": (
        "LINEAR0",
        32,
        lambda s: Config(
            kernel="spk_segdense_linear0_b32",
            kind=Gemm(rows=64, cols=128, select=0),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR0_B32_SELECT": (
        "LINEAR0",
        32,
        lambda s: Config(
            kernel="spk_segdense_linear0_b32_tf32",
            kind=Gemm(rows=64, cols=128, select=16, fragments=Fragments(planes=1, half=True)),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR1_B1": (
        "LINEAR1",
        1,
        lambda s: Config(
            kernel="spk_segdense_linear1_b1",
            kind=Gemm(rows=16, cols=32, select=0),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR1_B1_TF32": (
        "LINEAR1",
        1,
        lambda s: Config(
            kernel="spk_segdense_linear1_b1_tf32",
            kind=Gemm(rows=16, cols=32, select=0),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR1_B32": (
        "LINEAR1",
        32,
        lambda s: Config(
            kernel="spk_segdense_linear1_b32",
            kind=Gemm(rows=64, cols=128, select=0),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR1_B32_TF32": (
        "LINEAR1",
        32,
        lambda s: Config(
            kernel="spk_segdense_linear1_b32_tf32",
            kind=Gemm(rows=64, cols=128, select=0, fragments=Fragments(planes=1, half=True)),
            block=128,
            shared=0,
        ),
    ),
    "CLASSIFIER_B1": (
        "LINEAR2",
        1,
        lambda s: Config(
            kernel="spk_segdense_classifier_b1", kind=Classifier(rows=8), block=64, shared=0
        ),
    ),
    "CLASSIFIER_B32": (
        "LINEAR2",
        32,
        lambda s: Config(
            kernel="spk_segdense_classifier_b32", kind=Classifier(rows=128), block=256, shared=0
        ),
    ),
    "EMBED_B1": (
        "EMBEDDING",
        1,
        lambda s: Config(kernel="spk_segdense_embed_b1", kind=Gemv(cols=2), block=256, shared=0),
    ),
    "EMBED_B32": ("EMBEDDING", 32, lambda s: _split("spk_segdense_embed_b32", 128, s, 192)),
    "EMBED_B32_TF32": (
        "EMBEDDING",
        32,
        lambda s: _split("spk_segdense_embed_b32_tf32", 128, s, 192, Fragments(1)),
    ),
    "EMBED_B32_TF32_K2": (
        "EMBEDDING",
        32,
        lambda s: _split("spk_segdense_embed_b32_tf32_k2", 128, s, 384, Fragments(1)),
    ),
    "EMBED_B32_TF32_E64": (
        "EMBEDDING",
        32,
        lambda s: _split("spk_segdense_embed_b32_tf32_e64", 64, s, 192, Fragments(1, paired=True)),
    ),
    "EMBED_B32_X3": (
        "EMBEDDING",
        32,
        lambda s: _split("spk_segdense_embed_b32_x3", 64, s, 192, Fragments(2)),
    ),
    "EMBED_B32_F16": (
        "EMBEDDING",
        32,
        lambda s: Config(
            kernel="spk_segdense_embed_b32_f16",
            kind=Split(rows=96, cols=128, splits=s, weights=SplitWeights.SCALED_HALF),
            block=384,
            shared=89472,
        ),
    ),
}


def test_tensor_conv_shared_by_hand() -> None:
    # stage = 8 * 144 + 2560 * planes; three stages beat the 64 * 136 = 8704 epilogue
    assert SHARED_TC == 4 * 3 * 3712 == 44544
    assert SHARED_X3 == 4 * 3 * 6272 == 75264


def test_entry_members() -> None:
    assert {entry.name for entry in Entry} == set(ENTRY_TABLE)
    assert len(Entry) == 25


@pytest.mark.parametrize("name", list(ENTRY_TABLE))
def test_entry_site_batch_config(name: str) -> None:
    site, batch, config = ENTRY_TABLE[name]
    entry = Entry[name]
    assert entry.site() is Site[site]
    assert entry.batch() == batch
    assert entry.is_split() is (name in SPLIT_ENTRIES)
    for splits in (1, 17, 18, 128):
        got = entry.config(splits)
        want = config(splits)
        assert got == want
        assert (got.kernel, got.kind, got.block, got.shared) == (
            want.kernel,
            want.kind,
            want.block,
            want.shared,
        )
    if name not in SPLIT_ENTRIES:
        assert entry.config(0) == entry.config(99)


def test_kernel_names_are_distinct() -> None:
    # 25 entry kernels plus five reductions: with the two packs, the 32 exports of DESIGN 4
    names = {Entry[name].config(1).kernel for name in ENTRY_TABLE}
    names |= {Reduction.shape(s).kernel for s in range(1, 129)}
    assert len(names) == 30
    assert all(name.startswith("spk_segdense_") for name in names)


def test_choice() -> None:
    fixed = Choice.fixed(Entry.LINEAR0_B32)
    assert (fixed.entry, fixed.splits) == (Entry.LINEAR0_B32, 0)
    assert fixed.config() == ENTRY_TABLE["LINEAR0_B32"][2](0)
    split = Choice.split(Entry.EMBED_B32_F16, 17)
    assert (split.entry, split.splits) == (Entry.EMBED_B32_F16, 17)
    assert split.config() == ENTRY_TABLE["EMBED_B32_F16"][2](17)
    assert split == Choice(Entry.EMBED_B32_F16, 17)
    assert split != Choice(Entry.EMBED_B32_F16, 18)


def test_pin_accessors() -> None:
    for name in ENTRY_TABLE:
        splits = 17 if name in SPLIT_ENTRIES else 0
        pin = SegdensePin(Choice(Entry[name], splits), TF32, SM80)
        assert pin.entry() is Entry[name]
        assert pin.config() == ENTRY_TABLE[name][2](splits)
        assert pin.splits() == (17 if name in SPLIT_ENTRIES else None)


# --- reductions ----------------------------------------------------------------------


@pytest.mark.parametrize("splits", range(1, 129))
def test_reduction_shape(splits: int) -> None:
    # OUTPUTS = 96 * 256 = 24576 (line 1078)
    shape = Reduction.shape(splits)
    assert isinstance(shape, ReductionShape)
    assert shape.splits == splits
    if splits in (18, 34, 36):
        want = (f"spk_segdense_reduce_e{splits}", 48, 128)  # 24576 / 4 / 128
    elif splits <= 40:
        want = ("spk_segdense_reduce_embed_flat", 96, 64)  # 24576 / 4 / 64
    else:
        want = ("spk_segdense_reduce_embed", 192, 256)  # 24576 / 128
    assert (shape.kernel, shape.grid, shape.block) == want


def test_reduction_shape_equality() -> None:
    assert Reduction.shape(40) == ReductionShape(
        kernel="spk_segdense_reduce_embed_flat", splits=40, grid=96, block=64
    )
    assert Reduction.shape(41) == ReductionShape(
        kernel="spk_segdense_reduce_embed", splits=41, grid=192, block=256
    )


# --- check ---------------------------------------------------------------------------


def test_check_accepts_its_own_boundary() -> None:
    dev = device(8, 9, 34)
    for site, batch, math, tier in itertools.product(Site, (1, 32), MATHS, (SM75, SM80)):
        pin = SegdensePin.select(site, batch, math, tier, dev)
        assert pin.check(site, batch, math, tier) is None
        # a module above the pin's tier also runs it
        assert pin.check(site, batch, math, PtxTier.SM120) is None


def test_check_refuses_another_boundary() -> None:
    pin = SegdensePin.measured_rtx4060ti_embedding()
    for site in Site:
        if site is not Site.EMBEDDING:
            with pytest.raises(GeometryInvalid):
                pin.check(site, 32, TF32, SM80)
    with pytest.raises(GeometryInvalid):
        pin.check(Site.EMBEDDING, 1, TF32, SM80)
    with pytest.raises(GeometryInvalid):
        pin.check(Site.EMBEDDING, 32, FP32, SM80)
    fixed = SegdensePin(Choice.fixed(Entry.CLASSIFIER_B1), FP32, SM75)
    with pytest.raises(GeometryInvalid):
        fixed.check(Site.LINEAR1, 1, FP32, SM75)
    with pytest.raises(GeometryInvalid):
        fixed.check(Site.LINEAR2, 32, FP32, SM75)
    with pytest.raises(GeometryInvalid):
        fixed.check(Site.LINEAR2, 1, TF32, SM75)
    # a boundary mismatch is a bug, not an unimplemented geometry
    with pytest.raises(GeometryError) as caught:
        fixed.check(Site.LINEAR2, 1, TF32, SM75)
    assert not isinstance(caught.value, GeometryUnimplemented)


def test_check_refuses_a_module_below_the_pin() -> None:
    pin = SegdensePin.measured_rtx5060ti_embedding()
    with pytest.raises(DeviceUnsupported) as caught:
        pin.check(Site.EMBEDDING, 32, TF32, SM75)
    message = str(caught.value)
    assert "spk_segdense_embed_b32_f16" in message
    assert "sm80" in message
    assert "sm75" in message
    high = SegdensePin(Choice.fixed(Entry.CONV1_B1), FP32, PtxTier.SM90)
    with pytest.raises(DeviceUnsupported) as caught:
        high.check(Site.CONV1, 1, FP32, SM80)
    message = str(caught.value)
    assert "spk_segdense_conv1_b1" in message
    assert "sm90" in message
    assert "sm80" in message


def test_check_compares_the_boundary_before_the_tier() -> None:
    # lines 781-801: the boundary test comes first
    pin = SegdensePin.measured_rtx4060ti_embedding()
    with pytest.raises(GeometryInvalid):
        pin.check(Site.LINEAR0, 32, TF32, SM75)


# --- select_fp32, select_tuning_tf32 -------------------------------------------------


@pytest.mark.parametrize("row", DEVICES, ids=[row[0] for row in DEVICES])
def test_select_fp32(row: tuple) -> None:
    _, (major, minor), sms, optin, *_ = row
    s22 = row[5]
    dev = device(major, minor, sms, optin)
    for site, batch, math, tier in itertools.product(
        Site, (1, 32), MATHS, (SM75, SM80, PtxTier.SM90)
    ):
        pin = SegdensePin.select_fp32(site, batch, math, tier, dev)
        # scalar_choice with FP32 math (line 725): LINEAR1 batch 1 keeps LINEAR1_B1
        want_entry = SCALAR_TABLE[site.name, batch, "FP32"]
        want_splits = s22 if want_entry == "EMBED_B32" else 0
        assert (pin.entry().name, pin.choice.splits) == (want_entry, want_splits)
        assert pin.math is math  # the requested mode is kept
        assert pin.tier is tier


@pytest.mark.parametrize("batch", [0, 2, 33])
def test_select_fp32_other_batches(batch: int) -> None:
    for site in Site:
        with pytest.raises(GeometryUnimplemented, match=rf"batch {batch}\b"):
            SegdensePin.select_fp32(site, batch, TF32, SM80, device(8, 9, 34))


@pytest.mark.parametrize("row", DEVICES, ids=[row[0] for row in DEVICES])
def test_select_tuning_tf32(row: tuple) -> None:
    _, (major, minor), sms, optin, _, s22, _, (rule_entry, _) = row
    dev = device(major, minor, sms, optin)
    for site, batch, math in itertools.product(Site, (1, 2, 32), MATHS):
        assert SegdensePin.select_tuning_tf32(site, batch, math, SM75, dev) is None
        for tier in (SM80, PtxTier.SM90):
            got = SegdensePin.select_tuning_tf32(site, batch, math, tier, dev)
            if (site, batch, math) != (Site.EMBEDDING, 32, TF32) or rule_entry != F16:
                assert got is None, (site, batch, math)
                continue
            # tf32_embedding (lines 314-322): K2 with splits(2, 1) on 12.x, else
            # EMBED_B32_TF32 with splits(2, 2)
            want = (K2, min(max(sms // 2, 1), 128)) if major == 12 else (TF, s22)
            assert got is not None
            assert (got.entry().name, got.choice.splits) == want
            assert (got.math, got.tier) == (TF32, tier)


def test_select_tuning_tf32_measured_devices() -> None:
    ada = SegdensePin.select_tuning_tf32(Site.EMBEDDING, 32, TF32, SM80, device(8, 9, 34))
    assert ada == SegdensePin(Choice(Entry.EMBED_B32_TF32, 34), TF32, SM80)
    bw = SegdensePin.select_tuning_tf32(Site.EMBEDDING, 32, TF32, SM80, device(12, 0, 36))
    assert bw == SegdensePin(Choice(Entry.EMBED_B32_TF32_K2, 18), TF32, SM80)


# --- forced pins (an extension beyond the Rust) --------------------------------------

# the slice count the device rule uses per split entry: (tiles, resident)
FORCED_RESIDENCY = {
    "EMBED_B32": (2, 2),
    "EMBED_B32_TF32": (2, 2),
    "EMBED_B32_TF32_K2": (2, 1),
    "EMBED_B32_F16": (2, 1),
    "EMBED_B32_TF32_E64": (4, 2),
    "EMBED_B32_X3": (4, 2),
}


@pytest.mark.parametrize(
    ("sms", "want"),
    [
        (
            34,
            {
                "EMBED_B32": 34,
                "EMBED_B32_TF32": 34,
                "EMBED_B32_TF32_K2": 17,
                "EMBED_B32_F16": 17,
                "EMBED_B32_TF32_E64": 17,
                "EMBED_B32_X3": 17,
            },
        ),
        (
            132,
            {
                "EMBED_B32": 128,
                "EMBED_B32_TF32": 128,
                "EMBED_B32_TF32_K2": 66,
                "EMBED_B32_F16": 66,
                "EMBED_B32_TF32_E64": 66,
                "EMBED_B32_X3": 66,
            },
        ),
        (
            1,
            {
                "EMBED_B32": 1,
                "EMBED_B32_TF32": 1,
                "EMBED_B32_TF32_K2": 1,
                "EMBED_B32_F16": 1,
                "EMBED_B32_TF32_E64": 1,
                "EMBED_B32_X3": 1,
            },
        ),
    ],
)
def test_forced_every_entry(sms: int, want: dict[str, int]) -> None:
    dev = device(8, 9, sms)
    for name in ENTRY_TABLE:
        for math in MATHS:
            if math is FP32 and name in REDUCED_PRODUCTS:
                continue
            pin = SegdensePin.forced(Entry[name], math, SM80, dev)
            assert pin.entry() is Entry[name]
            assert (pin.math, pin.tier) == (math, SM80)
            if name in SPLIT_ENTRIES:
                assert pin.splits() == want[name]
                assert pin.choice.splits == want[name]
            else:
                assert pin.splits() is None
                assert pin.choice.splits == 0
            site, batch, _ = ENTRY_TABLE[name]
            assert pin.check(Site[site], batch, math, SM80) is None


def test_forced_refuses_entries_above_the_tier() -> None:
    dev = device(8, 9, 34)
    for name in SM80_ONLY:
        with pytest.raises(DeviceUnsupported, match=ENTRY_TABLE[name][2](1).kernel):
            SegdensePin.forced(Entry[name], TF32, SM75, dev)
    for name in set(ENTRY_TABLE) - SM80_ONLY:
        math = TF32 if name in REDUCED_PRODUCTS else FP32
        pin = SegdensePin.forced(Entry[name], math, SM75, dev)
        assert (pin.entry(), pin.tier) == (Entry[name], SM75)


def test_forced_refuses_reduced_products_for_fp32() -> None:
    dev = device(9, 0, 132, 227 * K)
    for name in REDUCED_PRODUCTS:
        with pytest.raises(GeometryInvalid):
            SegdensePin.forced(Entry[name], FP32, SM80, dev)
    for name in set(ENTRY_TABLE) - REDUCED_PRODUCTS:
        assert SegdensePin.forced(Entry[name], FP32, SM80, dev).math is FP32


@pytest.mark.parametrize("row", DEVICES, ids=[row[0] for row in DEVICES])
def test_forced_rule_pick_equals_selected(row: tuple) -> None:
    _, (major, minor), sms, optin, *_ = row
    dev = device(major, minor, sms, optin)
    for site, batch, math, tier in itertools.product(Site, (1, 32), MATHS, (SM75, SM80)):
        pin = SegdensePin.select(site, batch, math, tier, dev)
        assert SegdensePin.forced(pin.entry(), math, tier, dev) == pin
    for name, (tiles, resident) in FORCED_RESIDENCY.items():
        math = TF32 if name in REDUCED_PRODUCTS else FP32
        pin = SegdensePin.forced(Entry[name], math, SM80, dev)
        assert pin.splits() == min(max(sms * resident // tiles, 1), 128)


# --- sites ---------------------------------------------------------------------------

BOUNDARY_SITES = {
    "sincnet.conv1": "CONV1",
    "sincnet.conv2": "CONV2",
    "linear0": "LINEAR0",
    "linear1": "LINEAR1",
    "linear2": "LINEAR2",
    "resnet.seg_1": "EMBEDDING",
}


def test_site_members() -> None:
    assert {site.name for site in Site} == set(BOUNDARY_SITES.values())


@pytest.mark.parametrize(("name", "site"), list(BOUNDARY_SITES.items()))
def test_site_from_boundary(name: str, site: str) -> None:
    assert Site.from_boundary(BoundaryId.named(name)) is Site[site]


@pytest.mark.parametrize(
    "name", ["linear3", "resnet.seg_2", "sincnet.conv3", "conv1", "resnet", "sincnet"]
)
def test_site_from_unknown_boundary(name: str) -> None:
    with pytest.raises(GeometryUnimplemented, match=name.replace(".", r"\.")):
        Site.from_boundary(BoundaryId.named(name))


def test_site_of() -> None:
    assert Site.of(DenseSite.LINEAR0) is Site.LINEAR0
    assert Site.of(DenseSite.LINEAR1) is Site.LINEAR1
    assert Site.of(DenseSite.CLASSIFIER) is Site.LINEAR2
    assert Site.of(DenseSite.EMBEDDING) is Site.EMBEDDING
    assert Site.of(SegConvSite.CONV1) is Site.CONV1
    assert Site.of(SegConvSite.CONV2) is Site.CONV2


def test_site_dimensions() -> None:
    # lines 210-219 and DESIGN 1
    assert Site.CONV1.dimensions() == (5321, 60, 400, 5325)
    assert Site.CONV2.dimensions() == (1769, 60, 300, 1773)
    assert Site.LINEAR0.dimensions() == (589, 128, 256, 0)
    assert Site.LINEAR1.dimensions() == (589, 128, 128, 0)
    assert Site.LINEAR2.dimensions() == (589, 7, 128, 0)
    assert Site.EMBEDDING.dimensions() == (3, 256, 5120, 0)


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
    # DenseOxide and SegConvOxide COVERAGE (lines 1207-1211, 1268-1272)
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
    # the Rust Area declares `const AREA: KernelModule = KernelModule::Segdense` (line
    # 1320); framework.DriverCandidate declares AREA too
    wanted = set(DriverCandidate.__annotations__) | {
        name for name in vars(DriverCandidate) if not name.startswith("_")
    }
    missing = sorted(name for name in wanted if not hasattr(Area, name))
    assert missing == []
    assert "segdense" in str(getattr(Area.AREA, "value", Area.AREA)).lower()


def test_special_values() -> None:
    # lines 75-80
    assert SPECIAL_VALUES.finite.headroom == 2
    assert SPECIAL_VALUES.nan is NanContract.UNSPECIFIED
    assert SPECIAL_VALUES.infinity is InfinityContract.UNSPECIFIED
    assert SPECIAL_VALUES.signed_zero is SignedZeroContract.UNSPECIFIED


def test_public_names() -> None:
    assert pyspk.Site is Site
    assert pyspk.Entry is Entry
    assert pyspk.SegdensePin is SegdensePin
    assert pyspk.Area is Area


# --- exhaustive cross-check against a literal transcription of the Rust rule ---------
# Everything below down to the grid is an independent re-reading of lines 90-322;
# it shares no code with pyspk.


def _rust_rule(
    site: str, batch: int, math: str, tier_rank: int, major: int, minor: int, sms: int, optin: int
) -> tuple[str, int] | None:
    """Site::choice: (entry name, splits; 0 for a fixed entry) or None."""

    def splits(tiles: int, resident: int) -> int:  # Hardware::splits
        return min(max(sms * resident // tiles, 1), 128)

    heavy = (major, minor) in ((8, 0), (9, 0), (10, 0))  # tensor_heavy
    half_fits = splits(2, 1) >= 16 and optin >= 89472  # half_split_fits

    def tf32_embedding() -> tuple[str, int]:
        if major == 12:  # consumer_blackwell
            return ("EMBED_B32_TF32_K2", splits(2, 1))
        return ("EMBED_B32_TF32", splits(2, 2))

    def tensor_choice() -> tuple[str, int] | None:
        key = (site, batch, math)
        if key == ("CONV1", 32, "TF32") and heavy:
            return ("CONV1_B32_TC", 0)
        if key == ("CONV1", 32, "FP32") and heavy:
            return ("CONV1_B32_X3", 0)
        if key == ("CONV2", 32, "TF32") and heavy:
            return ("CONV2_B32_TC", 0)
        if key == ("CONV2", 32, "FP32") and heavy:
            return ("CONV2_B32_X3", 0)
        if key == ("LINEAR0", 1, "TF32"):
            return ("LINEAR0_B1_TF32", 0)
        if key == ("LINEAR0", 32, "TF32"):
            return ("LINEAR0_B32_SELECT", 0)
        if key == ("LINEAR1", 32, "TF32"):
            return ("LINEAR1_B32_TF32", 0)
        if key == ("EMBEDDING", 32, "TF32") and heavy:
            return ("EMBED_B32_TF32_E64", splits(4, 2))
        if key == ("EMBEDDING", 32, "TF32") and half_fits:
            return ("EMBED_B32_F16", splits(2, 1))
        if key == ("EMBEDDING", 32, "TF32"):
            return tf32_embedding()
        if key == ("EMBEDDING", 32, "FP32") and heavy:
            return ("EMBED_B32_X3", splits(4, 2))
        return None

    def scalar_choice() -> tuple[str, int] | None:
        key = (site, batch)
        arms = {
            ("CONV1", 1): "CONV1_B1",
            ("CONV1", 32): "CONV1_B32",
            ("CONV2", 1): "CONV2_B1",
            ("CONV2", 32): "CONV2_B32",
            ("LINEAR0", 1): "LINEAR0_B1",
            ("LINEAR0", 32): "LINEAR0_B32",
        }
        if key in arms:
            return (arms[key], 0)
        if key == ("LINEAR1", 1) and math == "TF32":
            return ("LINEAR1_B1_TF32", 0)
        arms = {
            ("LINEAR1", 1): "LINEAR1_B1",
            ("LINEAR1", 32): "LINEAR1_B32",
            ("LINEAR2", 1): "CLASSIFIER_B1",
            ("LINEAR2", 32): "CLASSIFIER_B32",
            ("EMBEDDING", 1): "EMBED_B1",
        }
        if key in arms:
            return (arms[key], 0)
        if key == ("EMBEDDING", 32):
            return ("EMBED_B32", splits(2, 2))
        return None

    if tier_rank >= 1:  # tier >= Sm80
        choice = tensor_choice()
        if choice is not None:
            return choice
    return scalar_choice()


TIER_RANK = {PtxTier.SM75: 0, PtxTier.SM80: 1, PtxTier.SM90: 2, PtxTier.SM120: 3}
GRID_CAPABILITIES = [
    (7, 5),
    (8, 0),
    (8, 6),
    (8, 7),
    (8, 9),
    (9, 0),
    (10, 0),
    (10, 3),
    (11, 0),
    (12, 0),
    (12, 1),
]
GRID_SMS = [1, 2, 16, 17, 31, 32, 33, 34, 36, 58, 64, 108, 128, 132, 148, 170, 256]
GRID_OPTIN = [48 * K, 64 * K, HAND_HALF_SHARED - 1, HAND_HALF_SHARED, 99 * K, 163 * K, 227 * K]


@pytest.mark.parametrize("capability", GRID_CAPABILITIES, ids=lambda c: f"{c[0]}.{c[1]}")
def test_rule_matches_a_transcription_of_the_rust(capability: tuple[int, int]) -> None:
    major, minor = capability
    wrong = []
    for sms, optin, tier, math, batch, site in itertools.product(
        GRID_SMS, GRID_OPTIN, PtxTier, MATHS, (1, 2, 32), Site
    ):
        want = _rust_rule(site.name, batch, math.name, TIER_RANK[tier], major, minor, sms, optin)
        dev = device(major, minor, sms, optin)
        try:
            pin = SegdensePin.select(site, batch, math, tier, dev)
            got = (pin.entry().name, pin.choice.splits)
        except GeometryUnimplemented:
            got = None
        if got != want:
            wrong.append((sms, optin, tier, math, batch, site, got, want))
    assert wrong[:10] == []
