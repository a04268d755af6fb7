"""`pyspk.pyannote._steps` against pyannote.audio's own steps, bit for bit, on random binary
segmentations and soft scores. Skipped without pyannote.audio (the `pyannote` extra)."""

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
    from pyannote.audio.core.inference import Inference
    from pyannote.audio.pipelines.speaker_diarization import SpeakerDiarization
    from pyannote.audio.utils.signal import Binarize
    from pyannote.core import SlidingWindow, SlidingWindowFeature

from pyspk.pyannote import _annotation, _steps

CHUNKS = SlidingWindow(start=0.0, duration=10.0, step=1.0)
FRAMES = SlidingWindow(start=0.0, duration=0.0619375, step=0.016875)  # segmentation-3.0's


def _segmentations(seed: int, chunks: int = 120, run: int = 25) -> np.ndarray:
    """(chunks, 589, 3) binary segmentations in runs of `run` frames."""
    rng = np.random.default_rng(seed)
    coarse = rng.random((chunks, 589 // run + 1, 3)) < 0.35
    return np.repeat(coarse, run, axis=1)[:, :589].astype(np.float32)


def _same(ours: SlidingWindowFeature, theirs: SlidingWindowFeature) -> bool:
    return (
        ours.data.dtype == theirs.data.dtype
        and np.array_equal(ours.data, theirs.data, equal_nan=True)
        and ours.sliding_window.start == theirs.sliding_window.start
        and ours.sliding_window.step == theirs.sliding_window.step
        and ours.sliding_window.duration == theirs.sliding_window.duration
    )


def _count(data: np.ndarray, warm_up=(0.0, 0.0)):
    return SpeakerDiarization.speaker_count(SlidingWindowFeature(data, CHUNKS), FRAMES, warm_up)


@pytest.mark.parametrize("values", ["binary", "soft"])
@pytest.mark.parametrize("warm_up", [(0.0, 0.0), (0.1, 0.1)])
def test_speaker_count_is_pyannotes(warm_up, values):
    """Binary segmentations (summed by a product with ones) and soft scores (numpy's
    sum) alike."""
    data = _segmentations(0)
    if values == "soft":
        data = data * np.random.default_rng(9).random(data.shape, dtype=np.float32)
    ours = _steps.speaker_count(SlidingWindowFeature(data.copy(), CHUNKS), FRAMES, warm_up)
    assert _same(ours, _count(data.copy(), warm_up))


def test_active_runs_rebuild_the_segmentations():
    """Every run of active frames, at a chunk's first and last frames too, and nothing
    else; None for values other than 0 and 1."""
    data = _segmentations(6, chunks=40, run=7)
    data[0, :, 0] = 1.0  # active throughout
    data[1, :, 1] = 0.0  # never active
    data[2, 0, 2], data[2, -1, 2] = 1.0, 1.0  # on the first and last frames alone
    data[2, 1, 2], data[2, -2, 2] = 0.0, 0.0
    runs = _steps.active_runs(data)
    rebuilt = np.zeros_like(data)
    for chunk, speaker, first, end in zip(
        runs.chunk, runs.speaker, runs.first, runs.end, strict=True
    ):
        assert first < end and not rebuilt[chunk, first:end, speaker].any()
        rebuilt[chunk, first:end, speaker] = 1.0
    assert np.array_equal(rebuilt, data)
    order = np.lexsort((runs.first, runs.speaker, runs.chunk))
    assert np.array_equal(order, np.arange(len(order)))
    assert _steps.active_runs(0.5 * data) is None


def test_segmentation_facts_are_the_stock_sums():
    data = _segmentations(7)
    data[3, :, 1] = 0.0
    segmentations = SlidingWindowFeature(data, CHUNKS)
    facts = _steps.segmentation_facts(segmentations, FRAMES)
    assert _same(
        SlidingWindowFeature(facts.frame_sums, CHUNKS),
        SlidingWindowFeature(np.sum(data, axis=1), CHUNKS),
    )
    assert np.array_equal(facts.inactive, np.sum(data, axis=1) == 0) and facts.inactive[3, 1]
    assert _same(facts.count, _count(data.copy()))
    assert facts.runs is not None and facts.clean is not None
    soft = _steps.segmentation_facts(SlidingWindowFeature(0.5 * data, CHUNKS), FRAMES)
    assert soft.runs is None and soft.clean is None
    assert np.array_equal(soft.frame_sums, np.sum(0.5 * data, axis=1))


@pytest.mark.parametrize(
    "options",
    [
        {"hamming": True, "warm_up": (0.5, 0.5)},
        {"hamming": True},
        {"hamming": False, "missing": 0.0, "skip_average": True},
        {"hamming": False, "missing": 0.0},
    ],
    ids=["hamming-warm-up", "hamming", "sum", "average"],
)
def test_aggregate_of_soft_scores_with_nan_is_pyannotes(options):
    rng = np.random.default_rng(1)
    scores = rng.random((80, 589, 3)).astype(np.float32)
    scores[rng.random(scores.shape) < 0.01] = np.nan
    ours = _steps.aggregate(SlidingWindowFeature(scores.copy(), CHUNKS), FRAMES, **options)
    theirs = Inference.aggregate(SlidingWindowFeature(scores.copy(), CHUNKS), FRAMES, **options)
    assert _same(ours, theirs)


def test_aggregate_of_large_whole_numbers_keeps_pyannotes_order():
    # sums beyond 2^24 round: the whole-number shortcut must not be taken
    scores = np.full((40, 589, 1), 2.0**23 + 1, dtype=np.float32)
    ours = _steps.aggregate(SlidingWindowFeature(scores.copy(), CHUNKS), FRAMES, skip_average=True)
    theirs = Inference.aggregate(
        SlidingWindowFeature(scores.copy(), CHUNKS), FRAMES, skip_average=True
    )
    assert _same(ours, theirs)


def _reconstructions(data: np.ndarray, clusters: np.ndarray, binary: np.ndarray):
    """(ours, theirs, count): `reconstruct` of `data` by `_steps` and by pyannote, with
    the speaker count of the binary segmentations `binary`, at most 3."""
    count = _count(binary.copy())
    count.data = np.minimum(count.data, 3).astype(np.int8)
    pipeline = SpeakerDiarization.__new__(SpeakerDiarization)
    theirs = SpeakerDiarization.reconstruct(
        pipeline, SlidingWindowFeature(data.copy(), CHUNKS), clusters, count
    )
    ours = _steps.reconstruct(SlidingWindowFeature(data.copy(), CHUNKS), clusters, count)
    return ours, theirs, count


@pytest.mark.parametrize("seed", [2, 3])
def test_reconstruct_and_annotation_are_pyannotes(seed):
    data = _segmentations(seed)
    rng = np.random.default_rng(seed)
    clusters = rng.integers(0, 4, size=(data.shape[0], 3))
    clusters[rng.random(clusters.shape) < 0.2] = -2
    ours, theirs, count = _reconstructions(data, clusters, data)
    assert _same(ours, theirs)
    # binary segmentations (the fast sums), with two speakers of one cluster in some
    # chunks, whose union those sums count
    assert ((clusters[:, 0] == clusters[:, 1]) & (clusters[:, 0] >= 0)).any()
    binary = SlidingWindowFeature(data, CHUNKS)
    assert _steps._binary_cluster_sums(binary, clusters, 4, count) is not None
    exclusive = SlidingWindowFeature(
        np.minimum(count.data, 1).astype(np.int8), count.sliding_window
    )
    both = _steps.reconstruct_each(
        SlidingWindowFeature(data.copy(), CHUNKS), clusters, [count, exclusive]
    )
    exclusive_theirs = SpeakerDiarization.reconstruct(
        SpeakerDiarization.__new__(SpeakerDiarization),
        SlidingWindowFeature(data.copy(), CHUNKS),
        clusters,
        exclusive,
    )
    assert _same(both[0], theirs) and _same(both[1], exclusive_theirs)
    for on, off in ((0.0, 0.0), (0.3, 0.5)):
        expected = SpeakerDiarization.to_annotation(
            theirs, min_duration_on=on, min_duration_off=off
        )
        expected.uri = "talk"  # what the stock apply does next: it builds every timeline
        got = _annotation.to_annotation(ours, min_duration_on=on, min_duration_off=off, uri="talk")
        assert list(got.itertracks(yield_label=True)) == list(expected.itertracks(yield_label=True))
        assert len(got) > 10
        assert _annotation.labels_of(got) == expected.labels()
        assert got.uri == "talk" and got.get_timeline().uri == "talk"
        for label in expected.labels():
            assert got.label_timeline(label) == expected.label_timeline(label)
            assert got.label_timeline(label).uri == "talk"


def test_reconstruct_merges_a_chunks_speakers_of_one_cluster_and_pads_the_count():
    """Two or three speakers of a chunk in one cluster, their runs overlapping, touching
    or apart, and a count above the clusters (pyannote pads the activations for it, but
    not for the exclusive count): both selections are pyannote's, with runs given or
    found."""
    data = _segmentations(8)
    data[20:40] = 1.0  # three speakers at once throughout: a count of 3
    data[5] = 0.0
    data[5, 0:100, 0], data[5, 50:150, 1], data[5, 150:200, 2] = 1.0, 1.0, 1.0
    data[6, 10:20, 0], data[6, 300:310, 1] = 1.0, 1.0
    rng = np.random.default_rng(8)
    clusters = rng.integers(0, 2, size=(data.shape[0], 3))
    clusters[5], clusters[6] = 0, (1, 1, -2)
    counts = _count(data.copy())
    counts.data = np.minimum(counts.data, 3).astype(np.int8)
    assert counts.data.max() == 3  # above the two clusters
    exclusive = SlidingWindowFeature(
        np.minimum(counts.data, 1).astype(np.int8), counts.sliding_window
    )
    pipeline = SpeakerDiarization.__new__(SpeakerDiarization)
    theirs = [
        SpeakerDiarization.reconstruct(
            pipeline, SlidingWindowFeature(data.copy(), CHUNKS), clusters, count
        )
        for count in (counts, exclusive)
    ]
    assert theirs[0].data.shape[1] == 3 and theirs[1].data.shape[1] == 2
    for runs in (None, _steps.active_runs(data)):
        ours = _steps.reconstruct_each(
            SlidingWindowFeature(data.copy(), CHUNKS), clusters, [counts, exclusive], runs
        )
        assert all(_same(mine, stock) for mine, stock in zip(ours, theirs, strict=True))


def test_random_binary_reconstructions_are_pyannotes():
    """Random shapes: 1 to 150 chunks, 1 to 4 local speakers, 1 to 5 clusters, runs of
    1 to 100 frames, empty chunks, -0.0 for 0, int8 and int64 labels, counts capped at
    1 to 3: both selections, with the runs found or given, and their annotations are
    pyannote's, and so are the segmentations' facts."""
    for seed in range(24):
        rng = np.random.default_rng(seed)
        chunks = int(rng.choice([1, 2, 5, 30, 150]))
        speakers = int(rng.integers(1, 5))
        run = int(rng.choice([1, 3, 25, 100]))
        coarse = rng.random((chunks, 589 // run + 1, speakers)) < rng.uniform(0.05, 0.9)
        data = np.repeat(coarse, run, axis=1)[:, :589].astype(np.float32)
        if seed % 4 == 0:
            data[rng.integers(0, chunks)] = 0.0
        if seed % 5 == 0:
            data[data == 0] = -0.0
        clusters = rng.integers(0, int(rng.integers(1, 6)), size=(chunks, speakers))
        clusters[rng.random(clusters.shape) < 0.2] = -2
        clusters[0, 0] = max(clusters[0, 0], 0)  # one label at least
        clusters = clusters.astype(np.int8 if seed % 2 else np.int64)
        count = _count(data.copy())
        count.data = np.minimum(count.data, 1 + seed % 3).astype(np.int8)
        exclusive = SlidingWindowFeature(
            np.minimum(count.data, 1).astype(np.int8), count.sliding_window
        )
        pipeline = SpeakerDiarization.__new__(SpeakerDiarization)
        theirs = [
            SpeakerDiarization.reconstruct(
                pipeline, SlidingWindowFeature(data.copy(), CHUNKS), clusters.copy(), each
            )
            for each in (count, exclusive)
        ]
        for runs in (None, _steps.active_runs(data)):
            ours = _steps.reconstruct_each(
                SlidingWindowFeature(data.copy(), CHUNKS), clusters.copy(), [count, exclusive], runs
            )
            assert all(_same(mine, stock) for mine, stock in zip(ours, theirs, strict=True))
        for stock in theirs:
            expected = SpeakerDiarization.to_annotation(stock, 0.0, 0.0)
            got = _annotation.to_annotation(stock, 0.0, 0.0)
            assert list(got.itertracks(yield_label=True)) == list(
                expected.itertracks(yield_label=True)
            )
        facts = _steps.segmentation_facts(SlidingWindowFeature(data, CHUNKS), FRAMES)
        assert np.array_equal(facts.frame_sums, np.sum(data, axis=1))
        assert _same(facts.count, _count(data.copy()))


def test_bool_and_integer_segmentations_sum_as_numpy_does():
    """Segmentations stored as bool or uint8: the speaker count is pyannote's, and the
    frame sums are numpy's in its widened type (a product with ones would be a logical
    or for bool, and uint8 lengths would wrap past 255)."""
    for data in (np.ones((3, 589, 3), dtype=bool), _segmentations(12, chunks=6) > 0):
        for stored in (data, data.astype(np.uint8)):
            facts = _steps.segmentation_facts(SlidingWindowFeature(stored, CHUNKS), FRAMES)
            expected = np.sum(stored, axis=1)
            assert facts.frame_sums.dtype == expected.dtype
            assert np.array_equal(facts.frame_sums, expected)
            assert _same(facts.count, _count(stored.copy()))


@pytest.mark.parametrize("odd", ["label -1", "infinite scores"])
def test_reconstruct_of_labels_and_scores_pyannote_takes_its_own_way(odd):
    """A label -1 (pyannote writes it into the chunk's last cluster, and that cluster's
    own label, later in `np.unique`'s order, overwrites it) and infinite scores
    (pyannote's float64 array keeps the float64 range): pyannote's result."""
    rng = np.random.default_rng(14)
    data = _segmentations(14, chunks=40)
    clusters = rng.integers(0, 3, size=(40, 3))
    if odd == "label -1":
        clusters[rng.random(clusters.shape) < 0.3] = -1
        clusters[rng.random(clusters.shape) < 0.1] = -2
    else:
        data = data * rng.random(data.shape, dtype=np.float32)
        data[rng.random(data.shape) < 0.02] = np.inf
    ours, theirs, _ = _reconstructions(data, clusters, (data > 0.5).astype(np.float32))
    assert _same(ours, theirs)


@pytest.mark.parametrize("values", ["soft", "whole"])
def test_reconstruct_of_other_than_binary_segmentations_is_pyannotes(values):
    """Scores other than 0 and 1 (soft scores, or whole numbers up to 3) take the
    general path of clustered segmentations and their overlap-add: pyannote's bits."""
    rng = np.random.default_rng(5)
    if values == "soft":
        data = rng.random((60, 589, 3)).astype(np.float32)
    else:
        data = 3 * _segmentations(5, chunks=60)
    clusters = rng.integers(0, 3, size=(60, 3))
    clusters[rng.random(clusters.shape) < 0.2] = -2
    ours, theirs, count = _reconstructions(data, clusters, (data > 0.5).astype(np.float32))
    assert _same(ours, theirs)
    general = _steps._binary_cluster_sums(SlidingWindowFeature(data, CHUNKS), clusters, 3, count)
    assert general is None


@pytest.mark.parametrize("nan", [True, False])
@pytest.mark.parametrize(("onset", "offset"), [(0.5, None), (0.7, 0.3), (0.6, 0.6), (0.3, 0.7)])
def test_binarize_is_pyannotes(onset, offset, nan):
    """With NaN or frames between the thresholds (each frame's state found from the
    frames before it) and without (each frame decided by its own score)."""
    rng = np.random.default_rng(4)
    data = np.repeat(rng.random((400, 3)), 5, axis=0)
    if nan:
        data[rng.random(data.shape) < 0.01] = np.nan
    data[100:105] = onset  # neither above the onset nor below the offset
    data[200:205] = onset if offset is None else offset
    data[0] = 0.9  # starts active
    scores = SlidingWindowFeature(data, FRAMES)
    expected = Binarize(onset=onset, offset=offset)(scores)
    got = _annotation.binarize(scores, onset=onset, offset=offset)
    assert list(got.itertracks(yield_label=True)) == list(expected.itertracks(yield_label=True))


def _runs_of_classes(classes: int, seed: int) -> np.ndarray:
    """(5000, classes) scores of 0 and 1 in runs of 7 frames, 3% of frames flipped: gaps
    of one frame (16.9 ms) up to long ones."""
    rng = np.random.default_rng(seed)
    data = np.repeat((rng.random((5000 // 7 + 1, classes)) < 0.5), 7, axis=0)[:5000]
    flip = rng.random(data.shape) < 0.03
    data[flip] = ~data[flip]
    return data.astype(np.float32)


@pytest.mark.parametrize(
    ("classes", "labels", "on", "off", "pad_onset", "pad_offset"),
    [
        (3, None, 0.0, 0.016875, 0.0, 0.0),  # a collar of exactly one frame
        (3, None, 0.0, 0.1, 0.0, 0.0),
        (3, None, 0.0, 0.5, 0.0, 0.0),
        (12, None, 0.0, 0.2, 0.0, 0.0),  # labels 10 and 11 before 2 (sorted as text)
        (3, None, 0.1, 0.3, 0.05, 0.02),
        (3, None, 0.0, 0.0, 0.0, 0.1),  # padding alone: overlapping segments merged
        (4, ["b", "a", "b", "c"], 0.0, 0.2, 0.0, 0.0),  # two classes of one label
    ],
)
def test_binarize_with_a_collar_or_padding_is_pyannotes_support(
    monkeypatch, classes, labels, on, off, pad_onset, pad_offset
):
    """The support (`Annotation.support(collar)`) found over arrays, not pyannote's
    loop over every segment, which the test forbids: the same tracks, track names,
    labels and label timelines as pyannote.audio's `Binarize`."""
    scores = SlidingWindowFeature(_runs_of_classes(classes, seed=classes), FRAMES, labels=labels)
    options = dict(
        min_duration_on=on, min_duration_off=off, pad_onset=pad_onset, pad_offset=pad_offset
    )
    expected = Binarize(onset=0.5, offset=0.5, **options)(scores)
    expected.uri = "talk"
    with monkeypatch.context() as patched:
        patched.setattr(
            _annotation.Annotation, "support", lambda *_, **__: pytest.fail("pyannote's loop")
        )
        got = _annotation.binarize(scores, onset=0.5, offset=0.5, uri="talk", **options)
    tracks = list(expected.itertracks(yield_label=True))
    assert list(got.itertracks(yield_label=True)) == tracks
    assert len(tracks) > 10 and len(tracks) < (scores.data[1:] != scores.data[:-1]).sum()
    assert _annotation.labels_of(got) == expected.labels() == got.labels()
    for label in expected.labels():
        assert got.label_timeline(label) == expected.label_timeline(label)


@pytest.mark.parametrize("odd", ["labels that print alike", "rounded times"])
def test_binarize_leaves_the_support_to_pyannote_where_its_order_or_times_differ(odd):
    """Labels 1 and "1" (the annotation's own order of them decides) and pyannote.core's
    rounding of times (`Segment.set_precision`): pyannote's `support` makes the result."""
    from pyannote.core import Segment

    labels = [1, "1", 2] if odd == "labels that print alike" else None
    scores = SlidingWindowFeature(_runs_of_classes(3, seed=5), FRAMES, labels=labels)
    if odd == "rounded times":
        Segment.set_precision(3)
    try:
        support = _annotation._support_tracks(
            np.array([0.0]), np.array([1.0]), np.array([0]), [1, "1", 2] if labels else [0], 0.1
        )
        expected = Binarize(onset=0.5, offset=0.5, min_duration_off=0.1)(scores)
        got = _annotation.binarize(scores, onset=0.5, offset=0.5, min_duration_off=0.1)
    finally:
        Segment.set_precision(None)
    assert support is None
    assert list(got.itertracks(yield_label=True)) == list(expected.itertracks(yield_label=True))


def test_frame_middles_are_the_segments_middles():
    middles = _steps.frame_middles(FRAMES, 5000)
    assert [float(m) for m in middles] == [FRAMES[i].middle for i in range(5000)]


def test_annotation_of_is_the_inserts():
    """Same segments for several tracks, empty segments, a track relabelled, labels of
    mixed order: the same tracks, labels, timelines and support as the inserts give."""
    from pyannote.core import Annotation, Segment

    rng = np.random.default_rng(9)
    tracks = []
    for _ in range(3000):
        start = float(rng.integers(0, 400)) / 4
        length = float(rng.integers(0, 8)) / 4  # 0: an empty segment
        tracks.append(
            (Segment(start, start + length), f"t{rng.integers(0, 4)}", int(rng.integers(0, 5)))
        )
    expected = Annotation()
    for segment, track, label in tracks:
        expected[segment, track] = label
    got = _annotation.annotation_of(tracks)
    assert list(got.itertracks(yield_label=True)) == list(expected.itertracks(yield_label=True))
    assert _annotation.labels_of(got) == got.labels() == expected.labels()
    assert all(got.label_timeline(x) == expected.label_timeline(x) for x in expected.labels())
    assert got.get_timeline() == expected.get_timeline()
    assert got.support(collar=0.3) == expected.support(collar=0.3)


def test_rename_in_place_is_rename_labels():
    """A mapping of some labels (others unmapped, one to a label already present): the
    same tracks, labels, timelines and update flags (their order too) as
    `rename_labels(copy=False)`, before and after the labels are built."""
    from pyannote.core import Segment

    rng = np.random.default_rng(10)
    tracks = []
    for _ in range(2000):
        start = float(rng.integers(0, 400)) / 4
        length = float(rng.integers(1, 8)) / 4
        tracks.append(
            (Segment(start, start + length), f"t{rng.integers(0, 3)}", int(rng.integers(0, 5)))
        )
    mapping = {0: "SPEAKER_00", 3: "SPEAKER_01", 1: 4}
    expected = _annotation.annotation_of(tracks).rename_labels(mapping=mapping, copy=False)
    got = _annotation.rename_in_place(_annotation.annotation_of(tracks), mapping)
    assert list(got.itertracks(yield_label=True)) == list(expected.itertracks(yield_label=True))
    assert list(got._labelNeedsUpdate.items()) == list(expected._labelNeedsUpdate.items())
    assert got.labels() == expected.labels()
    assert all(got.label_timeline(x) == expected.label_timeline(x) for x in expected.labels())
    assert list(got._labelNeedsUpdate.items()) == list(expected._labelNeedsUpdate.items())
