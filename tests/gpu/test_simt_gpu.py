"""Every FP32 SIMT entry (the entries the sm75 tier carries for real), forced on this
device, at its batch and in both math modes: float64 agreement within the derived
bound, no worse than twice the library's FP32 error, bit-identical graph replay, and
batch-32 items that match their own single-item references."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.candidate.segdense import Entry, Products, Site
from pyspk.cuda import CudaMath, PtxTier
from pyspk.testing import (
    UNIT,
    assert_replay_bit_identical,
    error_bound,
    library,
    operands,
    plan,
    relative_l2,
    run_eager,
    truth,
)

pytestmark = pytest.mark.gpu

SIMT = [entry for entry in Entry if entry.tier() is PtxTier.SM75]
FP32_SIMT = [entry for entry in SIMT if entry.products() is Products.FP32]
# dot products accumulated with error-free transformations
COMPENSATED = {Entry.LINEAR1_B1, Entry.CLASSIFIER_B32}


def _cases() -> list[tuple[Entry, CudaMath]]:
    # TF32-product entries are never pinned to FP32 math (SegdensePin.forced refuses it)
    return [(e, m) for e in SIMT for m in CudaMath if e in FP32_SIMT or m is CudaMath.TF32]


def _id(case: object) -> str:
    return case.name if isinstance(case, Entry) else str(case)


@pytest.mark.parametrize(("entry", "math"), _cases(), ids=_id)
def test_matches_float64(runtime, kernels, entry: Entry, math: CudaMath) -> None:
    site, batch = entry.site(), entry.batch()
    ops = operands(site, batch, seed=21)
    exact, scale = truth(site, batch, ops)
    oxide = plan(runtime, entry, math, ops)
    y = run_eager(runtime, oxide, ops["x"])
    oxide.close()
    assert np.all(np.isfinite(y))
    error = np.abs(y - exact)
    allowed = error_bound(entry, exact, scale)
    worst = int(np.argmax(error / allowed))
    assert error[worst] <= allowed[worst], (
        f"output {worst}: error {error[worst]:.3e} over bound {allowed[worst]:.3e}"
    )
    if entry in COMPENSATED:
        # compensated sums land within a rounding or two of the float64 logit; a plain
        # FP32 sum errs by about sqrt(k) u sum|terms|, several times more
        # the dot product rounds once, then once more where the bias is added
        dot = (ops["x"].astype(np.float64) @ ops["w"].astype(np.float64)).reshape(-1)
        logits = dot + np.tile(ops["bias"].astype(np.float64), len(dot) // len(ops["bias"]))
        logit_error = UNIT * (np.abs(logits) + np.abs(dot)) + (256 * UNIT) ** 2 * scale
        if site is Site.LINEAR2:
            row_worst = logit_error.reshape(-1, 7).max(axis=1).repeat(7)
            logit_error = 2 * row_worst + 16 * UNIT * (np.abs(exact) + 1)
        else:
            logit_error = logit_error + UNIT * np.abs(exact)
        assert np.all(error <= logit_error)


@pytest.mark.parametrize("entry", FP32_SIMT, ids=_id)
def test_no_worse_than_twice_the_library(runtime, kernels, torch, entry: Entry) -> None:
    site, batch = entry.site(), entry.batch()
    ops = operands(site, batch, seed=22)
    exact, _ = truth(site, batch, ops)
    oxide = plan(runtime, entry, CudaMath.FP32, ops)
    ours = run_eager(runtime, oxide, ops["x"])
    oxide.close()
    theirs = library(torch, site, ops, CudaMath.FP32)
    assert relative_l2(ours, exact) <= 2 * relative_l2(theirs, exact)


@pytest.mark.parametrize("entry", SIMT, ids=_id)
def test_graph_replay_is_bit_identical(runtime, kernels, entry: Entry) -> None:
    ops = operands(entry.site(), entry.batch(), seed=23)
    math = CudaMath.FP32 if entry in FP32_SIMT else CudaMath.TF32
    oxide = plan(runtime, entry, math, ops)
    assert_replay_bit_identical(runtime, oxide, ops["x"])
    oxide.close()


@pytest.mark.parametrize("entry", [e for e in FP32_SIMT if e.batch() == 32], ids=_id)
def test_batch_items_match_their_own_references(runtime, kernels, entry: Entry) -> None:
    """Each of the 32 items agrees with a float64 reference of that item alone, so no
    item reads another's rows or channels."""
    site = entry.site()
    ops = operands(site, 32, seed=24)
    oxide = plan(runtime, entry, CudaMath.FP32, ops)
    y = run_eager(runtime, oxide, ops["x"]).reshape(32, -1)
    oxide.close()
    per_item = len(ops["x"]) // 32 if not site.is_conv() else 1
    for item in range(32):
        if site.is_conv():
            one = {"x": ops["x"][item : item + 1], "w": ops["w"]}
        else:
            rows = slice(item * per_item, (item + 1) * per_item)
            one = {"x": ops["x"][rows], "w": ops["w"], "bias": ops["bias"]}
        exact, scale = truth(site, 1, one)
        allowed = error_bound(entry, exact, scale)
        assert np.all(np.abs(y[item] - exact) <= allowed), f"item {item}"
