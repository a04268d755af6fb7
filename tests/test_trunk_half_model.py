"""`tools/trunk_half_model.py`'s pieces on small arrays: the scales, the operand splits
and the bound its 16-bit form relies on."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from pyspk import reference
from tests.repo import load_tool

model = load_tool("trunk_half_model")


def _conv(
    rng: np.random.Generator, site: str, channels_in: int, channels_out: int = 4
) -> SimpleNamespace:
    """A 3x3 stride-1 convolution of `site` with N(0, 1) weights and bias."""
    return SimpleNamespace(
        weight=rng.normal(size=(channels_out, channels_in, 3, 3)),
        bias=rng.normal(size=channels_out),
        site=SimpleNamespace(value=site, shape=SimpleNamespace(stride=1)),
    )


def _weights(sites: list[str]) -> SimpleNamespace:
    rng = np.random.default_rng(2)
    blocks = [
        SimpleNamespace(conv1=_conv(rng, site, 4), conv2=_conv(rng, site, 4), shortcut=None)
        for site in sites
    ]
    return SimpleNamespace(stem=_conv(rng, "stem", 1), blocks=blocks)


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
    conv = _conv(rng, "layer1_conv", 4, channels_out=5)
    out = reference.trunk_conv(x, conv.weight, conv.bias, 1, relu=True)
    bound = model.bound_of(x, conv)
    assert np.all(model.largest(out) <= bound)
    assert bound[1] < bound[0]


def test_the_layer1_form_stores_layer1s_outputs_as_the_all_form_and_no_others() -> None:
    fbank = np.random.default_rng(3).normal(size=(2, 7, 5)) * 2.0
    only_layer1 = _weights(["layer1_conv", "layer1_conv"])
    both = {form: model.model(fbank, only_layer1, form)[0] for form in ("tf32 all", "tf32 layer1")}
    assert np.array_equal(both["tf32 all"], both["tf32 layer1"])
    with_layer2 = _weights(["layer1_conv", "layer2_conv"])
    forms = ("tf32 all", "tf32 layer1", "tf32 bound")
    out = {form: model.model(fbank, with_layer2, form)[0] for form in forms}
    assert not np.array_equal(out["tf32 layer1"], out["tf32 all"])  # layer2's output kept
    assert not np.array_equal(out["tf32 layer1"], out["tf32 bound"])  # layer1's stored


def test_the_stream_forms_store_each_layers_block_outputs_but_its_last() -> None:
    fbank = np.random.default_rng(4).normal(size=(2, 7, 5)) * 2.0
    sites = ["layer1_conv", "layer1_conv", "layer2_conv", "layer2_conv"]
    forms = ("tf32 stream1", "tf32 stream2", "tf32 stream3", "tf32 bound")
    out = {form: model.model(fbank, _weights(sites), form)[0] for form in forms}
    assert not np.array_equal(out["tf32 stream1"], out["tf32 bound"])  # block 0 stored
    assert not np.array_equal(out["tf32 stream1"], out["tf32 stream2"])  # block 2 stored
    assert np.array_equal(out["tf32 stream2"], out["tf32 stream3"])  # no layer3 blocks
    # a layer of one block keeps its output: only the stem's is stored in either form
    single = _weights(["layer1_conv", "layer2_conv"])
    one, two = (model.model(fbank, single, form)[0] for form in ("tf32 stream1", "tf32 stream2"))
    assert np.array_equal(one, two)
