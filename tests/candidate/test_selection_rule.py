"""The segdense device rule (`SegdensePin.select`, `select_fp32`,
`select_tuning_tf32`) branch by branch on described devices, checked without a GPU
against picks derived by hand from the reference rule, never from the code under test."""

from __future__ import annotations

import itertools

import pytest

from pyspk.candidate.errors import GeometryUnimplemented
from pyspk.candidate.segdense import Choice, Entry, Hardware, SegdensePin, Site
from pyspk.cuda import PtxTier
from tests.segdense_expected import (
    DEVICES,
    F16,
    K2,
    MATHS,
    SM75,
    SM80,
    SM80_ONLY,
    TF,
    TF32,
    K,
    device,
    hardware,
)

# --- the device rule, branch by branch -----------------------------------------------

# sm75 tier on any device: (site, batch, math) -> entry; the batch-32 embedding is
# EMBED_B32 with splits(2, 2) (the rule's scalar_choice)
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
# sm80 tier, every device (the TF32 linears of the rule's tensor_choice); the TF32
# embedding is per device
SM80_OVERRIDES = {
    ("LINEAR0", 1, "TF32"): "LINEAR0_B1_TF32",
    ("LINEAR0", 32, "TF32"): "LINEAR0_B32_SELECT",
    ("LINEAR1", 32, "TF32"): "LINEAR1_B32_TF32",
}
# sm80 tier, tensor-heavy devices only (the batch-32 tensor-core convolutions of
# tensor_choice); the FP32 embedding is X3
SM80_HEAVY_OVERRIDES = {
    ("CONV1", 32, "TF32"): "CONV1_B32_TC",
    ("CONV1", 32, "FP32"): "CONV1_B32_X3",
    ("CONV2", 32, "TF32"): "CONV2_B32_TC",
    ("CONV2", 32, "FP32"): "CONV2_B32_X3",
}


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
        # scalar_choice with FP32 math: LINEAR1 batch 1 keeps LINEAR1_B1
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
            # tf32_embedding: K2 with splits(2, 1) on 12.x, else
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
