"""The driver and runtime on a real device, and their interplay with PyTorch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from pyspk.cuda import driver
from pyspk.cuda.buffers import DeviceBuffer
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import BufferLayoutError, BufferLengthError, CudaError, DriverError
from pyspk.cuda.runtime import CudaRuntime
from pyspk.cuda.tier import ComputeCapability
from tests.device_arrays import device_array

pytestmark = pytest.mark.gpu

TWO = 0x40000000  # the bits of 2.0f


@pytest.fixture
def runtime() -> Iterator[CudaRuntime]:
    with CudaRuntime(0) as opened:
        yield opened


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    return torch


def _memset(runtime: CudaRuntime, buffer: DeviceBuffer, bits: int) -> None:
    ptr = driver.api().CUdeviceptr(buffer.ptr)
    driver.call("cuMemsetD32Async", ptr, bits, buffer.len, runtime.stream)


def test_device_attributes() -> None:
    attributes = DeviceAttributes.query(0)
    assert attributes.capability >= ComputeCapability(7, 5)
    assert attributes.multiprocessors > 0
    assert attributes.shared_optin_bytes >= 48 * 1024
    assert attributes.l2_bytes > 0
    assert attributes.name and "\0" not in attributes.name
    assert driver.device_count() >= 1


def test_driver_error_is_named() -> None:
    with pytest.raises(DriverError) as caught:
        driver.call("cuMemAlloc", 1 << 60)
    assert caught.value.call == "cuMemAlloc"
    assert caught.value.result_name.startswith("CUDA_ERROR_")
    assert caught.value.result_text


def test_upload_download_round_trip(runtime: CudaRuntime) -> None:
    data = np.random.default_rng(7).standard_normal((37, 29)).astype(np.float32)
    buffer = runtime.upload(data)
    assert len(buffer) == data.size and buffer.nbytes == data.nbytes
    np.testing.assert_array_equal(runtime.download(buffer), data.ravel())
    # non-contiguous and float64 host arrays are converted
    np.testing.assert_array_equal(
        runtime.download(runtime.upload(data.T.astype(np.float64))), data.T.ravel()
    )


def test_alloc_zeros_is_zero(runtime: CudaRuntime) -> None:
    count = 1 << 20
    runtime.upload(np.full(count, np.nan, np.float32)).free()  # leave garbage behind
    zeros = runtime.alloc_zeros(count)
    assert not np.any(runtime.download(zeros))
    assert runtime.download(runtime.alloc_zeros(0)).shape == (0,)


def test_copy(runtime: CudaRuntime) -> None:
    data = np.arange(1000, dtype=np.float32)
    source = runtime.upload(data)
    target = runtime.alloc_zeros(1000)
    runtime.copy(target, source)
    np.testing.assert_array_equal(runtime.download(target), data)
    with pytest.raises(BufferLengthError):
        runtime.copy(runtime.alloc_zeros(999), source)


def test_capture_replays_memset_and_copy(runtime: CudaRuntime) -> None:
    first = runtime.alloc_zeros(4096)
    second = runtime.alloc_zeros(4096)

    def sequence() -> None:
        _memset(runtime, first, TWO)
        runtime.copy(second, first)

    graph = runtime.capture(sequence)
    runtime.synchronize()
    assert not np.any(runtime.download(second)), "capturing must not run the work"
    for _ in range(2):
        runtime.copy(second, runtime.alloc_zeros(4096))
        graph.replay()
        runtime.synchronize()
        assert np.all(runtime.download(second) == 2.0)
    graph.close()
    graph.close()
    with pytest.raises(CudaError):
        graph.replay()


def test_capture_that_raises_leaves_stream_usable(runtime: CudaRuntime) -> None:
    buffer = runtime.alloc_zeros(16)

    def broken() -> None:
        _memset(runtime, buffer, TWO)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        runtime.capture(broken)
    runtime.synchronize()
    assert not np.any(runtime.download(buffer)), "the abandoned capture must not run"
    graph = runtime.capture(lambda: _memset(runtime, buffer, TWO))
    graph.replay()
    assert np.all(runtime.download(buffer) == 2.0)


def test_close_is_idempotent() -> None:
    runtime = CudaRuntime(0)
    buffer = runtime.upload(np.ones(8, np.float32))
    graph = runtime.capture(lambda: _memset(runtime, buffer, 0))
    runtime.close()
    runtime.close()
    assert runtime.closed and buffer.freed and graph.closed
    with pytest.raises(CudaError):
        runtime.alloc_zeros(4)
    # a fresh runtime retains the primary context again
    with CudaRuntime(0) as again:
        assert again.download(again.upload(np.ones(3, np.float32))).tolist() == [1, 1, 1]


def test_torch_tensor_through_device_array(runtime: CudaRuntime, torch) -> None:
    tensor = torch.arange(12, dtype=torch.float32, device="cuda:0")
    assert device_array(tensor, 12, "test", "x", 0) == (tensor.data_ptr(), 12)
    assert device_array(tensor.view(3, 4), 12, "test", "x", 0)[1] == 12
    with pytest.raises(BufferLayoutError, match="float32"):
        device_array(tensor.double(), 12, "test", "x", 0)
    with pytest.raises(BufferLayoutError, match="C-contiguous"):
        device_array(tensor.view(3, 4)[:, ::2], 6, "test", "x", 0)
    with pytest.raises(BufferLengthError):
        device_array(tensor, 13, "test", "x", 0)
    with pytest.raises(BufferLayoutError):
        device_array(tensor.clone().requires_grad_(), 12, "test", "x", 0)
    with pytest.raises(BufferLayoutError):
        device_array(tensor.cpu(), 12, "test", "x", 0)
    if torch.cuda.device_count() > 1:
        other = tensor.to("cuda:1")
        with pytest.raises(BufferLayoutError, match="device 1"):
            device_array(other, 12, "test", "x", 0)


def test_shares_the_primary_context_with_torch(runtime: CudaRuntime, torch) -> None:
    tensor = torch.randn(1000, device="cuda:0")
    torch.cuda.synchronize()
    buffer = runtime.alloc_zeros(1000)
    runtime.copy(buffer, tensor)
    np.testing.assert_array_equal(runtime.download(buffer), tensor.cpu().numpy())
    np.testing.assert_array_equal(runtime.download(tensor), tensor.cpu().numpy())

    data = np.linspace(-1, 1, 500, dtype=np.float32)
    uploaded = runtime.upload(data)
    view = torch.as_tensor(uploaded, device="cuda:0")
    assert view.data_ptr() == uploaded.ptr
    np.testing.assert_array_equal(view.cpu().numpy(), data)


def test_capture_accepts_torch_tensors(runtime: CudaRuntime, torch) -> None:
    # plan entry points check foreign buffers while being captured
    tensor = torch.full((256,), 3.0, device="cuda:0")
    torch.cuda.synchronize()
    buffer = runtime.alloc_zeros(256)
    graph = runtime.capture(lambda: runtime.copy(buffer, tensor))
    graph.replay()
    assert np.all(runtime.download(buffer) == 3.0)


def test_adopts_a_torch_stream(torch) -> None:
    stream = torch.cuda.Stream(device=0)
    with CudaRuntime(0, stream=stream) as runtime:
        assert runtime.stream_handle == stream.cuda_stream
        buffer = runtime.alloc_zeros(64)
        graph = runtime.capture(lambda: _memset(runtime, buffer, TWO))
        graph.replay()
        assert np.all(runtime.download(buffer) == 2.0)
    # the runtime did not destroy the stream it adopted
    with torch.cuda.stream(stream):
        ones = torch.ones(4, device="cuda:0") * 2
    stream.synchronize()
    assert ones.sum().item() == 8
    with CudaRuntime(0, stream=int(stream.cuda_stream)) as runtime:
        assert runtime.stream_handle == stream.cuda_stream
