"""The engine's chunk arithmetic (`pyspk.pyannote._chunks`) against pyannote.audio's own
sliding window on the CPU, and the embedding schedule's cover of every chunk."""

from __future__ import annotations

import os
import warnings

import pytest

from pyspk.pyannote._chunks import (
    chunk_count,
    embedding_sizes,
    embedding_spans,
    padded_length,
    segmentation_sizes,
    segmentation_spans,
    smallest_holding,
)
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


@pytest.mark.parametrize(
    ("batch", "sizes"),
    [
        (512, [512, 256, 128, 64, 32]),
        (128, [128, 64, 32]),
        (100, [100, 64, 32]),
        (32, [32]),
        (16, [16]),
        (33, [33, 32]),
    ],
)
def test_segmentation_sizes_are_the_batch_then_powers_of_two_from_32(batch, sizes):
    assert segmentation_sizes(batch) == sizes


@pytest.mark.parametrize("batch", [512, 128, 100, 32, 16])
@pytest.mark.parametrize("total", [1, 17, 31, 32, 33, 141, 291, 511, 512, 513, 1000, 3591])
def test_segmentation_spans_tile_the_file_and_pad_less_than_they_run(batch, total):
    """Full forwards of the batch, then one last forward, the smallest that holds the
    rest: its padding is less than the chunks it runs, or than 32; and the embedding
    spans over those forwards still cover every chunk once."""
    sizes = segmentation_sizes(batch)
    spans = segmentation_spans(total, sizes)
    assert [first for first, _, _ in spans] == [0] + [stop for _, stop, _ in spans[:-1]]
    assert spans[-1][1] == total
    assert all(size == batch for _, _, size in spans[:-1])
    first, stop, size = spans[-1]
    assert size in sizes and stop - first <= size
    assert size - (stop - first) < max(stop - first, 32) or size == batch
    if stop - first < batch:
        assert size == min(s for s in sizes if s >= stop - first)
    done, embedded = 0, []
    for _, stop, _ in spans:
        embedded += embedding_spans(done, stop, total, 32)
        done = embedded[-1][1] if embedded else 0
    assert embedded[-1][1] == total and sum(b - a for a, b in embedded) == total


def test_the_hours_last_chunks_run_on_the_smallest_forward():
    """3591 chunks (an hour) at 512: seven full forwards, and 7 chunks on 32, where
    padding them to 512 ran 505 chunks of zeros."""
    spans = segmentation_spans(3591, segmentation_sizes(512))
    assert len(spans) == 8 and spans[-1] == (3584, 3591, 32)


@pytest.mark.parametrize(
    ("batch", "sizes"), [(32, [32, 8, 16, 24]), (64, [64, 8, 16, 24]), (16, [16, 8]), (8, [8])]
)
def test_embedding_sizes_are_the_batch_then_the_tails_below_it(batch, sizes):
    assert embedding_sizes(batch) == sizes


@pytest.mark.parametrize("total", [*range(1, 70), 3591])
def test_a_files_last_embedding_batch_runs_on_the_smallest_forward_that_holds_it(total):
    """Full batches of 32, then the rest on 8, 16, 24 or 32 chunks: fewer than 8 chunks of
    padding (the hour's 3591 chunks end with 7 on 8, which padded 25 chunks on 32)."""
    sizes = embedding_sizes(32)
    spans = embedding_spans(0, total, total, 32)
    runs = [smallest_holding(sizes, last - first) for first, last in spans]
    assert runs[:-1] == [32] * (len(spans) - 1)
    first, last = spans[-1]
    assert 0 <= runs[-1] - (last - first) < 8
    if total == 3591:
        assert spans[-1] == (3584, 3591) and runs[-1] == 8


def test_chunks_must_start_on_whole_samples():
    """The engine's chunks are the stock crops at pyannote's 1 s step; at a step of no
    whole number of samples the last chunk's start differs, and the engine refuses."""
    importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")
    from pyannote.audio import Audio
    from pyannote.core import SlidingWindow

    from pyspk.cuda.errors import InvalidArgument
    from pyspk.pyannote._chunks import check_crops

    audio = Audio()
    check_crops(audio, SlidingWindow(start=0.0, duration=10.0, step=1.0), 100, 16000, 16000)
    with pytest.raises(InvalidArgument, match="chunk 99 starts at sample 1583984, not 1584000"):
        window = SlidingWindow(start=0.0, duration=10.0, step=0.99999)
        check_crops(audio, window, 100, 16000, 16000)
