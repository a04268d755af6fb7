"""The lifetime every plan shares: the lock an enqueue holds, `close()`, and the graphs
captured with `CudaRuntime.capture` that keep a closed plan's buffers alive."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, TypeVar

from pyspk.cuda.errors import ClosedError

if TYPE_CHECKING:
    from pyspk.cuda.buffers import DeviceBuffer
    from pyspk.cuda.runtime import CudaRuntime

_Plan = TypeVar("_Plan", bound="PlanLifetime")


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
