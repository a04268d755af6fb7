"""The segdense host packing for the tensor-core kernels (`round_tf32` and the mma
fragment packs of the convolutions and GEMMs), checked without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.candidate.segdense.packing import (
    half_scale,
    pack_conv_half,
    pack_conv_mma,
    pack_conv_rows,
    pack_gemm_half,
    pack_gemm_mma,
    round_tf32,
)
from tests.float_bits import float32_bits

# -- the tensor-core convolution pack ---------------------------------------------------


def test_round_tf32_rounds_to_nearest_ties_away() -> None:
    one = 1.0
    step = 2.0**-10  # TF32 spacing in [1, 2)
    values = np.array(
        [one + step / 2, one + step / 2 - 2**-23, -(one + step / 2), one + 3 * step / 2, 0.0],
        np.float32,
    )
    expected = np.array([one + step, one, -(one + step), one + 2 * step, 0.0], np.float32)
    assert np.array_equal(round_tf32(values), expected)
    assert np.all(
        (float32_bits(round_tf32(np.random.default_rng(0).standard_normal(99))) & 0x1FFF) == 0
    )
    assert np.isinf(round_tf32(np.float32(np.finfo(np.float32).max)))
    # an add alone would carry the all-ones NaNs into the sign bit: 0x7fffffff -> -0
    nans = np.array([0x7FFF_FFFF, 0xFFFF_FFFF, 0x7FC0_0000], np.uint32).view(np.float32)
    assert np.all(np.isnan(round_tf32(nans)))


@pytest.mark.parametrize(("cin", "cin_pad"), [(80, 80), (60, 64)])
def test_pack_conv_mma_places_each_weight_in_its_fragment(cin: int, cin_pad: int) -> None:
    """Reading the packed planes back as mma.m16n8k8 A fragments (register e of lane l:
    row l / 4 + 8 (e % 2), column l % 4 + 4 (e / 2)) gives the [64, cin_pad * 5] weight,
    zero-padded, in TF32 plus its TF32 residual."""
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((60, cin, 5)).astype(np.float32)
    packed = pack_conv_mma(weight, cin, cin_pad, 2).reshape(2, -1, 4, 32, 4)
    k_pad = cin_pad * 5
    restored = np.zeros((2, 64, k_pad), np.float32)
    for step in range(k_pad // 8):
        for tile in range(4):
            for lane in range(32):
                for e in range(4):
                    row = tile * 16 + lane // 4 + 8 * (e % 2)
                    col = step * 8 + lane % 4 + 4 * (e // 2)
                    restored[:, row, col] = packed[:, step, tile, lane, e]
    full = np.zeros((64, k_pad), np.float32)
    full[:60, : cin * 5] = weight.reshape(60, -1)
    high = round_tf32(full)
    assert np.array_equal(restored[0], high)
    assert np.array_equal(restored[1], round_tf32(full - high))
    # the split carries about 22 bits: the residual's own rounding error is below 2^-22
    error = np.abs(full.astype(np.float64) - restored[0] - restored[1])
    assert np.all(error <= 2.0**-22 * np.abs(full))
    assert np.array_equal(pack_conv_mma(weight, cin, cin_pad, 1), packed[0].reshape(-1))


@pytest.mark.parametrize(("cin", "cin_pad"), [(80, 80), (60, 64)])
def test_pack_conv_half_places_each_scaled_pair_in_its_fragment(cin: int, cin_pad: int) -> None:
    """Reading the words back as mma.m16n8k16 A fragments (register e of lane l: row
    l / 4 + 8 (e % 2), input channels 2 (l % 4) + 8 (e / 2) and the next, low half
    first, of one stage of 16 and one tap) gives each channel's weights times its power
    of two, rounded to FP16, zero-padded; the 64 inverse scales follow."""
    rng = np.random.default_rng(8)
    weight = rng.standard_normal((60, cin, 5)).astype(np.float32)
    weight[7] *= np.float32(2.0**-30)  # a channel far below the others keeps its bits
    packed = pack_conv_half(weight, cin, cin_pad)
    words = packed[: cin_pad * 5 * 32].view(np.uint32).reshape(cin_pad // 16, 5, 4, 32, 4)
    inverse = packed[cin_pad * 5 * 32 :]
    assert inverse.shape == (64,) and np.all(inverse[60:] == 1)
    restored = np.full((64, cin_pad, 5), np.nan, np.float32)
    for stage, tap, tile, lane, e in np.ndindex(*words.shape):
        row = tile * 16 + lane // 4 + 8 * (e % 2)
        ci = stage * 16 + 2 * (lane % 4) + 8 * (e // 2)
        pair = np.array([words[stage, tap, tile, lane, e]], np.uint32).view(np.float16)
        restored[row, ci : ci + 2, tap] = pair.astype(np.float32)
    scale, expected_inverse = half_scale(np.abs(weight).reshape(60, -1).max(axis=1))
    assert np.array_equal(inverse[:60], expected_inverse)
    full = np.zeros((64, cin_pad, 5), np.float32)
    full[:60, :cin] = weight * scale[:, None, None]
    assert np.array_equal(restored, full.astype(np.float16).astype(np.float32))
    assert np.all(np.abs(full[:60]).max(axis=(1, 2)) < 2.0**15)
    # each weight within FP16's half ulp of its scaled value: 11 significant bits
    unscaled = restored[:60, :cin] * inverse[:60, None, None]
    assert np.all(np.abs(unscaled - weight) <= 2.0**-11 * np.abs(weight))
    with pytest.raises(ValueError, match="cin_pad a multiple of 16"):
        pack_conv_half(weight, cin, 72)
    with pytest.raises(ValueError, match="pack_conv_half weight has shape"):
        pack_conv_half(weight, cin + 1, 96)


@pytest.mark.parametrize("cin", [80, 60])
def test_pack_conv_rows_gives_each_channel_group_its_float4s(cin: int) -> None:
    """Thread tile cg of the SIMT convolutions reads channels 15 cg + 4 q + {0..3} as
    the float4 at column 16 q + 4 cg of every row (q = 3: three channels, then zero)."""
    rng = np.random.default_rng(6)
    weight = rng.standard_normal((60, cin, 5)).astype(np.float32)
    packed = pack_conv_rows(weight, cin).reshape(cin * 5, 64)
    by_k = weight.reshape(60, -1).T
    for cg in range(4):
        for q in range(4):
            quad = packed[:, 16 * q + 4 * cg : 16 * q + 4 * cg + 4]
            channels = range(15 * cg + 4 * q, 15 * cg + min(4 * q + 4, 15))
            assert np.array_equal(quad[:, : len(channels)], by_k[:, list(channels)])
            assert not quad[:, len(channels) :].any()
    # every weight exactly once, nothing else
    assert np.array_equal(np.sort(packed[packed != 0]), np.sort(weight[weight != 0]))
    assert np.array_equal(pack_conv_rows(weight.reshape(60, -1), cin), packed.reshape(-1))
    with pytest.raises(ValueError, match="pack_conv_rows weight has shape"):
        pack_conv_rows(weight, cin + 1)


@pytest.mark.parametrize("paired", [False, True])
def test_pack_gemm_mma_pairs_each_weight_with_the_x_column_the_kernel_reads(paired: bool) -> None:
    """Read back as the GEMM kernels read it: lane l = 4 g + q takes, for mma tile 2 p + h
    of a column tile, registers 2 h (k-slot q) and 2 h + 1 (k-slot q + 4) of its float4,
    at column 16 p + 8 h + g; a k-slot multiplies x's column q (q + 4), or 2 q (2 q + 1)
    where x is read in pairs. Every weight lands once, in TF32 plus its residual."""
    k, n, cols = 24, 64, 32
    weight = np.random.default_rng(7).standard_normal((k, n)).astype(np.float32)
    packed = pack_gemm_mma(weight, n, k, cols, 2, paired).reshape(
        n // cols, k // 8, cols // 16, 2, 32, 4
    )
    restored = np.full((2, k, n), np.nan, np.float32)
    for tile, step, pair, lane, e in np.ndindex(n // cols, k // 8, cols // 16, 32, 4):
        q, g = lane % 4, lane // 4
        x_column = 2 * q + e % 2 if paired else q + 4 * (e % 2)
        col = tile * cols + pair * 16 + 8 * (e // 2) + g
        restored[:, step * 8 + x_column, col] = packed[tile, step, pair, :, lane, e]
    high = round_tf32(weight)
    assert np.array_equal(restored[0], high)
    assert np.array_equal(restored[1], round_tf32(weight - high))
    one_plane = pack_gemm_mma(weight, n, k, cols, 1, paired)
    assert np.array_equal(one_plane, packed[:, :, :, 0].reshape(-1))


def test_pack_gemm_mma_refuses_bad_shapes() -> None:
    weight = np.zeros((16, 64), np.float32)
    with pytest.raises(ValueError, match="1 or 2 planes"):
        pack_gemm_mma(weight, 64, 16, 32, 3)
    with pytest.raises(ValueError, match="cols a multiple of 16 dividing n"):
        pack_gemm_mma(weight, 64, 16, 24, 1)
    with pytest.raises(ValueError, match="k a multiple of 8"):
        pack_gemm_mma(np.zeros((12, 64), np.float32), 64, 12, 32, 1)
    with pytest.raises(ValueError, match=r"expected \(16, 64\)"):
        pack_gemm_mma(np.zeros((64, 16), np.float32), 64, 16, 32, 1)


def test_pack_gemm_half_places_each_scaled_pair_in_its_fragment() -> None:
    """Read back as the FP16 GEMMs read it: lane l = 4 g + q takes, for mma tile 2 p + h of
    a column tile, registers 2 h (b0: rows 2 q, 2 q + 1 of the k-step) and 2 h + 1 (b1:
    rows 2 q + 8, 2 q + 9), low half first, at column 16 p + 8 h + g. Every weight lands
    once, times its column's power of two and rounded to FP16; the rows listed to be
    zeroed are zero and set no scale; the n inverse scales follow."""
    k, n, cols = 48, 64, 32
    weight = np.random.default_rng(9).standard_normal((k, n)).astype(np.float32)
    weight[:, 5] *= np.float32(2.0**-30)  # a column far below the others keeps its bits
    zeroed = [3, 40]
    weight[40, 9] = 1e6  # a zeroed row's huge value must not set its column's scale
    packed = pack_gemm_half(weight, n, k, cols, zeroed)
    words = packed[: k * n // 2].view(np.uint32).reshape(n // cols, k // 16, cols // 16, 32, 4)
    inverse = packed[k * n // 2 :]
    restored = np.full((k, n), np.nan, np.float32)
    for tile, step, pair, lane, e in np.ndindex(*words.shape):
        q, g = lane % 4, lane // 4
        row = step * 16 + 2 * q + 8 * (e % 2)
        col = tile * cols + pair * 16 + 8 * (e // 2) + g
        halves = np.array([words[tile, step, pair, lane, e]], np.uint32).view(np.float16)
        restored[row : row + 2, col] = halves.astype(np.float32)
    kept = weight.copy()
    kept[zeroed] = 0
    scale, expected_inverse = half_scale(np.abs(kept).max(axis=0))
    assert np.array_equal(inverse, expected_inverse)
    full = kept * scale[None, :]
    assert np.array_equal(restored, full.astype(np.float16).astype(np.float32))
    assert np.all(np.abs(full).max(axis=0) < 2.0**15)
    unscaled = restored * inverse[None, :]
    assert np.all(np.abs(unscaled - kept) <= 2.0**-11 * np.abs(kept))
    assert np.array_equal(pack_gemm_half(weight.reshape(-1), n, k, cols, zeroed), packed)


def test_pack_gemm_half_refuses_bad_shapes() -> None:
    weight = np.zeros((32, 64), np.float32)
    with pytest.raises(ValueError, match="cols a multiple of 16 dividing n"):
        pack_gemm_half(weight, 64, 32, 24)
    with pytest.raises(ValueError, match="k a multiple of 16"):
        pack_gemm_half(np.zeros((24, 64), np.float32), 64, 24, 32)
    with pytest.raises(ValueError, match=r"expected \(32, 64\)"):
        pack_gemm_half(np.zeros((64, 32), np.float32), 64, 32, 32)


def test_pack_conv_mma_refuses_bad_shapes() -> None:
    weight = np.zeros((60, 80, 5), np.float32)
    with pytest.raises(ValueError, match="cin_pad a multiple of 8"):
        pack_conv_mma(weight, 80, 84, 1)
    with pytest.raises(ValueError, match="1 or 2 planes"):
        pack_conv_mma(weight, 80, 80, 3)
    with pytest.raises(ValueError, match=r"expected \(60, 60, 5\)"):
        pack_conv_mma(weight, 60, 64, 1)
