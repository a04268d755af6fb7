"""Peak memory over a stretch of work, for the benchmarks' reports: the process's
resident set (from /proc/self/statm) and, given a probe, the device's memory in use,
both sampled by a background thread. Sampling misses peaks shorter than its period, so a
report states the period. Also the garbage collector's pauses over a stretch of work
(`CollectorPauses`)."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
SAMPLING_PERIOD_S = 0.05


def resident_bytes() -> int:
    """This process's resident set now, in bytes (0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        return 0


class PeakMemory:
    """`with PeakMemory(device_used) as peak:` ... then `peak.host_bytes` and
    `peak.device_bytes`: the largest sample of each while the block ran (its first and
    last sample included). `device_used` returns the device's bytes in use (for example
    total minus free from `torch.cuda.mem_get_info`); without it device_bytes stays 0."""

    def __init__(
        self, device_used: Callable[[], int] | None = None, period_s: float = SAMPLING_PERIOD_S
    ):
        self.period_s = period_s
        self.host_bytes = 0
        self.device_bytes = 0
        self._device_used = device_used
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pyspk-peak-memory", daemon=True)

    def _sample(self) -> None:
        self.host_bytes = max(self.host_bytes, resident_bytes())
        if self._device_used is not None:
            self.device_bytes = max(self.device_bytes, int(self._device_used()))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


class CollectorPauses:
    """`with CollectorPauses() as pauses:` ... then `pauses.seconds` (the garbage
    collector's pauses while the block ran, in any thread), `pauses.full` (how many were
    full collections, generation 2) and `pauses.longest`. A full collection visits every
    object the collector tracks: with pyannote's pipeline loaded (some 480,000 objects)
    one took 0.24 s on a two-core development machine, so one that falls inside a timed
    run shows in its time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self.longest = 0.0
        self._began = 0.0

    def _observe(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._began = now
            return
        pause = now - self._began
        self.seconds += pause
        self.longest = max(self.longest, pause)
        self.full += info.get("generation") == 2

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        gc.callbacks.remove(self._observe)
