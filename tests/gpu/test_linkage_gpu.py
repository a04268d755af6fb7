"""The cluster module on the GPU: `device_linkage` gives scipy's linkage matrix bit for
bit (random embeddings, ties, both places of its state, distances on the device), steps
aside where scipy meets NaN, and is clean under compute-sanitizer; `device_pdist` gives
scipy's `pdist` bit for bit; `DeviceLinkage` (the cluster area on a pyspk runtime, no
PyTorch) gives both for host points as it grows, from two threads at once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

from pyspk.torch.linkage import STATE_BYTES_PER_CLUSTER, device_linkage, device_pdist
from tests.optional import importorskip

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def scipy(torch) -> SimpleNamespace:
    """scipy's `linkage` and `pdist`, the truth here: skipped without scipy (the `gpu`
    extra installs it), failed instead when PYSPK_REQUIRE_GPU=1."""
    try:
        from scipy.cluster.hierarchy import linkage
        from scipy.spatial.distance import pdist
    except ImportError as error:
        if os.environ.get("PYSPK_REQUIRE_GPU") == "1":
            pytest.fail(f"PYSPK_REQUIRE_GPU=1 but {error}; install pyspk[gpu]", pytrace=False)
        pytest.skip(f"scipy is missing ({error})")
    return SimpleNamespace(linkage=linkage, pdist=pdist)


def unit_rows(count: int, dims: int, seed: int) -> np.ndarray:
    """Unit vectors, as pyannote normalizes embeddings before a centroid linkage."""
    points = np.random.default_rng(seed).standard_normal((count, dims))
    return points / np.linalg.norm(points, axis=1, keepdims=True)


def same_as_scipy(scipy: SimpleNamespace, distances: np.ndarray, method: str) -> None:
    got = device_linkage(distances, method)
    assert got is not None
    expected = scipy.linkage(distances, method)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got, expected)


@pytest.mark.parametrize(
    ("count", "dims", "method"),
    [
        (2, 3, "centroid"),
        (3, 3, "centroid"),
        (40, 8, "centroid"),
        (1100, 256, "centroid"),  # more points than the block's threads
        (3558, 256, "centroid"),  # a diarized hour's embeddings
        (700, 16, "median"),
    ],
)
def test_device_linkage_is_scipys(scipy, count: int, dims: int, method: str) -> None:
    same_as_scipy(scipy, scipy.pdist(unit_rows(count, dims, seed=count)), method)


def test_ties_are_broken_as_scipy_breaks_them(scipy) -> None:
    """Repeated points (zero distances) and points on a small integer grid (many equal
    distances, equal bounds in the heap)."""
    repeated = np.repeat(unit_rows(300, 4, seed=1), 3, axis=0)
    grid = np.random.default_rng(2).integers(0, 4, size=(1500, 3)).astype(np.float64)
    for points in (repeated, grid):
        for method in ("centroid", "median"):
            same_as_scipy(scipy, scipy.pdist(points), method)


def test_state_in_global_memory_when_shared_memory_is_too_small(scipy) -> None:
    """Past the device's opt-in shared memory the kernel keeps its state in global
    memory: the same matrix."""
    from pyspk.torch import shared_runtime

    count = shared_runtime(0).device.shared_optin_bytes // STATE_BYTES_PER_CLUSTER + 50
    same_as_scipy(scipy, scipy.pdist(unit_rows(count, 32, seed=3)), "centroid")


def test_distances_already_on_the_device(torch, scipy) -> None:
    distances = scipy.pdist(unit_rows(900, 64, seed=4))
    got = device_linkage(torch.from_numpy(distances).cuda(), "centroid")
    assert np.array_equal(got, scipy.linkage(distances, "centroid"))


_WITHOUT_ROOM = textwrap.dedent(
    """
    import numpy as np
    import torch
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import pdist

    from pyspk.torch.linkage import device_linkage

    points = np.random.default_rng(9).standard_normal((3000, 16))
    distances = pdist(points / np.linalg.norm(points, axis=1, keepdims=True))
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 2**23) / total)
    refused = device_linkage(distances, "centroid") is None
    torch.cuda.set_per_process_memory_fraction(1.0)
    same = np.array_equal(device_linkage(distances, "centroid"), linkage(distances, "centroid"))
    print("refused" if refused else "served", bool(same))
    """
)


def test_a_device_without_room_for_the_distances_leaves_the_work_to_scipy(scipy) -> None:
    """PyTorch's allocator held below the distances' copy (36 MB): None, where PyTorch's
    out-of-memory error had reached the caller; with room again, scipy's matrix. In a
    fresh process: in this one an earlier test's live segment can hold a free block that
    takes the copy, which a cap on new reservations does not refuse (it did so in the
    whole GPU suite on an H100)."""
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_ROOM],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["refused", "True"], result.stdout + result.stderr


def test_a_point_without_a_finite_distance_stops_the_plan(torch) -> None:
    """Distances the wrappers refuse, given to the plan itself: point 0's are NaN, so it
    has no candidate. The kernel merges 1 and 2, finds none for 0 when it comes to the
    heap's top and stops (scipy refuses such distances) without a merge past the
    first."""
    from pyspk.candidate.cluster import plan_linkage
    from pyspk.candidate.cluster.plan import LINKAGE_STOPPED, LINKAGE_UNRUN
    from pyspk.torch import shared_runtime

    d = torch.tensor([float("nan"), float("nan"), 1.0], dtype=torch.float64, device="cuda")
    z = torch.full((2, 4), -1.0, dtype=torch.float64, device="cuda")
    status = torch.full((1,), LINKAGE_UNRUN, dtype=torch.int32, device="cuda")
    with plan_linkage(shared_runtime(0), 3) as plan:
        plan.enqueue(
            d,
            z,
            status,
            count=3,
            method="centroid",
            stream=torch.cuda.current_stream().cuda_stream,
        )
        torch.cuda.synchronize()
    assert int(status.item()) == LINKAGE_STOPPED
    assert z.cpu().numpy().tolist() == [[1.0, 2.0, 1.0, 2.0], [-1.0, -1.0, -1.0, -1.0]]


def test_nan_distances_leave_the_work_to_scipy(scipy) -> None:
    """Distances that no points have (uniform noise) send the centroid formula below
    zero, and its square root to NaN: the kernel either follows scipy to the same matrix
    or stops, and `linkage_on` then gives scipy's own answer. Distances that are not
    finite go to scipy without a launch."""
    distances = np.random.default_rng(5).uniform(0.0, 1.0, 999 * 998 // 2)
    infinite = distances.copy()
    infinite[17] = np.inf
    assert device_linkage(infinite, "centroid") is None  # scipy refuses it itself
    got = device_linkage(distances, "centroid")
    try:
        expected = scipy.linkage(distances, "centroid")
    except ValueError:
        assert got is None
        return
    assert got is None or np.array_equal(got, expected, equal_nan=True)


@pytest.mark.parametrize(
    ("count", "dims"), [(2, 1), (17, 3), (40, 33), (1100, 256), (3558, 256), (4100, 7)]
)
def test_device_pdist_is_scipys(scipy, count: int, dims: int) -> None:
    """Partial tiles of points and of coordinates, and float32 embeddings taken as
    float64, as scipy takes them."""
    points = np.random.default_rng(count).standard_normal((count, dims)).astype(np.float32)
    got = device_pdist(points).cpu().numpy()
    assert got.dtype == np.float64 and np.array_equal(got, scipy.pdist(points, "euclidean"))


def test_device_pdist_carries_nan_and_infinity_as_scipy(scipy) -> None:
    points = np.random.default_rng(3).standard_normal((60, 20))
    points[4, 7] = np.nan
    points[9, 2] = np.inf
    points[11, 2] = np.inf  # inf - inf: NaN for that pair
    got = device_pdist(points).cpu().numpy()
    assert np.array_equal(got, scipy.pdist(points, "euclidean"), equal_nan=True)


def test_the_engines_linkage_is_scipys(scipy) -> None:
    """`_clustering.linkage_on(DeviceLinkage)` as pyannote calls it: observations in, the
    matrix of scipy's linkage out, through the device above DEVICE_LINKAGE_MIN_POINTS."""
    importorskip("pyannote.audio", reason="pyspk.pyannote._clustering needs pyannote.audio")
    from pyspk.candidate.cluster import DeviceLinkage
    from pyspk.pyannote import _clustering
    from pyspk.torch import shared_runtime

    points = unit_rows(_clustering.DEVICE_LINKAGE_MIN_POINTS + 100, 256, seed=6)
    with DeviceLinkage(shared_runtime(0)) as device:
        got = _clustering.linkage_on(device)(points, method="centroid", metric="euclidean")
    assert np.array_equal(got, scipy.linkage(points, method="centroid", metric="euclidean"))


def test_a_device_linkage_on_its_own_runtime_grows_and_stays_scipys(scipy) -> None:
    """A pyspk runtime of its own (no PyTorch buffer or stream): sizes up and down, its
    plans made again past each capacity step and for other dims, float32 embeddings taken
    as float64 as scipy takes them, and NaN points left to scipy."""
    from pyspk.candidate.cluster import DeviceLinkage
    from pyspk.cuda import CudaRuntime

    with CudaRuntime(0) as runtime, DeviceLinkage(runtime) as linkage:
        for count, dims, method in [
            (700, 256, "centroid"),
            (2100, 256, "centroid"),
            (900, 256, "median"),
            (1500, 16, "centroid"),
        ]:
            points = unit_rows(count, dims, seed=count).astype(np.float32)
            expected = scipy.linkage(scipy.pdist(points, "euclidean"), method)
            assert np.array_equal(linkage(points, method), expected), (count, dims, method)
        points[3, 2] = np.nan
        assert linkage(points, "centroid") is None


def test_host_work_meanwhile_runs_during_the_merges(scipy) -> None:
    """`meanwhile` runs once the merges are launched and before their reads, the matrix
    stays scipy's, and its error comes out after the merges, the linkage usable after;
    nothing runs where scipy must (NaN points)."""
    from pyspk.candidate.cluster import DeviceLinkage
    from pyspk.cuda import CudaRuntime

    points = unit_rows(2000, 256, seed=21)
    expected = scipy.linkage(scipy.pdist(points, "euclidean"), "centroid")
    ran = []
    with CudaRuntime(0) as runtime, DeviceLinkage(runtime) as linkage:
        assert np.array_equal(
            linkage(points, "centroid", meanwhile=lambda: ran.append(1)), expected
        )
        assert ran == [1]

        def failing() -> None:
            raise RuntimeError("host work")

        with pytest.raises(RuntimeError, match="host work"):
            linkage(points, "centroid", meanwhile=failing)
        assert np.array_equal(linkage(points, "centroid"), expected)
        nan = points.copy()
        nan[5, 1] = np.nan
        assert linkage(nan, "centroid", meanwhile=lambda: ran.append(2)) is None
        assert ran == [1]


def test_more_points_than_the_block_has_flag_words_for_in_one_pass(scipy) -> None:
    """33,000 points (a 9-hour file's embeddings): the merges' flags of lowered bounds
    take 34 passes of 992 clusters at first, past the 32 passes of 1024 that the kernel's
    flag words once held, and the state and the 4.6 GB of distances stay in global
    memory. Four clusters, as a few speakers' embeddings."""
    from pyspk.candidate.cluster import MAX_POINTS, DeviceLinkage
    from pyspk.cuda import CudaRuntime

    assert MAX_POINTS == 65536
    rng = np.random.default_rng(33)
    centres = 5.0 * rng.standard_normal((4, 3))
    points = centres[rng.integers(0, 4, 33000)] + rng.standard_normal((33000, 3))
    with CudaRuntime(0) as runtime, DeviceLinkage(runtime) as linkage:
        got = linkage(points, "centroid")
    assert got is not None and np.array_equal(got, scipy.linkage(scipy.pdist(points), "centroid"))


def test_two_threads_on_one_and_on_two_device_linkages(scipy) -> None:
    """Two engines' linkages on one runtime, and one linkage shared by two threads: every
    call its own matrix, scipy's."""
    from pyspk.candidate.cluster import DeviceLinkage
    from pyspk.torch import shared_runtime
    from tests.concurrency import run_together

    runtime = shared_runtime(0)
    sizes = [800, 2600]
    inputs = [unit_rows(count, 64, seed=count) for count in sizes]
    expected = [scipy.linkage(scipy.pdist(points), "centroid") for points in inputs]
    with DeviceLinkage(runtime) as first, DeviceLinkage(runtime) as second:
        for linkages in ([first, second], [first, first]):
            got: dict[int, list] = {}

            def work(index: int, linkages: list = linkages, got: dict = got) -> None:
                got[index] = [linkages[index](inputs[index], "centroid") for _ in range(3)]

            run_together(work, [(0,), (1,)])
            for index in range(2):
                assert all(np.array_equal(matrix, expected[index]) for matrix in got[index])


def test_threads_at_once_each_get_scipys_matrix(scipy) -> None:
    """Calls of several sizes from four threads at once (the state in shared memory and in
    global memory among them): each its own matrix, scipy's."""
    from tests.concurrency import run_together

    sizes = [600, 2500, 7000, 1200]
    inputs = [scipy.pdist(unit_rows(count, 16, seed=count)) for count in sizes]
    got: dict[int, list] = {}

    def work(index: int) -> None:
        got[index] = [device_linkage(inputs[index], "centroid") for _ in range(3)]

    run_together(work, [(index,) for index in range(len(sizes))])
    for index, distances in enumerate(inputs):
        expected = scipy.linkage(distances, "centroid")
        assert all(np.array_equal(matrix, expected) for matrix in got[index])


_SANITIZED = """
import sys
import numpy as np
from pyspk.torch.linkage import device_linkage, device_pdist
for count in map(int, sys.argv[1:]):
    points = np.random.default_rng(count).standard_normal((count, 16))
    assert device_linkage(device_pdist(points), "centroid") is not None
    print(count, "done", flush=True)
"""


@pytest.mark.parametrize(
    ("tool", "counts"), [("memcheck", ["700", "7000"]), ("racecheck", ["300"])]
)
def test_compute_sanitizer_finds_nothing_in_the_linkage(scipy, tool: str, counts: list) -> None:
    """Every entry (the distances, then the linkage), the state in shared memory and
    (7000 points, past any device's opt-in shared memory) in global memory."""
    from tests.gpu.test_sanitizer_gpu import sanitized_run

    output = sanitized_run(tool, _SANITIZED, *counts)
    assert output.count(" done\n") == len(counts), output[-4000:]
