"""The CUDA side of pyspk: capabilities and tiers, device attributes, errors, and (lazily)
the driver, runtime and kernel modules. Importing this package never loads the driver."""

from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import (
    ArtifactError,
    BufferLengthError,
    ClosedError,
    CudaError,
    DriverError,
    KernelMissingError,
    NoDeviceError,
    NoDriverError,
    check_len,
)
from pyspk.cuda.events import EventPhases
from pyspk.cuda.kernels import KernelModule, LoadedKernels
from pyspk.cuda.math import CudaMath
from pyspk.cuda.runtime import BufferLayoutError, CudaRuntime, DeviceBuffer, Graph, device_array
from pyspk.cuda.tier import ComputeCapability, PtxTier

__all__ = [
    "ArtifactError",
    "BufferLayoutError",
    "BufferLengthError",
    "ClosedError",
    "ComputeCapability",
    "CudaError",
    "CudaMath",
    "CudaRuntime",
    "DeviceAttributes",
    "DeviceBuffer",
    "DriverError",
    "EventPhases",
    "Graph",
    "KernelMissingError",
    "KernelModule",
    "LoadedKernels",
    "NoDeviceError",
    "NoDriverError",
    "PtxTier",
    "check_len",
    "device_array",
]
