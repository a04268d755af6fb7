"""The engine's steps after the models, on the host: pyannote.audio's clustering (with
pyspk's parts, `pyspk.pyannote._clustering`), reconstruction and annotations, each
with the stock result to the bit."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from pyannote.audio.pipelines.speaker_diarization import DiarizeOutput
from pyannote.core import Annotation, SlidingWindowFeature

from pyspk.pyannote import _annotation, _clustering, _steps
from pyspk.pyannote._report import RunReport

if TYPE_CHECKING:
    from pyspk.candidate.cluster import DeviceLinkage

__all__ = ["cluster_and_reconstruct"]


def cluster_and_reconstruct(
    pipeline: Any,
    linkage: DeviceLinkage | None,
    file: Mapping,
    segmentations: SlidingWindowFeature,
    facts: _steps.SegmentationFacts,
    embeddings: np.ndarray,
    num_speakers: int | None,
    min_speakers: int,
    max_speakers: int | float,
    hook: Callable,
    report: RunReport,
) -> DiarizeOutput | Annotation:
    """`pipeline`'s stock `apply` from the clustering on, with `pyspk.pyannote._steps`
    (`linkage`: the centroid linkage on the device, or None for scipy's)."""
    binarized_segmentations = segmentations  # powerset outputs are binary already
    clustering = time.perf_counter()
    hard_clusters, _, centroids = _clustering.cluster(
        pipeline.clustering,
        device_linkage=linkage,
        timings=report.clustering,
        clean=facts.clean,
        frame_sums=facts.frame_sums,
        embeddings=embeddings,
        segmentations=binarized_segmentations,
        num_clusters=num_speakers,
        min_clusters=min_speakers,
        max_clusters=max_speakers,
        file=file,
        frames=pipeline._segmentation.model.receptive_field,
    )
    reconstruction = time.perf_counter()
    report.steps["clustering"] = reconstruction - clustering
    num_different_speakers = int(np.max(hard_clusters)) + 1
    report.speakers = num_different_speakers
    if num_different_speakers < min_speakers or num_different_speakers > max_speakers:
        warnings.warn(  # the stock warning
            f"The detected number of speakers ({num_different_speakers}) for "
            f"{file['uri']} is outside the given bounds [{min_speakers}, {max_speakers}]. "
            "This can happen if the given audio file is too short to contain "
            f"{min_speakers} or more speakers. Try to lower the desired minimal number "
            "of speakers.",
            stacklevel=4,
        )
    count = facts.count
    count.data = np.minimum(count.data, max_speakers).astype(np.int8)
    hard_clusters[facts.inactive] = -2
    exclusive_count = SlidingWindowFeature(
        np.minimum(count.data, 1).astype(np.int8), count.sliding_window
    )
    discrete_diarization, exclusive = _steps.reconstruct_each(
        segmentations, hard_clusters, [count, exclusive_count], facts.runs
    )
    hook("discrete_diarization", discrete_diarization)
    min_duration_off = pipeline.segmentation.min_duration_off
    diarization, exclusive_diarization = (
        _annotation.to_annotation(
            discrete, min_duration_on=0.0, min_duration_off=min_duration_off, uri=file["uri"]
        )
        for discrete in (discrete_diarization, exclusive)
    )
    output = _annotation.name_speakers(
        pipeline, file, diarization, exclusive_diarization, centroids
    )
    report.steps["reconstruction"] = time.perf_counter() - reconstruction
    return output
