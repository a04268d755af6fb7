"""Files from several engines on one GPU, queued on the device the way one engine queues
a long file's batches.

Engines that share a GPU and each alternate GPU work and host work (a file's models, then
its clustering and reconstruction) fall into step when their files run side by side on
the device: both finish their GPU work at about the same time, then both are on the host
while the GPU idles. With turns, each stream role's work for a file (the segmentation
stream's, the embedding stream's) runs after that role's work for the file queued before
it, whichever engine queued that one: while one engine is on the host, the GPU runs the
other's file, and a file's segmentation still overlaps the embeddings of the file before
it, as the batches of one file overlap (docs/performance.md, "Corpus mode's GPU queue").
Needs no torch: streams are anything with `wait_event` and `record_event`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pyspk.cuda.errors import InvalidArgument

__all__ = ["DeviceTurns"]


class DeviceTurns:
    """One GPU's queue of files, shared by the engines that run on it
    (`accelerate_pipeline(..., turns=...)`); thread-safe. `count` is the turns taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ends: list[Any] = []  # per stream role, the event that ended the last turn
        self._device: Any = None
        self.count = 0

    @contextmanager
    def turn(self, streams: Sequence[Any]) -> Iterator[None]:
        """Queues a file's GPU work, which the caller enqueues inside the block, on
        `streams` (by role, the same roles in every turn): each stream first waits for
        its role's work of the turn before. Turns are taken one at a time, in the order
        the engines ask; a turn that raises still ends, so that the next waits only for
        what it queued."""
        with self._lock:
            device = getattr(streams[0], "device", None)
            if self._device is None:
                self._device = device
            elif device != self._device:
                raise InvalidArgument(
                    f"pyspk DeviceTurns: a turn on {device}, but these turns queue {self._device}"
                )
            for stream, end in zip(streams, self._ends, strict=False):
                stream.wait_event(end)
            try:
                yield
            finally:
                self._ends = [stream.record_event() for stream in streams]
                self.count += 1
