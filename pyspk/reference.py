"""Float64 truth for the six boundaries, the ResNet34 trunk, its fbank and its statistics
pooling, the BiLSTM and SincNet's first stage, on the layouts the kernels use.

Every function takes float32 or float64 arrays (flat or shaped), computes in float64 and
returns float64 with the boundary's output shape. `absolute_sum` gives, per output, the
float64 sum of the absolute values of its terms, which scales rounding-error bounds and
the finite-output contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pyspk.candidate.framework import CONV_TAPS, DenseSite, SegConvSite
from pyspk.cuda.errors import InvalidArgument

if TYPE_CHECKING:
    from pyspk.candidate.trunk.folding import TrunkWeights

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


def trunk_conv(
    x: npt.ArrayLike,
    weight: npt.ArrayLike,
    bias: npt.ArrayLike,
    stride: int,
    *,
    residual: npt.ArrayLike | None = None,
    relu: bool = False,
) -> np.ndarray:
    """One convolution of the ResNet trunk on NHWC activations: x [b, h, w, cin], weight
    [cout, cin, ks, ks] (ks 3 with padding 1, or 1), bias [cout], residual [b, hout,
    wout, cout] -> [b, hout, wout, cout]: conv + bias (+ residual), ReLU if asked."""
    x = np.asarray(x, np.float64)
    weight = np.asarray(weight, np.float64)
    if x.ndim != 4 or weight.ndim != 4 or x.shape[3] != weight.shape[1]:
        raise InvalidArgument(f"trunk_conv: x {x.shape} and weight {weight.shape} do not match")
    ks = weight.shape[2]
    pad = ks // 2
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    hout = (x.shape[1] + 2 * pad - ks) // stride + 1
    wout = (x.shape[2] + 2 * pad - ks) // stride + 1
    out = np.zeros((x.shape[0], hout, wout, weight.shape[0]))
    for dy in range(ks):
        for dx in range(ks):
            window = padded[:, dy : dy + stride * hout : stride, dx : dx + stride * wout : stride]
            # contiguous 2-D operands keep the product on BLAS
            rows = np.ascontiguousarray(window).reshape(-1, x.shape[3])
            out += (rows @ weight[:, :, dy, dx].T).reshape(out.shape)
    out += np.asarray(bias, np.float64)
    if residual is not None:
        out += np.asarray(residual, np.float64)
    return np.maximum(out, 0.0) if relu else out


def trunk(fbank: npt.ArrayLike, weights: TrunkWeights) -> np.ndarray:
    """The whole ResNet34 trunk with folded weights: fbank [b, frames, bins] -> the
    model's `forward_frames` output [b, 256, 10, 125] (NCHW)."""
    x = np.asarray(fbank, np.float64).transpose(0, 2, 1)[..., None]
    stem = weights.stem
    x = trunk_conv(x, stem.weight, stem.bias, 1, relu=True)
    for block in weights.blocks:
        stride = block.conv1.site.shape.stride
        h = trunk_conv(x, block.conv1.weight, block.conv1.bias, stride, relu=True)
        shortcut = x
        if block.shortcut is not None:
            shortcut = trunk_conv(x, block.shortcut.weight, block.shortcut.bias, stride)
        x = trunk_conv(h, block.conv2.weight, block.conv2.bias, 1, residual=shortcut, relu=True)
    return x.transpose(0, 3, 1, 2)


LstmDirection = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""One direction of one LSTM layer: `weight_ih` [4H, in], `weight_hh` [4H, H], `bias_ih`
and `bias_hh` [4H], gates in PyTorch's order (input, forget, cell, output)."""


def _sigmoid(values: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * values))


def _lstm_direction(x: np.ndarray, weights: LstmDirection, reverse: bool) -> np.ndarray:
    weight_ih, weight_hh, bias_ih, bias_hh = (np.asarray(w, np.float64) for w in weights)
    batch, steps, _ = x.shape
    hidden = weight_hh.shape[1]
    inputs = x @ weight_ih.T + (bias_ih + bias_hh)  # every step's input part at once
    h = np.zeros((batch, hidden))
    c = np.zeros((batch, hidden))
    out = np.empty((batch, steps, hidden))
    for step in range(steps - 1, -1, -1) if reverse else range(steps):
        gates = inputs[:, step] + h @ weight_hh.T
        i, f, g, o = np.split(gates, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        out[:, step] = h
    return out


def bilstm(x: npt.ArrayLike, layers: list[tuple[LstmDirection, LstmDirection]]) -> np.ndarray:
    """A stacked bidirectional LSTM as PyTorch's `nn.LSTM(batch_first=True,
    bidirectional=True)` computes it, zero initial states: x [batch, steps, features] ->
    [batch, steps, 2H], each layer's forward and reverse outputs concatenated."""
    values = np.asarray(x, np.float64)
    if values.ndim != 3:
        raise InvalidArgument(f"x must be [batch, steps, features], not {values.shape}")
    for forward, backward in layers:
        values = np.concatenate(
            [_lstm_direction(values, forward, False), _lstm_direction(values, backward, True)],
            axis=2,
        )
    return values


def sinc_front(x: npt.ArrayLike, filters: npt.ArrayLike, stride: int = 10) -> np.ndarray:
    """SincNet's first stage: x [items, samples] and filters [80, taps] -> MaxPool1d(3, 3)
    of |the valid convolution at `stride`|, [items, 80, pooled]."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(filters, dtype=np.float64)
    if x.ndim != 2 or w.ndim != 2:
        raise InvalidArgument(f"x and filters must be 2-D, not {x.shape} and {w.shape}")
    windows = np.lib.stride_tricks.sliding_window_view(x, w.shape[1], axis=1)[:, ::stride]
    pooled = windows.shape[1] // 3
    out = np.abs(windows[:, : 3 * pooled] @ w.T)  # [items, positions, 80]
    return out.reshape(x.shape[0], pooled, 3, w.shape[0]).max(axis=2).transpose(0, 2, 1)


def stats_pool(x: npt.ArrayLike, w: npt.ArrayLike) -> np.ndarray:
    """pyannote's weighted statistics pooling: x [items, features, frames] and weights w
    [items, speakers, frames] -> [items, speakers, 2 features], each speaker's weighted
    mean of every feature, then `sqrt(sum w (x - mean)^2 / (v1 - sum w^2 / v1 + 1e-8))`
    with `v1 = sum w + 1e-8`."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if x.ndim != 3 or w.ndim != 3 or x.shape[0] != w.shape[0] or x.shape[2] != w.shape[2]:
        raise InvalidArgument(f"x and w must be [items, *, frames] alike, not {x.shape}, {w.shape}")
    v1 = w.sum(axis=2, keepdims=True) + 1e-8  # [items, speakers, 1]
    mean = np.einsum("isf,irf->isr", w, x) / v1
    centred = x[:, None, :, :] - mean[:, :, :, None]  # [items, speakers, features, frames]
    spread = np.einsum("isf,isrf->isr", w, centred * centred)
    std = np.sqrt(spread / (v1 - (w * w).sum(axis=2, keepdims=True) / v1 + 1e-8))
    return np.concatenate([mean, std], axis=2)


def kaldi_fbank(
    x: npt.ArrayLike, window: npt.ArrayLike, banks: npt.ArrayLike, shift: int = 160
) -> np.ndarray:
    """WeSpeaker's fbank as pyannote computes it: x [items, samples] (scaled by 2^15)
    in frames of len(window) samples every `shift`, each frame's mean removed,
    pre-emphasis 0.97 (the first sample its own predecessor), the window, the power
    spectrum of the real FFT zero-padded to 2 (banks' rows - 1) points, the mel banks
    [bins, mels], the log floored at FP32's epsilon, less each mel's mean over the
    chunk's frames: [items, frames, mels]."""
    x = np.asarray(x, dtype=np.float64) * 32768.0
    w = np.asarray(window, dtype=np.float64)
    b = np.asarray(banks, dtype=np.float64)
    if x.ndim != 2 or w.ndim != 1 or b.ndim != 2 or x.shape[1] < w.size:
        raise InvalidArgument(f"x [items, samples >= {w.size}] and 1-D window, 2-D banks")
    frames = np.lib.stride_tricks.sliding_window_view(x, w.size, axis=1)[:, ::shift]
    frames = frames - frames.mean(axis=2, keepdims=True)
    previous = np.concatenate([frames[..., :1], frames[..., :-1]], axis=2)
    spectrum = np.fft.rfft((frames - 0.97 * previous) * w, n=2 * (b.shape[0] - 1), axis=2)
    power = spectrum.real**2 + spectrum.imag**2
    features = np.log(np.maximum(power @ b, float(np.finfo(np.float32).eps)))
    return features - features.mean(axis=1, keepdims=True)
