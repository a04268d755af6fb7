"""`pyspk.torch` on the GPU: wrapped modules against float64 and against the library path,
the fallback for shapes no plan serves, ordering on PyTorch's current stream (a busy user
stream), `torch.cuda.graph` capture, and the inference-only and stale-weight refusals.

Tolerances: these tests check the wrappers' plumbing (weight layout, shapes, streams),
not the kernels' numerics, which tests/gpu/test_simt_gpu.py and test_tensor_gpu.py bound
per entry. A transposed weight or a missed write errs by O(1); FP32 plans err by about
1e-7 relative on these random operands (k <= 5120 terms), TF32 products by about 3e-4
(2^-11 per product, errors of random sign); the bounds are 2e-6 and 3e-3."""

from __future__ import annotations

import pytest

from pyspk.candidate import DenseSite, SegConvSite
from pyspk.cuda import CudaMath
from pyspk.testing import torch_replay_matches_eager

pytestmark = pytest.mark.gpu

BOUND = {CudaMath.FP32: 2e-6, CudaMath.TF32: 3e-3}


@pytest.fixture(scope="module")
def ptorch(torch):
    """pyspk.torch, once PyTorch with a GPU is known to be there."""
    import pyspk.torch

    return pyspk.torch


def _rel_l2(torch, y, exact) -> float:
    return float(torch.linalg.vector_norm(y.double() - exact) / torch.linalg.vector_norm(exact))


def _dense_input(torch, site: DenseSite, batch: int, generator):
    rows, _, k = site.dimensions()
    shape = (batch, 3, k) if site is DenseSite.EMBEDDING else (batch, rows, k)
    return torch.randn(shape, generator=generator, device="cuda")


def _dense_exact(torch, site: DenseSite, linear, x):
    from pyspk.torch import epilogue

    y = torch.nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double())
    after = epilogue(site)
    return y if after is None else after(y)


def _linear(torch, site: DenseSite, seed: int):
    _, n, k = site.dimensions()
    torch.manual_seed(seed)
    return torch.nn.Linear(k, n).cuda()


def _planned(torch, ptorch, site: DenseSite, seed: int, math: CudaMath = CudaMath.FP32):
    return ptorch.PlannedDense(_linear(torch, site, seed), site, math)


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
@pytest.mark.parametrize("site", list(DenseSite), ids=lambda s: s.name)
def test_planned_dense_serves_its_batches_and_falls_back_for_others(torch, ptorch, site, math):
    linear = _linear(torch, site, seed=3)
    planned = ptorch.PlannedDense(linear, site, math)
    assert set(planned.entries()) == {1, 32}
    generator = torch.Generator(device="cuda").manual_seed(5)
    with torch.inference_mode():
        for batch in (1, 32):
            x = _dense_input(torch, site, batch, generator)
            y = planned(x)
            assert y.shape == (*x.shape[:-1], site.dimensions()[1])
            assert _rel_l2(torch, y, _dense_exact(torch, site, linear, x)) < BOUND[math]
        # batch 2 has no plan: the module's own library path, to the bit
        x = _dense_input(torch, site, 2, generator)
        assert torch.equal(planned(x), planned.library(x))
        after = ptorch.epilogue(site)
        expected = linear(x) if after is None else after(linear(x))
        assert torch.equal(planned(x), expected)
    planned.close()


@pytest.mark.parametrize("bias", ["add", "drop"])
@pytest.mark.parametrize("site", list(SegConvSite), ids=lambda s: s.name)
def test_planned_conv1d_with_its_bias_added_or_dropped(torch, ptorch, site, bias):
    _, n, k, length = site.dimensions()
    torch.manual_seed(7)
    conv = torch.nn.Conv1d(k // 5, n, 5).cuda()
    planned = ptorch.PlannedConv1d(conv, site, CudaMath.FP32, bias=bias)
    generator = torch.Generator(device="cuda").manual_seed(9)
    kept = conv.bias.double() if bias == "add" else None
    with torch.inference_mode():
        for batch in (1, 32):
            x = torch.randn((batch, k // 5, length), generator=generator, device="cuda")
            exact = torch.nn.functional.conv1d(x.double(), conv.weight.double(), kept)
            assert _rel_l2(torch, planned(x), exact) < BOUND[CudaMath.FP32]
        x = torch.randn((2, k // 5, length), generator=generator, device="cuda")
        assert torch.equal(planned(x), planned.library(x))
        # another length has no plan either
        x = torch.randn((1, k // 5, length + 6), generator=generator, device="cuda")
        assert planned(x).shape == (1, n, length + 2)
    planned.close()


def test_enqueues_follow_the_current_user_stream(torch, ptorch):
    """The input is written on a user stream behind half a second of GPU work: a plan
    launched anywhere but that stream would read the zeros before the copy lands."""
    site = DenseSite.LINEAR1
    linear = _linear(torch, site, seed=11)
    planned = ptorch.PlannedDense(linear, site)
    source = torch.randn((32, 589, 128), device="cuda")
    x = torch.zeros_like(source)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.inference_mode(), torch.cuda.stream(stream):
        torch.cuda._sleep(1_000_000_000)  # about 0.5 s at H200 clocks
        x.copy_(source)
        y = planned(x)
    stream.synchronize()
    with torch.inference_mode():
        assert torch.equal(y, planned(source))
    planned.close()


def test_a_captured_graph_replays_the_plans_bits(torch, ptorch):
    planned = _planned(torch, ptorch, DenseSite.EMBEDDING, seed=13, math=CudaMath.TF32)
    with torch.inference_mode():
        static_x = torch.randn((32, 3, 5120), device="cuda")
        assert torch_replay_matches_eager(torch, planned, static_x)
    planned.close()


def test_autograd_is_refused(torch, ptorch):
    planned = _planned(torch, ptorch, DenseSite.LINEAR0, seed=17)
    x = torch.randn((1, 589, 256), device="cuda")
    with pytest.raises(ptorch.InferenceOnlyError, match="inference_mode"):
        planned(x)  # the parameters require grad and autograd records
    with torch.no_grad():
        planned(x)
    planned.requires_grad_(False)
    planned(x)  # nothing to record
    with pytest.raises(ptorch.InferenceOnlyError):
        planned(x.requires_grad_())
    planned.close()


def test_changed_weights_are_refused_until_replanned(torch, ptorch):
    site = DenseSite.LINEAR1
    linear = _linear(torch, site, seed=19)
    planned = ptorch.PlannedDense(linear, site)  # holds the module's own parameters
    x = torch.randn((32, 589, 128), device="cuda")
    with torch.inference_mode():
        before = planned(x)
    with torch.no_grad():
        linear.weight.mul_(2.0)
    with torch.inference_mode(), pytest.raises(ptorch.WeightsChangedError, match="replan"):
        planned(x)
    planned.replan()
    with torch.inference_mode():
        after = planned(x)
        exact = _dense_exact(torch, site, linear, x)
    assert not torch.equal(after, before)
    assert _rel_l2(torch, after, exact) < BOUND[CudaMath.FP32]
    planned.close()
    with torch.inference_mode():
        assert torch.equal(planned(x), planned.library(x))  # closed: the library path


def test_state_dict_keys_are_the_modules_own(torch, ptorch):
    site = DenseSite.CLASSIFIER
    linear = _linear(torch, site, seed=23)
    planned = ptorch.PlannedDense(linear, site)
    assert list(planned.state_dict()) == list(linear.state_dict())
    assert planned.weight is linear.weight
    planned.close()


def test_a_module_built_in_inference_mode_is_planned(torch, ptorch):
    """Inference tensors keep no version counter; planning and calls still work."""
    site = DenseSite.LINEAR0
    with torch.inference_mode():
        linear = _linear(torch, site, seed=29)
        planned = ptorch.PlannedDense(linear, site)
        x = torch.randn((1, 589, 256), device="cuda")
        exact = _dense_exact(torch, site, linear, x)
        assert _rel_l2(torch, planned(x), exact) < BOUND[CudaMath.FP32]
    planned.close()


def test_weights_moved_to_new_storage_are_refused(torch, ptorch):
    """What `.to()` does to a parameter (new storage, no version bump) is caught by
    its address."""
    site = DenseSite.LINEAR1
    linear = _linear(torch, site, seed=31)
    planned = ptorch.PlannedDense(linear, site)
    linear.weight.data = linear.weight.data.clone()
    with torch.inference_mode(), pytest.raises(ptorch.WeightsChangedError):
        planned(torch.randn((1, 589, 128), device="cuda"))
    planned.close()


def test_a_split_k_plan_on_two_busy_streams_at_once(torch, ptorch):
    """seg_1 at batch 32 runs split-K: each call takes its partial planes from PyTorch's
    allocator on its own stream, so two streams whose calls overlap in time each get
    their own batch's result."""
    planned = _planned(torch, ptorch, DenseSite.EMBEDDING, seed=37)
    inputs = [torch.randn((32, 3, 5120), device="cuda") for _ in range(2)]
    with torch.inference_mode():
        expected = [planned(x) for x in inputs]
        streams = [torch.cuda.Stream() for _ in inputs]
        torch.cuda.synchronize()
        outputs = []
        for stream, x in zip(streams, inputs, strict=True):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(100_000_000)  # both streams' work lines up behind this
                outputs.append([planned(x) for _ in range(20)])
        torch.cuda.synchronize()
    for want, got in zip(expected, outputs, strict=True):
        assert all(torch.equal(y, want) for y in got)
    planned.close()
