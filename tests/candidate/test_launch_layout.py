"""Without a GPU: the grid each entry launches with and its parameter order, against the
reference's `Producer::enqueue` rules written out as a table, and against the parameter
types the shipped module exports."""

from __future__ import annotations

import pytest

from pyspk.candidate.segdense import Conv, Entry, SegdensePin, TensorConv
from pyspk.candidate.segdense.producer import (
    CONV_PARAMS,
    DENSE_PARAMS,
    GATHER_PARAMS,
    REDUCE_PARAMS,
    _Geometry,
    _grid,
)
from pyspk.cuda import CudaMath, DeviceAttributes, PtxTier
from pyspk.cuda.manifest import KernelModule, Manifest
from pyspk.cuda.profiles import profile
from tests.signatures import ptx_kinds

H200 = profile("h200")

# the reference's grids: conv (ceil(rows / positions), batch, 1); gemm (ceil(m / rows),
# n / cols, 1); classifier (ceil(m / rows), 1, 1); gemv (n / cols, 1, 1); split
# (ceil(m / rows), n / cols, splits), with the H200's slices (66, or 132 clamped to 128)
EXPECTED_GRIDS = {
    Entry.CONV1_B1: (84, 1, 1),
    Entry.CONV1_B32: (42, 32, 1),
    Entry.CONV1_B32_TC: (42, 32, 1),
    Entry.CONV1_B32_X3: (42, 32, 1),
    Entry.CONV2_B1: (56, 1, 1),
    Entry.CONV2_B32: (14, 32, 1),
    Entry.CONV2_B32_TC: (14, 32, 1),
    Entry.CONV2_B32_X3: (14, 32, 1),
    Entry.LINEAR0_B1: (37, 4, 1),
    Entry.LINEAR0_B1_TF32: (19, 4, 1),
    Entry.LINEAR0_B32: (295, 1, 1),
    Entry.LINEAR0_B32_SELECT: (295, 1, 1),
    Entry.LINEAR1_B1: (37, 4, 1),
    Entry.LINEAR1_B1_TF32: (37, 4, 1),
    Entry.LINEAR1_B32: (295, 1, 1),
    Entry.LINEAR1_B32_TF32: (295, 1, 1),
    Entry.CLASSIFIER_B1: (74, 1, 1),
    Entry.CLASSIFIER_B32: (148, 1, 1),
    Entry.EMBED_B1: (128, 1, 1),
    Entry.EMBED_B32: (1, 2, 128),
    Entry.EMBED_B32_TF32: (1, 2, 128),
    Entry.EMBED_B32_TF32_K2: (1, 2, 66),
    Entry.EMBED_B32_TF32_E64: (1, 4, 66),
    Entry.EMBED_B32_X3: (1, 4, 66),
    Entry.EMBED_B32_F16: (1, 2, 66),
}


def _pin(entry: Entry, device: DeviceAttributes = H200) -> SegdensePin:
    math = CudaMath.FP32 if entry.products().value == "fp32" else CudaMath.TF32
    return SegdensePin.forced(entry, math, PtxTier.SM80, device)


def test_the_table_covers_every_entry() -> None:
    assert set(EXPECTED_GRIDS) == set(Entry)


@pytest.mark.parametrize("entry", list(Entry), ids=lambda e: e.name)
def test_grid_matches_the_reference(entry: Entry) -> None:
    pin = _pin(entry)
    assert _grid(pin.config().kind, _Geometry.of(pin)) == EXPECTED_GRIDS[entry]


@pytest.mark.parametrize("entry", list(Entry), ids=lambda e: e.name)
def test_parameter_order_matches_the_module(entry: Entry) -> None:
    """Conv and TensorConv kinds take (x, w, y), every other kind (x, w, bias, y), each
    buffer a pointer and its count: the shipped tiers export exactly these types."""
    config = entry.config(1)
    params = CONV_PARAMS if isinstance(config.kind, (Conv, TensorConv)) else DENSE_PARAMS
    assert [name for name, _ in params][::2] == (
        ["x", "w", "y"] if params is CONV_PARAMS else ["x", "w", "bias", "y"]
    )
    module = Manifest.load().module(KernelModule.SEGDENSE)
    for tier in (PtxTier.SM75, PtxTier.SM80):
        assert list(module.tiers[tier].entries[config.kernel]) == ptx_kinds(params)


def test_reduction_and_pack_parameters_match_the_module() -> None:
    entries = Manifest.load().module(KernelModule.SEGDENSE).tiers[PtxTier.SM80].entries
    assert list(entries["spk_segdense_reduce_embed"]) == ptx_kinds(REDUCE_PARAMS)
    assert list(entries["spk_segdense_pack_gather"]) == ptx_kinds(GATHER_PARAMS)
