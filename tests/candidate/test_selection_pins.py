"""`SegdensePin.check` and the forced pins (an extension beyond the reference rule):
which boundaries and tiers a pin serves, and what forcing an entry gives (no GPU)."""

from __future__ import annotations

import itertools

import pytest

from pyspk.candidate.errors import (
    DeviceUnsupported,
    GeometryError,
    GeometryInvalid,
    GeometryUnimplemented,
)
from pyspk.candidate.segdense import Choice, Entry, SegdensePin, Site
from pyspk.cuda import PtxTier
from tests.segdense_expected import (
    DEVICES,
    ENTRY_TABLE,
    FP32,
    MATHS,
    REDUCED_PRODUCTS,
    SM75,
    SM80,
    SM80_ONLY,
    SPLIT_ENTRIES,
    TF32,
    K,
    device,
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
    # the reference's check compares the boundary first and the tier after it
    pin = SegdensePin.measured_rtx4060ti_embedding()
    with pytest.raises(GeometryInvalid):
        pin.check(Site.LINEAR0, 32, TF32, SM75)


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
