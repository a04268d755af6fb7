"""The trunk area's statistics pooling on the GPU: `PlannedStatsPool` in place of a
WeSpeaker ResNet's `pool` (pyannote's TSTP over `StatsPool`, three speakers' weights
a chunk) against float64 truth and the library, the library's values where a speaker is
absent or has one frame, an item's bits whatever the batch, graph replays, two threads
on two streams at once, the entry's checks, and compute-sanitizer.

Tolerance: the plan's two data sums are FP64 and its outputs are rounded to FP32 once
(the mean) or twice (the deviation, from the rounded mean), where the library sums 125
FP32 terms per output: the plan's error against float64 is at or below the library's,
largest and norm-wise."""

from __future__ import annotations

import pytest

from tests.optional import importorskip

pytestmark = pytest.mark.gpu

SHAPE = (256, 10, 125)  # the trunk's output a chunk: channels, bins, frames
MASK_FRAMES = 589  # segmentation-3.0's frames a chunk, interpolated to 125 as stock does


@pytest.fixture(scope="module")
def pool():
    importorskip("pyannote.audio", reason="the pool is pyannote's TSTP")
    from pyannote.audio.models.embedding.wespeaker.resnet import TSTP

    return TSTP(in_dim=SHAPE[0] * SHAPE[1])


def features(torch, items: int, seed: int):
    """Trunk-like outputs: rectified, a quarter of the rows with a large common level
    (the centring's cancellation)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.relu(torch.randn(items, *SHAPE, generator=generator))
    x[:, ::4] += 8.0
    return x.cuda()


def masks(torch, items: int, seed: int, frames: int = MASK_FRAMES):
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(items, 3, frames, generator=generator) > 0.4).float().cuda()


def planned(torch, module, x, w):
    with torch.inference_mode():
        return module(x, weights=w)


def test_the_pools_error_is_at_or_below_the_librarys(torch, pool) -> None:
    from pyspk.testing import relative_errors
    from pyspk.torch.resnet import PlannedStatsPool

    module = PlannedStatsPool(pool)
    x, w = features(torch, 32, seed=1), masks(torch, 32, seed=2)
    w[:, :, ::3] = torch.rand_like(w[:, :, ::3])  # fractional weights too
    with torch.inference_mode():
        exact = pool(x.double(), weights=w.double()).cpu().numpy()  # StatsPool in float64
        stock = pool(x, weights=w).cpu().numpy()
    got = planned(torch, module, x, w)
    assert got.shape == (32, 3, 2 * SHAPE[0] * SHAPE[1])
    ours, library = (relative_errors(y, exact) for y in (got.cpu().numpy(), stock))
    print(f"\nstats pool (max, norm-wise) error: plan {ours}, library {library}")
    assert ours[0] <= library[0] and ours[1] <= library[1]
    module.close()


def test_an_absent_speaker_and_a_single_frame_get_the_librarys_values(torch, pool) -> None:
    """0 and 0 for a speaker with no frame; the frame's value and a deviation of 0 for
    one frame (v1's 1e-8 vanishes in FP32, as in the library); 2-D weights as a single
    speaker; weights already at the features' 125 frames."""
    from pyspk.torch.resnet import PlannedStatsPool

    module = PlannedStatsPool(pool)
    x = features(torch, 4, seed=3)
    w = masks(torch, 4, seed=4, frames=SHAPE[2])
    w[0, 1] = 0.0
    w[1, 2] = 0.0
    w[1, 2, 17] = 1.0
    with torch.inference_mode():
        stock = pool(x, weights=w)
    got = planned(torch, module, x, w)
    assert torch.equal(got[0, 1], stock[0, 1]) and not got[0, 1].any()
    assert torch.equal(got[1, 2], stock[1, 2])
    assert torch.equal(got[1, 2, : SHAPE[0] * SHAPE[1]], x[1, :, :, 17].reshape(-1))
    single = planned(torch, module, x, w[:, 0])
    assert single.shape == (4, 2 * SHAPE[0] * SHAPE[1])
    assert torch.equal(single, got[:, 0])
    module.close()


def test_without_weights_or_in_float64_the_library_pools(torch, pool) -> None:
    from pyspk.torch.resnet import PlannedStatsPool

    module = PlannedStatsPool(pool)
    x, w = features(torch, 2, seed=5), masks(torch, 2, seed=6)
    with torch.inference_mode():
        assert torch.equal(module(x), pool(x))
        assert torch.equal(module(x.double(), weights=w.double()), pool(x.double(), w.double()))
    module.close()


def test_an_item_has_its_bits_whatever_the_batch(torch, pool) -> None:
    from pyspk.torch.resnet import PlannedStatsPool

    module = PlannedStatsPool(pool)
    x, w = features(torch, 37, seed=7), masks(torch, 37, seed=8)
    whole = planned(torch, module, x, w)
    assert torch.equal(whole, planned(torch, module, x, w))
    assert torch.equal(whole[:5], planned(torch, module, x[:5], w[:5]))
    assert torch.equal(whole[36:], planned(torch, module, x[36:], w[36:]))
    module.close()


def test_a_graph_replays_the_eager_bits(torch, pool) -> None:
    from pyspk.testing import torch_graph
    from pyspk.torch.resnet import PlannedStatsPool

    module = PlannedStatsPool(pool)
    x, w = features(torch, 20, seed=9), masks(torch, 20, seed=10)
    eager = planned(torch, module, x, w)
    with torch.inference_mode():
        graph, captured = torch_graph(torch, lambda: module(x, weights=w))
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)
    module.close()


def test_two_threads_on_two_streams_get_their_own_bits(torch, pool) -> None:
    from pyspk.torch.resnet import PlannedStatsPool
    from tests.concurrency import assert_serial_bits_on_two_streams

    module = PlannedStatsPool(pool)
    pairs = [
        (features(torch, n, seed), masks(torch, n, seed + 1)) for n, seed in ((24, 11), (9, 13))
    ]
    assert_serial_bits_on_two_streams(torch, lambda pair: planned(torch, module, *pair), pairs)
    module.close()


def test_a_launch_of_another_shape_writes_nothing(torch) -> None:
    """The entry's checks: a block of 128 threads, a grid one block wider or a wrong
    length each leave the output as it was; the right launch then writes all of it."""
    from pyspk.candidate.trunk import pooling
    from pyspk.candidate.trunk.pooling import plan_stats_pool
    from pyspk.torch import shared_runtime

    plan = plan_stats_pool(shared_runtime(0))
    items, speakers, rows, frames = 2, 3, 100, 125
    x = torch.rand(items * rows * frames, device="cuda")
    w = torch.ones(items * speakers * frames, device="cuda")
    y = torch.full((items * speakers * 2 * rows,), 7.0, device="cuda")
    lengths = (x.numel(), w.numel(), y.numel())
    stream = torch.cuda.current_stream().cuda_stream

    def launch(grid: tuple, threads: int, y_len: int) -> None:
        values = [x.data_ptr(), lengths[0], w.data_ptr(), lengths[1], y.data_ptr(), y_len]
        plan._kernel.launch(
            grid, threads, 0, pooling.SIGNATURE, [*values, items, speakers, rows, frames]
        ).enqueue(stream)
        torch.cuda.synchronize()

    for grid, threads, y_len in [
        ((2, items, 1), 128, lengths[2]),
        ((3, items, 1), pooling.POOL_THREADS, lengths[2]),
        ((2, items, 1), pooling.POOL_THREADS, lengths[2] - 1),
    ]:
        launch(grid, threads, y_len)
        assert torch.all(y == 7.0), (grid, threads, y_len)
    launch((2, items, 1), pooling.POOL_THREADS, lengths[2])
    assert not torch.any(y == 7.0)
    plan.close()


_SANITIZED = """
import torch
from pyspk.candidate.trunk.pooling import plan_stats_pool
from pyspk.torch import shared_runtime
plan = plan_stats_pool(shared_runtime(0))
items, speakers, rows, frames = 3, 3, 2560, 125
x = torch.rand(items, rows, frames, device="cuda")
w = (torch.rand(items, speakers, frames, device="cuda") > 0.5).float()
y = torch.empty(items, speakers, 2 * rows, device="cuda")
plan.enqueue(x, w, y, items=items, speakers=speakers, features=rows, frames=frames,
             stream=torch.cuda.current_stream().cuda_stream)
torch.cuda.synchronize()
print("pool done", flush=True)
"""


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_finds_nothing_in_the_pool(torch, tool: str) -> None:
    from tests.gpu.test_sanitizer_gpu import sanitized_run

    assert "pool done" in sanitized_run(tool, _SANITIZED)
