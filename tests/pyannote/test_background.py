"""`pyspk.pyannote._background.Background`: setup work on a thread of its own, whose
error the caller gets when it needs the work, with the error as its cause."""

from __future__ import annotations

import threading

import pytest

from pyspk.errors import BackgroundSetupError
from pyspk.pyannote._background import Background


def test_work_runs_on_its_own_thread_and_is_ready_once_done():
    release, ran_on = threading.Event(), []

    def work() -> None:
        ran_on.append(threading.current_thread().name)
        assert release.wait(timeout=60)

    side = Background("pyspk-test-setup", "the test setup", work)
    assert not side.ready()  # still waiting for the release
    release.set()
    assert side.settle() is None
    side.wait()
    assert side.ready()
    assert ran_on == ["pyspk-test-setup"]


def test_a_failure_is_kept_for_the_caller_with_its_cause():
    def work() -> None:
        raise MemoryError("out of device memory")

    side = Background("pyspk-test-setup", "pyspk engine: the embedding setup on cuda:0", work)
    error = side.settle()  # returned, not raised
    assert isinstance(error, MemoryError)
    assert not side.ready()
    for _ in range(2):  # every caller that needs the work gets it
        with pytest.raises(
            BackgroundSetupError, match=r"embedding setup on cuda:0 failed: MemoryError"
        ) as raised:
            side.wait()
        assert raised.value.__cause__ is error
