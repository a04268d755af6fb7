"""Private CUDA streams, shared over their users' lifetimes: `STREAMS.take(device, n)`
and `STREAMS.give_back(streams)`, and `HOST_COPY_STREAMS` the same way for copies to
pinned host memory."""

from __future__ import annotations

import threading

import torch

from pyspk.cuda import driver
from pyspk.torch import _ordinal

__all__ = ["HOST_COPY_STREAMS", "STREAMS", "StreamPool", "private_stream"]


def private_stream(device: torch.device) -> torch.cuda.Stream:
    """A non-blocking stream that no other code is handed, for the process's lifetime.
    `torch.cuda.Stream()` hands out a pool of 32 streams per device in turn, so another
    thread's new stream can be one that pyspk captures on or forks to inside a capture,
    and what that thread enqueues or waits for meanwhile joins or breaks the graph
    (measured on the H200: a thread's `synchronize` on such a stream invalidated the
    engine's capture)."""
    ordinal = _cuda(device).index
    # the stream needs the primary context (PyTorch's) alive as long as it is: never released
    context = driver.call("cuDevicePrimaryCtxRetain", driver.device(ordinal))
    driver.call("cuCtxPushCurrent", context)
    try:
        flags = int(driver.api().CUstream_flags.CU_STREAM_NON_BLOCKING)
        handle = driver.call("cuStreamCreate", flags)
    finally:
        driver.call("cuCtxPopCurrent")
    return torch.cuda.ExternalStream(int(handle), device=torch.device("cuda", ordinal))


def _cuda(device: torch.device) -> torch.device:
    """`device` with its ordinal ("cuda" is the current device)."""
    return torch.device("cuda", _ordinal(device))


class StreamPool:
    """Private streams (`private_stream`) that engines and planned trunks take and give
    back, per device. A stream that runs library matrix products keeps a cuBLAS
    workspace for as long as the process lives, which `torch.cuda.empty_cache()` does not
    release: an engine per accelerate/undo cycle on new streams would leave one more each
    time. Users alive at once get streams of their own."""

    def __init__(self) -> None:
        self._idle: dict[torch.device, list[torch.cuda.Stream]] = {}
        self._lock = threading.Lock()

    def take(self, device: torch.device, count: int) -> list[torch.cuda.Stream]:
        with self._lock:
            idle = self._idle.setdefault(_cuda(device), [])
            taken = [idle.pop() for _ in range(min(count, len(idle)))]
        try:
            while len(taken) < count:
                taken.append(private_stream(device))
        except BaseException:
            self.give_back(taken)
            raise
        return taken

    def give_back(self, streams: list[torch.cuda.Stream]) -> None:
        """Each stream back under its own device (not the current one: a finalizer may
        run in any thread)."""
        with self._lock:
            for stream in streams:
                self._idle.setdefault(_cuda(stream.device), []).append(stream)


STREAMS = StreamPool()

HOST_COPY_STREAMS = StreamPool()
"""Streams for copies into pinned host memory, which no capture ever uses. PyTorch's host
allocator records a freed pinned block's reuse event on each stream that used the block.
On a stream that is capturing, that record joins the capture, and the allocator's next
query of the event fails ("invalid argument"), failing an unrelated pinned allocation
later (measured on an H100: a file's host outputs freed while a later engine captured
on the streams that had copied them)."""
