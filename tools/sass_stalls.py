#!/usr/bin/env python3
"""Where one kernel's warps wait, from ncu's per-instruction warp samples: the stall
reasons' shares of all samples, the opcodes with the most samples, the SASS lines with
the most, and the shares of samples and executed instructions in stretches of the
kernel's SASS (split at --cut line numbers; the first and last HGMMA and STG lines are
printed to place them).

    ncu --clock-control none --set full --import-source no -k regex:KERNEL -c 1 -o REPORT \\
        python3 tools/trunk_kernels.py --forward sm90 fp32
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > KERNEL-sass.csv
    python3 tools/sass_stalls.py KERNEL-sass.csv [--cut 400 1119 2040] [--top 12]
"""

from __future__ import annotations

import argparse
import collections
import csv
import itertools
import sys
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def opcode(source: str) -> str:
    """The instruction's opcode without its predicate and modifiers ("@!P1 BRA x" -> BRA)."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def report(path: Path, cuts: list[int], top: int) -> list[str]:
    rows = list(csv.reader(path.open()))
    header = rows[1]
    column = {name: i for i, name in enumerate(header)}
    lines = [row for row in rows[2:] if len(row) >= len(header)]
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def count(row: list[str], name: str) -> int:
        return int(row[column[name]] or 0)

    samples = [count(row, SAMPLES) for row in lines]
    executed = [count(row, EXECUTED) for row in lines]
    total, total_executed = sum(samples) or 1, sum(executed) or 1
    out = [f"{path.name}: {len(lines)} SASS lines, {sum(samples)} warp samples"]
    by_reason = collections.Counter()
    by_opcode = collections.Counter()
    for row, sampled in zip(lines, samples, strict=True):
        by_reason.update({name[6:]: count(row, name) for name in reasons})
        by_opcode[opcode(row[column["Source"]])] += sampled
    out.append("stall samples by reason (% of all):")
    out += [f"  {name:<22}{100 * n / total:6.1f}" for name, n in by_reason.most_common(10)]
    out.append("samples by opcode (% of all):")
    out += [f"  {name:<22}{100 * n / total:6.1f}" for name, n in by_opcode.most_common(10)]
    for marker in ("HGMMA", "STG"):
        at = [i for i, row in enumerate(lines) if opcode(row[column["Source"]]) == marker]
        if at:
            out.append(f"{marker}: {len(at)} lines, the first at {at[0]}, the last at {at[-1]}")
    bounds = [0, *sorted(cuts), len(lines)]
    out.append("stretches (SASS lines): % of samples, % of executed instructions")
    for start, end in itertools.pairwise(bounds):
        share = 100 * sum(samples[start:end]) / total
        work = 100 * sum(executed[start:end]) / total_executed
        out.append(f"  {start:5d}-{end:5d}  {share:6.1f}  {work:6.1f}")
    out.append("SASS lines with the most samples (% of all), each with its two largest reasons:")
    ranked = sorted(range(len(lines)), key=lambda i: -samples[i])[:top]
    for i in ranked:
        row = lines[i]
        largest = sorted(reasons, key=lambda name: -count(row, name))[:2]
        why = " ".join(f"{name[6:]} {100 * count(row, name) / total:.1f}" for name in largest)
        source = row[column["Source"]].strip()[:56]
        out.append(f"  {100 * samples[i] / total:5.1f}  {i:5d}  {source:<56} {why}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--cut", type=int, nargs="*", default=[])
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    print("\n".join(report(args.csv, args.cut, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
