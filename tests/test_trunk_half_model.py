"""`tools/trunk_half_model.py`'s pieces on small arrays: the scales, the operand splits
and the bound its 16-bit form relies on."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from pyspk import reference
from tests.repo import load_tool

model = load_tool("trunk_half_model")


def test_a_chunks_scale_puts_its_largest_value_in_the_top_binade_below_fp16s_max() -> None:
    largest = np.array([1e-30, 3e-7, 1.0, 1.5, 7e3, 6.5e4, 1e30])
    scaled = largest * model.chunk_scale(largest)
    assert np.all((scaled >= 2.0**14) & (scaled < 2.0**15))


def test_the_fp32_split_keeps_22_bits_where_one_fp16_keeps_11() -> None:
    values = np.random.default_rng(0).normal(size=1000) * 3.0
    scale = model.chunk_scale(np.abs(values).max())
    high, low = model.split(values, scale)
    one = model.half(values, scale)
    assert np.array_equal(high, one)
    top = np.abs(values).max()
    assert np.abs(one - values).max() <= top * 2.0**-11
    assert np.abs(high + low - values).max() <= top * 2.0**-22


def test_the_bound_is_above_every_output_of_the_convolution() -> None:
    rng = np.random.default_rng(1)
    x = np.maximum(rng.normal(size=(2, 6, 7, 4)), 0.0)
    x[1] *= 2.0**-9  # a quiet chunk keeps a bound of its own
    conv = SimpleNamespace(
        weight=rng.normal(size=(5, 4, 3, 3)),
        bias=rng.normal(size=5),
        site=SimpleNamespace(shape=SimpleNamespace(stride=1)),
    )
    out = reference.trunk_conv(x, conv.weight, conv.bias, 1, relu=True)
    bound = model.bound_of(x, conv)
    assert np.all(model.largest(out) <= bound)
    assert bound[1] < bound[0]
