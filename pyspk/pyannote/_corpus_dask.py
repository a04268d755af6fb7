"""Corpus runs on a `dask.distributed` cluster: each file a task, longest first, on
workers of one process per GPU (`local_gpu_cluster`, or workers started on other
machines). Each worker keeps the pipelines it builds for its later files; the manifest
is written by the calling process alone (`pyspk.pyannote.corpus` tells the whole)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pyspk.files import rttm_uri
from pyspk.pyannote._corpus_files import CorpusRun, diarize_file, plan_run, to_stderr

__all__ = ["diarize_corpus_on_dask", "local_gpu_cluster"]


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
    progress: Callable[[str], None] | None = to_stderr,
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
    todo, record, run = plan_run(inputs, rttm, manifest)
    started = time.perf_counter()
    # keys of this run's own: another run's tasks on the scheduler never stand for them
    run_key = uuid.uuid4().hex[:12]
    futures = [
        client.submit(
            _diarize_on_worker,
            make_pipeline,
            # absolute, links not followed: the worker names the RTTM after the link, as
            # `plan_run` checked the names
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
        run.tally(entry, started, progress)
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
