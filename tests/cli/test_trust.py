"""Untrusted checkpoints and pipeline folders never choose code to import: a crafted
checkpoint names a module that sits on `sys.path` and records its own import; without
`--trust-checkpoints` it never runs, and the command exits 2 with one line."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

from tests.optional import importorskip

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch = pytest.importorskip("torch")
    importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")

from pyspk.cli.diarize import DiarizeError
from pyspk.cli.trust import check_pipeline_folder, load_checkpoint


@pytest.fixture
def trap(tmp_path, monkeypatch):
    """A module on sys.path whose import writes a marker file: (its name, the marker)."""
    name = f"pyspk_trap_{os.getpid()}"
    marker = tmp_path / "imported"
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\nclass Model: pass\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name, marker


def _crafted(path, module: str) -> None:
    """A checkpoint of plain values (weights_only loads it) naming `module`.Model."""
    torch.save(
        {
            "state_dict": {"weight": torch.zeros(2)},
            "hyper_parameters": {},
            "pyannote.audio": {
                "versions": {"pyannote.audio": "4.0.7"},
                "architecture": {"module": module, "class": "Model"},
            },
        },
        path,
    )


def test_a_checkpoint_naming_another_module_is_refused_before_it_runs(trap, tmp_path, capsys):
    soundfile = pytest.importorskip("soundfile")
    import numpy as np

    from pyspk.cli import main

    name, marker = trap
    _crafted(tmp_path / "crafted.ckpt", name)
    soundfile.write(tmp_path / "talk.wav", np.zeros(16000, dtype=np.float32), 16000)
    arguments = ["diarize", str(tmp_path / "talk.wav"), "--segmentation"]
    arguments += [str(tmp_path / "crafted.ckpt"), "--embedding", str(tmp_path / "crafted.ckpt")]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"names the model class {name}.Model" in error
    assert not marker.exists()
    # --trust-checkpoints is the way past: pyannote.audio then imports the module
    assert main([*arguments, "--trust-checkpoints"]) == 2  # no model in it
    assert marker.exists()


def test_load_checkpoint_refuses_unless_trusted(trap, tmp_path):
    name, marker = trap
    _crafted(tmp_path / "crafted.ckpt", name)
    with pytest.raises(DiarizeError, match="does not serve"):
        load_checkpoint(tmp_path / "crafted.ckpt", trust=False)
    assert not marker.exists()
    with pytest.raises(DiarizeError, match="cannot load it"):
        load_checkpoint(tmp_path / "crafted.ckpt", trust=True)
    assert marker.exists()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """community-1's shape written by pyspk.pyannote.offline: a folder that passes the check."""
    from pyspk.pyannote import offline
    from pyspk.pyannote.plda import fit_plda, write_plda

    root = tmp_path_factory.mktemp("pipeline")
    rng = __import__("numpy").random.default_rng(0)
    plda = write_plda(
        root / "plda-fit", *fit_plda(rng.standard_normal((40, 256)), rng.integers(0, 4, 40))
    )
    models = offline.segmentation_3_0(seed=0), offline.wespeaker_resnet34(seed=1)
    return offline.write_pipeline(root / "community-1", *models, plda)


def test_a_written_community_1_folder_passes(folder):
    check_pipeline_folder(folder)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("pyannote.audio.pipelines.SpeakerDiarization", "{trap}.Model"), "names the pipeline"),
        (("$model/segmentation", "$model/../../elsewhere"), "not a \\$model/ subfolder"),
        (("$model/embedding", "pyannote/wespeaker-voxceleb-resnet34-LM"), "not a \\$model/"),
        (
            ("\nparams:\n", "\npreprocessors:\n  audio:\n    name: {trap}.Model\nparams:\n"),
            "preprocessor",
        ),
    ],
)
def test_a_folder_that_chooses_code_is_refused(folder, trap, tmp_path, edit, message):
    import shutil

    name, marker = trap
    copy = shutil.copytree(folder, tmp_path / "copy")
    config = (copy / "config.yaml").read_text()
    old, new = edit
    assert old in config
    (copy / "config.yaml").write_text(config.replace(old, new.format(trap=name), 1))
    with pytest.raises(DiarizeError, match=message):
        check_pipeline_folder(copy)
    assert not marker.exists()


def test_a_folder_whose_checkpoint_names_another_module_is_refused(folder, trap, tmp_path):
    import shutil

    name, marker = trap
    copy = shutil.copytree(folder, tmp_path / "copy")
    _crafted(copy / "embedding" / "pytorch_model.bin", name)
    with pytest.raises(DiarizeError, match="does not serve"):
        check_pipeline_folder(copy)
    assert not marker.exists()


def test_a_config_file_given_itself_is_checked_as_its_folder(folder, trap, tmp_path, capsys):
    """`--pipeline path/config.yaml` (pyannote reads a config file given itself) takes
    the folder's check; another local file is refused; the module never runs."""
    import shutil

    import numpy as np

    from pyspk.cli import main

    soundfile = pytest.importorskip("soundfile")
    name, marker = trap
    copy = shutil.copytree(folder, tmp_path / "copy")
    config = copy / "config.yaml"
    config.write_text(
        config.read_text().replace("pyannote.audio.pipelines.SpeakerDiarization", f"{name}.Model")
    )
    soundfile.write(tmp_path / "talk.wav", np.zeros(16000, dtype=np.float32), 16000)
    for given in (config, copy / "plda" / "plda.npz"):
        assert main(["diarize", str(tmp_path / "talk.wav"), "--pipeline", str(given)]) == 2
        error = capsys.readouterr().err
        assert (
            error.count("\n") == 1
            and f"--pipeline {given.parent if given == config else given}" in error
        )
    assert not marker.exists()
