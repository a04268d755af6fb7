"""Packaging facts held in one place: the version, the license, the extras."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

import pyspk

tomllib = pytest.importorskip("tomllib")  # Python 3.11 and newer

ROOT = Path(__file__).resolve().parent.parent


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_version_lives_in_the_package_alone() -> None:
    project = _project()
    assert "version" not in project and "version" in project["dynamic"]
    assert importlib.metadata.version("pyspk-diarize") == pyspk.__version__


def test_every_install_hint_names_the_distribution_and_its_extra() -> None:
    """ "pyspk" on the package index is another project: a hint naming it installs that."""
    import re

    assert _project()["name"] == "pyspk-diarize"
    for path in [*(ROOT / "pyspk").rglob("*.py"), ROOT / "README.md"]:
        text = path.read_text()
        assert not re.search(r"pip install ['\"]?pyspk(\[|['\"]|\s|$)", text), path
    from pyspk.cli.diarize import INSTALL_HINT

    assert INSTALL_HINT == "pip install 'pyspk-diarize[diarize]'"
    assert "diarize" in _project()["optional-dependencies"]


def test_the_license_file_matches_the_metadata() -> None:
    project = _project()
    assert project["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


def test_the_gpu_extra_brings_the_library_path() -> None:
    assert any(item.startswith("torch") for item in _project()["optional-dependencies"]["gpu"])


def test_no_module_over_600_lines_and_no_function_over_80() -> None:
    """The package's size rule: a module past 600 lines or a function past 80 is split
    along a seam of what it does."""
    import ast

    long = []
    for path in sorted((ROOT / "pyspk").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > 600:
            long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 80:
                    long.append(f"{path.relative_to(ROOT)}: {node.name} has {length} lines")
    assert long == []


@pytest.mark.parametrize(
    "path",
    [
        "pyspk/pyannote/_steps.py",
        "pyspk/pyannote/_annotation.py",
        "pyspk/pyannote/_clustering.py",
        "pyspk/candidate/cluster",
    ],
)
def test_the_host_steps_and_the_cluster_area_import_no_torch(path: str) -> None:
    """No import of torch or pyspk.torch at any level, lazy ones included: the cluster
    area plans on a pyspk runtime and the steps take numpy arrays."""
    import ast

    files = sorted((ROOT / path).rglob("*.py")) if (ROOT / path).is_dir() else [ROOT / path]
    found = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [
                f"{file.name}:{node.lineno} {name}"
                for name in names
                if name.split(".")[0] == "torch" or name.startswith("pyspk.torch")
            ]
    assert found == []


def test_the_cluster_area_loads_without_torch() -> None:
    import subprocess
    import sys

    probe = "import sys, pyspk.candidate.cluster; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"
