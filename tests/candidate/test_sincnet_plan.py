"""The sincnet area without a GPU (the fake driver): the pooled length, the filters'
upload and the tensor-core kernel's packing of them, the plan's checks, its persistent
launch in either math, and the sm75 tier's refusal. The kernels' results are tested on
the H200 (tests/gpu/test_sincnet_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.candidate.sincnet import plan as sincnet
from pyspk.cuda import CudaMath, CudaRuntime
from pyspk.cuda.manifest import KernelModule, Manifest
from pyspk.cuda.tier import PtxTier
from pyspk.errors import (
    BufferLayoutError,
    BufferLengthError,
    DeviceUnsupported,
    GeometryInvalid,
    InvalidArgument,
    WeightsOutOfContract,
)
from tests.fake_driver import CaiView, FakeApi
from tests.signatures import ptx_kinds

FAKE_MULTIPROCESSORS = 34  # the fake device's


def random_filters(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((80, 251)).astype(np.float32)


@pytest.mark.parametrize(
    ("samples", "pooled"),
    [(160000, 5325), (270, 0), (271, 1), (300, 1), (301, 2), (250, 0), (32000, 1058)],
)
def test_the_pooled_length_is_max_pool_over_the_convolution(samples: int, pooled: int) -> None:
    """(samples - 251) // 10 + 1 positions, three to a pooled output, the rest dropped:
    segmentation-3.0's 10 s chunks give 5325 frames."""
    assert sincnet.sinc_pooled(samples) == pooled


@pytest.mark.parametrize("tier", [PtxTier.SM75, PtxTier.SM80], ids=str)
@pytest.mark.parametrize("kernel", [sincnet.KERNEL, sincnet.HALVES_KERNEL])
def test_the_launch_signature_is_the_shipped_entry(tier: PtxTier, kernel: str) -> None:
    entries = Manifest.load().module(KernelModule.SINCNET).tiers[tier].entries
    assert list(entries[kernel]) == ptx_kinds(sincnet.SIGNATURE)


def _pair_values(words: np.ndarray) -> np.ndarray:
    """FP16 pair words (low half first) -> [..., 2] float64 values."""
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).astype(np.uint16)
    return halves.view(np.float16).astype(np.float64)


def unpacked_halves(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(high, low) [80, 256] float64 values and the 80 inverse scales, read back from
    `pack_sinc_halves`'s words by the layout its docstring gives."""
    pairs = _pair_values(packed[: sincnet.SINC_HALF_WORDS].view(np.uint32))
    parts = np.zeros((2, 80, 256))
    for index, pair in enumerate(pairs):
        lane_word, i = divmod(index, 4)
        lane_row, lane = divmod(lane_word, 32)
        step, tile = divmod(lane_row, 10)
        k = 16 * step + 2 * (lane % 4) + 8 * (i % 2)
        parts[i // 2, 8 * tile + lane // 4, k : k + 2] = pair
    return parts[0], parts[1], packed[sincnet.SINC_HALF_WORDS :].astype(np.float64)


def test_the_tensor_core_filters_are_split_scaled_and_in_fragment_order() -> None:
    """High plus low, unscaled, is each tap to about 22 bits (the split's residual below
    2^-22 of the filter's largest magnitude); each filter's largest scaled magnitude lies
    in [2^14, 2^15); the padded taps are zero."""
    filters = random_filters() * np.exp(np.random.default_rng(1).standard_normal((80, 1)))
    filters = filters.astype(np.float32)
    high, low, inverse = unpacked_halves(sincnet.pack_sinc_halves(filters))
    assert high.shape == (80, 256) and inverse.shape == (80,)
    assert not np.any(high[:, 251:]) and not np.any(low[:, 251:])
    largest = np.abs(high).max(axis=1)
    assert np.all((largest >= 2.0**14) & (largest <= 2.0**15))
    assert np.array_equal(np.log2(inverse), np.round(np.log2(inverse)))  # powers of two
    restored = (high + low)[:, :251] * inverse[:, None]
    error = np.abs(restored - filters).max(axis=1) / np.abs(filters).max(axis=1)
    assert error.max() < 2.0**-22


def test_the_tf32_plan_launches_the_tensor_core_kernel(fake: FakeApi) -> None:
    """Its own entry, block and shared memory (the packed filters and a tile's sample
    pairs: 16 x 10 x 32 x 4 words and 5 rounds of 256 pairs of 8 bytes), and two blocks
    an sm_90 holds."""
    assert sincnet.SINC_HALF_SHARED_BYTES == 20480 * 4 + 5 * 256 * 8 == 92160
    assert sincnet.resident_blocks(232448, sincnet.SINC_HALF_SHARED_BYTES) == 2
    runtime = CudaRuntime(0)
    items, samples = 3, 160000
    x = runtime.alloc_zeros(items * samples)
    y = runtime.alloc_zeros(items * 80 * 5325)
    with sincnet.plan_sinc_front(runtime, random_filters(), CudaMath.TF32) as plan:
        fake.read_params = (1, 3, 5)
        plan.enqueue(x, y, items=items, samples=samples)
    (launch,) = fake.launches
    assert launch[0] == f"fn:{sincnet.HALVES_KERNEL}"
    assert launch[2:4] == ((sincnet.SINC_HALF_THREADS, 1, 1), sincnet.SINC_HALF_SHARED_BYTES)
    words = sincnet.SINC_HALF_WORDS + 80
    assert fake.param_values == [(launch[0], items * samples, words, items * 80 * 5325)]
    runtime.close()


def test_the_filters_are_uploaded_tap_major(fake: FakeApi, runtime: CudaRuntime) -> None:
    filters = random_filters()
    with sincnet.plan_sinc_front(runtime, filters) as plan:
        address = plan._filters.ptr
        uploaded = np.frombuffer(bytes(fake.memory[address][: 80 * 251 * 4]), np.float32)
        assert np.array_equal(uploaded.reshape(251, 80), filters.T)


def test_the_shared_memory_is_the_filters_and_a_tiles_samples() -> None:
    """The kernel's SINC_SHARED_BYTES: 251 x 80 filter taps and the 30 x 63 + 20 + 251 =
    2161 samples a tile reads, padded to 2164, four bytes each."""
    assert sincnet.SINC_SHARED_BYTES == (251 * 80 + 2164) * 4 == 88976


@pytest.mark.parametrize(
    ("optin", "blocks"), [(232448, 2), (166912, 1), (101376, 1), (2 * 88976 + 1024, 2)]
)
def test_resident_blocks_follow_the_shared_memory(optin: int, blocks: int) -> None:
    """An sm_90 (227 KiB a block, 228 a multiprocessor) holds two blocks, an sm_80
    (163 KiB) or an sm_86 (99 KiB) one."""
    assert sincnet.resident_blocks(optin) == blocks


@pytest.mark.parametrize(
    ("optin", "items", "samples", "blocks"),
    [
        (232448, 7, 160000, 2 * FAKE_MULTIPROCESSORS),
        (101376, 7, 160000, FAKE_MULTIPROCESSORS),
        (232448, 1, 1000, 1),
        (232448, 3, 3000, 6),
    ],
)
def test_a_plan_launches_the_persistent_blocks_the_device_holds(
    fake: FakeApi, optin: int, items: int, samples: int, blocks: int
) -> None:
    """One block a tile of 64 pooled outputs while there are fewer tiles than resident
    blocks (3000 samples: 91 outputs, two tiles an item), else the blocks the
    multiprocessors hold at once, which walk the tiles."""
    fake.shared_optin = optin
    runtime = CudaRuntime(0)
    pooled = sincnet.sinc_pooled(samples)
    x = runtime.alloc_zeros(items * samples)
    y = runtime.alloc_zeros(items * 80 * pooled)
    with sincnet.plan_sinc_front(runtime, random_filters()) as plan:
        fake.read_params = (1, 3, 5)  # x's, w's and y's lengths
        plan.enqueue(x, y, items=items, samples=samples)
    (launch,) = fake.launches
    assert launch[0] == f"fn:{sincnet.KERNEL}"
    assert launch[1:4] == ((blocks, 1, 1), (sincnet.SINC_THREADS, 1, 1), sincnet.SINC_SHARED_BYTES)
    assert fake.param_values == [(launch[0], items * samples, 251 * 80, items * 80 * pooled)]
    runtime.close()


def test_the_plan_refuses_wrong_calls_and_launches_nothing(
    fake: FakeApi, runtime: CudaRuntime
) -> None:
    x, y = runtime.alloc_zeros(2 * 1000), runtime.alloc_zeros(2 * 80 * 25)
    with sincnet.plan_sinc_front(runtime, random_filters()) as plan:
        with pytest.raises(BufferLengthError):
            plan.enqueue(x, y, items=3, samples=1000)
        with pytest.raises(InvalidArgument, match="samples=270"):
            plan.enqueue(x, y, items=2, samples=270)
        with pytest.raises(InvalidArgument, match="items=0"):
            plan.enqueue(x, y, items=0, samples=1000)
        with pytest.raises(BufferLayoutError, match="y shares bytes with x"):
            plan.enqueue(x, CaiView(x.ptr, 2 * 80 * 25), items=2, samples=1000)
    assert not fake.launches


def test_other_filters_are_refused(runtime: CudaRuntime) -> None:
    with pytest.raises(GeometryInvalid, match=r"\[80, 251\], not \[80, 250\]"):
        sincnet.plan_sinc_front(runtime, np.zeros((80, 250), np.float32))
    bad = random_filters()
    bad[3, 100] = np.inf
    with pytest.raises(WeightsOutOfContract, match="non-finite"):
        sincnet.plan_sinc_front(runtime, bad)


def test_the_sm75_tier_refuses(fake: FakeApi) -> None:
    with (
        CudaRuntime(0, ptx_tier=PtxTier.SM75) as runtime,
        pytest.raises(DeviceUnsupported, match="sm80 tier"),
    ):
        sincnet.plan_sinc_front(runtime, random_filters())


def test_a_model_of_the_tensor_core_kernels_data_flow_gives_the_float64_stage() -> None:
    """The kernel's addressing, modelled in numpy for one tile: the sample pairs each lane
    reads (15 pairs a row, rows 4 (r % 4) + r / 4, the last step's taps past 250 masked),
    the packed filters each lane reads, both placed by mma.m16n8k16's fragment layouts
    (a: rows g, g + 8 and k pairs t, t + 4; b: k pairs t, t + 4 of column g; c: rows g,
    g + 8, columns 2t, 2t + 1), the three products summed exactly. The result is the
    float64 stage to the split's 22 bits."""
    from pyspk import reference
    from pyspk.candidate.segdense.packing import f16_bits, half_scale

    rng = np.random.default_rng(3)
    filters = random_filters(2) * np.exp(rng.standard_normal((80, 1))).astype(np.float32)
    samples, tile = 32001, 3
    x = rng.standard_normal(samples).astype(np.float32)
    packed = sincnet.pack_sinc_halves(filters)
    words = packed[: sincnet.SINC_HALF_WORDS].view(np.uint32).reshape(16, 10, 32, 4)
    first = 64 * tile
    raw = np.zeros(2 * 1280, np.float32)
    span = x[30 * first : 30 * first + 2 * (30 * 63 + 20 + 256) // 2]
    raw[: len(span)] = span
    scale, inverse = half_scale(np.abs(raw).max())
    high = f16_bits(raw * scale)
    low = f16_bits(raw * scale - high.view(np.float16).astype(np.float32))
    pairs = [
        part.astype(np.uint32)[0::2] | part.astype(np.uint32)[1::2] << 16 for part in (high, low)
    ]
    lanes = np.arange(32)
    g, t = lanes >> 2, lanes & 3
    out = np.zeros((80, 64))
    for warp in range(8):
        row = 16 * (warp % 4) + 4 * (g % 4) + g // 4  # [32]
        acc = np.zeros((3, 5, 16, 8))  # [m tile][n tile] as the c fragment's rows, columns
        for step in range(16):
            keep = np.where(t == 0, 0xFFFFFFFF, np.where(t == 1, 0xFFFF, 0)).astype(np.uint32)
            for j in range(3):
                base = 15 * row + t + 5 * j + 8 * step
                a = []
                for part in pairs:
                    regs = [part[base], part[base + 30], part[base + 4], part[base + 34]]
                    if step == 15:
                        regs[2], regs[3] = regs[2] & keep, regs[3] & keep
                    matrix = np.zeros((16, 16))
                    for (rows, k0), reg in zip(
                        [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)],
                        regs,
                        strict=True,
                    ):
                        matrix[rows[:, None], k0[:, None] + np.arange(2)] = _pair_values(reg)
                    a.append(matrix)
                for n in range(5):
                    lane_words = words[step, 5 * (warp // 4) + n]  # [32][4]
                    b = []
                    for i0 in (0, 2):
                        matrix = np.zeros((16, 8))
                        for i, k0 in ((i0, 2 * t), (i0 + 1, 2 * t + 8)):
                            values = _pair_values(lane_words[:, i])
                            matrix[k0, g], matrix[k0 + 1, g] = values[:, 0], values[:, 1]
                        b.append(matrix)
                    acc[j, n] += a[1] @ b[0] + a[0] @ b[1] + a[0] @ b[0]
        pooled = np.abs(acc).max(axis=0)  # [n tile][16][8]
        for n in range(5):
            filters_at = 8 * (5 * (warp // 4) + n)
            rows = 16 * (warp % 4) + 4 * (np.arange(16) % 4) + np.arange(16) // 4
            out[filters_at : filters_at + 8, rows] = pooled[n].T
    inverses = packed[sincnet.SINC_HALF_WORDS :].astype(np.float64)
    out *= float(inverse) * inverses[:, None]
    truth = reference.sinc_front(x[None], filters)[0][:, first : first + 64]
    error = np.linalg.norm(out - truth) / np.linalg.norm(truth)
    assert error < 2.0**-22
