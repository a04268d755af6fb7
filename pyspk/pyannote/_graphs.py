"""The engine's GPU scheduling parts: the streams engines share over their lifetimes, and
one fixed-batch forward replayed from a CUDA graph."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import torch

__all__ = ["STREAMS", "Forward", "StreamPool"]


class StreamPool:
    """Streams engines take and give back, per device. A stream that runs library matrix
    products keeps a cuBLAS workspace for as long as the process lives, which
    `torch.cuda.empty_cache()` does not release: an engine per accelerate/undo cycle on
    new streams would leave one more each time. Engines alive at once get streams of
    their own."""

    def __init__(self) -> None:
        self._idle: dict[torch.device, list[torch.cuda.Stream]] = {}
        self._lock = threading.Lock()

    def take(self, device: torch.device, count: int) -> list[torch.cuda.Stream]:
        with self._lock:
            idle = self._idle.setdefault(device, [])
            taken = [idle.pop() for _ in range(min(count, len(idle)))]
        return taken + [torch.cuda.Stream(device) for _ in range(count - len(taken))]

    def give_back(self, device: torch.device, streams: list[torch.cuda.Stream]) -> None:
        with self._lock:
            self._idle.setdefault(device, []).extend(streams)


STREAMS = StreamPool()


class Forward:
    """One fixed-batch forward: inputs copied into static buffers (the rest of a short
    batch zeroed, so padded items are the same on every run), then run eagerly or
    replayed from a CUDA graph captured once."""

    def __init__(
        self,
        name: str,
        function: Callable[..., tuple[torch.Tensor, ...]],
        shapes: list[tuple[int, ...]],
        device: torch.device,
        graph: bool,
        stream: torch.cuda.Stream,
    ) -> None:
        self.name = name
        self.function = function
        self.inputs = [torch.zeros(shape, device=device) for shape in shapes]
        self.batch = shapes[0][0]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()
        self.note = "eager"
        if graph:
            self._capture(stream)

    def _capture(self, stream: torch.cuda.Stream) -> None:
        """Captures on PyTorch's capture stream after two eager runs on `stream` (the
        stream the forward will replay on): lazy initialisation and workspaces."""
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.function(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            # thread-local: what other threads do meanwhile (allocate, synchronize) is
            # none of this capture's business, and cannot break it
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = self.function(*self.inputs)
        except RuntimeError as error:  # a model with host work inside: run eagerly
            self.note = f"eager (capture failed: {' '.join(str(error).split())[:200]})"
            warnings.warn(
                f"pyspk engine: the {self.name} forward runs eagerly, its CUDA graph "
                f"capture failed ({' '.join(str(error).split())[:200]})",
                RuntimeWarning,
                stacklevel=2,
            )
            torch.cuda.synchronize()
            return
        self.graph, self.outputs, self.note = graph, outputs, "graph"

    def __call__(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The outputs for `values` (a batch of at most `batch` items each), valid
        until the next call on the current stream."""
        count = values[0].shape[0]
        for static, value in zip(self.inputs, values, strict=True):
            static[:count].copy_(value)
            if count < self.batch:
                static[count:].zero_()
        if self.graph is None:
            return self.function(*self.inputs)
        self.graph.replay()
        return self.outputs

    def close(self) -> None:
        self.graph, self.outputs, self.inputs = None, (), []
