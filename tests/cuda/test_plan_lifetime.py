"""Plan lifetime and buffer rules against the fake driver (no GPU): nothing launches from
a closed plan or runtime, a live captured graph keeps its plans' buffers, an output that
shares bytes with the input is refused, concurrent enqueues launch with their own
buffers, and an entry the module lacks is a `PlanError`."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.candidate.segdense import DenseOxide, Entry, SegdensePin
from pyspk.cuda import CudaMath, CudaRuntime
from pyspk.cuda.kernels import load_kernels
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.tier import PtxTier
from pyspk.errors import (
    BufferLayoutError,
    BufferLengthError,
    ClosedError,
    DeviceUnsupported,
    PlanError,
)
from tests.concurrency import run_together
from tests.embed_plans import KERNEL, SPEC, embed_b1_plan, embed_b32_plan
from tests.fake_driver import CaiView, FakeApi


def _main_launches(fake: FakeApi) -> int:
    return sum(launch[0] == KERNEL for launch in fake.launches)


def test_a_closed_plan_launches_nothing(fake: FakeApi, runtime: CudaRuntime) -> None:
    oxide = embed_b1_plan(runtime)
    x, y = runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256)
    oxide.enqueue(x, y)
    oxide.close()
    with pytest.raises(ClosedError, match="plan was closed"):
        oxide.enqueue(x, y)
    assert _main_launches(fake) == 1


def test_a_closed_runtime_plans_and_launches_nothing(fake: FakeApi) -> None:
    runtime = CudaRuntime(0)
    kernels = runtime.load_kernels(KernelModule.SEGDENSE)
    oxide = embed_b1_plan(runtime, kernels)
    pin = SegdensePin.forced(Entry.EMBED_B1, CudaMath.FP32, kernels.tier, runtime.device)
    weight = runtime.upload(np.zeros(256 * 5120, np.float32))
    bias = runtime.upload(np.zeros(256, np.float32))
    x, y = runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256)
    runtime.close()
    with pytest.raises(ClosedError, match="runtime of this plan was closed"):
        oxide.enqueue(x, y)
    with pytest.raises(ClosedError, match="the runtime was closed; nothing was planned"):
        DenseOxide.plan(runtime, kernels, SPEC, weight, bias, pin)
    assert _main_launches(fake) == 0


def test_a_live_graph_keeps_the_plan_buffers(fake: FakeApi, runtime: CudaRuntime) -> None:
    """Closing a plan that a captured graph launches defers the free to the graph's end;
    the plan refuses new enqueues at once."""
    embed_b1_plan(runtime).close()  # the runtime keeps the layout's gather map from here on
    before = set(fake.memory)
    oxide = embed_b1_plan(runtime)
    owned = set(fake.memory) - before
    assert len(owned) == 2  # the weight copy and the bias copy
    x, y = runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256)
    graph = runtime.capture(lambda: oxide.enqueue(x, y))
    other = runtime.capture(lambda: oxide.enqueue(x, y))
    oxide.close()
    assert owned <= set(fake.memory)
    with pytest.raises(ClosedError):
        oxide.enqueue(x, y)
    graph.close()
    assert owned <= set(fake.memory)  # the second graph still launches it
    del other  # collected, not closed
    import gc

    gc.collect()
    assert not owned & set(fake.memory)


def test_an_output_over_the_input_is_refused(fake: FakeApi, runtime: CudaRuntime) -> None:
    oxide = embed_b1_plan(runtime)
    both = runtime.alloc_zeros(3 * 5120 + 3 * 256)
    x = both
    # a view of the last 768 floats of the same allocation, as PyTorch would hand it over
    y = CaiView(both.ptr + 4 * (3 * 5120 - 1), 3 * 256)
    with pytest.raises(BufferLayoutError, match="output shares bytes with input"):
        oxide.enqueue(CaiView(x.ptr, 3 * 5120), y)
    assert _main_launches(fake) == 0
    oxide.enqueue(CaiView(x.ptr, 3 * 5120), CaiView(both.ptr + 4 * 3 * 5120, 3 * 256))  # adjacent
    assert _main_launches(fake) == 1


def test_concurrent_enqueues_launch_their_own_buffers(fake: FakeApi, runtime: CudaRuntime) -> None:
    oxide = embed_b1_plan(runtime)
    fake.read_params = (0, 6)  # x and y
    pairs = [(runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256)) for _ in range(8)]

    def drive(x, y) -> None:
        for _ in range(300):
            oxide.enqueue(x, y)

    run_together(drive, pairs)
    launched = [(x, y) for kernel, x, y in fake.param_values if kernel == KERNEL]
    assert sorted(launched) == sorted((x.ptr, y.ptr) for x, y in pairs for _ in range(300))


def test_an_entry_the_module_lacks_is_a_plan_error(fake: FakeApi, runtime: CudaRuntime) -> None:
    kernels = load_kernels(KernelModule.SEGDENSE, runtime.device.capability, PtxTier.SM80)
    del kernels._kernels["spk_segdense_embed_b1"]
    with pytest.raises(DeviceUnsupported, match="spk_segdense_embed_b1 cannot run here") as caught:
        embed_b1_plan(runtime, kernels)
    assert isinstance(caught.value, PlanError)


def test_an_enqueue_on_a_given_stream_launches_there(fake: FakeApi, runtime: CudaRuntime) -> None:
    """`stream=` (a raw handle, as torch's `cuda_stream`) takes the launch off the
    runtime's stream for that call only; with timing phases it is refused."""
    oxide = embed_b1_plan(runtime)
    x, y = runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256)
    oxide.enqueue(x, y, stream=0x5EED)
    oxide.enqueue(x, y)
    streams = [int(launch[4]) for launch in fake.launches if launch[0] == KERNEL]
    assert streams == [0x5EED, int(runtime.stream)]
    with pytest.raises(ValueError, match="give no stream"):
        oxide.enqueue(x, y, RecordingPhases(), stream=0x5EED)
    assert _main_launches(fake) == 2


class RecordingPhases:
    def op(self, op: object, launch: object) -> None:
        raise AssertionError("not reached")


def test_a_callers_partials_serve_one_enqueue(fake: FakeApi, runtime: CudaRuntime) -> None:
    """`partials=` points the split-K launch and its reduction at the caller's scratch for
    that call; the next call without it goes back to the plan's own."""
    oxide = embed_b32_plan(runtime)
    producer = oxide.producer
    x, y = runtime.alloc_zeros(96 * 5120), runtime.alloc_zeros(96 * 256)
    mine = runtime.alloc_zeros(producer.workspace_len)
    fake.read_params = (0,)  # the main launch's x, the reduction's partials
    oxide.enqueue(x, y, partials=mine)
    oxide.enqueue(x, y)
    reduce_reads = [values[0] for f, *values in fake.param_values if "reduce" in str(f)]
    assert reduce_reads == [mine.ptr, producer._own_partials]
    assert producer._own_partials not in (0, mine.ptr)
    main = producer._main
    oxide.enqueue(x, y, partials=mine)
    assert main.value("y") == mine.ptr and main.value("y_len") == producer.workspace_len


def test_partials_are_checked(fake: FakeApi, runtime: CudaRuntime) -> None:
    split = embed_b32_plan(runtime)
    single = embed_b1_plan(runtime)
    x, y = runtime.alloc_zeros(96 * 5120), runtime.alloc_zeros(96 * 256)
    launches = len(fake.launches)
    with pytest.raises(BufferLengthError, match="partials"):
        split.enqueue(x, y, partials=runtime.alloc_zeros(split.producer.workspace_len - 1))
    workspace = split.producer.workspace_len
    both = runtime.alloc_zeros(96 * 5120 + workspace)
    # partials that begin on the input's last float
    over = CaiView(both.ptr + 4 * (96 * 5120 - 1), workspace)
    with pytest.raises(BufferLayoutError, match="partials overlaps the input"):
        split.enqueue(CaiView(both.ptr, 96 * 5120), y, partials=over)
    with pytest.raises(BufferLayoutError, match="without split-K"):
        single.enqueue(runtime.alloc_zeros(3 * 5120), runtime.alloc_zeros(3 * 256), partials=y)
    assert len(fake.launches) == launches  # nothing launched
