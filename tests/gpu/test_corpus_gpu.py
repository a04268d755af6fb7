"""Corpus mode on the GPU: two accelerated engines sharing the one GPU (`diarize_corpus`,
their files side by side or in turns), two engines of one `DeviceTurns` on threads of
their own, and two Dask worker processes sharing it give each file the RTTM an
accelerated pipeline gives it alone, in FP32 math; and turns order work on CUDA streams."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.optional import required

pytestmark = pytest.mark.gpu

SECONDS = (95.0, 40.0, 70.0, 30.0, 55.0)


def gpu_pipeline(weights: Path):
    """The random-weight pipeline with the segmentation weights saved at `weights`, on
    the GPU (picklable by reference, for Dask's workers: every process gets the same
    weights)."""
    import torch

    from pyspk.pyannote.offline import offline_pipeline, segmentation_3_0, wespeaker_resnet34

    segmentation = segmentation_3_0(seed=0)
    segmentation.load_state_dict(torch.load(weights, map_location="cpu"))
    built = offline_pipeline(segmentation, wespeaker_resnet34(seed=1))
    return built.to(torch.device("cuda"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, torch, pyannote) -> tuple[Path, Path, Path]:
    """WAV files, the calibrated segmentation's weights, and each file's RTTM from one
    accelerated pipeline, one file at a time."""
    soundfile = required("soundfile", "PYSPK_REQUIRE_PYANNOTE")
    from pyspk.pyannote.corpus import diarize_file
    from pyspk.pyannote.offline import segmentation_3_0
    from pyspk.testing.synthetic import recording

    folder = tmp_path_factory.mktemp("audio")
    for index, seconds in enumerate(SECONDS):
        waveform = recording(seconds, seed=70 + index).waveform
        soundfile.write(folder / f"f{index}.wav", waveform, 16000)
    weights = folder.parent / "segmentation.pt"
    fitted = segmentation_3_0(seed=0, fit_to=recording(200, seed=11), device="cuda")
    torch.save(fitted.state_dict(), weights)
    alone = tmp_path_factory.mktemp("alone")
    pipeline = gpu_pipeline(weights)
    with pyannote.accelerate_pipeline(pipeline, "fp32"):
        for path in sorted(folder.glob("*.wav")):
            assert diarize_file(pipeline, path, None, alone)["status"] == "done"
    return folder, weights, alone


def _rttms(folder: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(folder.glob("*.rttm"))}


def _counting_turns(monkeypatch: pytest.MonkeyPatch) -> list:
    """The `DeviceTurns` of every turn taken from now on, one entry a turn."""
    from pyspk.pyannote._turns import DeviceTurns

    taken: list = []
    turn = DeviceTurns.turn

    def counted(self: DeviceTurns, streams: Any) -> Any:
        taken.append(self)
        return turn(self, streams)

    monkeypatch.setattr(DeviceTurns, "turn", counted)
    return taken


@pytest.mark.parametrize("turns", [False, True])
def test_two_engines_on_one_gpu_give_each_file_its_own_output(
    pyannote, corpus, tmp_path, monkeypatch, turns
):
    """The second engine plans and captures while the first diarizes: its captures stay
    graphs (a failed one would warn that its forward runs eagerly), and every file's RTTM
    is the one it gets alone, with the files' GPU work side by side or in turns (every
    file a turn of one `DeviceTurns`)."""
    import warnings

    folder, weights, alone = corpus
    taken = _counting_turns(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = pyannote.diarize_corpus(
            gpu_pipeline(weights), [folder], tmp_path, engines=2, turns=turns, progress=None
        )
    assert not [w for w in caught if "runs eagerly" in str(w.message)]
    assert (run.done, run.failed) == (len(SECONDS), 0)
    assert _rttms(tmp_path) == _rttms(alone)
    assert len(taken) == (len(SECONDS) if turns else 0)
    assert len({id(turn) for turn in taken}) == (1 if turns else 0)


def test_a_turn_starts_on_the_device_when_the_turn_before_has_ended(torch, pyannote):
    """On CUDA streams: each stream of the second turn starts its work after the same
    role's stream of the first turn ended its kernel, the second role's five times as
    long as the first's (so a role that waited for the other role alone would start
    early). (No control of streams without turns: two streams can share one of the
    device's hardware queues, and then one waits for the other anyway.)"""

    def timing() -> Any:
        return torch.cuda.Event(enable_timing=True)

    def sleeping(streams: tuple) -> list:
        ended = []
        for stream, cycles in zip(streams, (20_000_000, 100_000_000), strict=True):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(cycles)  # some 10 and 50 ms
                ended.append(stream.record_event(timing()))
        return ended

    turns = pyannote.DeviceTurns()
    first = (torch.cuda.Stream(), torch.cuda.Stream())
    second = (torch.cuda.Stream(), torch.cuda.Stream())
    with turns.turn(first):
        ended = sleeping(first)
    with turns.turn(second):
        began = [stream.record_event(timing()) for stream in second]
    torch.cuda.synchronize()
    assert all(end.elapsed_time(start) >= 0 for end, start in zip(ended, began, strict=True))
    assert turns.count == 2


def test_two_engines_in_turns_on_their_own_threads_give_each_file_its_own_output(
    pyannote, corpus, tmp_path
):
    """Two pipelines accelerated with one `DeviceTurns`, each diarizing every file on a
    thread of its own at once: every file's GPU work took a turn, and every RTTM is the
    one the file gets alone."""
    import threading

    from pyspk.pyannote.corpus import diarize_file

    folder, weights, alone = corpus
    turns = pyannote.DeviceTurns()
    paths = sorted(folder.glob("*.wav"))
    entries: dict[int, list] = {0: [], 1: []}

    def diarize_all(index: int, pipeline: Any) -> None:
        out = tmp_path / str(index)
        out.mkdir()
        entries[index] = [diarize_file(pipeline, path, None, out) for path in paths]

    pipelines = [gpu_pipeline(weights), gpu_pipeline(weights)]
    accelerations = []
    try:
        for pipeline in pipelines:
            accelerations.append(pyannote.accelerate_pipeline(pipeline, "fp32", turns=turns))
        threads = [
            threading.Thread(target=diarize_all, args=(index, pipeline), daemon=True)
            for index, pipeline in enumerate(pipelines)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        assert not any(thread.is_alive() for thread in threads), "a thread hangs"
    finally:
        for acceleration in accelerations:
            acceleration.undo()
    statuses = [entry["status"] for index in (0, 1) for entry in entries[index]]
    assert statuses == ["done"] * (2 * len(paths))
    assert turns.count == 2 * len(paths)
    assert _rttms(tmp_path / "0") == _rttms(tmp_path / "1") == _rttms(alone)


@pytest.mark.parametrize("engines", [1, 2])
def test_two_dask_workers_on_one_gpu_give_each_file_its_own_output(
    pyannote, corpus, tmp_path, engines
):
    """Each worker has a thread per engine; a worker's two engines queue their files on
    the GPU in turns: every file took a turn, and a worker built its second engine when
    it ran two files at once."""
    import functools

    distributed = required("distributed", "PYSPK_REQUIRE_DASK")
    folder, weights, alone = corpus
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=engines, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        run = pyannote.diarize_corpus_on_dask(
            functools.partial(gpu_pipeline, weights),
            [folder],
            tmp_path,
            client,
            engines=engines,
            turns=engines > 1,
            progress=None,
        )
        pools = [pool for pools in client.run(_worker_engines).values() for pool in pools]
    assert (run.done, run.failed) == (len(SECONDS), 0)
    assert _rttms(tmp_path) == _rttms(alone)
    assert max(made for made, _ in pools) == engines  # 5 files on 2 workers of `engines` threads
    assert sum(turns for _, turns in pools) == (len(SECONDS) if engines > 1 else 0)


def _worker_engines() -> list[tuple[int, int]]:
    """On a Dask worker: (pipelines made, turns taken) of each of its engine pools."""
    from pyspk.pyannote import _corpus_dask

    return [
        (pool.made, pool.turns.count if pool.turns else 0)
        for pool in _corpus_dask._WORKER_ENGINES.values()
    ]
