"""The engine's fixed-batch forward, replayed from a CUDA graph captured on one of the
engine's private streams (`pyspk.torch._streams`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from pyspk.cuda import driver
from pyspk.cuda.errors import CudaError, InvalidArgument
from pyspk.cuda.lifetime import stream_capturing
from pyspk.cuda.runtime import abandon_capture

__all__ = ["Forward", "fill_ladder", "padded"]


class Forward:
    """One fixed-batch forward: inputs copied into static buffers (the rest of a short
    batch zeroed, so padded items are the same on every run), then run eagerly or
    replayed from a CUDA graph captured once.

    A smaller forward of the same function can `share` a larger one's memory: its static
    inputs are the larger's leading items, and its graph takes its memory from the
    larger's pool (`shared_pool`). Such forwards must run on one stream, one after
    another, and each call's outputs must be consumed before the next call of any of
    them."""

    def __init__(
        self,
        name: str,
        function: Callable[..., tuple[torch.Tensor, ...]],
        shapes: list[tuple[int, ...]],
        device: torch.device,
        graph: bool,
        stream: torch.cuda.Stream,
        share: Forward | None = None,
    ) -> None:
        self.name = name
        self.function = function
        self.batch = shapes[0][0]
        if share is None:
            self.inputs = [torch.zeros(shape, device=device) for shape in shapes]
        else:
            if [shape[1:] for shape in shapes] != [tuple(x.shape[1:]) for x in share.inputs]:
                raise InvalidArgument(f"{name}: shapes {shapes} are not {share.name}'s items")
            if self.batch > share.batch:
                raise InvalidArgument(f"{name}: batch {self.batch} exceeds {share.name}'s")
            self.inputs = [static[: self.batch] for static in share.inputs]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()
        self.note = "eager"
        self.shared_pool: Any = None  # the graph memory a smaller forward may capture into
        if not graph:
            return
        pool = None if share is None else share.shared_pool
        # a forward sharing a larger one's memory runs after it on the same stream, whose
        # lazy initialisation is done: one eager run there, for its own shapes' workspaces
        if self._capture(stream, pool, warmups=2 if share is None else 1):
            assert self.graph is not None
            self.shared_pool = self.graph.pool()
        elif share is not None and pool is not None:
            # a capture into the shared pool failed: the forwards after it take pools
            # of their own, whatever the failure left of this one
            share.shared_pool = None

    def _capture(self, stream: torch.cuda.Stream, pool: Any, warmups: int) -> bool:
        """Captures on `stream`, the private stream the forward will replay on, after
        `warmups` eager runs there (lazy initialisation and workspaces) whose memory
        comes from the capture's pool (`_route_into`). Not on PyTorch's default capture
        stream: that one comes from PyTorch's shared pool (`private_stream`). Not
        through `torch.cuda.graph` either: it first synchronizes the whole device, which
        CUDA refuses while another thread captures, breaking that thread's capture, and
        empties the allocator's cache. False when the capture failed, the forward then
        running eagerly."""
        # a pool named here, not by PyTorch, so that a failed capture's can be let go
        pool = torch.cuda.graph_pool_handle() if pool is None else pool
        routing = _route_into(stream.device.index, pool)
        try:
            current = torch.cuda.current_stream()
            stream.wait_stream(current)
            try:
                with torch.cuda.stream(stream):
                    for _ in range(warmups):
                        self.function(*self.inputs)
            finally:
                if routing is not None:
                    routing.stop()
            current.wait_stream(stream)
            return self._capture_into(stream, pool)
        finally:
            if routing is not None:  # the graph holds the pool now, if it was made
                routing.release()

    def _capture_into(self, stream: torch.cuda.Stream, pool: Any) -> bool:
        graph = torch.cuda.CUDAGraph()
        attempted = False
        try:
            with torch.cuda.stream(stream):
                attempted = True
                # thread-local: what other threads do on their own streams meanwhile
                # (allocate, synchronize them) is none of this capture's business
                graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    outputs = self.function(*self.inputs)
                finally:
                    graph.capture_end()
        except (RuntimeError, CudaError) as error:  # host work, a device-wide synchronize
            _after_failed_capture(stream, pool, attempted)
            self.note = f"eager (capture failed: {' '.join(str(error).split())[:200]})"
            warnings.warn(
                f"pyspk engine: the {self.name} forward runs eagerly, its CUDA graph "
                f"capture failed ({' '.join(str(error).split())[:200]})",
                RuntimeWarning,
                stacklevel=3,
            )
            # this stream alone: a device-wide synchronize would break another thread's
            # capture as this one was broken
            stream.synchronize()
            return False
        self.graph, self.outputs, self.note = graph, outputs, "graph"
        return True

    def __call__(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The outputs for `values` (a batch of at most `batch` items each), valid
        until the next call on the current stream (of this forward, or of one sharing its
        memory)."""
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


def fill_ladder(
    forwards: dict[int, Forward],
    name: str,
    function: Callable[..., tuple[torch.Tensor, ...]],
    shapes: Callable[[int], list[tuple[int, ...]]],
    sizes: list[int],
    device: torch.device,
    graph: bool,
    stream: torch.cuda.Stream,
) -> None:
    """Fills `forwards` with a `Forward` of `function` for each batch size in `sizes`
    (the full batch first, named `name`), each smaller one sharing the full one's memory
    (`shapes(size)`: its inputs' shapes). Those made before an error stay in `forwards`,
    for the caller to close."""
    for size in sizes:
        forwards[size] = Forward(
            name if size == sizes[0] else f"{name} {size}",
            function,
            shapes(size),
            device,
            graph,
            stream,
            share=forwards.get(sizes[0]),
        )


def padded(items: torch.Tensor, count: int) -> torch.Tensor:
    """`items` and zero items after them, `count` in all (as a short batch's static
    inputs are padded)."""
    return torch.cat([items, items.new_zeros((count - items.shape[0], *items.shape[1:]))])


class _PoolRouting:
    """This thread's allocations on `device` routed into `pool` (created if new, a
    reference taken) from construction until `stop()`; `release()` lets the reference
    go. PyTorch's private calls (2.11), as `capture_begin` makes them."""

    def __init__(self, device: int, pool: Any) -> None:
        self.device, self.pool = device, pool
        torch._C._cuda_beginAllocateCurrentThreadToPool(device, pool)

    def stop(self) -> None:
        torch._C._cuda_endAllocateToPool(self.device, self.pool)

    def release(self) -> None:
        torch._C._cuda_releasePool(self.device, self.pool)


def _route_into(device: int, pool: Any) -> _PoolRouting | None:
    """The eager runs before a capture routed into the pool the capture then reuses, so
    that their memory is not left in the allocator's cache, where only later eager work
    on the stream could use it: two engines of a corpus run kept some gigabytes there
    (`benchmarks/h100-sxm-capture-pools.txt`). While it routes, PyTorch counts a
    capture underway, as during the capture itself: see `_upload.to_host` on what that
    means for `record_stream`. None, nothing routed, in a PyTorch without the calls."""
    names = ("_cuda_beginAllocateCurrentThreadToPool", "_cuda_endAllocateToPool")
    if not all(hasattr(torch._C, name) for name in (*names, "_cuda_releasePool")):
        return None
    return _PoolRouting(device, pool)


def _after_failed_capture(captured: torch.cuda.Stream, pool: Any, attempted: bool) -> None:
    """Undoes what PyTorch (2.11) leaves behind when a capture on `captured` into `pool`
    fails (`attempted`: once `capture_begin` was called):

    - a capture that `capture_begin` began and then refused (its check that the capture
      is active fails when another thread's device-wide synchronize lands in between)
      is never ended, and every later use of the stream fails, an event recorded in a
      tensor's destructor among them;
    - a failed `capture_end` (the capture invalidated) leaves the caching allocator
      routing into the capture's pool: from then on it holds back every freed block
      that another stream used (the engine's masks, each file) and the pool's memory;
    - the device's default generator still counts as capturing, so the next random draw
      on the device raises "Offset increment outside graph capture" (measured on the
      H200). A copy of the generator's state (same seed and offset) that is not
      capturing replaces it."""
    _end_capture_left_open(captured)
    _release_pool_left_routing(captured.device.index, pool)
    if attempted:
        generator = torch.cuda.default_generators[captured.device.index]
        generator.graphsafe_set_state(generator.clone_state())


def _end_capture_left_open(stream: torch.cuda.Stream) -> None:
    handle = driver.api().CUstream(stream.cuda_stream)
    if stream_capturing(handle):
        abandon_capture(handle)


def _release_pool_left_routing(device: int, pool: Any) -> None:
    # PyTorch's private calls (2.11): a PyTorch without them leaves the pool as it is
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    release = getattr(torch._C, "_cuda_releasePool", None)
    if end is None or release is None:
        return
    try:
        end(device, pool)
    except RuntimeError:
        return  # not routing: capture_end ended it, or capture_begin never began it
    release(device, pool)  # the reference capture_begin took
