"""The segdense host packing of scaled FP16 weight columns (`pack_half_columns`) and
the rows the linear0 select kernel recomputes (`selected_rows`), checked without a GPU
against numpy's IEEE float16 conversion and plain-Python references."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from pyspk.candidate.segdense.packing import half_scale, pack_half_columns, selected_rows
from pyspk.candidate.segdense.shapes import SELECT_ROWS
from tests.float_bits import ieee_half_bits

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
        assert np.array_equal(halves[col], ieee_half_bits(scaled)), col
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
    assert np.array_equal(halves, ieee_half_bits(weight * scale[:, None]))


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
