"""Float64 truth for the six boundaries, on the layouts the kernels use.

Every function takes float32 or float64 arrays (flat or shaped), computes in float64 and
returns float64 with the boundary's output shape. `absolute_sum` gives, per output, the
float64 sum of the absolute values of its terms, which scales rounding-error bounds and
the finite-output contract."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pyspk.candidate.framework import CONV_TAPS, DenseSite, SegConvSite
from pyspk.cuda.errors import InvalidArgument

LEAKY_SLOPE = 0.01


def _f64(array: npt.ArrayLike, shape: tuple[int, ...], name: str) -> np.ndarray:
    values = np.asarray(array, dtype=np.float64)
    if values.size != int(np.prod(shape)):
        raise InvalidArgument(f"{name} has {values.size} elements, expected {shape}")
    return values.reshape(shape)


def conv(site: SegConvSite, batch: int, x: npt.ArrayLike, w: npt.ArrayLike) -> np.ndarray:
    """Valid five-tap NCW convolution without bias: x [b, cin, L], w [60, cin, 5] ->
    [b, 60, L - 4]."""
    positions, n, k, length = site.dimensions()
    cin = k // CONV_TAPS
    x = _f64(x, (batch, cin, length), "x")
    w = _f64(w, (n, cin, CONV_TAPS), "w")
    taps = w.reshape(n, k).T  # [(ci, tap), o]
    out = np.empty((batch, n, positions))
    for item in range(batch):
        # [p, (ci, tap)] windows of one item keep the BLAS product within memory
        windows = np.lib.stride_tricks.sliding_window_view(x[item], CONV_TAPS, axis=1)
        out[item] = (windows.transpose(1, 0, 2).reshape(positions, k) @ taps).T
    return out


def conv_absolute_sum(
    site: SegConvSite, batch: int, x: npt.ArrayLike, w: npt.ArrayLike
) -> np.ndarray:
    return conv(site, batch, np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64)))


def leaky_relu(values: np.ndarray) -> np.ndarray:
    """x where x >= 0 or x is NaN, else 0.01 x."""
    return np.where(values < 0, LEAKY_SLOPE * values, values)


def log_softmax(values: np.ndarray) -> np.ndarray:
    """Per row: x - max - ln(sum(exp(x - max)))."""
    shifted = values - values.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _affine(
    site: DenseSite, batch: int, x: npt.ArrayLike, w: npt.ArrayLike, bias: npt.ArrayLike
) -> np.ndarray:
    rows, n, k = site.dimensions()
    m = batch * rows
    x = _f64(x, (m, k), "x")
    bias = _f64(bias, (n,), "bias")
    if site is DenseSite.EMBEDDING:
        return x @ _f64(w, (n, k), "w").T + bias
    return x @ _f64(w, (k, n), "w") + bias


def dense(
    site: DenseSite, batch: int, x: npt.ArrayLike, w: npt.ArrayLike, bias: npt.ArrayLike
) -> np.ndarray:
    """The dense boundary with its epilogue: [m, n] for m = batch * rows.

    Linear weights are [k, n]; the embedding weight is [n, k] (PyTorch Linear layout)."""
    affine = _affine(site, batch, x, w, bias)
    if site in (DenseSite.LINEAR0, DenseSite.LINEAR1):
        return leaky_relu(affine)
    if site is DenseSite.CLASSIFIER:
        return log_softmax(affine)
    return affine


def dense_absolute_sum(
    site: DenseSite, batch: int, x: npt.ArrayLike, w: npt.ArrayLike, bias: npt.ArrayLike
) -> np.ndarray:
    """Per pre-epilogue output, sum |w x| + |bias| in float64."""
    return _affine(
        site,
        batch,
        np.abs(np.asarray(x, np.float64)),
        np.abs(np.asarray(w, np.float64)),
        np.abs(np.asarray(bias, np.float64)),
    )
