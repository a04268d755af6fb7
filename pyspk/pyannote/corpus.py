"""Corpus runs: many files through a pyannote pipeline, each file's RTTM written whole, a
JSON-lines manifest of what was done, and a rerun that skips it.

- `diarize_corpus`: on this process's GPU. Files are decoded ahead on a bounded queue
  (at most `decode_ahead` decoded files wait), longest first, from the start, and
  `engines` accelerated copies of the pipeline take them in turn on threads, each on
  streams of its own (each copy accelerated in its thread, one at a time, the first
  diarizing while the next are planned and captured; each copy's embedding side made
  while its first file's segmentation already runs): one
  file's clustering, reconstruction and RTTM run on the host while the next file's
  models run on the GPU, and the engines' GPU passes (one math: `library_math` scopes
  of one math run together) overlap each other, or with `turns` queue on the GPU one
  file after another (`pyspk.pyannote._turns`). Each file's output is the one the
  pipeline gives it alone (the copies hold the same weights, and no kernel's result
  depends on what runs beside it).
- `diarize_corpus_on_dask`: the same files as tasks of a `dask.distributed` cluster, one
  worker process per GPU (`local_gpu_cluster`, or workers started on other machines),
  longest first. Each worker builds a pipeline per file it runs at once, up to
  `engines` (`make_pipeline`, a picklable function), keeps them for its later files,
  and writes each RTTM whole; a file whose worker dies is run again on another. The
  manifest is written by the calling process alone.

A file that cannot be decoded or diarized is recorded as failed, and the others go on.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspk.errors import BackgroundSetupError
from pyspk.files import (
    Audio,
    FileError,
    audio_header,
    corpus_files,
    read_audio,
    refuse_rttm_twins,
    rttm_uri,
    write_rttm,
)

__all__ = [
    "CorpusRun",
    "Manifest",
    "diarize_corpus",
    "diarize_corpus_on_dask",
    "local_gpu_cluster",
]

MANIFEST_NAME = "manifest.jsonl"


class Manifest:
    """A JSON-lines record of finished files, one line each (`path`, `status` "done" or
    "failed", `audio_seconds`, `seconds`, `rtfx`, `speakers`, `rttm`, `error`), appended
    and flushed to disk as each file finishes, so that a run killed at any point keeps
    what it finished."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        # a run killed in the middle of a line left it unended: the next record starts
        # on a line of its own
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb+") as handle:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    handle.write(b"\n")

    def done(self) -> set[str]:
        """The paths whose last record says done and whose RTTM file exists."""
        last: dict[str, dict] = {}
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill: not a finished file
                    continue
                if isinstance(entry, dict) and "path" in entry:
                    last[entry["path"]] = entry
        return {
            path
            for path, entry in last.items()
            if entry.get("status") == "done" and Path(entry.get("rttm", "")).is_file()
        }

    def record(self, entry: dict) -> None:
        line = json.dumps(entry, sort_keys=True) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


@dataclass
class CorpusRun:
    """What a corpus run did: files found, diarized, skipped (done before) and failed;
    seconds of audio diarized and of wall time."""

    files: int = 0
    done: int = 0
    skipped: int = 0
    failed: int = 0
    audio_seconds: float = 0.0
    seconds: float = 0.0
    setup_seconds: float = 0.0
    """Of `seconds`, before any file could start: copying the pipelines and accelerating
    the first one's segmentation side (its embedding side is made while its first
    file's segmentation runs, the other engines while it diarizes)."""

    @property
    def rtfx(self) -> float:
        return self.audio_seconds / self.seconds if self.seconds > 0 else 0.0

    def progress_line(self, entry: dict) -> str:
        hours = self.audio_seconds / 3600
        finished = self.done + self.failed
        todo = self.files - self.skipped
        what = (
            f"{entry['speakers']} speakers, {entry['rtfx']:.0f}x"
            if entry["status"] == "done"
            else f"failed: {entry['error']}"
        )
        return (
            f"[{finished}/{todo}] {entry['path']}: {what}; {hours:.2f} h done, "
            f"{self.rtfx:.0f}x real time in aggregate"
        )


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _plan(
    inputs: Iterable[str | Path], rttm: Path, manifest: Path | None
) -> tuple[list[Path], Manifest, CorpusRun]:
    """The files to run (longest first, those done before left out), the manifest, and
    the run's counts so far."""
    files = corpus_files(inputs)
    refuse_rttm_twins(files)
    rttm.mkdir(parents=True, exist_ok=True)
    manifest = Path(manifest) if manifest is not None else rttm / MANIFEST_NAME
    manifest.parent.mkdir(parents=True, exist_ok=True)  # before any file: none unrecorded
    record = Manifest(manifest)
    done = record.done()
    todo = [path for path in files if str(path) not in done]
    todo.sort(key=_seconds_or_zero, reverse=True)
    return todo, record, CorpusRun(files=len(files), skipped=len(files) - len(todo))


def _seconds_or_zero(path: Path) -> float:
    """The length that orders the run: the header's duration, not the bytes, which
    understate a compressed file's length; 0 for a file libsndfile cannot read, which
    fails quickly in its turn."""
    try:
        header = audio_header(path)
    except FileError:
        return 0.0
    return header.frames / header.samplerate if header.samplerate > 0 else 0.0


def diarize_file(
    pipeline: Any, path: Path, audio: Audio | None, rttm: Path, **options: Any
) -> dict:
    """One file through `pipeline`, its RTTM written whole: the manifest entry (a
    failure is an entry too, with its error). `audio` is the decoded file, or None to
    decode it here."""
    import torch

    entry: dict[str, Any] = {"path": str(path), "rttm": str(rttm / f"{rttm_uri(path)}.rttm")}
    started = time.perf_counter()
    try:
        audio = read_audio(path) if audio is None else audio
        file = {
            "waveform": torch.from_numpy(audio.waveform),
            "sample_rate": audio.sample_rate,
            "uri": rttm_uri(path),
        }
        output = pipeline(file, **options)
        annotation = getattr(output, "speaker_diarization", output)
        write_rttm(annotation, Path(entry["rttm"]))
    except BackgroundSetupError:  # the engine's, not the file's: the run stops
        raise
    except Exception as error:  # this file's failure: recorded, and the others go on
        entry.update(status="failed", error=f"{type(error).__name__}: {error}")
        return entry
    seconds = time.perf_counter() - started
    entry.update(
        status="done",
        audio_seconds=audio.seconds,
        seconds=seconds,
        rtfx=audio.seconds / seconds,
        speakers=len(annotation.labels()),
    )
    return entry


def _count(run: CorpusRun, entry: dict) -> None:
    if entry["status"] == "done":
        run.done += 1
        run.audio_seconds += entry["audio_seconds"]
    else:
        run.failed += 1


def diarize_corpus(
    pipeline: Any,
    inputs: Iterable[str | Path],
    rttm: Path,
    *,
    manifest: Path | None = None,
    math: str = "fp32",
    engines: int = 2,
    decode_ahead: int = 4,
    accelerate: bool = True,
    segmentation_batch: int | None = None,
    turns: bool = True,
    freeze: bool = False,
    progress: Callable[[str], None] | None = _to_stderr,
    **options: Any,
) -> CorpusRun:
    """Diarizes the audio files `inputs` name (files, folders, `@list` files: see
    `pyspk.files.corpus_files`) with `pipeline` (a `SpeakerDiarization` on its CUDA
    device) on `engines` accelerated copies of it in `math` (the stock pipeline where
    `accelerate` is false; `segmentation_batch` as `accelerate_pipeline` takes it;
    `turns`: the engines' files queued on the GPU in turn, `pyspk.pyannote.DeviceTurns`;
    False: side by side, each file's GPU work beside the other engines'; `freeze`: the
    objects alive when the files start, the pipelines' among them, left out of the
    garbage collector's full collections until the run ends (`gc.freeze`), unless the
    process froze some itself),
    writing `rttm/<uri>.rttm` and the manifest (by default `rttm/manifest.jsonl`). Files
    the manifest says are done are skipped, and an RTTM it does not record as done is
    written again. `options` go to each pipeline call (e.g. `num_speakers`); `progress`
    gets one line per file."""
    if engines < 1 or decode_ahead < 1:
        raise ValueError(f"engines and decode_ahead must be positive: {engines}, {decode_ahead}")
    # the manifest's RTTM paths hold from any working directory a rerun starts in
    rttm = Path(rttm).absolute()
    todo, record, run = _plan(inputs, rttm, manifest)
    if not todo:
        return run
    started = time.perf_counter()
    pipelines = [pipeline, *(copy.deepcopy(pipeline) for _ in range(min(engines, len(todo)) - 1))]
    setup = _Setup(math, segmentation_batch, turns) if accelerate else None
    # a full collection walks every tracked object, the loaded pipelines' some 480,000:
    # 0.24 s on the H200's host, in whichever file's step it lands (24 us once frozen on
    # a development machine; on the H200 a frozen run still had one, of 0.388 s)
    frozen = freeze and gc.get_freeze_count() == 0
    if frozen:
        gc.freeze()
    try:
        _Engines(pipelines, todo, decode_ahead, rttm, options, setup).run(
            record, run, progress, started
        )
    finally:
        if frozen:
            gc.unfreeze()
        if setup is not None:  # after `run`: no engine thread runs
            setup.undo()
    run.seconds = time.perf_counter() - started
    return run


class _Setup:
    """Each engine's acceleration, made in its own thread one engine at a time: the first
    engine diarizes while the next ones plan and capture (their captures are
    thread-local, on streams of their own), so a run waits for one engine's segmentation
    side: its embedding side is made while its first file's segmentation runs, and the
    next engine's setup starts after it. Each thread runs on the caller's device."""

    def __init__(self, math: str, segmentation_batch: int | None, turns: bool) -> None:
        import torch

        from pyspk.pyannote._turns import DeviceTurns

        self.math, self.segmentation_batch = math, segmentation_batch
        self.turns = DeviceTurns() if turns else None
        self.device = torch.cuda.current_device()
        self.lock = threading.Lock()
        self.accelerations: list[Any] = []

    def accelerate(self, pipeline: Any, stop: threading.Event) -> bool:
        """Accelerates `pipeline` in this thread, unless the run stopped meanwhile."""
        import torch

        from pyspk.pyannote import accelerate_pipeline

        torch.cuda.set_device(self.device)
        with self.lock:
            if self.accelerations:  # the engine before's embedding side is made too
                self.accelerations[-1].settle()
            if stop.is_set():
                return False
            self.accelerations.append(
                accelerate_pipeline(
                    pipeline,
                    self.math,
                    segmentation_batch=self.segmentation_batch,
                    turns=self.turns,
                    embedding_in_background=True,
                )
            )
        return True

    def undo(self) -> None:
        from pyspk.errors import run_all

        run_all([acceleration.undo for acceleration in self.accelerations])


class _Engines:
    """One thread decoding the files ahead into a bounded queue, and one thread per
    pipeline diarizing what it takes from it. What stops an engine (not a file's
    failure: the manifest's disk, the caller's progress) stops the run: the others end
    after their current file, and `run` raises it."""

    def __init__(
        self,
        pipelines: list[Any],
        todo: list[Path],
        ahead: int,
        rttm: Path,
        options: dict,
        setup: _Setup | None,
    ) -> None:
        self.pipelines, self.todo, self.rttm, self.options = pipelines, todo, rttm, options
        self.setup = setup
        self.decoded: queue.Queue = queue.Queue(maxsize=ahead)
        self.stop = threading.Event()
        self.raised: list[BaseException] = []
        self.lock = threading.Lock()

    def offer(self, item: Any) -> bool:
        """Queues `item` unless the run stops first."""
        while not self.stop.is_set():
            try:
                self.decoded.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def take(self) -> Any:
        """The next decoded file, or None at the end or when the run stops."""
        while not self.stop.is_set():
            try:
                return self.decoded.get(timeout=0.1)
            except queue.Empty:
                continue
        return None

    def decode_all(self) -> None:
        try:
            for path in self.todo:
                try:
                    item: tuple[Path, Any] = (path, read_audio(path))
                except Exception as error:  # this file's: recorded against it
                    item = (path, error)
                if not self.offer(item):
                    return
        finally:
            for _ in self.pipelines:
                self.offer(None)

    def engine(
        self,
        own: Any,
        record: Manifest,
        run: CorpusRun,
        progress: Any,
        started: float,
        finished: threading.Event,
    ) -> None:
        try:
            if self.setup is not None:
                if not self.setup.accelerate(own, self.stop):
                    return
                with self.lock:  # the first engine ready ends the run's setup
                    run.setup_seconds = run.setup_seconds or time.perf_counter() - started
            while (item := self.take()) is not None:
                path, audio = item
                if isinstance(audio, Exception):
                    error = audio if isinstance(audio, FileError) else repr(audio)
                    entry = {"path": str(path), "status": "failed", "error": f"{error}"}
                else:
                    entry = diarize_file(own, path, audio, self.rttm, **self.options)
                record.record(entry)
                with self.lock:
                    _count(run, entry)
                    run.seconds = time.perf_counter() - started
                    if progress is not None:
                        progress(run.progress_line(entry))
        except BaseException as error:
            self.raised.append(error)
            self.stop.set()
        finally:
            finished.set()

    def run(self, record: Manifest, run: CorpusRun, progress: Any, started: float) -> None:
        # each engine says it has ended with an event, not by its thread's join: a ^C
        # that lands in `Thread.join` marks that thread ended while it still runs
        # (CPython 3.11), and the run would then undo the accelerations under it
        finished = [threading.Event() for _ in self.pipelines]
        threads = [
            threading.Thread(
                target=self.engine,
                args=(own, record, run, progress, started, ended),
                name=f"pyspk-engine-{index}",
            )
            for index, (own, ended) in enumerate(zip(self.pipelines, finished, strict=True))
        ]
        try:
            threading.Thread(target=self.decode_all, daemon=True, name="pyspk-decode").start()
            for thread in threads:
                thread.start()
            for ended in finished:
                ended.wait()
        finally:
            self.stop.set()  # ^C here: each engine ends after its current file
            for thread, ended in zip(threads, finished, strict=True):
                if thread.ident is not None:  # started
                    ended.wait()
        if self.raised:
            raise self.raised[0]


# -- Dask -----------------------------------------------------------------------------


class _WorkerEngines:
    """A worker process's pipelines for one kind of task (`make_pipeline`, math,
    acceleration): up to `engines` of them, each task taking a free one and giving it
    back, a new one built (and accelerated, on one `DeviceTurns` where `turns`) while
    fewer exist and none is free; so a worker of that many threads runs that many files
    at once, one's host steps beside another's GPU work, as `diarize_corpus` does."""

    def __init__(self, engines: int, turns: bool) -> None:
        from pyspk.pyannote._turns import DeviceTurns

        self.engines = engines
        self.turns = DeviceTurns() if turns else None
        self.free: list[Any] = []
        self.made = 0
        self.changed = threading.Condition()
        # one build at a time, as `diarize_corpus` accelerates its engines: a builder
        # may draw on process-wide state (the offline models seed torch's generator,
        # and two built at once got each other's draws)
        self.building = threading.Lock()

    def take(self, make_pipeline: Callable[[], Any], math: str, accelerate: bool) -> Any:
        with self.changed:
            while not self.free and self.made >= self.engines:
                self.changed.wait()
            if self.free:
                return self.free.pop()
            self.made += 1
        try:  # outside the pool's lock: the worker's other engines diarize meanwhile
            with self.building:
                pipeline = make_pipeline()
                if accelerate:
                    from pyspk.pyannote import accelerate_pipeline

                    # lasts as long as the pipeline
                    accelerate_pipeline(pipeline, math, turns=self.turns)
        except BaseException:
            with self.changed:
                self.made -= 1
                self.changed.notify()
            raise
        return pipeline

    def give_back(self, pipeline: Any) -> None:
        with self.changed:
            self.free.append(pipeline)
            self.changed.notify()


_WORKER_ENGINES: dict[tuple, _WorkerEngines] = {}
_WORKER_LOCK = threading.Lock()


def _diarize_on_worker(
    make_pipeline: Callable[[], Any],
    path: str,
    rttm: str,
    math: str,
    accelerate: bool,
    options: dict,
    engines: int = 1,
    turns: bool = False,
) -> dict:
    """One file on a worker, on one of this process's pipelines of its kind (made at
    the first files, as many as run at once up to `engines`)."""
    import pickle

    key = (pickle.dumps(make_pipeline), math, accelerate, engines, turns)
    with _WORKER_LOCK:
        if key not in _WORKER_ENGINES:
            _WORKER_ENGINES[key] = _WorkerEngines(engines, turns)
        pool = _WORKER_ENGINES[key]
    pipeline = pool.take(make_pipeline, math, accelerate)
    try:
        return diarize_file(pipeline, Path(path), None, Path(rttm), **options)
    finally:
        pool.give_back(pipeline)


def diarize_corpus_on_dask(
    make_pipeline: Callable[[], Any],
    inputs: Iterable[str | Path],
    rttm: Path,
    client: Any,
    *,
    manifest: Path | None = None,
    math: str = "fp32",
    accelerate: bool = True,
    engines: int = 1,
    turns: bool = True,
    progress: Callable[[str], None] | None = _to_stderr,
    **options: Any,
) -> CorpusRun:
    """`diarize_corpus` on the workers of the `dask.distributed` `client`: each file a
    task, longest first; `make_pipeline()` builds a pipeline on a worker (on the
    worker's device), up to `engines` per worker as its threads run files at once
    (`turns` as `diarize_corpus` takes it), each kept for the worker's later files.
    Files must be readable at the same paths by every worker, and `rttm` writable by
    them."""
    if engines < 1:
        raise ValueError(f"engines must be positive: {engines}")
    from distributed import as_completed

    rttm = Path(rttm).resolve()
    todo, record, run = _plan(inputs, rttm, manifest)
    started = time.perf_counter()
    # keys of this run's own: another run's tasks on the scheduler never stand for them
    run_key = uuid.uuid4().hex[:12]
    futures = [
        client.submit(
            _diarize_on_worker,
            make_pipeline,
            # absolute, links not followed: the worker names the RTTM after the link, as
            # `_plan` checked the names
            str(path.absolute()),
            str(rttm),
            math,
            accelerate,
            options,
            engines,
            turns,
            key=f"pyspk-diarize-{run_key}-{index}-{rttm_uri(path)}",
            priority=len(todo) - index,  # longest first
            pure=False,
        )
        for index, path in enumerate(todo)
    ]
    named = {future.key: str(path) for future, path in zip(futures, todo, strict=True)}
    for future in as_completed(futures):
        try:
            entry = future.result()
        except Exception as error:  # e.g. KilledWorker: the file killed worker after worker
            entry = {"status": "failed", "error": f"{type(error).__name__}: {error}"}
        entry["path"] = named[future.key]  # as the caller named it
        record.record(entry)
        _count(run, entry)
        run.seconds = time.perf_counter() - started
        if progress is not None:
            progress(run.progress_line(entry))
    run.seconds = time.perf_counter() - started
    return run


def local_gpu_cluster(gpus: int, threads: int = 1) -> Any:
    """A `distributed.Client` of a local cluster with one worker process per GPU, of
    `threads` threads (one per engine: `diarize_corpus_on_dask`'s `engines`), worker i
    seeing only GPU i (set before anything in it initialises CUDA)."""
    from distributed import Client, LocalCluster, WorkerPlugin

    class PinDevice(WorkerPlugin):
        name = "pyspk-pin-device"

        def setup(self, worker: Any) -> None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(worker.name)

    cluster = LocalCluster(n_workers=gpus, threads_per_worker=threads, processes=True)
    client = Client(cluster)
    client.register_plugin(PinDevice())
    return client
