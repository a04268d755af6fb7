"""Every error pyspk raises, importable from this one module.

Three families, by what the caller does about them:
- `PlanError` and its subclasses: this plan cannot be made here. `DeviceUnsupported`,
  `GeometryUnimplemented` and `WeightsOutOfContract` are fallbacks (take the library
  call instead); `GeometryInvalid` is a bug in the call.
- `CudaError` and its subclasses: the driver, the device, a kernel artifact or a buffer.
- Errors of use: `InvalidArgument` (an argument of the wrong type or value),
  `InferenceOnlyError` (a planned module called while autograd records),
  `WeightsChangedError` (its parameters changed after planning) and `TooLongError` (a
  recording this machine's memory cannot hold). None is a fallback.
- `BackgroundSetupError`: setup made on a thread of its own failed (its cause is the
  error); an engine that raises it cannot diarize.

`run_all` runs every step of a cleanup and then raises the first error among them.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspk.candidate.errors import (
    DeviceUnsupported,
    GeometryError,
    GeometryInvalid,
    GeometryUnimplemented,
    PlanError,
    WeightsOutOfContract,
)
from pyspk.cuda.errors import (
    ArtifactError,
    BufferLayoutError,
    BufferLengthError,
    ClosedError,
    CudaError,
    DriverError,
    InvalidArgument,
    KernelMissingError,
    NoDeviceError,
    NoDriverError,
)

__all__ = [
    "ArtifactError",
    "BackgroundSetupError",
    "BufferLayoutError",
    "BufferLengthError",
    "ClosedError",
    "CudaError",
    "DeviceUnsupported",
    "DriverError",
    "FileError",
    "GeometryError",
    "GeometryInvalid",
    "GeometryUnimplemented",
    "InferenceOnlyError",
    "InvalidArgument",
    "KernelMissingError",
    "NoDeviceError",
    "NoDriverError",
    "PlanError",
    "TooLongError",
    "WeightsChangedError",
    "WeightsOutOfContract",
    "run_all",
]


class InferenceOnlyError(RuntimeError):
    """A planned module was called while autograd records: run it under
    `torch.inference_mode()` or `torch.no_grad()`."""


class WeightsChangedError(RuntimeError):
    """A planned module's parameters changed after its plans copied them: call
    `replan()`."""


class BackgroundSetupError(RuntimeError):
    """Setup that ran in the background (`accelerate_pipeline(...,
    embedding_in_background=True)`) failed; its error is the cause. Not a file's
    failure: a corpus run stops and raises it."""


class FileError(Exception):
    """One audio or RTTM file cannot be read or written (`pyspk.files`); the message
    names it. A corpus run records it against that file and goes on."""


class TooLongError(MemoryError):
    """A recording whose diarization needs more memory than the device or the host has
    free, refused before the step that would run out (the message gives the length and
    the memory it would take)."""


def available_host_memory() -> int | None:
    """Bytes the host can still give without swapping (Linux's MemAvailable), or None
    where the system does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run_all(steps: list[Callable[[], None]]) -> None:
    """Runs every step, in order, whatever the others raise; then raises the first
    error (the later ones chained in its notes)."""
    errors: list[BaseException] = []
    for step in steps:
        try:
            step()
        except BaseException as error:  # the rest must still run
            errors.append(error)
    if errors:
        add_note = getattr(errors[0], "add_note", None)  # Python 3.11 and newer
        if add_note is not None:
            for later in errors[1:]:
                add_note(f"also raised while undoing: {type(later).__name__}: {later}")
        raise errors[0]
