"""`pyspk diarize` without a GPU: its help, and every input error as one line on
stderr with exit status 2, before PyTorch or pyannote.audio is needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.command import run
from tests.optional import importorskip


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
        "--overwrite",
    ):
        assert option in out
    assert "pickles and can run code" in " ".join(out.split())


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


def test_a_library_that_will_not_load_is_named_not_taken_for_a_write_error(capsys, monkeypatch):
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


def test_a_batch_above_the_bound_is_a_usage_error(capsys):
    status, _, err = _run(capsys, "--batch", "1025", "a.wav")
    assert status == 2 and "1025 is more than 1024" in err and len(err.strip().splitlines()) == 1


def test_an_rttm_folder_under_a_file_is_refused_before_any_model(capsys, tmp_path):
    pytest.importorskip("soundfile")
    (tmp_path / "plain").write_text("a file")
    audio = _audio(tmp_path, "talk")
    result = _run(capsys, str(audio), "--pipeline", "x", "--rttm", str(tmp_path / "plain" / "out"))
    _one_line_error(*result, "is not a folder")


def test_an_existing_rttm_is_refused_unless_overwrite(capsys, tmp_path):
    pytest.importorskip("soundfile")
    audio = _audio(tmp_path, "talk")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "talk.rttm").write_text("old")
    result = _run(capsys, str(audio), "--pipeline", "x", "--rttm", str(tmp_path / "out"))
    _one_line_error(*result, "talk.rttm exists: pass --overwrite")


def test_whitespace_in_a_name_makes_a_valid_rttm_uri_and_collisions_are_refused(capsys, tmp_path):
    from pyspk.cli.diarize import rttm_uri

    assert rttm_uri("my talk.wav") == "my_talk"
    assert rttm_uri("a\tb  c.flac") == "a_b_c"
    pytest.importorskip("soundfile")
    first, second = _audio(tmp_path, "my talk"), _audio(tmp_path, "my_talk")
    result = _run(capsys, str(first), str(second), "--pipeline", "x", "--rttm", str(tmp_path))
    _one_line_error(*result, "share a name")


def _audio(folder, stem: str):
    import numpy as np
    import soundfile

    path = folder / f"{stem}.wav"
    soundfile.write(path, np.zeros(16000, dtype=np.float32), 16000)
    return path


def test_a_failing_file_is_reported_and_the_others_go_on(capsys, tmp_path, monkeypatch):
    """The loop on a stand-in pipeline (no GPU): the middle file fails, the two others
    get their RTTM, written whole with no partial file left; exit status 1."""
    pytest.importorskip("soundfile")
    torch = pytest.importorskip("torch")
    pytest.importorskip("pyannote.core")
    from pyannote.core import Annotation, Segment

    from pyspk.cli import diarize

    class Stand:
        def to(self, device):
            return self

        def __call__(self, file, hook=None, num_speakers=None):
            if file["uri"] == "broken":
                raise RuntimeError("the model failed")
            annotation = Annotation(uri=file["uri"])
            annotation[Segment(0.0, 0.5)] = "SPEAKER_00"
            return annotation

    monkeypatch.setattr(diarize, "_import_stack", lambda: (torch, None))
    monkeypatch.setattr(diarize, "_pipeline", lambda args, pa: Stand())
    monkeypatch.setattr(diarize, "_cuda", lambda torch, ordinal: "cpu")
    paths = [str(_audio(tmp_path, stem)) for stem in ("first", "broken", "last")]
    out = tmp_path / "out"
    status, _, err = _run(capsys, *paths, "--pipeline", "x", "--rttm", str(out), "--stock")
    assert status == 1
    assert "broken.wav: RuntimeError: the model failed" in err
    assert "1 of 3 files failed" in err
    assert sorted(p.name for p in out.iterdir()) == ["first.rttm", "last.rttm"]
    assert (out / "last.rttm").read_text().startswith("SPEAKER last 1 0.000 0.500")


def test_help_names_the_corpus_options(capsys):
    status, out, _ = _run(capsys, "--help")
    assert status == 0
    for option in ("--corpus", "--manifest", "--engines", "--gpus", "--scheduler"):
        assert option in out


def test_corpus_mode_needs_an_rttm_folder_and_inputs(capsys, tmp_path):
    _one_line_error(*_run(capsys, "--corpus", str(tmp_path), "--pipeline", "x"), "give --rttm DIR")
    _one_line_error(
        *_run(capsys, "--corpus", "--rttm", str(tmp_path / "out"), "--pipeline", "x"),
        "no AUDIO file, folder or @list given",
    )


def test_corpus_inputs_that_name_no_audio_are_an_error(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("not audio\n")
    out = tmp_path / "out"
    status, stdout, err = _run(
        capsys, "--corpus", str(tmp_path), "--rttm", str(out), "--pipeline", "x"
    )
    _one_line_error(status, stdout, err, "the inputs name no audio file")
    assert not out.exists()  # nothing written for a run that cannot start


def test_corpus_inputs_that_would_share_an_rttm_or_a_list_not_utf8_are_an_error(capsys, tmp_path):
    """Both found before any model loads (a traceback and exit status 1 before)."""
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "one.wav").write_bytes(b"RIFF")
    out = tmp_path / "out"
    status, stdout, err = _run(
        capsys, "--corpus", str(tmp_path), "--rttm", str(out), "--pipeline", "x"
    )
    _one_line_error(status, stdout, err, "would both write one.rttm")
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"caf\xe9.wav\n")
    status, stdout, err = _run(
        capsys, "--corpus", f"@{listing}", "--rttm", str(out), "--pipeline", "x"
    )
    _one_line_error(status, stdout, err, "the list is not UTF-8 text")


def test_gpus_and_scheduler_are_exclusive(capsys, tmp_path):
    status, out, err = _run(
        capsys, str(tmp_path), "--rttm", str(tmp_path / "out"), "--pipeline", "x",
        "--gpus", "2", "--scheduler", "tcp://127.0.0.1:8786",
    )  # fmt: skip
    _one_line_error(status, out, err, "give either --gpus or --scheduler")


@pytest.mark.parametrize(("gpus", "text"), [("0", "--gpus 0: "), ("999", "this machine has")])
def test_a_gpu_count_the_machine_cannot_serve_is_an_error(capsys, tmp_path, gpus, text):
    importorskip("distributed", reason="dask.distributed is missing (corpus extra)")
    importorskip("torch", reason="PyTorch is missing")
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    status, out, err = _run(
        capsys, str(tmp_path), "--rttm", str(tmp_path / "out"), "--pipeline", "x", "--gpus", gpus
    )
    _one_line_error(status, out, err, text)


def test_a_scheduler_that_does_not_answer_is_named(capsys, tmp_path):
    """Not "cannot write the output", as an OSError from Dask's connect was reported."""
    importorskip("distributed", reason="dask.distributed is missing (corpus extra)")
    importorskip("torch", reason="PyTorch is missing")
    import dask

    (tmp_path / "a.wav").write_bytes(b"RIFF")
    address = "tcp://127.0.0.1:1"  # nothing listens on port 1
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        status, out, err = _run(
            capsys, str(tmp_path), "--rttm", str(tmp_path / "out"), "--pipeline", "x",
            "--scheduler", address,
        )  # fmt: skip
    _one_line_error(status, out, err, f"--scheduler {address}: ")
