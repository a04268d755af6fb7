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


class _FakeCuda:
    """Stand-ins for the torch.cuda calls of a graph capture, on the CPU: each capture
    is recorded with its mode, and `fail` makes it raise as a failed capture does."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.modes: list[str] = []

    class Stream:
        def wait_stream(self, other: object) -> None:
            pass

    def current_stream(self) -> _FakeCuda.Stream:
        return _FakeCuda.Stream()

    def stream(self, stream: object):
        import contextlib

        return contextlib.nullcontext()

    class CUDAGraph:
        pass

    def graph(self, graph: object, capture_error_mode: str = "global"):
        import contextlib

        self.modes.append(capture_error_mode)
        fail = self.fail

        @contextlib.contextmanager
        def capturing():
            if fail:
                raise RuntimeError("operation not permitted when stream is capturing")
            yield

        return capturing()

    def synchronize(self) -> None:
        pass


@pytest.mark.parametrize("fail", [False, True])
def test_capture_is_thread_local_and_a_fallback_is_said(monkeypatch, fail):
    """The forward's graph is captured in thread-local mode (other threads' allocations
    and synchronizations cannot break it); a failed capture says so, in `note` (which
    `Engine.describe` reports) and in a warning, and the forward runs eagerly."""
    import torch

    from pyspk import engine

    fake = _FakeCuda(fail)
    for name in ("Stream", "current_stream", "stream", "CUDAGraph", "graph", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forward = engine._Forward(
            "segmentation",
            lambda x: (x * 2,),
            [(4, 3)],
            torch.device("cpu"),
            graph=True,
            stream=fake.Stream(),
        )
    assert fake.modes == ["thread_local"]
    said = [w for w in caught if "runs eagerly" in str(w.message)]
    if fail:
        assert forward.graph is None and forward.note.startswith("eager (capture failed")
        assert len(said) == 1 and "segmentation forward" in str(said[0].message)
    else:
        assert forward.note == "graph" and not said
