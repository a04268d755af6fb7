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
