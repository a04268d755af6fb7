"""pyannote.audio's clustering steps with pyspk's parts in them, each with pyannote's
result to the bit: the pairwise distances and the centroid linkage on the GPU
(`pyspk.candidate.cluster`; on the host, the distances on several threads), the embedding filter
on booleans, and the constrained assignment of every chunk solved at once.

`cluster` runs a pipeline's clustering: for `AgglomerativeClustering` and
`VBxClustering` their own code (pyannote.audio 4.0) with those parts in place of
scipy's and their own; any other clustering as it is. Needs numpy, scipy and
pyannote.audio, and no PyTorch.
"""

from __future__ import annotations

import copy
import itertools
import os
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "DEVICE_LINKAGE_MIN_POINTS",
    "clean_frames",
    "cluster",
    "constrained_argmax",
    "filter_embeddings",
    "linear_sum_assignments",
    "linkage_on",
    "pdist_euclidean",
]

Timings = dict[str, float]


def pdist_euclidean(points: np.ndarray, threads: int | None = None) -> np.ndarray:
    """`scipy.spatial.distance.pdist(points, "euclidean")` to the bit, its rows computed
    by `cdist` (which gives each pair pdist's value) on several threads: scipy's own
    loop runs on one core, and it is half of a centroid linkage of thousands of
    embeddings."""
    from concurrent.futures import ThreadPoolExecutor

    from scipy.spatial.distance import cdist, pdist

    points = np.asarray(points, dtype=np.float64)  # as pdist converts them
    count = len(points)
    threads = threads or min(16, len(os.sched_getaffinity(0)))
    if count < 1024 or threads < 2:
        return pdist(points, "euclidean")
    condensed = np.empty(count * (count - 1) // 2)
    bounds = np.unique(np.linspace(0, count - 1, 8 * threads + 1).astype(np.int64))

    def rows(first: int, last: int) -> None:
        # rows first..last-1 against the points after the first of them
        block = cdist(points[first:last], points[first + 1 :], "euclidean")
        for row in range(first, last):
            start = count * row - row * (row + 1) // 2
            condensed[start : start + count - row - 1] = block[row - first, row - first :]

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda span: rows(*span), itertools.pairwise(bounds)))
    return condensed


# below this many embeddings scipy's linkage takes about as long as the device's launches
# and copies
DEVICE_LINKAGE_MIN_POINTS = 512


def linkage_on(
    device_linkage: Callable[..., np.ndarray | None] | None = None,
    meanwhile: Callable[[], object] | None = None,
) -> Callable[..., np.ndarray]:
    """`scipy.cluster.hierarchy.linkage` of observations with scipy's dendrogram to the
    bit, or scipy's own error: the centroid and median methods by `device_linkage` (a
    `pyspk.candidate.cluster.DeviceLinkage`: the distances and the merges on its
    device) where one is given and there are enough observations, else the Euclidean
    distances from `pdist_euclidean` (the same condensed matrix) and scipy's linkage of
    them. `meanwhile`, when given, is handed to `device_linkage` to run on the host
    while the device merges (it may not run at all)."""

    def linkage(y: np.ndarray, method: str = "single", metric: str = "euclidean", **kwargs: Any):
        from scipy.cluster.hierarchy import linkage as scipy_linkage

        if metric != "euclidean" or np.ndim(y) != 2 or kwargs:
            return scipy_linkage(y, method=method, metric=metric, **kwargs)
        if device_linkage is not None and _on_device(method, len(y)):
            # None for distances scipy refuses, or NaN where the kernel steps aside
            extra = {} if meanwhile is None else {"meanwhile": meanwhile}
            dendrogram = device_linkage(np.asarray(y), method, **extra)
            if dendrogram is not None:
                return dendrogram
        check_host_distances(len(y))
        return scipy_linkage(pdist_euclidean(y), method=method)

    return linkage


def check_host_distances(count: int) -> None:
    """Refuses (`TooLongError`, one line) a host linkage of `count` observations whose
    distances the host cannot hold: the condensed float64 matrix and the copy scipy's
    linkage works on."""
    from pyspk.errors import TooLongError, available_host_memory

    need = 2 * 8 * (count * (count - 1) // 2)
    available = available_host_memory()
    if available is not None and need > available:
        raise TooLongError(
            f"pyspk clustering: {count} embeddings need {need / 1e9:.1f} GB of host memory "
            f"for their distances, {available / 1e9:.1f} GB available"
        )


def _on_device(method: str, count: int) -> bool:
    from pyspk.candidate.cluster import MAX_POINTS, METHODS

    return method in METHODS and DEVICE_LINKAGE_MIN_POINTS <= count <= MAX_POINTS


def clean_frames(segmentations: Any) -> np.ndarray | None:
    """(chunks, speakers): the frames in which each local speaker is the only one
    active, for segmentations whose every value is 0 or 1 (the engine's powerset
    outputs); None for others. The part of `filter_embeddings` that needs no embedding:
    the engine counts it while the GPU still embeds."""
    data = segmentations.data
    num_speakers = data.shape[2]
    active = data != 0
    if not np.array_equal(data, active):
        return None
    speakers = active[..., 0].astype(np.uint8)
    for speaker in range(1, num_speakers):
        speakers += active[..., speaker]
    alone = speakers == 1
    return np.stack(
        [np.count_nonzero(active[..., s] & alone, axis=1) for s in range(num_speakers)], axis=1
    )


def filter_embeddings(
    embeddings: np.ndarray,
    segmentations: Any = None,
    min_active_ratio: float = 0.2,
    clean: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """pyannote's `BaseClustering.filter_embeddings` to the bit where every
    segmentation value is 0 or 1: the embeddings without NaN of the (chunk, speaker)
    pairs whose speaker is the only one active in at least `min_active_ratio` of the
    chunk's frames, and their chunk and speaker indices. It counts booleans where
    pyannote sums float products (exact either way for 0 and 1), or takes `clean`,
    `clean_frames` of the same segmentations counted earlier. None for other
    segmentations, which take pyannote's own code."""
    if clean is None:
        clean = clean_frames(segmentations)
        if clean is None:
            return None
    num_frames = segmentations.data.shape[1]
    kept = (clean >= min_active_ratio * num_frames) & ~np.any(np.isnan(embeddings), axis=2)
    chunk_idx, speaker_idx = np.where(kept)
    return embeddings[chunk_idx, speaker_idx], chunk_idx, speaker_idx


# -- the assignment problems ------------------------------------------------------------


def linear_sum_assignments(costs: np.ndarray, maximize: bool = False) -> np.ndarray:
    """`scipy.optimize.linear_sum_assignment` of each (rows, columns) matrix of the
    finite `costs` (problems, rows, columns) at once: the column of each row, or -1 for
    a row left out (more rows than columns).

    It runs scipy's own algorithm (Crouse's shortest augmenting paths, as scipy's
    `rectangular_lsap` implements it) on every problem in step: the same operations in
    the same order on the same doubles, the same scan order of the remaining columns
    and the same choice among equal path costs, so the same assignment as scipy's, ties
    and near-ties included. A problem's path search takes at most one step per row
    already assigned, so the work is a few whole-array operations per row."""
    costs = np.asarray(costs, dtype=np.float64)
    problems, num_rows, num_columns = costs.shape
    transposed = num_columns < num_rows  # scipy solves a tall matrix transposed
    work = costs.transpose(0, 2, 1) if transposed else costs
    work = -work if maximize else work
    solved = _shortest_augmenting_paths(np.ascontiguousarray(work))
    if not transposed:
        return solved
    rows = np.full((problems, num_rows), -1, dtype=np.int64)
    # each column of the original was a row of the transposed problem
    problem = np.repeat(np.arange(problems), num_columns)
    rows[problem, solved.reshape(-1)] = np.tile(np.arange(num_columns), problems)
    return rows


def _shortest_augmenting_paths(cost: np.ndarray) -> np.ndarray:
    """The column of each row, for (problems, rows, columns) minimisations with rows <=
    columns: scipy's `solve` step for step (see `linear_sum_assignments`)."""
    problems, num_rows, num_columns = cost.shape
    every = np.arange(problems)
    u = np.zeros((problems, num_rows))
    v = np.zeros((problems, num_columns))
    col4row = np.full((problems, num_rows), -1, dtype=np.int64)
    row4col = np.full((problems, num_columns), -1, dtype=np.int64)
    for current in range(num_rows):
        path = np.full((problems, num_columns), -1, dtype=np.int64)
        shortest = np.full((problems, num_columns), np.inf)
        in_rows = np.zeros((problems, num_rows), dtype=bool)  # scipy's SR
        in_columns = np.zeros((problems, num_columns), dtype=bool)  # scipy's SC
        # scipy scans the remaining columns from the last, and removes one by moving the
        # last remaining into its place
        remaining = np.broadcast_to(np.arange(num_columns)[::-1], cost.shape[::2]).copy()
        row = np.full(problems, current)
        sink = np.full(problems, -1)
        min_value = np.zeros(problems)
        searching = np.ones(problems, dtype=bool)
        for left in range(num_columns, 0, -1):
            at = every[searching]
            i = row[at]
            in_rows[at, i] = True
            columns = remaining[at, :left]
            reduced = (
                (min_value[at, None] + cost[at, i][np.arange(len(at))[:, None], columns])
                - u[at, i][:, None]
            ) - v[at[:, None], columns]
            known = shortest[at[:, None], columns]
            shorter = reduced < known
            known = np.where(shorter, reduced, known)
            shortest[at[:, None], columns] = known
            path[at[:, None], columns] = np.where(shorter, i[:, None], path[at[:, None], columns])
            # the scan keeps the first lowest column, then any later one as low that is
            # unassigned: the last unassigned among the lowest, else the first lowest
            lowest = known.min(axis=1)
            tied = known == lowest[:, None]
            free = tied & (row4col[at[:, None], columns] == -1)
            last_free = left - 1 - np.argmax(free[:, ::-1], axis=1)
            index = np.where(free.any(axis=1), last_free, np.argmax(tied, axis=1))
            column = columns[np.arange(len(at)), index]
            min_value[at] = lowest
            owner = row4col[at, column]
            found = owner == -1
            sink[at[found]] = column[found]
            row[at[~found]] = owner[~found]
            in_columns[at, column] = True
            remaining[at, index] = remaining[at, left - 1]
            searching[at[found]] = False
            if not searching.any():
                break
        # the dual variables, from the costs of the paths found
        assigned = np.where(col4row >= 0, col4row, 0)
        through = np.take_along_axis(shortest, assigned, axis=1)
        others = in_rows.copy()
        others[:, current] = False
        u[:, current] += min_value
        u = np.where(others, u + (min_value[:, None] - through), u)
        v = np.where(in_columns, v - (min_value[:, None] - shortest), v)
        # the path's columns change hands back to the current row
        column = sink.copy()
        walking = np.ones(problems, dtype=bool)
        for _ in range(current + 1):
            at = every[walking]
            i = path[at, column[at]]
            row4col[at, column[at]] = i
            column[at], col4row[at, i] = col4row[at, i], column[at]
            walking[at[i == current]] = False
            if not walking.any():
                break
    return col4row


def constrained_argmax(soft_clusters: np.ndarray) -> np.ndarray:
    """pyannote's `BaseClustering.constrained_argmax` to the bit: each chunk's
    (speakers, clusters) scores assigned one cluster per speaker (and per cluster at
    most one speaker) for the greatest sum, as scipy's `linear_sum_assignment` assigns
    them, NaN scores taken as the least score; int8 labels, -2 for a speaker left out.
    Scores that are not all finite after that, or more than 128 clusters, take
    pyannote's own loop (and its error)."""
    soft_clusters = np.nan_to_num(soft_clusters, nan=np.nanmin(soft_clusters))
    # an int8 holds 128 clusters; pyannote's loop refuses more (OverflowError)
    if not np.all(np.isfinite(soft_clusters)) or soft_clusters.shape[2] > 128:
        from pyannote.audio.pipelines.clustering import BaseClustering

        return BaseClustering.constrained_argmax(None, soft_clusters)  # type: ignore[arg-type]
    # nan_to_num makes infinities the largest doubles, whose sums overflow in scipy too
    with np.errstate(over="ignore", invalid="ignore"):
        columns = linear_sum_assignments(soft_clusters, maximize=True)
    hard_clusters = np.full(columns.shape, -2, dtype=np.int8)
    chosen = columns >= 0
    hard_clusters[chosen] = columns[chosen]
    return hard_clusters


# -- a pipeline's clustering ----------------------------------------------------------


def cluster(
    clustering: Any,
    device_linkage: Callable[[np.ndarray, str], np.ndarray | None] | None = None,
    timings: Timings | None = None,
    clean: np.ndarray | None = None,
    frame_sums: np.ndarray | None = None,
    **arguments: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`clustering(**arguments)` (a pipeline's clustering step). pyannote's
    `AgglomerativeClustering` and `VBxClustering` run their own code with
    `linkage_on(device_linkage)` in place of scipy's linkage, `filter_embeddings` for
    binary segmentations, and (VBx, or agglomerative with constrained assignment)
    `constrained_argmax`; any other clustering runs as it is. `timings`, when given,
    receives the seconds of the steps pyspk serves ("filter", "linkage",
    "assignment"; with VBx also "plda" and "vbx") and "embeddings_clustered", the
    number of embeddings the clustering kept. `clean`, `clean_frames` of the
    segmentations when already counted, saves the filter that count; `frame_sums`,
    their `np.sum(data, axis=1)` when already found, saves VBx's assignment that sum."""
    from pyannote.audio.pipelines import clustering as module

    kind = type(clustering)
    name = {module.AgglomerativeClustering: "cluster", module.VBxClustering: "__call__"}.get(kind)
    stock = getattr(kind, name, None) if name else None
    if stock is None or "linkage" not in stock.__code__.co_names:  # another pyannote.audio
        return clustering(**arguments)
    timings = {} if timings is None else timings
    timed = _Timed(timings)
    # a shallow copy whose own methods shadow the class's: the caller's object is left
    # as it was, and the copy reads the same hyper-parameters
    twin = copy.copy(clustering)
    methods = twin.__dict__
    plda = None
    if "plda" in methods:
        plda = methods["plda"] = _TimedPlda(methods["plda"], timed)
    # VBx's PLDA transform of the kept embeddings runs while the device merges them
    meanwhile = None if plda is None else plda.ahead
    swapped = {"linkage": timed("linkage", linkage_on(device_linkage, meanwhile))}
    if "cluster_vbx" in stock.__code__.co_names:
        swapped["cluster_vbx"] = timed("vbx", stock.__globals__["cluster_vbx"])
    fast = types.FunctionType(
        stock.__code__,
        {**stock.__globals__, **swapped},
        stock.__name__,
        stock.__defaults__,
        stock.__closure__,
    )
    stock_filter = module.BaseClustering.filter_embeddings
    if kind.filter_embeddings is stock_filter:

        def filtered(self: Any, embeddings: np.ndarray, segmentations: Any = None, **rest: Any):
            kept = filter_embeddings(embeddings, segmentations, clean=clean, **rest)
            if kept is None:
                kept = stock_filter(self, embeddings, segmentations, **rest)
            timings["embeddings_clustered"] = len(kept[0])
            if plda is not None:
                plda.kept = kept[0]
            return kept

        methods["filter_embeddings"] = types.MethodType(timed("filter", filtered), twin)
    if kind.constrained_argmax is module.BaseClustering.constrained_argmax:
        methods["constrained_argmax"] = timed("assignment", constrained_argmax)
    if frame_sums is not None and arguments.get("segmentations") is not None:
        arguments["segmentations"] = _with_frame_sums(arguments["segmentations"], frame_sums)
    if name == "__call__":  # a special method: called on the copy, not looked up on it
        return fast(twin, **arguments)
    methods[name] = types.MethodType(fast, twin)
    return twin(**arguments)


class _FrameSummed(np.ndarray):
    """A view of (chunks, frames, speakers) segmentations whose sum over the frames,
    `.sum(1)` as VBx's assignment asks it, is the one found before (`counted`, set on
    this view alone: views and results made from it have none); every other sum is
    numpy's."""

    counted: np.ndarray | None = None

    def sum(self, axis: Any = None, *args: Any, **kwargs: Any) -> Any:
        if axis == 1 and not args and not kwargs and self.counted is not None:
            return self.counted.copy()
        return np.asarray(self).sum(axis, *args, **kwargs)


def _with_frame_sums(segmentations: Any, frame_sums: np.ndarray) -> Any:
    """`segmentations` (a `SlidingWindowFeature`) on a `_FrameSummed` view of its data."""
    from pyannote.core import SlidingWindowFeature

    data = segmentations.data
    if frame_sums.shape != (data.shape[0], data.shape[2]):
        raise ValueError(
            f"frame sums of shape {frame_sums.shape} for segmentations of {data.shape}"
        )
    view = data.view(_FrameSummed)
    view.counted = frame_sums
    return SlidingWindowFeature(view, segmentations.sliding_window, segmentations.labels)


class _Timed:
    """Wraps functions so that each call adds its seconds to `timings[step]`."""

    def __init__(self, timings: Timings) -> None:
        self.timings = timings

    def __call__(self, step: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                self.timings[step] = self.timings.get(step, 0.0) + spent

        return timed


class _TimedPlda:
    """A pyannote `PLDA` whose transform is timed as "plda"; its attributes are the
    PLDA's. `ahead` transforms the filter's kept embeddings (`kept`) early, while the
    device merges them; VBx's next transform of that same array is then that result
    (the transform is a function of its input), and any other is computed as asked."""

    def __init__(self, plda: Any, timed: _Timed) -> None:
        self._plda = plda
        self._transform = timed("plda", plda)
        self.kept: np.ndarray | None = None
        self._ahead: tuple[np.ndarray, np.ndarray] | None = None

    def ahead(self) -> None:
        if self.kept is not None:
            self._ahead = (self.kept, self._transform(self.kept))

    def __call__(self, embeddings: np.ndarray) -> np.ndarray:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] is embeddings:
            return ahead[1]
        return self._transform(embeddings)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plda, name)
