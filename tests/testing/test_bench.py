"""`pyspk.testing.benchmark`, the benchmark's pure parts, and tools/bench.py's dry run: the tuple
filter, the device rule's SIMT set, the summary arithmetic and the report and JSON
rendering, on fake results (no torch, no GPU)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyspk.candidate.segdense import Entry, SegdensePin, Site
from pyspk.cuda import CudaMath, PtxTier
from pyspk.cuda.profiles import profile
from pyspk.testing import benchmark
from tests.repo import load_tool

ROOT = Path(__file__).resolve().parents[2]
H200 = profile("h200")
# the tuples whose H200 pick is an FP32-product entry real in the sm75 tier
H200_SIMT = [
    "conv1:1:fp32",
    "conv1:1:tf32",
    "conv2:1:fp32",
    "conv2:1:tf32",
    "linear0:1:fp32",
    "linear0:32:fp32",
    "linear1:1:fp32",
    "linear1:32:fp32",
    "linear2:1:fp32",
    "linear2:1:tf32",
    "linear2:32:fp32",
    "linear2:32:tf32",
    "seg_1:1:fp32",
    "seg_1:1:tf32",
]


bench = load_tool("bench")


# -- tuples and the filter -------------------------------------------------------------


def test_all_cases_in_site_batch_math_order() -> None:
    keys = [case.key() for case in benchmark.ALL_CASES]
    assert len(keys) == len(set(keys)) == 24
    assert keys[:4] == ["conv1:1:fp32", "conv1:1:tf32", "conv1:32:fp32", "conv1:32:tf32"]
    assert keys[-1] == "seg_1:32:tf32"
    sites = [case.site for case in benchmark.ALL_CASES]
    assert sites == sorted(sites, key=list(Site).index)


@pytest.mark.parametrize(
    ("text", "site", "batch", "math"),
    [
        ("seg_1:32:fp32", Site.EMBEDDING, 32, CudaMath.FP32),
        ("resnet.seg_1:32:FP32", Site.EMBEDDING, 32, CudaMath.FP32),
        ("EMBEDDING:1", Site.EMBEDDING, 1, None),
        ("sincnet.conv1", Site.CONV1, None, None),
        ("conv2:b32:tf32", Site.CONV2, 32, CudaMath.TF32),
        ("classifier", Site.LINEAR2, None, None),
        ("*:32:tf32", None, 32, CudaMath.TF32),
        ("linear0::fp32", Site.LINEAR0, None, CudaMath.FP32),
        (" linear1 : * : tf32 ", Site.LINEAR1, None, CudaMath.TF32),
    ],
)
def test_parse_pattern(text: str, site: Site | None, batch: int | None, math: Any) -> None:
    assert benchmark.parse_pattern(text) == benchmark.Pattern(site, batch, math)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("conv3", "unknown site"),
        ("conv1:16", "batch must be 1 or 32"),
        ("conv1:1:fp16", "fp16"),
        ("conv1:1:fp32:x", "more than"),
    ],
)
def test_parse_pattern_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        benchmark.parse_pattern(text)


def test_select_cases_keeps_benchmark_order_without_duplicates() -> None:
    assert benchmark.select_cases([]) == list(benchmark.ALL_CASES)
    patterns = benchmark.parse_patterns(["seg_1:1", "conv1,,seg_1:1:fp32"])
    keys = [case.key() for case in benchmark.select_cases(patterns)]
    assert keys == [
        "conv1:1:fp32",
        "conv1:1:tf32",
        "conv1:32:fp32",
        "conv1:32:tf32",
        "seg_1:1:fp32",
        "seg_1:1:tf32",
    ]
    only = benchmark.select_cases(benchmark.parse_patterns(["seg_1:32:fp32"]))
    assert only == [benchmark.Case(Site.EMBEDDING, 32, CudaMath.FP32)]


def test_parse_entry() -> None:
    assert benchmark.parse_entry("EMBED_B32_X3") is Entry.EMBED_B32_X3
    assert benchmark.parse_entry("embed_b32_x3") is Entry.EMBED_B32_X3
    assert benchmark.parse_entry(" Classifier_B1 ") is Entry.CLASSIFIER_B1
    with pytest.raises(ValueError, match="unknown entry"):
        benchmark.parse_entry("EMBED_B64")


def test_forced_cases_follow_the_entry_site_and_batch() -> None:
    cases = benchmark.select_cases(benchmark.parse_patterns(["seg_1", "conv1:1:fp32"]))
    pairs = benchmark.forced_cases([Entry.EMBED_B32, Entry.CONV1_B1, Entry.LINEAR0_B1], cases)
    assert [(case.key(), entry) for case, entry in pairs] == [
        ("seg_1:32:fp32", Entry.EMBED_B32),
        ("seg_1:32:tf32", Entry.EMBED_B32),
        ("conv1:1:fp32", Entry.CONV1_B1),
    ]


def test_planned_rows_put_forced_entries_after_the_pick_and_skip_refused_maths() -> None:
    cases = benchmark.select_cases(benchmark.parse_patterns(["seg_1:32"]))
    plan, refused = bench.planned_rows(
        cases, [Entry.EMBED_B32_TF32, Entry.EMBED_B32], PtxTier.SM80, H200
    )
    described = [(case.key(), row["entry"], row["forced"], row["splits"]) for case, row, _ in plan]
    assert described == [
        ("seg_1:32:fp32", "EMBED_B32_X3", False, 66),
        ("seg_1:32:fp32", "EMBED_B32", True, 128),
        ("seg_1:32:tf32", "EMBED_B32_TF32_E64", False, 66),
        ("seg_1:32:tf32", "EMBED_B32_TF32", True, 128),
        ("seg_1:32:tf32", "EMBED_B32", True, 128),
    ]
    assert len(refused) == 1 and refused[0].startswith("EMBED_B32_TF32 seg_1:32:fp32")
    for case, row, pin in plan:
        assert row["kernel"] == pin.config().kernel
        if not row["forced"]:
            assert pin == SegdensePin.select(case.site, 32, case.math, PtxTier.SM80, H200)
    assert plan[0][1]["reduce_kernel"] == "spk_segdense_reduce_embed"


# -- the SIMT set ----------------------------------------------------------------------


def test_simt_set_on_the_h200_profile_is_the_fourteen_tuples() -> None:
    assert benchmark.simt_keys(PtxTier.SM80, H200) == H200_SIMT


def test_simt_needs_fp32_products_real_in_sm75() -> None:
    assert benchmark.is_simt(Entry.LINEAR0_B32)
    assert not benchmark.is_simt(Entry.LINEAR1_B1_TF32)  # sm75-real but TF32 products
    assert not benchmark.is_simt(Entry.EMBED_B32_X3)  # FP32-exact but sm80 only
    # on the sm75 tier every pick is SIMT except the TF32 linear1 batch-1 entry
    assert len(benchmark.simt_keys(PtxTier.SM75, H200)) == 23


# -- summary ---------------------------------------------------------------------------


def test_geomean() -> None:
    assert benchmark.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert benchmark.geomean([1.5]) == pytest.approx(1.5)
    assert benchmark.geomean([]) is None
    with pytest.raises(ValueError):
        benchmark.geomean([1.0, 0.0])


def _rows() -> list[dict[str, Any]]:
    """H200 picks for every tuple: speedups 1.0 + i/10, seg_1 b32 not built, one error,
    forced rows 100x, and linear2 b1 fp32 more than twice the library's error."""
    plan, _ = bench.planned_rows(list(benchmark.ALL_CASES), [Entry.EMBED_B1], PtxTier.SM80, H200)
    rows = []
    for index, (_, row, _) in enumerate(plan):
        row["library_us"] = 10.0 + index
        row["library_max_abs"], row["library_rel_l2"] = 1e-6, 1e-7
        row["host_us"] = 7.0
        row["seconds"] = 0.5
        if row["key"].startswith("seg_1:32"):
            row["status"], row["note"] = benchmark.NOT_BUILT, "no entry"
        elif row["key"] == "conv2:32:tf32":
            row["status"], row["note"] = benchmark.ERROR, "DriverError: boom"
        else:
            speedup = 100.0 if row["forced"] else 1.0 + index / 10
            row["pyspk_us"] = row["library_us"] / speedup
            row["speedup"] = speedup
            row["pyspk_max_abs"] = 2e-6
            row["pyspk_rel_l2"] = 4e-7 if row["key"] == "linear2:1:fp32" else 1.5e-7
            row["replay_bit_identical"] = True
        rows.append(row)
    return rows


def test_summarize() -> None:
    rows = _rows()
    summary = benchmark.summarize(rows, H200_SIMT)
    picks = [row for row in rows if not row["forced"]]
    measured = [row for row in picks if row["status"] == benchmark.MEASURED]
    assert len(measured) == 21  # 24 less two not built, one error
    assert summary["measured"] == [row["key"] for row in measured]
    expected = math.exp(sum(math.log(row["speedup"]) for row in measured) / len(measured))
    assert summary["geomean_speedup"] == pytest.approx(expected)
    simt = [row for row in measured if row["key"] in H200_SIMT]
    assert summary["simt_measured"] == H200_SIMT  # all fourteen were measured
    assert summary["simt_geomean_speedup"] == pytest.approx(
        math.exp(sum(math.log(row["speedup"]) for row in simt) / len(simt))
    )
    assert summary["simt_min_key"] == "conv1:1:fp32"
    assert summary["simt_min_speedup"] == pytest.approx(1.0)
    assert summary["fp32_accuracy_failing"] == ["linear2:1:fp32"]
    assert len(summary["fp32_accuracy_checked"]) == 11
    assert summary["not_built"] == ["seg_1:32:fp32", "seg_1:32:tf32"]
    assert summary["errors"] == ["conv2:32:tf32 CONV2_B32_TC"]
    tensor = [row for row in measured if row["key"] not in H200_SIMT]
    assert summary["tensor_error_ratios"] == {
        row["key"]: pytest.approx(row["pyspk_rel_l2"] / row["library_rel_l2"]) for row in tensor
    }
    assert "outside the SIMT set, pyspk rel-L2 / the library's" in "\n".join(
        benchmark.summary_lines(summary)
    )
    # the forced rows (100x) stay out
    assert max(row["speedup"] for row in measured) < 100
    assert all(key in summary["measured"] for key in ("seg_1:1:fp32", "seg_1:1:tf32"))


def test_summarize_with_nothing_measured() -> None:
    rows = [row for row in _rows() if row["status"] != benchmark.MEASURED]
    summary = benchmark.summarize(rows, H200_SIMT)
    assert summary["geomean_speedup"] is None
    assert summary["simt_min_speedup"] is None and summary["simt_min_key"] is None
    assert summary["fp32_accuracy_checked"] == []
    lines = "\n".join(benchmark.summary_lines(summary))
    assert "over the 0 measured tuples: -" in lines
    assert "none measured" in lines


def test_accuracy_ok() -> None:
    assert benchmark.accuracy_ok({"pyspk_rel_l2": 2e-7, "library_rel_l2": 1e-7})
    assert not benchmark.accuracy_ok({"pyspk_rel_l2": 2.1e-7, "library_rel_l2": 1e-7})
    assert benchmark.accuracy_ok({"pyspk_rel_l2": None, "library_rel_l2": 1e-7}) is None
    assert not benchmark.accuracy_ok({"pyspk_rel_l2": float("nan"), "library_rel_l2": 1e-7})


def test_errors() -> None:
    exact = np.array([3.0, 4.0])
    max_abs, rel = bench.testing.errors(np.array([3.0, 4.5], np.float32), exact)
    assert max_abs == pytest.approx(0.5)
    assert rel == pytest.approx(0.5 / 5.0)


# -- rendering -------------------------------------------------------------------------


def _meta() -> dict[str, Any]:
    return {
        "date": "2026-01-01T00:00:00+00:00",
        "device": {
            "name": "NVIDIA H200",
            "capability": "9.0",
            "multiprocessors": 132,
            "shared_optin_bytes": 232448,
            "l2_bytes": 50 * 1024 * 1024,
        },
        "versions": {
            "driver": "12.8 (12080)",
            "torch": "2.11.0",
            "torch_cuda": "12.8",
            "cudnn": "91000",
            "cuda_bindings": "12.9.0",
            "numpy": "2.2.0",
            "python": "3.12.3",
        },
        "tier": "sm80",
        "artifact": "segdense.sm80.sm_90.cubin",
        "graph_enqueues": 20,
        "rounds": 50,
        "warmup_rounds": 5,
        "spin_cycles": 1000000,
        "host_chunk": 100,
        "host_samples": 20,
        "seed": 0,
        "cudnn_benchmark": False,
        "tuples": [case.key() for case in benchmark.ALL_CASES],
        "forced": ["EMBED_B1"],
        "forced_refused": [],
        "argv": [],
        "seconds": 61.0,
    }


def test_render_markdown() -> None:
    rows = _rows()
    summary = benchmark.summarize(rows, H200_SIMT)
    text = benchmark.render_markdown(_meta(), rows, summary)
    lines = text.splitlines()
    assert lines[0] == "# segdense benchmark: NVIDIA H200"
    assert "compute capability 9.0, 132 SMs" in text
    assert "torch 2.11.0" in text and "driver CUDA 12.8" in text
    assert "tier sm80, artifact segdense.sm80.sm_90.cubin" in text
    assert "CUDA graph of 20 enqueues" in text and "50 interleaved rounds" in text
    table = [line for line in lines if line.startswith("| ")]
    assert table[0] == benchmark.TABLE_HEADER
    assert len(table) == 1 + len(rows)
    assert all(line.count("|") == 13 for line in table)
    first = table[1].split(" | ")
    assert first[:6] == ["| sincnet.conv1", "1", "fp32", "CONV1_B1", "`spk_segdense_conv1_b1`", "-"]
    assert first[6:9] == ["10.00", "10.00", "1.000x"]
    assert first[9:] == ["1.00e-06 / 1.00e-07", "2.00e-06 / 1.50e-07", "7.00 |"]
    not_built = next(line for line in table if "EMBED_B32_X3" in line)
    assert "| 66 |" in not_built and "| not built | - |" in not_built
    assert any("EMBED_B1 (forced)" in line for line in table)
    assert "SIMT set (the rule picks an FP32-product entry real in the sm75 tier), 14 " in text
    assert "minimum 1.000x (conv1:1:fp32)" in text
    assert "10/11 measured tuples (fail: linear2:1:fp32)" in text
    assert "not built (library timed, excluded from the summaries): seg_1:32:fp32" in text
    assert "conv2:32:tf32 CONV2_B32_TC: DriverError: boom" in text
    assert "forced rows" in text


def _with_compiled_arm(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The compiled arm at half the library's time: faster than pyspk where pyspk's
    speedup is under 2x."""
    for row in rows:
        if row["status"] == benchmark.MEASURED:
            row["compiled_us"] = row["library_us"] / 2
            row["compiled_max_abs"], row["compiled_rel_l2"] = 3e-6, 2e-7
    return rows


def test_summarize_names_the_tuples_the_compiled_arm_wins() -> None:
    rows = _with_compiled_arm(_rows())
    summary = benchmark.summarize(rows, H200_SIMT)
    picks = [row for row in rows if not row["forced"] and row["status"] == benchmark.MEASURED]
    assert summary["compiled_measured"] == [row["key"] for row in picks]
    assert summary["compiled_faster_than_pyspk"] == [
        row["key"] for row in picks if row["speedup"] < 2.0
    ]
    assert summary["compiled_faster_than_library"] == summary["compiled_measured"]
    expected = math.exp(sum(math.log(row["speedup"] / 2) for row in picks) / len(picks))
    assert summary["compiled_geomean_speedup"] == pytest.approx(expected)
    lines = "\n".join(benchmark.summary_lines(summary))
    assert "compiled arm faster than pyspk: conv1:1:fp32," in lines
    # without the arm the summary carries none of its keys
    assert "compiled_measured" not in benchmark.summarize(_rows(), H200_SIMT)


def test_render_markdown_with_the_compiled_arm() -> None:
    rows = _with_compiled_arm(_rows())
    meta = {**_meta(), "compiled": True}
    text = benchmark.render_markdown(meta, rows, benchmark.summarize(rows, H200_SIMT))
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[0] == benchmark.TABLE_HEADER + benchmark.COMPILED_HEADER
    assert all(line.count("|") == 16 for line in table)
    assert table[1].endswith("| 5.00 | 0.500x | 3.00e-06 / 2.00e-07 |")
    assert "(library, compiled library, pyspk)" in text
    assert 'torch.compile(mode="max-autotune-no-cudagraphs")' in text
    assert "(incomplete" not in text
    meta["complete"] = False
    assert "(incomplete: rows still to run)" in benchmark.render_markdown(
        meta, rows, benchmark.summarize(rows, H200_SIMT)
    )


def test_render_json_round_trips_with_nan_as_null() -> None:
    rows = _rows()
    rows[0]["pyspk_max_abs"] = float("nan")
    rows[0]["library_round_ms"] = [0.2, float("inf")]
    summary = benchmark.summarize(rows, H200_SIMT)
    document = json.loads(benchmark.render_json(_meta(), rows, summary))
    assert set(document) == {"meta", "summary", "rows"}
    assert document["meta"]["device"]["name"] == "NVIDIA H200"
    assert document["summary"]["simt_set"] == H200_SIMT
    assert len(document["rows"]) == len(rows)
    assert document["rows"][0]["pyspk_max_abs"] is None
    assert document["rows"][0]["library_round_ms"] == [0.2, None]
    assert document["rows"][1]["speedup"] == pytest.approx(rows[1]["speedup"])


def test_write_outputs(tmp_path: Path) -> None:
    rows = _rows()
    summary = benchmark.summarize(rows, H200_SIMT)
    messages = benchmark.write_outputs(tmp_path / "out", "h200-bench", _meta(), rows, summary)
    assert (tmp_path / "out/h200-bench.md").read_text().startswith("# segdense benchmark")
    json.loads((tmp_path / "out/h200-bench.json").read_text())
    chart = messages[-1]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert chart == "chart skipped: matplotlib is not installed"
    else:
        assert (tmp_path / "out/h200-bench.png").stat().st_size > 0, chart


def test_device_slug_and_stem() -> None:
    assert benchmark.device_slug("NVIDIA H200") == "h200"
    assert benchmark.device_slug("NVIDIA GeForce RTX 4060 Ti") == "rtx4060ti"
    assert benchmark.device_slug("NVIDIA H100 80GB HBM3") == "h100-sxm"  # nvidia-smi name
    assert benchmark.output_stem("NVIDIA H200", None) == "h200-bench"
    assert benchmark.output_stem("NVIDIA H200", PtxTier.SM75) == "h200-sm75-bench"
    assert benchmark.output_stem("NVIDIA H200", None, compiled=True) == "h200-bench-compiled"


# -- command line ----------------------------------------------------------------------


def test_parse_args() -> None:
    args = bench.parse_args([])
    assert args.rounds == 50 and len(args.cases) == 24 and args.entries == []
    assert args.out == ROOT / "benchmarks" and args.tier is None
    args = bench.parse_args(
        ["--tuples", "seg_1:32:fp32", "--force", "embed_b32", "--force", "EMBED_B32"]
    )
    assert [case.key() for case in args.cases] == ["seg_1:32:fp32"]
    assert args.entries == [Entry.EMBED_B32]
    assert bench.parse_args(["--tier", "sm75"]).tier is PtxTier.SM75


@pytest.mark.parametrize(
    "argv",
    [["--tuples", "conv9"], ["--force", "NOPE"], ["--rounds", "0"], ["--dry-run", "k80"]],
)
def test_parse_args_refuses(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        bench.parse_args(argv)
    assert raised.value.code == 2


def test_dry_run_prints_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--dry-run", "h200", "--force", "EMBED_B32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("NVIDIA H200 (profile h200), tier sm80: 26 rows")
    assert "seg_1:32:tf32    EMBED_B32_TF32_E64 x66" in out
    assert f"SIMT set, 14 tuples: {', '.join(H200_SIMT)}" in out


def test_importing_the_tool_loads_neither_torch_nor_the_driver() -> None:
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('b', 'tools/bench.py')\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "loaded = [m for m in ('torch', 'cuda.bindings', 'matplotlib') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_write_outputs_without_the_chart(tmp_path: Path) -> None:
    rows = _rows()
    summary = benchmark.summarize(rows, H200_SIMT)
    messages = benchmark.write_outputs(tmp_path, "h200-bench", _meta(), rows, summary, chart=False)
    assert messages == [
        f"report {tmp_path / 'h200-bench.md'}",
        f"data {tmp_path / 'h200-bench.json'}",
    ]
    assert not (tmp_path / "h200-bench.png").exists()
