"""`pyspk diarize` without a GPU: its help, and every input error as one line on
stderr with exit status 2, before PyTorch or pyannote.audio is needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.command import run


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    return run(capsys, "diarize", *argv)


def test_help_names_the_options_and_the_checkpoint_caveat(capsys):
    status, out, _ = _run(capsys, "--help")
    assert status == 0
    for option in (
        "--rttm",
        "--math",
        "--batch",
        "--pipeline",
        "--segmentation",
        "--embedding",
        "--demo",
        "--trust-checkpoints",
    ):
        assert option in out
    assert "unpickling runs code" in " ".join(out.split())


def _one_line_error(status: int, out: str, err: str, text: str) -> None:
    assert status == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pyspk diarize: error: ")
    assert text in lines[0]


def test_no_audio_is_an_error(capsys):
    _one_line_error(*_run(capsys), "no AUDIO file")


def test_a_missing_audio_path_is_an_error(capsys, tmp_path):
    missing = tmp_path / "absent.wav"
    _one_line_error(*_run(capsys, str(missing), "--pipeline", "x"), f"{missing}: no such file")


def test_a_folder_is_not_audio(capsys, tmp_path):
    _one_line_error(*_run(capsys, str(tmp_path), "--pipeline", "x"), "not a file")


def test_no_models_is_an_error(capsys, tmp_path):
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"RIFF")
    _one_line_error(*_run(capsys, str(audio)), "no models")


def test_a_missing_checkpoint_is_an_error(capsys, tmp_path):
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"RIFF")
    status, out, err = _run(
        capsys, str(audio), "--segmentation", str(tmp_path / "s.ckpt"), "--embedding", str(audio)
    )
    _one_line_error(status, out, err, "--segmentation")
    assert "no such checkpoint file" in err


def test_pipeline_and_checkpoints_are_exclusive(capsys, tmp_path):
    audio = tmp_path / "a.wav"
    audio.write_bytes(b"RIFF")
    status, out, err = _run(
        capsys,
        str(audio),
        "--pipeline",
        "x",
        "--segmentation",
        str(audio),
        "--embedding",
        str(audio),
    )
    _one_line_error(status, out, err, "either --pipeline or")


def test_colliding_rttm_names_are_an_error(capsys, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = tmp_path / "a" / "x.wav", tmp_path / "b" / "x.wav"
    first.write_bytes(b"RIFF")
    second.write_bytes(b"RIFF")
    status, out, err = _run(
        capsys, str(first), str(second), "--pipeline", "p", "--rttm", str(tmp_path / "out")
    )
    _one_line_error(status, out, err, "share a name")


def test_an_unreadable_file_is_an_error(capsys, tmp_path):
    pytest.importorskip("soundfile", reason="soundfile is missing (the diarize extra)")
    audio = tmp_path / "a.wav"
    audio.write_text("not audio")
    _one_line_error(*_run(capsys, str(audio), "--pipeline", "x"), "not audio that libsndfile")


def test_demo_takes_no_audio(capsys, tmp_path):
    _one_line_error(*_run(capsys, "--demo", str(tmp_path)), "--demo takes no audio")


@pytest.mark.parametrize("batch", ["0", "-3", "x"])
def test_a_bad_batch_is_a_usage_error(capsys, batch):
    status, _, err = _run(capsys, "--batch", batch, "a.wav")
    assert status == 2 and "--batch" in err and len(err.strip().splitlines()) == 1


def test_the_command_line_imports_no_torch_until_diarize_runs():
    code = (
        "import sys; from pyspk.cli import main; "
        "main(['diarize', '--help']); main(['diarize', '/absent.wav', '--pipeline', 'x']); "
        "print('torch' in sys.modules, 'pyannote' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False False"


def test_a_library_that_will_not_load_is_named_not_taken_for_a_write_error(
    capsys, monkeypatch
):
    """A compiled library that fails to load (an OSError, as a torchaudio built for
    another PyTorch raises) gets its own line and exit 2, not "cannot write the
    output"."""
    import importlib.abc

    class Unloadable(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "pyspk.pyannote":
                raise OSError("Could not load this library: _torchaudio.so")
            return None

    pytest.importorskip("torch")
    monkeypatch.delitem(sys.modules, "pyspk.pyannote", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Unloadable(), *sys.meta_path])
    from pyspk.cli import main

    assert main(["diarize", "--demo", "--seconds", "12"]) == 2
    error = capsys.readouterr().err
    assert "will not load (Could not load this library: _torchaudio.so)" in error
    assert "cannot write the output" not in error
    assert error.count("\n") == 1
