"""Every error pyspk raises, importable from this one module.

Three families, by what the caller does about them:
- `PlanError` and its subclasses: this plan cannot be made here. `DeviceUnsupported`,
  `GeometryUnimplemented` and `WeightsOutOfContract` are fallbacks (take the library
  call instead); `GeometryInvalid` is a bug in the call.
- `CudaError` and its subclasses: the driver, the device, a kernel artifact or a buffer.
- Errors of use: `InvalidArgument` (an argument of the wrong type or value),
  `InferenceOnlyError` (a planned module called while autograd records) and
  `WeightsChangedError` (its parameters changed after planning). None is a fallback.
"""

from __future__ import annotations

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
    "BufferLayoutError",
    "BufferLengthError",
    "ClosedError",
    "CudaError",
    "DeviceUnsupported",
    "DriverError",
    "GeometryError",
    "GeometryInvalid",
    "GeometryUnimplemented",
    "InferenceOnlyError",
    "InvalidArgument",
    "KernelMissingError",
    "NoDeviceError",
    "NoDriverError",
    "PlanError",
    "WeightsChangedError",
    "WeightsOutOfContract",
]


class InferenceOnlyError(RuntimeError):
    """A planned module was called while autograd records: run it under
    `torch.inference_mode()` or `torch.no_grad()`."""


class WeightsChangedError(RuntimeError):
    """A planned module's parameters changed after its plans copied them: call
    `replan()`."""
