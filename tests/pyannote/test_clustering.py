"""`pyspk.pyannote._clustering` against pyannote.audio's clusterings and scipy, bit for bit: the
threaded distances, the embedding filter, the assignment problems, and the agglomerative
and VBx clusterings with pyspk's parts in place (the linkage on the host here; the GPU
tests run it on the device). Skipped without pyannote.audio (the `pyannote` extra)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from tests.optional import importorskip

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")
    from pyannote.audio.core.plda import PLDA
    from pyannote.audio.pipelines.clustering import (
        AgglomerativeClustering,
        BaseClustering,
        OracleClustering,
        VBxClustering,
    )
    from pyannote.audio.pipelines.speaker_diarization import SpeakerDiarization
    from pyannote.core import Annotation, Segment, SlidingWindow, SlidingWindowFeature
    from scipy.optimize import linear_sum_assignment

from pyspk.pyannote import _clustering, _steps
from pyspk.pyannote.plda import fit_plda, write_plda

CHUNKS = SlidingWindow(start=0.0, duration=10.0, step=1.0)
FRAMES = SlidingWindow(start=0.0, duration=0.0619375, step=0.016875)  # segmentation-3.0's
UNBOUNDED = {"num_clusters": None, "min_clusters": 1, "max_clusters": np.inf}


def _turns(rng: np.random.Generator, chunks: int, silent: float = 0.25) -> np.ndarray:
    """(chunks, 589, 3) binary segmentations: one local speaker (or nobody) at a time,
    in runs of 10 frames, so that most (chunk, speaker) pairs are kept for clustering."""
    speaking = rng.integers(0, 3, (chunks, 59))
    speaking[rng.random(speaking.shape) < silent] = 3  # nobody
    return np.repeat(np.eye(4, dtype=np.float32)[speaking][..., :3], 10, axis=1)[:, :589]


def _voices(rng: np.random.Generator, chunks: int, voices: int, spread: float = 0.3):
    """(chunks, 3, 256) float32 embeddings of `voices` voices: each a centre plus noise."""
    centres = rng.standard_normal((voices, 256)) * 0.6 + 1.0
    who = rng.integers(0, voices, (chunks, 3))
    noise = spread * rng.standard_normal((chunks, 3, 256))
    return (centres[who] + noise).astype(np.float32)


@pytest.fixture(scope="module")
def plda(tmp_path_factory) -> PLDA:
    """A PLDA fitted to 16 voices that no test clusters."""
    rng = np.random.default_rng(40)
    centres = rng.standard_normal((16, 256)) * 0.6 + 1.0
    speakers = rng.integers(0, 16, 3000)
    embeddings = centres[speakers] + 0.3 * rng.standard_normal((3000, 256))
    folder = write_plda(tmp_path_factory.mktemp("plda"), *fit_plda(embeddings, speakers))
    return PLDA.from_pretrained(str(folder))


def _vbx(plda: PLDA, constrained: bool = True) -> VBxClustering:
    clustering = VBxClustering(plda, constrained_assignment=constrained)
    clustering.instantiate({"threshold": 0.6, "Fa": 0.07, "Fb": 0.8})
    return clustering


def _agglomerative(constrained: bool = False) -> AgglomerativeClustering:
    clustering = AgglomerativeClustering(constrained_assignment=constrained)
    clustering.instantiate({"method": "centroid", "min_cluster_size": 12, "threshold": 0.7})
    return clustering


def _same_outputs(ours, theirs) -> None:
    for mine, stock in zip(ours, theirs, strict=True):
        assert (mine is None and stock is None) or (
            mine.dtype == stock.dtype and np.array_equal(mine, stock, equal_nan=True)
        )


# -- the distances and the filter -------------------------------------------------------


def test_pdist_on_threads_is_scipys():
    from scipy.spatial.distance import pdist

    rng = np.random.default_rng(5)
    points = rng.standard_normal((1500, 256)).astype(np.float32)
    threaded = _clustering.pdist_euclidean(points, threads=4)
    assert np.array_equal(threaded, pdist(points, "euclidean"))


def test_filter_embeddings_is_pyannotes_on_binary_segmentations():
    rng = np.random.default_rng(8)
    chunks = 700
    data = (rng.random((chunks, 589, 3)) < rng.random((chunks, 1, 3))).astype(np.float32)
    data[3, :, 0] = -0.0  # inactive, as in pyannote's sums
    data[5, ::2, 1] = -0.0
    embeddings = rng.standard_normal((chunks, 3, 256)).astype(np.float32)
    embeddings[rng.random((chunks, 3)) < 0.1, 5] = np.nan
    segmentations = SlidingWindowFeature(data, CHUNKS)
    clustering = AgglomerativeClustering()
    for ratio in (0.2, 0.05):
        stock = BaseClustering.filter_embeddings(
            clustering, embeddings, segmentations=segmentations, min_active_ratio=ratio
        )
        ours = _clustering.filter_embeddings(embeddings, segmentations, min_active_ratio=ratio)
        counted = _clustering.filter_embeddings(
            embeddings, segmentations, ratio, clean=_clustering.clean_frames(segmentations)
        )
        assert len(stock[1]) > chunks // 2
        for mine, early, theirs in zip(ours, counted, stock, strict=True):
            assert np.array_equal(mine, theirs, equal_nan=True)
            assert np.array_equal(early, theirs, equal_nan=True)
    data[0, 0, 0] = 0.5  # not binary: pyannote's own code decides
    assert _clustering.filter_embeddings(embeddings, segmentations) is None
    assert _clustering.clean_frames(segmentations) is None


# -- the assignment problems -------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 1), (3, 2), (3, 3), (3, 4), (3, 9), (1, 4), (5, 3), (4, 4)])
@pytest.mark.parametrize("values", ["real", "few integers", "constant", "rows alike"])
def test_linear_sum_assignments_are_scipys(shape, values):
    """Every problem gets scipy's assignment, on ties too: integer costs with many
    equal sums, constant matrices, and rows alike (pyannote's inactive speakers)."""
    rng = np.random.default_rng(hash((shape, values)) % 2**32)
    problems = 600
    if values == "real":
        costs = rng.standard_normal((problems, *shape))
    elif values == "few integers":
        costs = rng.integers(0, 3, (problems, *shape)).astype(np.float64)
    elif values == "constant":
        costs = np.full((problems, *shape), 1.5)
    else:
        costs = rng.standard_normal((problems, *shape))
        costs[:, 1:] = costs.min() - 1.0
    for maximize in (False, True):
        got = _clustering.linear_sum_assignments(costs, maximize=maximize)
        for problem, cost in enumerate(costs):
            rows, columns = linear_sum_assignment(cost, maximize=maximize)
            expected = np.full(shape[0], -1)
            expected[rows] = columns
            assert np.array_equal(got[problem], expected), (problem, cost)


@pytest.mark.parametrize("clusters", [1, 2, 3, 5, 40])
def test_constrained_argmax_is_pyannotes(clusters):
    rng = np.random.default_rng(clusters)
    scores = 2 - rng.random((500, 3, clusters))
    scores[rng.random((500, 3)) < 0.4] = scores.min() - 1.0  # inactive speakers
    scores[7, 1, 0] = np.nan
    scores[9] = np.round(scores[9], 1)  # ties
    theirs = BaseClustering.constrained_argmax(None, scores.copy())
    ours = _clustering.constrained_argmax(scores.copy())
    assert ours.dtype == theirs.dtype == np.int8
    assert np.array_equal(ours, theirs)


def _stock_constrained_argmax(scores: np.ndarray) -> np.ndarray:
    return BaseClustering.constrained_argmax(None, scores)


def test_constrained_argmax_fails_as_pyannote_does():
    """Past 128 clusters pyannote's int8 labels overflow: the same error. Infinite
    scores take pyannote's own loop: the same outcome."""
    scores = np.random.default_rng(3).random((4, 3, 200))
    with pytest.raises(OverflowError):
        BaseClustering.constrained_argmax(None, scores.copy())
    with pytest.raises(OverflowError):
        _clustering.constrained_argmax(scores.copy())
    for infinite in (np.inf, -np.inf):
        scores = np.random.default_rng(4).random((4, 3, 5))
        scores[2, 1, 3] = infinite
        outcomes = []
        for solve in (_stock_constrained_argmax, _clustering.constrained_argmax):
            try:
                outcomes.append(solve(scores.copy()).tolist())
            except ValueError as error:
                outcomes.append(type(error))
        assert outcomes[0] == outcomes[1]


# -- the clusterings -----------------------------------------------------------------------


def _clustered_as_stock(clustering, embeddings, segmentations, constraints, device_linkage=None):
    """`_clustering.cluster`'s outputs and timings (with `device_linkage` when given),
    each output asserted to be the one `clustering` gives on its own (the same dtype,
    the same values)."""
    arguments = {**UNBOUNDED, **constraints}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "found only N clusters", KMeans' notices
        theirs = clustering(embeddings=embeddings.copy(), segmentations=segmentations, **arguments)
        timings: dict[str, float] = {}
        ours = _clustering.cluster(
            clustering,
            device_linkage=device_linkage,
            timings=timings,
            embeddings=embeddings.copy(),
            segmentations=segmentations,
            **arguments,
        )
    _same_outputs(ours, theirs)
    return ours, timings


@pytest.mark.parametrize(
    "constraints", [{}, {"num_clusters": 3}, {"min_clusters": 6}, {"max_clusters": 2}]
)
@pytest.mark.parametrize("constrained", [False, True])
def test_agglomerative_clustering_is_pyannotes(constraints, constrained, monkeypatch):
    rng = np.random.default_rng(6)
    chunks = 1300
    embeddings = _voices(rng, chunks, 4, spread=0.8)
    embeddings[rng.random((chunks, 3)) < 0.05] = np.nan
    segmentations = SlidingWindowFeature(_turns(rng, chunks, silent=0.0), CHUNKS)
    clustering = _agglomerative(constrained)
    filtered = []
    counting = _clustering.filter_embeddings
    monkeypatch.setattr(
        _clustering, "filter_embeddings", lambda *a, **k: filtered.append(1) or counting(*a, **k)
    )
    _, timings = _clustered_as_stock(clustering, embeddings, segmentations, constraints)
    assert filtered == [1]  # the binary segmentations took pyspk's filter
    assert "cluster" not in clustering.__dict__
    assert "filter_embeddings" not in clustering.__dict__
    assert timings["embeddings_clustered"] > chunks
    assert ("assignment" in timings) == constrained


@pytest.mark.parametrize(
    "constraints", [{}, {"num_clusters": 3}, {"min_clusters": 6}, {"max_clusters": 2}]
)
@pytest.mark.parametrize("constrained", [True, False])
def test_vbx_clustering_is_pyannotes(plda, constraints, constrained):
    """community-1's clustering (AHC, PLDA, VBx, constrained assignment) on voices the
    PLDA never saw: pyannote's labels, scores and centroids to the bit, and the four
    voices found when nothing forces the number."""
    rng = np.random.default_rng(12)
    chunks = 900
    embeddings = _voices(rng, chunks, 4)
    embeddings[rng.random((chunks, 3)) < 0.03] = np.nan
    segmentations = SlidingWindowFeature(_turns(rng, chunks), CHUNKS)
    clustering = _vbx(plda, constrained)
    ours, timings = _clustered_as_stock(clustering, embeddings, segmentations, constraints)
    assert set(timings) == {"embeddings_clustered", "filter", "linkage", "plda", "vbx"} | (
        {"assignment"} if constrained and not constraints else set()
    )
    assert timings["embeddings_clustered"] > chunks
    if not constraints:
        assert len(ours[2]) == 4
    assert "plda" not in clustering.__dict__ or clustering.__dict__["plda"] is plda


class _CountedPlda:
    """A PLDA whose transforms are recorded, each with whether it ran inside a merge."""

    def __init__(self, plda: PLDA, merging: list[bool]) -> None:
        self._plda, self._merging, self.calls = plda, merging, []

    def __call__(self, embeddings: np.ndarray) -> np.ndarray:
        self.calls.append(bool(self._merging))
        return self._plda(embeddings)

    def __getattr__(self, name: str):
        return getattr(self._plda, name)


def test_vbx_transforms_while_the_device_merges(plda):
    """With a device linkage (here a host stand-in that runs `meanwhile` as the
    device's would), the PLDA transform of the kept embeddings runs once, during the
    merges, and VBx takes it: pyannote's outputs to the bit. An error of the transform
    comes out of the clustering, after the merges."""
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import pdist

    merging: list[bool] = []
    merges = []

    def stand_in(points, method, meanwhile=None):
        merges.append(len(points))
        merging.append(True)
        try:
            if meanwhile is not None:
                meanwhile()
        finally:
            merging.clear()
        return linkage(pdist(points), method=method)

    rng = np.random.default_rng(14)
    chunks = 600
    embeddings = _voices(rng, chunks, 3)
    segmentations = SlidingWindowFeature(_turns(rng, chunks), CHUNKS)
    clustering = _vbx(plda, True)
    counted = _CountedPlda(plda, merging)
    clustering.plda = counted
    _clustered_as_stock(clustering, embeddings, segmentations, {}, device_linkage=stand_in)
    assert len(merges) == 1 and merges[0] > _clustering.DEVICE_LINKAGE_MIN_POINTS
    # stock's transform after its linkage, pyspk's once, during the merges
    assert counted.calls == [False, True]

    def failing(embeddings):
        raise RuntimeError("transform")

    clustering.plda = _CountedPlda(failing, merging)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="transform"):
            _clustering.cluster(
                clustering,
                device_linkage=stand_in,
                embeddings=embeddings.copy(),
                segmentations=segmentations,
                **UNBOUNDED,
            )
    assert merging == [] and len(merges) == 2


def test_vbx_takes_the_frame_sums_found_before(plda):
    """With the segmentations' sums over the frames given (as the engine finds them
    while the GPU embeds), VBx's constrained assignment reads them instead of summing:
    the stock outputs with the right sums, other labels with wrong ones."""
    rng = np.random.default_rng(13)
    chunks = 400
    embeddings = _voices(rng, chunks, 4)
    data = _turns(rng, chunks)
    data[rng.random(chunks) < 0.2, :, 2] = 0.0  # some local speakers never active
    segmentations = SlidingWindowFeature(data, CHUNKS)
    clustering = _vbx(plda, True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = clustering(embeddings=embeddings.copy(), segmentations=segmentations, **UNBOUNDED)
        given = {}
        for name, sums in {"right": np.sum(data, axis=1), "wrong": np.ones((chunks, 3))}.items():
            given[name] = _clustering.cluster(
                clustering,
                embeddings=embeddings.copy(),
                segmentations=segmentations,
                frame_sums=sums.astype(np.float32),
                **UNBOUNDED,
            )
    assert (np.sum(data, axis=1) == 0).any()
    _same_outputs(given["right"], theirs)
    assert not np.array_equal(given["wrong"][0], theirs[0])


def test_a_frame_summed_view_answers_only_its_own_frame_sum():
    data = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    counted = np.full((2, 3), 7.0, dtype=np.float32)
    view = _clustering._with_frame_sums(SlidingWindowFeature(data, CHUNKS), counted).data
    assert np.array_equal(view.sum(1), counted)
    assert np.array_equal(view.sum(axis=2), data.sum(axis=2))
    assert np.array_equal(view.sum(1, keepdims=True), data.sum(1, keepdims=True))
    assert np.array_equal(view[:, :2].sum(1), data[:, :2].sum(1))
    assert np.array_equal((view * 2).sum(1), (data * 2).sum(1))
    with pytest.raises(ValueError, match="frame sums of shape"):
        _clustering._with_frame_sums(SlidingWindowFeature(data, CHUNKS), counted[:1])


def _reconstructed_alike(segmentations: SlidingWindowFeature, hard_clusters: np.ndarray) -> None:
    """pyspk's reconstruction of these labels (in their own dtype) is pyannote's."""
    count = SpeakerDiarization.speaker_count(segmentations, FRAMES, warm_up=(0.0, 0.0))
    count.data = np.minimum(count.data, 3).astype(np.int8)
    hard_clusters = hard_clusters.copy()
    hard_clusters[np.sum(segmentations.data, axis=1) == 0] = -2
    pipeline = SpeakerDiarization.__new__(SpeakerDiarization)
    theirs = SpeakerDiarization.reconstruct(pipeline, segmentations, hard_clusters, count)
    ours = _steps.reconstruct(segmentations, hard_clusters, count)
    assert np.array_equal(ours.data, theirs.data)


def test_every_clusterings_labels_reconstruct_past_127_chunks(plda):
    """The labels' type never decides a size: int8 labels (constrained assignment, VBx,
    oracle, and every early return) and int64 ones, on 300 chunks, reconstruct as
    pyannote reconstructs them."""
    rng = np.random.default_rng(21)
    chunks = 300
    segmentations = SlidingWindowFeature(_turns(rng, chunks), CHUNKS)
    embeddings = _voices(rng, chunks, 3)
    arguments = {"embeddings": embeddings, "segmentations": segmentations, **UNBOUNDED}
    types = {}
    for name, clustering in {
        "agglomerative": _agglomerative(False),
        "agglomerative, constrained": _agglomerative(True),
        "vbx": _vbx(plda),
    }.items():
        hard_clusters = _clustering.cluster(clustering, **arguments)[0]
        types[name] = hard_clusters.dtype
        _reconstructed_alike(segmentations, hard_clusters)
    # oracle clustering, from the reference's turns
    reference = Annotation(uri="oracle")
    for start in range(0, chunks + 9, 4):
        reference[Segment(start, start + 3)] = f"voice{start % 3}"
    import torch

    waveform = torch.zeros((1, (chunks + 9) * 16000))
    file = {"uri": "oracle", "annotation": reference, "waveform": waveform, "sample_rate": 16000}
    oracle = OracleClustering()(segmentations=segmentations, file=file, frames=FRAMES)[0]
    types["oracle"] = oracle.dtype
    _reconstructed_alike(segmentations, oracle)
    # fewer than two embeddings to cluster: each clustering's early return
    quiet = SlidingWindowFeature(np.zeros_like(segmentations.data), CHUNKS)
    quiet.data[0, :300, 0] = 1.0
    for name, clustering in {"agglomerative": _agglomerative(), "vbx": _vbx(plda)}.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the mean of no embedding
            early = _clustering.cluster(clustering, **{**arguments, "segmentations": quiet})[0]
        types[f"{name}, early return"] = early.dtype
        _reconstructed_alike(quiet, early)
    assert types == {
        "agglomerative": np.int64,
        "agglomerative, constrained": np.int8,
        "vbx": np.int8,
        "oracle": np.int8,
        "agglomerative, early return": np.int8,
        "vbx, early return": np.int8,
    }


def test_a_host_linkage_the_host_cannot_hold_is_refused(monkeypatch):
    """Above the device linkage's size the distances are the host's: refused in one line
    when the matrix and scipy's copy of it do not fit in the available memory."""
    from pyspk import errors

    need = 2 * 8 * (40_000 * 39_999 // 2)
    monkeypatch.setattr(errors, "available_host_memory", lambda: need)
    _clustering.check_host_distances(40_000)
    monkeypatch.setattr(errors, "available_host_memory", lambda: need - 1)
    with pytest.raises(errors.TooLongError, match=r"40000 embeddings need 12\.8 GB"):
        _clustering.check_host_distances(40_000)
    linkage = _clustering.linkage_on(None)
    with pytest.raises(errors.TooLongError):
        linkage(np.zeros((40_000, 2)), method="centroid")
