"""The trunk plans on the GPU: every site and the whole trunk against float64, against
cuDNN's error in the same math, across chunks 2^20 apart, partial batches, reruns and
graph replays bit for bit, and the sm75 tier's refusal."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pyspk import reference
from pyspk.candidate.trunk import (
    TRUNK_BATCH,
    FoldedConv,
    TrunkSite,
    TrunkWeights,
    plan_conv,
    plan_trunk,
)
from pyspk.cuda.math import CudaMath
from pyspk.cuda.runtime import CudaRuntime
from pyspk.cuda.tier import PtxTier
from pyspk.errors import DeviceUnsupported

pytestmark = pytest.mark.gpu

CONV_SITES = [site for site in TrunkSite if site is not TrunkSite.STEM]
UNIT = 2.0**-23  # FP32 unit roundoff (round to nearest), also one truncation's bound / 2


def tolerance(site: TrunkSite, math: CudaMath) -> float:
    """Bound on |error| / (sum of |terms|) per output. Products: the FP16 split keeps
    about 22 bits of each operand (high + low), so a product is within 3 * 2^-22 of
    exact; one FP16 product rounds both operands to 11 bits, within 2^-10. The scales
    are powers of two and add no error (values below 2^-28 of their chunk's largest, and
    low parts of values below 2^-17 of it, lose bits to FP16's subnormals, with an
    absolute error under 2^-39 of the largest; the tests' data has none that matter at
    this bound).
    Sums: every k16 mma adds its 16 exact products to the FP32 accumulator once, and
    the tensor cores may truncate rather than round: 4 units for each of the K / 16
    (one product) or 3 K / 16 (three) mma steps; + 4 for the stem's FP32 fma chain,
    bias, residual."""
    k = site.shape.k
    if site is TrunkSite.STEM:
        return (k + 4) * UNIT
    if math is CudaMath.FP32:
        return 3 * 2.0**-22 + (3 * k / 8 * 2 + 4) * UNIT
    return 2.0**-10 + (k / 8 * 2 + 4) * UNIT


def rel_l2(got: np.ndarray, truth: np.ndarray) -> float:
    return float(np.linalg.norm(got - truth) / np.linalg.norm(truth))


def levelled_chunks(torch, weights: TrunkWeights, seed: int, levels: tuple[float, ...]):
    """Fbank chunks of N(0, 2) noise times `levels` on the GPU, and the trunk's float64
    output for them."""
    rng = np.random.default_rng(seed)
    fbank = rng.normal(0, 2, (len(levels), 998, 80)).astype(np.float32)
    fbank *= np.array(levels, np.float32)[:, None, None]
    return torch.from_numpy(fbank).cuda(), reference.trunk(fbank, weights)


def torch_layer(torch, site: TrunkSite, conv: FoldedConv, x, residual):
    """The library's conv + bias (+ residual, ReLU) on NHWC tensors, in NCHW."""
    import torch.nn.functional as F

    shape = site.shape
    weight = torch.from_numpy(conv.weight.astype(np.float32)).cuda()
    bias = torch.from_numpy(conv.bias.astype(np.float32)).cuda()
    out = F.conv2d(x.permute(0, 3, 1, 2), weight, bias, stride=shape.stride, padding=shape.pad)
    if residual is not None:
        out = out + residual.permute(0, 3, 1, 2)
    if not site.is_shortcut():
        out = torch.relu(out)
    return out.permute(0, 2, 3, 1).contiguous()


@pytest.mark.parametrize("halves", [False, True], ids=["default", "halves"])
@pytest.mark.parametrize("math", list(CudaMath), ids=str)
@pytest.mark.parametrize("site", list(TrunkSite), ids=str)
def test_each_site_within_its_bound_and_cudnns_error(runtime, torch, site, math, halves) -> None:
    """Each site's kernel (and, with `halves`, its halves form, where the loaded tier
    has one) against float64 and cuDNN: an entry that refused its launch would leave
    its output unwritten and fail the bound."""
    from pyspk.cuda import KernelModule
    from pyspk.torch import library_math

    tier = runtime.load_kernels(KernelModule.TRUNK).tier
    if halves and not site.in_halves(math, tier, True):
        pytest.skip(f"{site} has no halves form on the {tier} tier")
    items = 2  # a partial batch: the plan's grid covers 32, the absent chunks are skipped
    rng = np.random.default_rng(7)
    shape = site.shape
    conv = FoldedConv.of(
        site,
        rng.normal(0, np.sqrt(2 / shape.k), shape.weight_shape),
        rng.normal(0, 0.1, shape.cout),
    )
    stem = site is TrunkSite.STEM
    shortcut = site.is_shortcut()
    x_host = rng.normal(0, 1, (items, shape.hin, shape.win, shape.cin)).astype(np.float32)
    if not stem:
        x_host = np.maximum(x_host, 0)  # block inputs come out of a ReLU
    res_host = None
    if not stem and not shortcut:
        res_host = rng.normal(0, 1, (items, shape.hout, shape.wout, shape.cout)).astype(np.float32)
    x = torch.from_numpy(x_host).cuda()
    residual = None if res_host is None else torch.from_numpy(res_host).cuda()
    y = torch.full((items, shape.hout, shape.wout, shape.cout), float("nan"), device="cuda")
    with plan_conv(runtime, math, conv, halves=halves) as plan:
        # the stem reads the fbank layout [item, frame, bin]
        plan_input = x[..., 0].transpose(1, 2).contiguous() if stem else x
        plan.enqueue(
            plan_input,
            y,
            residual,
            items=items,
            relu=not shortcut,
            stream=torch.cuda.current_stream().cuda_stream,
        )
        torch.cuda.synchronize()
    got = y.cpu().numpy().astype(np.float64)
    truth = reference.trunk_conv(
        x_host, conv.weight, conv.bias, shape.stride, residual=res_host, relu=not shortcut
    )
    absolute = reference.trunk_conv(
        np.abs(x_host),
        np.abs(conv.weight),
        np.abs(conv.bias),
        shape.stride,
        residual=None if res_host is None else np.abs(res_host),
    )
    excess = np.abs(got - truth) - tolerance(site, math) * absolute
    assert excess.max() <= 0, f"{site} {math}: worst excess over the bound {excess.max():.3g}"
    with torch.inference_mode(), library_math(math):
        library = torch_layer(torch, site, conv, x, residual).cpu().numpy().astype(np.float64)
    ours, theirs = rel_l2(got, truth), rel_l2(library, truth)
    print(f"{site} {math}: pyspk {ours:.3e}, cuDNN {theirs:.3e}")
    # No worse than cuDNN's in the same math, within run-to-run spread of the measure
    # (5%), except the 1x1 shortcuts: over 32 to 128 terms the split operands' 2^-22
    # residual outweighs the sum's few roundings, measured 1.25x-1.75x cuDNN FP32's
    # with 3xTF32, the same split.
    allowed = 2.0 if site.is_shortcut() else 1.05
    assert ours <= theirs * allowed, f"{site} {math}: {ours:.3g} vs cuDNN {theirs:.3g}"


@pytest.fixture(scope="module")
def weights() -> TrunkWeights:
    return TrunkWeights.random(3)


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_whole_trunk_on_chunks_2_20_apart(runtime, torch, weights, math) -> None:
    """Chunk 0 at 2^10, chunk 1 at 2^-10 the level of the other: each within its own
    float64 truth as closely as cuDNN in the same math gets to it."""
    import torch.nn.functional as F

    from pyspk.torch import library_math

    fbank, truth = levelled_chunks(torch, weights, 11, (2.0**10, 2.0**-10))
    out = torch.empty((2, 256, 10, 125), device="cuda")
    with plan_trunk(runtime, math, weights) as plan:
        plan.enqueue(fbank, out, items=2, stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()

    def library_trunk(x):
        def conv(c, h, residual=None, relu=True):
            w = torch.from_numpy(c.weight.astype(np.float32)).cuda()
            b = torch.from_numpy(c.bias.astype(np.float32)).cuda()
            shape = c.site.shape
            h = F.conv2d(h, w, b, stride=shape.stride, padding=shape.pad)
            if residual is not None:
                h = h + residual
            return torch.relu(h) if relu else h

        h = conv(weights.stem, x.transpose(1, 2).unsqueeze(1))
        for block in weights.blocks:
            mid = conv(block.conv1, h)
            short = h if block.shortcut is None else conv(block.shortcut, h, relu=False)
            h = conv(block.conv2, mid, short)
        return h

    with torch.inference_mode(), library_math(math):
        library = library_trunk(fbank).cpu().numpy().astype(np.float64)
    got = out.cpu().numpy().astype(np.float64)
    for chunk in range(2):
        ours, theirs = rel_l2(got[chunk], truth[chunk]), rel_l2(library[chunk], truth[chunk])
        print(f"{math} chunk {chunk}: pyspk {ours:.3e}, cuDNN {theirs:.3e}")
        assert ours <= theirs, f"chunk {chunk}: {ours:.3g} vs cuDNN {theirs:.3g}"


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_reruns_partial_batches_and_replays_give_the_same_bits(
    runtime, torch, weights, math
) -> None:
    fbank = torch.randn(TRUNK_BATCH, 998, 80, device="cuda")
    full = torch.empty((TRUNK_BATCH, 256, 10, 125), device="cuda")
    again = torch.empty_like(full)
    part = torch.empty((3, 256, 10, 125), device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    loud = torch.empty_like(full)
    with plan_trunk(runtime, math, weights) as plan:
        plan.enqueue(fbank, full, stream=stream)
        # a louder batch in between: its chunk maxima must not outlive its enqueue (the
        # trunk's first launch clears them), or the next run's scales would differ
        plan.enqueue(fbank * 1024, loud, stream=stream)
        plan.enqueue(fbank, again, stream=stream)
        plan.enqueue(fbank[:3], part, items=3, stream=stream)
        graph = torch.cuda.CUDAGraph()
        replayed = torch.empty_like(full)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.cuda.graph(graph):
            plan.enqueue(fbank, replayed, stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.current_stream().wait_stream(side)
        graph.replay()
        torch.cuda.synchronize()
        del graph
    assert torch.equal(full, again)
    assert torch.equal(full[:3], part)
    assert torch.equal(full, replayed)


def _errors_on_and_off(
    runtime, torch, weights, math, seed: int, form: str, absent: str, **fixed
) -> list[tuple[float, float]]:
    """Each of three chunks (2^10, 1 and 2^-10 in level) as (error with plan_trunk's
    `form` on, error with it off) against float64, the other options `fixed`; skipped
    (saying `absent`) off the sm90 tier. Each plan's rerun gives its bits."""
    fbank, truth = levelled_chunks(torch, weights, seed, (2.0**10, 1.0, 2.0**-10))
    stream = torch.cuda.current_stream().cuda_stream
    got = {}
    for on in (True, False):
        with plan_trunk(runtime, math, weights, **{form: on}, **fixed) as plan:
            if plan.tier is not PtxTier.SM90:
                pytest.skip(absent)
            assert getattr(plan, form) is on
            out = torch.empty((3, 256, 10, 125), device="cuda")
            again = torch.empty_like(out)
            plan.enqueue(fbank, out, items=3, stream=stream)
            plan.enqueue(fbank, again, items=3, stream=stream)
            torch.cuda.synchronize()
            assert torch.equal(out, again)
            got[on] = out.cpu().numpy().astype(np.float64)
    return [tuple(rel_l2(got[on][c], truth[c]) for on in (True, False)) for c in range(3)]


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_layer1_middles_in_16_bits_keep_the_trunks_error(runtime, torch, weights, math) -> None:
    """On the sm90 tier layer1's middle activations stay in 16 bits (the FP16 planes,
    scaled by a bound their writer knows before it writes). A power-of-two scale leaves
    every normal FP16 rounding as it is, so only values that the bound's smaller scale
    puts among FP16's subnormals round differently (in FP32 math, low parts of values
    below about 2^-11 of their chunk's largest): the error against float64 must stay
    within 5% of the FP32 middles' (the CPU model of both forms differs by 0.2%), on
    chunks 2^10 and 2^-10 in level, at or below cuDNN's where that test measures it.
    The block outputs stay in 32 bits (the 16-bit stream is the next test's)."""
    errors = _errors_on_and_off(
        runtime,
        torch,
        weights,
        math,
        12,
        "middles",
        "the 16-bit middles exist on the sm90 tier only",
        stream16=False,
    )
    for chunk, (half, full) in enumerate(errors):
        print(f"{math} chunk {chunk}: 16-bit middles {half:.4e}, FP32 middles {full:.4e}")
        assert half <= 1.05 * full, f"chunk {chunk}: {half:.4g} vs {full:.4g}"


def test_layer1s_residual_stream_in_16_bits_keeps_the_trunks_error(runtime, torch, weights) -> None:
    """In TF32 math, `stream16` keeps the outputs of layer1's first two blocks as scaled
    FP16 planes too, each scaled by a bound: its error against float64 must stay within
    15% of the 32-bit stream's, on chunks 2^10 and 2^-10 in level (the CPU model,
    tools/trunk_half_model.py, puts the stem's and all three outputs in FP16 at 9.7%
    above; this form stores two of those four), and reruns give the same bits."""
    errors = _errors_on_and_off(
        runtime,
        torch,
        weights,
        "tf32",
        13,
        "stream16",
        "the 16-bit residual stream exists on the sm90 tier only",
    )
    for chunk, (half, full) in enumerate(errors):
        print(f"tf32 chunk {chunk}: 16-bit stream {half:.4e}, 32-bit stream {full:.4e}")
        assert half <= 1.15 * full, f"chunk {chunk}: {half:.4g} vs {full:.4g}"


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_the_halves_form_has_the_bits_of_the_strip_form(runtime, torch, weights, math) -> None:
    """On the sm90 tier the strips of layers 2 to 4 have a halves form in both maths (the
    block converts each strip once; its tiles span two chunks, the last batch's run past
    the chunks): the same FP16 operands, products and sums as the strip form, so the
    whole trunk's output must be the same bits, at a full batch and partial ones, with
    its copies by the async copy engine or by the threads."""
    fbank = torch.randn(TRUNK_BATCH, 998, 80, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    with (
        plan_trunk(runtime, math, weights, halves=True) as halves,
        plan_trunk(runtime, math, weights, halves=False) as strips,
    ):
        if halves.tier is not PtxTier.SM90:
            pytest.skip("the halves form exists on the sm90 tier only")
        assert halves.strips_by_tma  # layer3's and layer4's halves by the engine's copies
        for items in (TRUNK_BATCH, 11, 1):
            got = []
            for plan, by_tma in ((halves, True), (halves, False), (strips, True)):
                plan.stage_strips_by_tma(by_tma)
                got.append(torch.empty((items, 256, 10, 125), device="cuda"))
                plan.enqueue(fbank[:items], got[-1], items=items, stream=stream)
            torch.cuda.synchronize()
            assert torch.equal(got[0], got[2]) and torch.equal(got[1], got[2])


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_strips_staged_by_tma_have_the_bits_of_the_threads_copies(
    runtime, torch, weights, math
) -> None:
    """On the sm90 tier the strips stage by the async copy engine (tensor maps of their
    inputs, zeros past the batch's chunks; a tile's first boxes can lie wholly before
    the first row); by every thread's copies they must give the same bits, at a full
    batch and partial ones."""
    fbank = torch.randn(TRUNK_BATCH, 998, 80, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    with plan_trunk(runtime, math, weights) as plan:
        if not plan.strips_by_tma:
            pytest.skip("the strips stage by the async copy engine on the sm90 tier only")
        for items in (TRUNK_BATCH, 11, 1):
            got = {}
            for by_tma in (True, False):
                plan.stage_strips_by_tma(by_tma)
                got[by_tma] = torch.empty((items, 256, 10, 125), device="cuda")
                plan.enqueue(fbank[:items], got[by_tma], items=items, stream=stream)
            torch.cuda.synchronize()
            assert torch.equal(got[True], got[False])
            plan.stage_strips_by_tma(True)


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_one_plan_on_two_streams_and_two_threads_gives_the_serial_bits(
    runtime, torch, weights, math
) -> None:
    """One plan, its activations and chunk maxima shared: batches interleaved over two
    streams from one thread, then two threads each on its own stream, every output
    equal to the same batch's output enqueued alone on one stream."""
    from tests.concurrency import run_together

    generator = torch.Generator(device="cuda").manual_seed(44)
    inputs = [
        torch.randn(TRUNK_BATCH, 998, 80, device="cuda", generator=generator) * 4.0 ** (i % 3)
        for i in range(8)
    ]

    def outputs():
        return [torch.empty((TRUNK_BATCH, 256, 10, 125), device="cuda") for _ in inputs]

    serial, interleaved, threaded = outputs(), outputs(), outputs()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    with plan_trunk(runtime, math, weights) as plan:
        for x, y in zip(inputs, serial, strict=True):
            plan.enqueue(x, y, stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        for index, (x, y) in enumerate(zip(inputs, interleaved, strict=True)):
            plan.enqueue(x, y, stream=streams[index % 2].cuda_stream)
        torch.cuda.synchronize()

        def on_own_stream(which: int) -> None:
            stream = streams[which].cuda_stream
            for index in range(which, len(inputs), 2):
                for _ in range(3):  # each batch thrice, to widen the window for a race
                    plan.enqueue(inputs[index], threaded[index], stream=stream)

        run_together(on_own_stream, [(0,), (1,)])
        torch.cuda.synchronize()
    for index, expected in enumerate(serial):
        assert torch.equal(interleaved[index], expected), f"batch {index} on two streams"
        assert torch.equal(threaded[index], expected), f"batch {index} on two threads"


@pytest.mark.parametrize("halves", [False, True], ids=["strips", "halves"])
@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_a_chunk_that_is_not_finite_leaves_its_neighbours_alone(
    runtime, torch, weights, math, halves
) -> None:
    """An infinite fbank value at a chunk's first (last) position changes no bit of the
    chunk before (after) it. The stem passes it on (ReLU keeps +inf); a 3x3's taps
    outside an image, which at a chunk's first and last positions lie on the
    neighbouring chunk's pixels, must read zeros there, not those pixels times zero (in
    either form of the FP32 strips of layers 2 to 4 on the sm90 tier)."""
    fbank = torch.randn(4, 998, 80, device="cuda")
    poisoned = fbank.clone()
    poisoned[1, 0, 0] = float("inf")  # frame 0, bin 0: chunk 1's first position
    poisoned[2, 997, 79] = float("inf")  # chunk 2's last position
    clean = torch.empty((4, 256, 10, 125), device="cuda")
    dirty = torch.empty_like(clean)
    stream = torch.cuda.current_stream().cuda_stream
    with plan_trunk(runtime, math, weights, halves=halves) as plan:
        plan.enqueue(fbank, clean, items=4, stream=stream)
        plan.enqueue(poisoned, dirty, items=4, stream=stream)
        torch.cuda.synchronize()
    assert torch.isfinite(clean).all()
    assert torch.equal(clean[0], dirty[0]) and torch.equal(clean[3], dirty[3])


def test_sm75_tier_refuses_the_trunk(torch) -> None:
    with (
        CudaRuntime(0, ptx_tier=PtxTier.SM75) as sm75,
        pytest.raises(DeviceUnsupported, match="sm80 tier"),
    ):
        plan_trunk(sm75, CudaMath.FP32, TrunkWeights.random(0))


def test_a_planned_trunk_the_tier_refuses_says_so(pyannote, torch) -> None:
    """A refused plan leaves `PlannedTrunk` through its own `close()`, which must not
    fail before the side stream is taken: the caller sees the tier's refusal."""
    from pyspk.torch.resnet import PlannedTrunk

    model = pyannote.wespeaker_resnet34(seed=1).cuda()
    with (
        CudaRuntime(0, ptx_tier=PtxTier.SM75) as sm75,
        pytest.raises(DeviceUnsupported, match="sm80 tier"),
    ):
        PlannedTrunk(model.resnet, CudaMath.FP32, runtime=sm75)


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_planned_trunk_in_the_model_and_undo(pyannote, torch, math) -> None:
    """`accelerate` puts the trunk of a WeSpeaker ResNet34 on the plan; its output
    stays within the plan's accuracy of the stock module's, and `undo` restores it."""
    from pyspk.torch import library_math

    model = pyannote.wespeaker_resnet34(seed=1).cuda()
    resnet = model.resnet
    fbank = torch.randn(40, 998, 80, device="cuda")  # a full batch and a last one of 8
    with torch.inference_mode(), library_math(CudaMath.FP32):
        stock = resnet.forward_frames(fbank.clone())
        acceleration = pyannote.accelerate(model, math)
        assert "resnet.trunk" in acceleration.modules
        planned = resnet.forward_frames(fbank.clone())
        acceleration.undo()
        restored = resnet.forward_frames(fbank.clone())
    assert torch.equal(stock, restored)
    scale = stock.abs().max().item()
    limit = 1e-5 if math is CudaMath.FP32 else 1e-2
    assert (planned - stock).abs().max().item() <= limit * scale


@pytest.mark.parametrize(("streams", "piece"), [(2, None), (3, None), (2, 32)])
@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_planned_trunk_on_several_streams_has_the_bits_of_one(
    pyannote, torch, math, streams, piece
) -> None:
    """Pieces alternating between plans and streams (the default: 16 chunks on two; 11
    on three; 32 on two, where a call has more than 32 chunks) give every chunk the bits
    of pieces of 32 on one plan, eagerly and replayed from a graph: a chunk's sums never
    depend on the other chunks of its launch."""
    from pyspk.testing import torch_graph
    from pyspk.torch.resnet import PlannedTrunk

    resnet = pyannote.wespeaker_resnet34(seed=1).cuda().resnet
    fbank = torch.randn(40, 998, 80, device="cuda")  # e.g. pieces of 16, 16 and 8
    one = PlannedTrunk(resnet, math, streams=1)
    several = PlannedTrunk(resnet, math, streams=streams, piece=piece)
    try:
        with torch.inference_mode():
            expected = one(fbank)
            assert torch.equal(several(fbank), expected)
            graph, captured = torch_graph(torch, lambda: several(fbank))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(captured, expected)
    finally:
        one.close()
        several.close()


_SANITIZED_TRUNK = """
import numpy as np
from pyspk.candidate.trunk import TrunkWeights, plan_trunk
from pyspk.cuda import CudaMath
from pyspk.cuda.runtime import CudaRuntime

weights = TrunkWeights.random(5)
with CudaRuntime(0) as runtime:
    fbank = runtime.upload(np.random.default_rng(0).normal(size=2 * 998 * 80).astype(np.float32))
    out = runtime.alloc_zeros(2 * 256 * 10 * 125)
    for math, halves in ((m, h) for m in CudaMath for h in (False, True)):
        with plan_trunk(runtime, math, weights, halves=halves) as plan:
            plan.enqueue(fbank, out, items=2)
            runtime.synchronize()
        print(math, "done", flush=True)
"""

# One site's kernels (both maths) at `items` chunks: a ConvPlan (spk_trunk_chunk_max,
# then the convolution), then the same kernel launched as a trunk plan launches it,
# raising its output's chunk maxima (the plan's prepared launch, with out_max set).
# argv: site, items.
_SANITIZED_SITE = """
import sys
import numpy as np
from pyspk.candidate.trunk import TrunkSite, TrunkWeights, plan_conv
from pyspk.candidate.trunk.plan import FBANK_ITEM
from pyspk.candidate.trunk.shapes import CONV_RELU
from pyspk.cuda import CudaMath, KernelModule
from pyspk.cuda.runtime import CudaRuntime

site, items = TrunkSite(sys.argv[1]), int(sys.argv[2])
conv = next(c for c in TrunkWeights.random(5).convs() if c.site is site)
stem = site is TrunkSite.STEM
rng = np.random.default_rng(0)
with CudaRuntime(0) as runtime:
    x_len, y_len = items * (FBANK_ITEM if stem else site.shape.x_item), items * site.shape.y_item
    x = runtime.upload(np.abs(rng.normal(size=x_len)).astype(np.float32))
    y = runtime.alloc_zeros(y_len)
    residual = None if stem else runtime.alloc_zeros(y_len)
    out_max = runtime.alloc_zeros(32)
    tier = runtime.load_kernels(KernelModule.TRUNK).tier
    forms = [(m, h) for m in CudaMath for h in (False, True)]
    for math, halves in {site.kernel(m, tier, h): (m, h) for m, h in forms}.values():
        with plan_conv(runtime, math, conv, halves=halves) as plan:
            plan.enqueue(x, y, residual, items=items)
            own = {"out_max": (out_max.ptr, 32), "items": items}
            if not stem:
                own.update(in_max=(plan._maxima.ptr, 32), residual=(residual.ptr, y_len),
                           flags=CONV_RELU)
            plan._conv.launch((x.ptr, x_len), (y.ptr, y_len), **own).enqueue(runtime.stream)
            runtime.synchronize()
        print(site.kernel(math, tier, halves), "done", flush=True)
"""


# Layer1 alone as a trunk plan launches it with its middle activations in 16 bits (the
# sm90 tier): the clear, the stem, then each block's writer and reader, at `items`
# chunks, both maths, and in TF32 math with its residual stream in 16 bits too.
# argv: items.
_SANITIZED_MIDDLES = """
import sys
import numpy as np
from pyspk.candidate.trunk import TRUNK_BLOCKS, TrunkWeights, plan_trunk
from pyspk.candidate.trunk.plan import FBANK_ITEM
from pyspk.cuda import CudaMath
from pyspk.cuda.runtime import CudaRuntime

items = int(sys.argv[1])
with CudaRuntime(0) as runtime:
    x = np.random.default_rng(0).normal(size=items * FBANK_ITEM).astype(np.float32)
    fbank = runtime.upload(x)
    forms = [(CudaMath.FP32, False), (CudaMath.TF32, False), (CudaMath.TF32, True)]
    for math, stream16 in forms:
        weights = TrunkWeights.random(5)
        with plan_trunk(runtime, math, weights, middles=True, stream16=stream16) as plan:
            assert plan.stream16 is stream16
            launches = plan._launches[: 2 + 2 * TRUNK_BLOCKS[0]]
            for launch in launches[1:]:
                launch.set("items", items)
            launches[1].set("x", fbank.ptr)
            launches[1].set("x_len", items * FBANK_ITEM)
            for launch in launches:
                launch.enqueue(runtime.stream)
            runtime.synchronize()
        print(math, stream16, "done", flush=True)
"""


def _sanitized(tool: str, *script: str) -> subprocess.Popen[str]:
    from tests.gpu.test_sanitizer_gpu import _compute_sanitizer

    command = [_compute_sanitizer(), "--tool", tool, "--error-exitcode", "9"]
    if tool == "racecheck":
        command += ["--racecheck-report", "all"]
    return subprocess.Popen(
        [*command, sys.executable, "-c", *script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _all_clean(tool: str, runs: list[tuple[subprocess.Popen[str], int]]) -> None:
    """Each run exits 0 with its `done` lines and the tool's clean summary; a run left
    when one fails is killed."""
    summary = "ERROR SUMMARY: 0 errors" if tool == "memcheck" else "RACECHECK SUMMARY: 0 hazards"
    try:
        for run, done in runs:
            output, _ = run.communicate(timeout=900)
            assert run.returncode == 0, output[-4000:]
            assert output.count(" done\n") == done, output[-4000:]
            assert summary in output, output[-4000:]
    finally:
        for run, _ in runs:
            if run.poll() is None:
                run.kill()
                run.communicate()


def _site_kernels(site: TrunkSite, tier: PtxTier) -> int:
    """The kernels `_SANITIZED_SITE` runs for `site` on `tier`: each math's, and the
    halves form's where the site has one."""
    return len({site.kernel(math, tier, halves) for math in CudaMath for halves in (False, True)})


def _trunk_tier() -> PtxTier:
    from pyspk.cuda import KernelModule

    with CudaRuntime(0) as runtime:
        return runtime.load_kernels(KernelModule.TRUNK).tier


def test_memcheck_finds_nothing_in_the_trunk() -> None:
    """Every entry a trunk plan launches: the whole trunk in both maths on 2 chunks, in
    each form of the strips of layers 2 to 4 (the halves form on the sm90 tier);
    layer1's convolution on 11 chunks, where (strip form) the last block has three tiles
    of its four and two tiles that span two chunks come before their block's last, and
    (the tile form, on sm90) every row's last run overlaps the one before; and layer4's
    on 11 chunks, in each of its forms (tiles that span two chunks, the last one past
    the chunks); on sm90, layer1 with its middle activations in 16 bits on 11 chunks."""
    tier = _trunk_tier()
    layer4 = TrunkSite.LAYER4_CONV
    _all_clean(
        "memcheck",
        [
            (_sanitized("memcheck", _SANITIZED_TRUNK), 4),
            (_sanitized("memcheck", _SANITIZED_SITE, "layer1_conv", "11"), 2),
            (
                _sanitized("memcheck", _SANITIZED_SITE, layer4.value, "11"),
                _site_kernels(layer4, tier),
            ),
            *_middles_runs("memcheck", tier, "11"),
        ],
    )


def _middles_runs(tool: str, tier: PtxTier, items: str) -> list:
    """`_SANITIZED_MIDDLES` under `tool` where the tier has 16-bit middles (sm90)."""
    if tier is not PtxTier.SM90:
        return []
    return [(_sanitized(tool, _SANITIZED_MIDDLES, items), 3)]


def test_racecheck_finds_nothing_in_any_trunk_entry() -> None:
    """Every trunk entry on one chunk (spk_trunk_chunk_max, then each kernel with and
    without its output's chunk maxima), one process per site, side by side: each process
    stays small (racecheck slows a kernel by the number of its shared accesses); on
    sm90, layer1 with its middle activations in 16 bits too."""
    tier = _trunk_tier()
    runs = [
        (_sanitized("racecheck", _SANITIZED_SITE, site.value, "1"), _site_kernels(site, tier))
        for site in TrunkSite
    ]
    _all_clean("racecheck", [*runs, *_middles_runs("racecheck", tier, "1")])
