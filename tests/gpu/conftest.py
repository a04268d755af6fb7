"""Fixtures of the GPU tests: one runtime and loaded module, and PyTorch, for the session;
each test's start, stamped for CUDA's error log, on request."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from pyspk.cuda.kernels import LoadedKernels
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.runtime import CudaRuntime


@pytest.fixture(autouse=True)
def _start_stamped_as_cuda_logs(request: pytest.FixtureRequest) -> None:
    """With PYSPK_TEST_STARTS=FILE, each GPU test's start appended to FILE, stamped as
    CUDA's error log (CUDA_LOG_FILE) stamps its lines: sorted together, the two files
    say which test made each failing call (docs/kernels.md, "GPU tests")."""
    path = os.environ.get("PYSPK_TEST_STARTS")
    if path:
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
        with open(path, "a") as starts:
            starts.write(f"[{stamp}] start {request.node.nodeid}\n")


@pytest.fixture(scope="session")
def runtime() -> Iterator[CudaRuntime]:
    with CudaRuntime(0) as opened:
        yield opened


@pytest.fixture(scope="session")
def kernels(runtime: CudaRuntime) -> LoadedKernels:
    return runtime.load_kernels(KernelModule.SEGDENSE)


@pytest.fixture(scope="session")
def torch():
    """PyTorch for the library comparisons: skipped without it, but failed when
    PYSPK_REQUIRE_GPU=1 asks for every GPU test (install the `gpu` extra)."""
    required = os.environ.get("PYSPK_REQUIRE_GPU") == "1"
    try:
        import torch
    except ImportError as error:
        if required:
            pytest.fail(
                f"PYSPK_REQUIRE_GPU=1 but PyTorch is missing ({error}); install pyspk[gpu]",
                pytrace=False,
            )
        pytest.skip(f"PyTorch is missing ({error})")
    if not torch.cuda.is_available():
        if required:
            pytest.fail("PYSPK_REQUIRE_GPU=1 but PyTorch has no CUDA device", pytrace=False)
        pytest.skip("PyTorch has no CUDA device")
    return torch


@pytest.fixture(scope="session")
def pyannote(torch):
    """pyspk.pyannote: skipped without pyannote.audio (the `pyannote` extra), failed
    instead when PYSPK_REQUIRE_PYANNOTE=1."""
    import warnings

    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")  # no telemetry
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyannote's notices about optional decoders
            import pyspk.pyannote
    except ImportError as error:
        if os.environ.get("PYSPK_REQUIRE_PYANNOTE") == "1":
            pytest.fail(f"PYSPK_REQUIRE_PYANNOTE=1 but {error}", pytrace=False)
        pytest.skip(f"pyannote.audio is missing ({error})")
    return pyspk.pyannote
