"""The annotations the diarization steps end with: pyannote.audio's `Binarize` (and
`to_annotation` on it) without its per-frame loop, and without pyannote.core's
per-segment loop for its collar (`support`), an `Annotation` built from its tracks
in one sort, its labels read from the tracks, and the stock `apply`'s naming of the
speakers. Each gives pyannote.audio 4.0's own result: the same float64 timestamps and
the same tracks, labels and track names. Needs numpy, pyannote.core and sortedcontainers;
no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from pyannote.core import Annotation, Segment, SlidingWindowFeature
from pyannote.core import segment as core_segment
from pyannote.core.utils.generators import string_generator
from sortedcontainers import SortedDict

from pyspk.pyannote._steps import frame_middles, interval_unions

if TYPE_CHECKING:
    from pyannote.audio.pipelines.speaker_diarization import DiarizeOutput

__all__ = [
    "annotation_of",
    "binarize",
    "labels_of",
    "name_speakers",
    "rename_in_place",
    "to_annotation",
]


def binarize(
    scores: SlidingWindowFeature,
    onset: float = 0.5,
    offset: float | None = None,
    min_duration_on: float = 0.0,
    min_duration_off: float = 0.0,
    pad_onset: float = 0.0,
    pad_offset: float = 0.0,
    uri: str | None = None,
) -> Annotation:
    """`pyannote.audio.utils.signal.Binarize(...)(scores)`: hysteresis thresholding of
    (frames, classes) scores into an `Annotation` of active regions, named `uri` (what
    setting `.uri` afterwards gives, without the timelines that setter builds)."""
    offset = offset or onset
    if offset > onset:  # a frame may switch both ways: pyannote's own loop decides
        from pyannote.audio.utils.signal import Binarize

        active = Binarize(onset, offset, min_duration_on, min_duration_off, pad_onset, pad_offset)(
            scores
        )
        if uri is not None:
            active.uri = uri
        return active
    num_frames, num_classes = scores.data.shape
    timestamps = frame_middles(scores.sliding_window, num_frames)
    regions = [_active_regions(k_scores, onset, offset) for k_scores in scores.data.T]
    classes = np.repeat(np.arange(num_classes), [len(r) for r in regions])
    first, last = np.concatenate(regions).T
    # in time order, a region's classes in class order (a stable sort): the sorted index
    # of segments is then one run, which its sort takes in one pass
    order = np.lexsort((last, first))
    starts = timestamps[first[order]] - pad_onset
    ends = timestamps[last[order]] + pad_offset
    classes = classes[order]
    labels = list(range(num_classes)) if scores.labels is None else list(scores.labels)
    if pad_offset > 0.0 or pad_onset > 0.0 or min_duration_off > 0.0:
        merged = _support_tracks(starts, ends, classes, labels, min_duration_off)
        if merged is not None:
            active = annotation_of(merged, uri)
        else:
            active = _annotation_of_regions(starts, ends, classes, labels, uri)
            active = active.support(collar=min_duration_off)
    else:
        active = _annotation_of_regions(starts, ends, classes, labels, uri)
    if min_duration_on > 0:
        for segment, track in list(active.itertracks()):
            if segment.duration < min_duration_on:
                del active[segment, track]
    return active


def _annotation_of_regions(
    starts: np.ndarray, ends: np.ndarray, classes: np.ndarray, labels: list[Any], uri: str | None
) -> Annotation:
    """The annotation of the regions (`starts`, `ends`, `classes`), one track a class."""
    track_generator = string_generator()
    track_names = [next(track_generator) for _ in labels]
    tracks = [
        (Segment(start, end), track_names[k], labels[k])
        for start, end, k in zip(starts.tolist(), ends.tolist(), classes.tolist(), strict=True)
    ]
    return annotation_of(tracks, uri)


def _support_tracks(
    starts: np.ndarray, ends: np.ndarray, classes: np.ndarray, labels: list[Any], collar: float
) -> list[tuple[Segment, Any, Any]] | None:
    """The tracks of `Annotation.support(collar)` of the regions' annotation, found over
    arrays rather than by its loop over every segment. Per label in `labels()` order,
    its non-empty segments in time order, each joined to the union of those before it
    unless the gap from that union's end is both above `SEGMENT_PRECISION` and at least
    `collar` (pyannote's `^` and `|`, the same float64 operations), the unions named by
    one `string_generator` across labels. On a development machine, a synthetic hour's
    diarization (3436 tracks) took 0.19 s through `support` (median of 15, the first
    call 0.3 to 0.5 s) and takes 0.02 s here, for each of the stock apply's two
    annotations. None where pyannote.core rounds its times, or two labels print alike
    (the annotation's own order of them decides): `support` then makes the tracks."""
    if core_segment.AUTO_ROUND_TIME or len({str(label) for label in labels}) < len(set(labels)):
        return None
    precision = core_segment.SEGMENT_PRECISION
    kept = ends - starts > precision  # what `Annotation.__setitem__` keeps
    names = string_generator()
    tracks = []
    for label in sorted(set(labels), key=str):
        mine = kept & np.isin(classes, [k for k, other in enumerate(labels) if other == label])
        if not mine.any():
            continue  # no segment: not among the annotation's labels
        label_starts, label_ends = starts[mine], ends[mine]
        order = np.lexsort((label_ends, label_starts))
        label_starts, label_ends = label_starts[order], label_ends[order]
        firsts, union_ends = interval_unions(
            label_starts, label_ends, lambda gaps: (gaps > precision) & (gaps >= collar)
        )
        for start, end in zip(label_starts[firsts].tolist(), union_ends.tolist(), strict=True):
            tracks.append((Segment(start, end), next(names), label))
    return tracks


def annotation_of(tracks: list[tuple[Segment, Any, Any]], uri: str | None = None) -> Annotation:
    """The `Annotation(uri=uri)` that `annotation[segment, track] = label` for each of
    `tracks` in turn builds (empty segments left out, a later label of the same track
    replacing an earlier one), its sorted index of segments made by one sort of them all
    rather than a search per track: the labels come in runs of sorted segments, which one
    sort merges. It sets what `__setitem__` sets, as `Annotation.copy` does; where
    pyannote.core keeps its tracks otherwise, it takes the inserts."""
    annotation = Annotation(uri=uri)
    if not (
        isinstance(getattr(annotation, "_tracks", None), SortedDict)
        and isinstance(getattr(annotation, "_labelNeedsUpdate", None), dict)
        and getattr(annotation, "_timelineNeedsUpdate", None) is True
    ):
        for segment, track, label in tracks:
            annotation[segment, track] = label
        return annotation
    by_segment: dict[Segment, dict[Any, Any]] = {}
    needs_update = annotation._labelNeedsUpdate
    for segment, track, label in tracks:
        if segment:
            by_segment.setdefault(segment, {})[track] = label
            needs_update[label] = True
    annotation._tracks = SortedDict(by_segment)
    return annotation


def labels_of(annotation: Annotation) -> list[Any]:
    """`annotation.labels()` read from its tracks, without the per-label timelines that
    `labels()` builds first (a sort of every segment of every label); they stay for
    `Annotation` to build when asked."""
    tracks = getattr(annotation, "_tracks", None)
    if not isinstance(tracks, SortedDict):
        return annotation.labels()
    # dict's own view: a SortedDict's goes through the collections.abc iterator, item by item
    labels = {label for track_labels in dict.values(tracks) for label in track_labels.values()}
    return sorted(labels, key=str)


def _active_regions(scores: np.ndarray, onset: float, offset: float) -> np.ndarray:
    """(regions, 2) start and end frames of the active regions, as `Binarize`'s loop
    finds them (offset <= onset): a frame above `onset` turns on, one below `offset`
    turns off, others keep the state; the first frame is on when above `onset`. A region
    that is still on at the end closes on the last frame."""
    num_frames = len(scores)
    if num_frames < 2:  # pyannote's loop needs two frames to close a region
        return np.zeros((0, 2), dtype=np.int64)
    on = scores > onset
    below = scores < offset
    if not np.all(on | below):  # some frames keep the state before them (or are NaN)
        state = np.full(num_frames, -1, dtype=np.int8)  # -1: keeps the state before it
        state[below] = 0
        state[on] = 1
        state[0] = 1 if scores[0] > onset else 0
        defined = np.where(state >= 0, np.arange(num_frames), 0)
        np.maximum.accumulate(defined, out=defined)
        on = state[defined] == 1
    changes = np.flatnonzero(on[1:] != on[:-1]) + 1
    starts = changes[on[changes]]
    ends = changes[~on[changes]]
    if on[0]:
        starts = np.concatenate(([0], starts))
    if on[-1]:
        ends = np.concatenate((ends, [num_frames - 1]))
    return np.stack((starts, ends), axis=1)


def to_annotation(
    discrete_diarization: SlidingWindowFeature,
    min_duration_on: float = 0.0,
    min_duration_off: float = 0.0,
    uri: str | None = None,
) -> Annotation:
    """`SpeakerDiarizationMixin.to_annotation` on `binarize`, named `uri`."""
    return binarize(
        discrete_diarization,
        onset=0.5,
        offset=0.5,
        min_duration_on=min_duration_on,
        min_duration_off=min_duration_off,
        uri=uri,
    )


def rename_in_place(annotation: Annotation, mapping: Mapping) -> Annotation:
    """`annotation.rename_labels(mapping=mapping, copy=False)`: the same tracks, labels
    and update flags, each segment's tracks relabelled in their own dict where pyannote
    puts a new dict in its place (a sorted-dict assignment a segment: 3,335 of them in a
    synthetic hour's diarization). The dicts must be the annotation's own, as `binarize`
    and pyannote.core build them; where pyannote.core keeps its tracks otherwise, it
    renames."""
    tracks = getattr(annotation, "_tracks", None)
    needs_update = getattr(annotation, "_labelNeedsUpdate", None)
    if not (isinstance(tracks, SortedDict) and isinstance(needs_update, dict)):
        return annotation.rename_labels(mapping=mapping, copy=False)
    for old_label, new_label in mapping.items():
        needs_update[old_label] = True
        needs_update[new_label] = True
    for labels in dict.values(tracks):  # in any order: each dict is relabelled alone
        for track, label in labels.items():
            labels[track] = mapping.get(label, label)
    return annotation


def name_speakers(
    pipeline: Any,
    file: Mapping,
    diarization: Annotation,
    exclusive_diarization: Annotation,
    centroids: np.ndarray | None,
) -> DiarizeOutput | Annotation:
    """The stock `SpeakerDiarization.apply`'s last part: speaker names and the centroids
    in their order. Both annotations are the caller's own: they are renamed in place (a
    copy, pyannote's default, rebuilds every track), and their labels are read from the
    tracks (`labels_of`): the label timelines are left for `Annotation` to build when
    asked, as it builds them."""
    if file.get("annotation"):
        _, mapping = pipeline.optimal_mapping(file["annotation"], diarization, return_mapping=True)
        mapping = {key: mapping.get(key, key) for key in labels_of(diarization)}
    else:
        mapping = dict(zip(labels_of(diarization), pipeline.classes(), strict=False))
    diarization = rename_in_place(diarization, mapping)
    exclusive_diarization = rename_in_place(exclusive_diarization, mapping)
    if centroids is not None:  # None from oracle clustering
        labels = labels_of(diarization)
        if len(labels) > centroids.shape[0]:
            centroids = np.pad(centroids, ((0, len(labels) - centroids.shape[0]), (0, 0)))
        inverse_mapping = {label: index for index, label in mapping.items()}
        centroids = centroids[[inverse_mapping[label] for label in labels]]
    from pyannote.audio.pipelines.speaker_diarization import DiarizeOutput

    output = DiarizeOutput(
        speaker_diarization=diarization,
        exclusive_speaker_diarization=exclusive_diarization,
        speaker_embeddings=centroids,
    )
    return output.speaker_diarization if pipeline.legacy else output
