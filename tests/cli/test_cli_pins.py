"""`pyspk pins` in process: the picks for a named or described device, the local GPU
or, with none, every profile, and one-line errors for bad arguments. No test relies on
the machine having or lacking a GPU: the local device is replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pyspk import cli
from pyspk.cuda.errors import NoDeviceError, NoDriverError
from pyspk.cuda.profiles import PROFILES
from pyspk.cuda.tier import PtxTier
from tests.command import check_json_shape, run

pytestmark = pytest.mark.usefixtures("no_forced_tier")


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent() -> None:
        raise NoDriverError("libcuda is not here")

    monkeypatch.setattr(cli, "local_device", absent)


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


def test_a_pick_the_module_lacks_is_marked_not_built(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspk.candidate.segdense import pins

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
