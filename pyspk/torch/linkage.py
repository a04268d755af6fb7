"""The cluster area (`pyspk.candidate.cluster`) on PyTorch tensors: `device_pdist` and
`device_linkage`, scipy's Euclidean `pdist` and its centroid and median `linkage` on a
CUDA device, bit for bit, ordered on PyTorch's current stream there."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pyspk.candidate.cluster.plan import (
    LINKAGE_UNRUN,
    MAX_POINTS,
    METHODS,
    STATE_BYTES_PER_CLUSTER,
    merged_matrix,
    out_of_memory,
    pairs_of,
    plan_linkage,
    plan_pdist,
    points_of,
)
from pyspk.cuda.errors import DriverError
from pyspk.errors import InvalidArgument

if TYPE_CHECKING:
    import torch

__all__ = [
    "MAX_POINTS",
    "METHODS",
    "STATE_BYTES_PER_CLUSTER",
    "device_linkage",
    "device_pdist",
    "points_of",
]


def device_pdist(
    points: np.ndarray | torch.Tensor, device: torch.device | int | None = None
) -> torch.Tensor:
    """scipy's `pdist(points, "euclidean")` computed on a CUDA device, bit for bit: the
    condensed float64 matrix of the (n, dims) `points` (2 to MAX_POINTS of them, taken
    as float64 as scipy takes them), a tensor on `device`, ordered on PyTorch's current
    stream there. `device_linkage` takes it as it is."""
    import torch

    from pyspk.torch import _ordinal, shared_runtime

    shape = tuple(points.shape)
    if len(shape) != 2 or not 2 <= shape[0] <= MAX_POINTS or shape[1] < 1:
        raise InvalidArgument(
            f"device_pdist takes (n, dims) points, 2 <= n <= {MAX_POINTS}, not {shape}"
        )
    n, dims = shape
    device = torch.device("cuda", _ordinal(device))
    with torch.cuda.device(device):
        rows = torch.as_tensor(points).to(device=device, dtype=torch.float64).contiguous()
        d = torch.empty(pairs_of(n), dtype=torch.float64, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream
        with plan_pdist(shared_runtime(device), dims) as plan:
            plan.enqueue(rows, d, count=n, stream=stream)
    return d


def device_linkage(
    distances: np.ndarray | torch.Tensor, method: str, device: torch.device | int | None = None
) -> np.ndarray | None:
    """scipy's `linkage(distances, method)` computed on a CUDA device: the (n - 1, 4)
    float64 linkage matrix, equal to scipy's bit for bit, or None where scipy must run:
    distances that are not all finite (scipy refuses them with its own error), NaN
    distances the merges made, where the kernel stopped, or a device without room for
    the distances' copy or the merge state (PyTorch's or the driver's out-of-memory
    error). `distances` is a condensed distance matrix of 2 to MAX_POINTS points, on the
    host or on `device`; the work is ordered on PyTorch's current stream there and
    waited for."""
    if method not in METHODS:
        raise InvalidArgument(f"device_linkage runs the methods {sorted(METHODS)}, not {method!r}")
    n = points_of(distances)
    if not 2 <= n <= MAX_POINTS:
        raise InvalidArgument(f"device_linkage takes 2 to {MAX_POINTS} points, not {n}")
    import torch

    from pyspk.torch import _ordinal

    device = torch.device("cuda", _ordinal(device))
    try:
        merged = _merge(distances, n, method, device)
    except torch.OutOfMemoryError:
        return None
    except DriverError as error:
        if not out_of_memory(error):
            raise
        return None
    return None if merged is None else merged_matrix(*merged, str(device), n)


def _merge(
    distances: np.ndarray | torch.Tensor, n: int, method: str, device: torch.device
) -> tuple[int, np.ndarray] | None:
    """`device_linkage`'s device work: the merge's status and z, or None for distances
    that are not all finite."""
    import torch

    from pyspk.torch import shared_runtime

    with torch.cuda.device(device):
        # the kernel overwrites its matrix: always a copy, whatever the input
        d = torch.empty(len(distances), dtype=torch.float64, device=device)
        d.copy_(torch.as_tensor(distances))
        if not bool(torch.isfinite(d).all()):
            return None
        z = torch.empty((n - 1, 4), dtype=torch.float64, device=device)
        status = torch.full((1,), LINKAGE_UNRUN, dtype=torch.int32, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream
        with plan_linkage(shared_runtime(device), n) as plan:
            plan.enqueue(d, z, status, count=n, method=method, stream=stream)
            # read before the plan frees its merge state
            return int(status.item()), z.cpu().numpy()
