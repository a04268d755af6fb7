"""pyspk.torch.linkage without a GPU: what it refuses before touching a device (the
cluster area's own checks: tests/candidate/test_cluster_plan.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pyspk.cuda.errors import DriverError
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


def driver_error(result_name: str) -> DriverError:
    return DriverError("cuMemAlloc", result_name, "", 2)


@pytest.mark.parametrize("raised_by", ["torch", "driver"])
def test_a_device_without_room_leaves_the_work_to_scipy(monkeypatch, raised_by: str) -> None:
    import torch

    def no_room(*args: object) -> None:
        if raised_by == "torch":
            raise torch.OutOfMemoryError("no room")
        raise driver_error("CUDA_ERROR_OUT_OF_MEMORY")

    monkeypatch.setattr(linkage, "_merge", no_room)
    assert linkage.device_linkage(np.ones(6), "centroid", device=0) is None


def test_other_driver_errors_reach_the_caller(monkeypatch) -> None:
    def fails(*args: object) -> None:
        raise driver_error("CUDA_ERROR_ILLEGAL_ADDRESS")

    monkeypatch.setattr(linkage, "_merge", fails)
    with pytest.raises(DriverError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        linkage.device_linkage(np.ones(6), "centroid", device=0)
