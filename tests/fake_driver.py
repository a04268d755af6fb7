"""One fake `cuda.bindings.driver` for the GPU-free tests: memory is host bytearrays,
streams run work at once unless they capture, graphs replay the captured work, modules
resolve every entry but the ones named missing, and launches are recorded."""

from __future__ import annotations

import ctypes
import enum
import time
import types

import numpy as np


class Result(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_INSUFFICIENT_DRIVER = 35
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901


SUCCESS = Result.CUDA_SUCCESS.value
INVALID_VALUE = Result.CUDA_ERROR_INVALID_VALUE.value
OUT_OF_MEMORY = Result.CUDA_ERROR_OUT_OF_MEMORY.value
INSUFFICIENT_DRIVER = Result.CUDA_ERROR_INSUFFICIENT_DRIVER.value
NO_DEVICE = Result.CUDA_ERROR_NO_DEVICE.value
CAPTURE_UNSUPPORTED = Result.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.value
CAPTURE_INVALIDATED = Result.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.value
NAMES = {result.value: result.name for result in Result if result is not Result.CUDA_SUCCESS}


class Handle:
    """An opaque driver handle that converts to int, as the binding's handle types do."""

    def __init__(self, value: int = 0) -> None:
        self.value = int(value)

    def __int__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.value:#x}>"


class CUstream(Handle):
    pass


class CUdeviceptr(Handle):
    pass


class CUcontext(Handle):
    pass


class CUgraph(Handle):
    pass


class CUgraphExec(Handle):
    pass


class CUevent(Handle):
    pass


class DeviceAttribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


class FakeApi(types.SimpleNamespace):
    """A small simulation of the driver: memory is host bytearrays, streams run work at
    once unless they capture, and graphs replay the captured work."""

    def __init__(self, devices: int = 2) -> None:
        super().__init__()
        self.CUstream = CUstream
        self.CUdeviceptr = CUdeviceptr
        self.CUcontext = CUcontext
        self.CUdevice_attribute = DeviceAttribute
        self.CUstream_flags = types.SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
        self.CUevent_flags = types.SimpleNamespace(CU_EVENT_DEFAULT=0, CU_EVENT_DISABLE_TIMING=2)
        self.CUstreamCaptureMode = types.SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)
        self.CUpointer_attribute = types.SimpleNamespace(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL=9)
        self.devices = devices
        self.calls: list[str] = []
        self.memory: dict[int, bytearray] = {}
        self.owner: dict[int, int] = {}  # address -> device ordinal
        self.context_refs = 0
        self.current = CUcontext(0)
        self.stack: list[CUcontext] = []
        self.streams: set[int] = set()
        self.capturing: dict[int, list] = {}
        self.invalidated: set[int] = set()
        self.graphs: dict[int, list] = {}
        self.execs: dict[int, list] = {}
        self.events: set[int] = set()
        # ("record", event, stream) and ("wait", stream, event), in call order
        self.event_calls: list[tuple[str, int, int]] = []
        self.next_handle = 0x1000
        # modules and launches
        self.CUresult = Result
        self.CUfunction_attribute = types.SimpleNamespace(
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8,
            CU_FUNC_ATTRIBUTE_NUM_REGS=4,
            CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES=1,
        )
        self.missing: frozenset[str] = frozenset()
        self.loaded: list[bytes] = []
        self.unloaded: list[object] = []
        self.attributes: list[tuple] = []
        self.launches: list[tuple] = []
        self.launch_status = Result.CUDA_SUCCESS
        # 64-bit parameter slots whose values each launch records, read at launch time
        self.read_params: tuple[int, ...] = ()
        self.param_values: list[tuple[int, ...]] = []
        self.next_address = 0x7F00_0000_0000
        self.shared_optin = 101376  # an sm_89's opt-in shared memory a block (99 KiB)
        self.free_bytes = 20 << 30  # what cuMemGetInfo reports free
        # tensor maps: the enums by name, the sizes' wrappers as plain ints
        self.CUtensorMapDataType = types.SimpleNamespace(
            CU_TENSOR_MAP_DATA_TYPE_UINT64=4, CU_TENSOR_MAP_DATA_TYPE_FLOAT32=7
        )
        self.CUtensorMapInterleave = types.SimpleNamespace(CU_TENSOR_MAP_INTERLEAVE_NONE=0)
        self.CUtensorMapSwizzle = types.SimpleNamespace(CU_TENSOR_MAP_SWIZZLE_NONE=0)
        self.CUtensorMapL2promotion = types.SimpleNamespace(CU_TENSOR_MAP_L2_PROMOTION_L2_128B=2)
        self.CUtensorMapFloatOOBfill = types.SimpleNamespace(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE=0)
        self.cuuint64_t = int
        self.cuuint32_t = int

    def _new(self) -> int:
        self.next_handle += 0x100
        return self.next_handle

    def _enqueue(self, stream: object, work) -> tuple:
        key = int(stream)
        if key in self.capturing:
            self.capturing[key].append(work)
        else:
            work()
        return (SUCCESS,)

    def _block(self, address: int) -> tuple[bytearray, int]:
        for base, block in self.memory.items():
            if base <= address < base + len(block):
                return block, address - base
        raise AssertionError(f"fake: {address:#x} is not allocated")

    # errors and init
    def cuInit(self, flags):
        return (SUCCESS,)

    def cuGetErrorName(self, status):
        name = NAMES.get(int(status))
        return (SUCCESS, name.encode()) if name else (INVALID_VALUE, None)

    def cuGetErrorString(self, status):
        name = NAMES.get(int(status))
        return (SUCCESS, f"text of {name}".encode()) if name else (INVALID_VALUE, None)

    # devices
    def cuDriverGetVersion(self):
        return (SUCCESS, 13000)

    def cuDeviceTotalMem(self, dev):
        return (SUCCESS, 24 << 30)

    def cuDeviceGetCount(self):
        return (SUCCESS, self.devices)

    def cuDeviceGet(self, ordinal):
        return (SUCCESS, ordinal)

    def cuDeviceGetAttribute(self, attribute, dev):
        values = {
            DeviceAttribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 8,
            DeviceAttribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 9,
            DeviceAttribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 34,
            DeviceAttribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: 32 << 20,
            DeviceAttribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: (
                self.shared_optin
            ),
        }
        return (SUCCESS, values[attribute])

    def cuDeviceGetName(self, length, dev):
        return (SUCCESS, b"Fake GPU " + str(dev).encode() + b"\0" * (length - 10))

    # contexts
    def cuDevicePrimaryCtxRetain(self, dev):
        self.context_refs += 1
        return (SUCCESS, CUcontext(0xC0 + dev))

    def cuDevicePrimaryCtxRelease(self, dev):
        self.context_refs -= 1
        return (SUCCESS,)

    def cuCtxSetCurrent(self, ctx):
        self.current = ctx
        return (SUCCESS,)

    def cuCtxGetCurrent(self):
        return (SUCCESS, self.current)

    def cuCtxPushCurrent(self, ctx):
        self.stack.append(self.current)
        self.current = ctx
        return (SUCCESS,)

    def cuCtxPopCurrent(self):
        popped, self.current = self.current, self.stack.pop()
        return (SUCCESS, popped)

    # streams
    def cuStreamCreate(self, flags):
        assert flags == 1, "the runtime's own stream must be non-blocking"
        handle = self._new()
        self.streams.add(handle)
        return (SUCCESS, CUstream(handle))

    def cuStreamDestroy(self, stream):
        self.streams.remove(int(stream))
        return (SUCCESS,)

    def cuStreamGetCtx(self, stream):
        return (SUCCESS, CUcontext(0xC0 if int(stream) != 0xBAD else 0xC1))

    def cuStreamIsCapturing(self, stream):
        return (SUCCESS, 1 if int(stream) in self.capturing else 0)

    def cuStreamWaitEvent(self, stream, event, flags):
        assert int(event) in self.events
        self.event_calls.append(("wait", int(stream), int(event)))
        return (SUCCESS,)

    # events
    def cuEventCreate(self, flags):
        handle = self._new()
        self.events.add(handle)
        return (SUCCESS, CUevent(handle))

    def cuEventRecord(self, event, stream):
        assert int(event) in self.events
        self.event_calls.append(("record", int(event), int(stream)))
        return (SUCCESS,)

    def cuEventDestroy(self, event):
        self.events.remove(int(event))
        return (SUCCESS,)

    def cuStreamSynchronize(self, stream):
        if self.capturing:
            self.invalidated.update(self.capturing)
            return (CAPTURE_UNSUPPORTED,)
        return (SUCCESS,)

    # memory
    def cuMemGetInfo(self):
        self.calls.append("cuMemGetInfo")
        return (SUCCESS, self.free_bytes, 24 << 30)

    def cuMemAlloc(self, nbytes):
        self.calls.append("cuMemAlloc")
        if nbytes > 1 << 30:
            return (Result.CUDA_ERROR_OUT_OF_MEMORY, None)
        # distinct, non-overlapping ranges, as a real allocator's (a 256-byte gap after each)
        address = self.next_address
        self.next_address += (max(nbytes, 1) + 511) // 256 * 256
        self.memory[address] = bytearray(b"\xff" * nbytes)  # garbage until set
        self.owner[address] = int(self.current) - 0xC0
        return (SUCCESS, CUdeviceptr(address))

    def cuMemFree(self, ptr):
        if self.capturing:
            self.invalidated.update(self.capturing)
            return (CAPTURE_UNSUPPORTED,)
        del self.memory[int(ptr)]
        del self.owner[int(ptr)]
        return (SUCCESS,)

    def cuMemsetD32Async(self, ptr, value, count, stream):
        def work() -> None:
            block, offset = self._block(int(ptr))
            block[offset : offset + 4 * count] = np.full(count, value, "<u4").tobytes()

        return self._enqueue(stream, work)

    def cuMemcpyHtoDAsync(self, ptr, host, nbytes, stream):
        def work() -> None:
            block, offset = self._block(int(ptr))
            block[offset : offset + nbytes] = ctypes.string_at(host, nbytes)

        return self._enqueue(stream, work)

    def cuMemcpyDtoHAsync(self, host, ptr, nbytes, stream):
        def work() -> None:
            block, offset = self._block(int(ptr))
            ctypes.memmove(host, bytes(block[offset : offset + nbytes]), nbytes)

        return self._enqueue(stream, work)

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):
        def work() -> None:
            source, at = self._block(int(src))
            data = bytes(source[at : at + nbytes])
            target, to = self._block(int(dst))
            target[to : to + nbytes] = data

        return self._enqueue(stream, work)

    def cuPointerGetAttribute(self, attribute, ptr):
        assert attribute == 9
        for base, block in self.memory.items():
            if base <= int(ptr) < base + len(block):
                return (SUCCESS, self.owner[base])
        return (INVALID_VALUE, None)

    # graphs
    def cuStreamBeginCapture(self, stream, mode):
        assert mode == 1, "capture must be thread-local"
        self.capturing[int(stream)] = []
        return (SUCCESS,)

    def cuStreamEndCapture(self, stream):
        work = self.capturing.pop(int(stream))
        if int(stream) in self.invalidated:
            self.invalidated.discard(int(stream))
            return (CAPTURE_INVALIDATED, None)
        handle = self._new()
        self.graphs[handle] = work
        return (SUCCESS, CUgraph(handle))

    def cuGraphInstantiate(self, graph, flags):
        handle = self._new()
        self.execs[handle] = list(self.graphs[int(graph)])
        return (SUCCESS, CUgraphExec(handle))

    def cuGraphDestroy(self, graph):
        del self.graphs[int(graph)]
        return (SUCCESS,)

    def cuGraphExecDestroy(self, executable):
        del self.execs[int(executable)]
        return (SUCCESS,)

    def cuGraphLaunch(self, executable, stream):
        for work in self.execs[int(executable)]:
            work()
        return (SUCCESS,)

    # modules and launches
    def cuModuleLoadData(self, image):
        self.loaded.append(bytes(image))
        return (SUCCESS, "module")

    def cuModuleUnload(self, module):
        self.unloaded.append(module)
        return (SUCCESS,)

    def cuModuleGetFunction(self, module, name):
        if name.decode() in self.missing:
            return (Result.CUDA_ERROR_NOT_FOUND, None)
        return (SUCCESS, f"fn:{name.decode()}")

    def cuFuncSetAttribute(self, function, attribute, value):
        self.attributes.append((function, attribute, value))
        return (SUCCESS,)

    def cuTensorMapEncodeTiled(
        self, dtype, rank, address, dims, strides, box, element_strides, *modes
    ):
        """A map whose 16 words say what it was made of, as far as they go: the data
        type, the rank, the address, the dimensions, the strides, the box, the element
        strides, then the four modes."""
        self.calls.append("cuTensorMapEncodeTiled")
        words = [dtype, rank, address, *dims, *strides, *box, *element_strides, *modes]
        return (SUCCESS, types.SimpleNamespace(opaque=[*words[:16], *[0] * (16 - len(words))]))

    def cuFuncGetAttribute(self, attribute, function):
        return (SUCCESS, 42)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.launches.append((f, (gx, gy, gz), (bx, by, bz), shared, stream, params, extra))
        if self.read_params:
            time.sleep(0)  # let another thread run between the caller's writes and this read
            slots = (ctypes.c_void_p * (max(self.read_params) + 1)).from_address(params)
            values = [ctypes.c_uint64.from_address(slots[i]).value for i in self.read_params]
            self.param_values.append((f, *values))
        if f == "fn:spk_segdense_pack_gather" and self.launch_status == Result.CUDA_SUCCESS:
            # the one kernel the fake runs (in numpy): plans' weight packs land as on a GPU
            slots = (ctypes.c_void_p * 8).from_address(params)
            src, src_len, table, _, dst, dst_len, bad, _ = (
                ctypes.c_uint64.from_address(slots[i]).value for i in range(8)
            )
            return self._enqueue(
                stream, lambda: self._gather(src, src_len, table, dst, dst_len, bad)
            )
        return (self.launch_status,)

    def _gather(self, src: int, src_len: int, table: int, dst: int, dst_len: int, bad: int) -> None:
        from pyspk.candidate.segdense.packing import gather

        def floats(address: int, count: int) -> np.ndarray:
            block, offset = self._block(address)
            return np.frombuffer(bytes(block[offset : offset + 4 * count]), "<f4")

        weight, entries = floats(src, src_len), floats(table, dst_len).view("<u4")
        packed = gather(weight, entries)
        block, offset = self._block(dst)
        block[offset : offset + 4 * dst_len] = packed.tobytes()
        block, offset = self._block(bad)
        count = np.frombuffer(bytes(block[offset : offset + 4]), "<f4")[0]
        count += np.count_nonzero(~np.isfinite(weight))
        block[offset : offset + 4] = np.float32(count).tobytes()


class CaiView:
    """A float32 device array at `ptr` of `length` by `__cuda_array_interface__`, written
    by `stream` (None: it names none)."""

    def __init__(self, ptr: int, length: int, stream: int | None = None) -> None:
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": (length,),
            "typestr": "<f4",
            "data": (ptr, False),
            "strides": None,
            "stream": stream,
        }
