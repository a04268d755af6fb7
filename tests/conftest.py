"""GPU tests carry the `gpu` marker: skipped where no device answers, failing instead
when PYSPK_REQUIRE_GPU=1 so a GPU run cannot pass by skipping."""

from __future__ import annotations

import functools
import os

import pytest


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
def fake(monkeypatch: pytest.MonkeyPatch):
    """The fake driver (`tests.fake_driver.FakeApi`) in place of cuda.bindings."""
    from pyspk.cuda import driver
    from tests.fake_driver import FakeApi

    api = FakeApi()
    monkeypatch.setattr(driver, "_api", api)
    return api
