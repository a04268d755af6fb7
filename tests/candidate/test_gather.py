"""The device weight packs: every layout `gather_map` gives, applied as
`spk_segdense_pack_gather` applies it (`gather`, its numpy emulation), is `pack_weight`'s
host pack bit for bit, on weights whose low mantissa bits exercise the TF32 rounding and
its ties; every map reads every weight element, so the kernel's non-finite flag sees
each one; and the packs that scale or list rows stay on the host."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.candidate.segdense import Entry, Products
from pyspk.candidate.segdense.packing import (
    GATHER_ZERO,
    gather,
    gather_map,
    pack_weight,
)
from pyspk.candidate.segdense.shapes import Gemm, Split, SplitWeights, TensorConv


def _weight(n: int, k: int) -> np.ndarray:
    weight = np.random.default_rng(2).standard_normal(n * k).astype(np.float32)
    # every 7th value a tie of the TF32 rounding (exactly half an ulp below its 13 bits)
    weight[::7] = (weight[::7].view(np.uint32) & 0xFFFFE000 | 0x1000).view(np.float32)
    return weight


@pytest.mark.parametrize("entry", list(Entry), ids=lambda entry: entry.name)
def test_each_gather_map_makes_the_host_pack(entry: Entry) -> None:
    _, n, k, _ = entry.site().dimensions()
    kind = entry.config(4).kind
    entries = gather_map(kind, n, k)
    host_only = (isinstance(kind, TensorConv) and kind.planes == 1) or (
        isinstance(kind, Split) and kind.weights is SplitWeights.SCALED_HALF
    )
    host_only |= (
        isinstance(kind, Gemm)
        and kind.fragments is not None
        and (kind.fragments.half or kind.select > 0)
    )
    assert (entries is None) == host_only
    assert (entries is None) <= (entry.products() is Products.FP16)
    if entries is None:
        return
    weight = _weight(n, k)
    expected = np.asarray(pack_weight(kind, weight, n, k), np.float32).reshape(-1)
    assert np.array_equal(gather(weight, entries).view(np.uint32), expected.view(np.uint32))
    read = entries[entries >> 30 != GATHER_ZERO] & 0x3FFFFFFF
    assert np.array_equal(np.unique(read), np.arange(n * k))


def test_a_map_is_made_once_per_layout() -> None:
    kind = Entry.EMBED_B32_X3.config(4).kind
    assert gather_map(kind, 256, 5120) is gather_map(kind, 256, 5120)
