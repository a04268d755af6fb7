"""`pyspk info` without a GPU: with no driver it prints the versions and why the rest is
missing, and exits 0; against the fake driver it reports each device, the artifact it
would load and the rule's picks."""

from __future__ import annotations

import json

import pytest

from pyspk.cuda import driver
from tests.command import run
from tests.fake_driver import FakeApi


def test_without_a_driver_it_says_why_and_exits_0(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing() -> None:
        raise driver.NoDriverError("the NVIDIA driver library (libcuda) could not be loaded")

    monkeypatch.setattr(driver, "_api", None)
    monkeypatch.setattr(driver, "_load", missing)
    code, out, err = run(capsys, "info")
    assert (code, err) == (0, "")
    assert out.startswith("pyspk ")
    assert "cuda-bindings" in out
    assert "driver: unavailable: NoDriverError: the NVIDIA driver library" in out
    code, out, _ = run(capsys, "info", "--json")
    report = json.loads(out)
    assert code == 0 and report["devices"] == [] and report["driver"].startswith("unavailable")


def test_it_names_the_diarize_stack_without_importing_it(capsys, monkeypatch) -> None:
    """torch, torchaudio, pyannote.audio and soundfile: their installed versions (or
    "not installed"), read from the metadata, none of them imported."""
    import importlib.metadata
    import sys

    monkeypatch.setattr(driver, "_api", None)
    monkeypatch.setattr(driver, "_load", lambda: (_ for _ in ()).throw(driver.NoDriverError("x")))
    imported = {name for name in ("torch", "torchaudio", "pyannote.audio", "soundfile")}
    imported &= set(sys.modules)
    code, out, _ = run(capsys, "info", "--json")
    stack = json.loads(out)["diarize stack"]
    assert code == 0
    assert list(stack) == ["torch", "torchaudio", "pyannote.audio", "soundfile"]
    for name, version in stack.items():
        try:
            assert version == importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            assert version == "not installed"
    assert {n for n in stack if n in sys.modules} == imported  # nothing newly imported
    code, out, _ = run(capsys, "info")
    assert code == 0 and "diarize stack: torch " in out


def test_each_device_with_its_artifact_and_picks(
    capsys: pytest.CaptureFixture[str], fake: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYSPK_PTX_TIER", raising=False)
    monkeypatch.delenv("PYSPK_FORCE_PTX_JIT", raising=False)
    code, out, _ = run(capsys, "info", "--json")
    report = json.loads(out)
    assert code == 0
    assert report["driver"] == "CUDA 13.0 (13000)"
    assert [device["name"] for device in report["devices"]] == ["Fake GPU 0", "Fake GPU 1"]
    first = report["devices"][0]
    assert (first["capability"], first["multiprocessors"], first["memory_bytes"]) == (
        "8.9",
        34,
        24 << 30,
    )
    assert (first["tier"], first["artifact"]) == ("sm80", "segdense.sm80 cubin sm_89")
    assert first["modules"]["trunk"] == "trunk.sm80 cubin sm_89"  # sm90 runs on 9.0 only
    assert len(first["picks"]) == 24 and all(pick["built"] for pick in first["picks"])
    embedding = [p for p in first["picks"] if p["boundary"] == "resnet.seg_1" and p["batch"] == 32]
    assert [p["entry"] for p in embedding] == ["EMBED_B32", "EMBED_B32_F16"]

    monkeypatch.setenv("PYSPK_FORCE_PTX_JIT", "1")
    monkeypatch.setenv("PYSPK_PTX_TIER", "sm75")
    code, out, _ = run(capsys, "info")
    assert code == 0
    assert "loads: tier sm75, segdense.sm75.ptx (JIT) (forced by PYSPK_FORCE_PTX_JIT=1)" in out
    assert "modules: segdense.sm75.ptx (JIT), trunk.sm75.ptx (JIT)," in out


def test_it_says_whether_accelerate_pipeline_serves_a_pipeline(capsys, tmp_path, monkeypatch):
    """`--pipeline FOLDER`: a written community-1-shaped folder is served; one whose
    clustering is oracle is not, with the engine's reason; a missing one is one line."""
    import os
    import warnings

    from tests.optional import importorskip

    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        importorskip("torch", reason="PyTorch is missing")
        importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")
        from pyspk.pyannote import offline
        from pyspk.testing.synthetic import recording

    monkeypatch.setattr(driver, "_api", None)
    monkeypatch.setattr(driver, "_load", lambda: (_ for _ in ()).throw(driver.NoDriverError("x")))
    segmentation, embedding = offline.segmentation_3_0(seed=0), offline.wespeaker_resnet34(seed=1)
    plda = offline.fit_community_plda(embedding, recording(30, seed=12, speakers=4), tmp_path)
    folder = offline.write_pipeline(tmp_path / "community-1", segmentation, embedding, plda)
    code, out, _ = run(capsys, "info", "--pipeline", str(folder))
    assert code == 0
    assert f"pipeline {folder}: SpeakerDiarization, VBxClustering; " in out
    assert out.rstrip().endswith("accelerate_pipeline serves it: yes")
    config = folder / "config.yaml"
    text = config.read_text().replace("VBxClustering", "OracleClustering")
    config.write_text(
        text.replace("  clustering:\n    threshold: 0.6\n    Fa: 0.07\n    Fb: 0.8\n", "")
    )
    code, out, _ = run(capsys, "info", "--json", "--pipeline", str(folder))
    served = json.loads(out)["pipeline"]["served"]
    # pyannote builds no embedding model for oracle clustering: the engine's first reason
    assert served == "no: the embedding model is not a pyannote WeSpeaker ResNet"
    code, out, _ = run(capsys, "info", "--pipeline", str(tmp_path / "missing"))
    assert code == 0 and f"pipeline {tmp_path / 'missing'}: --pipeline" in out
