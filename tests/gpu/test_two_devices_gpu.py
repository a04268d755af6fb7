"""Two GPUs of one host: plans on device 1 give device 0's bits, a buffer of device 0 is
refused by a device-1 plan, and two threads driving the two devices at once give the
bits of a serial run. Skipped with fewer than two devices (PYSPK_REQUIRE_TWO_GPUS=1
fails instead)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pyspk.candidate.segdense import Entry, Site
from pyspk.cuda import CudaMath, CudaRuntime, driver
from pyspk.cuda.manifest import KernelModule
from pyspk.errors import BufferLayoutError
from pyspk.testing import operands, plan, run_eager
from tests.concurrency import run_together

pytestmark = pytest.mark.gpu

CASES = [(Entry.EMBED_B32_X3, CudaMath.FP32), (Entry.CONV2_B32_TC, CudaMath.TF32)]


@pytest.fixture(scope="module")
def second(runtime: CudaRuntime):
    runtime.synchronize()
    if driver.device_count() < 2:
        if os.environ.get("PYSPK_REQUIRE_TWO_GPUS") == "1":
            pytest.fail("PYSPK_REQUIRE_TWO_GPUS=1 but fewer than two devices", pytrace=False)
        pytest.skip("fewer than two CUDA devices")
    with CudaRuntime(1) as opened:
        yield opened, opened.load_kernels(KernelModule.SEGDENSE)
    runtime.synchronize()  # device 0's context current again for the tests after these


def _bits(runtime, kernels, entry, math, ops) -> np.ndarray:
    oxide = plan(runtime, entry, math, ops)
    try:
        return run_eager(runtime, oxide, ops["x"]).view(np.uint32)
    finally:
        oxide.close()


@pytest.mark.parametrize(("entry", "math"), CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_device_1_gives_device_0_bits(runtime, kernels, second, entry, math) -> None:
    ops = operands(entry.site(), 32, seed=51)
    zero = _bits(runtime, kernels, entry, math, ops)
    one_runtime, one_kernels = second
    one = _bits(one_runtime, one_kernels, entry, math, ops)
    runtime.synchronize()
    assert np.array_equal(zero, one)


def test_a_device_0_buffer_is_refused_by_a_device_1_plan(runtime, second) -> None:
    one_runtime, _ = second
    ops = operands(Site.EMBEDDING, 1, seed=52)
    oxide = plan(one_runtime, Entry.EMBED_B1, CudaMath.FP32, ops)
    foreign = runtime.upload(ops["x"])
    out = one_runtime.alloc_zeros(3 * 256)
    with pytest.raises(BufferLayoutError, match="lives on device 0, expected device 1"):
        oxide.enqueue(foreign, out)
    oxide.close()
    runtime.synchronize()


def test_two_threads_on_two_devices_match_a_serial_run(runtime, kernels, second) -> None:
    one_runtime, one_kernels = second
    entry, math = Entry.EMBED_B32_X3, CudaMath.FP32
    ops = operands(entry.site(), 32, seed=53)
    serial = _bits(runtime, kernels, entry, math, ops)
    results: dict[int, list[np.ndarray]] = {}

    def drive(index: int, rt: CudaRuntime, loaded) -> None:
        rt.synchronize()  # makes this runtime's context current on this thread
        oxide = plan(rt, entry, math, ops)
        x = rt.upload(ops["x"])
        outs = [rt.alloc_zeros(oxide.producer.output_len) for _ in range(20)]
        for out in outs:
            oxide.enqueue(x, out)
        rt.synchronize()
        results[index] = [rt.download(out).view(np.uint32) for out in outs]
        oxide.close()

    run_together(drive, [(0, runtime, kernels), (1, one_runtime, one_kernels)])
    runtime.synchronize()
    assert sorted(results) == [0, 1]
    for bits in results[0] + results[1]:
        assert np.array_equal(bits, serial)
