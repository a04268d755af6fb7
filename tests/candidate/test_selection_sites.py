"""The segdense sites: members, the boundaries they serve and their dimensions
(no GPU)."""

from __future__ import annotations

import pytest

from pyspk.candidate.errors import GeometryUnimplemented
from pyspk.candidate.framework import BoundaryId, DenseSite, SegConvSite
from pyspk.candidate.segdense import Site
from tests.segdense_expected import BOUNDARY_SITES

# --- sites ---------------------------------------------------------------------------


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
    # (rows per batch item, columns, reduction, NCW input length): convolution rows are
    # output positions, and the dense sites have no input length (0)
    assert Site.CONV1.dimensions() == (5321, 60, 400, 5325)
    assert Site.CONV2.dimensions() == (1769, 60, 300, 1773)
    assert Site.LINEAR0.dimensions() == (589, 128, 256, 0)
    assert Site.LINEAR1.dimensions() == (589, 128, 128, 0)
    assert Site.LINEAR2.dimensions() == (589, 7, 128, 0)
    assert Site.EMBEDDING.dimensions() == (3, 256, 5120, 0)
