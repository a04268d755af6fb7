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
import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pyspk.files import FileError, read_audio
from pyspk.pyannote._corpus_dask import diarize_corpus_on_dask, local_gpu_cluster
from pyspk.pyannote._corpus_files import (
    MANIFEST_NAME,
    CorpusRun,
    Manifest,
    diarize_file,
    plan_run,
    to_stderr,
)

__all__ = [
    "MANIFEST_NAME",
    "CorpusRun",
    "Manifest",
    "diarize_corpus",
    "diarize_corpus_on_dask",
    "diarize_file",
    "local_gpu_cluster",
]


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
    progress: Callable[[str], None] | None = to_stderr,
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
    todo, record, run = plan_run(inputs, rttm, manifest)
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
                    run.tally(entry, started, progress)
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
