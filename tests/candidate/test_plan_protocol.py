"""One plan shape for the kernel areas (`pyspk.cuda.Plan`), on the fake driver: a
plan of each is a `Plan`, planned from a runtime, enqueued on a given stream by a named
launch signature, and after `close()` (or its `with` block) refuses an enqueue and
launches nothing."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import attrs
import numpy as np
import pytest

from pyspk.candidate.cluster import plan_linkage, plan_pdist
from pyspk.candidate.lstm import plan_lstm_recurrence
from pyspk.candidate.sincnet import plan_sinc_front
from pyspk.candidate.trunk import TrunkSite, TrunkWeights, plan_conv
from pyspk.candidate.trunk.fbank import plan_fbank_frames, plan_log_mel
from pyspk.candidate.trunk.pooling import plan_stats_pool
from pyspk.cuda import CudaMath, CudaRuntime, Plan
from pyspk.cuda.buffers import FLOAT64, INT32
from pyspk.errors import ClosedError
from tests.embed_plans import embed_b1_plan
from tests.fake_driver import FakeApi

STREAM = 0x5100  # a caller's stream handle


def segdense(runtime: CudaRuntime) -> tuple[Plan, Callable[[Plan], None]]:
    plan = embed_b1_plan(runtime)
    # batch 1: the three (chunk, speaker) rows of one chunk
    x, y = runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256)
    return plan, lambda plan: plan.enqueue(x, y, stream=STREAM)


def trunk(runtime: CudaRuntime) -> tuple[Plan, Callable[[Plan], None]]:
    conv = TrunkWeights.random(0).convs()[1]
    assert conv.site is TrunkSite.LAYER1_CONV
    plan = plan_conv(runtime, CudaMath.FP32, conv)
    shape = conv.site.shape
    x, y = runtime.alloc_zeros(32 * shape.x_item), runtime.alloc_zeros(32 * shape.y_item)
    return plan, lambda plan: plan.enqueue(x, y, stream=STREAM)


def pdist(runtime: CudaRuntime) -> tuple[Plan, Callable[[Plan], None]]:
    points = runtime.upload(np.zeros((10, 4)), FLOAT64)
    d = runtime.alloc_zeros(45, FLOAT64)
    return plan_pdist(runtime, 4), lambda plan: plan.enqueue(points, d, count=10, stream=STREAM)


def linkage(runtime: CudaRuntime) -> tuple[Plan, Callable[[Plan], None]]:
    d, z = runtime.alloc_zeros(45, FLOAT64), runtime.alloc_zeros(36, FLOAT64)
    status = runtime.alloc_zeros(1, INT32)
    return plan_linkage(runtime, 10), lambda plan: plan.enqueue(
        d, z, status, count=10, method="centroid", stream=STREAM
    )


def lstm(runtime: CudaRuntime) -> tuple[Plan, Callable[[Plan], None]]:
    # the plan's 128 KiB of shared memory: an H200's opt-in limit
    runtime._device = attrs.evolve(runtime.device, shared_optin_bytes=232448)
    w_hh = np.zeros((2, 512, 128), np.float32)
    gx, y = runtime.alloc_zeros(3 * 7 * 1024), runtime.alloc_zeros(3 * 7 * 256)
    return plan_lstm_recurrence(runtime, w_hh), lambda plan: plan.enqueue(
        gx, y, items=3, steps=7, stream=STREAM
    )


def sincnet(runtime: CudaRuntime) -> tuple[Plan, Callable[[Plan], None]]:
    # the plan's 87 KiB of shared memory: an H200's opt-in limit
    runtime._device = attrs.evolve(runtime.device, shared_optin_bytes=232448)
    x, y = runtime.alloc_zeros(2 * 400), runtime.alloc_zeros(2 * 80 * 5)
    return plan_sinc_front(runtime, np.zeros((80, 251), np.float32)), lambda plan: plan.enqueue(
        x, y, items=2, samples=400, stream=STREAM
    )


def stats_pool(runtime: CudaRuntime) -> tuple[Plan, Callable[[Plan], None]]:
    x, w = runtime.alloc_zeros(2 * 6 * 5), runtime.alloc_zeros(2 * 3 * 5)
    y = runtime.alloc_zeros(2 * 3 * 12)
    return plan_stats_pool(runtime), lambda plan: plan.enqueue(
        x, w, y, items=2, speakers=3, features=6, frames=5, stream=STREAM
    )


def fbank_frames(runtime: CudaRuntime) -> tuple[Plan, Callable[[Plan], None]]:
    x, y = runtime.alloc_zeros(2 * 560), runtime.alloc_zeros(2 * 2 * 512)
    return plan_fbank_frames(runtime, np.ones(400, np.float32)), lambda plan: plan.enqueue(
        x, y, items=2, samples=560, stream=STREAM
    )


def log_mel(runtime: CudaRuntime) -> tuple[Plan, Callable[[Plan], None]]:
    banks = np.zeros((257, 80), np.float32)
    banks[np.arange(80) + 1, np.arange(80)] = 1.0  # one bin a filter
    spectrum, y = runtime.alloc_zeros(2 * 3 * 257 * 2), runtime.alloc_zeros(2 * 3 * 80)
    sums = runtime.alloc_zeros(2 * 80, FLOAT64)
    return plan_log_mel(runtime, banks), lambda plan: plan.enqueue(
        spectrum, y, sums, items=2, frames=3, stream=STREAM
    )


@pytest.mark.parametrize(
    "area",
    [segdense, trunk, pdist, linkage, lstm, sincnet, stats_pool, fbank_frames, log_mel],
    ids=lambda f: f.__name__,
)
def test_every_area_plans_to_one_shape(fake: FakeApi, runtime: CudaRuntime, area) -> None:
    plan, enqueue = area(runtime)
    with plan:
        assert isinstance(plan, Plan) and plan.runtime is runtime and not plan.closed
        stream = inspect.signature(plan.enqueue).parameters["stream"]
        assert stream.kind is inspect.Parameter.KEYWORD_ONLY and stream.default is None
        before = len(fake.launches)
        enqueue(plan)
        launched = fake.launches[before:]
        assert launched and all(int(launch[4]) == STREAM for launch in launched)
    assert plan.closed
    before = len(fake.launches)
    with pytest.raises(ClosedError, match="was closed; nothing was launched"):
        enqueue(plan)
    assert len(fake.launches) == before
