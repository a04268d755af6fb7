"""GPU tests carry the `gpu` marker: skipped where no device answers, failing instead
when PYSPK_REQUIRE_GPU=1 so a GPU run cannot pass by skipping. The fixtures of the
GPU-free tests: the fake driver, a runtime opened on it, and an environment that forces
no PTX tier. (tests/gpu/conftest.py gives its tests a real `runtime` instead.)"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspk.cuda import CudaRuntime
    from tests.fake_driver import FakeApi


@functools.cache
def gpu_absent_reason() -> str | None:
    """None when device 0 answers through the driver, else why not."""
    try:
        from pyspk.cuda.device import DeviceAttributes

        DeviceAttributes.query(0)
    except Exception as error:  # any failure to reach a device means: no GPU here
        return f"no CUDA device: {error}"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    reason = gpu_absent_reason()
    if reason is None:
        return
    if os.environ.get("PYSPK_REQUIRE_GPU") == "1":
        pytest.fail(f"PYSPK_REQUIRE_GPU=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    """The fake driver (`tests.fake_driver.FakeApi`) in place of cuda.bindings."""
    from pyspk.cuda import driver
    from tests.fake_driver import FakeApi

    api = FakeApi()
    monkeypatch.setattr(driver, "_api", api)
    return api


@pytest.fixture
def runtime(fake: FakeApi) -> Iterator[CudaRuntime]:
    """Device 0 of the fake driver, closed after the test."""
    from pyspk.cuda import CudaRuntime

    with CudaRuntime(0) as opened:
        yield opened


@pytest.fixture
def no_forced_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    """No PYSPK_PTX_TIER: the tier is the one the device gets."""
    monkeypatch.delenv("PYSPK_PTX_TIER", raising=False)
