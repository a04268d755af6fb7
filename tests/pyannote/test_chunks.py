"""The engine's chunk arithmetic (`pyspk.pyannote._chunks`) against pyannote.audio's own
sliding window on the CPU, and the embedding schedule's cover of every chunk."""

from __future__ import annotations

import os
import warnings

import pytest

from pyspk.pyannote._chunks import chunk_count, embedding_spans, padded_length
from tests.optional import importorskip

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")


@pytest.mark.parametrize("seconds", [0.5, 5.0, 10.0, 10.5, 11.0, 30.0, 31.3])
def test_chunk_count_is_the_chunks_inference_slides(seconds):
    """As many chunks as pyannote's `Inference` (10 s windows every second, no
    aggregation) returns for the same samples, and a padded length that holds them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch = importorskip("torch", reason="PyTorch is missing")
        importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")
        from pyannote.audio import Inference

        from pyspk.pyannote.offline import segmentation_3_0
    model = segmentation_3_0(seed=0)
    inference = Inference(model, step=1.0, skip_aggregation=True, batch_size=8)
    samples = round(seconds * 16000)
    waveform = torch.randn(1, samples, generator=torch.Generator().manual_seed(1)) * 0.1
    with torch.inference_mode():
        slid = inference({"waveform": waveform, "sample_rate": 16000})
    window, step = 160000, 16000
    count = chunk_count(samples, window, step)
    assert count == slid.data.shape[0]
    length = padded_length(count, window, step, samples)
    assert length >= samples and (count - 1) * step + window <= length


@pytest.mark.parametrize(
    ("total", "segmentation", "batch"),
    [(1, 128, 32), (300, 128, 32), (256, 128, 32), (97, 32, 32), (3591, 128, 32), (50, 20, 32)],
)
def test_embedding_spans_cover_every_chunk_once_in_full_batches(total, segmentation, batch):
    """Over all segmentation batches the spans tile [0, total) in order, every span at
    most `batch` chunks, only the file's last one short, and none runs ahead of the
    segmentation."""
    done, spans = 0, []
    for first in range(0, total, segmentation):
        stop = min(first + segmentation, total)
        new = embedding_spans(done, stop, total, batch)
        assert all(last <= stop for _, last in new)
        spans += new
        done = spans[-1][1] if spans else 0
    assert [first for first, _ in spans] == [0] + [last for _, last in spans[:-1]]
    assert spans[-1][1] == total
    sizes = [last - first for first, last in spans]
    assert all(size == batch for size in sizes[:-1]) and 0 < sizes[-1] <= batch
