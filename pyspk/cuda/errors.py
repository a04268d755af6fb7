"""The driver-side error family and the buffer length check every launch uses."""

from __future__ import annotations


class CudaError(Exception):
    """Base of every error raised on the driver side of pyspk; `fields` become
    attributes of the error beside its message (the call, the buffer at fault, ...)."""

    def __init__(self, message: str = "", **fields: object) -> None:
        super().__init__(message)
        self.__dict__.update(fields)


class InvalidArgument(TypeError, ValueError):
    """An argument of the wrong type or value (the message names it): a bug in the
    call, never a reason to fall back. A `TypeError` and a `ValueError`, as Python's own
    argument errors are one or the other."""


class DriverError(CudaError):
    """A CUDA driver call returned an error."""

    call: str
    result_name: str
    result_text: str
    code: int

    def __init__(self, call: str, result_name: str, result_text: str, code: int) -> None:
        message = f"{call} failed: {result_name} ({code}): {result_text}"
        super().__init__(
            message, call=call, result_name=result_name, result_text=result_text, code=code
        )


class NoDriverError(CudaError):
    """The CUDA driver library or its Python binding cannot be loaded."""


class NoDeviceError(CudaError):
    """No CUDA device is present, or the ordinal names none."""


class BufferLengthError(CudaError):
    """A buffer does not hold the number of elements its kernel is fixed to."""

    def __init__(self, context: str, expected: int, actual: int, buffer: str = "buffer") -> None:
        message = f"{context}: {buffer} has {actual} elements, expected {expected}"
        fields = {"context": context, "buffer": buffer, "expected": expected, "actual": actual}
        super().__init__(message, **fields)


class BufferLayoutError(CudaError):
    """A device buffer has the wrong dtype, layout or device for the kernel it feeds."""

    def __init__(self, context: str, buffer: str, problem: str) -> None:
        message = f"{context}: {buffer} {problem}"
        super().__init__(message, context=context, buffer=buffer, problem=problem)


class ClosedError(CudaError):
    """A plan, graph or runtime was used after `close()`: nothing was launched."""


class KernelMissingError(CudaError):
    """A kernel module does not export an entry a plan needs."""


class ArtifactError(CudaError):
    """A kernel artifact is missing, altered, or not valid for this device."""


def check_len(context: str, expected: int, actual: int, buffer: str = "buffer") -> None:
    """Raise `BufferLengthError` unless `actual == expected`."""
    if actual != expected:
        raise BufferLengthError(context, expected, actual, buffer)
