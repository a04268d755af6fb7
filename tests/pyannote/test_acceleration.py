"""Undoing an acceleration, and an engine used after it, without a GPU."""

from __future__ import annotations

import os
import threading
import warnings

import pytest

from tests.optional import importorskip

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch = pytest.importorskip("torch")
    importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")
    from pyspk import pyannote as pa
    from pyspk.cuda import CudaMath
    from pyspk.cuda.errors import ClosedError
    from pyspk.pyannote.engine import Engine


def _steps(ran: list[str], failing: set[str]):
    def step(name: str):
        def run() -> None:
            ran.append(name)
            if name in failing:
                raise RuntimeError(f"{name} failed")

        return run

    return step


def test_acceleration_undo_runs_every_step_then_raises_the_first_error():
    ran: list[str] = []
    step = _steps(ran, {"b", "c"})
    acceleration = pa.Acceleration(torch.nn.Linear(2, 2), CudaMath.FP32)
    for name in "abcd":
        acceleration.on_undo(step(name))
    with pytest.raises(RuntimeError, match="c failed") as raised:
        acceleration.undo()
    assert ran == ["d", "c", "b", "a"]  # the latest first, every one of them
    assert str(raised.value) == "c failed"
    notes = getattr(raised.value, "__notes__", ["b failed"])  # Python 3.10 has no notes
    assert any("b failed" in note for note in notes)
    acceleration.undo()  # done: nothing runs twice
    assert ran == ["d", "c", "b", "a"]


def test_pipeline_acceleration_undo_runs_every_step():
    ran: list[str] = []
    step = _steps(ran, {"apply"})
    acceleration = pa.PipelineAcceleration.__new__(pa.PipelineAcceleration)
    acceleration._steps = [step("models"), step("engine"), step("apply")]
    with pytest.raises(RuntimeError, match="apply failed"):
        acceleration.undo()
    assert ran == ["apply", "engine", "models"]


def test_a_closed_engine_refuses_with_one_clear_error():
    engine = Engine.__new__(Engine)
    engine.pipeline, engine.unserved, engine.closed = object(), None, False
    engine._lock = threading.Lock()
    engine._segments, engine._embeds, engine._linkage, engine._fbank = {}, {}, None, None
    engine._embedding_side = None
    given_back = []
    engine._give_back = [lambda: given_back.append(True)]
    engine.close()
    engine.close()
    assert given_back == [True]  # the streams, once
    with pytest.raises(ClosedError, match="closed"):
        engine.apply({"waveform": torch.zeros(1, 16000), "sample_rate": 16000})


@pytest.mark.parametrize("callers_math", [None, CudaMath.FP32, CudaMath.TF32])
def test_an_apply_waiting_for_the_embedding_side_never_holds_it_off(monkeypatch, callers_math):
    """An FP32 engine's embedding side, made on its own thread, opens its math scope
    before the engine is returned (the caller's own scope, of either math, let go
    meanwhile): an apply that then waits for it inside its own FP32 scope, while
    another thread waits to open a TF32 one, does not wait for good. The switches are
    as before once all ended."""
    import contextlib
    import time
    import types

    from pyspk.pyannote import engine as module
    from pyspk.torch import library_math

    switches = torch.backends.cuda.matmul, torch.backends.cudnn
    before = tuple(switch.allow_tf32 for switch in switches)
    monkeypatch.setattr(
        module, "STREAMS", types.SimpleNamespace(take=lambda d, n: [object()] * n, give_back=len)
    )
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    stream = types.SimpleNamespace(synchronize=lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
    engine = Engine.__new__(Engine)
    engine.device, engine.math, engine._give_back = "cuda:0", CudaMath.FP32, []
    engine._prepare_embedding = lambda graphs, window, stream: None
    release = threading.Event()
    caller = library_math(callers_math) if callers_math else contextlib.nullcontext()
    with caller:  # the embedding model's plans held up until released
        if callers_math is CudaMath.TF32:  # the caller's scope comes back after the side's
            threading.Timer(0.2, release.set).start()
        engine._start_embedding_side(lambda: release.wait(10), True, 160_000)

    def other_math() -> None:
        with library_math(CudaMath.TF32):
            pass

    other = threading.Thread(target=other_math)
    with library_math(CudaMath.FP32):  # the apply's scope
        other.start()
        time.sleep(0.1)  # the other thread waits for the TF32 switches meanwhile
        release.set()
        waiting = threading.Thread(target=engine.settle)  # as `_queue_models` waits
        waiting.start()
        waiting.join(10)
        # the side had to open its scope here before: it waited for the TF32 thread, which
        # waited for this scope to end
        assert not waiting.is_alive(), "the apply and the embedding side wait for each other"
    assert engine.settle() is None
    other.join(5)
    assert not other.is_alive()
    assert len(engine._give_back) == 1  # the capture stream, kept till the engine closes
    assert tuple(switch.allow_tf32 for switch in switches) == before
