"""`tools/trunk_winograd_model.py`'s pieces on small arrays: the transforms, the
convolution it models in each form and the products each form takes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pyspk import reference
from tests.repo import load_tool

model = load_tool("trunk_winograd_model")
half_model = load_tool("trunk_half_model")


def _conv(stride: int, channels_in: int = 20, channels_out: int = 6) -> SimpleNamespace:
    rng = np.random.default_rng(stride)
    return SimpleNamespace(
        weight=rng.normal(size=(channels_out, channels_in, 3, 3)),
        bias=rng.normal(size=channels_out),
        site=SimpleNamespace(shape=SimpleNamespace(stride=stride)),
    )


def _activations(width: int = 11, channels: int = 20) -> np.ndarray:
    """ReLU outputs in FP32 values, two chunks of 7 x `width`, the second 2^-9 quieter."""
    x = np.maximum(np.random.default_rng(5).normal(size=(2, 7, width, channels)), 0.0)
    x[1] *= 2.0**-9
    return x.astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("method", sorted(model.METHODS))
def test_each_forms_transforms_compute_the_three_tap_correlation(method) -> None:
    rng = np.random.default_rng(0)
    for bt, g, at in model.METHODS[method]:
        d, k = rng.normal(size=len(at) + 2), rng.normal(size=3)
        direct = [d[i : i + 3] @ k for i in range(len(at))]
        assert np.allclose(at @ ((g @ k) * (bt @ d)), direct, rtol=0, atol=1e-14)


@pytest.mark.parametrize("stride", [1, 2])
def test_the_direct_tf32_form_is_the_half_models(stride) -> None:
    """The same operand roundings and exact sums as `tools/trunk_half_model.py`: the
    outputs agree to the last FP32 bit, but for a sum that lands on a rounding tie."""
    x, conv = _activations(), _conv(stride)
    ours = model.modelled_conv(x, conv, None, relu=True, math="tf32", method="direct")
    theirs = half_model.rounded_conv(x, conv, None, relu=True)
    assert ours.shape == theirs.shape
    assert np.all(np.abs(ours - theirs) <= np.abs(theirs) * 2.0**-23)


@pytest.mark.parametrize("method", ["winograd 1d", "winograd 2x2", "winograd 4 1d"])
@pytest.mark.parametrize("math", ["tf32", "fp32"])
def test_winograd_forms_stay_near_the_exact_convolution(method, math) -> None:
    """Odd widths (tiles past the edge) and a quiet chunk: each chunk's error within
    eight roundings of its operands (11 bits in TF32 math, 22 in FP32) of its largest
    output (F(4,3)'s transforms, the worst, give about three here; direct about half
    of one)."""
    x, conv = _activations(width=13), _conv(1)
    residual = np.random.default_rng(7).normal(size=(2, 7, 13, 6))
    exact = reference.trunk_conv(x, conv.weight, conv.bias, 1, residual=residual, relu=True)
    got = model.modelled_conv(x, conv, residual, relu=True, math=math, method=method)
    bits = 11 if math == "tf32" else 22
    for chunk in range(2):
        error = np.abs(got[chunk] - exact[chunk]).max()
        assert 0 < error <= np.abs(exact[chunk]).max() * 2.0 ** (3 - bits)


def test_fp32_sums_add_error_to_the_exact_sums_of_the_same_products() -> None:
    x, conv = _activations(channels=64), _conv(1, channels_in=64)
    exact = reference.trunk_conv(x, conv.weight, conv.bias, 1, relu=True)
    errors = {
        math: np.linalg.norm(
            model.modelled_conv(x, conv, None, relu=True, math=math, method="direct") - exact
        )
        for math in ("fp32 exact", "fp32")
    }
    assert errors["fp32"] > errors["fp32 exact"] > 0


def test_each_form_takes_its_tiles_share_of_the_products() -> None:
    """F(2x2,3x3) takes 16 products for 4 outputs of a 3x3 where the direct form takes
    36, so the stride-1 3x3s' share s of the trunk's products falls to 4s/9."""
    from pyspk.candidate.trunk.shapes import TrunkSite, trunk_macs

    assert model.product_share("direct", model.ALL) == 1.0
    assert model.product_share("winograd 2x2", set()) == 1.0
    for layers in ({3, 4}, model.ALL):
        stride1 = sum(
            TrunkSite(f"layer{layer}_conv").shape.macs() * (2 * blocks - 1 if layer > 1 else 6)
            for layer, blocks in zip((1, 2, 3, 4), (3, 4, 6, 3), strict=True)
            if layer in layers
        )
        share = stride1 / trunk_macs()
        assert model.product_share("winograd 2x2", layers) == pytest.approx(1 - share * 5 / 9)
        assert model.product_share("winograd 1d", layers) == pytest.approx(1 - share / 3)


def test_an_operand_transformed_from_a_stored_fp16_input_is_rounded_twice() -> None:
    """The second rounding adds error (here about a tenth)."""
    x, conv = _activations(width=13), _conv(1)
    exact = reference.trunk_conv(x, conv.weight, conv.bias, 1, relu=True)
    errors = {
        math: np.linalg.norm(
            model.modelled_conv(x, conv, None, relu=True, math=math, method="winograd 1d") - exact
        )
        for math in ("tf32", "tf32 stored")
    }
    assert errors["tf32 stored"] > 1.05 * errors["tf32"]
