"""The diarization benchmark's pure parts, importable without torch or a GPU: the run
record every run of `tools/diarize_bench.py` fills, its check, and the rendering of
the report as markdown and a chart of the steps stacked per run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspk.cuda.errors import InvalidArgument

__all__ = [
    "CLUSTERINGS",
    "CLUSTERING_STEPS",
    "PATHS",
    "RUN_FIELDS",
    "STEPS",
    "check_runs",
    "plot",
    "render_markdown",
]

STEPS = ("segmentation", "speaker_counting", "embeddings", "clustering", "reconstruction")
"""The steps of a `SpeakerDiarization.apply`, in the order the stock path runs them."""

PATHS = ("stock", "accelerated")

CLUSTERINGS = ("agglomerative", "vbx")
"""The pipelines' shapes: agglomerative clustering, or community-1's VBx."""

CLUSTERING_STEPS = ("filter", "linkage", "plda", "vbx", "assignment")
"""The parts of the clustering step an accelerated run times (`pyspk.pyannote.engine.RunReport`);
the agglomerative shape has no "plda" or "vbx"."""

RUN_FIELDS: dict[str, type | tuple[type, ...]] = {
    "audio_seconds": (int, float),
    "path": str,
    "math": str,
    "seconds": float,
    "rtfx": float,
    "steps": dict,
    "overlapped_steps": list,
    "peak_gpu_bytes": int,
    "identical_to_stock": bool,
    "der_vs_stock": float,
    "max_abs_score_diff": float,
    "max_abs_embedding_diff": float,
    "clustering": str,
    "embeddings_clustered": int,
    "speakers": int,
    "speakers_in_recording": int,
    "host_after_embeddings_seconds": float,
}
"""Every run's fields (more may follow) and their types, as deployment scripts read them."""


def check_runs(runs: Sequence[Mapping[str, Any]]) -> None:
    """ValueError naming the first run and field that a report's reader cannot use."""
    for index, run in enumerate(runs):
        for name, kind in RUN_FIELDS.items():
            if name not in run:
                raise InvalidArgument(f"run {index} has no field {name!r}")
            value = run[name]
            if isinstance(value, bool) and kind is not bool:
                raise InvalidArgument(f"run {index}: {name} is a bool, not {kind}")
            if not isinstance(value, kind):
                raise InvalidArgument(f"run {index}: {name} is {type(value).__name__}, not {kind}")
        if run["path"] not in PATHS:
            raise InvalidArgument(f"run {index}: path {run['path']!r} is not one of {PATHS}")
        if run["math"] not in ("fp32", "tf32"):
            raise InvalidArgument(f"run {index}: math {run['math']!r} is not fp32 or tf32")
        if run["clustering"] not in CLUSTERINGS:
            raise InvalidArgument(
                f"run {index}: clustering {run['clustering']!r} is not one of {CLUSTERINGS}"
            )
        missing = [step for step in STEPS if step not in run["steps"]]
        if missing:
            raise InvalidArgument(f"run {index} has no time for the steps {missing}")


def _critical(run: Mapping[str, Any]) -> dict[str, float]:
    """The run's steps on its critical path (those not overlapped with GPU work)."""
    return {
        step: float(run["steps"][step])
        for step in STEPS
        if step not in run.get("overlapped_steps", ())
    }


def _length(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:g} min"


# what an accelerated arm may vary in a study, and its name in the report
STUDIED = (("segmentation_batch", "batch"), ("trunk_streams", "trunk streams"))


def _path(run: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> str:
    """The run's path, with what varies among the report's accelerated runs of the same
    audio, shape and math (a study of segmentation batches or of trunk streams)."""
    if run["path"] != "accelerated":
        return str(run["path"])
    key = (run["audio_seconds"], run["clustering"], run["math"])
    arms = [
        other
        for other in runs
        if other["path"] == "accelerated"
        and (other["audio_seconds"], other["clustering"], other["math"]) == key
    ]
    varied = [
        f"{name} {run.get(field)}"
        for field, name in STUDIED
        if len({other.get(field) for other in arms}) > 1
    ]
    return ", ".join(["accelerated", *varied])


CLUSTERING_NOTE = (
    "The clustering's parts as an accelerated run times them; the rest of the step "
    "(distances to the centroids, the AHC's cut, the centroids) is its remainder. "
    "With VBx the PLDA transform runs while the device merges: its seconds are "
    "within the linkage's."
)


def render_markdown(meta: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> str:
    """The report: what was run, a row per run with its steps, then the agreement."""
    lines = [
        f"# Diarization benchmark: {meta['device']}",
        "",
        f"- {meta['versions']}",
        f"- models: {meta['models']}",
        f"- audio: {meta['audio']}",
        f"- stock: {meta['stock']}",
        f"- accelerated: {meta['accelerated']}",
        f"- run: {meta['date']}, {meta['seconds']:.0f} s in all",
        "",
        "## Wall time and steps (seconds)",
        "",
        "A step in brackets ran while the GPU was still busy with the embeddings, off the "
        "critical path; the others add up to about the wall time.",
        "",
        "| audio | clustering | math | path | seconds | x real time | "
        + " | ".join(STEPS)
        + " | peak GPU GB |",
        "|---|---|---|---|---|---|" + "---|" * len(STEPS) + "---|",
    ]
    for run in runs:
        steps = []
        for step in STEPS:
            value = f"{float(run['steps'][step]):.3f}"
            steps.append(f"[{value}]" if step in run.get("overlapped_steps", ()) else value)
        lines.append(
            f"| {_length(run['audio_seconds'])} | {run['clustering']} | {run['math']} | "
            f"{_path(run, runs)} | {run['seconds']:.2f} | {run['rtfx']:.0f} | "
            + " | ".join(steps)
            + f" | {run['peak_gpu_bytes'] / 1e9:.2f} |"
        )
    lines += [
        "",
        "## What was clustered, and the host's time after the embeddings (seconds)",
        "",
        CLUSTERING_NOTE,
        "",
        "| audio | clustering | math | path | embeddings clustered | speakers found "
        "(in the recording) | host after embeddings | "
        + " | ".join(CLUSTERING_STEPS)
        + " | reconstruction |",
        "|---|---|---|---|---|---|---|" + "---|" * len(CLUSTERING_STEPS) + "---|",
    ]
    for run in runs:
        parts = run.get("clustering_steps", {})
        lines.append(
            f"| {_length(run['audio_seconds'])} | {run['clustering']} | {run['math']} | "
            f"{_path(run, runs)} | {run['embeddings_clustered']} | {run['speakers']} "
            f"({run['speakers_in_recording']}) | {run['host_after_embeddings_seconds']:.3f} | "
            + " | ".join(f"{parts[s]:.3f}" if s in parts else "-" for s in CLUSTERING_STEPS)
            + f" | {float(run['steps']['reconstruction']):.3f} |"
        )
    lines += [
        "",
        "## Agreement with stock (same audio, same math)",
        "",
        "| audio | clustering | math | path | identical annotation | DER vs stock | "
        "max abs score diff | max abs embedding diff | speakers | "
        "DER vs the recording's turns |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        if run["path"] != "accelerated":
            continue
        lines.append(
            f"| {_length(run['audio_seconds'])} | {run['clustering']} | {run['math']} | "
            f"{_path(run, runs)} | "
            f"{'yes' if run['identical_to_stock'] else 'no'} | {run['der_vs_stock']:.6f} | "
            f"{run['max_abs_score_diff']:.2e} | {run['max_abs_embedding_diff']:.2e} | "
            f"{run.get('speakers', '-')} (stock {run.get('stock_speakers', '-')}) | "
            f"{run.get('der_vs_truth', float('nan')):.3f} "
            f"(stock {run.get('stock_der_vs_truth', float('nan')):.3f}) |"
        )
    notes = meta.get("notes", ())
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[Mapping[str, Any]], path: Path, title: str) -> None:
    """Horizontal bars, one per run, of its critical-path steps stacked (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(run["audio_seconds"], run["clustering"]) for run in runs})
    figure, axes = plt.subplots(
        len(panels),
        1,
        figsize=(10, 1.2 + 1.4 * len(runs) / max(len(panels), 1)),
        squeeze=False,
    )
    colors = dict(zip(STEPS, ("#4c72b0", "#8172b3", "#dd8452", "#55a868", "#c44e52"), strict=True))
    for axis, (length, clustering) in zip(axes[:, 0], panels, strict=True):
        chosen = [
            run
            for run in runs
            if run["audio_seconds"] == length and run["clustering"] == clustering
        ]
        labels = []
        for row, run in enumerate(chosen):
            left = 0.0
            for step, seconds in _critical(run).items():
                axis.barh(
                    row, seconds, left=left, color=colors[step], label=step if row == 0 else None
                )
                left += seconds
            axis.text(left, row, f"  {run['seconds']:.2f} s, {run['rtfx']:.0f}x", va="center")
            labels.append(f"{_path(run, runs)} {run['math']}")
        axis.set_yticks(range(len(chosen)), labels)
        axis.invert_yaxis()
        axis.set_title(f"{_length(length)} of audio, {clustering} clustering")
        axis.set_xlabel("seconds")
        axis.set_xlim(0, max(run["seconds"] for run in chosen) * 1.3)
    handles, names = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, names, loc="lower center", ncol=len(STEPS), frameon=False)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
