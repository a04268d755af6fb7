"""`pyspk.torch._streams.StreamPool` on the CPU (no stream is created here: the pool's
bookkeeping runs on stand-ins): a stream given back goes under its own device, whatever
device is current, and a `take` that fails part-way keeps the streams it had taken."""

from __future__ import annotations

import types

import pytest

from tests.optional import importorskip

torch = importorskip("torch")
streams = importorskip("pyspk.torch._streams")


def _stream(ordinal: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(device=torch.device("cuda", ordinal))


def test_a_stream_goes_back_under_its_own_device(monkeypatch) -> None:
    pool = streams.StreamPool()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    on_one = _stream(1)
    pool.give_back([on_one])  # device 0 current, as in a finalizer of another thread
    monkeypatch.setattr(streams, "private_stream", lambda device: _stream(device.index))
    assert pool.take(torch.device("cuda", 1), 1) == [on_one]
    assert pool.take(torch.device("cuda", 0), 1)[0] is not on_one


def test_a_take_that_fails_part_way_keeps_what_it_had(monkeypatch) -> None:
    pool = streams.StreamPool()
    idle = _stream(0)
    pool.give_back([idle])

    def refused(device: object) -> object:
        raise RuntimeError("cuStreamCreate: out of resources")

    monkeypatch.setattr(streams, "private_stream", refused)
    with pytest.raises(RuntimeError, match="out of resources"):
        pool.take(torch.device("cuda", 0), 2)
    assert pool.take(torch.device("cuda", 0), 1) == [idle]


def test_two_threads_never_hold_one_stream_at_once(monkeypatch) -> None:
    """Two threads taking and giving back at once: a stream is held by one of them at a
    time, and every stream made comes back to the pool."""
    import threading

    pool = streams.StreamPool()
    made: list[types.SimpleNamespace] = []

    def private_stream(device: object) -> types.SimpleNamespace:
        made.append(_stream(0))
        return made[-1]

    monkeypatch.setattr(streams, "private_stream", private_stream)
    held: set[int] = set()
    clashes: list[int] = []
    guard = threading.Lock()

    def cycle() -> None:
        for _ in range(2000):
            taken = pool.take(torch.device("cuda", 0), 2)
            with guard:
                clashes.extend(id(s) for s in taken if id(s) in held)
                held.update(id(s) for s in taken)
            with guard:
                held.difference_update(id(s) for s in taken)
            pool.give_back(taken)

    threads = [threading.Thread(target=cycle) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clashes == []
    count = len(made)
    assert 2 <= count <= 4 and {id(s) for s in pool.take(torch.device("cuda", 0), count)} == {
        id(s) for s in made
    }
    assert len(made) == count  # all came back: the take made none
