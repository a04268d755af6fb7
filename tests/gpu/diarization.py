"""What the diarization GPU tests share: a synthetic file as pyannote takes it, and an
output's tracks to compare."""

from __future__ import annotations

from typing import Any


def synthetic_file(torch: Any, seconds: float, seed: int) -> dict:
    """`pyspk.testing.synthetic.recording(seconds, seed)` as an in-memory pyannote file."""
    from pyspk.testing.synthetic import recording

    made = recording(seconds, seed=seed)
    return {"waveform": torch.from_numpy(made.waveform)[None], "sample_rate": 16000, "uri": "t"}


def tracks(output: Any) -> list:
    """The annotation's and the exclusive annotation's tracks, with their labels."""
    return [
        list(output.speaker_diarization.itertracks(yield_label=True)),
        list(output.exclusive_speaker_diarization.itertracks(yield_label=True)),
    ]
