"""The engine's host parts without a GPU, against pyannote.audio's own code."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from tests.optional import importorskip

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("torch")
    importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")
    from pyannote.audio.pipelines.speaker_diarization import SpeakerDiarization
    from pyannote.core import Annotation, Segment

from pyspk.engine import _label


def _annotation(seed: int) -> Annotation:
    rng = np.random.default_rng(seed)
    annotation = Annotation(uri="talk")
    start = 0.0
    for track in range(3000):
        start += float(rng.random())
        label = int(rng.integers(0, 3))
        annotation[Segment(start, start + float(rng.random()) * 3), f"t{track % 5}"] = label
    return annotation


def test_labels_are_the_stock_names_in_the_stock_order():
    """`_label` renames in place what pyannote renames on a copy: the same tracks,
    labels, timelines and centroid order."""
    pipeline = SpeakerDiarization.__new__(SpeakerDiarization)
    pipeline.legacy = False
    centroids = np.arange(4 * 8, dtype=np.float64).reshape(4, 8)
    ours = _label(pipeline, {"uri": "talk"}, _annotation(1), _annotation(2), centroids)
    mapping = {label: f"SPEAKER_{label:02d}" for label in range(3)}
    for mine, stock in (
        (ours.speaker_diarization, _annotation(1).rename_labels(mapping=mapping)),
        (ours.exclusive_speaker_diarization, _annotation(2).rename_labels(mapping=mapping)),
    ):
        assert list(mine.itertracks(yield_label=True)) == list(stock.itertracks(yield_label=True))
        assert mine.labels() == stock.labels() == ["SPEAKER_00", "SPEAKER_01", "SPEAKER_02"]
        assert all(mine.label_timeline(x) == stock.label_timeline(x) for x in stock.labels())
    assert np.array_equal(ours.speaker_embeddings, centroids[:3])
