"""The trunk area on the CPU: its shape table, the BatchNorm fold, the weights' device
layout, the checks of folded weights, and the float64 truth against the model."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk import reference
from pyspk.candidate.trunk import (
    OUTPUT_SHAPE,
    TRUNK_BATCH,
    BatchNorm,
    Block,
    FoldedConv,
    TrunkSite,
    TrunkWeights,
    trunk_macs,
)
from pyspk.candidate.trunk.shapes import CONV_BM
from pyspk.cuda.tier import PtxTier
from pyspk.errors import GeometryInvalid, WeightsOutOfContract
from tests.optional import importorskip


def test_the_shape_table_follows_the_model() -> None:
    sizes = {site: (site.shape.hout, site.shape.wout, site.shape.cout) for site in TrunkSite}
    assert sizes[TrunkSite.LAYER1_CONV] == (80, 998, 32)
    assert sizes[TrunkSite.LAYER2_DOWN] == sizes[TrunkSite.LAYER2_SHORTCUT] == (40, 499, 64)
    assert sizes[TrunkSite.LAYER3_CONV] == (20, 250, 128)
    assert sizes[TrunkSite.LAYER4_CONV] == (10, 125, 256) == (OUTPUT_SHAPE[1], OUTPUT_SHAPE[2], 256)
    assert round(trunk_macs() / 1e9, 2) == 22.61  # 45.2 GFLOP per chunk


@pytest.mark.parametrize("site", [s for s in TrunkSite if s is not TrunkSite.STEM], ids=str)
def test_grids_cover_32_chunks_once(site: TrunkSite) -> None:
    (gx, gy, gz), threads, shared = site.launch()
    tiles = -(-TRUNK_BATCH * site.shape.positions // CONV_BM)  # of CONV_BM positions
    per_block = site.shape.tiles_per_block
    assert (gx - 1) * per_block < tiles <= gx * per_block
    assert per_block == (4 if site is TrunkSite.LAYER1_CONV else 1)
    assert gy * site.shape.block_channels == site.shape.cout and gz == 1
    # every block fits the 99 KB of dynamic shared memory sm_86 and sm_89 allow
    assert threads == 4 * site.shape.block_channels and shared <= 99 * 1024


def test_fold_equals_the_convolution_then_batchnorm() -> None:
    rng = np.random.default_rng(1)
    site = TrunkSite.LAYER2_DOWN
    weight = rng.normal(size=site.shape.weight_shape)
    norm = BatchNorm(
        rng.uniform(0.5, 1.5, 64),
        rng.normal(size=64),
        rng.normal(size=64),
        rng.uniform(0.5, 2, 64),
        1e-5,
    )
    folded = FoldedConv.fold(site, weight, norm)
    x = rng.normal(size=(1, 80, 998, 32))
    plain = reference.trunk_conv(x, weight, np.zeros(64), 2)
    expected = (plain - norm.mean) / np.sqrt(norm.var + norm.eps) * norm.gamma + norm.beta
    got = reference.trunk_conv(x, folded.weight, folded.bias, 2)
    assert np.abs(got - expected).max() <= 1e-12 * np.abs(expected).max()


def unpack_halves(packed: np.ndarray, k: int, cout: int) -> tuple[np.ndarray, np.ndarray]:
    """The (high, low) FP16 values `[k][cout]` of a packed convolution weight: per
    stage s of 16 k and column, lane t's words for pairs t and t + 4 (half h = 0, 1),
    high then low; pair (t, h) holds channels 16 s + 4 t + 2 h and the next."""
    words = packed.view(np.uint32).reshape(k // 16, cout, 4, 2, 2)  # [s][n][t][part][h]
    stage, column, lane, half = np.meshgrid(
        np.arange(k // 16), np.arange(cout), np.arange(4), np.arange(2), indexing="ij"
    )
    channel = 16 * stage + 4 * lane + 2 * half

    def values(part: int) -> np.ndarray:
        pairs = words[..., part, :]
        out = np.empty((k, cout))
        for offset, bits in enumerate((pairs & 0xFFFF, pairs >> 16)):
            halves = bits.astype(np.uint16).view(np.float16).astype(np.float64)
            out[channel + offset, column] = halves
        return out

    return values(0), values(1)


def test_the_packed_weight_is_tap_then_input_then_output_channel() -> None:
    site = TrunkSite.LAYER3_CONV
    weight = np.random.default_rng(2).normal(size=site.shape.weight_shape)
    weight[7] *= 2.0**-30  # a column far below the others keeps its own scale
    conv = FoldedConv.of(site, weight, np.zeros(128))
    packed = conv.packed()
    assert packed.dtype == np.float32 and packed.size == site.shape.k * 128
    high, low = unpack_halves(packed, site.shape.k, 128)
    shifts = conv.column_shifts()
    top = np.abs(high).max(axis=0)
    assert (top >= 2.0**14).all() and (top <= 2.0**15).all()
    value = ((high + low) * np.exp2(-shifts)).reshape(3, 3, 128, 128)
    # every weight at its (tap, input channel, output channel): high + low carries 22
    # bits, within 2^-23 of its column's largest value
    exact = weight.transpose(2, 3, 1, 0)
    column_largest = np.abs(weight).reshape(128, -1).max(axis=1)
    assert (np.abs(value - exact) <= 2.0**-23 * column_largest).all()
    bias = conv.packed_bias()
    assert bias.size == 256 and (bias[128:] == np.exp2(-shifts).astype(np.float32)).all()
    # one product's kernels read the high words alone, in the same order
    only_high = conv.packed(split=False).view(np.uint32).reshape(-1, 128, 4, 2)
    assert (only_high == packed.view(np.uint32).reshape(-1, 128, 4, 2, 2)[..., 0, :]).all()


def unpack_warpgroup_halves(packed: np.ndarray, k: int, cout: int) -> tuple[np.ndarray, ...]:
    """The FP16 planes `[k][cout]` of a weight packed for the wgmma kernels: per stage s
    of 16 k and plane, `[cout / 8][2][8][8]`, an 8 x 8 block per 8 columns and half of
    the stage; row n of a block is column n's 8 k positions p, which are an a fragment's
    (mma.sync m16n8k16 layout): lane t's registers hold p = 2 t, 2 t + 1 (its channels
    4 t, 4 t + 1) and p = 8 + 2 t, 9 + 2 t (channels 4 t + 2, 4 t + 3)."""
    halves = packed.view(np.float16).astype(np.float64)
    blocks = halves.reshape(k // 16, -1, cout // 8, 2, 8, 8)  # [s][plane][g][h][n][p % 8]
    stage, group, half, row, position = np.meshgrid(
        np.arange(k // 16), np.arange(cout // 8), np.arange(2), np.arange(8), np.arange(8),
        indexing="ij",
    )  # fmt: skip
    p = 8 * half + position
    channel = 16 * stage + 4 * (p % 8 // 2) + 2 * (p // 8) + p % 2
    planes = []
    for plane in range(blocks.shape[1]):
        out = np.empty((k, cout))
        out[channel, 8 * group + row] = blocks[:, plane][stage, group, half, row, position]
        planes.append(out)
    return tuple(planes)


@pytest.mark.parametrize(
    "site", [s for s in TrunkSite if s.shape.strip and s is not TrunkSite.STEM]
)
def test_the_warpgroup_layout_holds_the_same_halves(site: TrunkSite) -> None:
    """The wgmma kernels' weights (`packed(..., warpgroups=True)`) carry the same FP16
    high and low parts at the same channel and column as the mma.sync kernels'."""
    shape = site.shape
    rng = np.random.default_rng(5)
    conv = FoldedConv.of(site, rng.normal(size=shape.weight_shape), np.zeros(shape.cout))
    high, low = unpack_halves(conv.packed(), shape.k, shape.cout)
    split = conv.packed(True, warpgroups=True)
    assert split.dtype == np.float32 and split.size == conv.packed().size
    assert all(
        np.array_equal(a, b)
        for a, b in zip(
            unpack_warpgroup_halves(split, shape.k, shape.cout), (high, low), strict=True
        )
    )
    (only_high,) = unpack_warpgroup_halves(conv.packed(False, warpgroups=True), shape.k, shape.cout)
    assert np.array_equal(only_high, high)
    assert site.on_warpgroups(PtxTier.SM90) and not site.on_warpgroups(PtxTier.SM80)


def test_only_the_3x3s_run_on_warpgroups() -> None:
    assert {s for s in TrunkSite if s.on_warpgroups(PtxTier.SM90)} == {
        TrunkSite.LAYER1_CONV,
        TrunkSite.LAYER2_CONV,
        TrunkSite.LAYER3_CONV,
        TrunkSite.LAYER4_CONV,
        TrunkSite.LAYER2_DOWN,
        TrunkSite.LAYER3_DOWN,
        TrunkSite.LAYER4_DOWN,
    }
    assert not any(s.on_warpgroups(PtxTier.SM80) for s in TrunkSite)


def test_the_stem_packs_fp32_taps() -> None:
    site = TrunkSite.STEM
    weight = np.random.default_rng(3).normal(size=site.shape.weight_shape)
    packed = FoldedConv.of(site, weight, np.ones(32)).packed().reshape(3, 3, 32)
    assert packed[2, 1, 5] == np.float32(weight[5, 0, 2, 1])
    assert (FoldedConv.of(site, weight, np.ones(32)).packed_bias() == 1).all()


def test_zero_columns_keep_a_unit_scale() -> None:
    site = TrunkSite.LAYER1_CONV
    conv = FoldedConv.of(site, np.zeros(site.shape.weight_shape), np.zeros(32))
    assert (conv.column_shifts() == 0).all() and not conv.packed().view(np.uint32).any()
    assert (conv.packed_bias()[32:] == 1).all()


def test_folded_weights_are_checked() -> None:
    site = TrunkSite.LAYER1_CONV
    good = np.zeros(site.shape.weight_shape)
    with pytest.raises(GeometryInvalid, match="layer1_conv"):
        FoldedConv.of(site, good[:, :, :1], np.zeros(32))
    with pytest.raises(WeightsOutOfContract, match="weight"):
        FoldedConv.of(site, np.full(site.shape.weight_shape, 1e39), np.zeros(32))
    zero_var = BatchNorm(np.ones(32), np.zeros(32), np.zeros(32), np.zeros(32), 0.0)
    with pytest.raises(WeightsOutOfContract):
        FoldedConv.fold(site, np.ones(site.shape.weight_shape), zero_var)
    weights = TrunkWeights.random(0)
    with pytest.raises(GeometryInvalid, match="16 blocks"):
        TrunkWeights(weights.stem, weights.blocks[:-1])
    swapped = Block(weights.blocks[3].conv2, weights.blocks[3].conv1, weights.blocks[3].shortcut)
    with pytest.raises(GeometryInvalid, match="block 3"):
        TrunkWeights(weights.stem, (*weights.blocks[:3], swapped, *weights.blocks[4:]))


def test_the_float64_trunk_is_the_models() -> None:
    """`reference.trunk` on `trunk_weights(resnet)` against the stock module in float64."""
    torch = pytest.importorskip("torch")
    importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")
    from pyannote.audio.models.embedding.wespeaker.resnet import ResNet34

    from pyspk.torch.resnet import trunk_weights

    torch.manual_seed(0)
    resnet = ResNet34(80, 256).eval()
    for module in resnet.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.1)
            module.running_var.uniform_(0.5, 2)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.normal_(0, 0.1)
    fbank = torch.randn(1, 998, 80, dtype=torch.float64)
    with torch.no_grad():
        expected = resnet.double().forward_frames(fbank.clone()).numpy()
    got = reference.trunk(fbank.numpy(), trunk_weights(resnet))
    assert got.shape == (1, *OUTPUT_SHAPE)
    assert np.abs(got - expected).max() <= 1e-12 * np.abs(expected).max()


def test_each_packed_form_is_packed_once_and_kept_read_only() -> None:
    """A trunk's two plans upload the same packed weights: the second call of a form
    returns the first's array, which cannot be written, and the forms stay apart."""
    conv = next(c for c in TrunkWeights.random(5).convs() if c.site is TrunkSite.LAYER2_CONV)
    first = conv.packed(True, warpgroups=True)
    assert conv.packed(True, warpgroups=True) is first
    assert not first.flags.writeable
    with pytest.raises(ValueError):
        first[0] = 0.0
    fresh = FoldedConv.of(conv.site, conv.weight, conv.bias)
    assert np.array_equal(
        first.view(np.uint32), fresh.packed(True, warpgroups=True).view(np.uint32)
    )
    assert conv.packed(False, warpgroups=True).size == first.size // 2
    assert conv.packed(True).view(np.uint32).tolist() != first.view(np.uint32).tolist()
    # the columns' shifts and the packed bias the same way (each plan reads both)
    for name in ("column_shifts", "packed_bias"):
        kept = getattr(conv, name)()
        assert getattr(conv, name)() is kept and not kept.flags.writeable
        assert np.array_equal(kept, getattr(fresh, name)())


def test_two_threads_packing_one_convolution_get_the_same_words() -> None:
    """Two plans built in two threads at once pack the same `FoldedConv`: each gets the
    one form's words (a race may pack twice, never hand out a partial array), and one
    array is kept for later calls."""
    import threading

    conv = next(c for c in TrunkWeights.random(6).convs() if c.site is TrunkSite.LAYER4_CONV)
    fresh = FoldedConv.of(conv.site, conv.weight, conv.bias)
    expected = fresh.packed(True, warpgroups=True)
    start = threading.Barrier(2)
    got: list[np.ndarray] = []
    biases: list[np.ndarray] = []  # each plan uploads the bias too (its columns' scales)

    def pack() -> None:
        start.wait()
        got.append(conv.packed(True, warpgroups=True))
        biases.append(conv.packed_bias())

    threads = [threading.Thread(target=pack) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 2
    for words in got:
        assert np.array_equal(words.view(np.uint32), expected.view(np.uint32))
    assert conv.packed(True, warpgroups=True) is conv.packed(True, warpgroups=True)
    assert len(biases) == 2
    for bias in biases:
        assert np.array_equal(bias, fresh.packed_bias())
