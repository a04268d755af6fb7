"""The benchmarks' peak-memory sampler: it sees an allocation made and freed inside its
block, and the device probe's largest value, not its last; and the collector's pauses:
each collection inside the block, full ones counted, none after it."""

from __future__ import annotations

import gc
import mmap
import sys
import time

import numpy as np
import pytest

from pyspk.testing.memory import CollectorPauses, PeakMemory, resident_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_freed_allocation_still_shows_in_the_host_peak():
    # A fresh anonymous mapping, not the allocator: malloc may hand back pages the process
    # already holds (the resident set then rose by one page in a CI run).
    before = resident_bytes()
    with PeakMemory(period_s=0.01) as peak:
        block = mmap.mmap(-1, 64 << 20)
        pages = np.frombuffer(block, dtype=np.uint8)
        pages[:] = 1  # touched, so resident
        time.sleep(0.1)
        del pages
        block.close()
    assert peak.host_bytes >= before + (60 << 20)
    assert resident_bytes() < peak.host_bytes


def test_the_device_peak_is_the_largest_sample():
    readings = iter([5, 40, 7] + [3] * 1000)
    with PeakMemory(lambda: next(readings), period_s=0.01) as peak:
        time.sleep(0.1)
    assert peak.device_bytes == 40


def test_without_a_probe_the_device_peak_stays_zero():
    with PeakMemory(period_s=0.01) as peak:
        pass
    assert peak.device_bytes == 0 and peak.host_bytes > 0


def test_collector_pauses_count_the_collections_inside_the_block_only():
    with CollectorPauses() as pauses:
        gc.collect(0)
        gc.collect()  # a full collection
        gc.collect()
    assert pauses.full == 2
    assert 0.0 < pauses.longest <= pauses.seconds
    seen = pauses.seconds
    gc.collect()
    assert (pauses.full, pauses.seconds) == (2, seen)
