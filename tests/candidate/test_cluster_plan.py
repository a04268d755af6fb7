"""The cluster area without a GPU (the fake driver): runtime buffers of float64 and int32,
the plans' checks and launches against the shipped entries, and `DeviceLinkage`'s
growth, status handling and host-side refusals. The kernels' results are tested on the
H200 (tests/gpu/test_linkage_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.candidate.cluster import plan as cluster
from pyspk.cuda import CudaRuntime
from pyspk.cuda.buffers import FLOAT32, FLOAT64, INT32, buffer_interface
from pyspk.cuda.lifetime import PlanLifetime
from pyspk.cuda.manifest import KernelModule, Manifest
from pyspk.cuda.tier import PtxTier
from pyspk.errors import (
    BufferLayoutError,
    BufferLengthError,
    ClosedError,
    CudaError,
    InvalidArgument,
)
from tests.fake_driver import FakeApi
from tests.signatures import ptx_kinds


@pytest.mark.parametrize("dtype", [FLOAT32, FLOAT64, INT32], ids=str)
def test_buffers_of_each_dtype_round_trip(runtime: CudaRuntime, dtype) -> None:
    values = np.arange(-3, 9).astype(dtype)
    buffer = runtime.upload(values, dtype)
    assert buffer.dtype == dtype and buffer.nbytes == values.nbytes
    assert buffer.__cuda_array_interface__["typestr"] == dtype.str
    got = runtime.download(buffer)
    assert got.dtype == dtype and np.array_equal(got, values)
    zeros = runtime.alloc_zeros(5, dtype)
    assert np.array_equal(runtime.download(zeros), np.zeros(5, dtype))
    runtime.write(zeros, values[:3])
    assert np.array_equal(runtime.download(zeros), [*values[:3], 0, 0])
    copy = runtime.alloc_zeros(len(values), dtype)
    runtime.copy(copy, buffer, dtype)
    assert np.array_equal(runtime.download(copy), values)


def test_buffers_refuse_what_they_do_not_hold(runtime: CudaRuntime) -> None:
    with pytest.raises(InvalidArgument, match="float32, float64, int32, not int64"):
        runtime.alloc_zeros(4, np.int64)
    doubles = runtime.alloc_zeros(4, FLOAT64)
    with pytest.raises(BufferLayoutError, match="a plan: x holds float64, expected float32"):
        buffer_interface(doubles, "a plan", "x", 0)
    with pytest.raises(BufferLayoutError, match="typestr '<f4', expected float64"):
        buffer_interface(runtime.alloc_zeros(4).prefix(4), "a plan", "x", 0, dtype=FLOAT64)
    with pytest.raises(InvalidArgument, match="do not fit"):
        runtime.write(doubles, np.zeros(5))
    with pytest.raises(InvalidArgument, match="no prefix of 5"):
        doubles.prefix(5)
    with pytest.raises(InvalidArgument, match="float64 values do not go into"):
        runtime.write(runtime.alloc_zeros(4, INT32), np.zeros(4))


def test_a_prefix_is_the_start_of_its_buffer(runtime: CudaRuntime) -> None:
    buffer = runtime.upload(np.arange(10.0), FLOAT64)
    ptr, count, stream = buffer_interface(buffer.prefix(3), "a plan", "x", 0, dtype=FLOAT64)
    assert (ptr, count, stream) == (buffer.ptr, 3, runtime.stream_handle)
    assert np.array_equal(runtime.read(ptr, count, None, FLOAT64), [0.0, 1.0, 2.0])
    assert np.array_equal(runtime.download(buffer.prefix(2)), [0.0, 1.0])


@pytest.mark.parametrize("n", [2, 3, 10, 3558])
def test_points_of_a_condensed_matrix(n: int) -> None:
    assert cluster.points_of(np.zeros(n * (n - 1) // 2)) == n


def test_points_of_refuses_what_is_no_condensed_matrix() -> None:
    with pytest.raises(InvalidArgument, match="7 distances"):
        cluster.points_of(np.zeros(7))
    with pytest.raises(InvalidArgument, match="one dimension, not 2"):
        cluster.points_of(np.zeros((4, 4)))


@pytest.mark.parametrize("tier", [PtxTier.SM75, PtxTier.SM80], ids=str)
def test_launch_signatures_are_the_shipped_entries(tier: PtxTier) -> None:
    """Pointers travel as u64; the manifest records each entry's PTX parameter types."""
    entries = Manifest.load().module(KernelModule.CLUSTER).tiers[tier].entries
    for name, signature in [
        ("spk_linkage_neighbours", cluster.NEIGHBOURS_SIGNATURE),
        ("spk_linkage_merge", cluster.MERGE_SIGNATURE),
        ("spk_pdist_euclidean", cluster.PDIST_SIGNATURE),
    ]:
        assert list(entries[name]) == ptx_kinds(signature)


def test_the_plans_take_their_dtypes_and_exact_lengths(fake: FakeApi, runtime: CudaRuntime) -> None:
    n = 40
    with cluster.plan_linkage(runtime, 64) as linkage, cluster.plan_pdist(runtime, 8) as pdist:
        assert isinstance(linkage, PlanLifetime) and isinstance(pdist, PlanLifetime)
        points = runtime.alloc_zeros(n * 8, FLOAT64)
        d = runtime.alloc_zeros(n * (n - 1) // 2, FLOAT64)
        z = runtime.alloc_zeros(4 * (n - 1), FLOAT64)
        status = runtime.alloc_zeros(1, INT32)
        with pytest.raises(BufferLayoutError, match="points holds float32"):
            pdist.enqueue(runtime.alloc_zeros(n * 8), d, count=n)
        with pytest.raises(BufferLengthError):
            pdist.enqueue(points, d, count=n + 1)
        with pytest.raises(BufferLayoutError, match="status holds float64"):
            linkage.enqueue(d, z, z, count=n, method="centroid")
        with pytest.raises(InvalidArgument, match="2 to 64 points, not 65"):
            linkage.enqueue(d, z, status, count=65, method="centroid")
        with pytest.raises(InvalidArgument, match="not 'average'"):
            linkage.enqueue(d, z, status, count=n, method="average")
        fake.read_params = (1, 3)  # the first two buffers' lengths
        pdist.enqueue(points, d, count=n)
        linkage.enqueue(d, z, status, count=n, method="median")
    names = [launch[0] for launch in fake.launches]
    assert names == ["fn:spk_pdist_euclidean", "fn:spk_linkage_neighbours", "fn:spk_linkage_merge"]
    assert fake.launches[0][1] == (3, 3, 1)  # 16 x 16 pairs a block
    assert fake.launches[1][1] == (5, 1, 1)  # 8 points' rows a block
    assert fake.launches[2][3] == n * cluster.STATE_BYTES_PER_CLUSTER  # its state in shared memory
    pairs, words = n * (n - 1) // 2, n * cluster.STATE_BYTES_PER_CLUSTER // 4
    assert [values[1:] for values in fake.param_values] == [
        (n * 8, pairs),
        (pairs, words),
        (pairs, words),
    ]


def test_device_linkage_grows_in_steps_and_reports_a_refused_launch(
    fake: FakeApi, runtime: CudaRuntime
) -> None:
    """The fake runs no kernel, so the status stays LINKAGE_UNRUN: the error a launch
    the kernel refused gives."""
    rng = np.random.default_rng(0)
    with cluster.DeviceLinkage(runtime) as linkage:
        for count, allocations in [(600, 5), (1000, 0), (1100, 5), (30, 0)]:
            before = fake.calls.count("cuMemAlloc")
            with pytest.raises(CudaError, match=f"for {count} points \\(status 2\\)"):
                linkage(rng.standard_normal((count, 4)), "centroid")
            assert fake.calls.count("cuMemAlloc") - before == allocations, count
        # other dims: planned again at the same capacity
        with pytest.raises(CudaError):
            linkage(rng.standard_normal((30, 5)), "centroid")
        assert len(fake.memory) == 5  # points, distances, z, status and the merge state
    assert not fake.memory
    with pytest.raises(ClosedError, match="was closed; nothing was launched"):
        linkage(rng.standard_normal((30, 4)), "centroid")


def test_device_linkage_frees_what_it_planned_for_more_than_it_keeps(
    fake: FakeApi, runtime: CudaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plans for more than KEEP_POINTS points are freed after their call; smaller ones
    stay for the next."""
    monkeypatch.setattr(cluster.DeviceLinkage, "KEEP_POINTS", 1024)
    rng = np.random.default_rng(2)
    with cluster.DeviceLinkage(runtime) as linkage:
        for count, held in [(600, 5), (1500, 0), (1000, 5)]:
            with pytest.raises(CudaError, match="status 2"):  # the fake runs no kernel
                linkage(rng.standard_normal((count, 2)), "centroid")
            assert len(fake.memory) == held, count


def test_device_linkage_leaves_to_scipy_what_would_take_half_the_free_memory(
    fake: FakeApi, runtime: CudaRuntime
) -> None:
    """1000 points plan for 1024: 4.2 MB of distances and 37 KB of state. With 8 MB free
    they would take more than half: nothing is allocated or launched; with 9 MB, they
    are planned."""
    rng = np.random.default_rng(3)
    points = rng.standard_normal((1000, 2))
    with cluster.DeviceLinkage(runtime) as linkage:
        fake.free_bytes = 8 << 20
        allocations = fake.calls.count("cuMemAlloc")
        assert linkage(points, "centroid") is None
        assert fake.calls.count("cuMemAlloc") == allocations and not fake.launches
        fake.free_bytes = 9 << 20
        with pytest.raises(CudaError, match="status 2"):  # planned; the fake runs no kernel
            linkage(points, "centroid")
        assert len(fake.memory) == 5


def test_device_linkage_frees_what_it_planned_for_more_than_it_keeps_when_a_call_fails(
    fake: FakeApi, runtime: CudaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster.DeviceLinkage, "KEEP_POINTS", 1024)
    fake.launch_status = fake.CUresult.CUDA_ERROR_INVALID_VALUE  # the launch fails
    with cluster.DeviceLinkage(runtime) as linkage:
        with pytest.raises(CudaError):
            linkage(np.random.default_rng(4).standard_normal((1500, 2)), "centroid")
        assert not fake.memory


def test_device_linkage_leaves_distances_the_device_cannot_hold_to_scipy(
    fake: FakeApi, runtime: CudaRuntime
) -> None:
    """17,000 points' distances take 1.16 GB, more than the fake allocates (1 GiB): the
    linkage steps aside with nothing held or launched, and plans again for fewer."""
    rng = np.random.default_rng(1)
    with cluster.DeviceLinkage(runtime) as linkage:
        assert linkage(rng.standard_normal((17000, 2)), "centroid") is None
        assert not fake.launches and not fake.memory
        with pytest.raises(CudaError, match="status 2"):  # the fake runs no kernel
            linkage(rng.standard_normal((600, 2)), "centroid")
    assert not fake.memory


@pytest.mark.parametrize(
    "points", [np.full((20, 3), np.nan), np.full((20, 3), 1e151), np.full((20, 3), -np.inf)]
)
def test_device_linkage_leaves_points_without_finite_distances_to_scipy(
    fake: FakeApi, runtime: CudaRuntime, points: np.ndarray
) -> None:
    with cluster.DeviceLinkage(runtime) as linkage:
        assert linkage(points, "centroid") is None
    assert not fake.launches


@pytest.mark.parametrize(
    ("shape", "method", "message"),
    [
        ((1, 4), "centroid", r"not \(1, 4\)"),
        ((20,), "centroid", r"not \(20,\)"),
        ((20, 4), "ward", "not 'ward'"),
    ],
)
def test_device_linkage_refuses_before_launching(
    fake: FakeApi, runtime: CudaRuntime, shape: tuple, method: str, message: str
) -> None:
    with cluster.DeviceLinkage(runtime) as linkage, pytest.raises(InvalidArgument, match=message):
        linkage(np.zeros(shape), method)
    assert not fake.launches
