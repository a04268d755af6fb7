"""`RunReport`: what one `Engine.apply` measured, read by the corpus mode, the CLI and
the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["RunReport"]


@dataclass
class RunReport:
    """What one `Engine.apply` measured: wall seconds, the seconds of each step, and
    the models' outputs before the host steps."""

    audio_seconds: float
    chunks: int
    seconds: float = 0.0
    steps: dict[str, float] = field(default_factory=dict)
    setup: float = 0.0
    """Seconds from the call to the GPU's first work (reading and uploading the audio),
    part of the segmentation step."""
    gpu: float = 0.0
    """Seconds of the GPU's work, from its first segmentation to its last embedding."""
    overlapped: tuple[str, ...] = ("speaker_counting",)
    """Steps run while the GPU works on the embeddings (off the critical path); the
    speaker counting's time includes the rest of the segmentations' facts
    (`_steps.segmentation_facts`: frame counts, runs of activity, frame sums)."""
    scores: np.ndarray | None = None
    """(chunks, frames, powerset classes) log-probabilities of the segmentation model."""
    embeddings: np.ndarray | None = None
    """(chunks, local speakers, dimension) embeddings, as `get_embeddings` returns."""
    clustering: dict[str, float] = field(default_factory=dict)
    """Seconds of the clustering's parts that pyspk serves ("filter", "linkage",
    "assignment", and with VBx "plda" and "vbx"), and "embeddings_clustered". With the
    device's linkage the PLDA transform runs while it merges, within its seconds."""
    speakers: int = 0
    """Clusters the clustering found (its largest label plus one)."""
