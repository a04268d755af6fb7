"""A device's primary context and one stream, with device buffers and CUDA graphs.

`CudaRuntime` retains the device's primary context, the one the CUDA runtime (and so
PyTorch and CuPy) uses, so pointers and streams pass freely between them and pyspk in one
process. It owns a non-blocking stream or adopts a caller's. `buffer_interface` is the one
check every plan entry point applies to the buffers it is given (`pyspk.cuda.buffers`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pyspk.cuda import driver
from pyspk.cuda.buffers import (
    FLOAT32,
    BufferPrefix,
    DeviceBuffer,
    buffer_interface,
    supported_dtype,
)
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import (
    ClosedError,
    CudaError,
    DriverError,
    InvalidArgument,
    check_len,
)
from pyspk.cuda.tier import PtxTier

if TYPE_CHECKING:
    from pyspk.cuda.kernels import LoadedKernels
    from pyspk.cuda.manifest import KernelModule

__all__ = ["CudaRuntime", "Graph", "abandon_capture", "free_after_error"]

_GRAPH_TOKENS = itertools.count(1)


class GraphUser(Protocol):
    """What a captured graph tells the plans it launches: that it holds them, and that it
    is gone (a plan closed meanwhile frees its buffers then)."""

    def graph_opened(self) -> None: ...

    def graph_closed(self) -> None: ...


def _release_graph(
    runtime: CudaRuntime, token: int, executable: Any, users: tuple[GraphUser, ...]
) -> None:
    """The collector's path for a graph never closed: forget it, destroy it, then tell
    its users (on whatever thread collects it: never raise)."""
    runtime._graphs.pop(token, None)
    try:
        runtime._destroy_graph_quietly(executable)
    finally:
        for user in users:
            _quietly(user.graph_closed)


class Graph:
    """An instantiated CUDA graph captured on a runtime's stream."""

    def __init__(
        self, runtime: CudaRuntime, executable: Any, users: tuple[GraphUser, ...] = ()
    ) -> None:
        self._runtime = runtime
        self._exec = executable
        # the plans whose launches the graph holds stay alive and keep their buffers
        # until the graph is destroyed, whether by close() or by the collector
        for user in users:
            user.graph_opened()
        token = next(_GRAPH_TOKENS)
        self._finalizer = weakref.finalize(self, _release_graph, runtime, token, executable, users)
        self._finalizer.atexit = False
        self._token = token
        runtime._graphs[token] = self._finalizer

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def replay(self) -> None:
        """Launch the graph on the runtime's stream; returns without waiting for it."""
        if self.closed:
            raise ClosedError("Graph.replay: the graph was closed")
        self._runtime._make_current()
        driver.call("cuGraphLaunch", self._exec, self._runtime.stream)

    def close(self) -> None:
        """Destroy the executable graph (idempotent), then let the plans it used free
        what they deferred."""
        detached = self._finalizer.detach()
        if detached is not None:
            self._runtime._graphs.pop(self._token, None)
            _, _, (runtime, _, executable, users), _ = detached
            try:
                runtime._destroy_graph(executable)
            finally:
                for user in users:
                    user.graph_closed()

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CudaRuntime:
    """Device `ordinal`'s primary context made current, and a stream to enqueue on.

    `stream` is None (the runtime creates and later destroys a non-blocking stream), or a
    stream it adopts and never destroys: an int handle, a `CUstream`, or an object with
    a `cuda_stream` attribute (torch.cuda.Stream) or `__cuda_stream__` method.
    """

    def __init__(
        self,
        ordinal: int = 0,
        ptx_tier: PtxTier | None = None,
        stream: int | object | None = None,
    ) -> None:
        self._closed = True  # until the context is held, close() has nothing to undo
        self._allocations: dict[int, weakref.finalize] = {}
        # the live graphs by token; a collected graph's finalizer removes its own entry
        self._graphs: dict[int, weakref.finalize] = {}
        self._kernels: dict[Any, Any] = {}
        self._kernels_lock = threading.Lock()  # one load per module, whatever the threads
        self._constants: dict[Hashable, DeviceBuffer] = {}
        self._constants_lock = threading.Lock()
        self._capturing = 0
        self._deferred: list[int] = []
        self._deferred_lock = threading.Lock()
        self._capture_users: list[GraphUser] = []
        self._ordinal = operator.index(ordinal)
        self._ptx_tier = ptx_tier if ptx_tier is not None else PtxTier.from_env()
        api = driver.api()
        self._device = DeviceAttributes.query(self._ordinal)
        self._cudevice = driver.call("cuDeviceGet", self._ordinal)
        self._context = driver.call("cuDevicePrimaryCtxRetain", self._cudevice)
        self._context_handle = int(self._context)
        self._closed = False
        try:
            driver.call("cuCtxSetCurrent", self._context)
            self._stream_source = stream  # keeps an adopted stream's owner alive
            if stream is None:
                flags = int(api.CUstream_flags.CU_STREAM_NON_BLOCKING)
                self._stream = driver.call("cuStreamCreate", flags)
                self._owns_stream = True
            else:
                self._stream = _adopt_stream(api, stream)
                self._owns_stream = False
                self._check_stream_context()
        except BaseException:
            self._owns_stream = False
            self.close()
            raise

    # -- properties ------------------------------------------------------------------

    @property
    def device(self) -> DeviceAttributes:
        return self._device

    @property
    def ordinal(self) -> int:
        return self._ordinal

    @property
    def ptx_tier(self) -> PtxTier | None:
        """The tier asked for (argument, else PYSPK_PTX_TIER), or None for the device's."""
        return self._ptx_tier

    @property
    def stream(self) -> Any:
        """The `CUstream` every operation of this runtime is enqueued on."""
        return self._stream

    @property
    def stream_handle(self) -> int:
        return int(self._stream)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- memory ----------------------------------------------------------------------

    def alloc_zeros(self, count: int, dtype: np.dtype = FLOAT32) -> DeviceBuffer:
        """A buffer of `count` zeros of `dtype` (float32, float64 or int32), already zero
        when this returns."""
        buffer = self._alloc(count, dtype)
        if buffer.len:
            try:
                ptr = driver.api().CUdeviceptr(buffer.ptr)
                words = buffer.nbytes // 4  # every dtype's size is a multiple of 4 bytes
                driver.call("cuMemsetD32Async", ptr, 0, words, self._stream)
                self.synchronize()
            except BaseException:
                _quietly(buffer.free)  # the error being raised is the one to see
                raise
        return buffer

    def free_bytes(self) -> int:
        """The device's free memory now (`cuMemGetInfo`): what others' caches hold, such
        as PyTorch's, counts as taken."""
        self._make_current()
        free, _ = driver.call("cuMemGetInfo")
        return int(free)

    def upload(self, array: np.ndarray, dtype: np.dtype = FLOAT32) -> DeviceBuffer:
        """A new buffer holding `array` flattened, C-ordered, as `dtype` (float32 unless
        given)."""
        host = np.ascontiguousarray(array, dtype=supported_dtype(dtype)).reshape(-1)
        buffer = self._alloc(host.size, host.dtype)
        try:
            self.write(buffer, host)
        except BaseException:
            _quietly(buffer.free)  # the error being raised is the one to see
            raise
        return buffer

    def write(self, buffer: DeviceBuffer, array: np.ndarray) -> None:
        """Copies `array` (flattened, C-ordered, as the buffer's dtype) into the start of
        `buffer`, a live buffer of this runtime's device, and waits for the copy."""
        if buffer.freed or buffer.ordinal != self._ordinal:
            raise InvalidArgument(
                f"CudaRuntime.write: {buffer!r} is no live buffer of device {self._ordinal}"
            )
        values = np.asarray(array)
        if not np.can_cast(values.dtype, buffer.dtype, casting="same_kind"):
            raise InvalidArgument(
                f"CudaRuntime.write: {values.dtype} values do not go into {buffer!r} "
                "without losing their kind; convert them first"
            )
        host = np.ascontiguousarray(values, dtype=buffer.dtype).reshape(-1)
        if host.size > buffer.len:
            raise InvalidArgument(f"CudaRuntime.write: {host.size} elements do not fit {buffer!r}")
        if host.size:
            self._make_current()
            ptr = driver.api().CUdeviceptr(buffer.ptr)
            driver.call("cuMemcpyHtoDAsync", ptr, host.ctypes.data, host.nbytes, self._stream)
            # waiting keeps `host` alive for the copy and makes the data visible to every
            # stream, not only this one
            self.synchronize()

    def download(self, buffer: object, dtype: np.dtype | None = None) -> np.ndarray:
        """Copy a device buffer (DeviceBuffer or CUDA-array-interface object) of `dtype`
        (None: a DeviceBuffer's own, else float32) to a 1-D numpy array, after the work
        pending on its stream and on this runtime's."""
        if dtype is None:  # a DeviceBuffer's or a BufferPrefix's own; a tensor's is not numpy's
            dtype = buffer.dtype if isinstance(buffer, (DeviceBuffer, BufferPrefix)) else FLOAT32
        dtype = supported_dtype(dtype)
        ptr, count, producer = buffer_interface(
            buffer, "CudaRuntime.download", "buffer", self._ordinal, dtype=dtype
        )
        return self.read(ptr, count, producer, dtype)

    def read(
        self, ptr: int, count: int, producer: int | None, dtype: np.dtype = FLOAT32
    ) -> np.ndarray:
        """`count` elements of `dtype` at device address `ptr` (already checked, as
        `buffer_interface` checks a buffer) as a new numpy array, after the work pending
        on the stream `producer` and on this runtime's."""
        host = np.empty(count, dtype=dtype)
        if count:
            self._make_current()
            api = driver.api()
            self.order_after(producer)
            source = api.CUdeviceptr(ptr)
            driver.call("cuMemcpyDtoHAsync", host.ctypes.data, source, host.nbytes, self._stream)
            self.synchronize()
        return host

    def constant(self, key: Hashable, values: Callable[[], np.ndarray]) -> DeviceBuffer:
        """A device copy of the float32 array `values()`, uploaded on the first call with
        `key` and kept for every later one until the runtime closes: tables that plans
        of one shape share (the weight packs' gather maps)."""
        with self._constants_lock:
            buffer = self._constants.get(key)
            if buffer is None or buffer.freed:
                buffer = self.upload(values())
                self._constants[key] = buffer
            return buffer

    def copy(self, dst: object, src: object, dtype: np.dtype = FLOAT32) -> None:
        """Enqueue a device-to-device copy of all of `src` into `dst` (equal lengths, both
        of `dtype`), on the runtime's stream after the work pending on the streams that
        produce them."""
        context = "CudaRuntime.copy"
        dtype = supported_dtype(dtype)
        dst_ptr, dst_len, dst_stream = buffer_interface(
            dst, context, "dst", self._ordinal, writable=True, dtype=dtype
        )
        src_ptr, src_len, src_stream = buffer_interface(
            src, context, "src", self._ordinal, dtype=dtype
        )
        check_len(context, dst_len, src_len, "src")
        if dst_len:
            self.order_after(src_stream)
            self.order_after(dst_stream)
            self._make_current()
            api = driver.api()
            driver.call(
                "cuMemcpyDtoDAsync",
                api.CUdeviceptr(dst_ptr),
                api.CUdeviceptr(src_ptr),
                dst_len * dtype.itemsize,
                self._stream,
            )

    def order_after(self, producer: int | None) -> None:
        """Orders what the runtime enqueues next after the work pending on `producer` (a
        buffer's producer stream, as `producer_stream` gives it; None: nothing to wait
        for). Waits on the host: it serves planning, not the enqueue path."""
        if producer is None or producer == self.stream_handle:
            return
        self._make_current()
        driver.call("cuStreamSynchronize", driver.api().CUstream(producer))

    def synchronize(self) -> None:
        """Wait until everything enqueued on the runtime's stream has finished."""
        self._make_current()
        driver.call("cuStreamSynchronize", self._stream)

    # -- kernels and graphs ----------------------------------------------------------

    def load_kernels(self, module: KernelModule) -> LoadedKernels:
        """The kernels of `module` for this device and tier, loaded once per runtime."""
        if self._closed:
            raise ClosedError("this CudaRuntime is closed")
        with self._kernels_lock:
            loaded = self._kernels.get(module)
            if loaded is None:
                from pyspk.cuda.kernels import load_kernels

                self._make_current()
                loaded = load_kernels(module, self._device.capability, self._ptx_tier)
                self._kernels[module] = loaded
            return loaded

    def capture(self, fn: Callable[[], None]) -> Graph:
        """Record what `fn` enqueues on the runtime's stream into an instantiated graph.

        Nothing runs while capturing. The capture is of the stream, not of the thread:
        whatever any thread enqueues on the runtime's stream meanwhile (a plan's
        enqueue, a copy) is captured too, and runs only when the graph is replayed; keep
        other threads off this stream during a capture. (The capture mode is the
        driver's thread-local one: it only stops this thread from calls that cannot be
        captured.) If `fn` raises, the capture is ended and the error re-raised.
        """
        self._make_current()
        api = driver.api()
        mode = api.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        driver.call("cuStreamBeginCapture", self._stream, mode)
        with self._deferred_lock:
            self._capturing += 1
        users, self._capture_users = self._capture_users, []
        try:
            try:
                fn()
            except BaseException:
                self._abandon_capture()
                raise
            graph = driver.call("cuStreamEndCapture", self._stream)
        finally:
            with self._deferred_lock:
                self._capturing -= 1
            captured, self._capture_users = self._capture_users, users
            self._flush_deferred()
        try:
            executable = _instantiate(api, graph)
        finally:
            # the executable graph does not need its template once instantiated
            _quietly(lambda: driver.call("cuGraphDestroy", graph))
        return Graph(self, executable, tuple(dict.fromkeys(captured)))

    def note_capture_user(self, user: GraphUser) -> None:
        """Called by a plan that enqueues while this runtime captures: the graph will
        hold it (see `GraphUser`)."""
        if self._capturing:
            self._capture_users.append(user)

    def _abandon_capture(self) -> None:
        abandon_capture(self._stream)

    # -- lifetime --------------------------------------------------------------------

    def close(self) -> None:
        """Free what this runtime made and release the primary context (idempotent).

        An adopted stream is left alone. The first error met is raised after every
        resource has been given back.
        """
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []

        def attempt(step: Callable[[], object]) -> None:
            try:
                step()
            except Exception as error:  # keep releasing; report the first failure
                errors.append(error)

        attempt(lambda: driver.call("cuCtxSetCurrent", self._context))
        stream = getattr(self, "_stream", None)
        if stream is not None:
            attempt(lambda: driver.call("cuStreamSynchronize", stream))
        for finalizer in list(self._graphs.values()):
            found = finalizer.detach()
            if found is not None:
                _, _, executable, users = found[2]
                attempt(functools.partial(self._destroy_graph, executable))
                for user in users:
                    attempt(user.graph_closed)
        self._graphs.clear()
        for loaded in self._kernels.values():
            unload = getattr(loaded, "unload", None) or getattr(loaded, "close", None)
            if callable(unload):
                attempt(unload)
        self._kernels.clear()
        with self._deferred_lock:
            pending, self._deferred = self._deferred, []
        for finalizer in list(self._allocations.values()):
            found = finalizer.detach()
            if found is not None:
                pending.append(found[2][0])
        self._allocations.clear()
        for ptr in pending:
            attempt(functools.partial(self._free_now, ptr))
        if stream is not None and self._owns_stream:
            attempt(lambda: driver.call("cuStreamDestroy", stream))
        attempt(lambda: driver.call("cuDevicePrimaryCtxRelease", self._cudevice))
        if errors:
            raise errors[0]

    def __enter__(self) -> CudaRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"stream={self.stream_handle:#x}"
        return f"CudaRuntime(device {self._ordinal}: {self._device.name}, {state})"

    # -- internals -------------------------------------------------------------------

    def _make_current(self) -> None:
        if self._closed:
            raise ClosedError("this CudaRuntime is closed")
        # contexts are current per thread; another library may have switched it
        if int(driver.call("cuCtxGetCurrent")) != self._context_handle:
            driver.call("cuCtxSetCurrent", self._context)

    def _check_stream_context(self) -> None:
        try:
            owner = driver.call("cuStreamGetCtx", self._stream)
        except DriverError:
            return  # some handles (special streams) cannot be asked; the launch will tell
        if int(owner) != self._context_handle:
            raise CudaError(
                f"stream {self.stream_handle:#x} belongs to another CUDA context than the "
                f"primary context of device {self._ordinal}; pass a stream of that device"
            )

    def _alloc(self, count: int, dtype: np.dtype = FLOAT32) -> DeviceBuffer:
        count = operator.index(count)
        dtype = supported_dtype(dtype)
        if count < 0:
            raise InvalidArgument(f"a buffer cannot hold {count} elements")
        if count == 0:
            return DeviceBuffer(self, 0, 0, dtype)  # the driver allocates no zero-byte blocks
        self._make_current()
        ptr = int(driver.call("cuMemAlloc", count * dtype.itemsize))
        return DeviceBuffer(self, ptr, count, dtype)

    def _release(self, ptr: int) -> None:
        self._allocations.pop(ptr, None)
        with self._deferred_lock:
            if self._capturing:
                # freeing is not allowed while a capture is open: it would end the capture
                self._deferred.append(ptr)
                return
        self._free_now(ptr)

    def _release_collected(self, ptr: int) -> None:
        # runs from the garbage collector, on any thread: never raise
        _quietly(lambda: self._release(ptr))

    def _free_now(self, ptr: int) -> None:
        # push/pop so a free never changes which context the calling thread has current
        driver.call("cuCtxPushCurrent", self._context)
        try:
            driver.call("cuMemFree", driver.api().CUdeviceptr(ptr))
        finally:
            driver.call("cuCtxPopCurrent")

    def _flush_deferred(self) -> None:
        with self._deferred_lock:  # a finalizer may append meanwhile: take the list whole
            if self._capturing or not self._deferred:
                return
            pending, self._deferred = self._deferred, []
        for ptr in pending:
            _quietly(functools.partial(self._free_now, ptr))

    def _destroy_graph(self, executable: Any) -> None:
        driver.call("cuGraphExecDestroy", executable)

    def _destroy_graph_quietly(self, executable: Any) -> None:
        _quietly(lambda: self._destroy_graph(executable))


def abandon_capture(stream: Any) -> None:
    """Ends the capture begun on `stream` (a `CUstream`) and drops what it captured; an
    invalidated capture ends with an error and no graph, which is not raised."""
    try:
        graph = driver.call("cuStreamEndCapture", stream)
    except CudaError:
        return
    if graph is not None and int(graph):
        _quietly(lambda: driver.call("cuGraphDestroy", graph))


def free_after_error(buffers: list[DeviceBuffer]) -> None:
    """Frees `buffers` while an error propagates, never raising over it."""
    for buffer in buffers:
        _quietly(buffer.free)


def _quietly(step: Callable[[], object]) -> None:
    # cleanup must not hide the error being handled, nor raise inside the collector
    with contextlib.suppress(Exception):
        step()


def _adopt_stream(api: Any, stream: object) -> Any:
    if isinstance(stream, api.CUstream):
        return stream
    if isinstance(stream, bool):
        raise InvalidArgument("stream must be a stream handle or stream object, not a bool")
    if isinstance(stream, int):
        return api.CUstream(stream)
    protocol = getattr(stream, "__cuda_stream__", None)
    if callable(protocol):
        _version, handle = protocol()
        return api.CUstream(int(handle))
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None:
        return api.CUstream(int(handle))
    raise InvalidArgument(
        f"cannot use a {type(stream).__name__} as a CUDA stream: pass an int handle, a "
        "CUstream, or an object with `cuda_stream` (torch.cuda.Stream) or `__cuda_stream__`"
    )


def _instantiate(api: Any, graph: Any) -> Any:
    # cuda-bindings 12.x has cuGraphInstantiateWithFlags(graph, flags); 13.x removed it and
    # its cuGraphInstantiate takes the same (graph, flags)
    if hasattr(api, "cuGraphInstantiateWithFlags"):
        executable = driver.call("cuGraphInstantiateWithFlags", graph, 0)
    else:
        executable = driver.call("cuGraphInstantiate", graph, 0)
    if isinstance(executable, tuple):  # older bindings also return the error node and log
        executable = executable[0]
    return executable
