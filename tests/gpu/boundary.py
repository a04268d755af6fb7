"""Seeded boundary operands at realistic scales, float64 truth, and forced plans."""

from __future__ import annotations

import numpy as np

from pyspk import reference
from pyspk.candidate import DenseSite, DenseSpec, SegConvSite, SegConvSpec
from pyspk.candidate.segdense import Entry, SegdensePin, Site
from pyspk.candidate.segdense.producer import DenseOxide, SegConvOxide
from pyspk.cuda import CudaMath
from pyspk.cuda.kernels import LoadedKernels
from pyspk.cuda.runtime import CudaRuntime

# unit roundoff of FP32
UNIT = 2.0**-24


def operands(site: Site, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 operands at the scales the model sees: unit-variance activations
    and weights drawn as PyTorch initialises them, uniform in +-1/sqrt(fan_in)."""
    rng = np.random.default_rng(seed)
    rows, n, k, length = site.dimensions()
    bound = 1.0 / np.sqrt(k)
    if site.is_conv():
        x = rng.standard_normal((batch, k // 5, length))
        w = rng.uniform(-bound, bound, (n, k // 5, 5))
        return {"x": x.astype(np.float32), "w": w.astype(np.float32)}
    x = rng.standard_normal((batch * rows, k))
    w_shape = (n, k) if site is Site.EMBEDDING else (k, n)
    w = rng.uniform(-bound, bound, w_shape)
    bias = rng.uniform(-bound, bound, n)
    return {
        "x": x.astype(np.float32),
        "w": w.astype(np.float32),
        "bias": bias.astype(np.float32),
    }


def truth(site: Site, batch: int, ops: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(float64 output, float64 sum of |terms| per pre-epilogue output), both flat."""
    if site.is_conv():
        conv_site = SegConvSite(site.value)
        y = reference.conv(conv_site, batch, ops["x"], ops["w"])
        scale = reference.conv_absolute_sum(conv_site, batch, ops["x"], ops["w"])
    else:
        dense_site = DenseSite(site.value)
        y = reference.dense(dense_site, batch, ops["x"], ops["w"], ops["bias"])
        scale = reference.dense_absolute_sum(dense_site, batch, ops["x"], ops["w"], ops["bias"])
    return y.reshape(-1), scale.reshape(-1)


def plan(
    runtime: CudaRuntime,
    kernels: LoadedKernels,
    entry: Entry,
    math: CudaMath,
    ops: dict[str, np.ndarray],
) -> DenseOxide | SegConvOxide:
    """A plan of `entry` forced on this device, from freshly uploaded operands."""
    site, batch = entry.site(), entry.batch()
    pin = SegdensePin.forced(entry, math, kernels.tier, runtime.device)
    weight = runtime.upload(ops["w"])
    if site.is_conv():
        return SegConvOxide.plan(
            runtime, kernels, SegConvSpec(SegConvSite(site.value), batch, math), weight, pin
        )
    bias = runtime.upload(ops["bias"])
    spec = DenseSpec(DenseSite(site.value), batch, math)
    return DenseOxide.plan(runtime, kernels, spec, weight, bias, pin)


def run_eager(runtime: CudaRuntime, oxide: DenseOxide | SegConvOxide, x: np.ndarray) -> np.ndarray:
    """One enqueue from pyspk buffers over a NaN-poisoned output, downloaded."""
    x_buffer = runtime.upload(x)
    out = runtime.upload(np.full(oxide.producer.output_len, np.nan, np.float32))
    oxide.enqueue(x_buffer, out)
    return runtime.download(out)
