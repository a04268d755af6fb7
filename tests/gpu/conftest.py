"""Session fixtures of the GPU tests: one runtime and loaded module, and PyTorch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyspk.cuda.kernels import KernelModule, LoadedKernels
from pyspk.cuda.runtime import CudaRuntime


@pytest.fixture(scope="session")
def runtime() -> Iterator[CudaRuntime]:
    with CudaRuntime(0) as opened:
        yield opened


@pytest.fixture(scope="session")
def kernels(runtime: CudaRuntime) -> LoadedKernels:
    return runtime.load_kernels(KernelModule.SEGDENSE)


@pytest.fixture(scope="session")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    return torch
