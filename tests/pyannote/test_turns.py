"""`DeviceTurns` on stand-in streams: each stream role's work for a file waits for that
role's work of the file queued before it, whichever thread queued that one; turns are
taken one at a time, a turn that raises still ends, and a turn on another device is
refused."""

from __future__ import annotations

import threading

import pytest

from pyspk.cuda.errors import InvalidArgument
from tests.optional import importorskip

importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")

from pyspk.pyannote import DeviceTurns  # noqa: E402


class _Stream:
    """Logs what a CUDA stream would be asked: events waited for, events recorded."""

    def __init__(self, name: str, log: list[tuple[str, str]], device: int = 0) -> None:
        self.name, self.log, self.device = name, log, device
        self.recorded = 0

    def wait_event(self, event: str) -> None:
        self.log.append((self.name, f"waits {event}"))

    def record_event(self) -> str:
        self.recorded += 1
        event = f"{self.name}#{self.recorded}"
        self.log.append((self.name, f"records {event}"))
        return event


def test_each_role_waits_for_its_role_in_the_turn_before():
    log: list[tuple[str, str]] = []
    turns = DeviceTurns()
    a = (_Stream("a.seg", log), _Stream("a.emb", log))
    b = (_Stream("b.seg", log), _Stream("b.emb", log))
    one = _Stream("c", log)  # an engine without overlap: one stream in both roles
    for streams in (a, b, (one, one)):
        with turns.turn(streams):
            log.append(("caller", "queues"))
    assert log == [
        ("caller", "queues"),
        ("a.seg", "records a.seg#1"),
        ("a.emb", "records a.emb#1"),
        ("b.seg", "waits a.seg#1"),
        ("b.emb", "waits a.emb#1"),
        ("caller", "queues"),
        ("b.seg", "records b.seg#1"),
        ("b.emb", "records b.emb#1"),
        ("c", "waits b.seg#1"),
        ("c", "waits b.emb#1"),
        ("caller", "queues"),
        ("c", "records c#1"),
        ("c", "records c#2"),
    ]
    assert turns.count == 3


def test_two_threads_take_their_turns_one_at_a_time():
    """The second thread's turn begins only once the first's has ended, and then waits
    for the first's events."""
    log: list[tuple[str, str]] = []
    turns = DeviceTurns()
    first_inside, release = threading.Event(), threading.Event()

    def first() -> None:
        with turns.turn((_Stream("a.seg", log), _Stream("a.emb", log))):
            first_inside.set()
            assert release.wait(timeout=30)
            log.append(("a", "queued"))

    def second() -> None:
        assert first_inside.wait(timeout=30)
        with turns.turn((_Stream("b.seg", log), _Stream("b.emb", log))):
            log.append(("b", "queued"))

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert first_inside.wait(timeout=30)
    threading.Event().wait(0.2)  # the second thread has had time to ask for its turn
    assert ("b", "queued") not in log
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    assert log == [
        ("a", "queued"),
        ("a.seg", "records a.seg#1"),
        ("a.emb", "records a.emb#1"),
        ("b.seg", "waits a.seg#1"),
        ("b.emb", "waits a.emb#1"),
        ("b", "queued"),
        ("b.seg", "records b.seg#1"),
        ("b.emb", "records b.emb#1"),
    ]


def test_a_turn_that_raises_ends_and_the_next_one_follows_it():
    log: list[tuple[str, str]] = []
    turns = DeviceTurns()
    with pytest.raises(RuntimeError, match="capture failed"), turns.turn((_Stream("a", log),)):
        raise RuntimeError("capture failed")
    with turns.turn((_Stream("b", log),)):
        pass
    assert log == [("a", "records a#1"), ("b", "waits a#1"), ("b", "records b#1")]
    assert turns.count == 2


def test_a_turn_on_another_device_is_refused_and_the_queue_goes_on():
    log: list[tuple[str, str]] = []
    turns = DeviceTurns()
    with turns.turn((_Stream("a", log, device=0),)):
        pass
    refused = pytest.raises(InvalidArgument, match="a turn on 1, but these turns queue 0")
    with refused, turns.turn((_Stream("b", log, device=1),)):
        pass
    with turns.turn((_Stream("c", log, device=0),)):
        pass
    assert log == [("a", "records a#1"), ("c", "waits a#1"), ("c", "records c#1")]
