"""pyannote.audio's models and pipelines without a download: segmentation-3.0's
`PyanNet` and `WeSpeakerResNet34` with random weights (the PyanNet optionally calibrated
on a synthetic recording so that its output follows the voices), the agglomerative
pipeline the benchmarks build, and community-1's shape: a `SpeakerDiarization` with VBx
clustering over a PLDA fitted to embeddings of known voices, also written as a pipeline
folder that `Pipeline.from_pretrained(folder)` loads as it loads a downloaded one.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from pyannote.audio.models.embedding.wespeaker import BaseWeSpeakerResNet, WeSpeakerResNet34
from pyannote.audio.models.segmentation import PyanNet
from torch import nn

from pyspk.cuda.errors import InvalidArgument
from pyspk.pyannote.plda import fit_plda, write_plda
from pyspk.testing.synthetic import Recording

__all__ = [
    "COMMUNITY_1_OPTIONS",
    "COMMUNITY_1_PARAMETERS",
    "community_1_pipeline",
    "embed_chunks",
    "fit_community_plda",
    "offline_pipeline",
    "segmentation_3_0",
    "speaker_embeddings",
    "wespeaker_resnet34",
    "write_pipeline",
]

COMMUNITY_1_OPTIONS: dict[str, Any] = {
    "clustering": "VBxClustering",
    "embedding_batch_size": 32,
    "embedding_exclude_overlap": True,
    "segmentation_batch_size": 32,
}
"""`SpeakerDiarization`'s arguments in community-1's config.yaml (besides the models)."""

COMMUNITY_1_PARAMETERS: dict[str, Any] = {
    "clustering": {"threshold": 0.6, "Fa": 0.07, "Fb": 0.8},
    "segmentation": {"min_duration_off": 0.0},
}
"""community-1's instantiated hyper-parameters: VBx's AHC threshold, Fa and Fb."""


def segmentation_3_0(
    seed: int | None = None,
    fit_to: Recording | None = None,
    device: torch.device | str | None = None,
) -> PyanNet:
    """A PyanNet with segmentation-3.0's architecture (SincNet stride 10, four BiLSTM
    layers, three speakers in powerset classes) and random weights, built offline (and
    moved to `device`).

    A random PyanNet gives every frame the same class: its linear layers shrink what
    varies over time to a few thousandths of their output. With `fit_to` (a synthetic
    `Recording`) the model is instead calibrated on that recording (10 s chunks every
    3 s): each unit of `linear[0]` and `linear[1]` rescaled to zero mean and unit
    variance over the recording's frames (a data-dependent initialisation), then the
    classifier fitted by ridge regression of one-hot powerset targets on the features it
    receives. Its output then follows the voices, as a trained model's does, with a
    classifier of modest gain, and every step after it has speech turns, silences and
    overlaps to work on."""
    from pyannote.audio.core.task import Problem, Resolution, Specifications

    if seed is not None:
        torch.manual_seed(seed)
    model = PyanNet(sincnet={"stride": 10}, lstm={"num_layers": 4, "dropout": 0.5})
    model.specifications = Specifications(
        problem=Problem.MONO_LABEL_CLASSIFICATION,
        resolution=Resolution.FRAME,
        duration=10.0,
        classes=["speaker#1", "speaker#2", "speaker#3"],
        powerset_max_classes=2,
        permutation_invariant=True,
    )
    model.setup()  # the classifier (128 -> 7) and its LogSoftmax
    model.eval()
    if device is not None:
        model.to(device)
    if fit_to is not None:
        _calibrate(model, fit_to)
    return model


def _calibrate(model: PyanNet, recording: Recording, ridge: float = 1e-3) -> None:
    """`segmentation_3_0`'s calibration on `recording`, in float64, in place."""
    rate = recording.sample_rate
    specifications = model.specifications
    assert not isinstance(specifications, tuple)  # `segmentation_3_0`'s model has one task
    duration = specifications.duration
    window = round(duration * rate)
    starts = np.arange(0, recording.seconds - duration + 1e-9, 3.0)
    chunks = torch.stack(
        [torch.from_numpy(recording.waveform[round(s * rate) :][:window]) for s in starts]
    )[:, None]
    device = next(model.parameters()).device

    def inputs_of(module: nn.Module) -> torch.Tensor:
        captured: list[torch.Tensor] = []
        handle = module.register_forward_pre_hook(lambda _m, a: captured.append(a[0]))
        try:
            with torch.inference_mode():
                for batch in chunks.split(32):
                    model(batch.to(device))
        finally:
            handle.remove()
        return torch.cat(captured).reshape(-1, captured[0].shape[-1]).double().cpu()

    with torch.no_grad():
        for linear in cast("Iterable[nn.Linear]", model.linear):  # a ModuleList of Linears
            x = inputs_of(linear)
            weight, bias = linear.weight.double().cpu(), linear.bias.double().cpu()
            before = x @ weight.T + bias
            mean, scale = before.mean(0), before.std(0) + 1e-12
            linear.weight.copy_(weight / scale[:, None])
            linear.bias.copy_((bias - mean) / scale)
        features = inputs_of(model.classifier)
        frames = model.num_frames(window)
        targets = recording.powerset_targets(starts, frames, duration)
        one_hot = F.one_hot(torch.from_numpy(targets.reshape(-1)), model.classifier.out_features)
        one_hot = one_hot.double()
        mean, prior = features.mean(0), one_hot.mean(0)
        centred = features - mean
        gram = centred.T @ centred
        gram += ridge * len(features) * torch.eye(len(gram), dtype=torch.float64)
        solution = torch.linalg.solve(gram, centred.T @ (one_hot - prior))
        model.classifier.weight.copy_(solution.T)
        model.classifier.bias.copy_(prior - mean @ solution)


def wespeaker_resnet34(seed: int | None = None) -> WeSpeakerResNet34:
    """A WeSpeaker ResNet34 with random weights, built offline."""
    if seed is not None:
        torch.manual_seed(seed)
    return WeSpeakerResNet34().eval()


def offline_pipeline(
    segmentation: PyanNet, embedding: BaseWeSpeakerResNet, batch_size: int = 32
) -> Any:
    """A `SpeakerDiarization` pipeline over these models with agglomerative clustering,
    instantiated with its default segmentation parameters: no download (its PLDA, which
    only VBx clustering reads, is left unloaded)."""
    from pyannote.audio.core.plda import PLDA
    from pyannote.audio.pipelines import SpeakerDiarization

    pipeline = SpeakerDiarization(
        segmentation=segmentation,
        embedding=embedding,
        plda=PLDA.__new__(PLDA),
        clustering="AgglomerativeClustering",
        embedding_batch_size=batch_size,
        segmentation_batch_size=batch_size,
    )
    pipeline.instantiate(
        {
            "segmentation": {"min_duration_off": 0.0},
            "clustering": {"method": "centroid", "min_cluster_size": 12, "threshold": 0.7},
        }
    )
    return pipeline


def embed_chunks(
    model: BaseWeSpeakerResNet, waveforms: torch.Tensor, masks: torch.Tensor
) -> torch.Tensor:
    """`(B, speakers, dimension)` embeddings of `(B, 1, samples)` chunks and their
    `(B, speakers, frames)` masks, the trunk run once per chunk."""
    return model.forward_embedding(model.forward_frames(waveforms), weights=masks)


def speaker_embeddings(
    model: BaseWeSpeakerResNet,
    recording: Recording,
    step: float = 2.0,
    batch: int = 32,
    frames: int = 589,
    min_clean: float = 0.2,
) -> tuple[np.ndarray, np.ndarray]:
    """(n, dimension) embeddings of the voices of `recording` and their n voice names:
    the recording cut into 10 s chunks every `step` seconds, each chunk's voices pooled
    as the diarization pipeline pools its local speakers (masks of `frames` frames,
    frames of overlapped speech left out), keeping the voices that speak alone in at
    least `min_clean` of the chunk's frames, as pyannote's clustering keeps them."""
    rate, duration = recording.sample_rate, 10.0
    window = round(duration * rate)
    starts = np.arange(0.0, recording.seconds - duration + 1e-9, step)
    activity, voices = recording.local_activity(starts, frames, duration)
    clean = activity & (activity.sum(axis=2, keepdims=True) == 1)
    kept = clean.sum(axis=1) >= min_clean * frames  # (chunks, local speakers)
    device = next(model.parameters()).device
    embeddings, names = [], []
    for first in range(0, len(starts), batch):
        rows = range(first, min(first + batch, len(starts)))
        waveforms = torch.stack(
            [torch.from_numpy(recording.waveform[round(starts[r] * rate) :][:window]) for r in rows]
        )[:, None]
        masks = torch.from_numpy(clean[first : rows.stop].transpose(0, 2, 1).astype(np.float32))
        with torch.inference_mode():
            pooled = embed_chunks(model, waveforms.to(device), masks.to(device)).cpu().numpy()
        for row in rows:
            for slot, voice in enumerate(voices[row]):
                if kept[row, slot]:
                    embeddings.append(pooled[row - first, slot])
                    names.append(voice)
    return np.array(embeddings, dtype=np.float64), np.array(names)


def fit_community_plda(
    embedding: BaseWeSpeakerResNet, recording: Recording, directory: str | Path
) -> Path:
    """Fits a PLDA to `embedding`'s `speaker_embeddings` of `recording` (its voices and
    turns known) and writes it into `directory` as pyannote's two npz files; returns
    the folder, which `PLDA.from_pretrained` and `community_1_pipeline` read."""
    embeddings, voices = speaker_embeddings(embedding, recording)
    if not np.all(np.isfinite(embeddings)):
        raise InvalidArgument("fit_community_plda: the embedding model gave NaN or infinities")
    return write_plda(directory, *fit_plda(embeddings, voices))


def community_1_pipeline(segmentation: PyanNet, embedding: BaseWeSpeakerResNet, plda: Any) -> Any:
    """A `SpeakerDiarization` in community-1's shape over these models: VBx clustering
    over `plda` (a pyannote `PLDA`, or a folder holding its two npz files), constrained
    assignment, overlap left out of the embeddings, batch 32, and community-1's
    hyper-parameters (`COMMUNITY_1_PARAMETERS`)."""
    from pyannote.audio.core.plda import PLDA
    from pyannote.audio.pipelines import SpeakerDiarization

    if not isinstance(plda, PLDA):
        plda = PLDA.from_pretrained(str(plda))
    pipeline = SpeakerDiarization(
        segmentation=segmentation, embedding=embedding, plda=plda, **COMMUNITY_1_OPTIONS
    )
    pipeline.instantiate(COMMUNITY_1_PARAMETERS)
    return pipeline


def write_pipeline(
    directory: str | Path,
    segmentation: PyanNet,
    embedding: BaseWeSpeakerResNet,
    plda: str | Path,
) -> Path:
    """Writes community-1's shape as a pipeline folder in the layout pyannote.audio
    reads offline: `config.yaml` (`COMMUNITY_1_OPTIONS` and `COMMUNITY_1_PARAMETERS`,
    the models and the PLDA as `$model/` subfolders), `segmentation/` and `embedding/`
    (each a `pytorch_model.bin` checkpoint of the model) and `plda/` (the npz files of
    the folder `plda`). `Pipeline.from_pretrained(directory)` and `pyspk diarize
    --pipeline directory` load it. Returns the folder."""
    import shutil

    import pyannote.audio
    import yaml

    from pyspk.pyannote.plda import PLDA_FILE, TRANSFORM_FILE

    folder = Path(directory)
    for name, model in (("segmentation", segmentation), ("embedding", embedding)):
        (folder / name).mkdir(parents=True, exist_ok=True)
        torch.save(_checkpoint(model), folder / name / "pytorch_model.bin")
    (folder / "plda").mkdir(exist_ok=True)
    for name in (TRANSFORM_FILE, PLDA_FILE):
        shutil.copyfile(Path(plda) / name, folder / "plda" / name)
    config = {
        "dependencies": {"pyannote.audio": pyannote.audio.__version__},
        "pipeline": {
            "name": "pyannote.audio.pipelines.SpeakerDiarization",
            "params": {
                "segmentation": "$model/segmentation",
                "embedding": "$model/embedding",
                "plda": "$model/plda",
                **COMMUNITY_1_OPTIONS,
            },
        },
        "params": COMMUNITY_1_PARAMETERS,
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def _checkpoint(model: Any) -> dict[str, Any]:
    """What pyannote's `Model.from_pretrained` reads: the weights (on the host, so that
    any machine loads them), the constructor's hyper-parameters and pyannote's own entry
    (versions, class, specifications; a WeSpeaker model without specifications gets a
    5 s chunk-level representation's)."""
    import lightning
    import pyannote.audio
    from pyannote.audio.core.task import Problem, Resolution, Specifications

    try:
        specifications = model.specifications
    except Exception:  # pyannote raises its own error for a model never given any
        specifications = Specifications(
            problem=Problem.REPRESENTATION, resolution=Resolution.CHUNK, duration=5.0
        )
    return {
        "state_dict": {name: value.detach().cpu() for name, value in model.state_dict().items()},
        "hyper_parameters": dict(model.hparams),
        "pytorch-lightning_version": lightning.__version__,
        "pyannote.audio": {
            "versions": {"pyannote.audio": pyannote.audio.__version__},
            "architecture": {"module": type(model).__module__, "class": type(model).__name__},
            "specifications": specifications,
        },
    }
