"""The sm80 tier's tensor-core entries (the batch-32 convolutions, the TF32 linears with
Select, the split-K embeddings), forced on this device: agreement with float64 within
the bound of each product type (`tensor_bound`), batch items against their own
references, exact results on small integers, finite outputs at the contract boundary,
bit-identical graph replay, no worse error than the library's in the same math (and
Select below plain TF32), launches off the fixed geometry writing nothing, and the sm75
tier's stubs failing loudly (the weight packs: tests/gpu/test_kernels_gpu.py;
compute-sanitizer: tests/gpu/test_sanitizer_gpu.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pyspk.candidate.segdense import Entry, Products, Site, TensorConv
from pyspk.candidate.segdense.packing import pack_conv_half, pack_conv_mma, round_tf32
from pyspk.cuda import CudaMath, PtxTier
from pyspk.cuda.kernels import LoadedKernels
from pyspk.cuda.manifest import KernelModule, Manifest
from pyspk.testing import (
    assert_replay_bit_identical,
    library,
    operands,
    plan,
    relative_l2,
    run_eager,
    tensor_bound,
    truth,
)

pytestmark = pytest.mark.gpu

# every sm80-only entry the shipped sm80 module carries
_SHIPPED = Manifest.load().module(KernelModule.SEGDENSE).tiers[PtxTier.SM80].entries
ENTRIES = [e for e in Entry if e.tier() is PtxTier.SM80 and e.config(1).kernel in _SHIPPED]
BUF = ("ptr", "u64")
FLT_MAX = float(np.finfo(np.float32).max)


def _math(entry: Entry) -> CudaMath:
    return CudaMath.FP32 if entry.products() is Products.FP32 else CudaMath.TF32


def _id(entry: Entry) -> str:
    return entry.name


@pytest.fixture(autouse=True)
def _needs_sm80(kernels: LoadedKernels) -> None:
    if kernels.tier < PtxTier.SM80:
        pytest.skip("the tensor-core entries are stubs below the sm80 tier")


def _check(entry: Entry, ops: dict[str, np.ndarray], y: np.ndarray) -> None:
    exact, scale = truth(entry.site(), entry.batch(), ops)
    assert np.all(np.isfinite(y))
    error = np.abs(y.astype(np.float64) - exact)
    allowed = tensor_bound(entry, exact, scale, ops)
    worst = int(np.argmax(error / allowed))
    assert error[worst] <= allowed[worst], (
        f"output {worst}: error {error[worst]:.3e} over bound {allowed[worst]:.3e}"
    )


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_matches_float64_within_the_product_bound(runtime, kernels, entry: Entry) -> None:
    ops = operands(entry.site(), entry.batch(), seed=31)
    oxide = plan(runtime, entry, _math(entry), ops)
    _check(entry, ops, run_eager(runtime, oxide, ops["x"]))
    oxide.close()


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.batch() == 32], ids=_id)
def test_batch_items_match_their_own_references(runtime, kernels, entry: Entry) -> None:
    """Each item within the bound of a float64 reference of that item alone: no block
    reads another item's rows into its sums, and the last block stops at the last row.
    The bound of each output depends on its own item's operands alone (`tensor_bound`)."""
    _check_items(runtime, kernels, entry, operands(entry.site(), 32, seed=32))


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.batch() == 32], ids=_id)
def test_items_far_apart_in_level_keep_their_own_accuracy(runtime, kernels, entry) -> None:
    """Items alternately times 2^30 and 2^-30 (2^60 apart), no bias: every item within
    its own bound, so no FP16 scale is shared across items: a linear's warp covers 32
    rows, which span two items at 31 of the batch's 589-row boundaries."""
    ops = operands(entry.site(), 32, seed=33)
    levels = np.where(np.arange(32) % 2 == 0, 2.0**30, 2.0**-30).astype(np.float32)
    x = ops["x"].reshape(32, -1) * levels[:, None]
    ops = {**ops, "x": x.reshape(ops["x"].shape)}
    if "bias" in ops:
        ops["bias"] = np.zeros_like(ops["bias"])
    _check_items(runtime, kernels, entry, ops)


def _check_items(runtime, kernels, entry: Entry, ops: dict[str, np.ndarray]) -> None:
    site = entry.site()
    oxide = plan(runtime, entry, _math(entry), ops)
    y = run_eager(runtime, oxide, ops["x"]).reshape(32, -1)
    oxide.close()
    exact_all, scale_all = truth(site, 32, ops)
    bound = tensor_bound(entry, exact_all, scale_all, ops).reshape(32, -1)
    rows = len(ops["x"]) // 32
    for item in range(32):
        if site.is_conv():
            one = {"x": ops["x"][item : item + 1], "w": ops["w"]}
        else:
            one = {**ops, "x": ops["x"][item * rows : (item + 1) * rows]}
        exact, _ = truth(site, 1, one)
        error = np.abs(y[item].astype(np.float64) - exact)
        assert np.all(error <= bound[item]), (
            f"item {item}: rel-L2 {relative_l2(y[item], exact):.3e}, "
            f"worst error over bound {np.max(error / bound[item]):.3g}"
        )


def _exact_float32(entry: Entry, ops: dict[str, np.ndarray]) -> np.ndarray:
    """The output of integer operands in FP32: every sum exact, then the epilogue's
    one FP32 rounding (LeakyReLU's 0.01 v)."""
    site = entry.site()
    if site.is_conv():
        exact, _ = truth(site, entry.batch(), ops)
        return exact.astype(np.float32)
    x, w = ops["x"].astype(np.float64), ops["w"].astype(np.float64)
    logits = (x @ (w.T if site is Site.EMBEDDING else w) + ops["bias"]).astype(np.float32)
    if site is Site.EMBEDDING:
        return logits.reshape(-1)
    return np.where(logits < 0, np.float32(0.01) * logits, logits).reshape(-1)


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_small_integers_are_exact(runtime, kernels, entry: Entry) -> None:
    """Integers in [-3, 3]: every operand is a TF32 value (no residual) and, scaled by a
    power of two, an FP16 one; every product and partial sum an integer below 2^24 (or
    such an integer times a power of two), so any summation order gives the exact
    result."""
    rng = np.random.default_rng(33)
    ops = operands(entry.site(), entry.batch(), seed=33)
    ops = {name: rng.integers(-3, 4, value.shape).astype(np.float32) for name, value in ops.items()}
    oxide = plan(runtime, entry, _math(entry), ops)
    y = run_eager(runtime, oxide, ops["x"])
    oxide.close()
    assert np.array_equal(y, _exact_float32(entry, ops))


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_finite_at_the_contract_boundary(runtime, kernels, entry: Entry) -> None:
    """Operands scaled by powers of two until the largest sum of |terms| is within a
    factor 2 below FLT_MAX / 2: every output finite and within the bound."""
    batch = entry.batch()
    ops = operands(entry.site(), batch, seed=34)
    _, scale = truth(entry.site(), batch, ops)
    shift = int(np.floor(np.log2(FLT_MAX / 2 / scale.max())))
    factors = {"x": 2.0 ** (shift // 2), "w": 2.0 ** (shift - shift // 2), "bias": 2.0**shift}
    ops = {name: value * np.float32(factors[name]) for name, value in ops.items()}
    _, scale = truth(entry.site(), batch, ops)
    assert FLT_MAX / 4 < scale.max() <= FLT_MAX / 2
    oxide = plan(runtime, entry, _math(entry), ops)
    _check(entry, ops, run_eager(runtime, oxide, ops["x"]))
    oxide.close()


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.products() is Products.FP16], ids=_id)
def test_scaled_products_with_operand_scales_far_apart(runtime, kernels, entry: Entry) -> None:
    """x times 2^110 and w times 2^-110: every product as before, but the kernel's
    accumulators (about 2^31 in the scaled domain) times the x scale's inverse alone
    (about 2^98) would pass FP32's range before the w scale's inverse (about 2^-120)
    brought them back. Every output finite and within the bound."""
    ops = operands(entry.site(), entry.batch(), seed=40)
    ops = {**ops, "x": ops["x"] * np.float32(2.0**110), "w": ops["w"] * np.float32(2.0**-110)}
    oxide = plan(runtime, entry, _math(entry), ops)
    _check(entry, ops, run_eager(runtime, oxide, ops["x"]))
    oxide.close()


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_graph_replay_is_bit_identical(runtime, kernels, entry: Entry) -> None:
    ops = operands(entry.site(), entry.batch(), seed=35)
    oxide = plan(runtime, entry, _math(entry), ops)
    assert_replay_bit_identical(runtime, oxide, ops["x"])
    oxide.close()


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_no_less_exact_than_the_library(runtime, kernels, torch, entry: Entry) -> None:
    """3xTF32 entries against the library in FP32 math, and Select against it in TF32
    math: at most its error. The other TF32-math entries round each operand to the
    library's 11 significant bits (TF32, or FP16 after a power-of-two scaling), so their
    rel-L2 differ from the library's only by how the rounding errors of N outputs happen
    to sum: measured on the H200 within 3e-5
    (convolutions, N = 1e7), 7e-5 (linear0 at batch 1, N = 7.5e4) and 2.4e-4 (embedding,
    N = 2.5e4) of it, either side, about 0.05 / sqrt(N). Such an entry may exceed the
    library's error by 0.2 / sqrt(N) of it, four times that spread; truncating instead
    of rounding an operand would exceed it by about 40%."""
    batch = entry.batch()
    ops = operands(entry.site(), batch, seed=36)
    exact, _ = truth(entry.site(), batch, ops)
    oxide = plan(runtime, entry, _math(entry), ops)
    ours = relative_l2(run_eager(runtime, oxide, ops["x"]), exact)
    oxide.close()
    theirs = relative_l2(library(torch, entry.site(), ops, _math(entry)), exact)
    strict = entry.products() is Products.FP32 or entry is Entry.LINEAR0_B32_SELECT
    allowed = theirs if strict else theirs * (1 + 0.2 / np.sqrt(exact.size))
    assert ours <= allowed, f"rel-L2 {ours:.7e} against the library's {theirs:.7e}"


def test_select_is_more_exact_than_plain_tf32(runtime, kernels) -> None:
    """LINEAR0_B32_SELECT against the float64 sum of the TF32-rounded operands (plain
    TF32 products with an exact sum), on the same inputs: recomputing the 16 rows of
    largest energy in 3xTF32 lowers the relative L2 error by at least 1%."""
    entry = Entry.LINEAR0_B32_SELECT
    if entry not in ENTRIES:
        pytest.skip("the sm80 module does not carry LINEAR0_B32_SELECT")
    ops = operands(Site.LINEAR0, 32, seed=39)
    exact, _ = truth(Site.LINEAR0, 32, ops)
    oxide = plan(runtime, entry, CudaMath.TF32, ops)
    ours = relative_l2(run_eager(runtime, oxide, ops["x"]), exact)
    oxide.close()
    rounded = {**ops, "x": round_tf32(ops["x"]), "w": round_tf32(ops["w"])}
    plain = relative_l2(truth(Site.LINEAR0, 32, rounded)[0].astype(np.float32), exact)
    assert ours <= 0.99 * plain, f"Select rel-L2 {ours:.4e}, plain TF32 {plain:.4e}"


def _launch_tensor_conv(runtime, kernels, entry: Entry, **change) -> np.ndarray:
    """One direct launch of `entry` on seeded operands, with `change` overriding the
    grid, block, shared bytes or a length; the output, NaN-poisoned before, downloaded."""
    site = entry.site()
    rows, n, k, _ = site.dimensions()
    kind = entry.config(0).kind
    assert isinstance(kind, TensorConv)
    ops = operands(site, 32, seed=37)
    if kind.planes == 1:
        packed = pack_conv_half(ops["w"], k // 5, kind.cin_pad)
    else:
        packed = pack_conv_mma(ops["w"], k // 5, kind.cin_pad, kind.planes)
    x, w = runtime.upload(ops["x"]), runtime.upload(packed)
    y = runtime.upload(np.full(32 * n * rows, np.nan, np.float32))
    config = entry.config(0)
    shape = {
        "grid": (-(-rows // kind.positions), 32, 1),
        "block": config.block,
        "shared": config.shared,
        "x_len": x.len,
        "w_len": w.len,
        "y_len": y.len,
    } | change
    function = kernels.function(config.kernel)
    function.set_max_dynamic_shared(max(shape["shared"], config.shared))
    function.launch(
        shape["grid"],
        shape["block"],
        shape["shared"],
        BUF * 3,
        [x.ptr, shape["x_len"], w.ptr, shape["w_len"], y.ptr, shape["y_len"]],
    ).enqueue(runtime.stream)
    out = runtime.download(y)
    for buffer in (x, w, y):
        buffer.free()
    return out


OFF_GEOMETRY = {
    "shared": {"shared": 44544 + 16},
    "grid x": {"grid": (41, 32, 1)},
    "grid y": {"grid": (42, 31, 1)},
    "block": {"block": 64},
    "x_len": {"x_len": 32 * 80 * 5325 - 1},
    "w_len": {"w_len": 80 * 5 * 32 + 64 + 4},
    "y_len": {"y_len": 32 * 60 * 5321 + 1},
}


def test_control_launch_writes(runtime, kernels) -> None:
    # the test below would pass vacuously if a correct launch wrote nothing either
    y = _launch_tensor_conv(runtime, kernels, Entry.CONV1_B32_TC)
    assert np.all(np.isfinite(y))


@pytest.mark.parametrize("case", list(OFF_GEOMETRY))
def test_off_geometry_launch_writes_nothing(runtime, kernels, case: str) -> None:
    y = _launch_tensor_conv(runtime, kernels, Entry.CONV1_B32_TC, **OFF_GEOMETRY[case])
    assert np.all(np.isnan(y)), f"{case}: the kernel wrote its output"


_STUB_LAUNCH = textwrap.dedent(
    """
    import os
    import sys
    import numpy as np
    from pyspk.cuda import PtxTier
    from pyspk.cuda.errors import DriverError
    from pyspk.cuda.manifest import KernelModule
    from pyspk.cuda.runtime import CudaRuntime

    name, shared = sys.argv[1], int(sys.argv[2])
    with CudaRuntime(0, ptx_tier=PtxTier.SM75) as runtime:
        kernels = runtime.load_kernels(KernelModule.SEGDENSE)
        assert kernels.tier is PtxTier.SM75
        x = runtime.upload(np.ones(32 * 80 * 5325, np.float32))
        w = runtime.upload(np.ones(80 * 5 * 64, np.float32))
        y = runtime.upload(np.full(32 * 60 * 5321, np.nan, np.float32))
        function = kernels.function(name)
        function.set_max_dynamic_shared(shared)
        buf = ("ptr", "u64")
        try:
            function.launch((42, 32, 1), 128, shared, buf * 3,
                            [x.ptr, x.len, w.ptr, w.len, y.ptr, y.len]).enqueue(runtime.stream)
            runtime.synchronize()
        except DriverError as error:
            # the context is unusable from here on: leave without closing it
            print("driver error:", error, flush=True)
            os._exit(3)
    print("no error")
    """
)


def test_sm75_stub_fails_with_a_driver_error() -> None:
    """The sm75 tier's tensor-core entry executes `trap`: the launch ends in a driver
    error, in a subprocess since the error poisons that context for good."""
    result = subprocess.run(
        [sys.executable, "-c", _STUB_LAUNCH, "spk_segdense_conv1_b32_tc", "44544"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "driver error" in result.stdout
