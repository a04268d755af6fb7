"""What the diarization GPU tests share: the calibrated random-weight pipeline, a
synthetic file as pyannote takes it, and an output's tracks to compare."""

from __future__ import annotations

from typing import Any


def calibrated_pipeline(torch: Any, pyannote: Any) -> Any:
    """The offline pipeline on the GPU, its PyanNet's classifier fitted to
    `recording(200, seed=11)` so that its output follows the voices."""
    from pyspk.testing.synthetic import recording

    segmentation = pyannote.segmentation_3_0(seed=0, fit_to=recording(200, seed=11), device="cuda")
    built = pyannote.offline_pipeline(segmentation, pyannote.wespeaker_resnet34(seed=1))
    return built.to(torch.device("cuda"))


def synthetic_file(torch: Any, seconds: float, seed: int) -> dict:
    """`pyspk.testing.synthetic.recording(seconds, seed)` as an in-memory pyannote file."""
    from pyspk.testing.synthetic import recording

    return recording(seconds, seed=seed).as_file("t")


def tracks(output: Any) -> list:
    """The annotation's and the exclusive annotation's tracks, with their labels."""
    return [
        list(output.speaker_diarization.itertracks(yield_label=True)),
        list(output.exclusive_speaker_diarization.itertracks(yield_label=True)),
    ]
