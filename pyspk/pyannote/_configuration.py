"""Which pipelines the diarization engine serves (`pyspk.pyannote.engine`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from pyannote.audio.models.embedding.wespeaker import BaseWeSpeakerResNet

from pyspk.pyannote.fbank import Fbank

if TYPE_CHECKING:
    from lightning.fabric.utilities.data import AttributeDict

__all__ = ["unserved_configuration"]


def unserved_configuration(pipeline: Any) -> str | None:
    """Why the engine would run `pipeline`'s stock `apply`, whatever its device (None:
    it serves it): a segmentation model without powerset classes, an embedding model that
    is not a WeSpeaker ResNet (or whose fbank `Fbank` does not reproduce), oracle
    clustering, or models of two sample rates."""
    inference = getattr(pipeline, "_segmentation", None)
    model = getattr(inference, "model", None)
    if model is None or not model.specifications.powerset:
        return "the segmentation model has no powerset classes"
    embedding = getattr(getattr(pipeline, "_embedding", None), "model_", None)
    if not isinstance(embedding, BaseWeSpeakerResNet):
        return "the embedding model is not a pyannote WeSpeaker ResNet"
    reason = Fbank.unsupported(embedding)
    if reason is not None:
        return reason
    if pipeline.klustering == "OracleClustering":
        return "oracle clustering reads the reference, not embeddings"
    # lightning keeps the hyperparameters in an AttributeDict
    if cast("AttributeDict", embedding.hparams).sample_rate != model.hparams.sample_rate:
        return "the two models read different sample rates"
    return None
