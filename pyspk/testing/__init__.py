"""What the GPU tests and the benchmark share: seeded boundary operands at realistic
scales, float64 truth and error measures, the error bounds of each product type, forced
plans and their eager runs, the library path through PyTorch (passed in, never imported
here), and per-launch host timing. Importing it loads neither torch nor the driver."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pyspk import reference
from pyspk.candidate import SegConvSite
from pyspk.candidate.segdense import EMBED_MAX_SPLITS, Area, Entry, Products, SegdensePin, Site
from pyspk.candidate.segdense.candidates import DenseOxide, SegConvOxide
from pyspk.cuda import CudaMath
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
    framework_site = site.framework_site()
    if isinstance(framework_site, SegConvSite):
        y = reference.conv(framework_site, batch, ops["x"], ops["w"])
        scale = reference.conv_absolute_sum(framework_site, batch, ops["x"], ops["w"])
    else:
        y = reference.dense(framework_site, batch, ops["x"], ops["w"], ops["bias"])
        scale = reference.dense_absolute_sum(framework_site, batch, ops["x"], ops["w"], ops["bias"])
    return y.reshape(-1), scale.reshape(-1)


def plan_pin(
    runtime: CudaRuntime, pin: SegdensePin, ops: dict[str, np.ndarray]
) -> DenseOxide | SegConvOxide:
    """`pin` planned through the front door from freshly uploaded operands, freed once the
    plan holds its own packed copy."""
    entry = pin.entry()
    uploads = [runtime.upload(ops[name]) for name in ("w", "bias") if name in ops]
    try:
        bias = uploads[1] if len(uploads) > 1 else None
        return Area.plan(runtime, entry.site(), entry.batch(), pin.math, uploads[0], bias, pin=pin)
    finally:
        runtime.synchronize()
        for buffer in uploads:
            buffer.free()


def plan(
    runtime: CudaRuntime, entry: Entry, math: CudaMath, ops: dict[str, np.ndarray]
) -> DenseOxide | SegConvOxide:
    """A plan of `entry` forced on this device."""
    tier = runtime.load_kernels(Area.AREA).tier
    return plan_pin(runtime, SegdensePin.forced(entry, math, tier, runtime.device), ops)


def run_eager(runtime: CudaRuntime, oxide: DenseOxide | SegConvOxide, x: np.ndarray) -> np.ndarray:
    """One enqueue from pyspk buffers over a NaN-poisoned output, downloaded."""
    x_buffer = runtime.upload(x)
    out = runtime.upload(np.full(oxide.producer.output_len, np.nan, np.float32))
    oxide.enqueue(x_buffer, out)
    return runtime.download(out)


def error_bound(entry: Entry, exact: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Per-output error an FP32 kernel of `entry` may show against float64.

    Pre-epilogue: any order of FP32 summation of k products and the bias errs by at most
    gamma_{k+2} * sum|terms| (gamma_n = n u / (1 - n u)). LeakyReLU is 1-Lipschitz and
    adds one rounding of |y|. Log-softmax moves an output by at most twice the largest
    logit error of its row, plus a few roundings of its exp/log arithmetic."""
    site = entry.site()
    k = site.dimensions()[2]
    gamma = (k + 2) * UNIT / (1 - (k + 2) * UNIT)
    logit = gamma * scale
    if site in (Site.LINEAR0, Site.LINEAR1):
        return logit + UNIT * np.abs(exact)
    if site is Site.LINEAR2:
        row_worst = logit.reshape(-1, 7).max(axis=1, keepdims=True)
        return (2 * row_worst + 16 * UNIT * (np.abs(exact.reshape(-1, 7)) + 1)).reshape(-1)
    return logit


def tensor_bound(
    entry: Entry, exact: np.ndarray, scale: np.ndarray, ops: dict[str, np.ndarray]
) -> np.ndarray:
    """Per-output error a tensor-core entry may show against float64, from the bounds
    stated in ptx/src/segdense/segconv_mma.cuh, seggemm_mma.cuh and seggemm_half.cuh
    (u = 2^-24; no accumulator chains more than s = ceil(k / 8) k-steps of the mma):

    TF32 products (both operands rounded, ties away): each term errs by at most
    (2^-11 + 2^-11 + 2^-22) |a b|, and each of the s chained mma truncates at most
    9 * 2^-23 of the magnitudes it adds, so (2^-10 + 2^-22 + 18 s u) sum|terms|; the
    Select rows, recomputed in 3xTF32, only lower it. Scaled FP16 products round
    each operand to 11 significant bits too, and below FP16's normal range by an absolute
    2^-25 of the scaled value: 2^-38 (max|x_r| sum|w_c| + max|w_c| sum|x_r|) more, over
    the terms of the output (the convolutions: max|x| of the item, which bounds that of
    the window a warp scales by; the batch-32 linears: max|x| of the rows of one item
    among the 32 a warp scales).
    3xTF32: the dropped a_lo b_lo and split residuals cost 12 u |a b| per term, the
    three mma of a k-step at most 36 u of its terms, and the s FP32 additions s u, so
    (12 + 36 + s + 1) u sum|terms|. All then take one rounding per added k-split group,
    split-K plane (at most 128) and the bias; LeakyReLU is 1-Lipschitz and rounds once
    more. Worst cases; the slack 1.01 covers the second-order terms dropped in deriving
    them."""
    steps = -(-entry.site().dimensions()[2] // 8)
    if entry.products() is Products.FP32:
        factor = (12 + 36 + steps + 1) * UNIT
    else:
        factor = 2.0**-10 + 2.0**-22 + 18 * steps * UNIT
    factor += (EMBED_MAX_SPLITS + 4) * UNIT
    bound = 1.01 * factor * scale
    if entry.products() is Products.FP16:
        bound = bound + 2.0**-38 * _fp16_floor(entry.site(), ops)
    if entry.site() in (Site.LINEAR0, Site.LINEAR1):
        bound = bound + UNIT * np.abs(exact)
    return bound


def _fp16_floor(site: Site, ops: dict[str, np.ndarray]) -> np.ndarray:
    """max|x| sum|w| + max|w| sum|x| over the terms of each output, flat: what FP16's
    range costs scaled operands (`tensor_bound`). Convolution operands are `[b, cin, L]`
    and `[60, cin, 5]`, any batch; max|x| is per row for the embedding and per item's
    rows among 32 for the linears."""
    x, w = np.abs(ops["x"].astype(np.float64)), np.abs(ops["w"].astype(np.float64))
    if site.is_conv():
        batch = x.shape[0]
        conv_site = site.framework_site()
        assert isinstance(conv_site, SegConvSite)  # the convolutions' sites
        x_sums = reference.conv_absolute_sum(conv_site, batch, ops["x"], np.ones_like(ops["w"]))
        w_rows = w.reshape(w.shape[0], -1)
        x_max = x.reshape(batch, -1).max(axis=1)
        floor = x_max[:, None, None] * w_rows.sum(axis=1)[None, :, None]
        floor = floor + w_rows.max(axis=1)[None, :, None] * x_sums.reshape(batch, w.shape[0], -1)
        return floor.reshape(-1)
    x_max = x.max(axis=1)
    if site is Site.EMBEDDING:  # w [n, k], each row scaled on its own
        return (np.outer(x_max, w.sum(axis=1)) + np.outer(x.sum(axis=1), w.max(axis=1))).reshape(-1)
    # linears: w [k, n]; a warp scales the rows of each item among its 32 (32-aligned)
    # together
    rows = np.arange(x_max.size)
    starts = np.flatnonzero((rows % 32 == 0) | (rows % site.dimensions()[0] == 0))
    x_max = np.repeat(np.maximum.reduceat(x_max, starts), np.diff(starts, append=x_max.size))
    return (np.outer(x_max, w.sum(axis=0)) + np.outer(x.sum(axis=1), w.max(axis=0))).reshape(-1)


def assert_replay_bit_identical(
    runtime: CudaRuntime, oxide: DenseOxide | SegConvOxide, x: np.ndarray
) -> None:
    """A captured graph of 20 enqueues into NaN-poisoned outputs, replayed twice, gives
    the eager output's bits in every output."""
    eager = run_eager(runtime, oxide, x).view(np.uint32)
    x_buffer = runtime.upload(x)
    poison = runtime.upload(np.full(oxide.producer.output_len, np.nan, np.float32))
    outs = [runtime.alloc_zeros(oxide.producer.output_len) for _ in range(20)]

    def enqueue_all() -> None:
        for out in outs:
            oxide.enqueue(x_buffer, out)

    graph = runtime.capture(enqueue_all)
    try:
        for _ in range(2):
            for out in outs:
                runtime.copy(out, poison)
            graph.replay()
            runtime.synchronize()
            for out in outs:
                assert np.array_equal(runtime.download(out).view(np.uint32), eager)
    finally:
        graph.close()
        for buffer in (x_buffer, poison, *outs):
            buffer.free()


@contextlib.contextmanager
def library_math(torch: Any, math: CudaMath) -> Iterator[None]:
    """`pyspk.torch.library_math`: the library's TF32 switches for `math`, restored
    afterwards (`torch` is taken for the callers that pass it)."""
    from pyspk.torch import library_math as switches

    with switches(math):
        yield


def library_function(torch: Any, site: Site) -> Callable[[Any, Any, Any], Any]:
    """The library path of `site` as a function of (x, w, bias) torch tensors: cuDNN conv,
    or cuBLAS and its epilogue (the function `torch.compile` takes for the compiled arm)."""
    functional = torch.nn.functional
    if site.is_conv():
        return lambda x, w, bias: functional.conv1d(x, w)
    if site in (Site.LINEAR0, Site.LINEAR1):
        return lambda x, w, bias: functional.leaky_relu(
            torch.addmm(bias, x, w), reference.LEAKY_SLOPE
        )
    if site is Site.LINEAR2:
        return lambda x, w, bias: torch.log_softmax(torch.addmm(bias, x, w), -1)
    return lambda x, w, bias: functional.linear(x, w, bias)


def library_call(torch: Any, site: Site, x: Any, w: Any, bias: Any) -> Callable[[], Any]:
    """The library path of `site` on these torch tensors."""
    function = library_function(torch, site)
    return lambda: function(x, w, bias)


def library(torch: Any, site: Site, ops: dict[str, np.ndarray], math: CudaMath) -> np.ndarray:
    """One eager call of the library path on `ops`, flat."""
    tensors = {name: torch.from_numpy(value).cuda() for name, value in ops.items()}
    with library_math(torch, math):
        y = library_call(torch, site, tensors["x"], tensors["w"], tensors.get("bias"))()
    return y.cpu().numpy().reshape(-1)


def torch_graph(torch: Any, call: Callable[[], Any]) -> tuple[Any, Any]:
    """A `torch.cuda.CUDAGraph` of `call()`, captured after one warm-up call on a side
    stream (as PyTorch asks of captured work); the graph and the captured output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = call()
    return graph, output


def graph_replay_ms(torch: Any, graphs: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """Each graph's replay times in ms, `rounds` of them, the graphs replayed in turn
    within a round (interleaved: a drift of the device's clocks falls on every arm),
    each timed by CUDA events around it on the current stream."""
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return times


def torch_replay_matches_eager(torch: Any, call: Callable[[Any], Any], static_input: Any) -> bool:
    """Captures `call(static_input)`, refills the input with fresh values and replays:
    whether the replayed output has the bits of an eager call on those values."""
    graph, static_output = torch_graph(torch, lambda: call(static_input))
    fresh = torch.randn_like(static_input)
    static_input.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    matches = bool(torch.equal(static_output, call(fresh)))
    del graph
    return matches


def errors(y: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
    """(max-abs, relative-L2) of `y` against float64 `exact`, both flat."""
    difference = np.asarray(y, np.float64).reshape(-1) - exact
    return float(np.max(np.abs(difference))), float(
        np.linalg.norm(difference) / np.linalg.norm(exact)
    )


def relative_l2(y: np.ndarray, exact: np.ndarray) -> float:
    return errors(y, exact)[1]


def relative_errors(y: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
    """max |error| / max |exact| and ||error|| / ||exact|| of `y` against float64 `exact`."""
    exact = np.asarray(exact, np.float64).reshape(-1)
    largest, norm_wise = errors(y, exact)
    return largest / float(np.max(np.abs(exact))), norm_wise


def lstm_truth(lstm: Any, x: Any) -> np.ndarray:
    """The float64 output of `lstm` (a bidirectional, batch-first `nn.LSTM`) on the
    tensor `x`: `pyspk.reference.bilstm` on its weights."""
    layers: Any = [
        tuple(
            tuple(
                getattr(lstm, f"{kind}_l{layer}{suffix}").detach().cpu().numpy()
                for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            )
            for suffix in ("", "_reverse")
        )
        for layer in range(lstm.num_layers)
    ]
    return reference.bilstm(x.detach().cpu().numpy(), layers)


# -- host cost -----------------------------------------------------------------------

# launches per timed chunk: well under the driver's pending-launch queue, so the GPU
# never holds the host back
CHUNK = 100
SAMPLES = 200


def per_launch_us(
    runtime: CudaRuntime, launch: Callable[[], object], samples: int = SAMPLES
) -> float:
    """Median microseconds to queue one `launch` (perf_counter_ns), over `samples` chunks
    of CHUNK, each synchronized outside the timed region."""
    for _ in range(CHUNK):  # warm caches and bindings
        launch()
    runtime.synchronize()
    times = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        for _ in range(CHUNK):
            launch()
        times.append((time.perf_counter_ns() - start) / CHUNK / 1000)
        runtime.synchronize()
    return statistics.median(times)
