"""`Plan`, the shape of every kernel area's plans; the lifetime they share (the lock an
enqueue holds, `close()`, and the graphs captured with `CudaRuntime.capture` that keep a
closed plan's buffers alive); and `StreamOrder`, for plans whose buffers serve one
enqueue at a time on the GPU."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from pyspk.cuda import driver
from pyspk.cuda.errors import ClosedError

if TYPE_CHECKING:
    from pyspk.cuda.buffers import DeviceBuffer
    from pyspk.cuda.runtime import CudaRuntime

_Plan = TypeVar("_Plan", bound="PlanLifetime")


@runtime_checkable
class Plan(Protocol):
    """What a plan of every kernel area is. It is planned from a `CudaRuntime` (segdense:
    `Area.plan`; trunk: `plan_trunk`, `plan_conv`; cluster: `plan_pdist`,
    `plan_linkage`) and owns its device buffers from then on. `enqueue` takes the
    buffers one launch reads and writes, checked by `buffer_interface`'s rules, and
    queues the area's kernels, by their named launch signatures, on the keyword `stream`
    (an int handle) or the runtime's; several threads may call it. `close()` (or leaving
    a `with` block) frees the buffers once no enqueue or live captured graph needs them;
    an enqueue after it raises `ClosedError` and launches nothing."""

    @property
    def runtime(self) -> CudaRuntime: ...

    @property
    def closed(self) -> bool: ...

    def enqueue(self, *buffers: Any, stream: int | None = None, **options: Any) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


class PlanLifetime:
    """A plan's open state and the device buffers it owns. An enqueue takes the lock
    (`_acquire` / `_release`, bound once) and calls `_check_open` under it; `close()`
    waits for it, so the buffers are freed only after the last launch was queued."""

    def __init__(self, runtime: CudaRuntime, owned: list[DeviceBuffer], context: str) -> None:
        self.runtime = runtime
        self._context = context
        self._owned = owned
        self._closed = False
        self._graphs = 0  # live captured graphs that launch this plan
        lock = threading.Lock()
        self._acquire, self._release = lock.acquire, lock.release

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed or self.runtime.closed:
            what = "plan" if self._closed else "runtime of this plan"
            raise ClosedError(f"{self._context}: the {what} was closed; nothing was launched")

    def close(self) -> None:
        """Refuses every later enqueue and frees the plan's buffers (idempotent). While a
        captured graph that launches this plan is alive, the free waits for the last
        such graph to be closed or collected."""
        self._acquire()  # waits for an enqueue in flight, which launched on live memory
        try:
            self._closed = True
            owned = self._take_owned() if self._graphs == 0 else []
        finally:
            self._release()
        free_all(owned)

    def graph_opened(self) -> None:
        self._acquire()
        try:
            self._graphs += 1
        finally:
            self._release()

    def graph_closed(self) -> None:
        # also called from the collector's finalizers, on any thread
        self._acquire()
        try:
            self._graphs -= 1
            owned = self._take_owned() if self._closed and self._graphs == 0 else []
        finally:
            self._release()
        free_all(owned)

    def __enter__(self: _Plan) -> _Plan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take_owned(self) -> list[DeviceBuffer]:
        """The buffers to free, taken once (under the lock)."""
        owned, self._owned = self._owned, []
        return owned


def free_all(buffers: list[DeviceBuffer]) -> None:
    """Frees every buffer; the first error is raised after the others are freed."""
    failure: BaseException | None = None
    for buffer in buffers:
        try:
            buffer.free()
        except Exception as error:
            failure = failure or error
    if failure is not None:
        raise failure


class StreamOrder:
    """Orders a plan's enqueues on the GPU whatever streams they come on: an enqueue waits
    for the last one's work (`cuStreamWaitEvent` on an event recorded after it), so the
    buffers the plan owns (activations, chunk maxima) serve one enqueue at a time. The
    host lock alone orders only the queueing: two streams would run the kernels at once
    on the same buffers.

    An enqueue into a stream that captures a graph is left out (a capture may not wait
    on work outside it); the graph's replays run in the order of the streams they are
    launched on. Call `before` and `after` around the launches, under the plan's lock."""

    def __init__(self, runtime: CudaRuntime) -> None:
        runtime._make_current()
        flags = driver.api().CUevent_flags.CU_EVENT_DISABLE_TIMING
        self._done = driver.call("cuEventCreate", flags)
        self._last: int | None = None  # the stream of the last enqueue not captured

    def before(self, stream: Any) -> bool:
        """Makes `stream` (a `CUstream` or an int handle) wait for the last enqueue; False
        (and no wait) when `stream` captures."""
        stream = _stream(stream)
        if stream_capturing(stream):
            return False
        # every enqueue after the first waits, on its own stream too: handles do not name
        # streams uniquely (each thread's per-thread default stream has the same one),
        # and a wait on work already ordered before it costs nothing on the GPU
        if self._last is not None:
            driver.call("cuStreamWaitEvent", stream, self._done, 0)
        return True

    def after(self, stream: Any, ordered: bool) -> None:
        """Marks the end of the enqueue just queued on `stream` (`ordered`: what `before`
        returned)."""
        if ordered:
            stream = _stream(stream)
            driver.call("cuEventRecord", self._done, stream)
            self._last = int(stream)

    def close(self) -> None:
        """Destroys the event (idempotent); the driver frees it once pending work ends."""
        done, self._done = self._done, None
        if done is not None:
            driver.call("cuEventDestroy", done)


class OrderedPlanLifetime(PlanLifetime):
    """A `PlanLifetime` whose enqueues are ordered across streams by `self._order` (see
    `StreamOrder`), which `close()` destroys."""

    def __init__(self, runtime: CudaRuntime, owned: list[DeviceBuffer], context: str) -> None:
        try:
            self._order = StreamOrder(runtime)
        except BaseException:
            free_all(owned)
            raise
        super().__init__(runtime, owned, context)

    def close(self) -> None:
        super().close()
        if not self.runtime.closed:  # the context, and the event with it, are gone
            self._order.close()


def stream_capturing(stream: Any) -> bool:
    """Whether `stream` (a `CUstream` or an int handle) is in a capture, active or
    invalidated (an invalidated one still holds the stream until it is ended)."""
    status = driver.call("cuStreamIsCapturing", _stream(stream))
    return int(status) != 0  # CU_STREAM_CAPTURE_STATUS_NONE


def _stream(stream: Any) -> Any:
    kind = driver.api().CUstream
    return stream if isinstance(stream, kind) else kind(int(stream))
