"""pyannote.audio's diarization steps after the models, without their per-chunk and
per-frame Python loops: `Inference.aggregate`, `speaker_count`, `reconstruct` and
`to_diarization`, as pyannote.audio 4.0 defines them (the annotations built from their
results: `pyspk.pyannote._annotation`).

Each function returns what pyannote's own returns, to the bit: the same float32 sums in
the same order, the same float64 timestamps. Where a
shortcut is exact only for some inputs it is taken only for those: overlap-add sums
are formed in any order only when every term is a whole number (binary segmentations,
speaker counts), whose float32 sums are exact below 2^24; other scores are added chunk
by chunk in pyannote's order (`np.add.at` applies repeated indices in sequence).
`reconstruct` of segmentations of 0 and 1 only counts each cluster's active frames
from the local speakers' runs of active frames (`active_runs`, which the engine finds
while the GPU embeds), without forming the clustered segmentations.
Needs numpy and pyannote.core; no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pyannote.core import SlidingWindow, SlidingWindowFeature
from pyannote.core import segment as core_segment

from pyspk.pyannote._clustering import clean_frames

__all__ = [
    "ActiveRuns",
    "SegmentationFacts",
    "active_runs",
    "aggregate",
    "frame_middles",
    "interval_unions",
    "reconstruct",
    "reconstruct_each",
    "segmentation_facts",
    "speaker_count",
    "to_diarization",
]


def _window_starts(window: SlidingWindow, count: int) -> np.ndarray:
    """`window[i].start` for i < count, as `SlidingWindow.__getitem__` and `Segment`
    compute it (float64)."""
    if core_segment.AUTO_ROUND_TIME:  # Segment rounds its ends: take them from Segments
        return np.array([window[i].start for i in range(count)], dtype=np.float64)
    return window.start + np.arange(count) * window.step


def frame_middles(window: SlidingWindow, count: int) -> np.ndarray:
    """`window[i].middle` for i < count (float64), without building the Segments."""
    if core_segment.AUTO_ROUND_TIME:
        return np.array([window[i].middle for i in range(count)], dtype=np.float64)
    starts = _window_starts(window, count)
    return 0.5 * (starts + (starts + window.duration))


def _closest_frames(frames: SlidingWindow, t: np.ndarray) -> np.ndarray:
    """`frames.closest_frame(t)` for an array of times."""
    return np.rint((t - frames.start - 0.5 * frames.duration) / frames.step).astype(np.int64)


def aggregate(
    scores: SlidingWindowFeature,
    frames: SlidingWindow,
    warm_up: tuple[float, float] = (0.0, 0.0),
    epsilon: float = 1e-12,
    hamming: bool = False,
    missing: float = np.nan,
    skip_average: bool = False,
) -> SlidingWindowFeature:
    """`Inference.aggregate`: overlap-add of (chunks, frames, classes) scores onto
    `frames`, identical to pyannote.audio's loop (which also zeroes the NaN of `scores`
    in place; this leaves `scores` as they are)."""
    num_chunks, num_frames_per_chunk, _ = scores.data.shape
    chunks = scores.sliding_window
    frames, num_frames, starts = _frame_layout(chunks, num_chunks, frames)
    warm_up_left = round(warm_up[0] / chunks.duration * num_frames_per_chunk)
    warm_up_right = round(warm_up[1] / chunks.duration * num_frames_per_chunk)
    sums = None
    if not hamming and warm_up_left == 0 and warm_up_right == 0:
        sums = _whole_overlap_add(scores.data, starts, num_frames)
    if sums is None:
        sums = _ordered_overlap_add(
            scores.data, starts, num_frames, hamming, warm_up_left, warm_up_right, epsilon
        )
    output, overlapping, contributed = sums
    average = output if skip_average else output / np.maximum(overlapping, epsilon)
    average[contributed == 0.0] = missing
    return SlidingWindowFeature(average, frames)


def _frame_layout(
    chunks: SlidingWindow, num_chunks: int, frames: SlidingWindow
) -> tuple[SlidingWindow, int, np.ndarray]:
    """`aggregate`'s output frames: their window (from the chunks' start), their number,
    and the frame each chunk starts on."""
    frames = SlidingWindow(start=chunks.start, duration=frames.duration, step=frames.step)
    num_frames = (
        frames.closest_frame(
            chunks.start + chunks.duration + (num_chunks - 1) * chunks.step + 0.5 * frames.duration
        )
        + 1
    )
    starts = _closest_frames(frames, _window_starts(chunks, num_chunks) + 0.5 * frames.duration)
    return frames, num_frames, starts


Sums = tuple[np.ndarray, np.ndarray, np.ndarray]


def _whole_overlap_add(data: np.ndarray, starts: np.ndarray, num_frames: int) -> Sums | None:
    """pyannote's three sums (scores, contributing chunks, whether any contributed) for
    unit windows, each class's terms binned by frame in one pass (`np.bincount`, in
    float64); None unless every score is a whole number and every sum stays below
    2^24, where every partial sum is exact in float32 and float64 alike and the order
    of the terms cannot matter."""
    _, span, num_classes = data.shape
    unknown = np.isnan(data)
    values = np.where(unknown, 0.0, data)  # a copy, in the scores' own dtype
    if not np.array_equal(values, np.rint(values)):  # whole before any rounding
        return None
    # no frame is covered by more chunks than the passes of chunks that do not overlap
    if float(np.abs(values).max(initial=0.0)) * _passes(starts, span) >= 2**24:
        return None
    rows = (starts[:, None] + np.arange(span)).reshape(-1)
    output = np.empty((num_frames, num_classes), dtype=np.float32)
    overlapping = np.empty((num_frames, num_classes), dtype=np.float32)
    for k in range(num_classes):
        output[:, k] = np.bincount(rows, values[..., k].reshape(-1), num_frames)
        overlapping[:, k] = np.bincount(rows, ~unknown[..., k].reshape(-1), num_frames)
    return output, overlapping, overlapping


def _ordered_overlap_add(
    data: np.ndarray,
    starts: np.ndarray,
    num_frames: int,
    hamming: bool,
    warm_up_left: int,
    warm_up_right: int,
    epsilon: float,
) -> Sums:
    """pyannote's three sums term by term in its order: chunk after chunk, each float64
    term rounded into the float32 sum (`np.add.at` applies repeated rows in sequence)."""
    _, span, num_classes = data.shape
    hamming_window = np.hamming(span).reshape(-1, 1) if hamming else np.ones((span, 1))
    warm_up_window = np.ones((span, 1))
    warm_up_window[:warm_up_left] = epsilon
    warm_up_window[span - warm_up_right :] = epsilon
    mask = 1 - np.isnan(data)  # int64, as pyannote computes it
    score = np.nan_to_num(data, nan=0.0)
    rows = (starts[:, None] + np.arange(span)[None, :]).reshape(-1)
    output = np.zeros((num_frames, num_classes), dtype=np.float32)
    overlapping = np.zeros((num_frames, num_classes), dtype=np.float32)
    contributed = np.zeros((num_frames, num_classes), dtype=np.float32)
    terms = score * mask * hamming_window * warm_up_window
    np.add.at(output, rows, terms.reshape(-1, num_classes))
    np.add.at(overlapping, rows, (mask * hamming_window * warm_up_window).reshape(-1, num_classes))
    np.maximum.at(contributed, rows, mask.reshape(-1, num_classes))
    return output, overlapping, contributed


def _passes(starts: np.ndarray, span: int) -> int:
    """The fewest passes p such that chunks p apart never overlap."""
    passes = 1
    while passes < len(starts) and np.any(starts[passes:] - starts[:-passes] < span):
        passes += 1
    return passes


def speaker_count(
    binarized_segmentations: SlidingWindowFeature,
    frames: SlidingWindow,
    warm_up: tuple[float, float] = (0.1, 0.1),
) -> SlidingWindowFeature:
    """`SpeakerDiarizationMixin.speaker_count` on `aggregate`."""
    from pyannote.audio.core.inference import Inference

    trimmed = Inference.trim(binarized_segmentations, warm_up=warm_up)
    data = trimmed.data
    if data.dtype.kind == "f" and np.array_equal(data, data != 0):
        # 0 and 1 only: their sums are exact in any order, and one product with a column
        # of ones is some 30 times quicker than numpy's sum over a 3-long axis
        ones = np.ones((data.shape[-1], 1), dtype=data.dtype)
        summed = SlidingWindowFeature(data @ ones, trimmed.sliding_window)
    else:
        summed = np.sum(trimmed, axis=-1, keepdims=True)
    count = aggregate(
        summed,
        frames,
        hamming=False,
        missing=0.0,
        skip_average=False,
    )
    count.data = np.rint(count.data).astype(np.uint8)
    return count


@dataclass(frozen=True)
class ActiveRuns:
    """The runs of active frames of each local speaker in (chunks, frames, speakers)
    segmentations of 0 and 1: run i is frames first[i] to end[i] (excluded) of speaker
    speaker[i] in chunk chunk[i], ordered by chunk, speaker and frame."""

    chunk: np.ndarray
    speaker: np.ndarray
    first: np.ndarray
    end: np.ndarray


def active_runs(data: np.ndarray) -> ActiveRuns | None:
    """`ActiveRuns` of (chunks, frames, speakers) `data`; None unless every value is 0
    or 1."""
    active = data != 0
    if not np.array_equal(data, active):
        return None
    num_chunks, num_frames, num_speakers = data.shape
    # each speaker's frames between two inactive ones: its runs start where the
    # difference is 1 and end where it is -1, in turn
    padded = np.zeros((num_chunks, num_speakers, num_frames + 2), dtype=np.int8)
    padded[:, :, 1:-1] = active.transpose(0, 2, 1)
    edges = np.flatnonzero(np.diff(padded, axis=2))
    rows, frames = np.divmod(edges, num_frames + 1)
    chunk, speaker = np.divmod(rows[::2], num_speakers)
    return ActiveRuns(chunk, speaker, frames[::2], frames[1::2])


@dataclass(frozen=True)
class SegmentationFacts:
    """What the steps after the models need of the segmentations alone, so that the
    engine finds it while the GPU still embeds: the speaker count (`speaker_count`, no
    warm-up), the clustering's frame counts (`clean_frames`) and the local speakers'
    runs of active frames (`active_runs`), both None unless every value is 0 or 1, and
    the (chunks, speakers) sums over the frames (`np.sum(data, axis=1)`, which the
    stock reconstruction and VBx's assignment take)."""

    count: SlidingWindowFeature
    clean: np.ndarray | None
    runs: ActiveRuns | None
    frame_sums: np.ndarray

    @property
    def inactive(self) -> np.ndarray:
        """(chunks, speakers) True for a local speaker never active in its chunk."""
        return self.frame_sums == 0


def segmentation_facts(
    segmentations: SlidingWindowFeature, frames: SlidingWindow
) -> SegmentationFacts:
    """`SegmentationFacts` of `segmentations`, on the model's output `frames`."""
    data = segmentations.data
    runs = active_runs(data)
    if runs is None:
        frame_sums = np.sum(data, axis=1)
    else:  # the runs' lengths: whole numbers, without numpy's slow sum over a short axis
        num_chunks, _, num_speakers = data.shape
        lengths = np.bincount(
            runs.chunk * num_speakers + runs.speaker,
            weights=runs.end - runs.first,
            minlength=num_chunks * num_speakers,
        )
        # in the type numpy's sum gives (int64 for bool and narrow integers, which
        # these lengths would overflow)
        summed = np.sum(data[:0], axis=1).dtype
        frame_sums = lengths.reshape(num_chunks, num_speakers).astype(summed)
    return SegmentationFacts(
        count=speaker_count(segmentations, frames, warm_up=(0.0, 0.0)),
        clean=clean_frames(segmentations),
        runs=runs,
        frame_sums=frame_sums,
    )


def reconstruct(
    segmentations: SlidingWindowFeature, hard_clusters: np.ndarray, count: SlidingWindowFeature
) -> SlidingWindowFeature:
    """`SpeakerDiarization.reconstruct`: each chunk's local speakers merged (max) into
    their clusters, then `to_diarization`; cluster -2 is left out."""
    return reconstruct_each(segmentations, hard_clusters, [count])[0]


def reconstruct_each(
    segmentations: SlidingWindowFeature,
    hard_clusters: np.ndarray,
    counts: list[SlidingWindowFeature],
    runs: ActiveRuns | None = None,
) -> list[SlidingWindowFeature]:
    """`reconstruct` for each of `counts` (the pipeline's count and its exclusive
    count), merging the clusters and summing their activations once for all. `runs`:
    `active_runs` of the segmentations when already found."""
    # the clusterings return int8 or int64 labels: sizes and row numbers are reckoned in
    # int64 whatever the labels' type (int8 arithmetic overflows past 127 chunks)
    hard_clusters = np.asarray(hard_clusters, dtype=np.int64)
    num_clusters = int(np.max(hard_clusters)) + 1
    sums = _binary_cluster_sums(segmentations, hard_clusters, num_clusters, counts[0], runs)
    if sums is not None:
        return _select_each(sums, counts)
    data, window = segmentations.data, segmentations.sliding_window
    if ((hard_clusters < 0) & (hard_clusters != -2)).any() or np.isinf(data).any():
        clustered = _by_chunk(data, hard_clusters, num_clusters, window)
    else:
        clustered = _whole_array(data, hard_clusters, num_clusters, window)
    # the counts share their frames: the same sums serve every one
    return _select_each(_activations(clustered, counts[0]), counts)


def _whole_array(
    data: np.ndarray, hard_clusters: np.ndarray, num_clusters: int, window: SlidingWindow
) -> SlidingWindowFeature:
    """pyannote's clustered segmentations, a local speaker at a time over every chunk,
    for labels of -2 (left out) or 0 and up and finite scores."""
    num_chunks, num_frames, local_num_speakers = data.shape
    # (chunk, cluster) rows of frames; float32 holds the float32 scores exactly, as
    # pyannote's float64 array does, and NaN marks a cluster absent from a chunk
    rows = np.full((num_chunks * num_clusters, num_frames), np.nan, dtype=np.float32)
    filled = np.zeros(num_chunks * num_clusters, dtype=bool)
    chunk_rows = np.arange(num_chunks) * num_clusters
    for speaker in range(local_num_speakers):
        cluster = hard_clusters[:, speaker]
        kept = cluster != -2
        row = chunk_rows[kept] + cluster[kept]
        values = data[kept, :, speaker]
        first = ~filled[row]
        # np.max over a cluster's speakers: the first as it is, the others by maximum
        # (both propagate NaN)
        rows[row] = np.where(first[:, None], values, np.maximum(rows[row], values))
        filled[row] = True
    clustered = rows.reshape(num_chunks, num_clusters, num_frames).transpose(0, 2, 1)
    return SlidingWindowFeature(clustered, window)


def _by_chunk(
    data: np.ndarray, hard_clusters: np.ndarray, num_clusters: int, window: SlidingWindow
) -> SlidingWindowFeature:
    """pyannote's clustered segmentations chunk by chunk, for the labels and scores the
    whole-array form does not follow: a negative label other than -2 (pyannote writes
    it into the chunk's column counted from the end, and a later label of that column
    overwrites it) and infinite scores (pyannote's float64 array keeps the float64
    range through `nan_to_num`)."""
    clustered = np.full((data.shape[0], data.shape[1], num_clusters), np.nan)
    for chunk, labels in enumerate(hard_clusters):
        for label in np.unique(labels):
            if label != -2:
                clustered[chunk, :, label] = np.max(data[chunk][:, labels == label], axis=1)
    return SlidingWindowFeature(clustered, window)


def interval_unions(
    starts: np.ndarray, ends: np.ndarray, apart: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Intervals ordered by start, merged into unions: interval i begins a new union
    where `apart` holds for its gap from the furthest end of the intervals before it
    (any before it: keys must keep groups apart). The index of each union's first
    interval, and the union's end."""
    if len(starts) == 0:
        return np.zeros(0, dtype=np.intp), ends[:0]
    reach = np.maximum.accumulate(ends)
    heads = np.flatnonzero(np.concatenate(([True], apart(starts[1:] - reach[:-1]))))
    return heads, np.maximum.reduceat(ends, heads)


def _binary_cluster_sums(
    segmentations: SlidingWindowFeature,
    hard_clusters: np.ndarray,
    num_clusters: int,
    count: SlidingWindowFeature,
    runs: ActiveRuns | None = None,
) -> SlidingWindowFeature | None:
    """`reconstruct`'s activations (`_activations` of the clustered segmentations) for
    segmentations of 0 and 1 only, as the engine's are (`runs`, their `active_runs`,
    when already found); None for others. A cluster's maximum over a chunk's speakers
    is then the union of their runs, and the sum over the chunks a count of active
    frames, a whole number that float32 holds exactly as pyannote's sums do: each
    union run adds 1 to its cluster's column from its first frame on and takes it off
    after its last (a difference array, summed down the frames)."""
    if runs is None:
        runs = active_runs(segmentations.data)
    if runs is None or not ((hard_clusters >= 0) | (hard_clusters == -2)).all():
        return None  # pyannote's loop would index a cluster -1 from the end
    num_chunks, span, _ = segmentations.data.shape
    frames, num_frames, starts = _frame_layout(
        segmentations.sliding_window, num_chunks, count.sliding_window
    )
    cluster = hard_clusters[runs.chunk, runs.speaker]
    kept = cluster >= 0
    # a chunk's runs of one cluster (from two of its speakers) merged where they
    # overlap: ordered by (chunk, cluster) and start, a run starts a union unless it
    # starts before the furthest end so far of its group (group-keyed, so that no end
    # reaches into the next group). One key, group * (span + 1) + start, sorted stably:
    # the runs come in ascending stretches, which the stable sort merges (a tenth of a
    # lexsort's time on an hour's 155,000 runs)
    group = runs.chunk[kept] * num_clusters + cluster[kept]
    first, end = runs.first[kept], runs.end[kept]
    order = np.argsort(group * (span + 1) + first, kind="stable")
    group, first, end = group[order], first[order], end[order]
    origin = group * (span + 1)  # each run's group's first key
    heads, keyed_ends = interval_unions(origin + first, origin + end, lambda gaps: gaps > 0)
    if len(heads) == 0:
        sums = np.zeros((num_frames, num_clusters), dtype=np.int64)
    else:
        end = keyed_ends - origin[heads]
        group = group[heads]
        chunk, column = np.divmod(group, num_clusters)
        size = (num_frames + 1) * num_clusters
        steps = np.bincount((starts[chunk] + first[heads]) * num_clusters + column, minlength=size)
        steps -= np.bincount((starts[chunk] + end) * num_clusters + column, minlength=size)
        sums = np.cumsum(steps.reshape(num_frames + 1, num_clusters), axis=0)[:num_frames]
    return SlidingWindowFeature(sums.astype(np.float32), frames)


def to_diarization(
    segmentations: SlidingWindowFeature, count: SlidingWindowFeature
) -> SlidingWindowFeature:
    """`SpeakerDiarizationMixin.to_diarization`: in each frame the `count` most active
    speakers, ranked by pyannote's own `np.argsort`."""
    return _select(_activations(segmentations, count), count)


def _activations(
    segmentations: SlidingWindowFeature, count: SlidingWindowFeature
) -> SlidingWindowFeature:
    """`to_diarization`'s sums of each speaker's activity over the chunks."""
    return aggregate(
        segmentations, count.sliding_window, hamming=False, missing=0.0, skip_average=True
    )


def _select(activations: SlidingWindowFeature, count: SlidingWindowFeature) -> SlidingWindowFeature:
    """The rest of `to_diarization`: the `count` most active speakers of each frame."""
    return _select_each(activations, [count])[0]


def _select_each(
    activations: SlidingWindowFeature, counts: list[SlidingWindowFeature]
) -> list[SlidingWindowFeature]:
    """`_select` for each of `counts` (the pipeline's count and its exclusive count):
    counts that pad and crop the activations alike share one ranking of them."""
    ranked: dict[tuple, tuple[SlidingWindowFeature, np.ndarray]] = {}
    selected = []
    for count in counts:
        data = activations.data
        _, num_speakers = data.shape
        max_speakers_per_frame = int(np.max(count.data))
        extent = activations.extent & count.extent
        key = (max(num_speakers, max_speakers_per_frame), extent)
        if key not in ranked:
            if num_speakers < max_speakers_per_frame:
                data = np.pad(data, ((0, 0), (0, max_speakers_per_frame - num_speakers)))
            padded = SlidingWindowFeature(data, activations.sliding_window)
            padded = padded.crop(extent, return_data=False)
            ranked[key] = padded, np.argsort(-padded, axis=-1)
        padded, sorted_speakers = ranked[key]
        count = count.crop(extent, return_data=False)
        binary = np.zeros(padded.data.shape, dtype=padded.data.dtype)  # C order: flat below
        frames = min(len(count.data), len(sorted_speakers))  # what pyannote's zip covers
        per_frame = count.data[:frames, 0]
        # each ranking a permutation of its frame's speakers: 1 put at the first ranks,
        # a rank at a time into the frames that count past it (put_along_axis took 3
        # to 4 times as long on an hour's frames)
        width = binary.shape[1]
        flat = binary.reshape(-1)
        for rank in range(width):
            counted = np.flatnonzero(per_frame > rank)
            flat[counted * width + sorted_speakers[counted, rank]] = 1
        selected.append(SlidingWindowFeature(binary, padded.sliding_window))
    return selected
