"""The engine's host parts without a GPU, against pyannote.audio's own code."""

from __future__ import annotations

import os
import types
import warnings

import numpy as np
import pytest

from tests.optional import importorskip

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("torch")
    importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")
    from pyannote.audio.pipelines.speaker_diarization import SpeakerDiarization
    from pyannote.core import Annotation, Segment

from pyspk.pyannote._annotation import name_speakers


def _annotation(seed: int) -> Annotation:
    rng = np.random.default_rng(seed)
    annotation = Annotation(uri="talk")
    start = 0.0
    for track in range(3000):
        start += float(rng.random())
        label = int(rng.integers(0, 3))
        annotation[Segment(start, start + float(rng.random()) * 3), f"t{track % 5}"] = label
    return annotation


def test_labels_are_the_stock_names_in_the_stock_order():
    """`name_speakers` renames in place what pyannote renames on a copy: the same tracks,
    labels, timelines and centroid order."""
    pipeline = SpeakerDiarization.__new__(SpeakerDiarization)
    pipeline.legacy = False
    centroids = np.arange(4 * 8, dtype=np.float64).reshape(4, 8)
    ours = name_speakers(pipeline, {"uri": "talk"}, _annotation(1), _annotation(2), centroids)
    mapping = {label: f"SPEAKER_{label:02d}" for label in range(3)}
    for mine, stock in (
        (ours.speaker_diarization, _annotation(1).rename_labels(mapping=mapping)),
        (ours.exclusive_speaker_diarization, _annotation(2).rename_labels(mapping=mapping)),
    ):
        assert list(mine.itertracks(yield_label=True)) == list(stock.itertracks(yield_label=True))
        assert mine.labels() == stock.labels() == ["SPEAKER_00", "SPEAKER_01", "SPEAKER_02"]
        assert all(mine.label_timeline(x) == stock.label_timeline(x) for x in stock.labels())
    assert np.array_equal(ours.speaker_embeddings, centroids[:3])


class _FakeCuda:
    """Stand-ins for the torch.cuda calls of a graph capture, on the CPU: each capture
    is recorded with its mode, the stream current at `capture_begin`, and its pool; the
    captures numbered in `fail` raise as a failed capture does, in `capture_end` (the
    capture invalidated) or, with `early`, in `capture_begin`."""

    def __init__(self, fail: set[int], early: bool = False) -> None:
        self.fail, self.early = fail, early
        self.modes: list[str] = []
        self.streams: list[object] = []
        self.pools: list[object] = []
        self.handles = 0
        self.current = _FakeCuda.Stream()
        self.default_generators = [_FakeCuda.Generator()]
        self.undone: list[tuple[str, object]] = []  # what a failed capture left, undone
        self.events: list[tuple[str, object]] = []  # routing into pools, and captures

    class Stream:
        device = types.SimpleNamespace(index=0)

        def wait_stream(self, other: object) -> None:
            pass

        def synchronize(self) -> None:
            pass

    def graph_pool_handle(self) -> str:
        self.handles += 1
        return f"handle {self.handles - 1}"

    class Generator:
        def __init__(self) -> None:
            self.states: list[str] = ["capturing"]

        def clone_state(self) -> str:
            return "a copy"

        def graphsafe_set_state(self, state: str) -> None:
            self.states.append(state)

    def current_stream(self) -> _FakeCuda.Stream:
        return self.current

    def stream(self, stream: _FakeCuda.Stream):
        import contextlib

        @contextlib.contextmanager
        def current():
            before, self.current = self.current, stream
            try:
                yield
            finally:
                self.current = before

        return current()

    def CUDAGraph(self) -> _FakeGraph:
        return _FakeGraph(self)


class _FakeGraph:
    def __init__(self, cuda: _FakeCuda) -> None:
        self.cuda = cuda

    def capture_begin(self, pool: object = None, capture_error_mode: str = "global") -> None:
        cuda = self.cuda
        self.number, self.pool_id = len(cuda.modes), pool
        cuda.modes.append(capture_error_mode)
        cuda.streams.append(cuda.current)
        cuda.pools.append(pool)
        cuda.events.append(("capture", pool))
        if self.number in cuda.fail and cuda.early:
            raise RuntimeError("the capture was invalidated as it began")

    def capture_end(self) -> None:
        self.cuda.events.append(("captured", self.pool_id))
        if self.number in self.cuda.fail and not self.cuda.early:
            raise RuntimeError("operation failed due to a previous error during capture")

    def pool(self) -> object:
        return self.pool_id


def _fake_cuda(monkeypatch, fake: _FakeCuda) -> None:
    import torch

    from pyspk.pyannote import _graphs

    names = ("Stream", "current_stream", "stream", "CUDAGraph", "graph_pool_handle")
    for name in (*names, "default_generators"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(
        _graphs, "_end_capture_left_open", lambda stream: fake.undone.append(("capture", stream))
    )

    def release_pool_left_routing(device: int, pool: object) -> None:
        fake.undone.append(("pool", pool))
        fake.events.append(("failed capture's hold let go", pool))

    monkeypatch.setattr(_graphs, "_release_pool_left_routing", release_pool_left_routing)

    class Routing:
        def __init__(self, device: int, pool: object) -> None:
            self.pool = pool
            fake.events.append(("route", pool))

        def stop(self) -> None:
            fake.events.append(("stop", self.pool))

        def release(self) -> None:
            fake.events.append(("release", self.pool))

    monkeypatch.setattr(_graphs, "_route_into", Routing)


@pytest.mark.parametrize("fail", [False, True])
def test_capture_is_thread_local_and_a_fallback_is_said(monkeypatch, fail):
    """The forward's graph is captured in thread-local mode, on its own replay stream, not
    PyTorch's pooled default capture stream (other threads' allocations and
    synchronizations cannot break it); a failed capture says so, in `note` (which
    `Engine.describe` reports) and in a warning, and the forward runs eagerly, the
    thread's stream and the default generator's state put back as they were."""
    import torch

    from pyspk.pyannote import _graphs

    fake = _FakeCuda({0} if fail else set())
    _fake_cuda(monkeypatch, fake)
    replay, before = fake.Stream(), fake.current
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forward = _graphs.Forward(
            "segmentation",
            lambda x: (x * 2,),
            [(4, 3)],
            torch.device("cpu"),
            graph=True,
            stream=replay,
        )
    assert fake.modes == ["thread_local"] and fake.streams == [replay]
    said = [w for w in caught if "runs eagerly" in str(w.message)]
    if fail:
        assert forward.graph is None and forward.note.startswith("eager (capture failed")
        assert len(said) == 1 and "segmentation forward" in str(said[0].message)
        assert fake.default_generators[0].states == ["capturing", "a copy"]
        # a capture left open on its stream, the allocator's routing into its pool
        assert fake.undone == [("capture", replay), ("pool", "handle 0")]
    else:
        assert forward.note == "graph" and not said
        assert fake.default_generators[0].states == ["capturing"]
        assert fake.undone == [] and forward.shared_pool == "handle 0"
    assert fake.current is before


@pytest.mark.parametrize("fail", [False, True])
def test_the_eager_runs_before_a_capture_take_their_memory_from_its_pool(monkeypatch, fail):
    """The two eager runs before a capture allocate in the pool the capture then takes
    (not in the allocator's cache, where their memory would stay); the routing stops
    before the capture begins, and its reference to the pool is let go after the capture,
    whether the capture was made or failed (then after the failed capture's own)."""
    import torch

    from pyspk.pyannote import _graphs

    fake = _FakeCuda({0} if fail else set())
    _fake_cuda(monkeypatch, fake)

    def function(x: torch.Tensor) -> tuple[torch.Tensor]:
        fake.events.append(("run", None))
        return (x * 2,)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _graphs.Forward("x", function, [(4, 3)], torch.device("cpu"), True, fake.Stream())
    pool = "handle 0"
    failed = [("failed capture's hold let go", pool)] if fail else []
    assert fake.events == [
        ("route", pool), ("run", None), ("run", None), ("stop", pool),
        ("capture", pool), ("run", None), ("captured", pool), *failed, ("release", pool),
    ]  # fmt: skip


def test_a_forward_sharing_a_larger_ones_memory_runs_once_before_its_capture(monkeypatch):
    """The first forward of a function runs twice before its capture (lazy
    initialisation, then workspaces); a smaller one sharing its memory, on the same
    stream after it, runs once, whether the larger's capture was made or not."""
    import torch

    from pyspk.pyannote import _graphs

    fake = _FakeCuda({0})  # the first capture fails: the next forwards still share
    _fake_cuda(monkeypatch, fake)
    runs: list[int] = []

    def function(x: torch.Tensor) -> tuple[torch.Tensor]:
        runs.append(x.shape[0])
        return (x * 2,)

    stream = fake.Stream()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = _graphs.Forward("full", function, [(8, 3)], torch.device("cpu"), True, stream)
    half = _graphs.Forward("half", function, [(4, 3)], torch.device("cpu"), True, stream, full)
    _graphs.Forward("quarter", function, [(2, 3)], torch.device("cpu"), True, stream, half)
    # the failed capture's run of 8 counts: each capture runs the function once too
    assert runs == [8, 8, 8, 4, 4, 2, 2]


def test_the_routing_into_a_pool_makes_pytorchs_calls_or_none(monkeypatch):
    """The routing begins on this thread (a reference to the pool taken), ends, and lets
    the reference go, each with the device and pool; a PyTorch without the calls gets
    no routing."""
    import torch

    from pyspk.pyannote import _graphs

    calls: list[tuple[str, int, object]] = []
    for name in ("beginAllocateCurrentThreadToPool", "endAllocateToPool", "releasePool"):
        monkeypatch.setattr(
            torch._C,
            f"_cuda_{name}",
            lambda device, pool, name=name: calls.append((name, device, pool)),
            raising=False,
        )
    routing = _graphs._route_into(1, (0, 7))
    assert routing is not None
    routing.stop()
    routing.release()
    assert calls == [
        ("beginAllocateCurrentThreadToPool", 1, (0, 7)),
        ("endAllocateToPool", 1, (0, 7)),
        ("releasePool", 1, (0, 7)),
    ]
    monkeypatch.delattr(torch._C, "_cuda_beginAllocateCurrentThreadToPool")
    assert _graphs._route_into(0, (0, 7)) is None


def test_a_capture_refused_as_it_begins_runs_eagerly(monkeypatch):
    """A capture that `capture_begin` refuses (as PyTorch's check refuses a capture that
    another thread invalidated as it began): the forward runs eagerly, the thread on its
    own stream again, the generator's state a copy, and what the capture may have left
    undone."""
    import torch

    from pyspk.pyannote import _graphs

    fake = _FakeCuda({0}, early=True)
    _fake_cuda(monkeypatch, fake)
    before, replay = fake.current, fake.Stream()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        forward = _graphs.Forward("x", lambda x: (x,), [(4, 3)], torch.device("cpu"), True, replay)
    assert forward.graph is None and forward.note.startswith("eager (capture failed")
    assert fake.current is before and fake.streams == [replay]
    assert fake.default_generators[0].states == ["capturing", "a copy"]
    assert fake.undone == [("capture", replay), ("pool", "handle 0")]


@pytest.mark.parametrize("routing", ["routing", "not routing", "no such call"])
def test_a_failed_captures_pool_is_released_only_where_the_allocator_still_routes_to_it(
    monkeypatch, routing
):
    """`capture_begin` takes a reference to its pool and routes the allocator into it;
    `capture_end` stops the routing. After a failure the pool is released once, and only
    where the routing was still on (its end found it): a release without the reference
    would free a pool that a graph still uses. A PyTorch without these private calls
    leaves the pool alone."""
    import torch

    from pyspk.pyannote import _graphs

    calls: list[tuple[str, int, object]] = []

    def end(device: int, pool: object) -> None:
        calls.append(("end", device, pool))
        if routing == "not routing":
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    if routing == "no such call":
        monkeypatch.delattr(torch._C, "_cuda_endAllocateToPool", raising=False)
    else:
        monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end, raising=False)
    monkeypatch.setattr(
        torch._C,
        "_cuda_releasePool",
        lambda device, pool: calls.append(("release", device, pool)),
        raising=False,
    )
    _graphs._release_pool_left_routing(0, (0, 7))
    expected = {
        "routing": [("end", 0, (0, 7)), ("release", 0, (0, 7))],
        "not routing": [("end", 0, (0, 7))],
        "no such call": [],
    }
    assert calls == expected[routing]


def test_smaller_forwards_share_the_inputs_and_pool_until_a_shared_capture_fails(monkeypatch):
    """A forward that `share`s a larger one's memory takes its static inputs' leading
    items and captures into its pool; after a capture into that pool failed, the later
    forwards get pools of their own.
    Another item shape, or a larger batch, is refused."""
    import torch

    from pyspk.cuda.errors import InvalidArgument
    from pyspk.pyannote import _graphs

    fake = _FakeCuda({2})  # the third capture fails
    _fake_cuda(monkeypatch, fake)

    def forward(name: str, batch: int, share: object = None, items: int = 3):
        return _graphs.Forward(
            name, lambda x: (x * 2,), [(batch, items)], torch.device("cpu"), True,
            fake.Stream(), share=share,
        )  # fmt: skip

    full = forward("full", 8)
    half = forward("half", 4, full)
    assert half.inputs[0].data_ptr() == full.inputs[0].data_ptr()
    assert half.inputs[0].shape == (4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quarter = forward("quarter", 2, full)
    eighth = forward("eighth", 1, full)
    assert fake.pools == ["handle 0", "handle 0", "handle 0", "handle 1"]
    assert quarter.graph is None and eighth.note == "graph"
    assert full.shared_pool is None and half.shared_pool == "handle 0"
    assert fake.undone[1] == ("pool", "handle 0")  # the failed capture's hold on it
    with pytest.raises(InvalidArgument, match="not full's items"):
        forward("other", 2, full, items=5)
    with pytest.raises(InvalidArgument, match="exceeds full's"):
        forward("larger", 16, full)


def test_a_file_the_device_or_host_cannot_hold_is_refused_first(monkeypatch):
    """`_check_memory`: the audio and the per-chunk outputs against the device's free
    memory (the allocator's cache counted free) and the outputs' host copies against the
    host's; one line with the file, its length and the memory."""
    import types

    import torch

    from pyspk.errors import TooLongError
    from pyspk.pyannote import engine

    gib = 2**30
    fake = types.SimpleNamespace(
        _conversion=types.SimpleNamespace(num_classes=3, num_powerset_classes=7),
        _mask_frames=589,
        pipeline=types.SimpleNamespace(_embedding=types.SimpleNamespace(dimension=256)),
        device=torch.device("cuda", 0),
    )
    hour_chunks, hour_samples = 3591, 3600 * 16000
    # 4 bytes per sample, and per chunk 589 x (7 + 3) scores and masks, 3 x 256 embeddings
    outputs = 4 * hour_chunks * (589 * 10 + 3 * 256)
    needed = 4 * hour_samples + outputs
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: gib // 2)

    def check(device_free: int, host_free: int | None) -> None:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (device_free, 80 * gib))
        monkeypatch.setattr(engine, "available_host_memory", lambda: host_free)
        engine.Engine._check_memory(fake, {"uri": "long"}, 3600.0, hour_chunks, hour_samples)

    check(needed - gib // 2, outputs)  # just enough, with the cache's free half
    check(needed - gib // 2, None)  # a host that does not say
    with pytest.raises(TooLongError, match=r"long \(1\.0 h\) needs 0\.3 GB on cuda:0"):
        check(needed - gib // 2 - 1, outputs)
    with pytest.raises(TooLongError, match=r"long \(1\.0 h\) needs 0\.1 GB on host"):
        check(needed, outputs - 1)


class _Part:
    """A stand-in for one thing the engine makes (a plan, a forward): records its close."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.closed = args, False

    def close(self) -> None:
        self.closed = True


def test_an_engine_that_fails_to_prepare_closes_what_it_made(monkeypatch):
    """An error while the engine prepares (here its embedding forward, after the
    linkage, the fbank and the segmentation forwards) closes everything made before it
    and gives its streams back: a caller that retries, say with a smaller batch, gets
    their memory back at once, not when the collector runs."""
    import contextlib

    import torch

    from pyspk.pyannote import _graphs, engine

    made: list[_Part] = []
    given_back: list[list] = []

    def part(*args, **kwargs) -> _Part:
        if args and args[0] == "embedding":
            raise RuntimeError("the embedding forward failed")
        made.append(_Part(*args, **kwargs))
        return made[-1]

    streams = types.SimpleNamespace(
        take=lambda device, count: [object() for _ in range(count)],
        give_back=given_back.append,
    )
    monkeypatch.setattr(engine.Engine, "_unserved", staticmethod(lambda pipeline: None))
    monkeypatch.setattr(engine, "shared_runtime", lambda device: None)
    monkeypatch.setattr(engine, "STREAMS", streams)
    monkeypatch.setattr(engine, "HOST_COPY_STREAMS", streams)
    for name in ("DeviceLinkage", "planned_fbank"):
        monkeypatch.setattr(engine, name, part)
    monkeypatch.setattr(_graphs, "Forward", part)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    model = types.SimpleNamespace(
        audio=types.SimpleNamespace(get_num_samples=lambda duration: 160_000),
        num_frames=lambda samples: 589,
    )
    pipeline = types.SimpleNamespace(
        _segmentation=types.SimpleNamespace(
            device=torch.device("cpu"), model=model, conversion=None, duration=10.0
        ),
        _embedding=types.SimpleNamespace(model_=None),
    )
    with pytest.raises(RuntimeError, match="the embedding forward failed"):
        engine.Engine(pipeline, "fp32")
    # the linkage, the fbank and the segmentation's forwards (128, 64 and 32 chunks)
    assert len(made) == 2 + len(engine._chunks.segmentation_sizes(engine.SEGMENTATION_BATCH))
    assert all(made_part.closed for made_part in made)
    # the two streams of the models and the one of the copies to the host
    assert sorted(len(streams) for streams in given_back) == [1, 2]


def _conversation_artefacts(seconds: float) -> tuple[dict, object, np.ndarray]:
    """A synthetic conversation as the models would see it: the file, its binary
    (chunks, 589, 3) segmentations from who speaks when, and embeddings that are each
    voice's own direction plus noise (NaN where a chunk has no such local speaker)."""
    from pyannote.core import SlidingWindow, SlidingWindowFeature

    from pyspk.pyannote._chunks import chunk_count
    from pyspk.testing.synthetic import recording

    conversation = recording(seconds, seed=3)
    total = chunk_count(len(conversation.waveform), 160_000, 16_000)
    activity, voices = conversation.local_activity(np.arange(total, dtype=np.float64), 589, 10.0)
    rng = np.random.default_rng(4)
    names = sorted({voice for chunk in voices for voice in chunk})
    directions = rng.standard_normal((len(names), 256))
    embeddings = np.full((total, 3, 256), np.nan)
    for chunk, speakers in enumerate(voices):
        for slot, voice in enumerate(speakers):
            noise = 0.3 * rng.standard_normal(256)
            embeddings[chunk, slot] = directions[names.index(voice)] + noise
    window = SlidingWindow(start=0.0, duration=10.0, step=1.0)
    segmentations = SlidingWindowFeature(activity.astype(np.float32), window)
    return conversation.as_file("talk"), segmentations, embeddings


def test_the_engines_steps_after_the_models_give_the_stock_output():
    """`cluster_and_reconstruct`, given the segmentations' facts that `_collect`
    finds while the GPU embeds, on the same segmentations and embeddings as the stock
    `apply` (the models' steps stood in for): the stock tracks, labels and centroids,
    with several speakers."""
    import math

    from pyspk.pyannote import _steps
    from pyspk.pyannote._host_steps import cluster_and_reconstruct
    from pyspk.pyannote._report import RunReport
    from pyspk.pyannote.offline import offline_pipeline, segmentation_3_0, wespeaker_resnet34

    file, segmentations, embeddings = _conversation_artefacts(240.0)
    pipeline = offline_pipeline(segmentation_3_0(seed=0), wespeaker_resnet34(seed=1))
    pipeline.get_segmentations = lambda file, hook=None: segmentations
    pipeline.get_embeddings = lambda file, binary, exclude_overlap=False, hook=None: embeddings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = pipeline(file)
    frames = pipeline._segmentation.model.receptive_field
    ours = cluster_and_reconstruct(
        pipeline,
        None,
        file,
        segmentations,
        _steps.segmentation_facts(segmentations, frames),
        embeddings,
        None,
        1,
        math.inf,
        lambda *step, **progress: None,
        RunReport(audio_seconds=240.0, chunks=len(embeddings)),
    )
    for mine, theirs in (
        (ours.speaker_diarization, stock.speaker_diarization),
        (ours.exclusive_speaker_diarization, stock.exclusive_speaker_diarization),
    ):
        assert list(mine.itertracks(yield_label=True)) == list(theirs.itertracks(yield_label=True))
        assert mine.labels() == theirs.labels()
    assert len(stock.speaker_diarization.labels()) >= 3
    assert len(stock.speaker_diarization) > 20
    assert np.array_equal(ours.speaker_embeddings, stock.speaker_embeddings, equal_nan=True)
