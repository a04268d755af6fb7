"""The cluster area's plans: scipy's Euclidean `pdist` (`PdistPlan`) and its centroid and
median `linkage` of a condensed distance matrix (`LinkagePlan`) on a `CudaRuntime`'s
device, bit for bit; and `DeviceLinkage`, both for host points, as a clustering step
calls them.

The merge kernel runs scipy's generic algorithm step for step on one block: the same
distance updates rounded as scipy rounds them, the same choice among equal distances,
and scipy's heap operated in scipy's order, so the merges, their order and the linkage
matrix are scipy's. Where scipy would go on from a state the kernel does not follow (NaN
distances the merges make), the kernel stops with `LINKAGE_STOPPED` and the caller runs
scipy, as it does for distances scipy refuses."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pyspk.cuda.buffers import FLOAT64, INT32, DeviceBuffer, device_address
from pyspk.cuda.errors import ClosedError, CudaError, DriverError, InvalidArgument
from pyspk.cuda.kernels import buffer_params
from pyspk.cuda.lifetime import OrderedPlanLifetime, PlanLifetime, free_all
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.runtime import CudaRuntime, free_after_error

__all__ = [
    "MAX_POINTS",
    "METHODS",
    "DeviceLinkage",
    "LinkagePlan",
    "PdistPlan",
    "plan_linkage",
    "plan_pdist",
    "points_of",
]

CONTEXT = "cluster plan"
# the merge kernel's methods, by scipy's name
METHODS = {"centroid": 0, "median": 1}
# spk_linkage_merge's block, and the most points it takes (cluster ids fit its 16-bit live
# lists)
LINKAGE_THREADS = 1024
MAX_POINTS = 65536
# spk_linkage_neighbours: one warp per point, 8 a block
NEIGHBOUR_THREADS = 256
NEIGHBOUR_ROWS = 8
# the kernel's state per cluster: heap value, bound (doubles), five 32-bit words and two
# 16-bit live-list entries
STATE_BYTES_PER_CLUSTER = 40
# spk_pdist_euclidean: one block per PDIST_TILE x PDIST_TILE pairs, one thread a pair
PDIST_TILE = 16
PDIST_THREADS = PDIST_TILE * PDIST_TILE
# the entries' parameters: a pointer and length per buffer, then the scalars
NEIGHBOURS_SIGNATURE = (*buffer_params("d"), *buffer_params("work"), ("n", "u32"))
MERGE_SIGNATURE = (
    *buffer_params("d"),
    *buffer_params("work"),
    *buffer_params("z"),
    *buffer_params("status"),
    ("n", "u32"),
    ("method", "u32"),
    ("in_shared", "u32"),
)
PDIST_SIGNATURE = (*buffer_params("points"), *buffer_params("d"), ("n", "u32"), ("dims", "u32"))
# status words
LINKAGE_DONE = 0
LINKAGE_STOPPED = 1
LINKAGE_UNRUN = 2
# no squared difference of coordinates below this size reaches infinity, nor does their
# sum over MAX_DIMS coordinates: points within it give finite distances, which the merge
# kernel takes (scipy refuses infinite ones with its own error)
FINITE_COORDINATE = 1e150
MAX_DIMS = 1 << 16


def pairs_of(count: int) -> int:
    """The condensed matrix's length for `count` points."""
    return count * (count - 1) // 2


def points_of(distances: Any) -> int:
    """n for a condensed matrix of n * (n - 1) / 2 distances (an array of one dimension,
    on the host or a device)."""
    dims = distances.ndim if hasattr(distances, "ndim") else np.ndim(distances)
    if dims != 1:
        raise InvalidArgument(f"a condensed distance matrix has one dimension, not {dims}")
    count = len(distances)
    n = (1 + math.isqrt(1 + 8 * count)) // 2
    if pairs_of(n) != count:
        raise InvalidArgument(f"{count} distances are no condensed matrix of any number of points")
    return n


def _check_count(count: int, capacity: int, what: str) -> int:
    if not 2 <= count <= capacity:
        raise InvalidArgument(f"{CONTEXT}: {what} takes 2 to {capacity} points, not {count}")
    return count


class PdistPlan(PlanLifetime):
    """scipy's `pdist(points, "euclidean")` of float64 points, bit for bit:
    `enqueue(points, distances, count=n)` writes the condensed matrix of `n` points of
    `dims` coordinates. Owns no buffer: enqueues on any streams may overlap."""

    def __init__(self, runtime: CudaRuntime, dims: int) -> None:
        if not 1 <= dims <= MAX_DIMS:
            raise InvalidArgument(f"{CONTEXT}: pdist takes 1 to {MAX_DIMS} dims, not {dims}")
        self.dims = dims
        self._kernel = runtime.load_kernels(KernelModule.CLUSTER).function("spk_pdist_euclidean")
        super().__init__(runtime, [], CONTEXT)

    def enqueue(
        self, points: object, distances: object, *, count: int, stream: int | None = None
    ) -> None:
        """points: float64 `[count, dims]`, distances: float64 `[count * (count - 1) / 2]`,
        on the plan's device; queued on `stream` (an int handle) or the runtime's."""
        n = _check_count(count, MAX_POINTS, "pdist")
        ordinal = self.runtime.ordinal
        points_at = device_address(points, n * self.dims, CONTEXT, "points", ordinal, dtype=FLOAT64)
        d_len = pairs_of(n)
        d_at = device_address(
            distances, d_len, CONTEXT, "distances", ordinal, writable=True, dtype=FLOAT64
        )
        tiles = -(-n // PDIST_TILE)
        values = [points_at, n * self.dims, d_at, d_len, n, self.dims]
        launch = self._kernel.launch((tiles, tiles, 1), PDIST_THREADS, 0, PDIST_SIGNATURE, values)
        self._acquire()
        try:
            self._check_open()
            launch.enqueue(self.runtime.stream if stream is None else stream)
        finally:
            self._release()


class LinkagePlan(OrderedPlanLifetime):
    """scipy's `linkage(distances, method)` for the centroid and median methods, of up to
    `capacity` points: `enqueue(distances, z, status, count=n, method=...)` overwrites
    the condensed float64 `distances` while it merges, writes the `(n - 1, 4)` float64
    linkage matrix to `z` and a status word (`LINKAGE_DONE`, `LINKAGE_STOPPED` where
    scipy must run) to the int32 `status`. The merge state it owns serves one enqueue at
    a time, whatever the streams (`StreamOrder`)."""

    def __init__(self, runtime: CudaRuntime, capacity: int) -> None:
        self.capacity = _check_count(capacity, MAX_POINTS, "a linkage plan")
        kernels = runtime.load_kernels(KernelModule.CLUSTER)
        self._neighbours = kernels.function("spk_linkage_neighbours")
        self._merge = kernels.function("spk_linkage_merge")
        # the limit is all the shared memory the device allows, the same for every plan:
        # a limit fitted to one plan's size could be lowered by another's between this
        # one's setting and its launch
        self._room = self._merge.shared_room(runtime.device.shared_optin_bytes)
        self._merge.set_max_dynamic_shared(self._room)
        self._work = runtime.alloc_zeros(capacity * STATE_BYTES_PER_CLUSTER // 4, INT32)
        super().__init__(runtime, [self._work], CONTEXT)

    def enqueue(
        self,
        distances: object,
        z: object,
        status: object,
        *,
        count: int,
        method: str,
        stream: int | None = None,
    ) -> None:
        """Queues the merges of `count` points on `stream` (an int handle) or the
        runtime's; `status` reads `LINKAGE_DONE` once the matrix is scipy's."""
        if method not in METHODS:
            raise InvalidArgument(f"{CONTEXT}: the methods are {sorted(METHODS)}, not {method!r}")
        n = _check_count(count, self.capacity, "this linkage plan")
        ordinal = self.runtime.ordinal
        d_len, work_len = pairs_of(n), n * STATE_BYTES_PER_CLUSTER // 4
        d = (
            device_address(
                distances, d_len, CONTEXT, "distances", ordinal, writable=True, dtype=FLOAT64
            ),
            d_len,
        )
        z_at = (
            device_address(z, 4 * (n - 1), CONTEXT, "z", ordinal, writable=True, dtype=FLOAT64),
            4 * (n - 1),
        )
        status_at = (
            device_address(status, 1, CONTEXT, "status", ordinal, writable=True, dtype=INT32),
            1,
        )
        in_shared = int(n * STATE_BYTES_PER_CLUSTER <= self._room)
        shared = n * STATE_BYTES_PER_CLUSTER if in_shared else 0
        self._acquire()
        try:
            self._check_open()
            work = (self._work.ptr, work_len)
            neighbours = self._neighbours.launch(
                -(-(n - 1) // NEIGHBOUR_ROWS),
                NEIGHBOUR_THREADS,
                0,
                NEIGHBOURS_SIGNATURE,
                [*d, *work, n],
            )
            values = [*d, *work, *z_at, *status_at, n, METHODS[method], in_shared]
            merge = self._merge.launch(1, LINKAGE_THREADS, shared, MERGE_SIGNATURE, values)
            queue = self.runtime.stream if stream is None else stream
            ordered = self._order.before(queue)
            neighbours.enqueue(queue)
            merge.enqueue(queue)
            self._order.after(queue, ordered)
        finally:
            self._release()


def merged_matrix(code: int, z: np.ndarray, where: str, n: int) -> np.ndarray | None:
    """The linkage matrix `z` of a merge that ended with status `code`: None where the
    kernel stopped at NaN distances (scipy runs), an error naming `where` if the kernel
    refused its launch."""
    if code == LINKAGE_STOPPED:
        return None
    if code != LINKAGE_DONE:
        raise CudaError(
            f"spk_linkage_merge on {where} refused its launch for {n} points (status {code})"
        )
    return z


def out_of_memory(error: DriverError) -> bool:
    """Whether a driver call failed for want of device memory: the linkage's callers then
    return None, and scipy runs on the host."""
    return error.result_name == "CUDA_ERROR_OUT_OF_MEMORY"


def plan_pdist(runtime: CudaRuntime, dims: int) -> PdistPlan:
    """A plan of scipy's Euclidean `pdist` of float64 points of `dims` coordinates."""
    return PdistPlan(runtime, dims)


def plan_linkage(runtime: CudaRuntime, capacity: int) -> LinkagePlan:
    """A plan of scipy's centroid and median `linkage` of up to `capacity` points."""
    return LinkagePlan(runtime, capacity)


class DeviceLinkage:
    """scipy's `linkage(pdist(points), method)` of host points on the runtime's device, or
    None where scipy must run: points whose distances would not all be finite, NaN
    distances the merges made, or distances the device has no room for (8 bytes a pair:
    4.3 GB for 32,768 points, 17.2 GB for MAX_POINTS; planned only within half the free
    memory). Its plans and buffers grow to the most points asked for, so a run of files
    allocates (and synchronizes the device to free) only when one is larger than all
    before it, up to KEEP_POINTS; those for more are freed after their call. One call
    at a time (a lock); `close()` frees it all."""

    # capacities in steps of this many points: a run of files of similar sizes plans once
    CAPACITY_STEP = 1024
    # plans and buffers for more points are freed after their call: their distances
    # (1.07 GB at this count, 17.2 GB at MAX_POINTS) would otherwise stay held between
    # the rare long files, from the device memory the models' next files need
    KEEP_POINTS = 16384

    def __init__(self, runtime: CudaRuntime) -> None:
        self.runtime = runtime
        self._lock = threading.Lock()
        self._shape = (0, 0)  # (capacity, dims) of the plans and buffers below
        self._plans: list[PlanLifetime] = []
        self._buffers: list[DeviceBuffer] = []
        self.closed = False

    def __call__(
        self, points: np.ndarray, method: str, meanwhile: Callable[[], object] | None = None
    ) -> np.ndarray | None:
        """The dendrogram (see the class). `meanwhile`, when given, runs on the host
        while the device merges, once the merges are launched; it is not called where
        None comes back before any launch (scipy's turn), and its error is raised once
        the merges are done."""
        if method not in METHODS:
            raise InvalidArgument(f"{CONTEXT}: the methods are {sorted(METHODS)}, not {method!r}")
        rows = np.ascontiguousarray(points, dtype=np.float64)  # as scipy's pdist takes them
        if rows.ndim != 2 or not 2 <= len(rows) <= MAX_POINTS or not 1 <= rows.shape[1] <= MAX_DIMS:
            raise InvalidArgument(
                f"{CONTEXT}: takes (n, dims) points, 2 <= n <= {MAX_POINTS}, not {rows.shape}"
            )
        # two reductions and no temporary array; NaN fails both comparisons
        if not (rows.min() > -FINITE_COORDINATE and rows.max() < FINITE_COORDINATE):
            return None
        n, dims = rows.shape
        with self._lock:
            if self.closed:
                raise ClosedError(f"{CONTEXT}: this DeviceLinkage was closed; nothing was launched")
            try:
                fitted = self._fit(n, dims)
            except DriverError as error:
                if not out_of_memory(error):
                    raise
                return None
            if fitted is None:
                return None
            try:
                code, result = self._run(fitted, rows, method, meanwhile)
            finally:
                if self._shape[0] > self.KEEP_POINTS:
                    self._drop()
        return merged_matrix(code, result, f"device {self.runtime.ordinal}", n)

    def _run(
        self,
        fitted: tuple[PdistPlan, LinkagePlan, tuple[DeviceBuffer, ...]],
        rows: np.ndarray,
        method: str,
        meanwhile: Callable[[], object] | None = None,
    ) -> tuple[int, np.ndarray]:
        """The distances and merges of `rows` on the fitted plans: the status and z,
        `meanwhile` run between the launches and the reads."""
        pdist, linkage, (points_at, d, z, status) = fitted
        (n, dims), runtime = rows.shape, self.runtime
        runtime.write(points_at, rows)
        runtime.write(status, np.array([LINKAGE_UNRUN], dtype=np.int32))
        distances = d.prefix(pairs_of(n))
        pdist.enqueue(points_at.prefix(n * dims), distances, count=n)
        linkage.enqueue(distances, z.prefix(4 * (n - 1)), status, count=n, method=method)
        try:
            if meanwhile is not None:
                meanwhile()
        finally:  # the reads wait for the merges, whatever meanwhile did
            code = int(runtime.read(status.ptr, 1, None, INT32)[0])
        return code, runtime.read(z.ptr, 4 * (n - 1), None, FLOAT64).reshape(n - 1, 4)

    def _fit(
        self, count: int, dims: int
    ) -> tuple[PdistPlan, LinkagePlan, tuple[DeviceBuffer, ...]] | None:
        """The plans and buffers (points, distances, z, status) for `count` points of
        `dims` coordinates, planned again when they are too small or of other dims; None
        where they would take more than half the device's free memory (other engines'
        files may be on it; scipy runs instead)."""
        capacity, planned_dims = self._shape
        if count > capacity or dims != planned_dims:
            self._drop()
            capacity = min(MAX_POINTS, -(-count // self.CAPACITY_STEP) * self.CAPACITY_STEP)
            lengths = (
                (capacity * dims, FLOAT64),
                (pairs_of(capacity), FLOAT64),
                (4 * (capacity - 1), FLOAT64),
                (1, INT32),
            )
            runtime, made = self.runtime, []
            need = sum(length * dtype.itemsize for length, dtype in lengths)
            if need + capacity * STATE_BYTES_PER_CLUSTER > runtime.free_bytes() // 2:
                return None
            try:
                for length, dtype in lengths:
                    made.append(runtime.alloc_zeros(length, dtype))
                self._plans = [plan_pdist(runtime, dims)]
                self._plans.append(plan_linkage(runtime, capacity))
            except BaseException:
                free_after_error(made)
                self._drop()
                raise
            self._buffers, self._shape = made, (capacity, dims)
        pdist, linkage = self._plans
        return pdist, linkage, tuple(self._buffers)  # type: ignore[return-value]

    def _drop(self) -> None:
        plans, self._plans = self._plans, []
        buffers, self._buffers = self._buffers, []
        self._shape = (0, 0)
        try:
            for plan in plans:
                plan.close()
        finally:
            free_all(buffers)

    def close(self) -> None:
        """Frees its plans and buffers (idempotent); a later call raises `ClosedError`."""
        with self._lock:
            self.closed = True
            self._drop()

    def __enter__(self) -> DeviceLinkage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
