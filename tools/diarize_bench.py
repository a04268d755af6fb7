"""The diarization benchmark: the stock pyannote.audio pipeline against pyspk's
accelerated pipeline on synthetic conversations, in one process on one GPU, in FP32
and in TF32 math, for both pipeline shapes users run.

    PYTHONPATH=. python3 tools/diarize_bench.py [--out benchmarks] [--lengths 600 3600]
        [--math fp32 tf32] [--shapes agglomerative community-1] [--seed 0]
        [--segmentation-batch 128 256 512 1024] [--lstm]

The models are pyannote.audio 4's segmentation-3.0 PyanNet and WeSpeaker ResNet34 with
random weights, built offline (`pyspk.pyannote.offline`), the PyanNet's classifier fitted to one
synthetic recording. The shapes:
- agglomerative: `offline_pipeline` (centroid linkage, threshold 0.7, min cluster 12);
- community-1: VBx clustering over a PLDA fitted to the embeddings of 16 other voices,
  constrained assignment, community-1's hyper-parameters; written as a pipeline folder
  and loaded through `Pipeline.from_pretrained(folder)`, as a downloaded one is.
The test audio's voices are heard by neither calibration: each recording draws its
voices from its own seed, and the three seeds must differ.

For each shape, length and math it runs the stock pipeline (its own code and defaults:
batch 32, which switches TF32 off whatever the caller chose) and then the same pipeline
under `accelerate_pipeline` (plans, the engine, graphs captured before the timed runs),
once per `--segmentation-batch` value (a batch study against one stock run), after one
untimed warm-up of each on 60 s of audio. Each timed run starts from a collected heap
(`gc.collect()` before the clock), stock's and pyspk's alike. Steps are timed through the
pipeline's hooks (stock) or the engine's report (accelerated), the accelerated
clustering also in its parts. Each run records how many embeddings were clustered and
how many speakers were found, so that a degenerate clustering shows. Agreement is taken
against the stock run of the same audio and math: the raw segmentation
log-probabilities, the embeddings, the annotation (tracks and labels, also the exclusive
one) and its DER.

Writes <device>-diarization.md, .json and .png into --out (-diarization-lstm with --lstm).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import itertools
import json
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pyspk.testing.memory import CollectorPauses

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"agglomerative": "agglomerative", "community-1": "vbx"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--lengths", type=float, nargs="+", default=[600, 3600])
    parser.add_argument("--math", nargs="+", default=["fp32", "tf32"])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--seed", type=int, default=0, help="the test recordings' seed")
    parser.add_argument("--fit-seed", type=int, default=11, help="the PyanNet's calibration")
    parser.add_argument("--plda-seed", type=int, default=12, help="the PLDA's 16 voices")
    parser.add_argument(
        "--segmentation-batch",
        type=int,
        nargs="+",
        default=[None],
        help="chunks per segmentation forward (default: accelerate_pipeline's, 512 on "
        "pyspk's LSTM, else 128); several values run an accelerated arm each, against the "
        "same stock run",
    )
    parser.add_argument(
        "--trunk-streams",
        type=int,
        nargs="+",
        default=[None],
        help="the embeddings' trunk plans and streams (`pyspk.pyannote.PIPELINE_TRUNK_STREAMS`; "
        "default its own); several values run an accelerated arm each, against the same "
        "stock run",
    )
    parser.add_argument(
        "--lstm",
        action="store_true",
        help="the segmentation on plans with pyspk's LSTM in FP32 math too "
        "(accelerate_pipeline(lstm=True)); the report is <device>-diarization-lstm",
    )
    args = parser.parse_args(argv)
    if len({args.seed, args.fit_seed, args.plda_seed}) < 3:
        parser.error("--seed, --fit-seed and --plda-seed must differ: held-out voices")
    return args


@contextlib.contextmanager
def trunk_streams(streams: int | None) -> Iterator[None]:
    """`pyspk.pyannote.PIPELINE_TRUNK_STREAMS` set to `streams` in every math (None: left
    as it is) while a pipeline is accelerated."""
    import pyspk.pyannote as pa

    kept = pa.PIPELINE_TRUNK_STREAMS
    if streams is not None:
        pa.PIPELINE_TRUNK_STREAMS = dict.fromkeys(kept, streams)
    try:
        yield
    finally:
        pa.PIPELINE_TRUNK_STREAMS = kept


class StockSteps:
    """The stock `apply`'s step times from its hooks, and the artefacts they carry."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.marks: dict[str, float] = {}
        self.artefacts: dict[str, Any] = {}
        self.pauses = CollectorPauses()  # the last run's

    def hook(self, step: str, artefact: Any, file: Any = None, **progress: Any) -> None:
        if progress:  # a progress call inside a step
            return
        self.marks[step] = time.perf_counter()
        self.artefacts[step] = artefact

    def run(self, file: dict) -> tuple[Any, dict[str, float], float]:
        import torch

        pipeline = self.pipeline
        stock_reconstruct = pipeline.reconstruct
        marks = self.marks

        def reconstruct(*args: Any, **kwargs: Any) -> Any:
            marks.setdefault("clustered", time.perf_counter())
            return stock_reconstruct(*args, **kwargs)

        pipeline.reconstruct = reconstruct
        marks.clear()
        try:
            collect_before_timing()
            torch.cuda.synchronize()
            started = time.perf_counter()
            with CollectorPauses() as self.pauses:
                output = pipeline(file, hook=self.hook)
            ended = time.perf_counter()
        finally:
            del pipeline.reconstruct
        steps = {
            "segmentation": marks["segmentation"] - started,
            "speaker_counting": marks["speaker_counting"] - marks["segmentation"],
            "embeddings": marks["embeddings"] - marks["speaker_counting"],
            "clustering": marks["clustered"] - marks["embeddings"],
            "reconstruction": ended - marks["clustered"],
        }
        return output, steps, ended - started

    def embeddings_clustered(self) -> int:
        """How many embeddings the last run's clustering kept (pyannote's own filter)."""
        embeddings = self.artefacts["embeddings"]
        segmentations = self.artefacts["segmentation"]
        kept, _, _ = self.pipeline.clustering.filter_embeddings(embeddings, segmentations)
        return len(kept)


def collect_before_timing() -> None:
    """Start a timed run from a collected heap, stock's and pyspk's alike: the objects the
    benchmark's earlier runs left count toward Python's next full collection (0.24 to
    0.45 s here), which then lands in whichever run comes. A full collection that the
    run's own objects set off still counts in its time."""
    gc.collect()


def _collector(pauses: CollectorPauses) -> dict[str, Any]:
    """A run's garbage-collector pauses: a full collection inside it shows in its time."""
    return {"gc_seconds": pauses.seconds, "gc_full_collections": pauses.full}


def _scores_of(model: Any) -> tuple[list, Any]:
    """Collects a segmentation model's raw outputs (log-probabilities) per forward."""
    collected: list = []
    handle = model.register_forward_hook(lambda _m, _a, out: collected.append(out.cpu()))
    return collected, handle


def _tracks(annotation: Any) -> list:
    return list(annotation.itertracks(yield_label=True))


def _max_abs(np: Any, a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    both_nan = np.isnan(a) & np.isnan(b)
    difference = np.abs(np.where(both_nan, 0.0, a - b))
    return float(np.max(difference)) if difference.size else 0.0


def _truth(recording: Any, uri: str) -> Any:
    from pyannote.core import Annotation, Segment

    truth = Annotation(uri=uri)
    for index, turn in enumerate(recording.turns):
        truth[Segment(turn.start, turn.end), index] = turn.speaker
    return truth


def _pipelines(args: argparse.Namespace, folder: Path, device: Any) -> dict[str, Any]:
    """Each shape's pipeline on `device`, community-1's written into `folder` and loaded
    from there."""
    from pyannote.audio import Pipeline

    from pyspk.pyannote import offline
    from pyspk.testing.synthetic import recording

    fit = recording(400, seed=args.fit_seed)
    segmentation = offline.segmentation_3_0(seed=0, fit_to=fit, device=device)
    embedding = offline.wespeaker_resnet34(seed=1)
    pipelines = {}
    if "agglomerative" in args.shapes:
        pipelines["agglomerative"] = offline.offline_pipeline(segmentation, embedding).to(device)
    if "community-1" in args.shapes:
        voices = recording(1200, seed=args.plda_seed, speakers=16)
        made = time.perf_counter()
        plda = offline.fit_community_plda(embedding.to(device), voices, folder / "fitted-plda")
        print(f"PLDA fitted in {time.perf_counter() - made:.1f} s", flush=True)
        written = offline.write_pipeline(folder / "community-1", segmentation, embedding, plda)
        pipelines["community-1"] = Pipeline.from_pretrained(written).to(device)
    return pipelines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started_all = time.perf_counter()
    import numpy as np
    import torch

    warnings.simplefilter("ignore")  # pyannote's and torchcodec's notices
    import pyannote.audio
    from pyannote.metrics.diarization import DiarizationErrorRate

    import pyspk
    import pyspk.pyannote as pa
    from pyspk.cuda import CudaMath
    from pyspk.testing import diarization_report as report
    from pyspk.testing.benchmark import device_slug
    from pyspk.testing.synthetic import recording
    from pyspk.torch import library_math

    device = torch.device("cuda")
    workspace = tempfile.TemporaryDirectory()
    pipelines = _pipelines(args, Path(workspace.name), device)
    print("models ready", flush=True)

    recordings = {}
    for length in args.lengths:
        made = time.perf_counter()
        recordings[length] = recording(length, seed=args.seed)
        print(f"recording {length:g} s made in {time.perf_counter() - made:.1f} s", flush=True)

    warm = recording(60, seed=args.seed + 100).as_file("warm-up")
    der = DiarizationErrorRate()
    runs: list[dict] = []
    prepare: dict[str, float] = {}
    engines: dict[str, dict] = {}
    for shape, pipeline in pipelines.items():
        clustering = SHAPES[shape]
        segmentation = pipeline._segmentation.model
        stock_steps = StockSteps(pipeline)
        for name in args.math:
            math = CudaMath.parse(name)
            scores, handle = _scores_of(segmentation)
            with library_math(math):  # the caller's choice; pyannote's own apply resets it
                stock_steps.run(warm)
                stock_results = {}
                for length, rec in recordings.items():
                    file = rec.as_file(f"synthetic-{length:g}s")
                    scores.clear()
                    torch.cuda.reset_peak_memory_stats()
                    output, steps, seconds = stock_steps.run(file)
                    truth_der = float(der(_truth(rec, file["uri"]), output.speaker_diarization))
                    stock_results[length] = {
                        "output": output,
                        "scores": torch.cat(scores).numpy(),
                        "embeddings": stock_steps.artefacts["embeddings"],
                        "der_vs_truth": truth_der,
                    }
                    runs.append(
                        {
                            "audio_seconds": length,
                            "path": "stock",
                            "math": str(math),
                            "clustering": clustering,
                            "seconds": seconds,
                            "rtfx": length / seconds,
                            "steps": steps,
                            "overlapped_steps": [],
                            "peak_gpu_bytes": int(torch.cuda.max_memory_allocated()),
                            "identical_to_stock": True,
                            "der_vs_stock": 0.0,
                            "max_abs_score_diff": 0.0,
                            "max_abs_embedding_diff": 0.0,
                            "embeddings_clustered": stock_steps.embeddings_clustered(),
                            "speakers": len(output.speaker_diarization.labels()),
                            "speakers_in_recording": len({t.speaker for t in rec.turns}),
                            **_collector(stock_steps.pauses),
                            "host_after_embeddings_seconds": steps["clustering"]
                            + steps["reconstruction"],
                            "der_vs_truth": truth_der,
                        }
                    )
                    print(
                        f"{shape} {math} {length:g} s stock {seconds:.2f} s "
                        f"({length / seconds:.0f}x), speakers {runs[-1]['speakers']}",
                        flush=True,
                    )
                handle.remove()
                for batch, streams in itertools.product(
                    args.segmentation_batch, args.trunk_streams
                ):
                    arm = f"batch {batch}" if batch is not None else "default batch"
                    if streams is not None:
                        arm += f", trunk streams {streams}"
                    prepared = time.perf_counter()
                    with trunk_streams(streams):
                        acceleration = pa.accelerate_pipeline(
                            pipeline,
                            math,
                            segmentation_batch=batch,
                            lstm=True if args.lstm else None,
                        )
                    prepare[f"{shape} {math} {arm}"] = time.perf_counter() - prepared
                    engine = acceleration.engine
                    engines[f"{shape} {math} {arm}"] = engine.describe()
                    pipeline(warm)
                    for length, rec in recordings.items():
                        file = rec.as_file(f"synthetic-{length:g}s")
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                        collect_before_timing()
                        started = time.perf_counter()
                        with CollectorPauses() as pauses:
                            output = pipeline(file)
                        seconds = time.perf_counter() - started
                        run = engine.last_run
                        stock = stock_results[length]
                        same = _tracks(output.speaker_diarization) == _tracks(
                            stock["output"].speaker_diarization
                        ) and _tracks(output.exclusive_speaker_diarization) == _tracks(
                            stock["output"].exclusive_speaker_diarization
                        )
                        parts = dict(run.clustering)
                        clustered = int(parts.pop("embeddings_clustered", 0))
                        runs.append(
                            {
                                "audio_seconds": length,
                                "path": "accelerated",
                                "math": str(math),
                                "clustering": clustering,
                                "seconds": seconds,
                                "rtfx": length / seconds,
                                "steps": dict(run.steps),
                                "overlapped_steps": list(run.overlapped),
                                "peak_gpu_bytes": int(torch.cuda.max_memory_allocated()),
                                "identical_to_stock": bool(same),
                                "der_vs_stock": float(
                                    der(
                                        stock["output"].speaker_diarization,
                                        output.speaker_diarization,
                                    )
                                ),
                                "max_abs_score_diff": _max_abs(np, run.scores, stock["scores"]),
                                "max_abs_embedding_diff": _max_abs(
                                    np, run.embeddings, stock["embeddings"]
                                ),
                                "masks_identical": bool(
                                    np.array_equal(
                                        run.scores.argmax(-1), stock["scores"].argmax(-1)
                                    )
                                ),
                                "embeddings_clustered": clustered,
                                "clustering_steps": parts,
                                "speakers": len(output.speaker_diarization.labels()),
                                "stock_speakers": len(stock["output"].speaker_diarization.labels()),
                                "speakers_in_recording": len({t.speaker for t in rec.turns}),
                                **_collector(pauses),
                                "host_after_embeddings_seconds": run.steps["clustering"]
                                + run.steps["reconstruction"],
                                "der_vs_truth": float(
                                    der(_truth(rec, file["uri"]), output.speaker_diarization)
                                ),
                                "stock_der_vs_truth": stock["der_vs_truth"],
                                "embedding_scale": float(np.nanmax(np.abs(stock["embeddings"]))),
                                "setup_seconds": run.setup,
                                "gpu_seconds": run.gpu,
                                "segmentation_plans": acceleration.segmentation is not None,
                                "segmentation_batch": engine.segmentation_batch,
                                "trunk_streams": pa.PIPELINE_TRUNK_STREAMS[math]
                                if streams is None
                                else streams,
                            }
                        )
                        print(
                            f"{shape} {math} {length:g} s accelerated ({arm}) {seconds:.2f} s "
                            f"({length / seconds:.0f}x) identical {same} speakers "
                            f"{runs[-1]['speakers']} from {clustered} embeddings; gpu "
                            f"{run.gpu:.3f}; steps "
                            + ", ".join(f"{k} {v:.3f}" for k, v in run.steps.items())
                            + "; clustering "
                            + ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
                            + f"; collector {pauses.seconds:.3f} s ({pauses.full} full)",
                            flush=True,
                        )
                    acceleration.undo()
    workspace.cleanup()

    report.check_runs(runs)
    name = torch.cuda.get_device_name()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": name,
        "versions": (
            f"pyspk {pyspk.__version__}; pyannote.audio {pyannote.audio.__version__}; torch "
            f"{torch.__version__} (cuDNN {torch.backends.cudnn.version()}); numpy "
            f"{np.__version__}; Python {platform.python_version()}"
        ),
        "models": "random-weight segmentation-3.0 PyanNet (seed 0, classifier fitted to "
        f"`pyspk.testing.synthetic.recording(400, seed={args.fit_seed})`) and WeSpeaker ResNet34 "
        "(seed 1), built offline. Shapes: agglomerative (centroid, threshold 0.7, min "
        "cluster size 12); community-1 (VBx, threshold 0.6, Fa 0.07, Fb 0.8, constrained "
        "assignment, overlap left out of the embeddings; its PLDA fitted to the embeddings "
        f"of `recording(1200, seed={args.plda_seed}, speakers=16)`, written as a pipeline "
        "folder and loaded with `Pipeline.from_pretrained`)",
        "audio": f"`pyspk.testing.synthetic.recording(seconds, seed={args.seed})`, 16 kHz mono, in "
        "memory: 4 voices heard by neither calibration",
        "stock": "pyannote.audio's `SpeakerDiarization` as it is (batch 32 for both "
        "models; it switches TF32 off for every run, so its TF32 runs are FP32 runs)",
        "accelerated": "`accelerate_pipeline(pipeline, math, segmentation_batch="
        f"{'/'.join(str(b) for b in args.segmentation_batch)}"
        f"{', lstm=True' if args.lstm else ''})` (None: 512 chunks "
        "on pyspk's LSTM; else 128)"
        + (
            ""
            if args.trunk_streams == [None]
            else ", the embeddings' trunk on "
            + "/".join(str(n) for n in args.trunk_streams)
            + " plans and streams"
        )
        + "; forwards: "
        + "; ".join(f"{m}: {e}" for m, e in engines.items())
        + "; preparing (plans and graph capture) took "
        + ", ".join(f"{s:.1f} s in {m}" for m, s in prepare.items()),
        "seconds": time.perf_counter() - started_all,
        "prepare_seconds": prepare,
        "engines": engines,
        "argv": list(argv) if argv is not None else None,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{device_slug(name)}-diarization{'-lstm' if args.lstm else ''}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2) + "\n")
    stem.with_suffix(".md").write_text(report.render_markdown(meta, runs))
    report.plot(runs, stem.with_suffix(".png"), f"Diarization on the {name}: steps per run")
    print(f"report {stem}.md", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
