"""The segdense device rule against an independent literal transcription of the
reference rule, over a grid of capabilities, SM counts, opt-in sizes and tiers (no GPU)."""

from __future__ import annotations

import itertools

import pytest

from pyspk.candidate.errors import GeometryUnimplemented
from pyspk.candidate.segdense import SegdensePin, Site
from pyspk.cuda import PtxTier
from tests.segdense_expected import HAND_HALF_SHARED, MATHS, K, device

# --- exhaustive cross-check against a literal transcription of the Rust rule ---------
# Everything below down to the grid is an independent re-reading of the reference's
# Hardware and Site rule (splits, tensor_heavy, half_split_fits, the choices);
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
