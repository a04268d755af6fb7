"""The diarization report's record check and rendering, on made-up runs."""

from __future__ import annotations

import copy

import pytest

from pyspk.testing import diarization_report as report

STEPS = {step: 0.5 for step in report.STEPS}


def _run(path: str = "accelerated", **changes):
    run = {
        "audio_seconds": 3600,
        "path": path,
        "math": "fp32",
        "seconds": 6.0,
        "rtfx": 600.0,
        "steps": dict(STEPS),
        "overlapped_steps": ["speaker_counting"] if path == "accelerated" else [],
        "peak_gpu_bytes": 2_000_000_000,
        "identical_to_stock": True,
        "der_vs_stock": 0.0,
        "max_abs_score_diff": 1e-6,
        "max_abs_embedding_diff": 1e-8,
        "clustering": "vbx",
        "embeddings_clustered": 3558,
        "speakers": 3,
        "speakers_in_recording": 4,
        "host_after_embeddings_seconds": 0.4,
        "clustering_steps": {"filter": 0.02, "linkage": 0.1, "vbx": 0.03},
    }
    run.update(changes)
    return run


META = {
    "device": "NVIDIA H200",
    "versions": "v",
    "models": "m",
    "audio": "a",
    "stock": "s",
    "accelerated": "x",
    "date": "d",
    "seconds": 10.0,
}


def test_good_runs_pass_the_check():
    report.check_runs([_run("stock"), _run()])


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        ({"path": "fast"}, "path"),
        ({"math": "fp64"}, "math"),
        ({"rtfx": "600"}, "rtfx"),
        ({"peak_gpu_bytes": 2.0}, "peak_gpu_bytes"),
        ({"identical_to_stock": 1}, "identical_to_stock"),
        ({"der_vs_stock": True}, "der_vs_stock"),
        ({"steps": {"segmentation": 1.0}}, "steps"),
        ({"clustering": "kmeans"}, "clustering"),
        ({"embeddings_clustered": 3.0}, "embeddings_clustered"),
    ],
)
def test_bad_runs_are_named(changes, text):
    with pytest.raises(ValueError, match=text):
        report.check_runs([_run(), _run(**changes)])


def test_a_missing_field_is_named():
    run = _run()
    del run["max_abs_score_diff"]
    with pytest.raises(ValueError, match="run 0 has no field 'max_abs_score_diff'"):
        report.check_runs([run])


def test_markdown_has_a_row_per_run_and_brackets_overlapped_steps():
    runs = [_run("stock", seconds=24.0, rtfx=150.0), _run()]
    text = report.render_markdown(META, runs)
    assert "| 1 h | vbx | fp32 | stock | 24.00 | 150 |" in text
    assert "| 1 h | vbx | fp32 | accelerated | 6.00 | 600 | 0.500 | [0.500] |" in text
    assert "| 1 h | vbx | fp32 | accelerated | yes | 0.000000 | 1.00e-06 | 1.00e-08 |" in text
    # what was clustered, so that a degenerate clustering shows
    assert "| 1 h | vbx | fp32 | accelerated | 3558 | 3 (4) | 0.400 | 0.020 | 0.100 | - |" in text


def test_a_batch_study_names_each_arms_segmentation_batch():
    runs = [
        _run("stock"),
        _run(segmentation_batch=128, seconds=3.0),
        _run(segmentation_batch=512, seconds=2.0, identical_to_stock=False, der_vs_stock=1e-4),
        _run(audio_seconds=600, segmentation_batch=512),  # alone at its length: no batch
    ]
    text = report.render_markdown(META, runs)
    assert "| 1 h | vbx | fp32 | accelerated, batch 128 | 3.00 |" in text
    assert "| 1 h | vbx | fp32 | accelerated, batch 512 | 2.00 |" in text
    assert "| 1 h | vbx | fp32 | accelerated, batch 512 | no | 0.000100 |" in text
    assert "| 10 min | vbx | fp32 | accelerated | 6.00 |" in text
    assert "| 1 h | vbx | fp32 | stock | 6.00 |" in text


def test_a_trunk_streams_study_names_each_arms_streams_and_batch_where_both_vary():
    runs = [
        _run("stock"),
        _run(segmentation_batch=128, trunk_streams=2, seconds=3.0),
        _run(segmentation_batch=128, trunk_streams=3, seconds=2.5),
        _run(math="tf32", segmentation_batch=128, trunk_streams=2),
        _run(math="tf32", segmentation_batch=512, trunk_streams=3),
    ]
    text = report.render_markdown(META, runs)
    assert "| 1 h | vbx | fp32 | accelerated, trunk streams 2 | 3.00 |" in text
    assert "| 1 h | vbx | fp32 | accelerated, trunk streams 3 | 2.50 |" in text
    assert "| 1 h | vbx | tf32 | accelerated, batch 512, trunk streams 3 | 6.00 |" in text


def test_the_chart_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [_run("stock"), _run(), _run(audio_seconds=600), _run(clustering="agglomerative")]
    path = tmp_path / "chart.png"
    report.plot(copy.deepcopy(runs), path, "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
