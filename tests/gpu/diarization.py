"""What the diarization GPU tests share: the calibrated random-weight pipeline, a
synthetic file as pyannote takes it, and an output's tracks to compare."""

from __future__ import annotations

import threading
from collections.abc import Callable
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


def captured_beside(torch: Any, work: Callable[[], None]) -> bool:
    """Runs `work` in another thread while this thread captures a small CUDA graph (in
    thread-local mode, on a private stream); True when the capture completed and its
    replay gives the graph's result."""
    from pyspk.torch._streams import private_stream

    x = torch.ones(8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(
        graph, stream=private_stream(torch.device("cuda")), capture_error_mode="thread_local"
    ):
        y = x * 2.0
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    graph.replay()
    torch.cuda.synchronize()
    return bool((y == 2.0).all())
