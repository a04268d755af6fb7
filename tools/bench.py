"""Benchmark of record: the segdense entry the device rule picks against the library path
(cuDNN / cuBLAS and the epilogue through PyTorch), side by side in one process on one
stream, for each of the 24 tuples (site x batch 1, 32 x FP32, TF32 math).

Method (DESIGN.md section 6): each arm is a CUDA graph of 20 enqueues captured after
eager warm-up; warm-up rounds, then interleaved timed rounds (library, pyspk) with CUDA
events around each replay, a spin kernel ahead of each round so the host never starves
the GPU; medians per arm, per-enqueue microseconds, speedup = library / pyspk. Both arms'
eager outputs are compared with float64 (`pyspk.reference`) on the same seeded inputs
(`pyspk.testing.operands`). Host cost: median over chunks of eager enqueues timed
with perf_counter_ns, synchronized outside the timed region (`pyspk.testing.per_launch_us`).

    PYTHONPATH=. python3 tools/bench.py [--rounds 50] [--tuples seg_1:32:fp32 ...]
        [--force EMBED_B32 ...] [--tier sm75] [--out benchmarks]
    PYTHONPATH=. python3 tools/bench.py --dry-run h200    # the plan only; no GPU, no torch

Writes <device>-bench.md, .json and .png into --out. The pure parts (tuple filter,
summary, rendering) import without torch or a GPU; tests/test_bench.py covers them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import platform
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from pyspk import testing
from pyspk.candidate.errors import PlanError
from pyspk.candidate.segdense.selection import (
    Entry,
    Products,
    Reduction,
    SegdensePin,
    Site,
)
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import KernelMissingError
from pyspk.cuda.math import CudaMath
from pyspk.cuda.profiles import profile, profile_key
from pyspk.cuda.tier import PtxTier, loadable_tier
from pyspk.pins import TUPLES, device_json

ROOT = Path(__file__).resolve().parents[1]

GRAPH_ENQUEUES = 20
ROUNDS = 50
WARMUP_ROUNDS = 5
EAGER_WARMUP = 3
REPLAY_WARMUP = 2
HOST_SAMPLES = 20
# about 0.5 ms at H200 clocks: far longer than the host needs to queue one round
SPIN_CYCLES = 1_000_000

MEASURED = "measured"
NOT_BUILT = "not built"
ERROR = "error"


# -- tuples and the filter -------------------------------------------------------------


def short_name(site: Site) -> str:
    """ "conv1", "linear0", "seg_1": the boundary name's last component."""
    return site.value.rsplit(".", 1)[-1]


@attrs.frozen
class Case:
    """One benchmark tuple."""

    site: Site
    batch: int
    math: CudaMath

    def key(self) -> str:
        """ "seg_1:32:fp32", the form `--tuples` takes."""
        return f"{short_name(self.site)}:{self.batch}:{self.math}"


ALL_CASES: tuple[Case, ...] = tuple(Case(site, batch, math) for site, batch, math in TUPLES)

# every spelling `--tuples` accepts for a site: enum name, boundary name, short name
_SITE_ALIASES: dict[str, Site] = {
    alias.lower(): site for site in Site for alias in (site.name, site.value, short_name(site))
} | {"classifier": Site.LINEAR2, "seg1": Site.EMBEDDING}

_ANY = ("", "*", "all")


@attrs.frozen
class Pattern:
    """A `--tuples` item: SITE[:BATCH[:MATH]], each part `*` (or left out) for any."""

    site: Site | None
    batch: int | None
    math: CudaMath | None

    def matches(self, case: Case) -> bool:
        return (
            (self.site is None or self.site is case.site)
            and (self.batch is None or self.batch == case.batch)
            and (self.math is None or self.math is case.math)
        )


def parse_pattern(text: str) -> Pattern:
    """`seg_1:32:fp32`, `conv1:1`, `linear2`, `*:32:tf32`; ValueError says what is wrong."""
    parts = [part.strip().lower() for part in text.strip().split(":")]
    if len(parts) > 3:
        raise ValueError(f"tuple {text!r} has more than SITE:BATCH:MATH")
    parts += [""] * (3 - len(parts))
    site_text, batch_text, math_text = parts
    site = None
    if site_text not in _ANY:
        site = _SITE_ALIASES.get(site_text)
        if site is None:
            names = ", ".join(short_name(s) for s in Site)
            raise ValueError(f"tuple {text!r}: unknown site {site_text!r} (sites: {names})")
    batch = None
    if batch_text not in _ANY:
        batch_text = batch_text.removeprefix("b")
        if batch_text not in ("1", "32"):
            raise ValueError(f"tuple {text!r}: batch must be 1 or 32")
        batch = int(batch_text)
    math_value = None if math_text in _ANY else CudaMath.parse(math_text)
    return Pattern(site, batch, math_value)


def parse_patterns(items: Iterable[str]) -> list[Pattern]:
    """Every comma-separated item of every `--tuples` argument."""
    return [parse_pattern(part) for item in items for part in item.split(",") if part.strip()]


def select_cases(patterns: Sequence[Pattern]) -> list[Case]:
    """The cases any pattern matches, in benchmark order; all 24 without patterns."""
    if not patterns:
        return list(ALL_CASES)
    return [case for case in ALL_CASES if any(p.matches(case) for p in patterns)]


def parse_entry(text: str) -> Entry:
    """An `Entry` by name (`EMBED_B32`) or value (`embed_b32`), any case."""
    wanted = text.strip().lower()
    for entry in Entry:
        if wanted in (entry.name.lower(), entry.value):
            return entry
    raise ValueError(f"unknown entry {text!r} (entries: {', '.join(e.name for e in Entry)})")


def forced_cases(entries: Sequence[Entry], cases: Sequence[Case]) -> list[tuple[Case, Entry]]:
    """(case, entry) for each forced entry in each selected case of its site and batch."""
    return [
        (case, entry)
        for entry in entries
        for case in cases
        if (case.site, case.batch) == (entry.site(), entry.batch())
    ]


# -- the rule's picks ------------------------------------------------------------------


def is_simt(entry: Entry) -> bool:
    """An FP32-product entry real in the sm75 tier (a SIMT kernel)."""
    return entry.products() is Products.FP32 and entry.tier() is PtxTier.SM75


def pick(case: Case, tier: PtxTier, device: DeviceAttributes) -> SegdensePin:
    return SegdensePin.select(case.site, case.batch, case.math, tier, device)


def simt_keys(tier: PtxTier, device: DeviceAttributes) -> list[str]:
    """The tuples (of all 24) where the device rule picks a SIMT entry."""
    return [case.key() for case in ALL_CASES if is_simt(pick(case, tier, device).entry())]


def forced_pin(
    entry: Entry, math: CudaMath, tier: PtxTier, device: DeviceAttributes
) -> SegdensePin | str:
    """The forced pin, or why `SegdensePin.forced` refuses it."""
    try:
        return SegdensePin.forced(entry, math, tier, device)
    except PlanError as error:
        return str(error)


def new_row(case: Case, pin: SegdensePin, *, forced: bool, simt: bool) -> dict[str, Any]:
    """A result row with every field present; the GPU run fills in the measurements."""
    config = pin.config()
    splits = pin.splits()
    return {
        "key": case.key(),
        "boundary": case.site.value,
        "batch": case.batch,
        "math": str(case.math),
        "entry": pin.entry().name,
        "forced": forced,
        "simt": simt,
        "kernel": config.kernel,
        "reduce_kernel": None if splits is None else Reduction.shape(splits).kernel,
        "splits": splits,
        "block": config.block,
        "shared": config.shared,
        "status": MEASURED,
        "note": "",
        "library_us": None,
        "pyspk_us": None,
        "speedup": None,
        "round_ratio_median": None,
        "library_max_abs": None,
        "library_rel_l2": None,
        "pyspk_max_abs": None,
        "pyspk_rel_l2": None,
        "host_us": None,
        "replay_bit_identical": None,
        "seconds": None,
        "library_round_ms": [],
        "pyspk_round_ms": [],
    }


# -- summary ---------------------------------------------------------------------------


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive values; None for none."""
    values = list(values)
    if not values:
        return None
    if any(not v > 0 for v in values):
        raise ValueError(f"geometric mean of non-positive values {values}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _measured(row: Mapping[str, Any]) -> bool:
    return row["status"] == MEASURED and row["speedup"] is not None


def accuracy_ok(row: Mapping[str, Any]) -> bool | None:
    """pyspk rel-L2 <= 2x the library's; None where either is missing."""
    ours, library = row.get("pyspk_rel_l2"), row.get("library_rel_l2")
    if ours is None or library is None:
        return None
    return bool(ours <= 2 * library)


def summarize(rows: Sequence[Mapping[str, Any]], simt: Sequence[str]) -> dict[str, Any]:
    """Speedup summaries over the rule's picks that were measured (forced rows are extra
    and stay out), the SIMT set, and the FP32 accuracy check."""
    picks = [row for row in rows if not row["forced"]]
    measured = [row for row in picks if _measured(row)]
    simt_set = set(simt)
    simt_rows = [row for row in measured if row["key"] in simt_set]
    fastest_floor = min(simt_rows, key=lambda row: row["speedup"], default=None)
    fp32 = [row for row in measured if row["math"] == str(CudaMath.FP32)]
    failing = [row["key"] for row in fp32 if accuracy_ok(row) is not True]
    return {
        "measured": [row["key"] for row in measured],
        "geomean_speedup": geomean(row["speedup"] for row in measured),
        "simt_set": list(simt),
        "simt_measured": [row["key"] for row in simt_rows],
        "simt_geomean_speedup": geomean(row["speedup"] for row in simt_rows),
        "simt_min_speedup": None if fastest_floor is None else fastest_floor["speedup"],
        "simt_min_key": None if fastest_floor is None else fastest_floor["key"],
        "fp32_accuracy_checked": [row["key"] for row in fp32],
        "fp32_accuracy_failing": failing,
        # the picks outside the SIMT set, which must be as exact as the library in
        # their own math mode: pyspk rel-L2 over the library's
        "tensor_error_ratios": {
            row["key"]: row["pyspk_rel_l2"] / row["library_rel_l2"]
            for row in measured
            if row["key"] not in simt_set and row.get("library_rel_l2")
        },
        "not_built": [row["key"] for row in picks if row["status"] == NOT_BUILT],
        "errors": [f"{row['key']} {row['entry']}" for row in rows if row["status"] == ERROR],
    }


# -- rendering -------------------------------------------------------------------------


def _num(value: float | None, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def _errors(max_abs: float | None, rel_l2: float | None) -> str:
    if max_abs is None and rel_l2 is None:
        return "-"
    return f"{_num(max_abs, '.2e')} / {_num(rel_l2, '.2e')}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def method_line(meta: Mapping[str, Any]) -> str:
    return (
        f"each arm a CUDA graph of {meta['graph_enqueues']} enqueues on one shared stream; "
        f"{meta['warmup_rounds']} warm-up then {meta['rounds']} interleaved rounds "
        "(library, pyspk), CUDA events around each replay, a spin kernel before each round; "
        "median per arm / enqueues = per-enqueue us; speedup = library / pyspk. Errors: "
        "eager outputs of both arms against float64 on the same inputs (seed "
        f"{meta['seed']}). Host: median of {meta['host_samples']} chunks of "
        f"{meta['host_chunk']} eager pyspk enqueues (pyspk buffers), perf_counter_ns, "
        "synchronized outside the timed region"
    )


TABLE_HEADER = (
    "| boundary | batch | math | entry | kernel | splits | library us | pyspk us | speedup "
    "| library max-abs / rel-L2 | pyspk max-abs / rel-L2 | host us |"
)


def table_row(row: Mapping[str, Any]) -> str:
    entry = row["entry"] + (" (forced)" if row["forced"] else "")
    splits = "-" if row["splits"] is None else str(row["splits"])
    library = _errors(row["library_max_abs"], row["library_rel_l2"])
    if row["status"] == MEASURED:
        pyspk_us = _num(row["pyspk_us"], ".2f")
        pyspk_errors = _errors(row["pyspk_max_abs"], row["pyspk_rel_l2"])
        speedup = _x(row["speedup"])
    else:
        pyspk_us, pyspk_errors, speedup = row["status"], "-", "-"
    cells = [
        row["boundary"],
        str(row["batch"]),
        row["math"],
        entry,
        f"`{row['kernel']}`",
        splits,
        _num(row["library_us"], ".2f"),
        pyspk_us,
        speedup,
        library,
        pyspk_errors,
        _num(row["host_us"], ".2f"),
    ]
    return "| " + " | ".join(cells) + " |"


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    measured = summary["measured"]
    simt_set = summary["simt_set"]
    lines = [
        f"- geometric mean speedup over the {len(measured)} measured tuples: "
        f"{_x(summary['geomean_speedup'])}",
        f"- SIMT set (the rule picks an FP32-product entry real in the sm75 tier), "
        f"{len(simt_set)} tuples: {', '.join(simt_set) or 'none'}",
        f"- SIMT set, {len(summary['simt_measured'])} measured: geometric mean "
        f"{_x(summary['simt_geomean_speedup'])}, minimum {_x(summary['simt_min_speedup'])}"
        + (f" ({summary['simt_min_key']})" if summary["simt_min_key"] else ""),
    ]
    checked, failing = summary["fp32_accuracy_checked"], summary["fp32_accuracy_failing"]
    verdict = "all pass" if not failing else "fail: " + ", ".join(failing)
    lines.append(
        f"- FP32 math, pyspk rel-L2 <= 2x the library's: {len(checked) - len(failing)}/"
        f"{len(checked)} measured tuples ({verdict if checked else 'none measured'})"
    )
    ratios = summary.get("tensor_error_ratios", {})
    if ratios:
        lines.append(
            "- outside the SIMT set, pyspk rel-L2 / the library's in the same math: "
            + ", ".join(f"{key} {ratio:.7f}" for key, ratio in ratios.items())
        )
    if summary["not_built"]:
        lines.append(
            f"- not built (library timed, excluded from the summaries): "
            f"{', '.join(summary['not_built'])}"
        )
    if summary["errors"]:
        lines.append(f"- errors (see the JSON notes): {', '.join(summary['errors'])}")
    return lines


def render_markdown(
    meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> str:
    device = meta["device"]
    versions = meta["versions"]
    lines = [
        f"# segdense benchmark: {device['name']}",
        "",
        f"- device: {device['name']}, compute capability {device['capability']}, "
        f"{device['multiprocessors']} SMs, opt-in shared {device['shared_optin_bytes']} B, "
        f"L2 {device['l2_bytes'] // (1024 * 1024)} MiB",
        f"- driver CUDA {versions['driver']}; torch {versions['torch']} (CUDA "
        f"{versions['torch_cuda']}, cuDNN {versions['cudnn']}); cuda-bindings "
        f"{versions['cuda_bindings']}; numpy {versions['numpy']}; Python {versions['python']}",
        f"- kernels: segdense tier {meta['tier']}, artifact {meta['artifact']}",
        f"- method: {method_line(meta)}",
        f"- library settings: FP32 math sets torch.backends.cuda.matmul.allow_tf32 and "
        f"torch.backends.cudnn.allow_tf32 False, TF32 math True; cudnn.benchmark "
        f"{meta['cudnn_benchmark']}",
        f"- run: {meta['date']}, {meta['seconds']:.0f} s",
        "",
        TABLE_HEADER,
        "|" + "---|" * 12,
        *(table_row(row) for row in rows),
        "",
        "## Summary",
        "",
        *summary_lines(summary),
    ]
    if any(row["forced"] for row in rows):
        lines.append("- forced rows (`--force`) are extra and stay out of the summaries")
    notes = [
        f"- {row['key']} {row['entry']}: {row['note']}"
        for row in rows
        if row["note"] and row["status"] != NOT_BUILT
    ]
    unequal = [
        f"{row['key']} {row['entry']}" for row in rows if row["replay_bit_identical"] is False
    ]
    if unequal:
        notes.append(f"- graph replay differs from the eager bits: {', '.join(unequal)}")
    if notes:
        lines += ["", "## Notes", "", *notes]
    return "\n".join(lines) + "\n"


def _jsonable(value: Any) -> Any:
    """NaN and infinities become null (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def render_json(
    meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> str:
    document = {"meta": meta, "summary": summary, "rows": list(rows)}
    return json.dumps(_jsonable(document), indent=2, allow_nan=False) + "\n"


def device_slug(name: str) -> str:
    """The profile name of a known GPU ("NVIDIA H200" -> "h200"), else the name in
    lower-case letters, digits and dashes."""
    try:
        return profile_key(name)
    except KeyError:
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
        return slug or "device"


def output_stem(device_name: str, forced_tier: PtxTier | None) -> str:
    tier = f"-{forced_tier}" if forced_tier is not None else ""
    return f"{device_slug(device_name)}{tier}-bench"


def write_chart(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> str:
    """A bar chart of the measured speedups; a message saying what happened."""
    measured = [row for row in rows if _measured(row)]
    if not measured:
        return "chart skipped: no measured tuple"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return "chart skipped: matplotlib is not installed"
    labels = [row["key"] + (f"\n{row['entry']}" if row["forced"] else "") for row in measured]
    colors = [
        "tab:gray" if row["forced"] else ("tab:blue" if row["simt"] else "tab:orange")
        for row in measured
    ]
    figure, axes = plt.subplots(figsize=(max(6.0, 0.45 * len(measured) + 2), 4.5))
    bars = axes.bar(range(len(measured)), [row["speedup"] for row in measured], color=colors)
    axes.bar_label(bars, fmt="%.2f", fontsize=6)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(measured)), labels, rotation=60, ha="right", fontsize=7)
    axes.set_ylabel("speedup (library / pyspk)")
    axes.set_title(title, fontsize=9)
    axes.legend(
        handles=[
            Patch(color="tab:blue", label="SIMT pick"),
            Patch(color="tab:orange", label="other pick"),
            Patch(color="tab:gray", label="forced"),
        ],
        fontsize=7,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return f"chart {path}"


def write_outputs(
    out: Path,
    stem: str,
    meta: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    markdown, data = out / f"{stem}.md", out / f"{stem}.json"
    markdown.write_text(render_markdown(meta, rows, summary))
    data.write_text(render_json(meta, rows, summary))
    title = f"segdense speedup over the library, {meta['device']['name']} ({meta['tier']})"
    try:
        chart = write_chart(out / f"{stem}.png", rows, title)
    except Exception as error:  # the report and data are written; the chart is an extra
        chart = f"chart failed: {type(error).__name__}: {error}"
    return [f"report {markdown}", f"data {data}", chart]


# -- measuring (torch and a GPU from here on) ------------------------------------------


class Bench:
    """One stream shared by PyTorch and a `CudaRuntime` adopting it, the loaded module,
    and the operands and float64 truth of each (site, batch), made once."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from pyspk.cuda.kernels import KernelModule
        from pyspk.cuda.runtime import CudaRuntime

        if not torch.cuda.is_available():
            raise SystemExit("bench: PyTorch sees no CUDA device")
        self.torch = torch
        self.args = args
        self.ordinal = args.device
        torch.manual_seed(args.seed)
        torch.cuda.set_device(self.ordinal)
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
        self.stream = torch.cuda.Stream(device=self.ordinal)
        self.runtime = CudaRuntime(self.ordinal, ptx_tier=args.tier, stream=self.stream)
        self.kernels = self.runtime.load_kernels(KernelModule.SEGDENSE)
        self.sleep = getattr(torch.cuda, "_sleep", None)
        self._operands: dict[tuple[Site, int], Any] = {}
        self._truth: dict[tuple[Site, int], Any] = {}

    @property
    def device(self) -> DeviceAttributes:
        return self.runtime.device

    def operands(self, site: Site, batch: int) -> dict[str, Any]:
        if (site, batch) not in self._operands:
            self._operands.clear()  # rows of one (site, batch) run together
            self._truth.clear()
            self._operands[site, batch] = testing.operands(site, batch, self.args.seed)
        return self._operands[site, batch]

    def truth(self, site: Site, batch: int) -> Any:
        """Float64 output, flat."""
        if (site, batch) not in self._truth:
            self._truth[site, batch] = testing.truth(site, batch, self.operands(site, batch))[0]
        return self._truth[site, batch]

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()
        self.runtime.synchronize()

    # -- one row --------------------------------------------------------------------

    def measure(self, case: Case, row: dict[str, Any], pin: SegdensePin) -> None:
        started = time.perf_counter()
        library = pyspk = None
        try:
            library = self._library(case, row)
            try:
                pyspk = self._pyspk(case, row, pin)
            except KernelMissingError as error:
                row["status"], row["note"] = NOT_BUILT, str(error)
            arms = [library.replay] if pyspk is None else [library.replay, pyspk.replay]
            samples = self._rounds(arms)
            per_enqueue = [statistics.median(arm) * 1000 / GRAPH_ENQUEUES for arm in samples]
            row["library_round_ms"] = samples[0]
            row["library_us"] = per_enqueue[0]
            if pyspk is not None:
                row["pyspk_round_ms"] = samples[1]
                row["pyspk_us"] = per_enqueue[1]
                row["speedup"] = per_enqueue[0] / per_enqueue[1]
                ratios = [a / b for a, b in zip(samples[0], samples[1], strict=True)]
                row["round_ratio_median"] = statistics.median(ratios)
                row["replay_bit_identical"] = pyspk.replay_matches_eager()
        except Exception as error:
            row["status"] = ERROR
            row["note"] = f"{type(error).__name__}: {error}"
            traceback.print_exc()
        finally:
            for arm in (pyspk, library):
                if arm is not None:
                    with contextlib.suppress(Exception):
                        arm.close()
            with contextlib.suppress(Exception):
                self.synchronize()
            gc.collect()
            self.torch.cuda.empty_cache()
            row["seconds"] = time.perf_counter() - started

    def _library(self, case: Case, row: dict[str, Any]) -> _LibraryArm:
        arm = _LibraryArm(self, case)
        try:
            row["library_max_abs"], row["library_rel_l2"] = arm.errors
        except BaseException:
            with contextlib.suppress(Exception):
                arm.close()
            raise
        return arm

    def _pyspk(self, case: Case, row: dict[str, Any], pin: SegdensePin) -> _PyspkArm:
        arm = _PyspkArm(self, case, pin)
        try:
            row["pyspk_max_abs"], row["pyspk_rel_l2"] = arm.errors
            row["host_us"] = arm.host_us()
        except BaseException:
            with contextlib.suppress(Exception):
                arm.close()
            raise
        return arm

    def _rounds(self, replays: Sequence[Callable[[], None]]) -> list[list[float]]:
        """Milliseconds of each replay in each timed round, per arm."""
        torch, stream = self.torch, self.stream

        def run(rounds: int) -> list[list[tuple[Any, Any]]]:
            events: list[list[tuple[Any, Any]]] = [[] for _ in replays]
            for _ in range(rounds):
                if self.sleep is not None and self.args.spin_cycles > 0:
                    # the host queues the whole round while the GPU spins
                    self.sleep(self.args.spin_cycles)
                for arm, replay in enumerate(replays):
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record(stream)
                    replay()
                    end.record(stream)
                    events[arm].append((start, end))
            stream.synchronize()
            return events

        self.synchronize()
        run(self.args.warmup_rounds)
        timed = run(self.args.rounds)
        return [[start.elapsed_time(end) for start, end in arm] for arm in timed]


class _LibraryArm:
    """The PyTorch path on the shared stream: eager errors, then a graph of 20 calls."""

    def __init__(self, bench: Bench, case: Case) -> None:
        self.graph: Any = None
        self.outputs: list[Any] = []
        self.tensors: dict[str, Any] = {}
        try:
            self._setup(bench, case)
        except BaseException:
            with contextlib.suppress(Exception):  # keep the setup's error
                self.close()
            raise

    def _setup(self, bench: Bench, case: Case) -> None:
        torch = bench.torch
        ops = bench.operands(case.site, case.batch)
        device = torch.device("cuda", bench.ordinal)
        # kept alive for the graph's lifetime
        self.tensors = {name: torch.from_numpy(value).to(device) for name, value in ops.items()}
        x, w, bias = self.tensors["x"], self.tensors["w"], self.tensors.get("bias")
        call = testing.library_call(torch, case.site, x, w, bias)
        with testing.library_math(torch, case.math):
            for _ in range(EAGER_WARMUP):
                call()
            eager = call()
            torch.cuda.synchronize()
            self.errors = testing.errors(
                eager.detach().cpu().numpy(), bench.truth(case.site, case.batch)
            )
            del eager
            self.graph = torch.cuda.CUDAGraph()
            gc.collect()
            gc.disable()  # no collector-run frees while torch captures
            try:
                with torch.cuda.graph(self.graph, stream=bench.stream):
                    self.outputs = [call() for _ in range(GRAPH_ENQUEUES)]
            finally:
                gc.enable()
        for _ in range(REPLAY_WARMUP):
            self.graph.replay()
        torch.cuda.synchronize()

    def replay(self) -> None:
        self.graph.replay()

    def close(self) -> None:
        if self.graph is not None:
            self.graph.reset()
            self.graph = None
        self.outputs = []
        self.tensors = {}


class _PyspkArm:
    """The picked plan on the runtime adopting the shared stream: eager errors, host cost,
    then a graph of 20 enqueues into preallocated outputs."""

    def __init__(self, bench: Bench, case: Case, pin: SegdensePin) -> None:
        self._runtime = bench.runtime
        self._samples = bench.args.host_samples
        self.graph: Any = None
        self.oxide: Any = None
        self._buffers: list[Any] = []
        try:
            self._setup(bench, case, pin)
        except BaseException:
            with contextlib.suppress(Exception):  # keep the setup's error
                self.close()
            raise

    def _setup(self, bench: Bench, case: Case, pin: SegdensePin) -> None:
        import numpy as np

        runtime = self._runtime
        ops = bench.operands(case.site, case.batch)
        self.oxide = testing.plan_pin(runtime, bench.kernels, pin, ops)
        producer = self.oxide.producer
        self.x = self._keep(runtime.upload(ops["x"]))
        if len(self.x) != producer.input_len:
            raise RuntimeError(
                f"input has {len(self.x)} floats, the plan takes {producer.input_len}"
            )
        self.outputs = [
            self._keep(runtime.alloc_zeros(producer.output_len)) for _ in range(GRAPH_ENQUEUES)
        ]
        for _ in range(EAGER_WARMUP):
            self.oxide.enqueue(self.x, self.outputs[0])
        runtime.synchronize()
        # a kernel that writes nothing shows as NaN
        poisoned = self._keep(runtime.upload(np.full(producer.output_len, np.nan, np.float32)))
        self.oxide.enqueue(self.x, poisoned)
        self.eager = runtime.download(poisoned)
        self.errors = testing.errors(self.eager, bench.truth(case.site, case.batch))

        def enqueue_all() -> None:
            for output in self.outputs:
                self.oxide.enqueue(self.x, output)

        gc.collect()
        self.graph = runtime.capture(enqueue_all)
        for _ in range(REPLAY_WARMUP):
            self.graph.replay()
        runtime.synchronize()

    def _keep(self, buffer: Any) -> Any:
        self._buffers.append(buffer)
        return buffer

    def host_us(self) -> float:
        """Median microseconds to queue one eager enqueue."""
        oxide, x, y = self.oxide, self.x, self.outputs[0]
        return testing.per_launch_us(self._runtime, lambda: oxide.enqueue(x, y), self._samples)

    def replay(self) -> None:
        self.graph.replay()

    def replay_matches_eager(self) -> bool:
        """Whether the last replayed output has the eager output's bits."""
        import numpy as np

        replayed = self._runtime.download(self.outputs[-1])
        return bool(np.array_equal(replayed.view(np.uint32), self.eager.view(np.uint32)))

    def close(self) -> None:
        if self.graph is not None:
            self.graph.close()
            self.graph = None
        self._runtime.synchronize()
        buffers, self._buffers = self._buffers, []
        for buffer in buffers:
            buffer.free()
        if self.oxide is not None:
            self.oxide.close()
            self.oxide = None


def _versions(torch: Any) -> dict[str, str]:
    from importlib import metadata

    import numpy as np

    from pyspk.cuda import driver

    raw = int(driver.call("cuDriverGetVersion"))
    try:
        bindings = metadata.version("cuda-bindings")
    except metadata.PackageNotFoundError:
        bindings = "unknown"
    return {
        "driver": f"{raw // 1000}.{raw % 1000 // 10} ({raw})",
        "torch": torch.__version__,
        "torch_cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()),
        "cuda_bindings": bindings,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def _device_meta(device: DeviceAttributes) -> dict[str, Any]:
    return {**device_json(device), "l2_bytes": device.l2_bytes}


def planned_rows(
    cases: Sequence[Case], forced: Sequence[Entry], tier: PtxTier, device: DeviceAttributes
) -> tuple[list[tuple[Case, dict[str, Any], SegdensePin]], list[str]]:
    """(case, row, pin) in run order, each case's forced entries after its pick, and a
    line for each forced pin refused."""
    simt = set(simt_keys(tier, device))
    refused = []
    extra: dict[Case, list[tuple[Entry, SegdensePin]]] = {}
    for case, entry in forced_cases(forced, cases):
        pin = forced_pin(entry, case.math, tier, device)
        if isinstance(pin, str):
            refused.append(f"{entry.name} {case.key()}: {pin}")
        else:
            extra.setdefault(case, []).append((entry, pin))
    plan = []
    for case in cases:
        pin = pick(case, tier, device)
        plan.append((case, new_row(case, pin, forced=False, simt=case.key() in simt), pin))
        for _, forced_one in extra.get(case, []):
            plan.append((case, new_row(case, forced_one, forced=True, simt=False), forced_one))
    return plan, refused


def run(args: argparse.Namespace, cases: Sequence[Case], forced: Sequence[Entry]) -> int:
    started = time.perf_counter()
    bench = Bench(args)
    torch = bench.torch
    with torch.cuda.device(bench.ordinal), torch.cuda.stream(bench.stream):
        device, tier = bench.device, bench.kernels.tier
        plan, refused = planned_rows(cases, forced, tier, device)
        print(
            f"{device.name}: capability {device.capability}, {device.multiprocessors} SMs; "
            f"segdense {bench.kernels.artifact}; {len(plan)} rows, {args.rounds} rounds",
            flush=True,
        )
        for line in refused:
            print(f"forced pin refused: {line}", flush=True)
        if bench.sleep is None:
            print("torch.cuda._sleep is missing: rounds run without the spin kernel")
        rows = []
        for index, (case, row, pin) in enumerate(plan, 1):
            bench.measure(case, row, pin)
            rows.append(row)
            print(f"[{index:2}/{len(plan)}] {progress_line(row)}", flush=True)
        simt = simt_keys(tier, device)
        summary = summarize(rows, simt)
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": _device_meta(device),
            "versions": _versions(torch),
            "tier": str(tier),
            "artifact": bench.kernels.artifact,
            "graph_enqueues": GRAPH_ENQUEUES,
            "rounds": args.rounds,
            "warmup_rounds": args.warmup_rounds,
            "spin_cycles": args.spin_cycles if bench.sleep is not None else 0,
            "host_chunk": testing.CHUNK,
            "host_samples": args.host_samples,
            "seed": args.seed,
            "cudnn_benchmark": args.cudnn_benchmark,
            "tuples": [case.key() for case in cases],
            "forced": [entry.name for entry in forced],
            "forced_refused": refused,
            "argv": sys.argv[1:],
            "seconds": time.perf_counter() - started,
        }
        stem = output_stem(device.name, args.tier)
        for line in summary_lines(summary):
            print(line)
        for line in write_outputs(args.out, stem, meta, rows, summary):
            print(line)
    bench.runtime.close()
    return 1 if summary["errors"] else 0


def progress_line(row: Mapping[str, Any]) -> str:
    name = row["entry"] + (" (forced)" if row["forced"] else "")
    head = f"{row['key']:<16} {name:<24}"
    seconds = f"({_num(row['seconds'], '.1f')} s)"
    if row["status"] == ERROR:
        return f"{head} error: {row['note']} {seconds}"
    library = f"library {_num(row['library_us'], '9.2f')} us"
    if row["status"] == NOT_BUILT:
        return f"{head} {library}  pyspk not built {seconds}"
    return (
        f"{head} {library}  pyspk {_num(row['pyspk_us'], '9.2f')} us  "
        f"{_x(row['speedup'])}  host {_num(row['host_us'], '.2f')} us {seconds}"
    )


def dry_run(name: str, tier: PtxTier | None, cases: Sequence[Case], forced: Sequence[Entry]) -> int:
    """Print the rows a run would time on a named profile; no GPU, no torch."""
    device = profile(name)
    try:
        loaded = loadable_tier(device.capability, tier)
    except ValueError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    plan, refused = planned_rows(cases, forced, loaded, device)
    print(f"{device.name} (profile {profile_key(name)}), tier {loaded}: {len(plan)} rows")
    for case, row, _ in plan:
        splits = "" if row["splits"] is None else f" x{row['splits']}"
        marks = (" simt" if row["simt"] else "") + (" forced" if row["forced"] else "")
        print(f"  {case.key():<16} {row['entry']}{splits} `{row['kernel']}`{marks}")
    for line in refused:
        print(f"forced pin refused: {line}")
    simt = simt_keys(loaded, device)
    print(f"SIMT set, {len(simt)} tuples: {', '.join(simt)}")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="timed rounds per row")
    parser.add_argument("--warmup-rounds", type=int, default=WARMUP_ROUNDS)
    parser.add_argument(
        "--tuples",
        action="append",
        default=[],
        metavar="SITE[:BATCH[:MATH]]",
        help="only these tuples (repeatable, comma-separated), e.g. seg_1:32:fp32, conv1",
    )
    parser.add_argument(
        "--force",
        action="append",
        default=[],
        metavar="ENTRY",
        help="also time this entry (repeatable) in its site/batch, each math its pin allows",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--tier", type=PtxTier.parse, default=None, help="force a PTX tier")
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host-samples", type=int, default=HOST_SAMPLES)
    parser.add_argument("--spin-cycles", type=int, default=SPIN_CYCLES)
    parser.add_argument(
        "--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms"
    )
    parser.add_argument(
        "--dry-run", metavar="PROFILE", help="print the rows for a device profile and exit"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup_rounds < 0 or args.host_samples < 1:
        parser.error("--rounds and --host-samples must be >= 1, --warmup-rounds >= 0")
    try:
        args.cases = select_cases(parse_patterns(args.tuples))
        args.entries = list(dict.fromkeys(parse_entry(name) for name in args.force))
        if args.dry_run is not None:
            profile_key(args.dry_run)
    except (ValueError, KeyError) as error:
        parser.error(str(error).strip("'\""))
    if not args.cases:
        parser.error("--tuples selects no tuple")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run is not None:
        return dry_run(args.dry_run, args.tier, args.cases, args.entries)
    return run(args, args.cases, args.entries)


if __name__ == "__main__":
    raise SystemExit(main())
