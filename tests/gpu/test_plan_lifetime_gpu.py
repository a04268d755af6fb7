"""Plan lifetime, aliasing, threads and `pyspk info` on a real device: a closed plan
launches nothing, a live graph keeps a closed plan's buffers, overlapping PyTorch views
are refused, concurrent enqueues give each caller its own bits, plan/close cycles leak
no device memory, and `pyspk info` reports the device and what it loads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyspk import cli
from pyspk.candidate.segdense import Entry, Site
from pyspk.cuda import CudaMath, driver
from pyspk.errors import BufferLayoutError, ClosedError
from pyspk.testing import operands, plan, run_eager
from tests.concurrency import run_together

pytestmark = pytest.mark.gpu


def test_a_closed_plan_leaves_the_output_untouched(runtime, kernels) -> None:
    ops = operands(Site.EMBEDDING, 1, seed=41)
    oxide = plan(runtime, Entry.EMBED_B1, CudaMath.FP32, ops)
    oxide.close()
    x = runtime.upload(ops["x"])
    out = runtime.upload(np.full(3 * 256, np.nan, np.float32))
    with pytest.raises(ClosedError):
        oxide.enqueue(x, out)
    runtime.synchronize()
    assert np.all(np.isnan(runtime.download(out)))


def test_a_live_graph_replays_a_closed_plan(runtime, kernels) -> None:
    ops = operands(Site.EMBEDDING, 32, seed=42)
    oxide = plan(runtime, Entry.EMBED_B32, CudaMath.FP32, ops)
    eager = run_eager(runtime, oxide, ops["x"]).view(np.uint32)
    x = runtime.upload(ops["x"])
    out = runtime.alloc_zeros(oxide.producer.output_len)
    graph = runtime.capture(lambda: oxide.enqueue(x, out))
    oxide.close()
    runtime.copy(out, runtime.upload(np.full(len(out), np.nan, np.float32)))
    graph.replay()
    runtime.synchronize()
    assert np.array_equal(runtime.download(out).view(np.uint32), eager)
    graph.close()
    assert oxide.producer._owned == []


def test_overlapping_torch_views_are_refused(runtime, kernels, torch) -> None:
    ops = operands(Site.EMBEDDING, 1, seed=43)
    oxide = plan(runtime, Entry.EMBED_B1, CudaMath.FP32, ops)
    storage = torch.zeros(3 * 5120 + 3 * 256, device="cuda")
    with pytest.raises(BufferLayoutError, match="output shares bytes with input"):
        oxide.enqueue(storage[: 3 * 5120], storage[3 * 5120 - 1 : 3 * 5120 - 1 + 3 * 256])
    oxide.enqueue(storage[: 3 * 5120], storage[3 * 5120 :])  # adjacent, no byte in common
    runtime.synchronize()
    oxide.close()


def test_concurrent_enqueues_give_each_caller_its_bits(runtime, kernels) -> None:
    ops = operands(Site.EMBEDDING, 1, seed=44)
    oxide = plan(runtime, Entry.EMBED_B1, CudaMath.FP32, ops)
    rng = np.random.default_rng(44)
    inputs = [rng.standard_normal(3 * 5120).astype(np.float32) for _ in range(8)]
    expected = [run_eager(runtime, oxide, x).view(np.uint32) for x in inputs]
    buffers = [(runtime.upload(x), runtime.alloc_zeros(3 * 256)) for x in inputs]

    def drive(x, y) -> None:
        for _ in range(50):
            oxide.enqueue(x, y)

    run_together(drive, buffers)
    runtime.synchronize()
    for (_, y), bits in zip(buffers, expected, strict=True):
        assert np.array_equal(runtime.download(y).view(np.uint32), bits)
    oxide.close()


def test_plan_close_cycles_leak_no_device_memory(runtime, kernels) -> None:
    ops = operands(Site.EMBEDDING, 1, seed=45)

    def used() -> int:
        runtime.synchronize()
        free, total = driver.call("cuMemGetInfo")
        return int(total) - int(free)

    for _ in range(20):
        plan(runtime, Entry.EMBED_B1, CudaMath.FP32, ops).close()
    before = used()
    for _ in range(300):
        plan(runtime, Entry.EMBED_B1, CudaMath.FP32, ops).close()
    assert used() - before <= 2 << 20  # the driver's allocation granularity


def test_info_reports_the_device(capsys: pytest.CaptureFixture[str], runtime) -> None:
    assert cli.main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    device = report["devices"][0]
    assert device["name"] == runtime.device.name
    assert device["multiprocessors"] == runtime.device.multiprocessors
    assert device["memory_bytes"] > 0
    assert device["artifact"].startswith("segdense.")
    assert len(device["picks"]) == 24 and all(pick["built"] for pick in device["picks"])
