"""pyspk: fixed-shape CUDA kernels for the dense layers of a speaker-diarization engine,
called through the CUDA driver API. Importing pyspk never loads the driver.

The top level holds the front door (`plan`), the vocabulary a caller needs to use it and
the base errors; every error class is in `pyspk.errors`, the driver-level pieces in
`pyspk.cuda` and the plan framework in `pyspk.candidate`."""

from pyspk.candidate import BoundaryId, DenseSite, Fp16Policy, SegConvSite
from pyspk.candidate.segdense import DenseOxide, Entry, SegConvOxide, SegdensePin, Site, plan
from pyspk.cuda import CudaMath, CudaRuntime, PtxTier
from pyspk.errors import CudaError, InvalidArgument, PlanError

__version__ = "0.3.0"

__all__ = [
    "BoundaryId",
    "CudaError",
    "CudaMath",
    "CudaRuntime",
    "DenseOxide",
    "DenseSite",
    "Entry",
    "Fp16Policy",
    "InvalidArgument",
    "PlanError",
    "PtxTier",
    "SegConvOxide",
    "SegConvSite",
    "SegdensePin",
    "Site",
    "__version__",
    "plan",
]
