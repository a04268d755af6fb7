"""pyspk.torch.linkage without a GPU: what it refuses before touching a device (the
cluster area's own checks: tests/candidate/test_cluster_plan.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pyspk.errors import InvalidArgument
from pyspk.torch import linkage


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
