"""Host-side weight preparation for the segdense kernels, in pure numpy.

Ports `f16_bits`, `round_up`, `half_scale`, `pack_half_columns` and `selected_rows`
of the Rust module pyspk is a port of, bit for bit, vectorised over whole arrays so a
256 x 5120 embedding weight packs in milliseconds; `round_tf32` and `pack_conv_mma`
emulate the device rounding and the `spk_segdense_pack_conv_mma` kernel, for its
bit-for-bit test; `pack_conv_half` and `pack_gemm_half` lay out the FP16 tensor-core
convolutions' and linears' weights.
"""

from __future__ import annotations

import functools
from typing import overload

import numpy as np
import numpy.typing as npt

from pyspk.candidate.framework import CONV_TAPS, SegConvSite
from pyspk.candidate.segdense.shapes import (
    CONV_PADDED,
    Conv,
    Fragments,
    Gemm,
    Kind,
    Split,
    SplitWeights,
    TensorConv,
    packs_on_host,
)
from pyspk.cuda.errors import InvalidArgument

__all__ = [
    "GATHER_COPY",
    "GATHER_RESIDUAL",
    "GATHER_TF32",
    "GATHER_ZERO",
    "f16_bits",
    "gather",
    "gather_map",
    "half_scale",
    "pack_conv_half",
    "pack_conv_mma",
    "pack_conv_rows",
    "pack_gemm_half",
    "pack_gemm_mma",
    "pack_half_columns",
    "pack_weight",
    "round_tf32",
    "selected_rows",
]

_U32 = np.uint32


def _float32(values: npt.ArrayLike) -> np.ndarray:
    """`values` as a C-ordered float32 array of the same shape (0-d stays 0-d); wider
    floats round to nearest and overflow to infinity, as Rust's `as f32` does."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float32, order="C")


def _round_up(value: np.ndarray, bits: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Whether dropping the low `bits` bits of `value`, leaving `kept`, rounds up under
    ties-to-even; `bits` must lie in 1..31 so no shift is out of range."""
    one = _U32(1)
    half = one << (bits - one)
    rest = value & ((one << bits) - one)
    return (rest > half) | ((rest == half) & ((kept & one) == one))


# |x| of the smallest FP32 that rounds as a normal half (2^-14), and of infinity
_HALF_NORMAL_BITS = 113 << 23
_INFINITY_BITS = 0x7F80_0000


def _half_subnormal(magnitude: np.ndarray) -> np.ndarray:
    """Half bits of FP32 magnitudes below 2^-14: steps of 2^-24, ties to even."""
    exponent = magnitude >> _U32(23)
    # FP32 subnormals (exponent 0) and anything under half a step (exponent < 102) -> 0;
    # the shift is clamped only so the lanes that give zero stay well defined
    shift = np.clip(np.int32(126) - exponent.astype(np.int32), 14, 24).astype(_U32)
    significand = (magnitude & _U32(0x7F_FFFF)) | _U32(0x80_0000)
    steps = significand >> shift
    steps += _round_up(significand, shift, steps)
    return np.where(exponent >= 102, steps, _U32(0))


def _f16_bits_array(values: npt.ArrayLike) -> np.ndarray:
    """binary16 bits of `values` (cast to float32), same shape, as uint16."""
    # computed on a 1-D view: numpy scalar arithmetic would warn on the uint32 wrap below
    floats = _float32(values)
    bits = floats.reshape(-1).view(_U32)
    magnitude = bits & _U32(0x7FFF_FFFF)

    # normal halves: adding 0xfff plus the kept lsb carries out of the 13 dropped bits
    # exactly when the Rust's round_up(mantissa, 13, base) is true, and a carry into the
    # exponent is the correct result; rebiasing (127 -> 15) wraps for magnitudes below
    # 2^-14, which are overwritten next, and anything at or past 0x7c00 is infinity
    out = magnitude >> _U32(13)
    out &= _U32(1)
    out += magnitude
    out += _U32(0xFFF)
    out >>= _U32(13)
    out -= _U32(112 << 10)
    np.minimum(out, _U32(0x7C00), out=out)

    small = np.flatnonzero(magnitude < _U32(_HALF_NORMAL_BITS))
    if small.size:
        out[small] = _half_subnormal(magnitude[small])
    # infinity is already 0x7c00; NaN becomes the quiet NaN with mantissa 0x200
    out[magnitude > _U32(_INFINITY_BITS)] = _U32(0x7E00)

    out |= (bits >> _U32(16)) & _U32(0x8000)
    return out.astype(np.uint16).reshape(floats.shape)


@overload
def f16_bits(value: float | np.floating) -> int: ...
@overload
def f16_bits(value: np.ndarray) -> np.ndarray: ...
def f16_bits(value: float | np.floating | np.ndarray) -> int | np.ndarray:
    """`value` (as float32) rounded to the nearest FP16, ties to even, as binary16 bits,
    which is what the kernels' `cvt.rn.f16x2.f32` gives.

    Infinities stay infinite, NaN becomes the quiet NaN 0x7e00 with its sign, overflow
    gives infinity. A Python float is first rounded to float32, as the Rust takes f32.
    A scalar gives an int; an array gives a uint16 array of its shape.
    """
    if isinstance(value, np.ndarray):
        return _f16_bits_array(value)
    return int(_f16_bits_array(value))


def _half_scale_array(largest: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Elementwise `half_scale` over a float32 array: (scale, inverse) arrays."""
    floats = _float32(largest)
    bits = floats.reshape(-1).view(_U32)
    exponent = ((bits >> _U32(23)) & _U32(0xFF)).astype(np.int32) - 127
    shift = np.clip(14 - exponent, -113, 126)
    scale = ((shift + 127).astype(_U32) << _U32(23)).view(np.float32)
    inverse = ((127 - shift).astype(_U32) << _U32(23)).view(np.float32)
    return scale.reshape(floats.shape), inverse.reshape(floats.shape)


@overload
def half_scale(largest: float | np.floating) -> tuple[np.float32, np.float32]: ...
@overload
def half_scale(largest: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...
def half_scale(
    largest: float | np.floating | np.ndarray,
) -> tuple[np.float32, np.float32] | tuple[np.ndarray, np.ndarray]:
    """The power of two `s` that puts `largest` in [2^14, 2^15), below the FP16 maximum
    of 65504 even after rounding, and `1 / s`, both float32.

    The exponent is read from the bits (the sign is ignored) and the shift clamped to
    -113..126 so both are normal floats: zero, subnormal and tiny inputs get 2^126,
    infinity and NaN get 2^-113. An array gives two float32 arrays of its shape.
    """
    if isinstance(largest, np.ndarray):
        return _half_scale_array(largest)
    scale, inverse = _half_scale_array(largest)
    return np.float32(scale), np.float32(inverse)


def _weight_matrix(weight: npt.ArrayLike, rows: int, cols: int, name: str) -> np.ndarray:
    """`weight` as a [rows, cols] float32 matrix, from n*k flat values or that 2-D shape."""
    array = np.asarray(weight, dtype=np.float32)
    if array.ndim == 1:
        if array.size != rows * cols:
            raise InvalidArgument(
                f"{name} weight has {array.size} values, expected {rows} x {cols} = {rows * cols}"
            )
        return array.reshape(rows, cols)
    if array.ndim == 2:
        if array.shape != (rows, cols):
            raise InvalidArgument(
                f"{name} weight has shape {array.shape}, expected ({rows}, {cols})"
            )
        return array
    raise InvalidArgument(f"{name} weight must be 1-D or 2-D, got {array.ndim} dimensions")


def pack_half_columns(weight: npt.ArrayLike, n: int, k: int) -> np.ndarray:
    """Packs `weight [n, k]` (row-major, PyTorch Linear layout) for
    spk_segdense_embed_b32_f16.

    Returns float32 of length `k // 2 * n + n`: word `p * n + col` holds the FP16 pair
    `(w[col][2p] * s, w[col][2p + 1] * s)`, low half first, reinterpreted as float32
    bits; float `k // 2 * n + col` holds `1 / s`, where `s = half_scale(max |w[col]|)`.
    NaN weights are ignored when finding the column's largest magnitude, as Rust's
    `f32::max` ignores them.
    """
    if n < 1:
        raise InvalidArgument(f"pack_half_columns needs n >= 1 columns, got n={n}")
    if k < 2 or k % 2:
        raise InvalidArgument(f"pack_half_columns needs an even k >= 2, got k={k}")
    matrix = _weight_matrix(weight, n, k, "pack_half_columns")

    largest = np.fmax.reduce(np.abs(matrix), axis=1, initial=np.float32(0.0))
    scale, inverse = _half_scale_array(largest)
    # the product rounds in float32, as the Rust's `first * scale` does
    halves = _f16_bits_array(matrix * scale[:, None])
    # little-endian u16 pairs read as little-endian u32 are `low | high << 16`
    words = np.ascontiguousarray(halves, dtype="<u2").view("<u4")

    # assembled as uint32 so the FP16 pairs keep their exact bits (some are NaN patterns)
    packed = np.empty(k // 2 * n + n, dtype=_U32)
    packed[: k // 2 * n].reshape(k // 2, n)[...] = words.T
    packed[k // 2 * n :] = inverse.view(_U32)
    return packed.view(np.float32)


def selected_rows(weight: npt.ArrayLike, n: int, count: int) -> np.ndarray:
    """The `count` rows of a row-major `[k, n]` weight with the largest sum of squares,
    ascending, ties going to the lower index; all k rows when `count >= k`.

    Energies follow the Rust exactly: each float32 is squared in float64 (exact) and the
    squares are added left to right, so near-ties break as they do there.
    """
    if n < 1:
        raise InvalidArgument(f"selected_rows needs n >= 1 columns, got n={n}")
    if count < 0:
        raise InvalidArgument(f"selected_rows needs count >= 0, got count={count}")
    array = np.asarray(weight, dtype=np.float32)
    if array.ndim == 2:
        if array.shape[1] != n:
            raise InvalidArgument(
                f"selected_rows weight has shape {array.shape}, expected (k, {n})"
            )
    elif array.ndim != 1 or array.size % n:
        raise InvalidArgument(
            f"selected_rows weight must hold whole rows of n={n} values, got shape {array.shape}"
        )
    squares = np.square(array.reshape(-1, n).astype(np.float64))

    # numpy's sum adds pairwise along a row, which can differ from the Rust's left fold
    # in the last bit and flip a near-tie; a column loop keeps the sequential order
    energy = squares[:, 0].copy()
    for col in range(1, n):
        energy += squares[:, col]

    # Rust's f64::total_cmp order as integers (NaNs included), negated with `~` so a
    # stable ascending sort gives descending energy and the lower index first on ties
    key = energy.view(np.int64)
    key = key ^ ((key >> 63) & np.int64(0x7FFF_FFFF_FFFF_FFFF))
    order = np.argsort(~key, kind="stable")
    return np.sort(order[:count]).astype(np.uint32)


def round_tf32(values: npt.ArrayLike) -> np.ndarray:
    """float32 `values` rounded to TF32 (10 stored mantissa bits), ties away from zero,
    as `cvt.rna.tf32.f32` rounds: the low 13 bits come out zero, a carry past the
    largest finite value gives infinity, and NaN stays NaN (the add alone could carry a
    NaN's mantissa into its sign)."""
    array = _float32(values)
    rounded = ((array.view(_U32) + _U32(0x1000)) & _U32(0xFFFF_E000)).view(np.float32)
    return np.where(np.isnan(array), np.float32(np.nan), rounded)


# the m16n8k8 A fragment: four 16-channel tiles x 32 lanes x 4 registers per k-step
_MMA_TILES, _MMA_LANES, _MMA_REGISTERS = 4, 32, 4
_CONV_OUT = SegConvSite.CONV1.dimensions()[1]  # both convolutions have 60 outputs


def _index_grid(*extents: int) -> tuple[np.ndarray, ...]:
    """Every index tuple below `extents`, one array per axis, in C order."""
    return tuple(np.meshgrid(*(np.arange(extent) for extent in extents), indexing="ij"))


def pack_gemm_mma(
    weight: npt.ArrayLike, n: int, k: int, cols: int, planes: int, paired: bool = False
) -> np.ndarray:
    """Packs `weight [k, n]` (row-major) as the tensor-core GEMMs read their w operand.

    Returns float32 `[n / cols][k / 8][cols / 16][planes][32][4]` (column tile of the
    block, k-step, pair of 8-column mma tiles, plane, lane, register): register e of
    lane l in pair p of step s holds `w[8 s + r][16 p + l // 4 + 8 (e // 2)]` of the
    column tile, with `r = l % 4 + 4 (e % 2)`, or `r = 2 (l % 4) + e % 2` when `paired`
    (kernels that read x's columns 2 q and 2 q + 1 as mma k-slots q and q + 4). So a
    block's stages lie one after another and a lane reads the b fragments of two mma
    tiles with one 16-byte load. Plane 0 holds `round_tf32(w)`, plane 1 (when
    `planes == 2`) `round_tf32(w - round_tf32(w))`: the bits the kernels' own rounding
    gave.
    """
    if planes not in (1, 2):
        raise InvalidArgument(f"pack_gemm_mma packs 1 or 2 planes, got {planes}")
    if cols < 16 or cols % 16 or n % cols or k % 8:
        raise InvalidArgument(
            f"pack_gemm_mma needs cols a multiple of 16 dividing n, k a multiple of 8; "
            f"got n={n}, k={k}, cols={cols}"
        )
    values = _gemm_mma_order(_weight_matrix(weight, k, n, "pack_gemm_mma"), n, k, cols, paired)
    high = round_tf32(values)
    stacked = high if planes == 1 else np.concatenate([high, round_tf32(values - high)], axis=3)
    return stacked.reshape(-1)


def _gemm_mma_order(matrix: np.ndarray, n: int, k: int, cols: int, paired: bool) -> np.ndarray:
    """`matrix [k, n]` (of any dtype) in `pack_gemm_mma`'s order, one plane:
    `[n / cols][k / 8][cols / 16][1][128]`."""
    # k = 8 s + q + 4 r (paired: 8 s + 2 q + r), n = cols tile + 16 p + 8 h + g, and
    # lane 4 g + q holds register e = r + 2 h
    if paired:
        axes = matrix.reshape(k // 8, 4, 2, n // cols, cols // 16, 2, 8)  # s q r tile p h g
        order = (3, 0, 4, 6, 1, 5, 2)
    else:
        axes = matrix.reshape(k // 8, 2, 4, n // cols, cols // 16, 2, 8)  # s r q tile p h g
        order = (3, 0, 4, 6, 2, 5, 1)
    return axes.transpose(order).reshape(n // cols, k // 8, cols // 16, 1, 128)


def pack_gemm_half(
    weight: npt.ArrayLike, n: int, k: int, cols: int, zero_rows: npt.ArrayLike = ()
) -> np.ndarray:
    """Packs `weight [k, n]` (row-major) for the tensor-core GEMMs on scaled FP16 products.

    Returns float32 of length `k * n // 2 + n`: first `[n / cols][k / 16][cols / 16][32][4]`
    words (column tile of the block, k-step of 16, pair of 8-column mma tiles, lane,
    register): register e of lane l in pair p of step s holds the FP16 pair of column
    `16 p + l // 4 + 8 (e // 2)` of the tile at rows `16 s + 2 (l % 4) + 8 (e % 2)` and
    the next one, low half first, each value times the column's
    `s = half_scale(max |w[:, col]|)`; then `1 / s` for the n columns. The rows listed in
    `zero_rows` pack as zeros and set no scale (Select recomputes them in 3xTF32).
    """
    if cols < 16 or cols % 16 or n % cols or k < 16 or k % 16:
        raise InvalidArgument(
            f"pack_gemm_half needs cols a multiple of 16 dividing n, k a multiple of 16; "
            f"got n={n}, k={k}, cols={cols}"
        )
    matrix = _weight_matrix(weight, k, n, "pack_gemm_half").copy()
    matrix[np.asarray(zero_rows, dtype=np.int64)] = 0.0
    largest = np.fmax.reduce(np.abs(matrix), axis=0, initial=np.float32(0.0))
    scale, inverse = _half_scale_array(largest)
    halves = _f16_bits_array(matrix * scale[None, :]).reshape(k, n)
    # k = 16 s + 8 r + 2 q + b, n = cols tile + 16 p + 8 h + g; lane 4 g + q holds
    # register e = 2 h + r, whose low (b = 0) and high (b = 1) halves are adjacent rows
    axes = halves.reshape(k // 16, 2, 4, 2, n // cols, cols // 16, 2, 8)  # s r q b tile p h g
    ordered = np.ascontiguousarray(axes.transpose(4, 0, 5, 7, 2, 6, 1, 3), dtype="<u2")
    # assembled as uint32 so the FP16 pairs keep their exact bits (some are NaN patterns)
    packed = np.concatenate([ordered.view("<u4").reshape(-1), inverse.view(_U32)])
    return packed.view(np.float32)


def _conv_matrix(weight: npt.ArrayLike, cin: int, name: str) -> np.ndarray:
    """A conv weight `[60, cin, 5]` (or already `[60, cin * 5]`) as float32 `[60, cin * 5]`."""
    array = np.asarray(weight, dtype=np.float32)
    if array.ndim == 3 and array.shape != (_CONV_OUT, cin, CONV_TAPS):
        raise InvalidArgument(f"{name} weight has shape {array.shape}, expected (60, {cin}, 5)")
    return _weight_matrix(
        array.reshape(_CONV_OUT, -1) if array.ndim == 3 else array,
        _CONV_OUT,
        cin * CONV_TAPS,
        name,
    )


def pack_conv_half(weight: npt.ArrayLike, cin: int, cin_pad: int) -> np.ndarray:
    """Packs conv weights `[60, cin, 5]` for the FP16 tensor-core convolutions.

    Returns float32 of length `cin_pad * 5 * 32 + 64`: first `[cin_pad / 16][5][4][32][4]`
    words (stage of 16 input channels, tap, 16-channel tile, lane, register), register e
    of lane l in tile m holding the FP16 pair of channel `16 m + l // 4 + 8 (e % 2)` at
    input channels `16 stage + 2 (l % 4) + 8 (e // 2)` and the next one, low half first,
    each value times the channel's `s = half_scale(max |w[o]|)`; then `1 / s` for the 64
    channels. Channels past 60 and input channels past `cin` are zero.
    """
    if not 1 <= cin <= cin_pad or cin_pad % 16:
        raise InvalidArgument(
            f"pack_conv_half needs 1 <= cin <= cin_pad, cin_pad a multiple of 16; "
            f"got cin={cin}, cin_pad={cin_pad}"
        )
    matrix = _conv_matrix(weight, cin, "pack_conv_half")
    largest = np.fmax.reduce(np.abs(matrix), axis=1, initial=np.float32(0.0))
    scale, inverse = _half_scale_array(largest)
    padded = np.zeros((_MMA_TILES * 16, cin_pad, CONV_TAPS), np.float32)
    padded[:_CONV_OUT, :cin] = (matrix * scale[:, None]).reshape(_CONV_OUT, cin, CONV_TAPS)
    stage, tap, tile, lane, register = _index_grid(
        cin_pad // 16, CONV_TAPS, _MMA_TILES, _MMA_LANES, _MMA_REGISTERS
    )
    channel = tile * 16 + lane // 4 + 8 * (register % 2)
    ci = stage * 16 + 2 * (lane % 4) + 8 * (register // 2)
    low = _f16_bits_array(padded[channel, ci, tap]).astype(_U32)
    high = _f16_bits_array(padded[channel, ci + 1, tap]).astype(_U32)
    inverses = np.ones(_MMA_TILES * 16, np.float32)
    inverses[:_CONV_OUT] = inverse
    packed = np.concatenate([(low | high << _U32(16)).reshape(-1), inverses.view(_U32)])
    return packed.view(np.float32)


def pack_conv_rows(weight: npt.ArrayLike, cin: int) -> np.ndarray:
    """Packs conv weights `[60, cin, 5]` as the SIMT convolutions read them.

    Returns float32 `[cin * 5][64]`: row `k = ci * 5 + tap` holds channel
    `o = 15 cg + 4 q + e` (`e < 4`, `4 q + e < 15`) at column `16 q + 4 cg + e`, so a
    thread of channel group `cg` reads its channels `15 cg + 4 q + {0..3}` as one float4
    and the kernels copy rows to shared memory unchanged; columns 51, 55, 59 and 63 are
    zero.
    """
    return _conv_rows_order(_conv_matrix(weight, cin, "pack_conv_rows"), 0).reshape(-1)


def _conv_rows_order(matrix: np.ndarray, fill: int | float) -> np.ndarray:
    """`matrix [60, cin * 5]` (of any dtype) in `pack_conv_rows`' order, `fill` in the
    four padding columns: `[cin * 5][64]`."""
    channel = np.arange(_CONV_OUT)
    group, within = np.divmod(channel, 15)
    column = 16 * (within // 4) + 4 * group + within % 4
    packed = np.full((matrix.shape[1], CONV_PADDED), fill, matrix.dtype)
    packed[:, column] = matrix.T
    return packed


def pack_conv_mma(weight: npt.ArrayLike, cin: int, cin_pad: int, planes: int) -> np.ndarray:
    """Packs conv weights `[60, cin, 5]` as spk_segdense_pack_conv_mma does.

    Returns `planes` planes of `[cin_pad * 5 / 8][4][32][4]` float32 (k-step, 16-channel
    tile, lane, register): register e of lane l in tile m of step s holds channel
    `16 m + l // 4 + 8 (e % 2)` at reduction index `k = 8 s + l % 4 + 4 (e // 2)`,
    `k = ci * 5 + tap`, zero past channel 60 and input channel `cin`. Plane 0 holds
    `round_tf32(w)`, plane 1 (when `planes == 2`) `round_tf32(w - round_tf32(w))`.
    """
    if not 1 <= cin <= cin_pad or cin_pad % 8:
        raise InvalidArgument(
            f"pack_conv_mma needs 1 <= cin <= cin_pad, cin_pad a multiple of 8; "
            f"got cin={cin}, cin_pad={cin_pad}"
        )
    if planes not in (1, 2):
        raise InvalidArgument(f"pack_conv_mma packs 1 or 2 planes, got {planes}")
    values = _conv_mma_order(_conv_matrix(weight, cin, "pack_conv_mma"), cin_pad, 0)
    high = round_tf32(values)
    if planes == 1:
        return high
    return np.concatenate([high, round_tf32(values - high)])


def _conv_mma_order(matrix: np.ndarray, cin_pad: int, fill: int | float) -> np.ndarray:
    """`matrix [60, cin * 5]` (of any dtype) in `pack_conv_mma`'s order, one plane, flat,
    `fill` past channel 60 and input channel `cin`."""
    padded = np.full((_MMA_TILES * 16, cin_pad * CONV_TAPS), fill, matrix.dtype)
    padded[:_CONV_OUT, : matrix.shape[1]] = matrix
    steps = cin_pad * CONV_TAPS // 8
    step, tile, lane, register = _index_grid(steps, _MMA_TILES, _MMA_LANES, _MMA_REGISTERS)
    channel = tile * 16 + lane // 4 + 8 * (register % 2)
    k = step * 8 + lane % 4 + 4 * (register // 2)
    return padded[channel, k].reshape(-1)


# A gather map entry of `spk_segdense_pack_gather`: the index of the weight element to
# read in bits 0..29, and in bits 30..31 what to write of it
GATHER_COPY, GATHER_TF32, GATHER_RESIDUAL, GATHER_ZERO = range(4)
_GATHER_SHIFT = 30


def _sources(rows: int, cols: int) -> np.ndarray:
    """The index of each element of a `[rows, cols]` weight, as that matrix."""
    return np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)


def _gathered(sources: np.ndarray, mode: int) -> np.ndarray:
    """Gather entries reading `sources` (-1: write zero) in `mode`."""
    entries = np.where(sources < 0, GATHER_ZERO << _GATHER_SHIFT, sources | mode << _GATHER_SHIFT)
    return entries.astype(np.uint32)


def _planes(sources: np.ndarray, planes: int, axis: int) -> np.ndarray:
    """The TF32 value plane of `sources`, and with `planes == 2` its residual plane."""
    high = _gathered(sources, GATHER_TF32)
    if planes == 1:
        return high
    return np.concatenate([high, _gathered(sources, GATHER_RESIDUAL)], axis=axis)


@functools.cache
def gather_map(kind: Kind, n: int, k: int) -> np.ndarray | None:
    """`pack_weight`'s layout for `kind` as a map for `spk_segdense_pack_gather`, where
    that layout takes each weight element (or its TF32 value and residual) to places of
    its own, zero-padded: the SIMT convolutions' rows, the 3xTF32 convolutions' planes,
    the TF32 and 3xTF32 GEMM fragments, the SIMT embedding's transpose and the kinds
    that read the weight as it is. None for the packs that scale it (FP16 products) or
    list rows of it (Select), which the host makes. Every weight element appears in a
    map, so the kernel sees each one (and flags it if it is not finite)."""
    if packs_on_host(kind):
        return None
    match kind:
        case Conv():
            sources = _conv_rows_order(_sources(_CONV_OUT, k), -1)
            return _gathered(sources, GATHER_COPY).reshape(-1)
        case TensorConv(cin_pad=cin_pad, planes=planes):
            return _planes(_conv_mma_order(_sources(_CONV_OUT, k), cin_pad, -1), planes, 0)
        case Split(cols=cols, fragments=Fragments(planes=planes, paired=paired)):
            sources = _gemm_mma_order(_sources(n, k).T, n, k, cols, paired)
            return _planes(sources, planes, 3).reshape(-1)
        case Split():
            return _gathered(_sources(n, k).T, GATHER_COPY).reshape(-1)
        case Gemm(cols=cols, fragments=Fragments() as fragments):
            sources = _gemm_mma_order(_sources(k, n), n, k, cols, fragments.paired)
            return _planes(sources, fragments.planes, 3).reshape(-1)
    return _gathered(np.arange(n * k), GATHER_COPY)


def gather(weight: npt.ArrayLike, entries: np.ndarray) -> np.ndarray:
    """What `spk_segdense_pack_gather` writes for the float32 `weight` (flat) and a
    `gather_map`, in numpy, bit for bit."""
    values = np.asarray(weight, dtype=np.float32).reshape(-1)
    mode, index = entries >> _GATHER_SHIFT, entries & ((1 << _GATHER_SHIFT) - 1)
    read = values[np.where(mode == GATHER_ZERO, 0, index)]
    high = round_tf32(read)
    with np.errstate(invalid="ignore"):  # inf - inf: a plan refuses such weights anyway
        residual = round_tf32(read - high)
    written = np.select(
        [mode == GATHER_COPY, mode == GATHER_TF32, mode == GATHER_RESIDUAL],
        [read, high, residual],
        np.float32(0),
    )
    return written.astype(np.float32)


def pack_weight(kind: Kind, weight: np.ndarray, n: int, k: int) -> np.ndarray:
    """The checked host `weight` of a site with n columns and reduction k in the layout
    `kind`'s kernel reads, made on the host (`gather_map` gives the layouts a kernel of
    the module can make on the device instead)."""
    match kind:
        case Conv():
            return pack_conv_rows(weight, k // CONV_TAPS)
        case TensorConv(cin_pad=cin_pad, planes=1):
            return pack_conv_half(weight, k // CONV_TAPS, cin_pad)
        case TensorConv(cin_pad=cin_pad, planes=planes):
            return pack_conv_mma(weight, k // CONV_TAPS, cin_pad, planes)
        case Split(weights=SplitWeights.SCALED_HALF):
            return pack_half_columns(weight, n, k)
        case Split(cols=cols, fragments=Fragments(planes=planes, paired=paired)):
            return pack_gemm_mma(weight.reshape(n, k).T, n, k, cols, planes, paired)
        case Split():
            return np.ascontiguousarray(weight.reshape(n, k).T).reshape(-1)
        case Gemm(cols=cols, select=select, fragments=Fragments() as fragments):
            matrix = weight.reshape(k, n)
            rows = selected_rows(matrix, n, select) if select else np.zeros(0, np.uint32)
            if fragments.half:
                # the selected rows pack as zeros: the kernel multiplies them in 3xTF32
                packed = pack_gemm_half(matrix, n, k, cols, rows)
            else:
                packed = pack_gemm_mma(matrix, n, k, cols, fragments.planes, fragments.paired)
            if select == 0:
                return packed
            return np.concatenate([packed, rows.view(np.float32), matrix[rows].ravel()])
    # the other kinds read the weight as the caller holds it
    return weight
