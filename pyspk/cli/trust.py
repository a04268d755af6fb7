"""What a file can make `pyspk diarize` run: checkpoints are pickles, and pyannote.audio
imports the module a checkpoint (or a pipeline's config.yaml) names before it reads any
weight. These checks admit, without `--trust-checkpoints`, only weights and the model
and pipeline classes pyspk serves."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from pyspk.cli._arguments import DiarizeError

__all__ = [
    "SERVED_PIPELINES",
    "check_checkpoint",
    "check_pipeline_folder",
    "load_checkpoint",
    "served_architectures",
]


SERVED_PIPELINES = frozenset(
    {
        "pyannote.audio.pipelines.SpeakerDiarization",
        "pyannote.audio.pipelines.speaker_diarization.SpeakerDiarization",
    }
)
"""The pipeline classes a local `--pipeline` folder may name without
`--trust-checkpoints`: pyannote.audio imports whatever module its config.yaml names."""


def served_architectures() -> set[tuple[str, str]]:
    """(module, class) of the models pyspk serves: pyannote's `PyanNet` and the WeSpeaker
    ResNets. pyannote.audio imports the module a checkpoint names before reading its
    weights, so a checkpoint naming any other runs that module's code."""
    from pyannote.audio.models.embedding.wespeaker import BaseWeSpeakerResNet
    from pyannote.audio.models.segmentation import PyanNet

    served: list[type] = [PyanNet, *BaseWeSpeakerResNet.__subclasses__()]
    return {(kind.__module__, kind.__name__) for kind in served}


def check_checkpoint(path: Path, data: bytes) -> None:
    """DiarizeError unless the checkpoint `data` (read from `path`) holds only weights,
    plain containers and pyannote's specification types (`torch.load(weights_only=True)`)
    and names a model class that pyspk serves."""
    import pickle

    import torch
    from pyannote.audio.core.task import Problem, Resolution, Specifications

    try:
        with torch.serialization.safe_globals([Specifications, Problem, Resolution]):
            loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL (\S+)", str(error))
        needed = f"it names {found.group(1)}" if found else "objects beyond weights"
        raise DiarizeError(
            f"{path}: holds more than weights ({needed}), and loading it would run "
            "code; pass --trust-checkpoints only for a checkpoint you trust"
        ) from None
    except Exception as error:
        raise DiarizeError(f"{path}: not a PyTorch checkpoint ({error})") from None
    entry = loaded.get("pyannote.audio") if isinstance(loaded, dict) else None
    architecture = entry.get("architecture") if isinstance(entry, dict) else None
    named = (
        (architecture.get("module"), architecture.get("class"))
        if isinstance(architecture, dict)
        else (None, None)
    )
    if named not in served_architectures():
        raise DiarizeError(
            f"{path}: names the model class {named[0]}.{named[1]}, which pyspk does not "
            "serve, and building it would import that module and run its code; pass "
            "--trust-checkpoints only for a checkpoint you trust"
        )


def load_checkpoint(path: Path, trust: bool) -> Any:
    """A pyannote `Model` from a local checkpoint, checked first by `check_checkpoint`
    unless `trust` (see the module docstring); DiarizeError for what stops it."""
    from pyannote.audio import Model

    data = _read_checkpoint(path)
    if not trust:
        check_checkpoint(path, data)
    try:
        model = Model.from_pretrained(io.BytesIO(data))
    except Exception as error:
        raise DiarizeError(f"{path}: pyannote.audio cannot load it ({error})") from None
    if model is None:
        raise DiarizeError(f"{path}: pyannote.audio cannot load it")
    return model


def check_pipeline_folder(folder: Path) -> None:
    """DiarizeError unless the local pipeline `folder` chooses no code: its config.yaml
    names a pipeline of `SERVED_PIPELINES` and no preprocessors, and its two models are
    `$model/` subfolders of the folder whose checkpoints pass `check_checkpoint`. (Its
    PLDA is read by numpy without pickles.)"""
    import yaml

    where = f"--pipeline {folder}"
    try:
        config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise DiarizeError(f"{where}: cannot read its config.yaml ({error})") from None
    pipeline = config.get("pipeline") if isinstance(config, dict) else None
    name = pipeline.get("name") if isinstance(pipeline, dict) else None
    trust = "pass --trust-checkpoints only for a pipeline you trust"
    if not isinstance(pipeline, dict) or name not in SERVED_PIPELINES:
        raise DiarizeError(
            f"{where}: its config.yaml names the pipeline {name!r}, which pyspk does not "
            f"serve, and building it would import that module and run its code; {trust}"
        )
    if config.get("preprocessors"):
        raise DiarizeError(f"{where}: its config.yaml names preprocessor classes; {trust}")
    params = pipeline.get("params") or {}
    for key in ("segmentation", "embedding"):
        value = params.get(key) if isinstance(params, dict) else None
        inside = isinstance(value, str) and value.startswith("$model/") and "@" not in value
        checkpoint = folder / str(value).removeprefix("$model/") / "pytorch_model.bin"
        if not inside or not checkpoint.resolve().is_relative_to(folder.resolve()):
            raise DiarizeError(
                f"{where}: its {key} model is {value!r}, not a $model/ subfolder of the "
                f"folder, whose checkpoint pyspk could check; {trust}"
            )
        check_checkpoint(checkpoint, _read_checkpoint(checkpoint))


def _read_checkpoint(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise DiarizeError(f"{path}: cannot read ({error.strerror or error})") from None
