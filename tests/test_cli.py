"""The `pyspk pins` command, in process and as `python -m pyspk`, and the pins module's
JSON, diff and all-profiles table. No test relies on the machine having or lacking a GPU:
in process the local device is replaced, and the subprocesses name their device or
accept either outcome."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyspk import cli
from pyspk.cuda.errors import NoDeviceError, NoDriverError
from pyspk.cuda.profiles import PROFILES
from pyspk.cuda.tier import PtxTier
from pyspk.pins import (
    PICK_FIELDS,
    diff,
    pick_table,
    profiles_table,
    short_cell,
    to_json,
)

REPO = Path(__file__).resolve().parents[1]
PICK_KEYS = {"boundary", "batch", "math", *PICK_FIELDS, "built"}


@pytest.fixture(autouse=True)
def _no_forced_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPK_PTX_TIER", raising=False)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent() -> None:
        raise NoDriverError("libcuda is not here")

    monkeypatch.setattr(cli, "local_device", absent)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def check_json_shape(record: dict) -> None:
    assert set(record) == {"device", "tier", "picks"}
    assert set(record["device"]) == {"name", "capability", "multiprocessors", "shared_optin_bytes"}
    assert isinstance(record["device"]["name"], str)
    assert isinstance(record["device"]["capability"], str)
    assert isinstance(record["device"]["multiprocessors"], int)
    assert isinstance(record["device"]["shared_optin_bytes"], int)
    assert record["tier"] in ("sm75", "sm80")
    assert len(record["picks"]) == 24
    for pick in record["picks"]:
        assert set(pick) == PICK_KEYS
        assert isinstance(pick["boundary"], str)
        assert pick["batch"] in (1, 32)
        assert pick["math"] in ("fp32", "tf32")
        assert isinstance(pick["entry"], str)
        assert pick["kernel"].startswith("spk_segdense_")
        assert pick["splits"] is None or (isinstance(pick["splits"], int) and pick["splits"] > 0)
        assert isinstance(pick["block"], int)
        assert isinstance(pick["shared"], int)


# --- a named device ----------------------------------------------------------------------


def test_pins_for_a_profile_prints_header_and_24_rows(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "pins", "--device", "h200")
    assert code == 0
    assert err == ""
    lines = out.splitlines()
    header = lines[0]
    for part in ("NVIDIA H200", "profile h200", "9.0", "132 SMs", "232448", "sm80"):
        assert part in header
    assert lines[1].split() == [
        "boundary",
        "batch",
        "math",
        "entry",
        "kernel",
        "splits",
        "block",
        "shared",
    ]
    rows = [line.split() for line in lines[2:]]
    assert len(rows) == 24
    assert rows[2] == [
        "sincnet.conv1",
        "32",
        "fp32",
        "CONV1_B32_X3",
        "spk_segdense_conv1_b32_x3",
        "-",
        "256",
        "75264",
    ]
    assert rows[-1] == [
        "resnet.seg_1",
        "32",
        "tf32",
        "EMBED_B32_TF32_E64",
        "spk_segdense_embed_b32_tf32_e64",
        "66",
        "192",
        "0",
    ]


def test_pins_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "pins", "--device", "RTX 4060 Ti", "--json")
    assert code == 0
    record = json.loads(out)
    check_json_shape(record)
    assert record["device"] == {
        "name": "NVIDIA GeForce RTX 4060 Ti",
        "capability": "8.9",
        "multiprocessors": 34,
        "shared_optin_bytes": 101376,
    }
    assert record["tier"] == "sm80"
    assert record["picks"][-1]["entry"] == "EMBED_B32_F16"
    assert record["picks"][-1]["splits"] == 17


def test_pins_custom_attributes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "pins", "--capability", "12.0", "--sms", "30", "--json")
    assert code == 0
    record = json.loads(out)
    check_json_shape(record)
    assert record["device"]["capability"] == "12.0"
    assert record["device"]["multiprocessors"] == 30
    # the default opt-in is 99 KiB
    assert record["device"]["shared_optin_bytes"] == 99 * 1024
    last = record["picks"][-1]
    assert (last["entry"], last["splits"], last["block"]) == ("EMBED_B32_TF32_K2", 15, 384)

    code, out, _ = run(
        capsys, "pins", "--capability", "8.9", "--sms", "34", "--shared-optin", "65536", "--json"
    )
    assert code == 0
    last = json.loads(out)["picks"][-1]
    assert (last["entry"], last["splits"]) == ("EMBED_B32_TF32", 34)


def test_tier_option_and_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run(capsys, "pins", "--device", "h200", "--tier", "sm75", "--json")
    assert code == 0
    record = json.loads(out)
    assert record["tier"] == "sm75"
    assert record["picks"][-1]["entry"] == "EMBED_B32"
    # 132 * 2 / 2 clamps at 128 slices
    assert record["picks"][-1]["splits"] == 128

    monkeypatch.setenv("PYSPK_PTX_TIER", "sm75")
    code, out, _ = run(capsys, "pins", "--device", "h200")
    assert code == 0
    assert "sm75 (PYSPK_PTX_TIER)" in out.splitlines()[0]
    # the option wins over the environment
    code, out, _ = run(capsys, "pins", "--device", "h200", "--tier", "sm80")
    assert code == 0
    assert "sm80 (--tier)" in out.splitlines()[0]


def test_local_gpu_is_the_default_device(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    local = PROFILES["rtx5060ti"]
    monkeypatch.setattr(cli, "local_device", lambda: local)
    code, out, err = run(capsys, "pins")
    assert code == 0
    assert err == ""
    assert "NVIDIA GeForce RTX 5060 Ti (local device 0)" in out.splitlines()[0]
    assert len(out.splitlines()) == 26


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "pins", "--help")
    assert code == 0
    assert "--device" in out and "h200" in out


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


# --- one-line errors ---------------------------------------------------------------------


BAD_ARGUMENTS = [
    (["pins", "--device", "v100"], "unknown device 'v100'"),
    (["pins", "--capability", "8"], "MAJOR.MINOR"),
    (["pins", "--capability", "eight.nine", "--sms", "34"], "MAJOR.MINOR"),
    (["pins", "--capability", "8.9"], "--capability needs --sms"),
    (["pins", "--capability", "8.9", "--sms", "0"], "--sms"),
    (["pins", "--capability", "8.9", "--sms", "-3"], "--sms"),
    (["pins", "--capability", "8.9", "--sms", "many"], "--sms"),
    (["pins", "--capability", "8.9", "--sms", "34", "--shared-optin", "0"], "--shared-optin"),
    (["pins", "--sms", "34"], "--capability"),
    (["pins", "--device", "h200", "--capability", "9.0", "--sms", "132"], "--device"),
    (["pins", "--device", "h200", "--tier", "sm90"], "not shipped"),
    (["pins", "--device", "h200", "--tier", "sm70"], "sm70"),
    (["pins", "--device", "t4", "--tier", "sm80"], "needs compute capability 8.0"),
    (["pins", "--capability", "7.0", "--sms", "80"], "below the lowest shipped"),
    (["pins", "--capability", "6.1", "--sms", "20"], "below the lowest shipped"),
    (["pins", "--capability", "7.5", "--sms", "40", "--shared-optin", "65537"], "(65536 bytes)"),
    (["pins", "--capability", "9.0", "--sms", "132", "--shared-optin", "300000"], "232448"),
    (["pins", "--capability", "8.7", "--sms", "16"], "8.7 has no opt-in shared memory figure"),
    (["pins", "--capability", "11.0", "--sms", "16"], "give --shared-optin BYTES"),
    (["pins", "--capability", "8.9", "--sms", "1", "--shared-optin", "1024"], "less than the"),
    (["pins", "--capability", "8.9", "--sms", "1" + "0" * 19], "no GPU has more than"),
    (["pins", "--capability", "11.0", "--sms", "20", "--shared-optin", "300000"], "more than"),
    (["pins", "--device", "h100"], "ambiguous: it may be h100-pcie, h100-sxm"),
    (["pins", "--device", "h200", "--write", "a.json", "--check", "b.json"], "not allowed"),
    (["pins", "--bogus"], "unrecognized arguments"),
    (["bogus"], "invalid choice"),
    ([], "a command is required"),
]


@pytest.mark.parametrize(("argv", "needle"), BAD_ARGUMENTS)
def test_bad_arguments_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], no_gpu: None, argv: list[str], needle: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("pyspk: error: ")
    assert needle in err


def test_bad_environment_tier_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPK_PTX_TIER", "sm99")
    code, out, err = run(capsys, "pins", "--device", "h200")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("pyspk: error: PYSPK_PTX_TIER")


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


# --- no GPU and none named ---------------------------------------------------------------


def test_no_gpu_prints_every_profile(capsys: pytest.CaptureFixture[str], no_gpu: None) -> None:
    code, out, err = run(capsys, "pins")
    assert code == 0
    assert err.count("\n") == 1
    assert "no local GPU answered" in err
    assert "libcuda is not here" in err
    lines = out.splitlines()
    names = [line.split()[0] for line in lines[2 : 2 + len(PROFILES)]]
    assert names == list(PROFILES)
    h200 = lines[2 + list(PROFILES).index("h200")].split()
    assert h200[:4] == ["h200", "9.0", "132", "sm80"]
    assert h200[-2:] == ["x3:66", "e64:66"]
    t4 = lines[2 + list(PROFILES).index("t4")].split()
    assert t4[:4] == ["t4", "7.5", "40", "sm75"]
    assert t4[-2:] == ["simt:40", "simt:40"]
    assert "f16   split-K with scaled FP16 products: EMBED_B32_F16" in out
    assert "the same pick on every profile:" in out
    assert "linear2 b1 fp32, tf32:" in out
    # readable width
    assert max(len(line) for line in lines) <= 110


def test_no_gpu_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def absent() -> None:
        raise NoDeviceError("no CUDA device")

    monkeypatch.setattr(cli, "local_device", absent)
    code, out, err = run(capsys, "pins", "--json")
    assert code == 0
    assert "no local GPU answered (NoDeviceError: no CUDA device)" in err
    data = json.loads(out)
    assert set(data) == {"profiles"}
    assert list(data["profiles"]) == list(PROFILES)
    for record in data["profiles"].values():
        check_json_shape(record)
    assert data["profiles"]["t4"]["tier"] == "sm75"
    assert data["profiles"]["h200"]["picks"][-1]["splits"] == 66


def test_no_gpu_with_a_tier_override(capsys: pytest.CaptureFixture[str], no_gpu: None) -> None:
    code, out, _ = run(capsys, "pins", "--tier", "sm80", "--json")
    assert code == 0
    t4 = json.loads(out)["profiles"]["t4"]
    assert t4["tier"] is None
    assert t4["picks"] == []
    assert "needs compute capability 8.0" in t4["error"]

    code, out, _ = run(capsys, "pins", "--tier", "sm80")
    assert code == 0
    t4_line = next(line for line in out.splitlines() if line.startswith("t4 "))
    assert "needs compute capability 8.0" in t4_line

    code, out, err = run(capsys, "pins", "--tier", "sm90")
    assert code == 2
    assert "not shipped" in err


@pytest.mark.parametrize("option", ["--write", "--check"])
def test_no_gpu_cannot_record_or_check(
    capsys: pytest.CaptureFixture[str], no_gpu: None, tmp_path: Path, option: str
) -> None:
    code, out, err = run(capsys, "pins", option, str(tmp_path / "x.json"))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert f"{option} needs --device" in err


# --- the pins module ---------------------------------------------------------------------


def test_to_json_and_diff_of_identical_picks() -> None:
    device = PROFILES["a100"]
    picks = pick_table(device, PtxTier.SM80)
    record = to_json(device, PtxTier.SM80, picks)
    assert record["device"]["capability"] == "8.0"
    assert record["tier"] == "sm80"
    assert diff(json.loads(json.dumps(record)), picks) == []


def test_diff_names_recorded_tuples_not_picked() -> None:
    device = PROFILES["a100"]
    picks = pick_table(device, PtxTier.SM80)
    record = to_json(device, PtxTier.SM80, picks)
    extra = dict(record["picks"][0], batch=8)
    record["picks"].append(extra)
    assert diff(record, picks) == ["sincnet.conv1 batch 8 fp32: CONV1_B1 -> not picked"]
    record["picks"].append(extra)
    with pytest.raises(ValueError, match="repeats"):
        diff(record, picks)


def test_short_cells() -> None:
    cells = {pick.key(): short_cell(pick) for pick in pick_table(PROFILES["b200"], PtxTier.SM80)}
    assert cells["sincnet.conv2", 32, "tf32"] == "tc"
    assert cells["linear0", 32, "tf32"] == "sel"
    assert cells["resnet.seg_1", 32, "tf32"] == "e64:74"
    assert cells["linear2", 1, "fp32"] == "simt"


def test_profiles_table_rows() -> None:
    table = profiles_table()
    assert [row.name for row in table.rows] == list(PROFILES)
    assert all(row.tier is not None and len(row.picks) == 24 for row in table.rows)
    sm75 = profiles_table(PtxTier.SM75)
    assert {row.tier for row in sm75.rows} == {PtxTier.SM75}
    # on sm75 only the embedding's slice count differs between profiles
    header = sm75.render().splitlines()[1].split()
    assert header[4:] == ["b32", "fp32", "b32", "tf32"]


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


def test_a_pick_the_module_lacks_is_marked_not_built(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspk import pins

    shipped = pins.shipped_entries(PtxTier.SM80)
    assert shipped is not None and "spk_segdense_conv1_b32_tc" in shipped
    monkeypatch.setattr(
        pins, "shipped_entries", lambda tier: shipped - {"spk_segdense_conv1_b32_tc"}
    )
    code, out, _ = run(capsys, "pins", "--device", "h200")
    assert code == 0
    marked = [line for line in out.splitlines() if "(not built)" in line]
    assert len(marked) == 1 and "CONV1_B32_TC" in marked[0]
    code, out, _ = run(capsys, "pins", "--device", "h200", "--json")
    built = {pick["entry"]: pick["built"] for pick in json.loads(out)["picks"]}
    assert built["CONV1_B32_TC"] is False and built["CONV1_B32_X3"] is True


def test_pins_fp16_forbid_shows_no_fp16_entry(capsys) -> None:
    import json

    from pyspk.candidate.segdense import Entry
    from pyspk.candidate.segdense.selection import Products

    assert cli.main(["pins", "--device", "h200", "--json"]) == 0
    allowed = json.loads(capsys.readouterr().out)["picks"]
    assert cli.main(["pins", "--device", "h200", "--fp16", "forbid", "--json"]) == 0
    forbidden = json.loads(capsys.readouterr().out)["picks"]
    products = [Entry[pick["entry"]].products() for pick in forbidden]
    assert Products.FP16 not in products
    assert Products.FP16 in [Entry[pick["entry"]].products() for pick in allowed]
    changed = {p["entry"] for p, q in zip(allowed, forbidden, strict=True) if p != q}
    assert changed == {"CONV1_B32_TC", "CONV2_B32_TC", "LINEAR0_B32_SELECT", "LINEAR1_B32_TF32"}


@pytest.mark.parametrize("capability", ["8.7", "8.8", "10.3", "11.0", "12.1"])
def test_every_capability_the_ptx_serves_is_accepted(capability, capsys) -> None:
    argv = ["pins", "--capability", capability, "--sms", "20", "--shared-optin", "101376"]
    assert cli.main(argv) == 0
    assert f"capability {capability}, 20 SMs" in capsys.readouterr().out


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


def _pyspk(*argv: str, **run) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pyspk", *argv], capture_output=True, text=True, **run
    )


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
