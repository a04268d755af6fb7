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
