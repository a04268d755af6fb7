#!/usr/bin/env python3
"""A numpy model of the TF32-math trunk's roundings, to price a 16-bit store of each
block's first activation (the one only its second convolution reads) before any kernel
is built. Runs on the CPU.

The model (`tf32` form): every 3x3 convolution's operands rounded as the TF32 kernels
round them, each activation to FP16 after a power-of-two scale per chunk that puts its
largest magnitude in [2^14, 2^15), each weight column likewise by its own largest; the
products and sums in float64 (the kernels' FP32 sums add far less error than the
operands' 11 bits), the result rounded to FP32. The stem and the shortcuts are exact
(FP32 fused multiply-adds and three products in the kernels). The `bound` form differs
in one place: a block's first activation takes its scale from a bound known before it
is written, max |input| x the largest absolute row sum of the weights + the largest
bias (ReLU's output is at most that), not from its own largest value, which the writer
cannot know. A looser scale leaves more of the small values among FP16's subnormals.
The `all` form (TF32 math) stores every activation so, the residual stream and the
shortcuts' outputs too, each bound from the largest values of its inputs; the `layer1`
form only the stem's and layer1's (the activations whose bytes bound layer1's kernels);
the `streamN` forms the stem's and the block outputs of layers 1 to N but each layer's
last (N = 1: the kernels' 16-bit residual stream).

Both forms' errors against the float64 trunk (`pyspk.reference.trunk`) on chunks of
N(0, 4) fbank values, with the weights of `tools/trunk_bench.py` (WeSpeaker ResNet34,
seed 1, random BatchNorm statistics, seed 2), and per block the bound's excess over the
largest value, in powers of two.

    PYTHONPATH=. python3 tools/trunk_half_model.py [--chunks 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def half(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """FP16(values x scale) / scale: the operand an FP16 product sees, in float64."""
    return (values * scale).astype(np.float16).astype(np.float64) / scale


def split(values: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The FP32 kernels' operand: its high FP16 part and the FP16 rounding of the
    residual, each / scale, in float64."""
    scaled = values * scale
    high = scaled.astype(np.float16).astype(np.float64)
    low = (scaled - high).astype(np.float16).astype(np.float64)
    return high / scale, low / scale


def chunk_scale(largest: np.ndarray) -> np.ndarray:
    """Per chunk, the power of two that puts `largest` in [2^14, 2^15)."""
    exponent = np.floor(np.log2(np.maximum(largest, np.finfo(np.float64).tiny)))
    return np.exp2(14.0 - exponent)


def rounded_conv(
    x: np.ndarray,
    conv: Any,
    residual: np.ndarray | None,
    relu: bool,
    x_scale: np.ndarray | None = None,
    math: str = "tf32",
) -> np.ndarray:
    """One 3x3 convolution as the kernels of `math` round it: x [b, h, w, c] in FP32
    values, scaled per chunk by `x_scale` (default: from its own largest magnitude);
    TF32 math one FP16 product, FP32 math three (high x high, high x low, low x high)."""
    from pyspk import reference

    if x_scale is None:
        x_scale = chunk_scale(np.abs(x).reshape(len(x), -1).max(axis=1))
    weight = np.asarray(conv.weight, np.float64)
    columns = np.abs(weight).reshape(len(weight), -1).max(axis=1)
    w_scale = chunk_scale(columns)[:, None, None, None]
    x_scale = x_scale[:, None, None, None]
    stride = conv.site.shape.stride
    if math == "tf32":
        pairs = [(half(x, x_scale), half(weight, w_scale))]
    else:
        x_high, x_low = split(x, x_scale)
        w_high, w_low = split(weight, w_scale)
        pairs = [(x_high, w_high), (x_high, w_low), (x_low, w_high)]
    out = sum(reference.trunk_conv(xs, ws, np.zeros(len(weight)), stride) for xs, ws in pairs)
    out = out + np.asarray(conv.bias, np.float64)
    if residual is not None:
        out = out + residual
    if relu:
        out = np.maximum(out, 0.0)
    return out.astype(np.float32).astype(np.float64)


def exact_conv(x: np.ndarray, conv: Any, relu: bool) -> np.ndarray:
    from pyspk import reference

    out = reference.trunk_conv(x, conv.weight, conv.bias, conv.site.shape.stride, relu=relu)
    return out.astype(np.float32).astype(np.float64)


def bound_of(x: np.ndarray, conv: Any) -> np.ndarray:
    """Per chunk, a bound on ReLU(conv(x) + bias) known before the output is written."""
    weight = np.abs(np.asarray(conv.weight, np.float64))
    row_sums = weight.reshape(len(weight), -1).sum(axis=1)
    largest = np.abs(x).reshape(len(x), -1).max(axis=1)
    return largest * row_sums.max() + np.abs(np.asarray(conv.bias)).max()


def stored(values: np.ndarray, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`values` stored as FP16 scaled by the per-chunk `bound`: the values and the scale."""
    scale = chunk_scale(bound)
    return half(values, scale[:, None, None, None]), scale


def largest(values: np.ndarray) -> np.ndarray:
    return np.abs(values).reshape(len(values), -1).max(axis=1)


def model(fbank: np.ndarray, weights: Any, form: str) -> tuple[np.ndarray, list[float]]:
    """The trunk's output [b, 256, 10, 125] in `form`: "tf32" or "fp32"; with " bound"
    each block's first activation is scaled by its bound; "tf32 all" stores every
    activation (the stem's, each block's two and the shortcuts') as FP16, each scaled
    by a bound from its inputs' largest values, which the kernels before it record;
    "tf32 layer1" only the stem's and layer1's blocks' outputs; "tf32 streamN" the stem's
    and the block outputs of layers 1 to N but each layer's last.
    Also, with a bound, each block's log2 excess of the bound over its first activation's
    largest value (the worst chunk)."""
    math, _, variant = form.partition(" ")
    # "streamN": the stem's output and the block outputs of layers 1 to N in FP16, but for
    # each layer's last block, whose output the next layer's shortcut takes in 32 bits
    # (the kernels' form with N = 1: layer1's residual stream in 16 bits)
    stream = int(variant[len("stream") :]) if variant.startswith("stream") else 0

    def layer_of(site: Any) -> str:  # "stem", "layer1", ...
        return site.value.split("_")[0]

    layers = [layer_of(block.conv1.site) for block in weights.blocks]
    last = {i for i, layer in enumerate(layers) if i + 1 == len(layers) or layers[i + 1] != layer}

    def stores(site: Any, block: int = -1) -> bool:  # whether the output of `site` is FP16
        if stream:
            return layer_of(site) == "stem" or (
                block >= 0 and block not in last and int(layers[block][len("layer") :]) <= stream
            )
        return variant == "all" or (variant == "layer1" and layer_of(site) in ("stem", "layer1"))

    excess: list[float] = []
    x = fbank.astype(np.float64).transpose(0, 2, 1)[..., None]
    image = x
    x = exact_conv(x, weights.stem, relu=True)
    scale = None
    if stores(weights.stem.site):
        x, scale = stored(x, bound_of(image, weights.stem))
    for index, block in enumerate(weights.blocks):
        h = rounded_conv(x, block.conv1, None, relu=True, x_scale=scale, math=math)
        h_scale = None
        if variant:
            limit = bound_of(x, block.conv1)
            excess.append(float(np.max(np.log2(limit / largest(h)))))
            h_scale = chunk_scale(limit)  # what the second convolution's operands take
        shortcut = x if block.shortcut is None else exact_conv(x, block.shortcut, relu=False)
        if block.shortcut is not None and stores(block.shortcut.site):
            shortcut, _ = stored(shortcut, bound_of(x, block.shortcut))
        x = rounded_conv(h, block.conv2, shortcut, relu=True, x_scale=h_scale, math=math)
        scale = None
        if stores(block.conv2.site, index):
            x, scale = stored(x, bound_of(h, block.conv2) + largest(shortcut))
    return x.transpose(0, 3, 1, 2), excess


def trunk_inputs(chunks: int) -> tuple[np.ndarray, Any, np.ndarray, float]:
    """`tools/trunk_bench.py`'s trunk weights, `chunks` chunks of N(0, 4) fbank values
    [b, 998, 80], their float64 trunk outputs, and the seconds those took."""
    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
    warnings.simplefilter("ignore")
    import torch
    from trunk_bench import randomize_norms

    import pyspk.pyannote as pa
    from pyspk import reference
    from pyspk.torch.resnet import trunk_weights

    torch.manual_seed(0)
    resnet = pa.wespeaker_resnet34(seed=1).resnet
    randomize_norms(torch, resnet, seed=2)
    weights = trunk_weights(resnet)
    fbank = (torch.randn(chunks, 998, 80) * 2.0).numpy()
    started = time.perf_counter()
    truth = reference.trunk(fbank, weights)
    return fbank, weights, truth, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    fbank, weights, truth, seconds = trunk_inputs(args.chunks)
    lines = [
        f"# tools/trunk_half_model.py: {args.chunks} chunks, float64 truth in {seconds:.0f} s",
        "form         max |error| / max |truth|   norm-wise relative",
    ]
    excesses = {}
    forms = (
        "tf32",
        "tf32 bound",
        "tf32 all",
        "tf32 layer1",
        "tf32 stream1",
        "tf32 stream2",
        "tf32 stream3",
        "tf32 stream4",
        "fp32",
        "fp32 bound",
    )
    for form in forms:
        got, excesses[form] = model(fbank, weights, form)
        diff = got - truth
        lines.append(
            f"{form:12} {np.abs(diff).max() / np.abs(truth).max():.3e}"
            f"               {np.linalg.norm(diff) / np.linalg.norm(truth):.3e}"
        )
    lines.append(
        "bound's excess over each block's largest first activation, log2 (the worst chunk): "
        + " ".join(f"{e:.1f}" for e in excesses["tf32 bound"])
    )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
