"""The segdense entries: each one's site, batch and launch configuration, the kernel
names, `Choice`, the pin accessors and the split-K reductions' shapes (no GPU)."""

from __future__ import annotations

import pytest

from pyspk.candidate.segdense import Choice, Entry, Reduction, ReductionShape, SegdensePin, Site
from tests.segdense_expected import ENTRY_TABLE, SHARED_TC, SHARED_X3, SM80, SPLIT_ENTRIES, TF32


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
    # 25 entry kernels plus five reductions: with the two packs, the 32 kernels the
    # segdense module exports
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
    # the reductions' outputs: 96 rows * 256 columns = 24576
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
