"""The `pyspk` command run in process, and the shape of the record `pyspk pins
--json` prints."""

from __future__ import annotations

import pytest

from pyspk import cli
from pyspk.candidate.segdense.pins import PICK_FIELDS

PICK_KEYS = {"boundary", "batch", "math", *PICK_FIELDS, "built"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`pyspk *argv` in process: its exit status, stdout and stderr."""
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
