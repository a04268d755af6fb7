"""Plan and enqueue behaviour shown on the embedding boundary (resnet.seg_1): PyTorch
tensors as buffers, every split-K count, the errors raised before any launch, and the
tiers. Accuracy, library comparison and graph replay of every SIMT entry are in
test_simt_gpu.py; the bound is `error_bound` of tests/gpu/boundary.py (gamma_{k+2} of
the terms' magnitudes, which holds whatever order a kernel sums in)."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.candidate import DenseSite, DenseSpec, Op
from pyspk.candidate.segdense import Choice, Entry, SegdensePin, Site
from pyspk.candidate.segdense.candidates import DenseOxide
from pyspk.cuda import CudaMath, EventPhases, PtxTier
from pyspk.cuda.errors import BufferLayoutError
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.runtime import CudaRuntime
from pyspk.errors import BufferLengthError, DeviceUnsupported, GeometryInvalid
from pyspk.testing import error_bound, operands, plan, run_eager, truth

pytestmark = pytest.mark.gpu

K = 5120
ENTRIES = [Entry.EMBED_B1, Entry.EMBED_B32]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_torch_tensors_give_the_same_bits(runtime, kernels, torch, entry: Entry) -> None:
    ops = operands(Site.EMBEDDING, entry.batch(), seed=13)
    oxide = plan(runtime, entry, CudaMath.FP32, ops)
    eager = run_eager(runtime, oxide, ops["x"])
    x = torch.from_numpy(ops["x"]).cuda()
    out = torch.full((oxide.producer.output_len,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    oxide.enqueue(x, out)
    runtime.synchronize()
    assert np.array_equal(out.cpu().numpy().view(np.uint32), eager.view(np.uint32))
    oxide.close()


def test_split_counts_agree_to_rounding(runtime, kernels) -> None:
    """Every split count 1..128 gives the same sum within the bound: slice partitions
    and the reduction forms (fixed, flat, eight-warp) each cover all of k once."""
    ops = operands(Site.EMBEDDING, 32, seed=15)
    exact, scale = truth(Site.EMBEDDING, 32, ops)
    x = runtime.upload(ops["x"])
    weight, bias = runtime.upload(ops["w"]), runtime.upload(ops["bias"])
    spec = DenseSpec(DenseSite.EMBEDDING, 32, CudaMath.FP32)
    for splits in (1, 2, 7, 18, 34, 36, 40, 41, 64, 66, 100, 127, 128):
        pin = SegdensePin(Choice.split(Entry.EMBED_B32, splits), CudaMath.FP32, kernels.tier)
        oxide = DenseOxide.plan(runtime, kernels, spec, weight, bias, pin)
        out = runtime.upload(np.full(oxide.producer.output_len, np.nan, np.float32))
        oxide.enqueue(x, out)
        y = runtime.download(out)
        assert np.all(np.abs(y - exact) <= error_bound(Entry.EMBED_B32, exact, scale)), splits
        oxide.close()


def test_errors_raise_before_any_launch(runtime, kernels, torch) -> None:
    ops = operands(Site.EMBEDDING, 1, seed=16)
    oxide = plan(runtime, Entry.EMBED_B1, CudaMath.FP32, ops)
    poison = np.full(oxide.producer.output_len, np.nan, np.float32)
    out = runtime.upload(poison)
    x = runtime.upload(ops["x"])

    def untouched() -> bool:
        return bool(np.all(np.isnan(runtime.download(out))))

    with pytest.raises(BufferLengthError, match="input"):
        oxide.enqueue(runtime.upload(ops["x"][:-1]), out)
    with pytest.raises(BufferLengthError, match="output"):
        oxide.enqueue(x, runtime.upload(poison[:-1]))
    with pytest.raises(BufferLayoutError, match="input"):
        oxide.enqueue(torch.from_numpy(ops["x"]).double().cuda(), out)
    wide = torch.zeros((3, 2 * K), device="cuda")
    with pytest.raises(BufferLayoutError, match="input"):
        oxide.enqueue(wide[:, ::2], out)
    assert untouched()

    weight, bias = runtime.upload(ops["w"]), runtime.upload(ops["bias"])
    spec = DenseSpec(DenseSite.EMBEDDING, 1, CudaMath.FP32)
    other_site = SegdensePin.forced(Entry.LINEAR0_B1, CudaMath.FP32, kernels.tier, runtime.device)
    with pytest.raises(GeometryInvalid, match="cannot plan"):
        DenseOxide.plan(runtime, kernels, spec, weight, bias, other_site)
    other_math = SegdensePin.forced(Entry.EMBED_B1, CudaMath.TF32, kernels.tier, runtime.device)
    with pytest.raises(GeometryInvalid, match="cannot plan"):
        DenseOxide.plan(runtime, kernels, spec, weight, bias, other_math)
    with pytest.raises(BufferLengthError, match="weight"):
        DenseOxide.plan(
            runtime,
            kernels,
            spec,
            runtime.upload(ops["w"][:-1]),
            bias,
            SegdensePin.forced(Entry.EMBED_B1, CudaMath.FP32, kernels.tier, runtime.device),
        )
    oxide.close()


def test_pin_above_the_loaded_tier_is_refused(runtime) -> None:
    if runtime.device.capability < PtxTier.SM80.capability:
        pytest.skip("the device has no sm80 tier to pin above sm75")
    with CudaRuntime(0, ptx_tier=PtxTier.SM75) as low:
        kernels = low.load_kernels(KernelModule.SEGDENSE)
        assert kernels.tier is PtxTier.SM75
        ops = operands(Site.EMBEDDING, 1, seed=17)
        pin = SegdensePin.select(Site.EMBEDDING, 1, CudaMath.FP32, PtxTier.SM80, low.device)
        spec = DenseSpec(DenseSite.EMBEDDING, 1, CudaMath.FP32)
        with pytest.raises(DeviceUnsupported, match="sm80"):
            DenseOxide.plan(low, kernels, spec, low.upload(ops["w"]), low.upload(ops["bias"]), pin)


def test_sm75_tier_runs_the_same_kernels(runtime) -> None:
    """The sm75 module's SIMT entries agree with the float64 bound too."""
    with CudaRuntime(0, ptx_tier=PtxTier.SM75) as low:
        assert low.load_kernels(KernelModule.SEGDENSE).tier is PtxTier.SM75
        for entry in ENTRIES:
            ops = operands(Site.EMBEDDING, entry.batch(), seed=18)
            exact, scale = truth(Site.EMBEDDING, entry.batch(), ops)
            oxide = plan(low, entry, CudaMath.FP32, ops)
            y = run_eager(low, oxide, ops["x"])
            assert np.all(np.abs(y - exact) <= error_bound(entry, exact, scale)), entry.name
            oxide.close()


def test_event_phases_time_both_launches(runtime, kernels) -> None:
    ops = operands(Site.EMBEDDING, 32, seed=19)
    oxide = plan(runtime, Entry.EMBED_B32, CudaMath.FP32, ops)
    x = runtime.upload(ops["x"])
    out = runtime.alloc_zeros(oxide.producer.output_len)
    plain = runtime.alloc_zeros(oxide.producer.output_len)
    oxide.enqueue(x, plain)
    phases = EventPhases(runtime)
    for _ in range(3):
        oxide.enqueue(x, out, phases)
    elapsed = phases.elapsed_ms()
    assert set(elapsed) == {Op.MAIN, Op.REDUCE}
    assert all(0 < ms < 100 for ms in elapsed.values())
    assert phases.elapsed_ms() == {}  # read once, then forgotten
    assert np.array_equal(runtime.download(out), runtime.download(plain))
    phases.close()
    oxide.close()


def test_caller_scratch_holds_the_partials(runtime, kernels) -> None:
    ops = operands(Site.EMBEDDING, 32, seed=20)
    own = plan(runtime, Entry.EMBED_B32, CudaMath.FP32, ops)
    expected = run_eager(runtime, own, ops["x"])
    pin = SegdensePin.forced(Entry.EMBED_B32, CudaMath.FP32, kernels.tier, runtime.device)
    spec = DenseSpec(DenseSite.EMBEDDING, 32, CudaMath.FP32)
    weight, bias = runtime.upload(ops["w"]), runtime.upload(ops["bias"])
    needed = pin.splits() * own.producer.output_len
    scratch = runtime.alloc_zeros(needed + 7)  # longer is fine: the plan uses a prefix
    shared = DenseOxide.plan(runtime, kernels, spec, weight, bias, pin, scratch=scratch)
    assert np.array_equal(run_eager(runtime, shared, ops["x"]), expected)
    with pytest.raises(
        BufferLengthError, match=f"scratch has {needed - 1} elements, expected {needed}"
    ):
        DenseOxide.plan(
            runtime, kernels, spec, weight, bias, pin, scratch=runtime.alloc_zeros(needed - 1)
        )
    own.close()
    shared.close()
