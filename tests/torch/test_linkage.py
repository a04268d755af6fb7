"""pyspk.torch.linkage without a GPU: its arguments, and its launches against the shipped
cluster module's entries."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pyspk.cuda.manifest import KernelModule, Manifest
from pyspk.cuda.tier import PtxTier
from pyspk.errors import InvalidArgument
from pyspk.torch import linkage


@pytest.mark.parametrize("n", [2, 3, 10, 3558])
def test_points_of_a_condensed_matrix(n: int) -> None:
    assert linkage.points_of(np.zeros(n * (n - 1) // 2)) == n


def test_points_of_refuses_what_is_no_condensed_matrix() -> None:
    with pytest.raises(InvalidArgument, match="7 distances"):
        linkage.points_of(np.zeros(7))
    with pytest.raises(InvalidArgument, match="one dimension, not 2"):
        linkage.points_of(np.zeros((4, 4)))


@pytest.mark.parametrize(
    ("points", "method", "message"),
    [
        (10, "average", "not 'average'"),  # scipy runs average linkage by another algorithm
        (1 + linkage.MAX_POINTS, "centroid", f"not {1 + linkage.MAX_POINTS}"),
    ],
)
def test_device_linkage_refuses_before_touching_a_device(
    points: int, method: str, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        linkage.device_linkage(np.zeros(points * (points - 1) // 2), method)


@pytest.mark.parametrize("shape", [(1, 8), (4,), (3, 0), (1 + linkage.MAX_POINTS, 2)])
def test_device_pdist_refuses_before_touching_a_device(shape: tuple) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(f"not {shape}")):
        linkage.device_pdist(np.zeros(shape))


@pytest.mark.parametrize("tier", [PtxTier.SM75, PtxTier.SM80], ids=str)
def test_launch_signatures_are_the_shipped_entries(tier: PtxTier) -> None:
    """Pointers travel as u64; the manifest records each entry's PTX parameter types."""
    entries = Manifest.load().module(KernelModule.CLUSTER).tiers[tier].entries
    as_ptx = {"ptr": "u64", "u64": "u64", "u32": "u32"}
    for name, signature in [
        ("spk_linkage_neighbours", linkage.NEIGHBOURS_SIGNATURE),
        ("spk_linkage_merge", linkage.MERGE_SIGNATURE),
        ("spk_pdist_euclidean", linkage.PDIST_SIGNATURE),
    ]:
        assert tuple(entries[name]) == tuple(as_ptx[kind] for kind in signature)
