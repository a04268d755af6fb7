"""The README's Python examples run as written: the driver-level one, the PyTorch one
and (with pyannote.audio installed) the pyannote one."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _run(block: str) -> dict:
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    return namespace


def test_the_readme_has_its_three_examples() -> None:
    assert len(BLOCKS) == 3
    assert "pyspk.torch" in BLOCKS[1] and "pyspk.pyannote" in BLOCKS[2]


def test_driver_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    _run(BLOCKS[0])
    assert "segdense" in capsys.readouterr().out


def test_torch_example_runs(torch, capsys: pytest.CaptureFixture[str]) -> None:
    _run(BLOCKS[1])
    assert "LINEAR0_B32" in capsys.readouterr().out


def test_pyannote_example_runs(pyannote, capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        namespace = _run(BLOCKS[2])
    assert "Acceleration(PyanNet" in capsys.readouterr().out
    # the diarization ran through to its annotation, and undo restored the pipeline
    assert type(namespace["output"].speaker_diarization).__name__ == "Annotation"
    assert "get_embeddings" not in namespace["pipeline"].__dict__
