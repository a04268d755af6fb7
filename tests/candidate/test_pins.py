"""The pins module (`pyspk.candidate.segdense.pins`): JSON records, their diff, the short
cells and the all-profiles table."""

from __future__ import annotations

import json

import pytest

from pyspk.candidate.segdense.pins import diff, pick_table, profiles_table, short_cell, to_json
from pyspk.cuda.profiles import PROFILES
from pyspk.cuda.tier import PtxTier

pytestmark = pytest.mark.usefixtures("no_forced_tier")


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
