"""The sincnet area on the GPU: `PlannedSincFront` on segmentation-3.0's first stage (80
sinc filters of 251 taps, stride 10, |y|, MaxPool1d(3, 3)), in both maths, against
float64 truth and cuDNN, an item's bits whatever the batch around it, graph replays,
two threads on two streams at once, the accelerated PyanNet, and compute-sanitizer.

Tolerances. FP32 math: both sum 251 FP32 products; the plan in tap order, cuDNN in its
own (on the H200 the same: measured errors and bits equal). Elsewhere the errors stay
of one size: the plan's norm-wise error within 1.5 times cuDNN FP32's, its largest
within 2 times (one rounding more or less at the element where each is worst). TF32
math: the split operands carry about 22 significant bits against TF32's 11, so each
product is about 2^11 times finer than cuDNN TF32's; the bound, a twentieth of cuDNN
TF32's error, leaves room for the tensor cores' FP32 sums, which drop bits below their
largest term at every mma."""

from __future__ import annotations

import pytest

from tests.optional import importorskip

pytestmark = pytest.mark.gpu

SAMPLES = 160000  # a 10 s chunk at 16 kHz
MATHS = ["fp32", "tf32"]


@pytest.fixture(scope="module")
def stage(torch):
    """segmentation-3.0's first stage: its sinc filterbank (seeded band edges) and pool."""
    importorskip("asteroid_filterbanks", reason="the sinc filterbank is asteroid's")
    from asteroid_filterbanks import Encoder, ParamSincFB

    torch.manual_seed(0)
    encoder = Encoder(ParamSincFB(80, 251, stride=10, min_low_hz=50, min_band_hz=50)).cuda()
    with torch.no_grad():  # band edges off the initial mel grid
        for parameter in encoder.parameters():
            parameter.mul_(1 + 0.2 * torch.rand_like(parameter))
    return encoder, torch.nn.MaxPool1d(3, stride=3)


def inputs(torch, items: int, seed: int, samples: int = SAMPLES):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(items, 1, samples, generator=generator).cuda()


def stock(torch, stage, x):
    from pyspk.cuda import CudaMath
    from pyspk.torch import library_math

    encoder, pool = stage
    with torch.inference_mode(), library_math(CudaMath.FP32):
        return pool(torch.abs(encoder(x)))


def planned(torch, front, x):
    with torch.inference_mode():
        return front(x)


def test_the_fronts_error_is_cudnn_fp32s(torch, stage) -> None:
    from pyspk import reference
    from pyspk.testing import relative_errors
    from pyspk.torch.sincnet import PlannedSincFront

    encoder = stage[0]
    x = inputs(torch, 3, seed=1)
    filters = encoder.get_filters().detach().reshape(80, 251).cpu().numpy()
    expected = reference.sinc_front(x[:, 0].cpu().numpy(), filters)
    front = PlannedSincFront(*stage)
    got = planned(torch, front, x)
    assert got.shape == expected.shape == (3, 80, 5325)
    ours = relative_errors(got.cpu().numpy(), expected)
    cudnn = relative_errors(stock(torch, stage, x).cpu().numpy(), expected)
    print(f"\nsinc front (max, norm-wise) error: plan {ours}, cuDNN FP32 {cudnn}")
    assert ours[1] <= 1.5 * cudnn[1] and ours[0] <= 2 * cudnn[0]
    front.close()


def test_the_tf32_fronts_error_is_far_below_cudnn_tf32s(torch, stage) -> None:
    from pyspk import reference
    from pyspk.cuda import CudaMath
    from pyspk.testing import relative_errors
    from pyspk.torch import library_math
    from pyspk.torch.sincnet import PlannedSincFront

    encoder, pool = stage
    x = inputs(torch, 3, seed=1)
    filters = encoder.get_filters().detach().reshape(80, 251).cpu().numpy()
    expected = reference.sinc_front(x[:, 0].cpu().numpy(), filters)
    front = PlannedSincFront(*stage, "tf32")
    assert front.entries() == "spk_sinc_front_f16x3"
    ours = relative_errors(planned(torch, front, x).cpu().numpy(), expected)
    with torch.inference_mode(), library_math(CudaMath.TF32):
        tf32 = relative_errors(pool(torch.abs(encoder(x))).cpu().numpy(), expected)
    fp32 = relative_errors(stock(torch, stage, x).cpu().numpy(), expected)
    print(f"\nsinc front (max, norm-wise) error: TF32 plan {ours}, cuDNN TF32 {tf32}, FP32 {fp32}")
    assert ours[0] <= tf32[0] / 20 and ours[1] <= tf32[1] / 20
    front.close()


def test_the_tf32_front_scales_each_tile_so_the_level_does_not_matter(torch, stage) -> None:
    """The samples take a power-of-two scale per tile: items 2^40 louder or quieter give
    the same outputs times 2^40 or 2^-40, bit for bit, in one batch with the item as it
    is; so does an item 2^110 louder, whose scaled sums times the tile's inverse scale
    alone would pass FP32's range."""
    from pyspk.torch.sincnet import PlannedSincFront

    front = PlannedSincFront(*stage, "tf32")
    x = inputs(torch, 1, seed=10, samples=32001)
    levels = torch.cat([x, x * 2.0**40, x * 2.0**-40, x * 2.0**110])
    y = planned(torch, front, levels)
    assert torch.equal(y[1], y[0] * 2.0**40) and torch.equal(y[2], y[0] * 2.0**-40)
    assert torch.equal(y[3], y[0] * 2.0**110)
    front.close()


@pytest.mark.parametrize("math", MATHS)
def test_a_non_finite_sample_spoils_only_the_outputs_that_read_it(torch, stage, math: str) -> None:
    """A NaN and an infinity: the outputs whose windows hold them are not finite, as the
    library's, and every other output is (the TF32 kernel's padded taps read none)."""
    from pyspk.torch.sincnet import PlannedSincFront

    front = PlannedSincFront(*stage, math)
    x = inputs(torch, 2, seed=11, samples=32001)
    x[0, 0, 1000] = float("nan")
    x[1, 0, 20005] = float("inf")
    ours, library = planned(torch, front, x), stock(torch, stage, x)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(library))
    assert 0 < int((~torch.isfinite(ours)).sum()) < ours.numel() // 50
    front.close()


@pytest.mark.parametrize("math", MATHS)
def test_an_item_has_its_bits_whatever_the_batch(torch, stage, math: str) -> None:
    """Tiles never mix items: the first 5 of 37 items, alone or in the batch, and a
    second run give the same bits; a length whose last tile is partial (32001 samples:
    1058 outputs, 16 tiles and 34 outputs) too."""
    from pyspk.torch.sincnet import PlannedSincFront

    front = PlannedSincFront(*stage, math)
    for samples in (SAMPLES, 32001):
        x = inputs(torch, 37, seed=2, samples=samples)
        whole = planned(torch, front, x)
        assert torch.equal(whole, planned(torch, front, x))
        assert torch.equal(whole[:5], planned(torch, front, x[:5].contiguous()))
        assert torch.equal(whole[36:], planned(torch, front, x[36:].contiguous()))
    front.close()


@pytest.mark.parametrize("math", MATHS)
def test_a_graph_replays_the_eager_bits(torch, stage, math: str) -> None:
    from pyspk.testing import torch_graph
    from pyspk.torch.sincnet import PlannedSincFront

    front = PlannedSincFront(*stage, math)
    x = inputs(torch, 20, seed=3)
    eager = planned(torch, front, x)
    with torch.inference_mode():
        graph, captured = torch_graph(torch, lambda: front(x))
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)
    front.close()


@pytest.mark.parametrize("math", MATHS)
def test_two_threads_on_two_streams_get_their_own_bits(torch, stage, math: str) -> None:
    from pyspk.torch.sincnet import PlannedSincFront
    from tests.concurrency import assert_serial_bits_on_two_streams

    front = PlannedSincFront(*stage, math)
    xs = [inputs(torch, 24, seed=4), inputs(torch, 9, seed=5)]
    assert_serial_bits_on_two_streams(torch, lambda x: planned(torch, front, x), xs)
    front.close()


def test_a_changed_filterbank_is_refused_until_replanned(torch, stage) -> None:
    from pyspk.errors import WeightsChangedError
    from pyspk.torch.sincnet import PlannedSincFront

    encoder = stage[0]
    front = PlannedSincFront(*stage)
    x = inputs(torch, 2, seed=6)
    before = planned(torch, front, x)
    band = encoder.filterbank.band_hz_
    with torch.no_grad():
        band.mul_(1.1)
    try:
        with pytest.raises(WeightsChangedError, match="replan"):
            planned(torch, front, x)
        front.replan()
        after = planned(torch, front, x)
        assert not torch.equal(after, before)
        torch.testing.assert_close(after, stock(torch, stage, x), rtol=1e-5, atol=1e-5)
    finally:
        with torch.no_grad():
            band.div_(1.1)
    front.close()


def test_the_accelerated_pyannet_runs_the_front_and_undo_restores_it(torch) -> None:
    """SincNet's output with the front (and the planned convolutions after it) is as
    exact as stock against the float64 model; undo gives the stock bits again."""
    importorskip("pyannote.audio", reason="pyspk.pyannote needs pyannote.audio")
    import copy

    from pyspk import pyannote
    from pyspk.pyannote.offline import segmentation_3_0
    from pyspk.testing import relative_errors
    from pyspk.torch.sincnet import PlannedSincFront

    model = segmentation_3_0(seed=0).cuda().eval()
    sincnet = model.sincnet
    x = inputs(torch, 4, seed=7)
    with torch.inference_mode():
        exact = copy.deepcopy(sincnet).double()(x.double()).cpu().numpy()
        before = sincnet(x)
        with pyannote.accelerate(model, "fp32") as acceleration:
            assert isinstance(sincnet.conv1d[0], PlannedSincFront)
            assert sincnet.conv1d[0].entries() == "spk_sinc_front"
            assert "sincnet.conv1d.0" in acceleration.modules
            ours = sincnet(x)
        with pyannote.accelerate(model, "tf32"):  # the tensor-core form
            assert sincnet.conv1d[0].entries() == "spk_sinc_front_f16x3"
        after = sincnet(x)
    assert not isinstance(sincnet.conv1d[0], PlannedSincFront)
    assert "forward" not in sincnet.__dict__
    assert torch.equal(after, before)
    errors = [relative_errors(y.cpu().numpy(), exact) for y in (ours, before)]
    print(f"\nSincNet (max, norm-wise) error: accelerated {errors[0]}, stock {errors[1]}")
    assert errors[0][1] <= 2 * errors[1][1] + 1e-6


def test_the_fp32_pipeline_plans_the_front_only_where_its_bits_are_the_librarys(
    torch, monkeypatch
) -> None:
    """In FP32 math the engine keeps the library's segmentation, with SincNet's first
    stage on the plan after a probe at each forward batch gave the library's bits (the
    H200's cuDNN sums in tap order); a probe that differs leaves the stage alone."""
    importorskip("pyannote.audio", reason="pyspk.pyannote needs pyannote.audio")
    from pyspk import pyannote
    from pyspk.pyannote.offline import offline_pipeline, segmentation_3_0, wespeaker_resnet34
    from pyspk.torch.sincnet import PlannedSincFront

    pipeline = offline_pipeline(segmentation_3_0(seed=0), wespeaker_resnet34(seed=1)).to(
        torch.device("cuda")
    )
    sincnet = pipeline._segmentation.model.sincnet
    with pyannote.accelerate_pipeline(pipeline, "fp32") as acceleration:
        assert set(acceleration.segmentation.modules) == {"sincnet.conv1d.0"}
        front = sincnet.conv1d[0]
        assert isinstance(front, PlannedSincFront)
        assert front.served_batches == {32, 64, 128}  # the engine's forwards, probed
        # another size (a stock apply's last batch) takes the library stage: its bits
        x = inputs(torch, 3, seed=8)
        with torch.inference_mode():
            library = front.pool(torch.abs(front.encoder(x)))
            assert torch.equal(front(x), library)
    assert not isinstance(sincnet.conv1d[0], PlannedSincFront)
    assert "forward" not in sincnet.__dict__
    monkeypatch.setattr(torch, "equal", lambda a, b: False)
    with pyannote.accelerate_pipeline(pipeline, "fp32") as acceleration:
        assert acceleration.segmentation.modules == {}
        assert "differ" in acceleration.segmentation.skipped["sincnet.conv1d.0"]
        assert not isinstance(sincnet.conv1d[0], PlannedSincFront)
        assert "forward" not in sincnet.__dict__


@pytest.mark.parametrize("math", MATHS)
def test_a_launch_of_another_shape_writes_nothing(torch, stage, math: str) -> None:
    """The entry's checks: a block of another size, too little shared memory, a second
    grid row, or a wrong length each leave the output as it was."""
    from pyspk.candidate.sincnet import plan as sincnet
    from pyspk.torch.sincnet import PlannedSincFront

    front = PlannedSincFront(*stage, math)
    plan = front._plan
    threads, shared, w_len = plan._threads, plan._shared, len(plan._filters)
    items, samples = 2, 32001
    x = inputs(torch, items, seed=9, samples=samples)
    y_len = items * 80 * sincnet.sinc_pooled(samples)
    y = torch.full((y_len,), 7.0, device="cuda")
    lengths = (items * samples, w_len, y_len)
    wrong = [
        ((4, 1, 1), threads - 32, shared, lengths),
        ((4, 1, 1), threads, shared - 16, lengths),
        ((4, 2, 1), threads, shared, lengths),
        ((4, 1, 1), threads, shared, (items * samples, w_len, y_len - 1)),
        ((4, 1, 1), threads, shared, (items * samples, w_len - 1, y_len)),
    ]
    stream = torch.cuda.current_stream().cuda_stream
    for grid, threads, shared, (x_len, w_len, out_len) in wrong:
        values = [x.data_ptr(), x_len, plan._filters.ptr, w_len, y.data_ptr(), out_len]
        launch = plan._kernel.launch(
            grid, threads, shared, sincnet.SIGNATURE, [*values, items, samples]
        )
        launch.enqueue(stream)
        torch.cuda.synchronize()
        assert torch.all(y == 7.0), (grid, threads, shared, out_len)
    front.close()


_SANITIZED = """
import torch
from asteroid_filterbanks import Encoder, ParamSincFB
from pyspk.torch.sincnet import PlannedSincFront
encoder = Encoder(ParamSincFB(80, 251, stride=10, min_low_hz=50, min_band_hz=50)).cuda()
for math in ("fp32", "tf32"):
    front = PlannedSincFront(encoder, torch.nn.MaxPool1d(3, stride=3), math)
    with torch.inference_mode():
        y = front(torch.randn(3, 1, 32001, device="cuda"))
    torch.cuda.synchronize()
print("sinc done", flush=True)
"""


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_finds_nothing_in_the_front(torch, tool: str) -> None:
    """Three items whose last tiles are partial, in both maths."""
    importorskip("asteroid_filterbanks", reason="the sinc filterbank is asteroid's")
    from tests.gpu.test_sanitizer_gpu import sanitized_run

    assert "sinc done" in sanitized_run(tool, _SANITIZED)
