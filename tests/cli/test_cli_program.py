"""`python -m pyspk` as a program: JSON for a profile, one-line errors, the local GPU
or every profile, and a closed pipe or full disk without a traceback. The subprocesses
name their device or accept either outcome."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.command import check_json_shape
from tests.repo import REPO

pytestmark = pytest.mark.usefixtures("no_forced_tier")


# --- as a program ------------------------------------------------------------------------


def run_module(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYSPK_PTX_TIER", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pyspk", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_module_prints_json_for_a_profile() -> None:
    done = run_module("pins", "--device", "h200", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    check_json_shape(record)
    assert record["device"]["name"] == "NVIDIA H200"
    assert record["picks"][-2]["entry"] == "EMBED_B32_X3"


def test_module_error_is_one_line() -> None:
    done = run_module("pins", "--device", "v100")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("pyspk: error: unknown device")


def test_module_without_a_device_uses_the_gpu_or_every_profile() -> None:
    done = run_module("pins")
    assert done.returncode == 0, done.stderr
    if "no local GPU answered" in done.stderr:
        assert done.stdout.splitlines()[1].split()[:4] == ["profile", "cc", "SMs", "tier"]
    else:
        assert "(local device 0)" in done.stdout.splitlines()[0]
        assert len(done.stdout.splitlines()) == 26


def test_a_closed_pipe_ends_quietly() -> None:
    """A reader that leaves before the output is written (`pyspk pins ... | head -0`):
    no traceback on stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pyspk", "pins", "--device", "h200", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    error = process.stderr.read().decode()
    process.wait(timeout=60)
    assert "Traceback" not in error
    assert error == ""


def test_a_full_disk_is_one_line_and_status_2() -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "pyspk", "pins", "--device", "h200"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert done.returncode == 2
    assert done.stderr.strip().endswith("No space left on device")
    assert "Traceback" not in done.stderr


def test_a_reader_closing_the_pipe_leaves_the_commands_own_status() -> None:
    for _ in range(5):
        pins = subprocess.Popen(
            [sys.executable, "-m", "pyspk", "pins"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        pins.stdout.read(10)
        pins.stdout.close()  # as `| head -c 10` does
        _, err = pins.communicate()
        assert pins.returncode == 0, err
        assert b"Traceback" not in err


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_the_version_flag_prints_the_version(capsys, flag):
    import pyspk
    from pyspk.cli import main

    assert main([flag]) == 0
    assert capsys.readouterr().out.strip() == f"pyspk {pyspk.__version__}"
