"""pyspk: fixed-shape CUDA kernels for the dense layers of a speaker-diarization engine,
called through the CUDA driver API. Importing pyspk never loads the driver."""

from pyspk.candidate import (
    BoundaryId,
    DenseSite,
    DenseSpec,
    DeviceUnsupported,
    GeometryError,
    GeometryInvalid,
    GeometryUnimplemented,
    Op,
    PlanError,
    SegConvSite,
    SegConvSpec,
    WeightsOutOfContract,
)
from pyspk.candidate.segdense import Area, Entry, SegdensePin, Site
from pyspk.cuda import (
    ArtifactError,
    BufferLengthError,
    ComputeCapability,
    CudaError,
    CudaMath,
    DeviceAttributes,
    DriverError,
    KernelMissingError,
    NoDeviceError,
    NoDriverError,
    PtxTier,
)

__version__ = "0.1.0"

__all__ = [
    "Area",
    "ArtifactError",
    "BoundaryId",
    "BufferLengthError",
    "ComputeCapability",
    "CudaError",
    "CudaMath",
    "DenseSite",
    "DenseSpec",
    "DeviceAttributes",
    "DeviceUnsupported",
    "DriverError",
    "Entry",
    "GeometryError",
    "GeometryInvalid",
    "GeometryUnimplemented",
    "KernelMissingError",
    "NoDeviceError",
    "NoDriverError",
    "Op",
    "PlanError",
    "PtxTier",
    "SegConvSite",
    "SegConvSpec",
    "SegdensePin",
    "Site",
    "WeightsOutOfContract",
    "__version__",
]
