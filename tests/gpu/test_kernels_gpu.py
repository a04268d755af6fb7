"""The segdense kernels themselves on a device, launched directly: both tiers load with
every entry resolved, the pack layouts, each reduction bit for bit against a numpy
emulation of the order documented in ptx/src/segdense/segdense.cu, the embedding products against
float64, and launches off the fixed geometry leaving their output untouched."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from pyspk.candidate.segdense import Entry
from pyspk.candidate.segdense.packing import gather_map, pack_weight
from pyspk.candidate.segdense.shapes import packs_on_host
from pyspk.cuda import driver
from pyspk.cuda.buffers import DeviceBuffer
from pyspk.cuda.kernels import LoadedKernels, load_kernels
from pyspk.cuda.manifest import KernelModule, Manifest
from pyspk.cuda.runtime import CudaRuntime
from pyspk.cuda.tier import PtxTier

pytestmark = pytest.mark.gpu

ROWS, COLS, K = 96, 256, 5120
OUTPUTS = ROWS * COLS
UNITS, STEP = 640, 8  # the k partition of spk_segdense_embed_b32
UNIT = 2.0**-24
NAN_BITS = 0x7FC00000
BUF = ("ptr", "u64")
GATHER = BUF * 4
REDUCE = (*BUF, *BUF, *BUF, "u32")
DENSE = BUF * 4
TIERS = [PtxTier.SM75, PtxTier.SM80]


@pytest.fixture(scope="module")
def tiers(runtime: CudaRuntime) -> Iterator[dict[PtxTier, LoadedKernels]]:
    """Each tier the device runs, loaded beside the runtime's own module."""
    runtime.synchronize()  # makes the runtime's context current on this thread
    capability = runtime.device.capability
    loaded = {
        tier: load_kernels(KernelModule.SEGDENSE, capability, tier)
        for tier in TIERS
        if tier.capability <= capability
    }
    yield loaded
    for kernels in loaded.values():
        kernels.unload()


@pytest.fixture(params=TIERS, ids=str)
def module(request: pytest.FixtureRequest, tiers: dict[PtxTier, LoadedKernels]) -> LoadedKernels:
    if request.param not in tiers:
        pytest.skip(f"the device does not run the {request.param} tier")
    return tiers[request.param]


def launch(
    runtime: CudaRuntime,
    kernels: LoadedKernels,
    name: str,
    grid: int | tuple[int, int, int],
    block: int,
    signature: tuple[str, ...],
    values: list[int],
) -> None:
    kernels.function(name).launch(grid, block, 0, signature, values).enqueue(runtime.stream)
    runtime.synchronize()


def poison(runtime: CudaRuntime, buffer: DeviceBuffer) -> None:
    ptr = driver.api().CUdeviceptr(buffer.ptr)
    driver.call("cuMemsetD32Async", ptr, NAN_BITS, buffer.len, runtime.stream)
    runtime.synchronize()


def bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)


def gamma(n: int) -> float:
    return n * UNIT / (1 - n * UNIT)


# -- loading --------------------------------------------------------------------------


def test_both_tiers_resolve_every_entry(
    runtime: CudaRuntime, tiers: dict[PtxTier, LoadedKernels]
) -> None:
    manifest = Manifest.load().module(KernelModule.SEGDENSE)
    assert PtxTier.SM75 in tiers
    for tier, kernels in tiers.items():
        assert kernels.tier is tier
        assert set(kernels.entries) == set(manifest.tiers[tier].entries)
        shipped = runtime.device.capability.sm in manifest.tiers[tier].cubins
        assert ("cubin" in kernels.artifact) == shipped, kernels.artifact
        for name in kernels.entries:
            assert kernels.function(name).attribute("MAX_THREADS_PER_BLOCK") >= 64


def test_jit_of_each_tier_resolves_every_entry(
    runtime: CudaRuntime, tiers: dict[PtxTier, LoadedKernels], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPK_FORCE_PTX_JIT", "1")
    runtime.synchronize()
    for tier in tiers:
        kernels = load_kernels(KernelModule.SEGDENSE, runtime.device.capability, tier)
        try:
            assert kernels.artifact == f"segdense.{tier}.ptx (JIT)"
            assert kernels.entries == tiers[tier].entries
        finally:
            kernels.unload()


# -- pack -----------------------------------------------------------------------------


# the entries whose weight pack is a layout the gather kernel makes (the others scale
# the weight or list rows of it on the host)
GATHERED = [entry for entry in Entry if not packs_on_host(entry.config(4).kind)]


@pytest.mark.parametrize("entry", GATHERED, ids=lambda entry: entry.name)
def test_gather_makes_the_host_pack(
    runtime: CudaRuntime, module: LoadedKernels, entry: Entry
) -> None:
    """spk_segdense_pack_gather with each entry's `gather_map` writes `pack_weight`'s bits,
    on weights whose low mantissa bits exercise the TF32 rounding and its ties; it counts
    the non-finite elements."""
    _, n, k, _ = entry.site().dimensions()
    kind = entry.config(4).kind
    entries = gather_map(kind, n, k)
    source = np.random.default_rng(1).standard_normal(n * k).astype(np.float32)
    source[::7] = (source[::7].view(np.uint32) & 0xFFFFE000 | 0x1000).view(np.float32)
    src, table = runtime.upload(source), runtime.upload(entries.view(np.float32))
    dst, flag = runtime.alloc_zeros(entries.size), runtime.alloc_zeros(1)
    poison(runtime, dst)
    grid = -(-entries.size // 1024)
    values = [src.ptr, src.len, table.ptr, table.len, dst.ptr, dst.len, flag.ptr, 1]
    launch(runtime, module, "spk_segdense_pack_gather", grid, 1024, GATHER, values)
    expected = np.asarray(pack_weight(kind, source, n, k), np.float32).reshape(-1)
    assert np.array_equal(bits(runtime.download(dst)), bits(expected))
    assert runtime.download(flag)[0] == 0
    source[n * k // 2] = np.inf
    source[n * k // 3] = np.nan
    bad = runtime.upload(source)
    values[:2] = [bad.ptr, bad.len]
    launch(runtime, module, "spk_segdense_pack_gather", grid, 1024, GATHER, values)
    assert runtime.download(flag)[0] == 2  # each non-finite element counted once


# -- reductions -----------------------------------------------------------------------


def sequential(planes: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """((p0 + p1) + p2) + ... in FP32, then the bias."""
    total = planes[0].copy()
    for plane in planes[1:]:
        total = total + plane
    return total + np.tile(bias, ROWS)


def eight_warps(planes: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Warp w sums planes w, w + 8, ... in order; the group sums are added in warp
    order, empty groups skipped; then the bias."""
    groups = []
    for warp in range(min(8, len(planes))):
        group = planes[warp].copy()
        for plane in planes[warp + 8 :: 8]:
            group = group + plane
        groups.append(group)
    total = groups[0]
    for group in groups[1:]:
        total = total + group
    return total + np.tile(bias, ROWS)


REDUCTIONS: list[tuple[str, range, int, int, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = [
    ("spk_segdense_reduce_e18", range(18, 19), 48, 128, sequential),
    ("spk_segdense_reduce_e34", range(34, 35), 48, 128, sequential),
    ("spk_segdense_reduce_e36", range(36, 37), 48, 128, sequential),
    ("spk_segdense_reduce_embed_flat", range(1, 41), 96, 64, sequential),
    ("spk_segdense_reduce_embed", range(1, 129), 192, 256, eight_warps),
]


@pytest.fixture(scope="module")
def planes() -> tuple[np.ndarray, np.ndarray]:
    """128 partial planes whose magnitudes span 2^+-12, so that summation order shows in
    the bits, and a bias."""
    rng = np.random.default_rng(2)
    scale = 2.0 ** rng.integers(-12, 13, size=(128, OUTPUTS))
    values = (rng.standard_normal((128, OUTPUTS)) * scale).astype(np.float32)
    bias = rng.standard_normal(COLS).astype(np.float32)
    return values, bias


def test_the_emulated_orders_differ(planes: tuple[np.ndarray, np.ndarray]) -> None:
    # otherwise the bit-for-bit tests below could not tell the kernels' orders apart
    values, bias = planes
    assert not np.array_equal(
        bits(sequential(values[:40], bias)), bits(eight_warps(values[:40], bias))
    )
    assert not np.array_equal(
        bits(sequential(values[:40], bias)), bits(sequential(values[:40][::-1], bias))
    )


@pytest.mark.parametrize(
    ("name", "counts", "grid", "block", "order"), REDUCTIONS, ids=[r[0] for r in REDUCTIONS]
)
def test_reduction_order_bit_for_bit(
    runtime: CudaRuntime,
    module: LoadedKernels,
    planes: tuple[np.ndarray, np.ndarray],
    name: str,
    counts: range,
    grid: int,
    block: int,
    order: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> None:
    values, bias = planes
    partials = runtime.upload(values)
    bias_buffer = runtime.upload(bias)
    y = runtime.alloc_zeros(OUTPUTS)
    wrong = []
    for splits in counts:
        poison(runtime, y)
        launch(
            runtime,
            module,
            name,
            grid,
            block,
            REDUCE,
            [partials.ptr, splits * OUTPUTS, bias_buffer.ptr, COLS, y.ptr, OUTPUTS, splits],
        )
        expected = order(values[:splits], bias)
        if not np.array_equal(bits(runtime.download(y)), bits(expected)):
            wrong.append(splits)
    assert wrong == [], f"{name} differs from its documented order for splits {wrong}"


# -- embedding products ---------------------------------------------------------------


@pytest.fixture(scope="module")
def embedding() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    bound = 1.0 / np.sqrt(K)
    return {
        "x": rng.standard_normal((ROWS, K)).astype(np.float32),
        "w": rng.uniform(-bound, bound, (COLS, K)).astype(np.float32),
        "bias": rng.uniform(-bound, bound, COLS).astype(np.float32),
    }


def test_embed_b1_against_float64(
    runtime: CudaRuntime, module: LoadedKernels, embedding: dict[str, np.ndarray]
) -> None:
    x, w, bias = embedding["x"][:3], embedding["w"], embedding["bias"]
    buffers = [runtime.upload(a) for a in (x, w, bias)]
    y = runtime.alloc_zeros(3 * COLS)
    values = [v for b in buffers for v in (b.ptr, b.len)] + [y.ptr, y.len]
    results = []
    for _ in range(2):
        poison(runtime, y)
        launch(runtime, module, "spk_segdense_embed_b1", 128, 256, DENSE, values)
        results.append(runtime.download(y))
    assert np.array_equal(bits(results[0]), bits(results[1]))
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, bias))
    exact = (x64 @ w64.T + b64).reshape(-1)
    scale = (np.abs(x64) @ np.abs(w64).T + np.abs(b64)).reshape(-1)
    assert np.all(np.abs(results[0] - exact) <= gamma(K + 2) * scale)


def k_slices(splits: int) -> list[tuple[int, int]]:
    """The k range of each slice, as spk_segdense_embed_b32 documents its partition."""
    per, extra = divmod(UNITS, splits)
    ranges, start = [], 0
    for z in range(splits):
        units = per + (1 if z < extra else 0)
        ranges.append((start * STEP, (start + units) * STEP))
        start += units
    return ranges


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 18, 34, 36, 64, 100, 127, 128])
def test_embed_b32_planes_and_reduction(
    runtime: CudaRuntime,
    module: LoadedKernels,
    embedding: dict[str, np.ndarray],
    splits: int,
) -> None:
    x, w, bias = embedding["x"], embedding["w"], embedding["bias"]
    x_buffer, bias_buffer = runtime.upload(x), runtime.upload(bias)
    packed = runtime.upload(w.reshape(COLS, K).T)  # [k, n], as EMBED_B32 reads it
    partials = runtime.alloc_zeros(splits * OUTPUTS)
    poison(runtime, partials)
    launch(
        runtime,
        module,
        "spk_segdense_embed_b32",
        (1, 2, splits),
        192,
        DENSE,
        [
            x_buffer.ptr,
            x_buffer.len,
            packed.ptr,
            packed.len,
            bias_buffer.ptr,
            COLS,
            partials.ptr,
            partials.len,
        ],
    )
    planes = runtime.download(partials).reshape(splits, ROWS, COLS)
    assert np.all(np.isfinite(planes)), "a partial plane was not fully written"
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    for z, (first, last) in enumerate(k_slices(splits)):
        exact = x64[:, first:last] @ w64[:, first:last].T
        scale = np.abs(x64[:, first:last]) @ np.abs(w64[:, first:last]).T
        assert np.all(np.abs(planes[z] - exact) <= gamma(last - first + 1) * scale), (
            f"plane {z} does not hold k {first}..{last}"
        )

    if splits in (18, 34, 36):
        name, grid, block = f"spk_segdense_reduce_e{splits}", 48, 128
    elif splits <= 40:
        name, grid, block = "spk_segdense_reduce_embed_flat", 96, 64
    else:
        name, grid, block = "spk_segdense_reduce_embed", 192, 256
    y = runtime.alloc_zeros(OUTPUTS)
    poison(runtime, y)
    launch(
        runtime,
        module,
        name,
        grid,
        block,
        REDUCE,
        [partials.ptr, partials.len, bias_buffer.ptr, COLS, y.ptr, OUTPUTS, splits],
    )
    b64 = bias.astype(np.float64)
    exact = (x64 @ w64.T + b64).reshape(-1)
    scale = (np.abs(x64) @ np.abs(w64).T + np.abs(b64)).reshape(-1)
    assert np.all(np.abs(runtime.download(y) - exact) <= gamma(K + 2) * scale)


# -- off-geometry launches write nothing ----------------------------------------------


class Operands:
    """Inputs large enough for every case below, and one poisoned output."""

    def __init__(self, runtime: CudaRuntime) -> None:
        rng = np.random.default_rng(4)

        def upload(count: int) -> DeviceBuffer:
            return runtime.upload(rng.standard_normal(count).astype(np.float32))

        self.src = upload(60 * 400)
        # an identity gather map (copy every element), and the gather's non-finite flag
        self.map = runtime.upload(np.arange(60 * 400, dtype=np.uint32).view(np.float32))
        self.flag = runtime.alloc_zeros(1)
        self.partials = upload(129 * OUTPUTS)
        self.bias = upload(COLS)
        self.x1 = upload(3 * K)
        self.x32 = upload(ROWS * K)
        self.w = upload(COLS * K)
        self.out = runtime.alloc_zeros(129 * OUTPUTS + 4)


def pack(o: Operands, **change):
    v = dict(grid=24, block=1024, map_len=24000, dst_len=24000, bad_len=1)
    v.update(change)
    return (
        "spk_segdense_pack_gather",
        v["grid"],
        v["block"],
        GATHER,
        [
            o.src.ptr,
            24000,
            o.map.ptr,
            v["map_len"],
            o.out.ptr,
            v["dst_len"],
            o.flag.ptr,
            v["bad_len"],
        ],
    )


def reduce(o: Operands, name: str, **values):
    v = dict(p=o.partials.ptr, bias_len=COLS, y=o.out.ptr, y_len=OUTPUTS)
    v["p_len"] = values["splits"] * OUTPUTS
    v.update(values)
    return (
        name,
        v["grid"],
        v["block"],
        REDUCE,
        [v["p"], v["p_len"], o.bias.ptr, v["bias_len"], v["y"], v["y_len"], v["splits"]],
    )


def e18(o, **c):
    return reduce(o, "spk_segdense_reduce_e18", **{"grid": 48, "block": 128, "splits": 18, **c})


def flat(o, **c):
    return reduce(
        o, "spk_segdense_reduce_embed_flat", **{"grid": 96, "block": 64, "splits": 10, **c}
    )


def eight(o, **c):
    return reduce(o, "spk_segdense_reduce_embed", **{"grid": 192, "block": 256, "splits": 50, **c})


def b1(o: Operands, **change):
    v = dict(
        grid=128,
        block=256,
        x=o.x1.ptr,
        x_len=3 * K,
        w=o.w.ptr,
        w_len=COLS * K,
        bias_len=COLS,
        y=o.out.ptr,
        y_len=3 * COLS,
    )
    v.update(change)
    return (
        "spk_segdense_embed_b1",
        v["grid"],
        v["block"],
        DENSE,
        [v["x"], v["x_len"], v["w"], v["w_len"], o.bias.ptr, v["bias_len"], v["y"], v["y_len"]],
    )


def b32(o: Operands, **change):
    v = dict(
        grid=(1, 2, 4),
        block=192,
        x_len=ROWS * K,
        w_len=K * COLS,
        bias_len=COLS,
        p=o.out.ptr,
        p_len=4 * OUTPUTS,
    )
    v.update(change)
    return (
        "spk_segdense_embed_b32",
        v["grid"],
        v["block"],
        DENSE,
        [o.x32.ptr, v["x_len"], o.w.ptr, v["w_len"], o.bias.ptr, v["bias_len"], v["p"], v["p_len"]],
    )


VALID = {"pack": pack, "e18": e18, "flat": flat, "eight": eight, "b1": b1, "b32": b32}

OFF_GEOMETRY = {
    "pack map_len": lambda o: pack(o, map_len=23999),
    "pack bad_len": lambda o: pack(o, bad_len=2),
    "pack grid": lambda o: pack(o, grid=25),
    "pack block": lambda o: pack(o, grid=47, block=512),
    "e18 splits": lambda o: e18(o, splits=17, p_len=17 * OUTPUTS),
    "e18 p_len": lambda o: e18(o, p_len=18 * OUTPUTS - 4),
    "e18 bias_len": lambda o: e18(o, bias_len=COLS - 1),
    "e18 y_len": lambda o: e18(o, y_len=OUTPUTS - 1),
    "e18 grid": lambda o: e18(o, grid=47),
    "e18 block": lambda o: e18(o, grid=96, block=64),
    "e18 misaligned y": lambda o: e18(o, y=o.out.ptr + 4),
    "e34 splits": lambda o: reduce(o, "spk_segdense_reduce_e34", grid=48, block=128, splits=36),
    "e36 splits": lambda o: reduce(o, "spk_segdense_reduce_e36", grid=48, block=128, splits=34),
    "flat splits 41": lambda o: flat(o, splits=41, p_len=41 * OUTPUTS),
    "flat splits 0": lambda o: flat(o, splits=0, p_len=0),
    "flat shape": lambda o: flat(o, grid=192, block=32),
    "flat misaligned partials": lambda o: flat(o, p=o.partials.ptr + 4),
    "eight splits 129": lambda o: eight(o, splits=129, p_len=129 * OUTPUTS),
    "eight splits 0": lambda o: eight(o, splits=0, p_len=0),
    "eight grid": lambda o: eight(o, grid=96),
    "eight block": lambda o: eight(o, block=128),
    "b1 x_len": lambda o: b1(o, x_len=3 * K - 1),
    "b1 w_len": lambda o: b1(o, w_len=COLS * K + 1),
    "b1 bias_len": lambda o: b1(o, bias_len=0),
    "b1 y_len": lambda o: b1(o, y_len=3 * COLS + 1),
    "b1 grid": lambda o: b1(o, grid=127),
    "b1 block": lambda o: b1(o, block=128),
    "b1 misaligned w": lambda o: b1(o, w=o.w.ptr + 4, w_len=COLS * K),
    "b32 splits 129": lambda o: b32(o, grid=(1, 2, 129), p_len=129 * OUTPUTS),
    "b32 p_len": lambda o: b32(o, p_len=4 * OUTPUTS - 1),
    "b32 grid x": lambda o: b32(o, grid=(2, 2, 4)),
    "b32 grid y": lambda o: b32(o, grid=(1, 1, 4)),
    "b32 block": lambda o: b32(o, block=128),
    "b32 bias_len": lambda o: b32(o, bias_len=0),
    "b32 x_len": lambda o: b32(o, x_len=ROWS * K - 1),
    "b32 misaligned partials": lambda o: b32(o, p=o.out.ptr + 4),
}


@pytest.fixture(scope="module")
def operands(runtime: CudaRuntime) -> Operands:
    return Operands(runtime)


def _run_case(runtime: CudaRuntime, kernels: LoadedKernels, operands: Operands, case) -> np.ndarray:
    poison(runtime, operands.out)
    name, grid, block, signature, values = case
    launch(runtime, kernels, name, grid, block, signature, values)
    return bits(runtime.download(operands.out))


@pytest.mark.parametrize("family", list(VALID))
def test_control_launch_writes(runtime, module, operands, family: str) -> None:
    # the harness below would pass vacuously if a correct launch wrote nothing either
    written = _run_case(runtime, module, operands, VALID[family](operands))
    assert np.any(written != NAN_BITS)


@pytest.mark.parametrize("case", list(OFF_GEOMETRY))
def test_off_geometry_launch_writes_nothing(runtime, module, operands, case: str) -> None:
    written = _run_case(runtime, module, operands, OFF_GEOMETRY[case](operands))
    assert np.all(written == NAN_BITS), f"{case}: the kernel wrote its output"
