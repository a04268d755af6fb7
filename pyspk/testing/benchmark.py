"""The benchmark of record's pure parts, importable without torch or a GPU: the tuples
and the `--tuples` / `--force` filters, the rule's picks as report rows, the summary
(speedups, the SIMT set, error checks) and the rendering of the report as markdown, JSON
and a chart. `tools/bench.py` measures the rows on a device and writes them with these."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from pyspk.candidate.errors import PlanError
from pyspk.candidate.framework import Fp16Policy
from pyspk.candidate.segdense import Area, Entry, Products, Reduction, SegdensePin, Site
from pyspk.candidate.segdense.pins import TUPLES
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import InvalidArgument
from pyspk.cuda.math import CudaMath
from pyspk.cuda.profiles import profile_key
from pyspk.cuda.tier import PtxTier

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
        raise InvalidArgument(f"tuple {text!r} has more than SITE:BATCH:MATH")
    parts += [""] * (3 - len(parts))
    site_text, batch_text, math_text = parts
    site = None
    if site_text not in _ANY:
        site = _SITE_ALIASES.get(site_text)
        if site is None:
            names = ", ".join(short_name(s) for s in Site)
            raise InvalidArgument(f"tuple {text!r}: unknown site {site_text!r} (sites: {names})")
    batch = None
    if batch_text not in _ANY:
        batch_text = batch_text.removeprefix("b")
        if batch_text not in ("1", "32"):
            raise InvalidArgument(f"tuple {text!r}: batch must be 1 or 32")
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
    raise InvalidArgument(f"unknown entry {text!r} (entries: {', '.join(e.name for e in Entry)})")


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
    return Area.driver_pin(
        case.site.boundary(), case.batch, case.math, device, tier, Fp16Policy.ALLOW
    )


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
    fields: dict[str, object] = dict(pin.fields())  # a plain dict: two keys popped
    splits = pin.splits()
    return {
        "key": case.key(),
        "boundary": case.site.value,
        "batch": case.batch,
        "math": str(case.math),
        "entry": fields.pop("entry"),
        "forced": forced,
        "simt": simt,
        "kernel": fields.pop("kernel"),
        "reduce_kernel": None if splits is None else Reduction.shape(splits).kernel,
        **fields,
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
        # the compiled library arm (bench --compiled): torch.compile of the same function
        "compiled_us": None,
        "compiled_max_abs": None,
        "compiled_rel_l2": None,
        # the compiled arm's whole setup: compile and autotune, eager warm-up and error,
        # graph capture
        "compile_seconds": None,
        "compiled_round_ms": [],
    }


# -- summary ---------------------------------------------------------------------------


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive values; None for none."""
    values = list(values)
    if not values:
        return None
    if any(not v > 0 for v in values):
        raise InvalidArgument(f"geometric mean of non-positive values {values}")
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
        **_compiled_summary(measured),
    }


def _compiled_summary(measured: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Over the picks the compiled arm measured too: pyspk's speedup over it, the tuples
    where it beats pyspk, and those where it beats the eager library."""
    rows = [row for row in measured if row.get("compiled_us") is not None]
    if not rows:
        return {}
    return {
        "compiled_measured": [row["key"] for row in rows],
        "compiled_geomean_speedup": geomean(row["compiled_us"] / row["pyspk_us"] for row in rows),
        "compiled_faster_than_pyspk": [
            row["key"] for row in rows if row["compiled_us"] < row["pyspk_us"]
        ],
        "compiled_faster_than_library": [
            row["key"] for row in rows if row["compiled_us"] < row["library_us"]
        ],
    }


# -- rendering -------------------------------------------------------------------------


def format_number(value: float | None, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def _errors(max_abs: float | None, rel_l2: float | None) -> str:
    if max_abs is None and rel_l2 is None:
        return "-"
    return f"{format_number(max_abs, '.2e')} / {format_number(rel_l2, '.2e')}"


def format_speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def method_line(meta: Mapping[str, Any]) -> str:
    arms = "library, compiled library, pyspk" if meta.get("compiled") else "library, pyspk"
    return (
        f"each arm a CUDA graph of {meta['graph_enqueues']} enqueues on one shared stream; "
        f"{meta['warmup_rounds']} warm-up then {meta['rounds']} interleaved rounds "
        f"({arms}), CUDA events around each replay, a spin kernel before each round; "
        "median per arm / enqueues = per-enqueue us; speedup = library / pyspk. Errors: "
        "eager outputs of every arm against float64 on the same inputs (seed "
        f"{meta['seed']}). Host: median of {meta['host_samples']} chunks of "
        f"{meta['host_chunk']} eager pyspk enqueues (pyspk buffers), perf_counter_ns, "
        "synchronized outside the timed region"
    )


TABLE_HEADER = (
    "| boundary | batch | math | entry | kernel | splits | library us | pyspk us | speedup "
    "| library max-abs / rel-L2 | pyspk max-abs / rel-L2 | host us |"
)
COMPILED_HEADER = " compiled us | pyspk over compiled | compiled max-abs / rel-L2 |"


def table_header(compiled: bool) -> list[str]:
    """The table's header and rule; `compiled` adds the compiled arm's columns."""
    header = TABLE_HEADER + (COMPILED_HEADER if compiled else "")
    return [header, "|" + "---|" * (header.count("|") - 1)]


def _compiled_cells(row: Mapping[str, Any]) -> list[str]:
    compiled, ours = row.get("compiled_us"), row["pyspk_us"]
    ratio = None if compiled is None or ours is None else compiled / ours
    return [
        format_number(compiled, ".2f"),
        format_speedup(ratio),
        _errors(row.get("compiled_max_abs"), row.get("compiled_rel_l2")),
    ]


def table_row(row: Mapping[str, Any], compiled: bool = False) -> str:
    entry = row["entry"] + (" (forced)" if row["forced"] else "")
    splits = "-" if row["splits"] is None else str(row["splits"])
    library = _errors(row["library_max_abs"], row["library_rel_l2"])
    if row["status"] == MEASURED:
        pyspk_us = format_number(row["pyspk_us"], ".2f")
        pyspk_errors = _errors(row["pyspk_max_abs"], row["pyspk_rel_l2"])
        speedup = format_speedup(row["speedup"])
    else:
        pyspk_us, pyspk_errors, speedup = row["status"], "-", "-"
    cells = [
        row["boundary"],
        str(row["batch"]),
        row["math"],
        entry,
        f"`{row['kernel']}`",
        splits,
        format_number(row["library_us"], ".2f"),
        pyspk_us,
        speedup,
        library,
        pyspk_errors,
        format_number(row["host_us"], ".2f"),
    ]
    if compiled:
        cells += _compiled_cells(row)
    return "| " + " | ".join(cells) + " |"


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    measured = summary["measured"]
    simt_set = summary["simt_set"]
    lines = [
        f"- geometric mean speedup over the {len(measured)} measured tuples: "
        f"{format_speedup(summary['geomean_speedup'])}",
        f"- SIMT set (the rule picks an FP32-product entry real in the sm75 tier), "
        f"{len(simt_set)} tuples: {', '.join(simt_set) or 'none'}",
        f"- SIMT set, {len(summary['simt_measured'])} measured: geometric mean "
        f"{format_speedup(summary['simt_geomean_speedup'])}, "
        f"minimum {format_speedup(summary['simt_min_speedup'])}"
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
    if "compiled_measured" in summary:
        faster = summary["compiled_faster_than_pyspk"]
        lines += [
            f"- compiled arm, {len(summary['compiled_measured'])} tuples: pyspk geometric "
            f"mean speedup over it {format_speedup(summary['compiled_geomean_speedup'])}",
            f"- compiled arm faster than pyspk: {', '.join(faster) or 'none'}",
            "- compiled arm faster than the eager library: "
            f"{', '.join(summary['compiled_faster_than_library']) or 'none'}",
        ]
    return lines


def render_markdown(
    meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> str:
    device = meta["device"]
    versions = meta["versions"]
    compiled = bool(meta.get("compiled"))
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
        *(
            [
                "- compiled arm: the same library function through `torch.compile(mode="
                '"max-autotune-no-cudagraphs")`, compiled per tuple after '
                "`torch._dynamo.reset()`, in the same math settings"
            ]
            if compiled
            else []
        ),
        f"- run: {meta['date']}, {meta['seconds']:.0f} s"
        + ("" if meta.get("complete", True) else " (incomplete: rows still to run)"),
        "",
        *table_header(compiled),
        *(table_row(row, compiled) for row in rows),
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


def output_stem(device_name: str, forced_tier: PtxTier | None, compiled: bool = False) -> str:
    tier = f"-{forced_tier}" if forced_tier is not None else ""
    return f"{device_slug(device_name)}{tier}-bench" + ("-compiled" if compiled else "")


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
    chart: bool = True,
) -> list[str]:
    """The report, the data and (with `chart`) the speedup chart; a line for each."""
    out.mkdir(parents=True, exist_ok=True)
    markdown, data = out / f"{stem}.md", out / f"{stem}.json"
    markdown.write_text(render_markdown(meta, rows, summary))
    data.write_text(render_json(meta, rows, summary))
    if not chart:
        return [f"report {markdown}", f"data {data}"]
    title = f"segdense speedup over the library, {meta['device']['name']} ({meta['tier']})"
    try:
        chart_line = write_chart(out / f"{stem}.png", rows, title)
    except Exception as error:  # the report and data are written; the chart is an extra
        chart_line = f"chart failed: {type(error).__name__}: {error}"
    return [f"report {markdown}", f"data {data}", chart_line]
