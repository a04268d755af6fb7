"""`tools/trunk_ab.py` without a GPU: a build's shadow of the checkout loads that build's
artifacts, and the report sums a forward's kernels per chunk and compares digests."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo import REPO, load_tool

ab = load_tool("trunk_ab")


def test_a_shadow_loads_its_builds_artifacts(tmp_path: Path) -> None:
    build = tmp_path / "variant" / "ptx"
    build.mkdir(parents=True)
    root = ab.shadow(build, tmp_path / "shadow")
    code = "from pyspk.cuda.manifest import artifact_dir; print(artifact_dir())"
    found = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, check=True, env={"PYTHONPATH": str(root)}, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert Path(found).resolve() == build.resolve()
    assert (root / "tools" / "trunk_kernels.py").resolve() == REPO / "tools" / "trunk_kernels.py"


def test_a_whole_checkout_runs_from_itself(tmp_path: Path, monkeypatch) -> None:
    """A build folder with `pyspk/` is its own root: its script runs, not the tree's."""
    other = tmp_path / "other"
    (other / "pyspk").mkdir(parents=True)
    scripts = []

    def fake_times(tier, math, script, env, save=None):
        scripts.append((Path(script), env["PYTHONPATH"]))
        return {"spk_trunk_stem": [3.2]}, "d" * 64, "artifacts"

    monkeypatch.setattr(ab, "kernel_times", fake_times)
    assert ab.main([f"other={other}", "--math", "tf32", "--rounds", "1"]) == 0
    assert (other.resolve() / "tools" / "trunk_kernels.py", str(other.resolve())) in scripts
    assert (REPO / "tools" / "trunk_kernels.py", str(REPO)) in scripts


def test_the_report_sums_per_chunk_and_compares_the_outputs() -> None:
    times = {
        ("fp32", "spk_trunk_stem", "tree"): [64.0, 70.0, 66.0],
        ("fp32", "spk_trunk_stem", "new"): [32.0, 32.0, 40.0],
        ("fp32", "spk_trunk_layer1_tiles_f16x3", "tree"): [320.0, 330.0, 310.0],
        ("fp32", "spk_trunk_layer1_tiles_f16x3", "new"): [288.0, 300.0, 290.0],
    }
    args = argparse.Namespace(tier="sm90", rounds=3, math=["fp32"])
    same = {("fp32", "tree"): {"a"}, ("fp32", "new"): {"a"}}
    lines = ab.report(times, same, ["tree", "new"], args)
    per_chunk = next(line for line in lines if "all, per chunk" in line).split()[-2:]
    assert per_chunk == [f"{(66 + 320) / 32:.1f}", f"{(32 + 290) / 32:.1f}"]
    assert lines[-1].endswith("True")
    differ = {("fp32", "tree"): {"a"}, ("fp32", "new"): {"a", "b"}}
    assert ab.report(times, differ, ["tree", "new"], args)[-1].endswith("False")


def test_the_forward_names_its_artifacts_and_output(fake, capsys) -> None:
    """On the fake driver (compute capability 8.9, so the sm80 tier): the lines
    `kernel_times` reads from the profiled run, the same digest on a second forward."""
    kernels = load_tool("trunk_kernels")
    digests = []
    for _ in range(2):
        kernels.forward("sm80", "fp32")
        artifacts, output = capsys.readouterr().out.splitlines()
        assert artifacts.startswith(f"artifacts {REPO / 'ptx'}: trunk.sm80")
        assert output.startswith("output sha256 ")
        digests.append(output.split()[-1])
    assert len(set(digests)) == 1 and len(digests[0]) == 64


def test_the_report_gives_each_builds_error_where_measured() -> None:
    times = {("fp32", "spk_trunk_stem", name): [64.0] for name in ("tree", "new")}
    args = argparse.Namespace(tier="sm90", rounds=1, math=["fp32"])
    digests = {("fp32", "tree"): {"a"}, ("fp32", "new"): {"b"}}
    lines = ab.report(times, digests, ["tree", "new"], args, {("fp32", "new"): (3e-7, 2e-7)})
    assert lines[-2].endswith("False")
    assert lines[-1] == (
        "fp32 new: error against float64 (2 chunks) 3.000e-07 of the largest, 2.000e-07 norm-wise"
    )


def test_errors_compare_each_saved_output_with_one_float64_truth(tmp_path, monkeypatch) -> None:
    import numpy as np

    from pyspk import reference

    kernels = load_tool("trunk_kernels")
    truth = np.arange(1.0, 9.0).reshape(2, 4)
    calls = []

    def fake_trunk(fbank, weights):
        calls.append(fbank.shape)
        return truth

    monkeypatch.setattr(reference, "trunk", fake_trunk)
    exact, off = tmp_path / "exact.npy", tmp_path / "off.npy"
    np.save(exact, truth.astype(np.float32))
    np.save(off, (truth + np.array([0.0] * 7 + [0.8]).reshape(2, 4)).astype(np.float32))
    found = kernels.errors({"exact": exact, "off": off})
    assert calls == [(2, 998, 80)]  # one truth, of the forward's first two chunks
    assert found["exact"] == (0.0, 0.0)
    assert found["off"][0] == pytest.approx(0.1)
    assert found["off"][1] == pytest.approx(0.8 / np.linalg.norm(truth))


def test_the_forward_saves_its_first_chunks(fake, tmp_path, capsys) -> None:
    import numpy as np

    kernels = load_tool("trunk_kernels")
    kernels.forward("sm80", "fp32", save=tmp_path / "out.npy")
    capsys.readouterr()
    assert np.load(tmp_path / "out.npy").shape == (2, 256, 10, 125)


def test_kernel_times_asks_the_forward_for_the_halves_form(monkeypatch) -> None:
    kernels = load_tool("trunk_kernels")
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        csv = '"ID","Kernel Name","Metric Value"\n"0","spk_trunk_stem","2,000"\n'
        out = f"artifacts here: trunk.sm90\noutput sha256 {'e' * 64}\n{csv}"
        return subprocess.CompletedProcess(command, 0, stdout=out, stderr="")

    monkeypatch.setattr(kernels.subprocess, "run", fake_run)
    times, digest, _ = kernels.kernel_times("sm90", "fp32", halves=True)
    assert commands[0][-4:] == ["--forward", "sm90", "fp32", "--halves"]
    assert times == {"spk_trunk_stem": [2.0]} and digest == "e" * 64
    kernels.kernel_times("sm90", "fp32")
    assert "--halves" not in commands[1]
