"""Interleavings and lifetimes forced with the fake driver (no GPU): a close() racing an
enqueue never lets a launch use freed memory, graphs the collector takes leave no entry
behind, frees made while a capture is open are all done when it ends, and a failing
cleanup never hides the error that caused it."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from pyspk.candidate.segdense import DenseOxide, Entry, SegdensePin
from pyspk.cuda import CudaMath, CudaRuntime
from pyspk.cuda.manifest import KernelModule
from pyspk.errors import BufferLayoutError, BufferLengthError, ClosedError, WeightsOutOfContract
from tests.concurrency import run_together
from tests.embed_plans import KERNEL, SPEC, embed_b1_plan, embed_b32_plan
from tests.fake_driver import CaiView, FakeApi


def _owned(oxide: DenseOxide) -> list[int]:
    return [buffer._ptr for buffer in oxide.producer._owned]


def test_close_waits_for_the_enqueue_in_flight(fake: FakeApi, runtime: CudaRuntime) -> None:
    seen: dict[str, bool] = {}
    armed: list[threading.Thread] = []
    launch = fake.cuLaunchKernel

    def launch_while_closing(*args):
        if armed and not seen:
            closer = armed[0]
            closer.start()
            closer.join(0.2)  # close() must wait for this launch: it cannot end yet
            seen["close ended during the launch"] = not closer.is_alive()
            seen["packed weight live at launch"] = all(ptr in fake.memory for ptr in owned)
        return launch(*args)

    fake.cuLaunchKernel = launch_while_closing  # before planning: launches bind it
    oxide = embed_b1_plan(runtime)
    x, y = runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256)
    owned = _owned(oxide)
    armed.append(threading.Thread(target=oxide.close))
    oxide.enqueue(x, y)
    armed[0].join()
    assert seen == {"close ended during the launch": False, "packed weight live at launch": True}
    assert not any(ptr in fake.memory for ptr in owned)  # freed once the launch was made
    with pytest.raises(ClosedError):
        oxide.enqueue(x, y)


def test_a_close_between_the_checks_and_the_launch_launches_nothing(
    fake: FakeApi, runtime: CudaRuntime
) -> None:
    oxide = embed_b1_plan(runtime)
    x, y = runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256)
    producer = oxide.producer
    acquire = producer._acquire

    def close_first(*args):
        # another thread closes (and frees) after the enqueue checked its buffers
        producer._acquire = acquire
        closer = threading.Thread(target=oxide.close)
        closer.start()
        closer.join()
        return acquire(*args)

    producer._acquire = close_first
    with pytest.raises(ClosedError, match="plan was closed"):
        oxide.enqueue(x, y)
    assert not any(launch[0] == KERNEL for launch in fake.launches)


def test_close_and_enqueue_from_many_threads_never_launch_on_freed_memory(
    fake: FakeApi, runtime: CudaRuntime
) -> None:
    x, y = runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256)
    bad: list[str] = []
    live: list[list[int]] = [[]]
    launch = fake.cuLaunchKernel

    def checked_launch(*args):
        if args[0] == KERNEL and not all(ptr in fake.memory for ptr in live[0]):
            bad.append("launched on freed memory")
        return launch(*args)

    fake.cuLaunchKernel = checked_launch
    for _ in range(20):
        oxide = embed_b1_plan(runtime)
        live[0] = _owned(oxide)

        def enqueue_until_closed(oxide=oxide):
            for _ in range(50):
                try:
                    oxide.enqueue(x, y)
                except ClosedError:
                    return

        run_together(
            lambda index, oxide=oxide: oxide.close() if index == 0 else enqueue_until_closed(),
            [(index,) for index in range(4)],
        )
        oxide.close()
    assert bad == []


def test_collected_graphs_leave_no_entry_in_the_runtime(fake: FakeApi, runtime: CudaRuntime):
    oxide = embed_b1_plan(runtime)
    x, y = runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256)
    for _ in range(1000):
        graph = runtime.capture(lambda: oxide.enqueue(x, y))
        del graph
    gc.collect()
    assert runtime._graphs == {}
    assert oxide.producer._graphs == 0
    kept = runtime.capture(lambda: oxide.enqueue(x, y))
    assert len(runtime._graphs) == 1
    kept.close()
    assert runtime._graphs == {}
    oxide.close()


def test_frees_made_during_a_capture_are_all_done_after_it(fake: FakeApi, runtime: CudaRuntime):
    buffers = [runtime.alloc_zeros(4) for _ in range(64)]
    pointers = [buffer._ptr for buffer in buffers]

    def free_from_threads() -> None:
        run_together(lambda buffer: buffer.free(), [(buffer,) for buffer in buffers])

    runtime.capture(free_from_threads).close()
    assert not any(ptr in fake.memory for ptr in pointers)


def test_a_failing_free_does_not_hide_the_planning_error(
    fake: FakeApi, runtime: CudaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernels = runtime.load_kernels(KernelModule.SEGDENSE)
    pin = SegdensePin.forced(Entry.EMBED_B1, CudaMath.FP32, kernels.tier, runtime.device)
    weight = runtime.upload(np.zeros(256 * 5120, np.float32))
    bias = runtime.upload(np.zeros(256, np.float32))

    def failing_sync() -> None:
        raise RuntimeError("the error that matters")

    def failing_free(ptr):
        raise OSError("the cleanup also failed")

    monkeypatch.setattr(runtime, "synchronize", failing_sync)
    monkeypatch.setattr(fake, "cuMemFree", failing_free)
    with pytest.raises(RuntimeError, match="the error that matters"):
        DenseOxide.plan(runtime, kernels, SPEC, weight, bias, pin)


def test_a_callers_scratch_is_kept_alive_and_checked(fake: FakeApi, runtime: CudaRuntime):
    probe = embed_b32_plan(runtime)
    workspace = probe.producer.workspace_len
    probe.close()
    scratch = runtime.alloc_zeros(workspace)
    at = scratch._ptr
    oxide = embed_b32_plan(runtime, scratch=scratch)
    del scratch
    gc.collect()
    assert at in fake.memory  # the plan still holds it
    x, y = runtime.alloc_zeros(96 * 5120), runtime.alloc_zeros(96 * 256)
    oxide.enqueue(x, y)
    with pytest.raises(BufferLayoutError, match="scratch overlaps the input"):
        oxide.enqueue(CaiView(at, 96 * 5120, 0), y)
    with pytest.raises(BufferLengthError, match="scratch has 10 elements"):
        embed_b32_plan(runtime, scratch=runtime.alloc_zeros(10))
    with CudaRuntime(1) as other:
        elsewhere = other.alloc_zeros(workspace)
        with pytest.raises(BufferLayoutError, match="scratch lives on device 1"):
            embed_b32_plan(runtime, scratch=elsewhere)
    oxide.close()


def test_plan_time_reads_wait_for_the_buffers_producer_streams(fake: FakeApi, runtime: CudaRuntime):
    weight = runtime.upload(np.zeros(256 * 5120, np.float32))
    bias = runtime.upload(np.zeros(256, np.float32))
    events: list[object] = []  # streams waited on, copies to the host and launches
    synchronize, to_host, launch = (
        fake.cuStreamSynchronize,
        fake.cuMemcpyDtoHAsync,
        fake.cuLaunchKernel,
    )

    def record_wait(stream):
        events.append(int(stream))
        return synchronize(stream)

    def record_copy(host, ptr, nbytes, stream):
        events.append(("to host", int(ptr)))
        return to_host(host, ptr, nbytes, stream)

    def record_launch(f, *args):
        events.append(("launch", f))
        return launch(f, *args)

    fake.cuStreamSynchronize = record_wait
    fake.cuMemcpyDtoHAsync = record_copy
    fake.cuLaunchKernel = record_launch
    embed_b32_plan(
        runtime, CaiView(weight._ptr, 256 * 5120, 0xA11), CaiView(bias._ptr, 256, 0xB22)
    ).close()
    # the bias is read to the host, the weight packed on the device by the gather kernel
    assert events.index(0xB22) < events.index(("to host", bias._ptr))
    assert events.index(0xA11) < events.index(("launch", "fn:spk_segdense_pack_gather"))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["weight", "bias"])
def test_non_finite_weights_are_refused_at_plan_time(
    fake: FakeApi, runtime: CudaRuntime, bad: float, where: str
) -> None:
    weight = np.zeros(256 * 5120, np.float32)
    bias = np.zeros(256, np.float32)
    (weight if where == "weight" else bias)[7] = bad
    embed_b32_plan(runtime).close()  # the runtime keeps the layout's gather map from here on
    before = set(fake.memory)
    uploaded = runtime.upload(weight), runtime.upload(bias)
    with pytest.raises(WeightsOutOfContract, match=f"the {where} holds 1 non-finite"):
        embed_b32_plan(runtime, *uploaded)
    for buffer in uploaded:
        buffer.free()
    assert set(fake.memory) == before  # nothing the failed plan made is left
