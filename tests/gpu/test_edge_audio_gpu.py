"""Edge audio through the accelerated pipeline against the stock one, in FP32 math: each
input gives the stock tracks, or the stock exception's type. The cases are the lengths
around one chunk (0, 5, 10, 10.5 and 30 s), a silent hour and an hour of quiet noise
(more than 127 chunks with few or no speakers), samples that are not finite, stereo,
other sample rates, a huge gain and integer samples."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tests.gpu.diarization import calibrated_pipeline, tracks

pytestmark = pytest.mark.gpu

RATE = 16000


def _speech(seconds: float, seed: int = 31) -> np.ndarray:
    from pyspk.testing.synthetic import recording

    return recording(max(seconds, 1.0), seed=seed).waveform[: round(seconds * RATE)]


def _with(values: Callable[[np.ndarray], None], seconds: float = 30.0) -> np.ndarray:
    samples = _speech(seconds).copy()
    values(samples)
    return samples


def _resampled(rate: int) -> tuple[np.ndarray, int]:
    """30 s of the conversation at `rate`, by linear interpolation."""
    samples = _speech(30.0)
    times = np.arange(round(30.0 * rate)) / rate
    return np.interp(times, np.arange(len(samples)) / RATE, samples).astype(np.float32), rate


def _nan_at(index: int) -> Callable[[np.ndarray], None]:
    def put(samples: np.ndarray) -> None:
        samples[index] = np.nan

    return put


CASES: dict[str, Callable[[], tuple[np.ndarray, int]]] = {
    "0 s": lambda: (np.zeros((1, 0), np.float32), RATE),
    "5 s": lambda: (_speech(5.0), RATE),
    "10 s": lambda: (_speech(10.0), RATE),
    "10.5 s": lambda: (_speech(10.5), RATE),
    "30 s": lambda: (_speech(30.0), RATE),
    "silent hour": lambda: (np.zeros(3600 * RATE, np.float32), RATE),
    "quiet noise hour": lambda: (
        (1e-4 * np.random.default_rng(3).standard_normal(3600 * RATE)).astype(np.float32),
        RATE,
    ),
    "all NaN": lambda: (np.full(30 * RATE, np.nan, np.float32), RATE),
    "one NaN": lambda: (_with(_nan_at(12 * RATE)), RATE),
    "one Inf": lambda: (_with(lambda s: s.__setitem__(12 * RATE, np.inf)), RATE),
    "stereo": lambda: (np.stack([_speech(30.0), _speech(30.0, seed=32)]), RATE),
    "8 kHz": lambda: _resampled(8000),
    "44.1 kHz": lambda: _resampled(44100),
    "x1e30": lambda: (_speech(30.0) * np.float32(1e30), RATE),
    "int16": lambda: ((_speech(30.0) * 32767).astype(np.int16), RATE),
}


def _file(torch, name: str) -> dict:
    samples, rate = CASES[name]()
    waveform = torch.from_numpy(np.ascontiguousarray(samples))
    if waveform.dim() == 1:
        waveform = waveform[None]
    return {"waveform": waveform, "sample_rate": rate, "uri": "edge"}


def _outcome(pipeline, file: dict) -> tuple[str, object]:
    try:
        return ("tracks", tracks(pipeline(dict(file))))
    except Exception as error:  # the stock exception, whatever its type
        return ("raises", type(error))


@pytest.fixture(scope="module")
def pipeline(torch, pyannote):
    return calibrated_pipeline(torch, pyannote)


@pytest.fixture(scope="module")
def stock(torch, pipeline) -> dict[str, tuple[str, object]]:
    """Every case's stock outcome, before any acceleration."""
    return {name: _outcome(pipeline, _file(torch, name)) for name in CASES}


@pytest.fixture(scope="module")
def accelerated(torch, pyannote, pipeline, stock) -> dict[str, tuple[str, object]]:
    with pyannote.accelerate_pipeline(pipeline, "fp32"):
        return {name: _outcome(pipeline, _file(torch, name)) for name in CASES}


@pytest.mark.parametrize("name", list(CASES))
def test_edge_audio_gives_the_stock_outcome(stock, accelerated, name) -> None:
    kind, value = stock[name]
    print(f"{name}: stock {kind} {value if kind == 'raises' else len(value[0])}")
    assert accelerated[name] == stock[name]
