"""Corpus runs on the CPU with the stock pyannote pipeline (random-weight models): which
files an input names, the manifest and the rerun that skips what it records, a corrupt
file among good ones, bounded decoding, a Dask cluster of two worker processes that
loses one mid-run and still writes every file's RTTM as a single process does, and the
`--gpus` cluster's one device per worker."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from pyspk.files import FileError, corpus_files, rttm_uri
from tests.optional import importorskip

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")

SECONDS = (10.5, 12.0, 14.0, 11.0)


def cpu_pipeline():
    """The stock pipeline of the random-weight models, on the CPU (picklable by
    reference, for Dask's workers)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pyspk.pyannote.offline import offline_pipeline, segmentation_3_0, wespeaker_resnet34

        return offline_pipeline(segmentation_3_0(seed=0), wespeaker_resnet34(seed=1))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Four short conversations as WAV files in nested folders, and a corrupt .wav."""
    soundfile = importorskip("soundfile", reason="soundfile is missing (diarize extra)")
    from pyspk.testing.synthetic import recording

    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a" / "b").mkdir(parents=True)
    places = ["one.wav", "a/two.wav", "a/b/three.flac", "a/b/four.wav"]
    for index, (place, seconds) in enumerate(zip(places, SECONDS, strict=True)):
        soundfile.write(folder / place, recording(seconds, seed=60 + index).waveform, 16000)
    (folder / "a" / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00not audio at all")
    (folder / "notes.txt").write_text("not audio, and not an audio extension\n")
    return folder


def _stack() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        importorskip("torch", reason="PyTorch is missing")
        importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")


def test_inputs_name_files_folders_and_lists(corpus, tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text(f"# two of them\n{corpus / 'one.wav'}\n\n{corpus / 'a' / 'two.wav'}\n")
    found = corpus_files([corpus / "a", f"@{listing}", corpus / "one.wav"])
    assert [p.relative_to(corpus).as_posix() for p in found] == [
        "a/b/four.wav",
        "a/b/three.flac",
        "a/broken.wav",
        "a/two.wav",
        "one.wav",
    ]
    with pytest.raises(FileError, match="no such file or folder"):
        corpus_files([corpus / "missing.wav"])


def _rttms(folder: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(folder.glob("*.rttm"))}


def _alone(corpus: Path, tmp_path: Path) -> Path:
    """A folder of each good file's RTTM from one pipeline, one file after another."""
    from pyspk.pyannote.corpus import diarize_file

    alone = tmp_path / "alone"
    alone.mkdir()
    pipeline = cpu_pipeline()
    for path in corpus_files([corpus]):
        if path.name != "broken.wav":
            assert diarize_file(pipeline, path, None, alone)["status"] == "done"
    return alone


def _entries(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text().splitlines()]


def test_a_run_records_each_file_resumes_and_keeps_decoding_bounded(corpus, tmp_path, monkeypatch):
    """Two engines over the corpus: every good file's RTTM equals a single pipeline's;
    the corrupt file is recorded as failed; a rerun after an interruption (a cut manifest
    line, a partial RTTM) redoes only what the manifest does not say is done; decoded
    files waiting never exceed `decode_ahead`."""
    _stack()
    from pyspk.pyannote import corpus as corpus_module
    from pyspk.pyannote.corpus import diarize_corpus, diarize_file

    alone = tmp_path / "alone"
    alone.mkdir()
    pipeline = cpu_pipeline()
    good = [p for p in corpus_files([corpus]) if p.name != "broken.wav"]
    for path in good:
        assert diarize_file(pipeline, path, None, alone)["status"] == "done"

    waiting, most = [0], [0]
    read = corpus_module.read_audio

    def counted(path):
        audio = read(path)
        waiting[0] += 1
        most[0] = max(most[0], waiting[0])
        return audio

    diarize = corpus_module.diarize_file

    def consumed(*args, **kwargs):
        waiting[0] -= 1
        return diarize(*args, **kwargs)

    monkeypatch.setattr(corpus_module, "read_audio", counted)
    monkeypatch.setattr(corpus_module, "diarize_file", consumed)
    out = tmp_path / "out"
    lines: list[str] = []
    # the first run sees two files only, as a run killed after them would have left
    first = diarize_corpus(
        pipeline,
        [corpus / "one.wav", corpus / "a" / "two.wav"],
        out,
        accelerate=False,
        progress=lines.append,
    )
    assert (first.done, first.failed, first.skipped) == (2, 0, 0)
    manifest = out / "manifest.jsonl"
    with open(manifest, "a") as handle:
        handle.write('{"path": "cut by a ki')  # a kill in the middle of a line
    (out / ".three.rttm.partial").write_text("half")
    run = diarize_corpus(
        pipeline, [corpus], out, accelerate=False, decode_ahead=1, progress=lines.append
    )
    assert (run.files, run.done, run.skipped, run.failed) == (5, 2, 2, 1)
    assert most[0] <= 1 + 2  # the queue's one, and one in each engine's hands
    assert _rttms(out) == _rttms(alone)
    records = {}
    for line in manifest.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        records[Path(entry["path"]).name] = entry
    assert records["broken.wav"]["status"] == "failed"
    assert "libsndfile" in records["broken.wav"]["error"]
    assert {name for name, e in records.items() if e["status"] == "done"} == {p.name for p in good}
    assert any("x real time in aggregate" in line for line in lines)
    again = diarize_corpus(pipeline, [corpus], out, accelerate=False, progress=None)
    assert (again.done, again.skipped, again.failed) == (0, 4, 1)  # the broken file again


def test_an_error_outside_any_file_stops_the_run_and_is_raised(corpus, tmp_path):
    """What stops an engine (here the caller's progress callback) is not a file's
    failure: the other engine ends after its current file, no file is started after,
    and the run raises it with the finished files recorded."""
    _stack()
    from pyspk.pyannote.corpus import diarize_corpus

    def broken(line: str) -> None:
        raise RuntimeError("the progress display broke")

    with pytest.raises(RuntimeError, match="progress display broke"):
        diarize_corpus(cpu_pipeline(), [corpus], tmp_path, accelerate=False, progress=broken)
    entries = _entries(tmp_path / "manifest.jsonl")
    assert 1 <= len(entries) <= 2  # one file in each engine's hands at most


class _Accelerations:
    """`accelerate_pipeline` stood in for (the CPU has no engine): what each call got,
    on which thread, and whether it was undone. `fail_at` makes that call raise."""

    def __init__(self, wait_before: int | None = None, fail_at: int | None = None) -> None:
        self.calls: list[str] = []
        self.turns: list[object] = []
        self.undone: list[bool] = []
        self.settled: list[int] = []  # which engines' setups were waited for, in order
        self.in_background: list[bool] = []
        self.first_file_done = threading.Event()
        self.wait_before, self.fail_at = wait_before, fail_at

    def __call__(
        self, pipeline, math, segmentation_batch=None, turns=None, embedding_in_background=False
    ):
        index = len(self.calls)
        self.calls.append(threading.current_thread().name)
        self.turns.append(turns)
        self.in_background.append(embedding_in_background)
        if index == self.wait_before:  # returns only if another engine diarizes meanwhile
            assert self.first_file_done.wait(timeout=120), "no file was diarized meanwhile"
        if index == self.fail_at:
            raise MemoryError(f"accelerating engine {index}")
        self.undone.append(False)
        return _Undo(self, index)


class _Undo:
    def __init__(self, accelerations: _Accelerations, index: int) -> None:
        self.accelerations, self.index = accelerations, index

    def settle(self) -> None:
        self.accelerations.settled.append(self.index)

    def undo(self) -> None:
        self.accelerations.undone[self.index] = True


def _stand_in(monkeypatch, accelerations: _Accelerations) -> None:
    torch = importorskip("torch", reason="PyTorch is missing")
    import pyspk.pyannote

    monkeypatch.setattr(pyspk.pyannote, "accelerate_pipeline", accelerations)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)


def test_the_first_engine_diarizes_while_the_next_is_accelerated(corpus, tmp_path, monkeypatch):
    """Each engine is accelerated in its own thread, one at a time, and the first takes
    files as soon as it is ready: the second engine's acceleration here returns only
    once a file is done, so a run that accelerated every engine first would never end.
    Every acceleration is undone at the end, and the setup is the first engine's. With
    `turns`, both engines queue on one `DeviceTurns`."""
    _stack()
    from pyspk.pyannote import DeviceTurns
    from pyspk.pyannote.corpus import diarize_corpus

    accelerations = _Accelerations(wait_before=1)
    _stand_in(monkeypatch, accelerations)
    run = diarize_corpus(
        cpu_pipeline(),
        [corpus],
        tmp_path,
        engines=2,
        turns=True,
        progress=lambda line: accelerations.first_file_done.set(),
    )
    assert (run.done, run.failed) == (4, 1)
    assert len(accelerations.calls) == 2 and len(set(accelerations.calls)) == 2
    first, second = accelerations.turns
    assert isinstance(first, DeviceTurns) and second is first
    assert threading.current_thread().name not in accelerations.calls
    assert accelerations.undone == [True, True]
    assert 0.0 < run.setup_seconds < run.seconds
    # each engine's embedding side made beside its first file, the second engine's
    # setup begun once the first one's was made
    assert accelerations.in_background == [True, True]
    assert accelerations.settled == [0]


def test_a_failed_embedding_setup_stops_the_run_and_records_no_file(corpus, tmp_path, monkeypatch):
    """An engine whose embedding side, made in the background, failed raises
    `BackgroundSetupError` from its file's `apply`: that is the engine's failure, not
    the file's, so the run stops and raises it, and the manifest records no file as
    failed (a rerun redoes them)."""
    _stack()
    from pyspk.errors import BackgroundSetupError
    from pyspk.pyannote.corpus import diarize_corpus

    _stand_in(monkeypatch, _Accelerations())
    pipeline = cpu_pipeline()

    def broken(file, **options):
        raise BackgroundSetupError("pyspk engine: the embedding setup on cuda:0 failed")

    pipeline.apply = broken
    with pytest.raises(BackgroundSetupError, match="embedding setup on cuda:0"):
        diarize_corpus(pipeline, [corpus], tmp_path, engines=1, progress=None)
    manifest = tmp_path / "manifest.jsonl"
    assert not manifest.exists() or _entries(manifest) == []


def test_an_engine_that_cannot_be_accelerated_stops_the_run(corpus, tmp_path, monkeypatch):
    """An acceleration that fails (here the second engine's) is not a file's failure:
    the run stops, raises it, and undoes the accelerations it made."""
    _stack()
    from pyspk.pyannote.corpus import diarize_corpus

    accelerations = _Accelerations(fail_at=1)
    _stand_in(monkeypatch, accelerations)
    with pytest.raises(MemoryError, match="accelerating engine 1"):
        diarize_corpus(cpu_pipeline(), [corpus], tmp_path, engines=2, progress=None)
    assert accelerations.undone == [True]
    first, second = accelerations.turns  # in turns by default: one DeviceTurns for both
    assert first is not None and first is second


def test_a_decoding_error_of_any_kind_is_that_files_and_names_are_unique(
    corpus, tmp_path, monkeypatch
):
    """A decoder that fails otherwise than libsndfile does (memory) records the file as
    failed and the run ends; two files of one RTTM name are refused before any work."""
    _stack()
    from pyspk.pyannote import corpus as corpus_module

    def no_memory(path):
        raise MemoryError(f"{path} is too long")

    monkeypatch.setattr(corpus_module, "read_audio", no_memory)
    run = corpus_module.diarize_corpus(
        cpu_pipeline(), [corpus], tmp_path / "out", accelerate=False, progress=None
    )
    assert (run.done, run.failed) == (0, 5)
    errors = [entry["error"] for entry in _entries(tmp_path / "out" / "manifest.jsonl")]
    assert all(error.startswith("MemoryError(") for error in errors)
    twin = tmp_path / "twin"
    twin.mkdir()
    (twin / "one.flac").write_bytes((corpus / "one.wav").read_bytes())
    with pytest.raises(FileError, match=r"would both write one\.rttm"):
        corpus_module.diarize_corpus(
            cpu_pipeline(), [corpus / "one.wav", twin], tmp_path / "twins", accelerate=False
        )


def test_dask_workers_write_what_one_process_writes_when_one_dies(corpus, tmp_path):
    """A LocalCluster of two worker processes; one is killed while files are being
    diarized. Every good file's RTTM equals a single process's, and the manifest has one
    record per file."""
    _stack()
    importorskip("distributed", reason="dask.distributed is missing (corpus extra)")
    from distributed import Client, LocalCluster

    from pyspk.pyannote.corpus import diarize_corpus_on_dask

    alone = _alone(corpus, tmp_path)
    good = [p for p in corpus_files([corpus]) if p.name != "broken.wav"]
    out = tmp_path / "dask"
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        killed: list[int] = []

        def kill_a_busy_worker() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not killed:
                busy = [worker for worker, keys in client.processing().items() if keys]
                if busy:
                    pid = client.run(os.getpid, workers=[busy[0]])[busy[0]]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                time.sleep(0.05)

        killer = threading.Thread(target=kill_a_busy_worker)
        killer.start()
        run = diarize_corpus_on_dask(
            cpu_pipeline, [corpus], out, client, accelerate=False, progress=None
        )
        killer.join()
    assert killed, "no worker was busy to be killed"
    assert (run.done, run.failed) == (4, 1)
    assert _rttms(out) == _rttms(alone)
    entries = _entries(out / "manifest.jsonl")
    assert sorted(Path(e["path"]).name for e in entries) == sorted(
        p.name for p in corpus_files([corpus])
    )
    assert not list(out.glob(".*.partial"))
    assert rttm_uri(good[0]) + ".rttm" in _rttms(out)
    assert np.isfinite([e["seconds"] for e in entries if e["status"] == "done"]).all()


def test_the_local_gpu_cluster_pins_each_worker_to_its_device_also_after_a_death():
    """`--gpus N`'s cluster: worker i sees only device i (CUDA_VISIBLE_DEVICES, read by
    CUDA when it starts in that process), and a worker the nanny restarts after a kill
    sees its own device again, not another's or all."""
    importorskip("distributed", reason="dask.distributed is missing (corpus extra)")
    from pyspk.pyannote.corpus import local_gpu_cluster

    def visible() -> dict[str, str | None]:
        return client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))

    client = local_gpu_cluster(2)
    try:
        pinned = visible()
        assert sorted(pinned.values()) == ["0", "1"]
        names = client.run(lambda dask_worker: str(dask_worker.name))
        assert all(pinned[address] == names[address] for address in pinned)
        victim = next(iter(pinned))
        os.kill(client.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while victim in client.scheduler_info()["workers"] and time.monotonic() < deadline:
            time.sleep(0.05)
        client.wait_for_workers(2, timeout=60)
        assert victim not in visible()  # the restarted worker is a new process
        assert sorted(visible().values()) == ["0", "1"]
    finally:
        client.shutdown()


def test_files_run_longest_first_by_their_headers_not_their_bytes(corpus, tmp_path):
    """A 14 s FLAC file is smaller than a 12 s WAV file, yet runs before it; a file
    libsndfile cannot read runs last; a file the manifest records as done is left out."""
    from pyspk.pyannote._corpus_files import plan_run

    flac, wav = corpus / "a" / "b" / "three.flac", corpus / "a" / "two.wav"
    assert flac.stat().st_size < wav.stat().st_size  # what bytes alone would misorder
    todo, _, run = plan_run([corpus], tmp_path, None)
    assert [path.name for path in todo] == [
        "three.flac",
        "two.wav",
        "four.wav",
        "one.wav",
        "broken.wav",
    ]
    (tmp_path / "three.rttm").write_text("")
    done = {"path": str(flac), "status": "done", "rttm": str(tmp_path / "three.rttm")}
    (tmp_path / "manifest.jsonl").write_text(json.dumps(done) + "\n")
    todo, _, run = plan_run([corpus], tmp_path, None)
    assert flac not in todo and run.skipped == 1


def test_a_workers_engines_are_made_as_files_run_at_once_up_to_their_number(monkeypatch):
    """Three threads of one worker take pipelines from a pool of two engines: two are
    made (accelerated on one DeviceTurns) and the third thread waits for one to be given
    back; a build that fails leaves its place to the next."""
    _stack()
    import pyspk.pyannote
    from pyspk.pyannote import DeviceTurns
    from pyspk.pyannote._corpus_dask import _WorkerEngines

    accelerated: list[tuple[object, str, object]] = []
    monkeypatch.setattr(
        pyspk.pyannote,
        "accelerate_pipeline",
        lambda pipeline, math, turns=None: accelerated.append((pipeline, math, turns)),
    )
    made: list[object] = []
    builds = 0

    def make() -> object:
        nonlocal builds
        builds += 1
        if builds == 1:
            raise MemoryError("the first build fails")
        made.append(object())
        return made[-1]

    pool = _WorkerEngines(2, turns=True)
    with pytest.raises(MemoryError, match="first build"):
        pool.take(make, "tf32", True)
    first, second = pool.take(make, "tf32", True), pool.take(make, "tf32", True)
    taken: list[object] = []
    waiting = threading.Thread(target=lambda: taken.append(pool.take(make, "tf32", True)))
    waiting.start()
    waiting.join(timeout=0.3)
    assert waiting.is_alive() and not taken  # two engines, both busy
    pool.give_back(second)
    waiting.join(timeout=30)
    assert taken == [second] and made == [first, second]
    assert [pipeline for pipeline, _, _ in accelerated] == [first, second]
    turns = {id(turn) for _, _, turn in accelerated}
    assert len(turns) == 1 and isinstance(accelerated[0][2], DeviceTurns)


def test_a_dask_worker_of_two_threads_runs_two_engines(corpus, tmp_path):
    """One worker process with two threads and `engines=2`: it builds two pipelines
    (each build leaves a mark), never more, and writes what one process writes."""
    _stack()
    importorskip("distributed", reason="dask.distributed is missing (corpus extra)")
    import functools

    from distributed import Client, LocalCluster

    from pyspk.pyannote.corpus import diarize_corpus_on_dask

    alone = _alone(corpus, tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    out = tmp_path / "dask"
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        run = diarize_corpus_on_dask(
            functools.partial(_marked_cpu_pipeline, marks),
            [corpus],
            out,
            client,
            accelerate=False,
            engines=2,
            progress=None,
        )
    assert (run.done, run.failed) == (4, 1)
    assert _rttms(out) == _rttms(alone)
    assert len(list(marks.iterdir())) == 2


def _marked_cpu_pipeline(marks: Path):
    """`cpu_pipeline()`, leaving a file in `marks` for each one built."""
    (marks / f"{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}").touch()
    return cpu_pipeline()


def test_decoded_audio_is_channels_by_samples_in_c_order(tmp_path):
    """Mono and stereo files decode to (channels, samples) float32 arrays in C order,
    each channel's samples as written."""
    soundfile = importorskip("soundfile", reason="soundfile is missing (diarize extra)")
    from pyspk.files import read_audio

    samples = np.linspace(-0.5, 0.5, 4000, dtype=np.float32)
    for channels in (1, 2):
        written = np.stack([samples * (c + 1) for c in range(channels)], axis=1)
        soundfile.write(tmp_path / f"{channels}.wav", written, 16000, subtype="FLOAT")
        audio = read_audio(tmp_path / f"{channels}.wav")
        assert audio.waveform.shape == (channels, 4000) and audio.waveform.dtype == np.float32
        assert audio.waveform.flags.c_contiguous
        assert np.array_equal(audio.waveform, written.T)


class _Quick:
    """Stands for a pipeline: each call says it began, takes its time (the calls in turn
    take `seconds`, the last value for the rest) and returns an empty annotation; copies
    are the same object (its event is shared)."""

    def __init__(self, *seconds: float) -> None:
        self.seconds = list(seconds or (0.0,))
        self.began = threading.Event()
        self.running = 0  # calls begun and not yet returned
        self.lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> _Quick:
        return self

    def __call__(self, file: dict, **options):
        from pyannote.core import Annotation

        with self.lock:
            self.running += 1
            seconds = self.seconds.pop(0) if len(self.seconds) > 1 else self.seconds[0]
        self.began.set()
        time.sleep(seconds)
        with self.lock:
            self.running -= 1
        return Annotation(uri=file["uri"])


def _quick_pipeline() -> _Quick:
    return _Quick()


def test_a_ctrl_c_lets_the_files_in_flight_finish_and_is_raised(corpus, tmp_path):
    """A real SIGINT while two engines diarize files of 3 s and 1 s: the run ends only
    after each engine has recorded its file in flight, raises KeyboardInterrupt, and
    leaves no engine thread running (a ^C inside `Thread.join` had marked a running
    engine ended, and the run went on without waiting for it)."""
    _stack()
    from pyspk.pyannote.corpus import diarize_corpus

    pipeline = _Quick(3.0, 1.0)

    def interrupt() -> None:
        assert pipeline.began.wait(30)
        time.sleep(0.2)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        diarize_corpus(pipeline, [corpus], out, accelerate=False, engines=2, progress=None)
    assert pipeline.running == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("pyspk-engine")]
    entries = _entries(out / "manifest.jsonl")
    assert 1 <= len(entries) < 5 and all(entry["status"] == "done" for entry in entries)
    assert sorted(p.name for p in out.glob("*.rttm")) == sorted(
        f"{rttm_uri(entry['path'])}.rttm" for entry in entries
    )


def test_names_not_utf8_a_relative_rttm_folder_and_a_new_manifest_folder(tmp_path, monkeypatch):
    """A file whose name is not UTF-8 is decoded and gets an RTTM (U+FFFD for the odd
    byte); an RTTM folder given relative to the working directory is recorded whole, so
    a rerun from elsewhere skips what was done; a manifest in a folder not yet there is
    made before any file runs; a folder's hidden files are left out."""
    _stack()
    soundfile = importorskip("soundfile", reason="soundfile is missing (diarize extra)")
    from pyspk.pyannote.corpus import diarize_corpus
    from pyspk.testing.synthetic import recording

    audio = tmp_path / "audio"
    audio.mkdir()
    try:
        odd = audio / os.fsdecode(b"caf\xe9.wav")
        soundfile.write(os.fsencode(odd), recording(11.0, seed=5).waveform, 16000)
    except (OSError, UnicodeError):
        pytest.skip("this file system takes only UTF-8 names")
    soundfile.write(audio / "plain.wav", recording(11.0, seed=6).waveform, 16000)
    (audio / "._plain.wav").write_bytes(b"\x00\x05\x16\x07 macOS metadata")
    (audio / ".cache").mkdir()
    (audio / ".cache" / "x.wav").write_bytes(b"RIFF")
    assert sorted(p.name for p in corpus_files([audio])) == sorted([odd.name, "plain.wav"])
    monkeypatch.chdir(tmp_path)
    manifest = tmp_path / "logs" / "run.jsonl"
    run = diarize_corpus(
        _Quick(), [audio], Path("out"), manifest=manifest, accelerate=False, progress=None
    )
    assert (run.done, run.failed) == (2, 0)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["caf\ufffd.rttm", "plain.rttm"]
    monkeypatch.chdir(audio)
    again = diarize_corpus(
        _Quick(), [audio], tmp_path / "out", manifest=manifest, accelerate=False, progress=None
    )
    assert (again.skipped, again.done) == (2, 0)


def test_an_rttm_written_whole_or_not_at_all_whatever_fails():
    """A writer that raises midway leaves no temporary file, and raises as it did; a
    folder that cannot be written is a FileError."""
    import tempfile

    from pyspk.files import write_rttm

    class Failing:
        def write_rttm(self, handle) -> None:
            handle.write("SPEAKER half")
            raise ValueError("midway")

    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "x.rttm"
        with pytest.raises(ValueError, match="midway"):
            write_rttm(Failing(), target)
        assert os.listdir(folder) == []
        with pytest.raises(FileError, match="cannot write"):
            write_rttm(Failing(), Path(folder) / "missing" / "x.rttm")


def test_dask_runs_name_rttms_after_links_and_keep_tasks_of_their_own(corpus, tmp_path):
    """Two links to files of one name in two folders: each RTTM is named after its link,
    as a single process names it (the worker had been sent the resolved path). Two runs
    on one scheduler submit tasks of different keys (a run had taken another's result
    for a task of the same key)."""
    _stack()
    importorskip("distributed", reason="dask.distributed is missing (corpus extra)")
    from distributed import Client, LocalCluster

    from pyspk.pyannote.corpus import diarize_corpus_on_dask

    for name, target in (("a.wav", corpus / "one.wav"), ("b.wav", corpus / "a" / "two.wav")):
        folder = tmp_path / name[0]
        folder.mkdir()
        (folder / "audio.wav").symlink_to(target)
        (tmp_path / name).symlink_to(folder / "audio.wav")
    links = [tmp_path / "a.wav", tmp_path / "b.wav"]

    class Recording:
        def __init__(self, client) -> None:
            self.client, self.keys = client, []

        def submit(self, *args, key: str, **kwargs):
            self.keys.append(key)
            return self.client.submit(*args, key=key, **kwargs)

    keys = []
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        for out in ("first", "second"):
            recording = Recording(client)
            run = diarize_corpus_on_dask(
                _quick_pipeline, links, tmp_path / out, recording, accelerate=False, progress=None
            )
            assert (run.done, run.failed) == (2, 0)
            assert sorted(p.name for p in (tmp_path / out).glob("*.rttm")) == ["a.rttm", "b.rttm"]
            keys.append(set(recording.keys))
    assert len(keys[0]) == 2 and not keys[0] & keys[1]


def test_freeze_keeps_the_pipelines_out_of_full_collections_for_the_run(corpus, tmp_path):
    """`freeze=True`: the objects alive at the start are frozen while the files run and
    given back after; a process that froze objects itself keeps its own freeze."""
    _stack()
    import gc

    from pyspk.pyannote.corpus import diarize_corpus

    class Counting(_Quick):
        def __call__(self, file: dict, **options):
            seen.append(gc.get_freeze_count())
            return super().__call__(file, **options)

    assert gc.get_freeze_count() == 0
    seen: list[int] = []
    diarize_corpus(Counting(), [corpus], tmp_path / "a", accelerate=False, progress=None)
    assert seen and set(seen) == {0}  # not asked
    seen.clear()
    diarize_corpus(
        Counting(), [corpus], tmp_path / "b", accelerate=False, freeze=True, progress=None
    )
    assert seen and min(seen) > 1000 and gc.get_freeze_count() == 0
    gc.freeze()
    try:
        own = gc.get_freeze_count()
        diarize_corpus(
            Counting(), [corpus], tmp_path / "c", accelerate=False, freeze=True, progress=None
        )
        assert gc.get_freeze_count() > own // 2  # not unfrozen (a few freed meanwhile)
    finally:
        gc.unfreeze()
