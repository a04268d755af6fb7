"""The CUDA side of pyspk: capabilities and tiers, device attributes, buffers, and
(lazily) the driver, runtime and kernel modules; its errors are in `pyspk.errors`.
Importing this package never loads the driver."""

from pyspk.cuda.buffers import DeviceBuffer, buffer_interface
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import check_len
from pyspk.cuda.events import EventPhases
from pyspk.cuda.kernels import LoadedKernels
from pyspk.cuda.lifetime import Plan
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.math import CudaMath
from pyspk.cuda.runtime import CudaRuntime, Graph
from pyspk.cuda.tier import ComputeCapability, PtxTier

__all__ = [
    "ComputeCapability",
    "CudaMath",
    "CudaRuntime",
    "DeviceAttributes",
    "DeviceBuffer",
    "EventPhases",
    "Graph",
    "KernelModule",
    "LoadedKernels",
    "Plan",
    "PtxTier",
    "buffer_interface",
    "check_len",
]
