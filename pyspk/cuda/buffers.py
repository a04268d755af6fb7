"""Device buffers (float32, float64 or int32) and the one check every plan entry point
applies to the buffers it is given: a pyspk `DeviceBuffer`, or any object with
`__cuda_array_interface__` (PyTorch tensors, CuPy arrays), of the dtype the entry takes
(float32 unless it says otherwise), C-contiguous, on the right device."""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from pyspk.cuda import driver
from pyspk.cuda.errors import (
    BufferLayoutError,
    CudaError,
    DriverError,
    InvalidArgument,
    check_len,
)


class BufferOwner(Protocol):
    """What a `DeviceBuffer` asks of the runtime that allocated it (a `CudaRuntime`):
    its device and stream, its table of live allocations, and its two frees (now, and
    from the collector's finalizer)."""

    _ordinal: int
    _allocations: dict[int, weakref.finalize]

    @property
    def ordinal(self) -> int: ...

    @property
    def stream_handle(self) -> int: ...

    def _release(self, ptr: int) -> None: ...

    def _release_collected(self, ptr: int) -> None: ...


__all__ = [
    "DTYPES",
    "FLOAT32",
    "FLOAT64",
    "INT32",
    "ITEM_BYTES",
    "DeviceBuffer",
    "buffer_interface",
    "device_address",
    "producer_stream",
]

FLOAT32 = np.dtype("<f4")
FLOAT64 = np.dtype("<f8")
INT32 = np.dtype("<i4")
# the element types a runtime allocates and a plan entry may take; float32 is the default
DTYPES = (FLOAT32, FLOAT64, INT32)
ITEM_BYTES = 4  # float32's, the plans' activations and weights
# __cuda_array_interface__ v3 writes the legacy default stream as 1, never 0
_CAI_LEGACY_STREAM = 1


class DeviceBuffer:
    """A 1-D allocation of `length` elements of `dtype` (one of `DTYPES`) made by a
    `CudaRuntime`; freed by `free()`, by the runtime's `close()`, or when
    garbage-collected."""

    def __init__(
        self, runtime: BufferOwner, ptr: int, length: int, dtype: np.dtype = FLOAT32
    ) -> None:
        self._runtime = runtime
        self._ptr = ptr
        self._len = length
        self.dtype = supported_dtype(dtype)
        self._finalizer: weakref.finalize | None = None
        if ptr:
            self._finalizer = weakref.finalize(self, runtime._release_collected, ptr)
            # at interpreter exit the process frees device memory; do not call the driver
            self._finalizer.atexit = False
            runtime._allocations[ptr] = self._finalizer

    @property
    def freed(self) -> bool:
        return self._ptr != 0 and (self._finalizer is None or not self._finalizer.alive)

    @property
    def ptr(self) -> int:
        """The device address (0 for an empty buffer); `CudaError` once freed."""
        if self.freed:
            raise CudaError(f"{self!r} was freed; its device address is no longer valid")
        return self._ptr

    @property
    def len(self) -> int:
        return self._len

    def __len__(self) -> int:
        return self._len

    @property
    def nbytes(self) -> int:
        return self._len * self.dtype.itemsize

    @property
    def ordinal(self) -> int:
        return self._runtime.ordinal

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        # the data may still be being written on the runtime's stream: name it so a
        # consumer orders its reads after that work (v3 semantics)
        handle = self._runtime.stream_handle
        return {
            "version": 3,
            "shape": (self._len,),
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None,
            "stream": handle if handle != 0 else _CAI_LEGACY_STREAM,
        }

    def prefix(self, count: int) -> BufferPrefix:
        """Its first `count` elements, as a CUDA array that keeps this buffer alive: for
        plans that take exact lengths, on a buffer sized for the largest call."""
        return BufferPrefix(self, count)

    def free(self) -> None:
        """Free the memory now (idempotent)."""
        if self._finalizer is not None and self._finalizer.detach() is not None:
            self._runtime._release(self._ptr)

    def __repr__(self) -> str:
        state = " freed" if self.freed else ""
        kind = "" if self.dtype == FLOAT32 else f", dtype={self.dtype.name}"
        return (
            f"DeviceBuffer(ptr={self._ptr:#x}, len={self._len}{kind}, device={self.ordinal}{state})"
        )


class BufferPrefix:
    """The first `count` elements of a `DeviceBuffer`, by `__cuda_array_interface__`."""

    def __init__(self, buffer: DeviceBuffer, count: int) -> None:
        if not 0 <= count <= buffer.len:
            raise InvalidArgument(f"{buffer!r} has no prefix of {count} elements")
        self.buffer = buffer
        self.count = count
        self.dtype = buffer.dtype

    def __len__(self) -> int:
        return self.count

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {**self.buffer.__cuda_array_interface__, "shape": (self.count,)}


def supported_dtype(dtype: object) -> np.dtype:
    """`dtype` as one of `DTYPES` (little-endian), or `InvalidArgument`."""
    try:
        found = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as error:
        raise InvalidArgument(f"{dtype!r} is no dtype") from error
    found = found.newbyteorder("<") if found.byteorder == ">" else found
    if found not in DTYPES:
        names = ", ".join(kind.name for kind in DTYPES)
        raise InvalidArgument(f"device buffers hold {names}, not {found}")
    return found


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """Whether byte `strides` lay `shape` out densely in C order (extent-1 axes and empty
    arrays place no constraint, as in numpy)."""
    if len(strides) != len(shape):
        return False
    if 0 in shape:
        return True
    expected = itemsize
    for extent, stride in zip(reversed(shape), reversed(strides), strict=True):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def buffer_interface(
    obj: object,
    context: str,
    buffer: str,
    ordinal: int,
    *,
    expected_len: int | None = None,
    writable: bool = False,
    dtype: np.dtype = FLOAT32,
) -> tuple[int, int, int | None]:
    """Check that `obj` is a C-contiguous buffer of `dtype` on device `ordinal` (of
    `expected_len` elements, where given; writable for outputs, so read-only views are
    refused); return its (device pointer, elements, producer stream).

    `obj` is a `DeviceBuffer` or anything exposing `__cuda_array_interface__` (a PyTorch
    CUDA tensor, a CuPy array). Its producer stream is returned, not waited on: the
    caller orders the work after it. Errors name the `buffer` and the `context`."""
    if isinstance(obj, DeviceBuffer):
        if obj.freed:
            raise BufferLayoutError(context, buffer, "is a DeviceBuffer that was freed")
        if obj.ordinal != ordinal:
            raise BufferLayoutError(
                context, buffer, f"lives on device {obj.ordinal}, expected device {ordinal}"
            )
        if obj.dtype != dtype:
            raise BufferLayoutError(
                context, buffer, f"holds {obj.dtype.name}, expected {np.dtype(dtype).name}"
            )
        if expected_len is not None:
            check_len(context, expected_len, obj.len, buffer)
        # its pending writes are on the stream of the runtime that made it
        return obj.ptr, obj.len, obj._runtime.stream_handle

    try:
        cai = obj.__cuda_array_interface__  # type: ignore[attr-defined]
    except AttributeError:
        cai = None
    except Exception as error:  # e.g. torch refuses tensors that require grad
        raise BufferLayoutError(
            context, buffer, f"does not expose its device memory ({error})"
        ) from error
    if not isinstance(cai, Mapping):
        raise BufferLayoutError(
            context,
            buffer,
            f"is a {type(obj).__name__}, not a DeviceBuffer or an object with "
            "__cuda_array_interface__ (a CUDA tensor or array)",
        )
    _check_dtype(cai.get("typestr"), dtype, context, buffer)
    try:
        shape = tuple(int(extent) for extent in cai["shape"])
        ptr = int(cai["data"][0])
        readonly = bool(cai["data"][1])
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise BufferLayoutError(
            context, buffer, f"has a malformed __cuda_array_interface__ ({error!r})"
        ) from error
    strides = cai.get("strides")
    itemsize = np.dtype(dtype).itemsize
    strides = None if strides is None else tuple(int(stride) for stride in strides)
    if strides is not None and not _c_contiguous(shape, strides, itemsize):
        raise BufferLayoutError(
            context,
            buffer,
            f"is not C-contiguous (shape {shape}, byte strides {tuple(strides)}); "
            "pass a contiguous copy",
        )
    if cai.get("mask") is not None:
        raise BufferLayoutError(context, buffer, "has a mask; masked arrays are not supported")
    if writable and readonly:
        raise BufferLayoutError(context, buffer, "is read-only but is written to")
    if ptr % itemsize:
        raise BufferLayoutError(context, buffer, f"address {ptr:#x} is not {itemsize}-byte aligned")
    count = math.prod(shape)
    if expected_len is not None:
        check_len(context, expected_len, count, buffer)
    if ptr != 0 and count > 0:
        _check_device_memory(ptr, context, buffer, ordinal)
    stream = cai.get("stream")
    return ptr, count, (int(stream) if stream is not None else None)


def _check_dtype(typestr: object, expected: np.dtype, context: str, buffer: str) -> None:
    try:
        found = np.dtype(typestr)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        found = None
    if found != expected:
        raise BufferLayoutError(
            context, buffer, f"has typestr {typestr!r}, expected {np.dtype(expected).name}"
        )


def _check_device_memory(ptr: int, context: str, buffer: str, ordinal: int) -> None:
    """`ptr` is device memory of device `ordinal`, as the driver says."""
    try:
        found = driver.pointer_device_ordinal(ptr)
    except DriverError as error:
        raise BufferLayoutError(
            context, buffer, f"address {ptr:#x} is not CUDA device memory ({error.result_name})"
        ) from error
    if found != ordinal:
        raise BufferLayoutError(
            context, buffer, f"lives on device {found}, expected device {ordinal}"
        )


def producer_stream(obj: object, context: str, buffer: str, ordinal: int) -> int | None:
    """The stream whose pending work writes `obj` (a `DeviceBuffer`'s runtime stream,
    or the `stream` of its `__cuda_array_interface__`; None when it names none)."""
    return buffer_interface(obj, context, buffer, ordinal)[2]


def device_address(
    obj: object,
    expected_len: int,
    context: str,
    buffer: str,
    ordinal: int,
    *,
    writable: bool = False,
    dtype: np.dtype = FLOAT32,
) -> int:
    """`buffer_interface`'s pointer, with a fast path for a live `DeviceBuffer` of the right
    length and dtype on `ordinal`, which needs no check beyond those; the enqueue path
    calls this twice per launch, so it is kept to a few attribute reads."""
    if type(obj) is DeviceBuffer:
        finalizer = obj._finalizer
        if (
            finalizer is not None
            and finalizer.alive
            and obj._len == expected_len
            and obj._runtime._ordinal == ordinal
            and obj.dtype == dtype
        ):
            return obj._ptr
    elif dtype == FLOAT32:
        torch = sys.modules.get("torch")
        # a PyTorch tensor answers the same questions directly, several times faster
        # than building its __cuda_array_interface__ and querying the pointer's device
        if (
            torch is not None
            and isinstance(obj, torch.Tensor)
            and obj.dtype is torch.float32
            and not obj.requires_grad
            and obj.get_device() == ordinal
            and obj.is_contiguous()
            and obj.numel() == expected_len
            and obj.data_ptr() % ITEM_BYTES == 0
        ):
            return obj.data_ptr()
    # anything else, and every failure, takes the full check and its error
    return buffer_interface(
        obj, context, buffer, ordinal, expected_len=expected_len, writable=writable, dtype=dtype
    )[0]


KernelBuffer = tuple[str, object, int] | tuple[str, object, int, np.dtype]
"""A kernel buffer to check: (name, buffer, length), float32, or (..., dtype)."""


def kernel_addresses(
    context: str,
    ordinal: int,
    sources: Sequence[KernelBuffer],
    targets: Sequence[KernelBuffer],
    alignment: int,
) -> list[int]:
    """The addresses of a kernel's inputs, then its outputs: `device_address`'s checks
    (the outputs writable), then `BufferLayoutError` where an output shares bytes with
    any other of them (the kernel does not work in place) or where one is not
    `alignment`-byte aligned (its vector accesses would fault)."""
    checked: list[tuple[str, int, int]] = []  # name, address, bytes
    for buffers, writable in ((sources, False), (targets, True)):
        for name, obj, length, *rest in buffers:
            dtype = rest[0] if rest else FLOAT32
            at = device_address(obj, length, context, name, ordinal, writable=writable, dtype=dtype)
            checked.append((name, at, dtype.itemsize * length))
    for index in range(len(sources), len(checked)):
        name, at, size = checked[index]
        for before, (other, other_at, other_size) in enumerate(checked[:index]):
            if other_at < at + size and at < other_at + other_size:
                why = "; the kernel does not work in place" if before < len(sources) else ""
                raise BufferLayoutError(context, name, f"shares bytes with {other}{why}")
    for name, at, _ in checked:
        if at % alignment:
            raise BufferLayoutError(
                context, name, f"address {at:#x} is not {alignment}-byte aligned"
            )
    return [at for _, at, _ in checked]


def source_and_target(
    context: str,
    ordinal: int,
    source: tuple[str, object, int],
    target: tuple[str, object, int],
    alignment: int,
) -> tuple[int, int]:
    """`kernel_addresses` of a float32 kernel's one input and one output."""
    source_at, target_at = kernel_addresses(context, ordinal, [source], [target], alignment)
    return source_at, target_at
