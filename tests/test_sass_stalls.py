"""`tools/sass_stalls.py` on a small export in the layout of ncu's source page: the stall
reasons' and opcodes' shares, the stretches between cuts, and the busiest lines."""

from __future__ import annotations

import csv
from pathlib import Path

from tests.repo import load_tool

stalls = load_tool("sass_stalls")

HEADER = [
    "Address", "Source", "Warp Stall Sampling (All Samples)",
    "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed",
    "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)",
]  # fmt: skip
LINES = [  # source, samples, executed, long_sb, wait
    ("LDG.E.64 R2, desc[UR4][R4.64]", 10, 100, 2, 8),
    ("@!P0  BRA 0x7f00", 30, 100, 30, 0),
    ("HGMMA.64x32x16.F32 R24, gdesc[UR8], RZ", 40, 200, 0, 40),
    ("STG.E.64 desc[UR4][R6.64], R24", 20, 600, 20, 0),
]


def export(path: Path) -> Path:
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["Kernel Name", "spk_test"])
        writer.writerow(HEADER)
        for i, (source, samples, executed, long_sb, wait) in enumerate(LINES):
            writer.writerow([hex(i * 16), source, samples, samples, executed, long_sb, wait, 0])
    return path


def test_shares_by_reason_opcode_and_stretch(tmp_path: Path) -> None:
    out = stalls.report(export(tmp_path / "k.csv"), cuts=[2], top=2)
    assert out[0] == "k.csv: 4 SASS lines, 100 warp samples"
    assert (
        "  long_sb                 52.0" in out
    )  # 2 + 30 + 20 of 100; the Not Issued column apart
    assert "  wait                    48.0" in out
    assert "  HGMMA                   40.0" in out  # opcodes without predicates or modifiers
    assert "  BRA                     30.0" in out
    assert "HGMMA: 1 lines, the first at 2, the last at 2" in out
    assert "      0-    2    40.0    20.0" in out  # samples and executed instructions
    assert "      2-    4    60.0    80.0" in out
    busiest = out[out.index(next(line for line in out if line.startswith("SASS lines"))) + 1 :]
    assert [line.split()[1] for line in busiest] == ["2", "1"]
