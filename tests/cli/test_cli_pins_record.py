"""`pyspk pins --write` and `--check` in process: the round trip, the changes a check
names, and one line with exit status 2 for a record that is missing, malformed,
hostile or not a regular file, or a path that cannot be written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pyspk import cli
from tests.command import check_json_shape, run

pytestmark = pytest.mark.usefixtures("no_forced_tier")


# --- record and check --------------------------------------------------------------------


def test_write_then_check_round_trip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "h200.json"
    code, out, err = run(capsys, "pins", "--device", "h200", "--write", str(path))
    assert code == 0
    assert "EMBED_B32_TF32_E64" in out
    assert f"wrote 24 picks to {path}" in err
    check_json_shape(json.loads(path.read_text()))

    code, out, err = run(capsys, "pins", "--device", "h200", "--check", str(path))
    assert code == 0
    assert out.strip() == f"24 picks match {path}"
    assert err == ""


def test_write_with_json_prints_the_record(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "t4.json"
    code, out, _ = run(capsys, "pins", "--device", "t4", "--json", "--write", str(path))
    assert code == 0
    assert json.loads(out) == json.loads(path.read_text())


def test_check_names_every_changed_tuple(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "h200.json"
    assert run(capsys, "pins", "--device", "h200", "--write", str(path))[0] == 0
    record = json.loads(path.read_text())
    picks = record["picks"]
    # an older rule's embedding entry, a changed launch and a tuple missing from the record
    assert picks[23]["entry"] == "EMBED_B32_TF32_E64"
    picks[23]["entry"] = "EMBED_B32_TF32"
    assert picks[3]["entry"] == "CONV1_B32_TC"
    picks[3]["block"] = 256
    del picks[0]
    path.write_text(json.dumps(record))

    code, out, _ = run(capsys, "pins", "--device", "h200", "--check", str(path))
    assert code == 1
    assert "3 of 24 picks differ" in out
    assert "resnet.seg_1 batch 32 tf32: EMBED_B32_TF32 x66 -> EMBED_B32_TF32_E64 x66" in out
    assert "sincnet.conv1 batch 32 tf32: CONV1_B32_TC: block 256 -> 128" in out
    assert "sincnet.conv1 batch 1 fp32: not recorded -> CONV1_B1" in out

    code, out, _ = run(capsys, "pins", "--device", "h200", "--check", str(path), "--json")
    assert code == 1
    result = json.loads(out)
    assert result["matches"] is False
    assert len(result["changes"]) == 3


def test_check_against_another_device(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "h200.json"
    assert run(capsys, "pins", "--device", "h200", "--write", str(path))[0] == 0
    code, out, _ = run(capsys, "pins", "--device", "h100-pcie", "--check", str(path))
    assert code == 1
    assert "resnet.seg_1 batch 32 fp32: EMBED_B32_X3 x66 -> EMBED_B32_X3 x57" in out
    assert "recorded for NVIDIA H200" in out


# --- records that are missing or malformed, and paths that cannot be written -------


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot read"),
        ("{", "is not JSON"),
        ("[1, 2]", '"picks" list'),
        ('{"picks": [1]}', "is not an object"),
        ('{"picks": [{"boundary": "linear0"}]}', "lacks batch"),
    ],
)
def test_check_on_a_missing_or_malformed_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, needle: str
) -> None:
    path = tmp_path / "record.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run(capsys, "pins", "--device", "h200", "--check", str(path))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("pyspk: error: ")
    assert needle in err


def _mutated(record: dict, change: str) -> dict:
    """`record` with one field set to a value of the wrong type."""
    record = json.loads(json.dumps(record))
    where, _, value = change.partition("=")
    target = record
    *path, last = where.split(".")
    for part in path:
        target = target[int(part)] if part.isdigit() else target[part]
    target[int(last) if last.isdigit() else last] = json.loads(value)
    return record


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ('picks.0.batch="1"', 'field batch is "1", not int'),
        ("picks.0.batch=true", "field batch is true, not int"),
        ("picks.3.math=3", "field math is 3, not str"),
        ('picks.5.splits="a"', 'field splits is "a", not int or null'),
        ("picks.2.shared=1.5", "field shared is 1.5, not int"),
        ('device="h200"', 'no "device" object'),
        ("device.multiprocessors=1.5", "device.multiprocessors is 1.5, not int"),
        ("tier=80", "tier is 80, not str"),
    ],
)
def test_check_refuses_fields_of_the_wrong_type(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, change: str, needle: str
) -> None:
    """A record whose fields have other types than `--write` gives is malformed: exit 2
    and one line, never a traceback nor a list of changed picks."""
    good = tmp_path / "good.json"
    assert run(capsys, "pins", "--device", "h200", "--write", str(good))[0] == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_mutated(json.loads(good.read_text()), change)))
    code, out, err = run(capsys, "pins", "--device", "h200", "--check", str(bad))
    assert (code, out, err.count("\n")) == (2, "", 1)
    assert needle in err


def test_write_to_an_unwritable_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "missing" / "record.json"
    code, _, err = run(capsys, "pins", "--device", "h200", "--write", str(path))
    assert code == 2
    assert err.startswith("pyspk: error: cannot write")
    assert err.count("\n") == 1


# --- values and files that no --write gives ------------------------------------------


def _record(tmp_path: Path, change=None) -> Path:
    path = tmp_path / "picks.json"
    assert cli.main(["pins", "--device", "h200", "--write", str(path)]) == 0
    if change is not None:
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda r: r.__setitem__("tier", "sm99"), 'tier is "sm99"'),
        (lambda r: r["picks"][0].__setitem__("math", "fp64"), 'math is "fp64"'),
        (lambda r: r["picks"][0].__setitem__("batch", 0), "batch is 0"),
    ],
)
def test_check_refuses_values_no_record_holds(tmp_path, capsys, change, text) -> None:
    path = _record(tmp_path, change)
    capsys.readouterr()
    assert cli.main(["pins", "--device", "h200", "--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert text.replace("\\\\", "") in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("[" * 100_000 + "]" * 100_000, "not a record"),
        ('{"tier": ' + "9" * 5000 + "}", "not a record"),
        ("x" * (cli.RECORD_LIMIT + 10), "over"),
    ],
    ids=["deep", "huge-int", "too-big"],
)
def test_check_refuses_hostile_records_in_one_line(tmp_path, capsys, content, text) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert cli.main(["pins", "--device", "h200", "--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert text in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_check_refuses_a_fifo_or_device_without_blocking(tmp_path, capsys) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        assert cli.main(["pins", "--device", "h200", "--check", path]) == 2
        assert "is not a regular file" in capsys.readouterr().err


def test_check_against_another_devices_record_is_a_difference(tmp_path, capsys) -> None:
    path = tmp_path / "t4.json"
    assert cli.main(["pins", "--device", "t4", "--write", str(path)]) == 0
    capsys.readouterr()
    assert cli.main(["pins", "--device", "h200", "--check", str(path)]) == 1
