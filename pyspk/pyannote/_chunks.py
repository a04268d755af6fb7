"""The engine's chunk arithmetic, as pure functions: how many chunks pyannote's
`Inference.slide` cuts from a waveform, the padded length that holds them all, which
segmentation forward runs which chunks, and which embedding batches can run once the
segmentation has reached a chunk, and the check that the chunks are the stock crops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspk.cuda.errors import InvalidArgument

__all__ = [
    "check_crops",
    "chunk_count",
    "embedding_sizes",
    "embedding_spans",
    "padded_length",
    "segmentation_sizes",
    "segmentation_spans",
    "smallest_holding",
]

SMALLEST_FORWARD = 32
"""The smallest segmentation forward: pyspk's segmentation plans serve multiples of 32, and
below 32 chunks a forward's fixed cost dominates (docs/performance.md)."""


EMBEDDING_TAILS = (8, 16, 24)
"""The embedding forwards for a file's last chunks, below the full batch: a file's last
embedding batch is 16 chunks short of full on average, and each padded chunk costs the
trunk as much as a real one."""


def chunk_count(num_samples: int, window: int, step: int) -> int:
    """Chunks of `window` samples every `step` over `num_samples`, as `Inference.slide`
    cuts them: the complete ones, and one more, zero-padded, where samples remain after
    the last complete one or the audio is shorter than one window."""
    complete = (num_samples - window) // step + 1 if num_samples >= window else 0
    has_last = num_samples < window or (num_samples - window) % step > 0
    return complete + int(has_last)


def padded_length(chunks: int, window: int, step: int, num_samples: int) -> int:
    """Samples that hold all `chunks` (at least the audio's own): the zero-padded waveform
    whose windows the chunks are."""
    return max((chunks - 1) * step + window, num_samples)


def embedding_spans(done: int, stop: int, total: int, batch: int) -> list[tuple[int, int]]:
    """The [first, last) chunk ranges to embed once the segmentation has reached chunk
    `stop` of `total`, after the `done` chunks already embedded: full batches of `batch`,
    and at the end of the file the last, partial one."""
    spans = []
    while done < stop and (stop - done >= batch or stop == total):
        last = min(done + batch, stop)
        spans.append((done, last))
        done = last
    return spans


def embedding_sizes(batch: int) -> list[int]:
    """The embedding forwards' batches, largest first: `batch`, and the sizes of
    `EMBEDDING_TAILS` below it, for the file's last chunks."""
    return [batch, *(size for size in EMBEDDING_TAILS if size < batch)]


def smallest_holding(sizes: Sequence[int], count: int) -> int:
    """The smallest of `sizes` that holds `count` chunks (the largest holds any
    span)."""
    return min((size for size in sizes if size >= count), default=max(sizes))


def segmentation_sizes(batch: int) -> list[int]:
    """The segmentation forwards' batches, largest first: `batch`, and the powers of two
    from `SMALLEST_FORWARD` below it, for the file's last chunks."""
    sizes = [batch]
    size = SMALLEST_FORWARD
    while size < batch:
        sizes.insert(1, size)
        size *= 2
    return sizes


def segmentation_spans(total: int, sizes: Sequence[int]) -> list[tuple[int, int, int]]:
    """[first, stop) chunk ranges over `total` chunks with the forward batch that runs each:
    full forwards of `sizes[0]` (the largest), then the rest on the smallest size that
    holds it: with `segmentation_sizes`, a last forward pads fewer chunks than it runs,
    or than `SMALLEST_FORWARD`."""
    largest = sizes[0]
    whole = total - total % largest
    spans = [(first, first + largest, largest) for first in range(0, whole, largest)]
    if whole < total:
        spans.append((whole, total, smallest_holding(sizes, total - whole)))
    return spans


def check_crops(audio: Any, window: Any, total: int, step: int, rate: int) -> None:
    """Refuses chunks that are not the stock embeddings' crops. Those crop chunk c of
    `window` (a `SlidingWindow`) at `audio.get_num_samples(start, rate)` of the same
    waveform, the engine's chunks are views at c * `step`: they agree wherever the chunk
    start times are whole samples, as with pyannote's 1 s step."""
    for chunk in (0, total - 1):
        start = audio.get_num_samples(window[chunk].start, rate)
        if start != chunk * step:
            raise InvalidArgument(
                f"pyspk engine: chunk {chunk} starts at sample {start}, not "
                f"{chunk * step}; the step {window.step} s is no whole number of samples"
            )
