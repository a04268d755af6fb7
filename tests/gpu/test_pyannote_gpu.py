"""`pyspk.pyannote` on the GPU with random-weight segmentation-3.0 and WeSpeaker ResNet34
models: accelerated outputs against float64 copies of the same models, no less exact
than the stock modules (FP32 and TF32 math, batch 32, 1 and an uncovered batch that falls
back), `undo`, a captured graph of an accelerated forward, a busy user stream, and the
once-per-chunk embedding path against the stock pipeline's embeddings.

Skipped without pyannote.audio (the `pyannote` extra); PYSPK_REQUIRE_PYANNOTE=1 fails
instead.

Tolerance: an accelerated model's error against float64 may be at most twice the stock
model's in the same math (torch's TF32 switches follow the math), plus 1e-6 of the
output's scale. The plans are as exact as the library per boundary (the kernel tests);
the factor leaves room for the rest of the model amplifying either path's roundings
differently (the four LSTM layers after the convolutions)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from pyspk.cuda import CudaMath
from pyspk.testing import library_math, torch_replay_matches_eager

pytestmark = pytest.mark.gpu

CHUNK_SAMPLES = 160_000  # 10 s at 16 kHz
FRAMES = 589


@pytest.fixture(scope="module")
def segmentation(torch, pyannote):
    return pyannote.segmentation_3_0(seed=0).cuda()


@pytest.fixture(scope="module")
def embedding(torch, pyannote):
    return pyannote.wespeaker_resnet34(seed=1).cuda()


def _error(torch, y, exact) -> float:
    return float(torch.linalg.vector_norm(y.double() - exact) / torch.linalg.vector_norm(exact))


def _assert_no_less_exact(torch, accelerated, stock, exact) -> None:
    ours, theirs = _error(torch, accelerated, exact), _error(torch, stock, exact)
    assert ours <= 2 * theirs + 1e-6, (ours, theirs)


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_accelerated_segmentation_is_as_exact_as_stock(torch, pyannote, segmentation, math):
    exact_model = copy.deepcopy(segmentation).double()
    generator = torch.Generator(device="cuda").manual_seed(2)
    batches = {
        batch: torch.randn((batch, 1, CHUNK_SAMPLES), generator=generator, device="cuda")
        for batch in (32, 1, 3)
    }
    with torch.inference_mode(), library_math(torch, math):
        stock = {b: segmentation(x) for b, x in batches.items()}
        exact = {b: exact_model(x.double()) for b, x in batches.items()}
        with pyannote.accelerate(segmentation, math) as acceleration:
            # the LSTM on pyspk's plans in TF32 math only
            lstm = {"lstm"} if math is CudaMath.TF32 else set()
            assert set(acceleration.modules) == {
                "sincnet.conv1d.0",
                "sincnet.conv1d.1",
                "sincnet.conv1d.2",
                "linear.0",
                "linear.1",
                "classifier",
                *lstm,
            }
            assert acceleration.skipped == {}
            assert acceleration.modules["sincnet.conv1d.1"].bias_mode == "drop"
            ours = {b: segmentation(x) for b, x in batches.items()}
        restored = segmentation(batches[1])
    for batch in batches:
        assert ours[batch].shape == stock[batch].shape == (batch, FRAMES, 7)
        _assert_no_less_exact(torch, ours[batch], stock[batch], exact[batch])
    # undo puts the stock modules and forward back: the stock bits again
    assert "forward" not in segmentation.__dict__
    assert "forward" not in segmentation.sincnet.__dict__
    assert torch.equal(restored, stock[1])


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_accelerated_embeddings_are_as_exact_as_stock(torch, pyannote, embedding, math):
    generator = torch.Generator(device="cuda").manual_seed(4)
    resnet = embedding.resnet
    with torch.inference_mode(), library_math(torch, math):
        for batch in (32, 1, 2):
            waveforms = torch.randn((batch, 1, CHUNK_SAMPLES), generator=generator, device="cuda")
            masks = torch.rand((batch, 3, FRAMES), generator=generator, device="cuda")
            masks = (masks > 0.5).float()
            frames = embedding.forward_frames(waveforms)
            stock = embedding.forward_embedding(frames, weights=masks)
            stats = resnet.pool(frames.double(), weights=masks.double())  # in float64
            exact = torch.nn.functional.linear(
                stats, resnet.seg_1.weight.double(), resnet.seg_1.bias.double()
            )
            with pyannote.accelerate(embedding, math) as acceleration:
                assert set(acceleration.modules) == {"resnet.seg_1", "resnet.pool", "resnet.trunk"}
                ours = embedding.forward_embedding(frames, weights=masks)  # stock frames
                planned_frames = embedding.forward_frames(waveforms)  # the trunk's plan
                chunks = pyannote.embed_chunks(embedding, waveforms, masks)
                expected = embedding.forward_embedding(planned_frames, weights=masks)
            assert ours.shape == stock.shape == (batch, 3, 256)
            assert torch.equal(chunks, expected)
            # batch 2 (6 rows) takes seg_1's library path, after the planned pool
            _assert_no_less_exact(torch, ours, stock, exact)


def test_a_captured_accelerated_forward_replays_its_bits(torch, pyannote, segmentation):
    static_x = torch.randn((32, 1, CHUNK_SAMPLES), device="cuda")
    with torch.inference_mode(), pyannote.accelerate(segmentation, "tf32"):
        assert torch_replay_matches_eager(torch, segmentation, static_x)


def test_an_accelerated_forward_on_a_busy_user_stream(torch, pyannote, segmentation):
    source = torch.randn((32, 1, CHUNK_SAMPLES), device="cuda")
    x = torch.zeros_like(source)
    stream = torch.cuda.Stream()
    with torch.inference_mode(), pyannote.accelerate(segmentation):
        expected = segmentation(source)
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(1_000_000_000)  # about 0.5 s of GPU work ahead of the input
            x.copy_(source)
            y = segmentation(x)
        stream.synchronize()
    assert torch.equal(y, expected)


def test_once_per_chunk_embeddings_on_accelerated_models(torch, pyannote):
    """The stock pipeline (per pair, stock seg_1) against the once-per-chunk path on an
    accelerated WeSpeaker (seg_1 on 96- and 3-row plans): the same embeddings within
    FP32 rounding (torch's TF32 switches off in both)."""
    from pyannote.core import SlidingWindowFeature

    pipeline = pyannote.offline_pipeline(
        pyannote.segmentation_3_0(seed=0), pyannote.wespeaker_resnet34(seed=1)
    )
    pipeline.to(torch.device("cuda"))
    audio = {"waveform": 0.1 * torch.randn(1, 16000 * 42), "sample_rate": 16000}
    with library_math(torch, CudaMath.FP32):
        segmentations = pipeline.get_segmentations(audio)
        rng = np.random.default_rng(0)
        masks = (rng.random(segmentations.data.shape) > 0.6).astype(np.float32)
        binary = SlidingWindowFeature(masks, segmentations.sliding_window)
        stock = pipeline.get_embeddings(audio, binary, exclude_overlap=True)
        model = pipeline._embedding.model_
        with pyannote.accelerate(model, CudaMath.FP32) as acceleration:
            chunked = pyannote.embed_once_per_chunk(pipeline)
            ours = pipeline.get_embeddings(audio, binary, exclude_overlap=True)
            chunked.undo()
            entries = acceleration.modules["resnet.seg_1"].entries()
            assert entries[1] == "EMBED_B1" and entries[32].startswith("EMBED_B32")
    assert masks.shape[0] == 33  # one batch of 32 chunks (96 rows) and one of 1 (3 rows)
    assert ours.shape == stock.shape
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(stock))
    scale = np.nanmax(np.abs(stock))
    assert np.nanmax(np.abs(ours - stock)) <= 1e-5 * scale
