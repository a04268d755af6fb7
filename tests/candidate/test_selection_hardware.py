"""The segdense consts and `Hardware` (slices, tensor-heavy parts, whether the FP16
split fits), checked without a GPU against values derived by hand."""

from __future__ import annotations

import pytest

from pyspk.candidate.segdense import (
    BATCHES,
    DEFAULT_SHARED,
    EMBED_MAX_SPLITS,
    FLAT_MAX_SPLITS,
    HALF_MIN_SPLITS,
    HALF_SHARED,
    HALF_SLICE,
    HALF_STAGE,
    SELECT_ROWS,
    Hardware,
)
from pyspk.cuda import ComputeCapability
from tests.segdense_expected import HAND_HALF_MIN_SPLITS, HAND_HALF_SHARED, K, device, hardware

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
        # Hardware::splits: (multiprocessors * resident / tiles).clamp(1, 128)
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
