"""The FP16 conversion of the segdense packing (`f16_bits`, `half_scale`) and its
constants, checked without a GPU against numpy's IEEE float16 conversion and a scalar
transliteration of the Rust reference."""

from __future__ import annotations

import math

import numpy as np

from pyspk.candidate.segdense.packing import f16_bits, half_scale
from pyspk.candidate.segdense.shapes import (
    HALF_MIN_SPLITS,
    HALF_SHARED,
    HALF_SLICE,
    HALF_STAGE,
    SELECT_ROWS,
)
from tests.float_bits import float32_bits, float32_of_bits, ieee_half_bits

F32_TINY = float(np.finfo(np.float32).tiny)


def _assert_matches_ieee(values: np.ndarray) -> int:
    """f16_bits equals numpy's IEEE conversion except for NaN payloads, where both must
    be NaN of the input's sign and ours the fixed 0x7e00; returns the NaN count."""
    values = np.asarray(values, dtype=np.float32)
    ours = f16_bits(values)
    assert ours.dtype == np.uint16
    assert ours.shape == values.shape
    ieee = ieee_half_bits(values)
    nan = np.isnan(values)
    mismatch = np.flatnonzero((ours != ieee) & ~nan)
    assert mismatch.size == 0, [
        (hex(int(float32_bits(values)[i])), hex(int(ours[i])), hex(int(ieee[i])))
        for i in mismatch[:8]
    ]
    sign = (float32_bits(values[nan]) >> 31).astype(np.uint16)
    assert np.all(ours[nan] & 0x7FFF == 0x7E00)
    assert np.all(ours[nan] >> 15 == sign)
    assert np.all((ieee[nan] & 0x7C00 == 0x7C00) & (ieee[nan] & 0x3FF != 0))
    assert np.all(ieee[nan] >> 15 == sign)
    return int(nan.sum())


def _rust_f16_bits(bits: int) -> int:
    """Line-by-line transliteration of the Rust `f16_bits`, one value at a time."""

    def round_up(value: int, dropped: int, kept: int) -> bool:
        rest = value & ((1 << dropped) - 1)
        half = 1 << (dropped - 1)
        return rest > half or (rest == half and kept & 1 == 1)

    sign = (bits >> 16) & 0x8000
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7F_FFFF
    if exponent == 0xFF:
        return sign | 0x7C00 | (0 if mantissa == 0 else 0x200)
    half_exponent = exponent - 127 + 15
    if half_exponent >= 1:
        base = (half_exponent << 10) | (mantissa >> 13)
        rounded = base + int(round_up(mantissa, 13, base))
        return sign | min(rounded, 0x7C00)
    shift = 126 - exponent
    if exponent == 0 or shift > 24:
        return sign
    significand = mantissa | 0x80_0000
    steps = significand >> shift
    return sign | (steps + int(round_up(significand, shift, steps)))


# ---- constants -------------------------------------------------------------------------


def test_constants_follow_the_rust_expressions() -> None:
    assert (SELECT_ROWS, HALF_STAGE, HALF_SLICE) == (16, 32, 320)
    assert HALF_MIN_SPLITS == math.ceil((5120 / 32) / (320 / 32)) == 16
    # ring = 96 * 164 + 3 * 16 * 136 = 22272 outweighs the reduction's 12288 words
    assert HALF_SHARED == 4 * (96 + 22272) == 89472
    assert HALF_MIN_SPLITS * HALF_SLICE >= 5120


# ---- f16_bits --------------------------------------------------------------------------


def test_f16_bits_random_bit_patterns_over_the_whole_float32_range() -> None:
    rng = np.random.default_rng(0x5E6D)
    bits = rng.integers(0, 2**32, size=4_000_000, dtype=np.uint32)
    nans = _assert_matches_ieee(float32_of_bits(bits))
    assert nans > 10_000  # the NaN branch really ran


def test_f16_bits_rounding_classes_at_every_exponent() -> None:
    # every sign, FP32 exponent and kept 10-bit mantissa, with the 13 dropped bits at
    # zero, just above zero, just below, at and just above the half-way tie, and all ones
    sign = np.array([0, 1], dtype=np.uint32)[:, None, None, None] << 31
    exponent = np.arange(256, dtype=np.uint32)[None, :, None, None] << 23
    kept = np.arange(1024, dtype=np.uint32)[None, None, :, None] << 13
    dropped = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF], dtype=np.uint32)
    bits = (sign | exponent | kept | dropped[None, None, None, :]).reshape(-1)
    _assert_matches_ieee(float32_of_bits(bits))


def test_f16_bits_around_the_half_subnormal_range() -> None:
    rng = np.random.default_rng(0x0F16)
    size = 2_000_000
    # magnitudes from 2^-30 to 2^-13, across the 2^-25 (half a step) and 2^-24 edges
    exponent = rng.integers(97, 115, size=size, dtype=np.uint32)
    mantissa = rng.integers(0, 2**23, size=size, dtype=np.uint32)
    sign = rng.integers(0, 2, size=size, dtype=np.uint32)
    _assert_matches_ieee(float32_of_bits((sign << 31) | (exponent << 23) | mantissa))

    # a few hundred float32 neighbours of every boundary in that range
    edges = [2.0**-26, 2.0**-25, 1.5 * 2.0**-25, 2.0**-24, 3 * 2.0**-25, 2.0**-15, 2.0**-14]
    edges.append((1 - 2.0**-11) * 2.0**-14)  # tie between the largest subnormal and 2^-14
    centres = float32_bits(np.array(edges, dtype=np.float32)).astype(np.int64)
    near = (centres[:, None] + np.arange(-300, 301)[None, :]).reshape(-1).astype(np.uint32)
    _assert_matches_ieee(float32_of_bits(np.concatenate([near, near | np.uint32(0x8000_0000)])))


def test_f16_bits_exact_ties_go_to_even() -> None:
    # normal ties: a kept mantissa plus exactly half a half-ulp, for every half exponent
    exponent = np.arange(113, 143, dtype=np.uint32)[:, None] << 23
    kept = np.arange(1024, dtype=np.uint32)[None, :] << 13
    normal = (exponent | kept | np.uint32(0x1000)).reshape(-1)
    # subnormal ties: odd multiples of 2^-25, exactly between two steps of 2^-24
    subnormal = float32_bits(np.arange(1, 2048, 2, dtype=np.float32) * np.float32(2.0**-25))
    ties = np.concatenate([normal, subnormal])
    ties = np.concatenate([ties, ties | np.uint32(0x8000_0000)])
    _assert_matches_ieee(float32_of_bits(ties))
    _assert_matches_ieee(float32_of_bits(ties - 1))
    _assert_matches_ieee(float32_of_bits(ties + 1))

    # ties resolve to the even neighbour, in both ranges
    result = f16_bits(float32_of_bits(ties[: normal.size]))
    assert np.all(result & 1 == 0)
    steps = f16_bits(float32_of_bits(subnormal))
    assert np.array_equal(steps, (np.arange(1, 2048, 2) + 1) // 4 * 2)
    assert f16_bits(2.0**-25) == 0
    assert f16_bits(3 * 2.0**-25) == 2
    assert f16_bits(1 + 2.0**-11) == 0x3C00
    assert f16_bits(1 + 3 * 2.0**-11) == 0x3C02


def test_f16_bits_overflow_boundary() -> None:
    assert f16_bits(65504.0) == 0x7BFF
    assert f16_bits(np.nextafter(np.float32(65520.0), np.float32(0.0))) == 0x7BFF  # 65519.996
    assert f16_bits(65520.0) == 0x7C00  # the tie rounds to even, which is infinity
    assert f16_bits(-65520.0) == 0xFC00
    assert f16_bits(65536.0) == 0x7C00
    assert f16_bits(float(np.finfo(np.float32).max)) == 0x7C00
    assert f16_bits(1e300) == 0x7C00  # a Python float beyond float32 becomes infinity
    near = float32_bits(np.array([65504.0, 65520.0, 65536.0], dtype=np.float32)).astype(np.int64)
    window = (near[:, None] + np.arange(-2000, 2001)[None, :]).reshape(-1).astype(np.uint32)
    _assert_matches_ieee(float32_of_bits(np.concatenate([window, window | np.uint32(0x8000_0000)])))


def test_f16_bits_infinities_zeros_and_float32_subnormals() -> None:
    assert f16_bits(math.inf) == 0x7C00
    assert f16_bits(-math.inf) == 0xFC00
    assert f16_bits(0.0) == 0x0000
    assert f16_bits(-0.0) == 0x8000
    # every FP32 subnormal becomes a zero of its sign, as IEEE rounding gives anyway
    # (the largest is 2^-126, far under half the smallest half subnormal, 2^-25)
    rng = np.random.default_rng(0xD0)
    mantissa = rng.integers(1, 2**23, size=200_000, dtype=np.uint32)
    mantissa[:2] = [1, 2**23 - 1]
    subnormals = np.concatenate([mantissa, mantissa | np.uint32(0x8000_0000)])
    result = f16_bits(float32_of_bits(subnormals))
    assert np.array_equal(result, (subnormals >> 16).astype(np.uint16) & 0x8000)
    _assert_matches_ieee(float32_of_bits(subnormals))


def test_f16_bits_nan_is_the_fixed_quiet_nan_with_its_sign() -> None:
    rng = np.random.default_rng(0xA7)
    payload = rng.integers(1, 2**23, size=100_000, dtype=np.uint32)
    payload[:4] = [1, 0x40_0000, 0x7F_FFFF, 0x1FFF]  # signalling, quiet, full, low bits only
    nans = np.concatenate([payload | np.uint32(0x7F80_0000), payload | np.uint32(0xFF80_0000)])
    result = f16_bits(float32_of_bits(nans))
    assert np.all(result[: payload.size] == 0x7E00)
    assert np.all(result[payload.size :] == 0xFE00)
    assert _assert_matches_ieee(float32_of_bits(nans)) == nans.size
    assert f16_bits(math.nan) == 0x7E00
    assert f16_bits(-math.nan) == 0xFE00


def test_f16_bits_equals_a_scalar_transliteration_of_the_rust() -> None:
    rng = np.random.default_rng(0x2057)
    bits = rng.integers(0, 2**32, size=20_000, dtype=np.uint32)
    # bias half the sample towards the subnormal and overflow edges
    bits[10_000:] = (bits[10_000:] & np.uint32(0x807F_FFFF)) | (
        rng.integers(100, 145, size=10_000, dtype=np.uint32) << 23
    )
    expected = np.array([_rust_f16_bits(int(b)) for b in bits], dtype=np.uint16)
    assert np.array_equal(f16_bits(float32_of_bits(bits)), expected)


def test_f16_bits_scalar_form_equals_array_form() -> None:
    rng = np.random.default_rng(0x5CA1)
    bits = rng.integers(0, 2**32, size=3000, dtype=np.uint32)
    specials = [0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0xFFC0_0001, 0, 0x8000_0000, 1, 0x477F_F000]
    bits[: len(specials)] = specials
    values = float32_of_bits(bits)
    array = f16_bits(values)
    for value, expected in zip(values, array, strict=True):
        from_numpy = f16_bits(value)
        from_python = f16_bits(float(value))
        assert type(from_numpy) is int and type(from_python) is int
        assert from_numpy == from_python == int(expected)


def test_f16_bits_shapes_and_inputs() -> None:
    grid = np.linspace(-70000, 70000, 24, dtype=np.float32).reshape(2, 3, 4)
    result = f16_bits(grid)
    assert result.shape == (2, 3, 4) and result.dtype == np.uint16
    assert np.array_equal(result, ieee_half_bits(grid))
    strided = grid[:, ::2, ::-1]  # not contiguous
    assert np.array_equal(f16_bits(strided), ieee_half_bits(np.ascontiguousarray(strided)))
    zero_d = f16_bits(np.array(1.5, dtype=np.float32))
    assert isinstance(zero_d, np.ndarray) and zero_d.shape == () and int(zero_d) == 0x3E00
    assert f16_bits(np.array([], dtype=np.float32)).shape == (0,)
    # a float64 array is rounded to float32 first, as the Rust takes f32
    assert np.array_equal(f16_bits(np.array([0.1, 1e300])), f16_bits(np.float32([0.1, np.inf])))


def test_f16_bits_rounds_python_floats_to_float32_first() -> None:
    # 1 + 2^-11 + 2^-40 rounds to the tie 1 + 2^-11 in float32, which goes to even (1.0);
    # a direct float64 -> float16 rounding would give the next half up
    value = 1 + 2.0**-11 + 2.0**-40
    assert f16_bits(value) == 0x3C00
    assert np.float16(value).view(np.uint16) == 0x3C01


# ---- half_scale ------------------------------------------------------------------------


def test_half_scale_puts_every_normal_exponent_in_range() -> None:
    rng = np.random.default_rng(0x4A1F)
    exponent = np.repeat(np.arange(1, 255, dtype=np.uint32), 64)
    mantissa = rng.integers(0, 2**23, size=exponent.size, dtype=np.uint32)
    mantissa[::64] = 0
    mantissa[1::64] = 2**23 - 1
    largest = float32_of_bits((exponent << 23) | mantissa)
    scale, inverse = half_scale(largest)
    assert scale.dtype == inverse.dtype == np.float32
    assert scale.shape == inverse.shape == largest.shape

    scaled = largest.astype(np.float64) * scale.astype(np.float64)
    reachable = exponent >= 127 - 112  # shift 14 - e stays within the 126 clamp
    assert np.all((scaled[reachable] >= 2.0**14) & (scaled[reachable] < 2.0**15))
    assert np.all(scale[~reachable] == np.float32(2.0**126))
    assert np.all(scaled[~reachable] < 2.0**14)
    # the scaled largest magnitude stays finite (<= 2^15) in FP16 after rounding
    assert np.all(f16_bits(largest * scale)[reachable] <= 0x7800)
    assert np.all(scale * inverse == np.float32(1.0))


def test_half_scale_clamps_so_both_stay_normal() -> None:
    rng = np.random.default_rng(0xC1A)
    bits = rng.integers(0, 2**32, size=1_000_000, dtype=np.uint32)
    bits[:6] = [0, 0x8000_0000, 1, 0x7F80_0000, 0xFFC0_0000, 0x7F7F_FFFF]
    scale, inverse = half_scale(float32_of_bits(bits))
    for value in (scale, inverse):
        assert np.all(np.isfinite(value) & (value >= np.float32(F32_TINY)))
        mantissa = float32_bits(value) & 0x7F_FFFF
        assert np.all(mantissa == 0)  # powers of two
    assert np.all(scale * inverse == np.float32(1.0))

    assert half_scale(0.0) == (np.float32(2.0**126), np.float32(2.0**-126))
    assert half_scale(F32_TINY / 8) == (np.float32(2.0**126), np.float32(2.0**-126))
    assert half_scale(2.0**-112) == (np.float32(2.0**126), np.float32(2.0**-126))
    assert half_scale(2.0**-113) == (np.float32(2.0**126), np.float32(2.0**-126))
    assert half_scale(1.0) == (np.float32(2.0**14), np.float32(2.0**-14))
    assert half_scale(float(np.finfo(np.float32).max)) == (
        np.float32(2.0**-113),
        np.float32(2.0**113),
    )
    assert half_scale(math.inf) == (np.float32(2.0**-113), np.float32(2.0**113))
    assert half_scale(math.nan) == (np.float32(2.0**-113), np.float32(2.0**113))
    assert half_scale(-3.0) == half_scale(3.0)  # the sign bit is not read


def test_half_scale_scalar_form_equals_array_form() -> None:
    values = np.array([0.0, 1e-30, 0.02, 1.0, 3.0, 65504.0, 1e30, np.inf], dtype=np.float32)
    scales, inverses = half_scale(values)
    for value, scale, inverse in zip(values, scales, inverses, strict=True):
        got = half_scale(value)
        assert all(type(part) is np.float32 for part in got)
        assert got == (scale, inverse) == half_scale(float(value))
    zero_d = half_scale(np.array(3.0, dtype=np.float32))
    assert zero_d[0].shape == () and zero_d[0] == np.float32(2.0**13)
