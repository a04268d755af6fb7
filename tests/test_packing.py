"""Host-side packing of reference/segdense.rs, checked without a GPU against numpy's IEEE
float16 conversion, a scalar transliteration of the Rust and plain-Python references."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from pyspk.candidate.segdense.packing import (
    f16_bits,
    half_scale,
    pack_conv_half,
    pack_conv_mma,
    pack_conv_rows,
    pack_gemm_half,
    pack_gemm_mma,
    pack_half_columns,
    round_tf32,
    selected_rows,
)
from pyspk.candidate.segdense.selection import (
    HALF_MIN_SPLITS,
    HALF_SHARED,
    HALF_SLICE,
    HALF_STAGE,
    SELECT_ROWS,
)

F32_TINY = float(np.finfo(np.float32).tiny)


def _floats(bits: np.ndarray | list[int]) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def _bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def _ieee_half_bits(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(np.float16).view(np.uint16)


def _assert_matches_ieee(values: np.ndarray) -> int:
    """f16_bits equals numpy's IEEE conversion except for NaN payloads, where both must
    be NaN of the input's sign and ours the fixed 0x7e00; returns the NaN count."""
    values = np.asarray(values, dtype=np.float32)
    ours = f16_bits(values)
    assert ours.dtype == np.uint16
    assert ours.shape == values.shape
    ieee = _ieee_half_bits(values)
    nan = np.isnan(values)
    mismatch = np.flatnonzero((ours != ieee) & ~nan)
    assert mismatch.size == 0, [
        (hex(int(_bits(values)[i])), hex(int(ours[i])), hex(int(ieee[i]))) for i in mismatch[:8]
    ]
    sign = (_bits(values[nan]) >> 31).astype(np.uint16)
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
    nans = _assert_matches_ieee(_floats(bits))
    assert nans > 10_000  # the NaN branch really ran


def test_f16_bits_rounding_classes_at_every_exponent() -> None:
    # every sign, FP32 exponent and kept 10-bit mantissa, with the 13 dropped bits at
    # zero, just above zero, just below, at and just above the half-way tie, and all ones
    sign = np.array([0, 1], dtype=np.uint32)[:, None, None, None] << 31
    exponent = np.arange(256, dtype=np.uint32)[None, :, None, None] << 23
    kept = np.arange(1024, dtype=np.uint32)[None, None, :, None] << 13
    dropped = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF], dtype=np.uint32)
    bits = (sign | exponent | kept | dropped[None, None, None, :]).reshape(-1)
    _assert_matches_ieee(_floats(bits))


def test_f16_bits_around_the_half_subnormal_range() -> None:
    rng = np.random.default_rng(0x0F16)
    size = 2_000_000
    # magnitudes from 2^-30 to 2^-13, across the 2^-25 (half a step) and 2^-24 edges
    exponent = rng.integers(97, 115, size=size, dtype=np.uint32)
    mantissa = rng.integers(0, 2**23, size=size, dtype=np.uint32)
    sign = rng.integers(0, 2, size=size, dtype=np.uint32)
    _assert_matches_ieee(_floats((sign << 31) | (exponent << 23) | mantissa))

    # a few hundred float32 neighbours of every boundary in that range
    edges = [2.0**-26, 2.0**-25, 1.5 * 2.0**-25, 2.0**-24, 3 * 2.0**-25, 2.0**-15, 2.0**-14]
    edges.append((1 - 2.0**-11) * 2.0**-14)  # tie between the largest subnormal and 2^-14
    centres = _bits(np.array(edges, dtype=np.float32)).astype(np.int64)
    near = (centres[:, None] + np.arange(-300, 301)[None, :]).reshape(-1).astype(np.uint32)
    _assert_matches_ieee(_floats(np.concatenate([near, near | np.uint32(0x8000_0000)])))


def test_f16_bits_exact_ties_go_to_even() -> None:
    # normal ties: a kept mantissa plus exactly half a half-ulp, for every half exponent
    exponent = np.arange(113, 143, dtype=np.uint32)[:, None] << 23
    kept = np.arange(1024, dtype=np.uint32)[None, :] << 13
    normal = (exponent | kept | np.uint32(0x1000)).reshape(-1)
    # subnormal ties: odd multiples of 2^-25, exactly between two steps of 2^-24
    subnormal = _bits(np.arange(1, 2048, 2, dtype=np.float32) * np.float32(2.0**-25))
    ties = np.concatenate([normal, subnormal])
    ties = np.concatenate([ties, ties | np.uint32(0x8000_0000)])
    _assert_matches_ieee(_floats(ties))
    _assert_matches_ieee(_floats(ties - 1))
    _assert_matches_ieee(_floats(ties + 1))

    # ties resolve to the even neighbour, in both ranges
    result = f16_bits(_floats(ties[: normal.size]))
    assert np.all(result & 1 == 0)
    steps = f16_bits(_floats(subnormal))
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
    near = _bits(np.array([65504.0, 65520.0, 65536.0], dtype=np.float32)).astype(np.int64)
    window = (near[:, None] + np.arange(-2000, 2001)[None, :]).reshape(-1).astype(np.uint32)
    _assert_matches_ieee(_floats(np.concatenate([window, window | np.uint32(0x8000_0000)])))


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
    result = f16_bits(_floats(subnormals))
    assert np.array_equal(result, (subnormals >> 16).astype(np.uint16) & 0x8000)
    _assert_matches_ieee(_floats(subnormals))


def test_f16_bits_nan_is_the_fixed_quiet_nan_with_its_sign() -> None:
    rng = np.random.default_rng(0xA7)
    payload = rng.integers(1, 2**23, size=100_000, dtype=np.uint32)
    payload[:4] = [1, 0x40_0000, 0x7F_FFFF, 0x1FFF]  # signalling, quiet, full, low bits only
    nans = np.concatenate([payload | np.uint32(0x7F80_0000), payload | np.uint32(0xFF80_0000)])
    result = f16_bits(_floats(nans))
    assert np.all(result[: payload.size] == 0x7E00)
    assert np.all(result[payload.size :] == 0xFE00)
    assert _assert_matches_ieee(_floats(nans)) == nans.size
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
    assert np.array_equal(f16_bits(_floats(bits)), expected)


def test_f16_bits_scalar_form_equals_array_form() -> None:
    rng = np.random.default_rng(0x5CA1)
    bits = rng.integers(0, 2**32, size=3000, dtype=np.uint32)
    specials = [0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0xFFC0_0001, 0, 0x8000_0000, 1, 0x477F_F000]
    bits[: len(specials)] = specials
    values = _floats(bits)
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
    assert np.array_equal(result, _ieee_half_bits(grid))
    strided = grid[:, ::2, ::-1]  # not contiguous
    assert np.array_equal(f16_bits(strided), _ieee_half_bits(np.ascontiguousarray(strided)))
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
    largest = _floats((exponent << 23) | mantissa)
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
    scale, inverse = half_scale(_floats(bits))
    for value in (scale, inverse):
        assert np.all(np.isfinite(value) & (value >= np.float32(F32_TINY)))
        mantissa = _bits(value) & 0x7F_FFFF
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


# ---- pack_half_columns -----------------------------------------------------------------


def _unpack(packed: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(half bits [n, k], inverse scales [n]) read back out of a packed buffer."""
    words = packed[: k // 2 * n].view(np.uint32).reshape(k // 2, n)
    halves = np.empty((n, k), dtype=np.uint16)
    halves[:, 0::2] = (words & 0xFFFF).T
    halves[:, 1::2] = (words >> 16).T
    return halves, packed[k // 2 * n :]


def _column_scale(column: np.ndarray) -> float:
    """The power of two putting max |column| in [2^14, 2^15), found independently with
    frexp (valid away from the clamps)."""
    _, exponent = math.frexp(float(np.max(np.abs(column))))
    return 2.0 ** (15 - exponent)


def _varied_weight(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    weight = rng.standard_normal((n, k)).astype(np.float32)
    weight *= np.exp2(rng.integers(-60, 40, size=(n, 1))).astype(np.float32)
    # values far below a column's largest land in the half subnormal range or flush
    weight[:, 3] *= np.float32(2.0**-20)
    weight[:, 5] *= np.float32(2.0**-27)
    return weight


def test_pack_half_columns_decodes_to_the_scaled_weight_column_by_column() -> None:
    rng = np.random.default_rng(0xFACC)
    n, k = 24, 64
    weight = _varied_weight(rng, n, k)
    packed = pack_half_columns(weight, n, k)
    assert packed.dtype == np.float32 and packed.shape == (k // 2 * n + n,)
    halves, inverses = _unpack(packed, n, k)
    for col in range(n):
        scale = _column_scale(weight[col])
        assert inverses[col] == np.float32(1 / scale)
        scaled = weight[col] * np.float32(scale)
        assert np.array_equal(halves[col], _ieee_half_bits(scaled)), col
        decoded = halves[col].view(np.float16).astype(np.float32) / np.float32(scale)
        expected = scaled.astype(np.float16).astype(np.float32) / np.float32(scale)
        assert np.array_equal(decoded, expected)
        assert np.allclose(decoded, weight[col], rtol=2.0**-11, atol=2.0**-24 / scale)


def test_pack_half_columns_word_layout() -> None:
    weight = np.array([[1.0, 2.0, 3.0, 4.0], [0.5, -0.25, 0.0, 8.0]], dtype=np.float32)
    words = pack_half_columns(weight, 2, 4).view(np.uint32)
    # column 0: largest 4 -> s = 2^12, halves 2^12 (0x6c00) and 2^13 (0x7000), then 3, 4
    # column 1: largest 8 -> s = 2^11, halves 2^10 (0x6400), -2^9 (0xe000), 0, 2^14
    assert [hex(w) for w in words[:4]] == ["0x70006c00", "0xe0006400", "0x74007200", "0x74000000"]
    assert words[4:].view(np.float32).tolist() == [2.0**-12, 2.0**-11]


def test_pack_half_columns_accepts_flat_and_2d_weights() -> None:
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((8, 10)).astype(np.float32)
    flat = pack_half_columns(weight.reshape(-1), 8, 10)
    assert np.array_equal(flat.view(np.uint32), pack_half_columns(weight, 8, 10).view(np.uint32))
    as_list = pack_half_columns(weight.tolist(), 8, 10)
    assert np.array_equal(flat.view(np.uint32), as_list.view(np.uint32))


def test_pack_half_columns_special_columns() -> None:
    weight = np.ones((4, 6), dtype=np.float32)
    weight[0] = 0.0  # all zero: the clamped scale 2^126
    weight[1, 2] = np.nan  # NaN is skipped by the column maximum, as f32::max skips it
    weight[2, 4] = np.inf  # infinity sets the column's scale to the clamped 2^-113
    weight[3] = [-0.0, 0.0, -1.0, 1.0, 2.0**-30, -(2.0**-40)]
    halves, inverses = _unpack(pack_half_columns(weight, 4, 6), 4, 6)
    assert inverses.tolist() == [2.0**-126, 2.0**-14, 2.0**113, 2.0**-14]
    assert np.all(halves[0] == 0)
    assert halves[1].tolist() == [0x7400, 0x7400, 0x7E00, 0x7400, 0x7400, 0x7400]
    # 1 * 2^-113 is far below the half range: finite weights beside an infinity flush
    assert halves[2].tolist() == [0, 0, 0, 0, 0x7C00, 0]
    # 2^-30 * 2^14 = 2^-16 is the half subnormal 0x100; -2^-40 * 2^14 flushes to -0
    assert halves[3].tolist() == [0x8000, 0, 0xF400, 0x7400, 0x0100, 0x8000]


def test_pack_half_columns_embedding_weight_timing() -> None:
    rng = np.random.default_rng(0xE4B)
    n, k = 256, 5120
    weight = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    pack_half_columns(weight, n, k)  # warm-up
    seconds = []
    for _ in range(5):
        start = time.perf_counter()
        packed = pack_half_columns(weight, n, k)
        seconds.append(time.perf_counter() - start)
    # measured, never asserted; shown with `pytest -rP`
    print(f"pack_half_columns 256 x 5120: median {np.median(seconds) * 1e3:.2f} ms")

    halves, inverses = _unpack(packed, n, k)
    largest = np.max(np.abs(weight), axis=1)
    scale, inverse = half_scale(largest)
    assert np.array_equal(inverses, inverse)
    assert np.array_equal(halves, _ieee_half_bits(weight * scale[:, None]))


@pytest.mark.parametrize(
    ("weight", "n", "k", "match"),
    [
        (np.zeros(12, np.float32), 4, 3, "even k"),
        (np.zeros(0, np.float32), 4, 0, "even k"),
        (np.zeros(12, np.float32), 0, 12, "n >= 1"),
        (np.zeros(11, np.float32), 2, 6, "11 values, expected 2 x 6 = 12"),
        (np.zeros(13, np.float32), 2, 6, "13 values"),
        (np.zeros((6, 2), np.float32), 2, 6, r"shape \(6, 2\), expected \(2, 6\)"),
        (np.zeros((2, 2, 3), np.float32), 2, 6, "1-D or 2-D"),
    ],
)
def test_pack_half_columns_rejects_bad_shapes(
    weight: np.ndarray, n: int, k: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        pack_half_columns(weight, n, k)


# ---- selected_rows ---------------------------------------------------------------------


def _reference_rows(weight: np.ndarray, count: int) -> list[int]:
    """Plain-Python selection: each row's squares added left to right in float64 (the
    square of a float32 is exact in float64), highest first, lower index on ties."""
    energy = []
    for row in weight:
        total = 0.0
        for value in row:
            exact = float(value)
            total += exact * exact
        energy.append(total)
    ranked = sorted(range(len(energy)), key=lambda index: (-energy[index], index))
    return sorted(ranked[:count])


def test_selected_rows_linear0_weight_matches_reference() -> None:
    rng = np.random.default_rng(0x11)
    for trial in range(5):
        weight = (rng.standard_normal((256, 128)) * rng.uniform(0.01, 1.0)).astype(np.float32)
        rows = selected_rows(weight, 128, SELECT_ROWS)
        assert rows.dtype == np.uint32 and rows.shape == (SELECT_ROWS,)
        assert rows.tolist() == _reference_rows(weight, SELECT_ROWS), trial
        assert np.all(np.diff(rows.astype(np.int64)) > 0)


def test_selected_rows_uses_sequential_sums_for_near_ties() -> None:
    # permutations of one row have the same exact energy but different rounded
    # sequential sums; numpy's pairwise sum would rank them differently
    rng = np.random.default_rng(0x7E)
    base = (rng.standard_normal(128) * np.exp2(rng.integers(-8, 8, 128))).astype(np.float32)
    weight = np.stack([rng.permutation(base) for _ in range(64)])
    expected = _reference_rows(weight, SELECT_ROWS)
    assert selected_rows(weight, 128, SELECT_ROWS).tolist() == expected

    pairwise = np.sum(np.square(weight.astype(np.float64)), axis=1)
    by_pairwise = sorted(sorted(range(64), key=lambda i: (-pairwise[i], i))[:SELECT_ROWS])
    assert by_pairwise != expected  # the seed makes the two orders disagree


def test_selected_rows_ties_go_to_the_lower_index() -> None:
    weight = np.zeros((8, 2), dtype=np.float32)
    weight[[1, 3, 4, 6]] = [[3, 4], [4, 3], [-5, 0], [0, 5]]  # all energy 25
    weight[7] = [1, 1]
    assert selected_rows(weight, 2, 2).tolist() == [1, 3]
    assert selected_rows(weight, 2, 3).tolist() == [1, 3, 4]
    assert selected_rows(weight, 2, 5).tolist() == [1, 3, 4, 6, 7]
    # the all-zero rows tie too: the lowest zero rows are taken
    assert selected_rows(weight, 2, 7).tolist() == [0, 1, 2, 3, 4, 6, 7]
    assert selected_rows(weight, 2, 5).tolist() == _reference_rows(weight, 5)


def test_selected_rows_count_beyond_k_and_zero() -> None:
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((5, 4)).astype(np.float32)
    # Rust's take(count) stops at the end of the rows
    assert selected_rows(weight, 4, 5).tolist() == [0, 1, 2, 3, 4]
    assert selected_rows(weight, 4, 100).tolist() == [0, 1, 2, 3, 4]
    assert selected_rows(weight, 4, 0).tolist() == []
    assert selected_rows(weight.reshape(-1), 4, 3).tolist() == _reference_rows(weight, 3)
    assert selected_rows(np.zeros(0, np.float32), 4, 3).tolist() == []


def test_selected_rows_ranks_nan_and_infinity_first_like_total_cmp() -> None:
    weight = np.ones((6, 3), dtype=np.float32)
    weight[4, 1] = np.inf
    weight[2, 0] = np.nan  # a positive NaN sorts above +inf under f64::total_cmp
    assert selected_rows(weight, 3, 1).tolist() == [2]
    assert selected_rows(weight, 3, 2).tolist() == [2, 4]


@pytest.mark.parametrize(
    ("weight", "n", "count", "match"),
    [
        (np.zeros(8, np.float32), 0, 1, "n >= 1"),
        (np.zeros(8, np.float32), 4, -1, "count >= 0"),
        (np.zeros(10, np.float32), 4, 1, "whole rows of n=4"),
        (np.zeros((4, 3), np.float32), 4, 1, r"expected \(k, 4\)"),
        (np.zeros((2, 2, 2), np.float32), 4, 1, "whole rows"),
    ],
)
def test_selected_rows_rejects_bad_shapes(
    weight: np.ndarray, n: int, count: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        selected_rows(weight, n, count)


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
    assert np.all((_bits(round_tf32(np.random.default_rng(0).standard_normal(99))) & 0x1FFF) == 0)
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
