"""The CUDA side of pyspk: capabilities and tiers, device attributes, errors, and (lazily)
the driver, runtime and kernel modules. Importing this package never loads the driver."""

from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import (
    ArtifactError,
    BufferLengthError,
    CudaError,
    DriverError,
    KernelMissingError,
    NoDeviceError,
    NoDriverError,
    check_len,
)
from pyspk.cuda.math import CudaMath
from pyspk.cuda.tier import ComputeCapability, PtxTier

__all__ = [
    "ArtifactError",
    "BufferLengthError",
    "ComputeCapability",
    "CudaError",
    "CudaMath",
    "DeviceAttributes",
    "DriverError",
    "KernelMissingError",
    "NoDeviceError",
    "NoDriverError",
    "PtxTier",
    "check_len",
]
