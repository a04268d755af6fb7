"""`scipy.cluster.hierarchy.linkage` for the centroid and median methods on the GPU, with
scipy's dendrogram to the bit, and the Euclidean distances it starts from with scipy's
`pdist` to the bit (the cluster module, `ptx/src/cluster/cluster.cu`).

scipy runs these methods through its generic algorithm on one core, most of the
clustering step's time (docs/performance.md, "The diarization engine"). The kernel runs
the same algorithm step for step on one block: the same distance updates rounded as
scipy rounds them, the same choice among equal distances, and scipy's heap operated in
scipy's order, so the merges, their order and the linkage matrix are scipy's. Where
scipy would go on from a state the kernel does not follow (NaN distances), the kernel
stops and `device_linkage` returns None for the caller to run scipy, as it does for
distances scipy refuses. Needs PyTorch (buffers and streams)
and a CUDA device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pyspk.cuda.manifest import KernelModule
from pyspk.errors import CudaError, InvalidArgument

if TYPE_CHECKING:
    import torch

# the kernel's methods, by scipy's name
METHODS = {"centroid": 0, "median": 1}
# spk_linkage_merge's block, and the most points it takes (one cluster flag bit a thread
# per pass, 32 passes of 1024)
LINKAGE_THREADS = 1024
MAX_POINTS = 32768
# spk_linkage_neighbours: one warp per point, 8 a block
NEIGHBOUR_THREADS = 256
NEIGHBOUR_ROWS = 8
# the kernel's state per cluster: heap value, bound (doubles) and five 32-bit words
STATE_BYTES_PER_CLUSTER = 36
# spk_pdist_euclidean: one block per PDIST_TILE x PDIST_TILE pairs, one thread a pair
PDIST_TILE = 16
PDIST_THREADS = PDIST_TILE * PDIST_TILE
# the entries' parameters (pointer and length per buffer, then the scalars)
NEIGHBOURS_SIGNATURE = ("ptr", "u64", "ptr", "u64", "u32")  # d, work, n
MERGE_SIGNATURE = ("ptr", "u64") * 4 + ("u32",) * 3  # d, work, z, status, n, method, in_shared
PDIST_SIGNATURE = ("ptr", "u64", "ptr", "u64", "u32", "u32")  # points, d, n, dims
# status words
LINKAGE_DONE = 0
LINKAGE_STOPPED = 1
LINKAGE_UNRUN = 2


def points_of(distances: np.ndarray | torch.Tensor) -> int:
    """n for a condensed matrix of n * (n - 1) / 2 distances."""
    dims = distances.ndim if hasattr(distances, "ndim") else np.ndim(distances)
    if dims != 1:
        raise InvalidArgument(f"a condensed distance matrix has one dimension, not {dims}")
    count = len(distances)
    n = int((1 + np.sqrt(1 + 8 * count)) / 2)
    if n * (n - 1) // 2 != count:
        raise InvalidArgument(f"{count} distances are no condensed matrix of any number of points")
    return n


def device_pdist(points: np.ndarray | torch.Tensor, device: torch.device | int | None = None):
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
        d = torch.empty(n * (n - 1) // 2, dtype=torch.float64, device=device)
        kernels = shared_runtime(device).load_kernels(KernelModule.CLUSTER)
        tiles = -(-n // PDIST_TILE)
        kernels.function("spk_pdist_euclidean").launch(
            (tiles, tiles, 1),
            PDIST_THREADS,
            0,
            PDIST_SIGNATURE,
            [*_buffer(rows), *_buffer(d), n, dims],
        ).enqueue(torch.cuda.current_stream(device).cuda_stream)
    return d


def device_linkage(
    distances: np.ndarray | torch.Tensor, method: str, device: torch.device | int | None = None
) -> np.ndarray | None:
    """scipy's `linkage(distances, method)` computed on a CUDA device: the (n - 1, 4)
    float64 linkage matrix, equal to scipy's bit for bit, or None where scipy must run:
    distances that are not all finite (scipy refuses them with its own error), or NaN
    distances the merges made, where the kernel stopped. `distances` is a condensed
    distance matrix of 2 to MAX_POINTS points, on the host or on `device`; the work is
    ordered on PyTorch's current stream there and waited for."""
    if method not in METHODS:
        raise InvalidArgument(f"device_linkage runs the methods {sorted(METHODS)}, not {method!r}")
    n = points_of(distances)
    if not 2 <= n <= MAX_POINTS:
        raise InvalidArgument(f"device_linkage takes 2 to {MAX_POINTS} points, not {n}")
    import torch

    from pyspk.torch import _ordinal, shared_runtime

    device = torch.device("cuda", _ordinal(device))
    with torch.cuda.device(device):
        # the kernel overwrites its matrix: always a copy, whatever the input
        d = torch.empty(len(distances), dtype=torch.float64, device=device)
        d.copy_(torch.as_tensor(distances))
        if not bool(torch.isfinite(d).all()):
            return None
        runtime = shared_runtime(device)
        kernels = runtime.load_kernels(KernelModule.CLUSTER)
        neighbours = kernels.function("spk_linkage_neighbours")
        merge = kernels.function("spk_linkage_merge")
        work = torch.empty(n * STATE_BYTES_PER_CLUSTER // 4, dtype=torch.int32, device=device)
        z = torch.empty((n - 1, 4), dtype=torch.float64, device=device)
        status = torch.full((1,), LINKAGE_UNRUN, dtype=torch.int32, device=device)
        # the kernel's limit is set to all the shared memory the device allows, the same
        # on every call: a limit fitted to one call's size could be lowered by another
        # thread's call between this one's setting and its launch
        room = runtime.device.shared_optin_bytes - merge.attribute("SHARED_SIZE_BYTES")
        merge.set_max_dynamic_shared(room)
        in_shared = int(n * STATE_BYTES_PER_CLUSTER <= room)
        shared = n * STATE_BYTES_PER_CLUSTER if in_shared else 0
        stream = torch.cuda.current_stream(device).cuda_stream
        neighbours.launch(
            -(-(n - 1) // NEIGHBOUR_ROWS),
            NEIGHBOUR_THREADS,
            0,
            NEIGHBOURS_SIGNATURE,
            [*_buffer(d), *_buffer(work), n],
        ).enqueue(stream)
        merge.launch(
            1,
            LINKAGE_THREADS,
            shared,
            MERGE_SIGNATURE,
            [
                *_buffer(d),
                *_buffer(work),
                *_buffer(z),
                *_buffer(status),
                n,
                METHODS[method],
                in_shared,
            ],
        ).enqueue(stream)
        result = z.cpu().numpy()
        code = int(status.item())
    if code == LINKAGE_STOPPED:
        return None
    if code != LINKAGE_DONE:
        raise CudaError(
            f"spk_linkage_merge on {device} refused its launch for {n} points (status {code})"
        )
    return result


def _buffer(tensor: Any) -> tuple[int, int]:
    """A tensor as the calling convention's pointer and element count."""
    return tensor.data_ptr(), tensor.numel()
