"""The driver door and the runtime, against a fake `cuda.bindings.driver` (no GPU needed)."""

from __future__ import annotations

import gc
import subprocess
import sys
import types

import numpy as np
import pytest

from pyspk.cuda import driver
from pyspk.cuda.buffers import DeviceBuffer
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import (
    BufferLayoutError,
    BufferLengthError,
    CudaError,
    DriverError,
    NoDeviceError,
    NoDriverError,
)
from pyspk.cuda.runtime import CudaRuntime
from pyspk.cuda.tier import ComputeCapability
from tests.device_arrays import device_array
from tests.fake_driver import (
    INSUFFICIENT_DRIVER,
    INVALID_VALUE,
    NO_DEVICE,
    OUT_OF_MEMORY,
    SUCCESS,
    CaiView,
    FakeApi,
    Result,
)


class Interface:
    """An object exposing a chosen __cuda_array_interface__."""

    def __init__(self, **fields: object) -> None:
        self.__cuda_array_interface__ = {
            "version": 3,
            "typestr": "<f4",
            "shape": (2, 3),
            "strides": None,
            "data": (0x7000_0000, False),
        } | fields


# -- call: results and errors ---------------------------------------------------------


def test_call_unwraps_success_tuples(fake: FakeApi) -> None:
    fake.cuNothing = lambda: (SUCCESS,)
    fake.cuOne = lambda x: (SUCCESS, x + 1)
    fake.cuTwo = lambda: (SUCCESS, "a", "b")
    assert driver.call("cuNothing") is None
    assert driver.call("cuOne", 41) == 42
    assert driver.call("cuTwo") == ("a", "b")


def test_failing_call_names_call_result_and_text(fake: FakeApi) -> None:
    with pytest.raises(DriverError) as caught:
        driver.call("cuMemAlloc", 2 << 30)
    error = caught.value
    assert error.call == "cuMemAlloc"
    assert error.result_name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert error.result_text == "text of CUDA_ERROR_OUT_OF_MEMORY"
    assert error.code == OUT_OF_MEMORY
    assert "cuMemAlloc" in str(error) and "CUDA_ERROR_OUT_OF_MEMORY" in str(error)


def test_unknown_result_falls_back_to_enum_or_code(fake: FakeApi) -> None:
    fake.cuOdd = lambda: (Result.CUDA_ERROR_OUT_OF_MEMORY, None)
    fake.cuGetErrorName = lambda status: (INVALID_VALUE, None)
    fake.cuGetErrorString = lambda status: (_ for _ in ()).throw(RuntimeError("broken"))
    with pytest.raises(DriverError) as caught:
        driver.call("cuOdd")
    assert caught.value.result_name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert caught.value.result_text
    fake.cuOdder = lambda: (777,)
    with pytest.raises(DriverError) as caught:
        driver.call("cuOdder")
    assert caught.value.result_name == "CUresult 777"
    assert caught.value.code == 777


# -- loading the driver ---------------------------------------------------------------


def test_missing_binding_is_no_driver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "_api", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    with pytest.raises(NoDriverError, match=r"pip install cuda-bindings"):
        driver.api()
    with pytest.raises(NoDriverError):
        DeviceAttributes.query(0)


def _install_binding(monkeypatch: pytest.MonkeyPatch, module: object) -> None:
    monkeypatch.setattr(driver, "_api", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", module)


def test_missing_libcuda_is_no_driver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    module = FakeApi()

    def no_library(flags: int) -> tuple:
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    module.cuInit = no_library
    _install_binding(monkeypatch, module)
    with pytest.raises(NoDriverError) as caught:
        driver.api()
    message = str(caught.value)
    assert "libcuda.so.1" in message and "install the NVIDIA driver" in message


def test_cuinit_no_device_is_no_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    module = FakeApi()
    module.cuInit = lambda flags: (NO_DEVICE,)
    _install_binding(monkeypatch, module)
    with pytest.raises(NoDeviceError, match="CUDA_ERROR_NO_DEVICE"):
        driver.api()


def test_cuinit_failure_is_no_driver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    module = FakeApi()
    module.cuInit = lambda flags: (INSUFFICIENT_DRIVER,)
    _install_binding(monkeypatch, module)
    with pytest.raises(NoDriverError, match="CUDA_ERROR_INSUFFICIENT_DRIVER"):
        driver.api()


def test_api_initialises_once(monkeypatch: pytest.MonkeyPatch) -> None:
    module = FakeApi()
    count = []
    module.cuInit = lambda flags: count.append(flags) or (SUCCESS,)
    _install_binding(monkeypatch, module)
    assert driver.api() is module
    assert driver.api() is module
    assert count == [0]


def test_importing_pyspk_loads_no_binding() -> None:
    code = (
        "import sys, pyspk, pyspk.cuda, pyspk.cuda.driver, pyspk.cuda.runtime\n"
        "loaded = [m for m in sys.modules if m == 'cuda' or m.startswith('cuda.')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- devices ----------------------------------------------------------------------------


def test_no_device_and_bad_ordinal(fake: FakeApi) -> None:
    with pytest.raises(NoDeviceError, match=r"2 device\(s\)"):
        driver.device(2)
    with pytest.raises(NoDeviceError, match=r"2 device\(s\)"):
        driver.device(-1)
    fake.devices = 0
    with pytest.raises(NoDeviceError, match="no CUDA device"):
        driver.device(0)


def test_device_attributes(fake: FakeApi) -> None:
    attributes = DeviceAttributes.query(1)
    assert attributes == DeviceAttributes(
        ComputeCapability(8, 9),
        multiprocessors=34,
        shared_optin_bytes=101376,
        l2_bytes=32 << 20,
        name="Fake GPU 1",
    )
    assert DeviceAttributes.query(1) == attributes


# -- device_array -----------------------------------------------------------------------


def test_device_array_accepts_float32_contiguous(fake: FakeApi) -> None:
    fake.memory[0x7000_0000] = bytearray(24)
    fake.owner[0x7000_0000] = 0
    assert device_array(Interface(), 6, "plan", "x", 0) == (0x7000_0000, 6)
    assert device_array(Interface(typestr="=f4"), 6, "plan", "x", 0)[1] == 6
    explicit = Interface(strides=(12, 4))
    assert device_array(explicit, 6, "plan", "x", 0)[1] == 6
    # an axis of extent 1 constrains no stride, as numpy and torch treat it
    unit = Interface(shape=(1, 6), strides=(999, 4))
    assert device_array(unit, 6, "plan", "x", 0)[1] == 6


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"typestr": "<f8"}, "typestr '<f8'"),
        ({"typestr": ">f4"}, "typestr '>f4'"),
        ({"typestr": "<f2"}, "typestr '<f2'"),
        ({"strides": (4, 8)}, "not C-contiguous"),
        ({"shape": (2, 3), "strides": (24, 8)}, "not C-contiguous"),
        ({"mask": object()}, "mask"),
        ({"data": (0x7000_0002, False)}, "aligned"),
    ],
)
def test_device_array_refuses_layouts(fake: FakeApi, fields: dict, problem: str) -> None:
    with pytest.raises(BufferLayoutError) as caught:
        device_array(Interface(**fields), 6, "linear0 enqueue", "weights", 0)
    message = str(caught.value)
    assert problem in message
    assert message.startswith("linear0 enqueue: weights ")
    assert isinstance(caught.value, CudaError)


def test_device_array_length(fake: FakeApi) -> None:
    fake.memory[0x7000_0000] = bytearray(24)
    fake.owner[0x7000_0000] = 0
    with pytest.raises(BufferLengthError) as caught:
        device_array(Interface(), 7, "conv1", "y", 0)
    assert (caught.value.expected, caught.value.actual, caught.value.buffer) == (7, 6, "y")


def test_device_array_checks_the_device(fake: FakeApi) -> None:
    fake.memory[0x7000_0000] = bytearray(24)
    fake.owner[0x7000_0000] = 1
    with pytest.raises(BufferLayoutError, match="lives on device 1, expected device 0"):
        device_array(Interface(), 6, "plan", "x", 0)
    assert device_array(Interface(), 6, "plan", "x", 1)[0] == 0x7000_0000
    del fake.memory[0x7000_0000]
    with pytest.raises(BufferLayoutError, match="not CUDA device memory"):
        device_array(Interface(), 6, "plan", "x", 0)


def test_device_array_empty_skips_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "_api", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)  # any driver use fails
    empty = Interface(shape=(0,), data=(0, False))
    assert device_array(empty, 0, "plan", "x", 0) == (0, 0)


def test_device_array_refuses_other_objects(fake: FakeApi) -> None:
    with pytest.raises(BufferLayoutError, match="ndarray, not a DeviceBuffer"):
        device_array(np.zeros(6, np.float32), 6, "plan", "x", 0)

    class Refusing:
        @property
        def __cuda_array_interface__(self) -> dict:
            raise RuntimeError("requires grad")

    with pytest.raises(BufferLayoutError, match="requires grad"):
        device_array(Refusing(), 6, "plan", "x", 0)
    readonly = Interface(data=(0x7000_0000, True))
    with pytest.raises(BufferLayoutError, match="read-only"):
        device_array(readonly, 6, "plan", "y", 0, writable=True)


# -- the runtime on the fake driver ---------------------------------------------------


def test_runtime_round_trip_and_close(fake: FakeApi) -> None:
    runtime = CudaRuntime(0)
    assert fake.context_refs == 1 and int(fake.current) == 0xC0
    assert runtime.device.name == "Fake GPU 0"
    assert runtime.stream_handle in fake.streams
    data = np.arange(6, dtype=np.float64).reshape(2, 3)
    buffer = runtime.upload(data)
    assert isinstance(buffer, DeviceBuffer)
    assert (len(buffer), buffer.len, buffer.nbytes) == (6, 6, 24)
    np.testing.assert_array_equal(runtime.download(buffer), data.ravel().astype(np.float32))
    zeros = runtime.alloc_zeros(6)
    np.testing.assert_array_equal(runtime.download(zeros), np.zeros(6, np.float32))
    runtime.copy(zeros, buffer)
    np.testing.assert_array_equal(runtime.download(zeros), data.ravel())
    with pytest.raises(BufferLengthError):
        runtime.copy(runtime.alloc_zeros(5), buffer)
    interface = buffer.__cuda_array_interface__
    assert interface["shape"] == (6,) and interface["typestr"] == "<f4"
    assert interface["data"] == (buffer.ptr, False) and interface["version"] == 3
    assert device_array(buffer, 6, "plan", "x", 0) == (buffer.ptr, 6)
    with pytest.raises(BufferLayoutError, match="expected device 1"):
        device_array(buffer, 6, "plan", "x", 1)
    empty = runtime.alloc_zeros(0)
    assert empty.ptr == 0 and runtime.download(empty).shape == (0,)

    stream = runtime.stream_handle
    runtime.close()
    runtime.close()
    assert fake.context_refs == 0
    assert fake.memory == {}
    assert stream not in fake.streams
    assert buffer.freed
    with pytest.raises(CudaError, match="freed"):
        _ = buffer.ptr
    with pytest.raises(CudaError, match="closed"):
        runtime.upload(data)


def test_download_of_a_foreign_array_reads_float32_whatever_its_dtype_attribute(
    fake: FakeApi,
) -> None:
    """A PyTorch tensor has a `dtype` of its own (torch.float32, no numpy dtype): without
    a dtype, `download` reads a foreign array as float32, not by that attribute."""
    with CudaRuntime(0) as runtime:
        buffer = runtime.upload(np.array([1.5, -2.0, 3.25], np.float32))
        foreign = CaiView(buffer.ptr, 3)
        foreign.dtype = object()  # type: ignore[attr-defined]
        np.testing.assert_array_equal(runtime.download(foreign), [1.5, -2.0, 3.25])
        assert runtime.download(buffer.prefix(2)).dtype == np.float32


def test_buffers_free_when_dropped(fake: FakeApi) -> None:
    with CudaRuntime(0) as runtime:
        kept = runtime.alloc_zeros(4)
        dropped = runtime.alloc_zeros(4)
        del dropped
        gc.collect()
        assert list(fake.memory) == [kept.ptr]
        kept.free()
        kept.free()
        assert fake.memory == {}
    assert fake.context_refs == 0


def test_capture_and_replay(fake: FakeApi) -> None:
    with CudaRuntime(0) as runtime:
        source = runtime.upload(np.array([1, 2, 3], np.float32))
        target = runtime.alloc_zeros(3)
        graph = runtime.capture(lambda: runtime.copy(target, source))
        np.testing.assert_array_equal(runtime.download(target), np.zeros(3))
        assert fake.graphs == {}  # the template is destroyed once instantiated
        graph.replay()
        np.testing.assert_array_equal(runtime.download(target), [1, 2, 3])
        runtime.copy(target, runtime.alloc_zeros(3))
        graph.replay()
        np.testing.assert_array_equal(runtime.download(target), [1, 2, 3])
        kept = runtime.capture(lambda: None)
        graph.close()
        graph.close()
        with pytest.raises(CudaError, match="closed"):
            graph.replay()
        assert len(fake.execs) == 1
    assert fake.execs == {} and kept.closed


def test_capture_that_raises_ends_the_capture(fake: FakeApi) -> None:
    with CudaRuntime(0) as runtime:

        def broken() -> None:
            runtime.copy(runtime.alloc_zeros(0), runtime.alloc_zeros(0))
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            runtime.capture(broken)
        assert fake.capturing == {} and fake.graphs == {} and fake.execs == {}

        def synchronizes() -> None:
            runtime.synchronize()

        with pytest.raises(DriverError, match="cuStreamSynchronize"):
            runtime.capture(synchronizes)
        assert fake.capturing == {}
        runtime.synchronize()  # the stream is usable again


def test_frees_during_capture_are_deferred(fake: FakeApi) -> None:
    with CudaRuntime(0) as runtime:
        scratch = runtime.alloc_zeros(4)

        def drop() -> None:
            scratch.free()

        graph = runtime.capture(drop)
        assert fake.memory == {}
        graph.close()


def test_adopted_stream_is_not_destroyed(fake: FakeApi) -> None:
    outside = fake.cuStreamCreate(1)[1]

    class TorchLikeStream:
        cuda_stream = int(outside)

    for stream in (int(outside), outside, TorchLikeStream()):
        runtime = CudaRuntime(0, stream=stream)
        assert runtime.stream_handle == int(outside)
        runtime.close()
        assert int(outside) in fake.streams
    with pytest.raises(CudaError, match="another CUDA context"):
        CudaRuntime(0, stream=0xBAD)
    assert fake.context_refs == 0
    with pytest.raises(TypeError):
        CudaRuntime(0, stream="default")
    assert fake.context_refs == 0


def test_runtime_on_missing_device(fake: FakeApi) -> None:
    with pytest.raises(NoDeviceError):
        CudaRuntime(5)
    assert fake.context_refs == 0


def test_load_kernels_caches_and_unloads(fake: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list = []

    class Loaded:
        unloaded = False

        def unload(self) -> None:
            self.unloaded = True

    def load_kernels(module, capability, tier=None):
        loaded.append((module, capability, tier))
        return Loaded()

    kernels = types.ModuleType("pyspk.cuda.kernels")
    kernels.load_kernels = load_kernels
    monkeypatch.setitem(sys.modules, "pyspk.cuda.kernels", kernels)
    monkeypatch.delenv("PYSPK_PTX_TIER", raising=False)
    runtime = CudaRuntime(0)
    first = runtime.load_kernels("segdense")
    assert runtime.load_kernels("segdense") is first
    assert loaded == [("segdense", ComputeCapability(8, 9), None)]
    runtime.close()
    assert first.unloaded
