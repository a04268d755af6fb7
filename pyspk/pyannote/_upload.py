"""The engine's transfers: a file's waveform uploaded to the device in pieces, so that
the GPU starts on the first segmentation batch once that batch's samples have arrived,
and its outputs copied back to the host."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["PieceUpload", "float_waveform", "to_host"]


def float_waveform(file: Any) -> bool:
    """False for an in-memory waveform of integer samples, which the stock models refuse
    (and the engine leaves to them)."""
    waveform = file.get("waveform") if isinstance(file, Mapping) else None
    return not isinstance(waveform, torch.Tensor) or waveform.is_floating_point()


def to_host(
    stream: torch.cuda.Stream, after: torch.cuda.Event, *tensors: torch.Tensor
) -> tuple[list[torch.Tensor], torch.cuda.Event]:
    """`tensors` copied into pinned host memory on `stream` once `after` has happened, and
    the event that ends the copies. `stream` is one no capture uses (`HOST_COPY_STREAMS`:
    the copied blocks may be freed at any time, and their reuse events are recorded on
    it). The caller holds the device tensors until that event has happened: PyTorch's
    allocator (2.11) forgets a `record_stream` made while any thread of the process
    captures or routes into a graph's pool, if the tensor is freed then too, and would
    hand the block out again before the copy ends."""
    stream.wait_event(after)
    with torch.cuda.stream(stream):
        copies = [tensor.to("cpu", non_blocking=True) for tensor in tensors]
    return copies, stream.record_event()


class PieceUpload:
    """`waveform` `(1, samples)` on the host into `audio` `(1, length >= samples)` on the
    device, a piece at a time on the stream current when it is made (the caller's).
    `through(chunks, stream)` copies what the first `chunks` chunks read (chunk i: samples
    i step to i step + window) unless copied already, and makes `stream` wait for it.
    A pageable copy holds the host until it is done, so the host copies the next piece
    while the GPU runs the batches already queued (the whole hour in one copy, 27 to 32
    ms on the H200, left the GPU idle before its first kernel: `docs/performance.md`).
    Where `stream` is the upload's own (one stream for everything), the first call
    copies the whole waveform: PyTorch waits for a pageable copy's stream to drain, and
    a piece there would wait for every batch queued before it."""

    def __init__(self, audio: torch.Tensor, waveform: torch.Tensor, window: int, step: int) -> None:
        self._audio, self._waveform = audio, waveform
        self._window, self._step = window, step
        self._stream = torch.cuda.current_stream(audio.device)
        self._copied = 0
        self._arrived: torch.cuda.Event | None = None

    def through(self, chunks: int, stream: torch.cuda.Stream) -> None:
        stop = self._waveform.shape[1]
        if stream.cuda_stream != self._stream.cuda_stream:
            stop = min(stop, (chunks - 1) * self._step + self._window)
        if stop > self._copied:
            with torch.cuda.stream(self._stream):
                piece = slice(self._copied, stop)
                self._audio[:, piece].copy_(self._waveform[:, piece])
                self._arrived = torch.cuda.Event()
                self._arrived.record(self._stream)
            self._copied = stop
        if self._arrived is not None:
            stream.wait_event(self._arrived)
