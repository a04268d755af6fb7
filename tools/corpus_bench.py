"""The corpus benchmark: many files through one pipeline on one GPU, one after another
(stock and accelerated) and in corpus mode (`diarize_corpus`: files decoded ahead,
accelerated engines taking them in turn), in one process.

    PYTHONPATH=. python3 tools/corpus_bench.py [--hours 10] [--out benchmarks]
        [--shape community-1] [--math fp32 tf32] [--engines 2 3] [--turns off on]
        [--gpus 1 2] [--work DIR]

The corpus: synthetic conversations (`pyspk.testing.synthetic.recording`, 4 voices each,
heard by neither calibration) written as WAV files, lengths drawn like VoxConverse's
(log-normal, median 5 minutes, clipped to 30 s .. 20 min) until they add up to --hours;
kept in --work, so that a second shape's run on the same machine reads the same files.
The pipelines are the diarization benchmark's (`tools/diarize_bench.py`). Each arm reads
the WAV files from disk and writes RTTM files; the stock arm runs in FP32 math only (it
switches TF32 off whatever the caller asks) and counts the embeddings each file's
clustering kept (outside its timing). Each run records whether every annotation (the
RTTM text) equals the stock one, and the peaks of host memory (the process's resident
set) and of device memory in use, sampled every 50 ms, beside PyTorch's own peaks of
allocated and reserved memory; PyTorch's cache is emptied before each arm, so that an
arm's peaks are its own. Writes <device>-corpus.md and
.json into --out; runs of another shape already there on the same corpus are kept, so
one file holds both shapes. Corpus mode runs an arm per --engines value and per --turns
value: the engines' files side by side on the GPU (off) or in turns (on,
`pyspk.pyannote.DeviceTurns`), and per --gpus value: more than 1 runs
`diarize_corpus_on_dask` on a local cluster of one worker per GPU, each of --engines
engines, started and warmed (the workers' pipelines built) before its time starts.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--shape", choices=["agglomerative", "community-1"], default="community-1")
    parser.add_argument("--math", nargs="*", default=["fp32", "tf32"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda",
                        help="cpu: a smoke run (--math with no value: stock)")  # fmt: skip
    parser.add_argument("--engines", type=int, nargs="+", default=[2],
                        help="corpus mode's engines: a corpus arm per value")  # fmt: skip
    parser.add_argument("--gpus", type=int, nargs="+", default=[1],
                        help="corpus mode's GPUs: 1 in this process, more on a local Dask "
                        "cluster of one worker per GPU; an arm per value")  # fmt: skip
    parser.add_argument("--turns", nargs="+", choices=["off", "on"], default=["on"],
                        help="corpus mode's GPU queue: an arm per value")  # fmt: skip
    parser.add_argument("--freeze", nargs="+", choices=["off", "on"], default=["off"],
                        help="corpus mode's gc.freeze (one GPU): an arm per value")  # fmt: skip
    parser.add_argument("--segmentation-batch", type=int, nargs="+", default=[None],
                        help="corpus mode's segmentation chunks a forward (one GPU; default "
                        "the engine's): an arm per value")  # fmt: skip
    parser.add_argument("--work", type=Path, default=None,
                        help="where the audio and RTTM files go (default: a new temporary "
                        "folder); audio already there for the same lengths is reused")  # fmt: skip
    parser.add_argument(
        "--no-stock",
        action="store_true",
        help="leave out the stock arm; agreement is then taken against the accelerated "
        "run one file after another in the first --math",
    )
    return parser.parse_args(argv)


def lengths(hours: float, seed: int) -> list[float]:
    """File lengths in seconds, drawn like VoxConverse's, adding up to `hours`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    drawn: list[float] = []
    while sum(drawn) < hours * 3600:
        drawn.append(float(np.clip(rng.lognormal(np.log(300.0), 0.8), 30.0, 1200.0)))
    drawn[-1] -= sum(drawn) - hours * 3600
    if drawn[-1] < 30.0:
        drawn.pop()
    return [round(length, 1) for length in drawn]


class _Clustered:
    """A pipeline hook that keeps the last file's segmentations and embeddings, to count
    the embeddings its clustering kept (pyannote's own filter)."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.artefacts: dict[str, Any] = {}

    def __call__(self, step: str, artefact: Any, file: Any = None, **progress: Any) -> None:
        if not progress and step in ("segmentation", "embeddings"):
            self.artefacts[step] = artefact

    def count(self) -> int:
        embeddings = self.artefacts.get("embeddings")
        if embeddings is None:
            return 0
        segmentations = self.artefacts["segmentation"]
        kept, _, _ = self.pipeline.clustering.filter_embeddings(embeddings, segmentations)
        return len(kept)


def _corpus(folder: Path, drawn: list[float]) -> list[Path]:
    """The corpus's WAV files in `folder`, written unless there for these lengths."""
    import soundfile

    from pyspk.testing.synthetic import recording

    folder.mkdir(parents=True, exist_ok=True)
    written = folder / "lengths.json"
    if not written.exists() or json.loads(written.read_text()) != drawn:
        for old in folder.glob("*.wav"):
            old.unlink()
        for index, seconds in enumerate(drawn):
            made = recording(seconds, seed=1000 + index)
            soundfile.write(folder / f"file{index:03d}.wav", made.waveform, 16000)
        written.write_text(json.dumps(drawn))
    return sorted(folder.glob("*.wav"))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    warnings.simplefilter("ignore")
    import pyspk.pyannote as pa
    from pyspk.pyannote.corpus import diarize_file
    from pyspk.testing.benchmark import device_slug
    from pyspk.testing.memory import SAMPLING_PERIOD_S, CollectorPauses, PeakMemory
    from pyspk.testing.synthetic import recording
    from tools.diarize_bench import _pipelines

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"

    def synchronize() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    work = args.work or Path(tempfile.mkdtemp(prefix="pyspk-corpus-"))
    work.mkdir(parents=True, exist_ok=True)
    bench_args = argparse.Namespace(shapes=[args.shape], fit_seed=11, plda_seed=12)
    made_in = Path(tempfile.mkdtemp(dir=work))
    pipeline = _pipelines(bench_args, made_in, device)[args.shape]
    clustering = "vbx" if args.shape == "community-1" else "agglomerative"
    drawn = lengths(args.hours, args.seed)
    made = time.perf_counter()
    files = _corpus(work / "audio", drawn)
    folder = files[0].parent
    audio_seconds = sum(drawn)
    print(
        f"{len(files)} files, {audio_seconds / 3600:.2f} h, ready in "
        f"{time.perf_counter() - made:.1f} s",
        flush=True,
    )
    outputs = Path(tempfile.mkdtemp(prefix=f"{args.shape}-", dir=work))

    def gpu_used(index: int | None = None) -> int:
        free, total = torch.cuda.mem_get_info(device if index is None else index)
        return total - free

    device_used = gpu_used if on_gpu else None

    def fresh_peaks() -> None:
        """Before an arm: the allocator's cache from earlier arms given back (nothing
        captures between arms), so that an arm's device peak is its own."""
        if on_gpu:
            gc.collect()
            synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    def rttms(out: Path) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted(out.glob("*.rttm"))}

    runs: list[dict] = []

    def record(
        path: str,
        math: str,
        seconds: float,
        out: Path,
        entries: list[dict],
        peak: PeakMemory,
        pauses: CollectorPauses,
    ) -> dict:
        same = rttms(out) == stock_rttms
        run = {
            "path": path,
            "math": math,
            "gpus": 1,
            "clustering": clustering,
            "audio_seconds": audio_seconds,
            "files": len(files),
            "seconds": seconds,
            "rtfx": audio_seconds / seconds,
            "identical_to_stock": same,
            "failed": sum(entry["status"] != "done" for entry in entries),
            "host_peak_gb": peak.host_bytes / 1e9,
            "device_peak_gb": peak.device_bytes / 1e9,
            # PyTorch's own peaks in this process (pyspk's plans allocate outside it)
            "torch_allocated_peak_gb": torch.cuda.max_memory_allocated(device) / 1e9
            if on_gpu
            else 0.0,
            "torch_reserved_peak_gb": torch.cuda.max_memory_reserved(device) / 1e9
            if on_gpu
            else 0.0,
            "gc_seconds": pauses.seconds,  # the collector's pauses, a full one costly
            "gc_full_collections": pauses.full,
            "per_file": [
                {k: entry.get(k) for k in ("path", "audio_seconds", "seconds", "speakers")}
                for entry in entries
            ],
        }
        runs.append(run)
        print(
            f"{path} {math}: {seconds:.2f} s, {audio_seconds / seconds:.0f}x, identical to "
            f"stock {same}, peaks {run['host_peak_gb']:.2f} GB host, "
            f"{run['device_peak_gb']:.2f} GB device; collector {pauses.seconds:.3f} s "
            f"({pauses.full} full)",
            flush=True,
        )
        return run

    def sequential(label: str, counter: _Clustered | None = None) -> tuple[float, list[dict]]:
        """Every file in turn; the time is the files' own (the counting is outside)."""
        out = outputs / label
        out.mkdir()
        entries, seconds = [], 0.0
        options = {} if counter is None else {"hook": counter}
        for path in files:
            synchronize()
            started = time.perf_counter()
            entries.append(diarize_file(pipeline, path, None, out, **options))
            seconds += time.perf_counter() - started
            if counter is not None:
                entries[-1]["embeddings_clustered"] = counter.count()
        return seconds, entries

    def corpus_arm(
        math: str, engines: int, turns: bool, gpus: int, freeze: bool, batch: int | None
    ) -> None:
        queue = ("-turns" if turns else "") + ("-frozen" if freeze else "")
        out = outputs / f"corpus-{math}-{gpus}x{engines}{queue}-{batch or 'default'}"
        if gpus > 1:  # the cluster started and warmed first, outside the time
            with _DaskArm(args.shape, made_in, pipeline, work, gpus, engines) as arm:
                timed(math, engines, turns, gpus, out, arm.run(folder, out, math, turns))
            return
        timed(
            math, engines, turns, gpus, out,
            lambda: pa.diarize_corpus(
                pipeline, [folder], out, math=math, engines=engines, turns=turns,
                freeze=freeze, segmentation_batch=batch, progress=None,
            ),
        )  # fmt: skip
        runs[-1].update(freeze=freeze, segmentation_batch=batch)

    def timed(math: str, engines: int, turns: bool, gpus: int, out: Path, corpus_run: Any) -> None:
        # the sequential arms' probe on one GPU, every GPU's memory on Dask's
        probe = all_used if gpus > 1 else device_used
        fresh_peaks()  # synchronizes too
        with PeakMemory(probe) as peak, CollectorPauses() as pauses:
            started = time.perf_counter()
            corpus = corpus_run()
            seconds = time.perf_counter() - started
        lines = (out / "manifest.jsonl").read_text().splitlines()
        manifest = [json.loads(line) for line in lines]
        run = record("corpus", math, seconds, out, manifest, peak, pauses)
        run.update(gpus=gpus, engines=engines, turns=turns, setup_seconds=corpus.setup_seconds)
        if gpus > 1:  # PyTorch's peaks would be this process's, not the workers'
            run.update(torch_allocated_peak_gb=None, torch_reserved_peak_gb=None)
        run["rtfx_after_setup"] = audio_seconds / (seconds - corpus.setup_seconds)

    def all_used() -> int:  # every GPU's memory in use, the Dask workers' too
        return sum(gpu_used(index) for index in range(torch.cuda.device_count()))

    warm = recording(60, seed=99).as_file("warm")
    pipeline(warm)
    stock_rttms: dict[str, str] = {}
    reference = "stock"  # what stock_rttms are, for the report
    clustered: list[int] = []
    if not args.no_stock:
        fresh_peaks()
        with PeakMemory(device_used) as peak, CollectorPauses() as pauses:
            seconds, entries = sequential("stock", _Clustered(pipeline))
        stock_rttms = rttms(outputs / "stock")
        clustered = [entry.get("embeddings_clustered", 0) for entry in entries]
        run = record("stock", "fp32", seconds, outputs / "stock", entries, peak, pauses)
        for kept, entry in zip(run["per_file"], entries, strict=True):
            kept["embeddings_clustered"] = entry.get("embeddings_clustered")
    for math in args.math:
        with pa.accelerate_pipeline(pipeline, math):
            pipeline(warm)
            fresh_peaks()
            with PeakMemory(device_used) as peak, CollectorPauses() as pauses:
                seconds, entries = sequential(f"sequential-{math}")
        if not stock_rttms:  # --no-stock: the first math's accelerated run stands for it
            stock_rttms = rttms(outputs / f"sequential-{math}")
            reference = f"accelerated {math} sequential"
        record("sequential", math, seconds, outputs / f"sequential-{math}", entries, peak, pauses)
        for gpus in args.gpus:
            for engines in args.engines:
                for turns in args.turns:
                    for freeze, batch in _one_gpu_arms(args, gpus):
                        corpus_arm(math, engines, turns == "on", gpus, freeze == "on", batch)
    name = torch.cuda.get_device_name(device) if on_gpu else "cpu"
    slug = device_slug(name)
    args.out.mkdir(parents=True, exist_ok=True)
    speakers = [entry["speakers"] for entry in runs[0]["per_file"] if entry["speakers"] is not None]
    shape_meta = {
        "agreement_with": reference,
        "embeddings_clustered": sum(clustered),
        "speakers_found": {str(n): speakers.count(n) for n in sorted(set(speakers))},
    }
    meta = {
        "device": name,
        "lengths": drawn,
        "voices_per_file": 4,
        "memory_sampling_s": SAMPLING_PERIOD_S,
        "shapes": {clustering: shape_meta},
    }
    json_path = args.out / f"{slug}-corpus.json"
    if json_path.exists():  # another shape's runs on this same corpus are kept
        before = json.loads(json_path.read_text())
        if before.get("meta", {}).get("lengths") == drawn:
            runs = [run for run in before["runs"] if run["clustering"] != clustering] + runs
            meta["shapes"] = {**before["meta"].get("shapes", {}), clustering: shape_meta}
    json_path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    (args.out / f"{slug}-corpus.md").write_text(_markdown(meta, runs, args.hours))
    return 0


def _markdown(meta: dict, runs: list[dict], hours: float) -> str:
    drawn = meta["lengths"]
    lines = [
        f"# Corpus benchmark: {meta['device']}",
        "",
        f"`tools/corpus_bench.py --hours {hours:g}`: {len(drawn)} WAV files, "
        f"{sum(drawn) / 3600:.2f} h (lengths {min(drawn):.0f} to {max(drawn):.0f} s, median "
        f"{sorted(drawn)[len(drawn) // 2]:.0f} s; synthetic conversations of "
        f"{meta['voices_per_file']} voices the calibrations never heard), read from disk, "
        "RTTM files written; one process, one GPU, each shape's arms in one process "
        "(but for corpus mode on more GPUs: a local Dask cluster, one worker process a GPU, "
        "started and warmed before its time; its device peak sums every GPU's, its host "
        "peak is the calling process's alone). "
        "Corpus mode: `diarize_corpus`, files decoded ahead, N engines, their files side "
        "by side on the GPU or in turns (`DeviceTurns`). Peaks: the "
        f"process's resident set and the device's memory in use, sampled every "
        f"{meta['memory_sampling_s'] * 1000:.0f} ms, PyTorch's cache emptied before each "
        "arm; of the device's, PyTorch's peaks of allocated and reserved memory (one GPU; "
        "pyspk's plans allocate outside PyTorch).",
        "",
    ]
    for clustering, shape in meta["shapes"].items():
        found = ", ".join(f"{n} in {count}" for n, count in shape["speakers_found"].items())
        if shape.get("agreement_with", "stock") == "stock":
            counted = f"stock clustered {shape['embeddings_clustered']} embeddings in all"
        else:  # --no-stock: nothing counted, agreement with the first math's run
            counted = f"no stock arm, agreement taken against the {shape['agreement_with']} run"
        lines.append(f"- {clustering}: {counted}; speakers found (speakers in files): {found}.")
    lines += [
        "",
        "| clustering | path | math | GPUs | engines | GPU queue | seconds | x real time "
        "| of it, setup (s) | x real time after setup | host peak (GB) | device peak (GB) "
        "| PyTorch allocated / reserved peak (GB) | identical to stock | failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run['clustering']} | {run['path']} | {run['math']} | {run['gpus']} "
            f"| {run.get('engines', 1)} "
            f"| {_queue(run)} | {run['seconds']:.2f} | {run['rtfx']:.0f} "
            f"| {run.get('setup_seconds', 0.0):.2f} "
            f"| {run.get('rtfx_after_setup', run['rtfx']):.0f} | {run['host_peak_gb']:.2f} "
            f"| {run['device_peak_gb']:.2f} | {_torch_peaks(run)} "
            f"| {'yes' if run['identical_to_stock'] else 'no'} "
            f"| {run['failed']} |"
        )
    return "\n".join(lines) + "\n"


class _DaskArm:
    """Corpus mode over `folder` on a local Dask cluster of `gpus` workers of `engines`
    threads, each building the benchmark's pipeline (`_worker_pipeline`). `with` starts
    the cluster; `run(folder, out, math, turns)` warms it (a run over short files, in
    which the workers build their pipelines) and returns the run to time."""

    def __init__(
        self, shape: str, made_in: Path, pipeline: Any, work: Path, gpus: int, engines: int
    ) -> None:
        import functools

        import torch

        if shape == "community-1":
            place = made_in / "community-1"
        else:
            place = made_in / "segmentation.pt"
            torch.save(pipeline._segmentation.model.state_dict(), place)
        self.make = functools.partial(_worker_pipeline, shape, str(place))
        self.work, self.gpus, self.engines = work, gpus, engines
        self.client: Any = None
        self.warm_seconds = 0.0

    def __enter__(self) -> _DaskArm:
        from pyspk.pyannote.corpus import local_gpu_cluster

        started = time.perf_counter()
        self.client = local_gpu_cluster(self.gpus, threads=self.engines)
        self.warm_seconds = time.perf_counter() - started
        return self

    def run(self, folder: Path, out: Path, math: str, turns: bool) -> Any:
        import pyspk.pyannote as pa

        started = time.perf_counter()
        warm = _corpus(self.work / "warm-audio", [45.0] * (2 * self.gpus * self.engines))
        pa.diarize_corpus_on_dask(
            self.make, warm, Path(tempfile.mkdtemp(dir=self.work)), self.client,
            math=math, engines=self.engines, turns=turns, progress=None,
        )  # fmt: skip
        self.warm_seconds += time.perf_counter() - started
        print(f"Dask workers started and warmed in {self.warm_seconds:.1f} s", flush=True)
        return lambda: pa.diarize_corpus_on_dask(
            self.make, [folder], out, self.client,
            math=math, engines=self.engines, turns=turns, progress=None,
        )  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        self.client.shutdown()


def _worker_pipeline(shape: str, place: str) -> Any:
    """The benchmark's pipeline on a Dask worker's GPU: community-1's from the folder it
    was written to, the agglomerative one from the calibrated segmentation's weights."""
    import torch
    from pyannote.audio import Pipeline

    from pyspk.pyannote import offline

    cuda = torch.device("cuda")
    if shape == "community-1":
        return Pipeline.from_pretrained(place).to(cuda)
    segmentation = offline.segmentation_3_0(seed=0)
    segmentation.load_state_dict(torch.load(place, map_location="cpu"))
    return offline.offline_pipeline(segmentation, offline.wespeaker_resnet34(seed=1)).to(cuda)


def _one_gpu_arms(args: argparse.Namespace, gpus: int) -> list[tuple[str, int | None]]:
    """(freeze, segmentation batch) of each corpus arm: every pair on one GPU, the
    defaults on Dask."""
    if gpus > 1:
        return [("off", None)]
    return [(freeze, batch) for freeze in args.freeze for batch in args.segmentation_batch]


def _torch_peaks(run: dict) -> str:
    allocated, reserved = run.get("torch_allocated_peak_gb"), run.get("torch_reserved_peak_gb")
    return "" if allocated is None else f"{allocated:.2f} / {reserved:.2f}"


def _queue(run: dict) -> str:
    if run["path"] != "corpus":
        return ""
    queue = "in turns" if run.get("turns") else "side by side"
    if run.get("freeze"):
        queue += ", collector frozen"
    if run.get("segmentation_batch"):
        queue += f", segmentation batch {run['segmentation_batch']}"
    return queue


if __name__ == "__main__":
    raise SystemExit(main())
