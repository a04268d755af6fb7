"""`EventPhases`: a `Phases` that times each op of an enqueue with CUDA events."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

from pyspk.cuda import driver

if TYPE_CHECKING:
    from pyspk.cuda.runtime import CudaRuntime

T = TypeVar("T")


class EventPhases:
    """Records a start and an end event around every op on the runtime's stream;
    `elapsed_ms()` waits for them and gives each op's summed device time.

    Event pairs return to a free list once read, so steady timing allocates nothing."""

    def __init__(self, runtime: CudaRuntime) -> None:
        self._runtime = runtime
        self._recorded: list[tuple[Hashable, tuple[Any, Any]]] = []
        self._free: list[tuple[Any, Any]] = []

    def op(self, op: Hashable, launch: Callable[[], T]) -> T:
        pair = self._free.pop() if self._free else self._new_pair()
        stream = self._runtime.stream
        driver.call("cuEventRecord", pair[0], stream)
        result = launch()
        driver.call("cuEventRecord", pair[1], stream)
        self._recorded.append((op, pair))
        return result

    def elapsed_ms(self) -> dict[Hashable, float]:
        """Milliseconds per op (the plan framework's `Op`, or any key a caller passes)
        over every op recorded since the last call."""
        totals: dict[Hashable, float] = {}
        for op, (start, end) in self._recorded:
            driver.call("cuEventSynchronize", end)
            elapsed = float(driver.call("cuEventElapsedTime", start, end))
            totals[op] = totals.get(op, 0.0) + elapsed
        self._free += [pair for _, pair in self._recorded]
        self._recorded = []
        return totals

    def close(self) -> None:
        """Destroys every event this object made (idempotent)."""
        pairs = self._free + [pair for _, pair in self._recorded]
        self._free, self._recorded = [], []
        for pair in pairs:
            for event in pair:
                driver.call("cuEventDestroy", event)

    @staticmethod
    def _new_pair() -> tuple[Any, Any]:
        flags = driver.api().CUevent_flags.CU_EVENT_DEFAULT
        return (driver.call("cuEventCreate", flags), driver.call("cuEventCreate", flags))
