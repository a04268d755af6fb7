#!/usr/bin/env python3
"""A numpy model of the trunk's 3x3 convolutions in Winograd form, to price the error
of its transforms before any kernel is built. Runs on the CPU.

Winograd's F(2,3) computes two outputs of a 3-tap correlation from four inputs with four
products where the direct form takes six: along the frames alone ("winograd 1d") a 3x3
takes 2/3 of the direct form's products, along both axes ("winograd 2x2", F(2x2,3x3))
4/9; F(4,3) along the frames ("winograd 4 1d") 1/2. The tensor cores would take the
transformed operands: the input tile transform B^T d B and the weights' G g G^T, each
rounded to FP16 as the direct kernels round theirs (TF32 math one product, FP32 math
the high and low parts and three products), then the output transform A^T M A. What
this model prices is the transformed operands' rounding, which the output transform's
cancellation can amplify (F(2,3)'s coefficients are 0, 1/2 and 1; F(4,3)'s reach 8
and 1/24). The transformed operand is formed from the FP32 activation and rounded once;
"tf32 stored" forms it from an activation already stored as FP16 (rounded twice).

Each form applies to the stride-1 3x3s of the layers named (the stride-2 3x3s, the
stem and the shortcuts stay as today). Operands as `tools/trunk_half_model.py` rounds
them: an activation operand scaled per chunk by a power of two from its largest
magnitude, a weight column (per output channel, and per transform element) by its own.
TF32 math sums in float64 (the kernels' FP32 sums add far less error than 11-bit
operands). FP32 math's error is mostly its FP32 sums, which the model rounds too: each
k16 step's products summed exactly, then joining an FP32 accumulator (the direct form
one accumulator for every tap, as the kernels; Winograd one per transform element),
every transform's additions and the epilogue's (bias, then residual) rounded to FP32 in
turn. How a tensor core's accumulation rounds is not documented, so three models:
"fp32" rounds each step to nearest, "fp32 rz" truncates it, "fp32 fresh" truncates the
step's own sum and adds it to the running sum to nearest. The "direct" rows set each
model beside the kernels' measured error.

Errors against the float64 trunk (`pyspk.reference.trunk`) on chunks of N(0, 4) fbank
values, with the weights of `tools/trunk_bench.py` (WeSpeaker ResNet34, seed 1, random
BatchNorm statistics, seed 2).

    PYTHONPATH=. python3 tools/trunk_winograd_model.py [--chunks 2] [--math tf32|fp32]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trunk_half_model import chunk_scale, exact_conv, half, split, trunk_inputs

# One axis's transforms (B^T, G, A^T) for m outputs of a 3-tap correlation from m + 2
# inputs: y = A^T ((G g) * (B^T d)).
Transforms = tuple[np.ndarray, np.ndarray, np.ndarray]
F13: Transforms = (np.eye(3), np.eye(3), np.ones((1, 3)))  # the direct form
F23: Transforms = (
    np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
    np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
    np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64),
)
# F(4,3) on the points 0, 1, -1, 2, -2 (and infinity): 6 products for 4 outputs
F43: Transforms = (
    np.array(
        [
            [4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1],
        ],
        np.float64,
    ),
    np.array(
        [
            [1 / 4, 0, 0],
            [-1 / 6, -1 / 6, -1 / 6],
            [-1 / 6, 1 / 6, -1 / 6],
            [1 / 24, 1 / 12, 1 / 6],
            [1 / 24, -1 / 12, 1 / 6],
            [0, 0, 1],
        ]
    ),
    np.array(
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
        np.float64,
    ),
)
# each method's transforms along the bins (H) and the frames (W)
METHODS = {
    "direct": (F13, F13),
    "winograd 1d": (F13, F23),
    "winograd 2x2": (F23, F23),
    "winograd 4 1d": (F13, F43),
}
K_STEP = 16  # input channels a tensor-core k step sums before its FP32 accumulation


def f32(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float32).astype(np.float64)


def f32_toward_zero(values: np.ndarray) -> np.ndarray:
    """`values` rounded to FP32 toward zero: an accumulation that truncates."""
    rounded = values.astype(np.float32)
    over = np.abs(rounded.astype(np.float64)) > np.abs(values)
    rounded[over] = np.nextafter(rounded[over], np.float32(0))
    return rounded.astype(np.float64)


# the maths whose sums the model rounds to FP32, and how a k step's exact sum joins the
# accumulator: rounded to nearest; truncated; or (fresh) the step's sum truncated as a
# tensor core's own accumulation would, then added to the running sum rounded to nearest
Accumulate = Callable[[np.ndarray, np.ndarray], np.ndarray]
ACCUMULATIONS: dict[str, Accumulate] = {
    "fp32": lambda acc, step: f32(acc + step),
    "fp32 rz": lambda acc, step: f32_toward_zero(acc + step),
    "fp32 fresh": lambda acc, step: f32(acc + f32_toward_zero(step)),
}


def transform(values: np.ndarray, matrix: np.ndarray, axis: int, fp32: bool) -> np.ndarray:
    """`matrix` applied along `axis` of `values`; `fp32`: each output's nonzero terms
    added in turn, every sum rounded to FP32, as a kernel's FP32 adds would."""
    moved = np.moveaxis(values, axis, -1)
    if not fp32:
        return np.moveaxis(moved @ matrix.T, -1, axis)
    out = np.zeros((*moved.shape[:-1], len(matrix)))
    for row, coefficients in enumerate(matrix):
        for column in np.flatnonzero(coefficients):
            out[..., row] = f32(out[..., row] + coefficients[column] * moved[..., column])
    return np.moveaxis(out, -1, axis)


def operands(values: np.ndarray, scale: np.ndarray, math: str) -> list[np.ndarray]:
    """An operand as the products see it: TF32 math one FP16 part, FP32 the two."""
    return [half(values, scale)] if math.startswith("tf32") else list(split(values, scale))


def pairs_of(math: str) -> list[tuple[int, int]]:
    """The (input part, weight part) pairs whose products the kernels of `math` take."""
    return [(0, 0)] if math.startswith("tf32") else [(0, 0), (0, 1), (1, 0)]


def column_scale(weights: np.ndarray) -> np.ndarray:
    """u [a, b, cin, cout]: a power-of-two scale per transform element and column."""
    return chunk_scale(np.abs(weights).max(axis=2, keepdims=True))


def modelled_conv(
    x: np.ndarray, conv: Any, residual: np.ndarray | None, relu: bool, math: str, method: str
) -> np.ndarray:
    """One 3x3 convolution (stride 1, or 2 in the direct form) of x [b, h, w, cin] as a
    kernel of `math` in `method` would round it ("fp32 exact": FP32 math's operands and
    products with exact sums, as `tools/trunk_half_model.py`'s FP32 form; "fp32 rz":
    FP32 math whose tensor-core accumulations truncate; "tf32 stored": TF32 math whose
    input was stored as scaled FP16 before the transform, so its transformed operand is
    rounded twice)."""
    (bt_h, g_h, at_h), (bt_w, g_w, at_w) = METHODS[method]
    accumulate = ACCUMULATIONS.get(math)
    fp32 = accumulate is not None
    stride = conv.site.shape.stride
    weight = np.asarray(conv.weight, np.float64)  # [cout, cin, 3, 3]
    u = np.einsum("ak,bl,oikl->abio", g_h, g_w, weight)
    u_parts = operands(u, column_scale(u), math)
    m_h, m_w = len(at_h), len(at_w)
    batch, height, width, cin = x.shape
    h_out, w_out = (height - 1) // stride + 1, (width - 1) // stride + 1
    tiles_h, tiles_w = -(-h_out // m_h), -(-w_out // m_w)
    n_h, n_w = len(bt_h), len(bt_w)
    rows = (tiles_h - 1) * m_h * stride + n_h  # padded extents the tiles reach
    columns = (tiles_w - 1) * m_w * stride + n_w
    out = np.empty((batch, h_out, w_out, weight.shape[0]))
    for chunk in range(batch):
        padded = np.zeros((rows, columns, cin))
        padded[1 : height + 1, 1 : width + 1] = x[chunk]
        if math == "tf32 stored":  # the input kept as FP16, transformed by its reader
            padded = half(padded, chunk_scale(np.abs(padded).max()))
        d = sliding_window_view(padded, (n_h, n_w), axis=(0, 1))
        d = d[:: m_h * stride, :: m_w * stride]  # [tiles_h, tiles_w, cin, n_h, n_w]
        v = transform(transform(d, bt_h, 3, fp32), bt_w, 4, fp32)
        v = np.moveaxis(v, 2, 4)  # [tiles_h, tiles_w, n_h, n_w, cin]
        v_parts = operands(v, chunk_scale(np.abs(v).max()), math)
        m = _products(v_parts, u_parts, pairs_of(math), accumulate, single=method == "direct")
        y = transform(transform(m, at_h, 2, fp32), at_w, 3, fp32)
        y = y.transpose(0, 2, 1, 3, 4).reshape(tiles_h * m_h, tiles_w * m_w, -1)
        out[chunk] = y[:h_out, :w_out]
    if fp32:
        out = f32(out + np.asarray(conv.bias, np.float64))
        if residual is not None:
            out = f32(out + residual)
    else:
        out = out + np.asarray(conv.bias, np.float64)
        if residual is not None:
            out = out + residual
    return f32(np.maximum(out, 0.0) if relu else out)


def _products(
    v_parts: list[np.ndarray],
    u_parts: list[np.ndarray],
    pairs: list[tuple[int, int]],
    accumulate: Accumulate | None,
    single: bool,
) -> np.ndarray:
    """M [tiles_h, tiles_w, n_h, n_w, cout]: each transform element's sum over the input
    channels of the pairs' products; exact, or with `accumulate`, k steps of K_STEP
    channels summed exactly, each joining an FP32 accumulator by `accumulate`, one per
    element or (`single`, the direct form's taps) one for all."""
    if accumulate is None:
        return sum(np.einsum("hwabi,abio->hwabo", v_parts[p], u_parts[q]) for p, q in pairs)
    cin = v_parts[0].shape[-1]
    shape = (*v_parts[0].shape[:4], u_parts[0].shape[-1])
    acc = np.zeros(shape[:2] + shape[4:] if single else shape)
    for first in range(0, cin, K_STEP):
        block = slice(first, first + K_STEP)
        step = sum(
            np.einsum("hwabi,abio->hwabo", v_parts[p][..., block], u_parts[q][:, :, block])
            for p, q in pairs
        )
        if single:
            for a in range(shape[2]):
                for b in range(shape[3]):
                    acc = accumulate(acc, step[:, :, a, b])
        else:
            acc = accumulate(acc, step)
    if single:  # the taps' sum is already the output: A^T all ones, applied once
        out = np.zeros(shape)
        out[:, :, 0, 0] = acc
        return out
    return acc


def model(fbank: np.ndarray, weights: Any, math: str, method: str, layers: set[int]) -> np.ndarray:
    """The trunk's output [b, 256, 10, 125] with the stride-1 3x3s of `layers` in
    `method` and every other 3x3 direct, in `math`; the stem and shortcuts exact."""
    x = fbank.astype(np.float64).transpose(0, 2, 1)[..., None]
    x = exact_conv(x, weights.stem, relu=True)
    if math in ACCUMULATIONS:
        x = f32(x)
    for block in weights.blocks:
        forms = [
            method
            if int(conv.site.value[len("layer")]) in layers and conv.site.shape.stride == 1
            else "direct"
            for conv in (block.conv1, block.conv2)
        ]
        h = modelled_conv(x, block.conv1, None, relu=True, math=math, method=forms[0])
        shortcut = x if block.shortcut is None else exact_conv(x, block.shortcut, relu=False)
        if math in ACCUMULATIONS:
            shortcut = f32(shortcut)
        x = modelled_conv(h, block.conv2, shortcut, relu=True, math=math, method=forms[1])
    return x.transpose(0, 3, 1, 2)


ALL = {1, 2, 3, 4}
FORMS = (  # (math, method, layers)
    ("tf32", "direct", set()),
    ("tf32", "winograd 1d", ALL),
    ("tf32", "winograd 2x2", ALL),
    ("tf32", "winograd 2x2", {3, 4}),
    ("tf32", "winograd 4 1d", ALL),
    ("tf32 stored", "winograd 1d", ALL),
    ("fp32 exact", "direct", set()),
    ("fp32", "direct", set()),
    ("fp32", "winograd 1d", ALL),
    ("fp32", "winograd 2x2", ALL),
    ("fp32", "winograd 4 1d", ALL),
    ("fp32 fresh", "direct", set()),
    ("fp32 fresh", "winograd 2x2", ALL),
    ("fp32 rz", "direct", set()),
    ("fp32 rz", "winograd 2x2", ALL),
)


def product_share(method: str, layers: set[int]) -> float:
    """The trunk's tensor-core products in `method` over the direct form's, by count:
    the stride-1 3x3s (each layer's `conv` site) of `layers` take a tile's products per
    output, the rest (the stem and shortcuts included) as they are."""
    from pyspk.candidate.trunk.shapes import TRUNK_BLOCKS, TrunkSite, trunk_macs

    (_, _, at_h), (_, _, at_w) = METHODS[method]
    # a tile's products (n_h n_w per input channel and output channel) per output
    ratio = (len(at_h) + 2) * (len(at_w) + 2) / (9 * len(at_h) * len(at_w))
    saved = 0.0
    for layer, blocks in enumerate(TRUNK_BLOCKS, start=1):
        if layer in layers:
            for block in range(blocks):
                for site in TrunkSite.of_block(layer, block):
                    if site is TrunkSite(f"layer{layer}_conv"):
                        saved += site.shape.macs() * (1.0 - ratio)
    return 1.0 - saved / trunk_macs()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--math", choices=("tf32", "fp32"), default=None, help="its forms only")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    forms = [form for form in FORMS if form[0].startswith(args.math or "")]

    fbank, weights, truth, seconds = trunk_inputs(args.chunks)
    lines = [
        f"# tools/trunk_winograd_model.py: {args.chunks} chunks, float64 truth in {seconds:.0f} s",
        "math        method        layers   products  max |error| / max |truth|  norm-wise",
    ]
    for math, method, layers in forms:
        started = time.perf_counter()
        got = model(fbank, weights, math, method, layers)
        diff = got - truth
        lines.append(
            f"{math:11} {method:13} {''.join(map(str, sorted(layers))) or '-':8} "
            f"{product_share(method, layers):8.3f}  "
            f"{np.abs(diff).max() / np.abs(truth).max():.3e}                  "
            f"{np.linalg.norm(diff) / np.linalg.norm(truth):.3e}"
        )
        print(lines[-1], f"({time.perf_counter() - started:.0f} s)", flush=True)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
