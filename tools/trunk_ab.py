#!/usr/bin/env python3
"""The trunk's kernels in two or more builds, side by side on one device: each build's
per-launch time of every spk_trunk kernel under ncu, the builds taking turns in each
round, and whether their outputs are the same bits.

    python3 tools/kernels.py --ptx-dir variants/NAME/ptx build   # a variant, made here
    PYTHONPATH=. python3 tools/trunk_ab.py NAME=variants/NAME/ptx [...] \\
        [--tier sm90] [--math fp32 tf32] [--rounds 2] [--errors] [--out FILE]

The checkout's own `ptx/` is the build "tree". Each other build runs from a shadow of
the checkout (`pyspk` copied, `ptx` the build's folder, the rest linked), so pyspk loads
that build's artifacts; a build that is a whole checkout (a folder with `pyspk/`, such
as another branch's worktree) runs from itself, its own code with its own artifacts. A
run is `tools/trunk_kernels.py --forward` under ncu, one process per build, math and
round. Reported: the median microseconds of each kernel's launches in a forward per
build, their sum per chunk, and whether the outputs agree; with `--errors`, each build's
error against float64 (its first round's output, two chunks), for builds that sum in
another order.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from trunk_kernels import ERROR_CHUNKS, errors, kernel_times  # noqa: E402

BATCH = 32


def shadow(ptx: Path, into: Path) -> Path:
    """A folder that is the checkout but for `ptx`: `pyspk` copied (it finds its
    artifacts beside its own resolved path), `ptx` linked to the build's folder, every
    other entry of the root linked."""
    into.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name == "pyspk":
            shutil.copytree(entry, into / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif entry.name != "ptx":
            (into / entry.name).symlink_to(entry)
    (into / "ptx").symlink_to(ptx.resolve())
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", metavar="NAME=PTX_DIR")
    parser.add_argument("--tier", default="sm90")
    parser.add_argument("--math", nargs="+", default=["fp32", "tf32"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--errors", action="store_true",
        help="also each build's error against float64 (for builds whose sums differ)",
    )  # fmt: skip
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="pyspk-ab-") as scratch:
        roots = {"tree": ROOT}
        for spec in args.builds:
            name, _, folder = spec.partition("=")
            if name in roots:
                parser.error(f"{spec}: the build name {name!r} is taken")
            if (Path(folder) / "pyspk").is_dir():  # a whole checkout: its own code and ptx/
                roots[name] = Path(folder).resolve()
                continue
            if not (Path(folder) / "manifest.json").is_file():
                parser.error(f"{spec}: no manifest.json in {folder}; build it first")
            roots[name] = shadow(Path(folder), Path(scratch) / name)
        times: dict[tuple[str, str, str], list[float]] = {}
        digests: dict[tuple[str, str], set[str]] = {}
        saved: dict[tuple[str, str], Path] = {}  # (math, build): its first round's output
        for round_ in range(args.rounds):
            # the builds in turn, the order reversed every other round: a drift of the
            # device's clocks falls on every build
            order = list(roots.items())[:: -1 if round_ % 2 else 1]
            for math in args.math:
                for name, root in order:
                    env = {**os.environ, "PYTHONPATH": str(root)}
                    script = root / "tools" / "trunk_kernels.py"
                    save = None
                    if args.errors and round_ == 0:
                        save = saved[(math, name)] = Path(scratch) / f"{math}-{name}.npy"
                    launches, digest, loaded = kernel_times(args.tier, math, script, env, save)
                    digests.setdefault((math, name), set()).add(digest)
                    for kernel, each in launches.items():
                        times.setdefault((math, kernel, name), []).append(sum(each))
                    per_chunk = sum(map(sum, launches.values())) / BATCH
                    print(
                        f"round {round_} {math} {name}: {per_chunk:.1f} us a chunk, output "
                        f"{digest[:16]}, {loaded}",
                        flush=True,
                    )
        errors_found = errors(saved) if saved else {}
    lines = report(times, digests, list(roots), args, errors_found)
    print("\n".join(lines))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


def report(
    times: dict[tuple[str, str, str], list[float]],
    digests: dict[tuple[str, str], set[str]],
    names: list[str],
    args: argparse.Namespace,
    errors_found: dict[tuple[str, str], tuple[float, float]] | None = None,
) -> list[str]:
    """The table: per math and kernel, each build's median us of the kernel's launches
    in a forward, then the forward's kernels per chunk, whether every build and round
    gave the same output bits, and each build's error against float64 where measured
    (`errors_found`, by math and build)."""
    lines = [
        f"# trunk kernels, tier {args.tier}, batch {BATCH}, {args.rounds} rounds: median us "
        "of a kernel's launches in one forward (ncu --clock-control none)",
        "",
        f"{'math kernel':<44} " + " ".join(f"{name:>12}" for name in names),
    ]
    for math in args.math:
        medians = {
            (kernel, name): statistics.median(values)
            for (m, kernel, name), values in times.items()
            if m == math
        }
        for kernel in sorted({kernel for kernel, _ in medians}):
            cells = [medians.get((kernel, name)) for name in names]
            lines.append(
                f"{f'{math} {kernel}':<44} "
                + " ".join(f"{'-':>12}" if c is None else f"{c:>12.1f}" for c in cells)
            )
        totals = [
            sum(value for (_, name_), value in medians.items() if name_ == name) / BATCH
            for name in names
        ]
        lines.append(f"{f'{math} all, per chunk':<44} " + " ".join(f"{t:>12.1f}" for t in totals))
        seen = set().union(*(digests[(math, name)] for name in names))
        lines.append(f"{math}: outputs the same bits in every build and round: {len(seen) == 1}")
        for name in names:
            if errors_found and (math, name) in errors_found:
                largest, norm = errors_found[(math, name)]
                lines.append(
                    f"{math} {name}: error against float64 ({ERROR_CHUNKS} chunks) "
                    f"{largest:.3e} of the largest, {norm:.3e} norm-wise"
                )
    return lines


if __name__ == "__main__":
    sys.exit(main())
