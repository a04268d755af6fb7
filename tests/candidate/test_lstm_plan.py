"""The lstm area without a GPU (the fake driver): the recurrent weights' packing (the
power-of-two scales and the FP16 pairs), the plan's checks, its launch, and the sm75
tier's refusal. The kernel's results are tested on the H200 (tests/gpu/test_lstm_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.candidate.lstm import plan as lstm
from pyspk.cuda import CudaRuntime
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
from tests.fake_driver import FakeApi
from tests.signatures import ptx_kinds

SHAPE = (2, 512, 128)
H200_SHARED_OPTIN = 232448  # 227 KiB a block


@pytest.fixture
def h200(fake: FakeApi):
    """A fake device with the H200's opt-in shared memory, which the plan needs."""
    fake.shared_optin = H200_SHARED_OPTIN
    with CudaRuntime(0) as runtime:
        yield runtime


def random_w_hh(seed: int = 0, scale: float = 0.088) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-scale, scale, SHAPE).astype(np.float32)


def unpack(words: np.ndarray, inverses: tuple[float, float]) -> np.ndarray:
    halves = np.ascontiguousarray(words).view(np.float16).astype(np.float64)
    return halves.reshape(SHAPE) * np.array(inverses)[:, None, None]


def unpack_rest(rest: np.ndarray, inverses: tuple[float, float]) -> np.ndarray:
    """The rests back in W_hh's layout, from the kernel's [warp][tile][k][lane][register]
    order (tile 2 g + half: gate g's units warp*16 + half*8 + lane/4; register r the
    pair k*8 + 4 r + lane % 4)."""
    words = np.zeros((2, 512, 64), np.uint32)
    order = rest.reshape(2, 8, 8, 8, 32, 2)
    for warp, tile, k, lane, register in np.ndindex(8, 8, 8, 32, 2):
        row = (tile >> 1) * 128 + warp * 16 + (tile & 1) * 8 + (lane >> 2)
        words[:, row, k * 8 + register * 4 + (lane & 3)] = order[:, warp, tile, k, lane, register]
    return unpack(words, inverses)


@pytest.mark.parametrize("scale", [0.088, 3.0, 1e-6])
def test_packing_scales_each_direction_into_fp16s_normal_range(scale: float) -> None:
    w_hh = random_w_hh(scale=scale)
    w_hh[1] *= 8  # the directions' scales differ
    words, rest, inverses = lstm.pack_recurrent(w_hh)
    assert words.shape == (2, 512, 64) and words.dtype == np.uint32
    assert rest.shape == (2, lstm.LSTM_REST_WORDS) and rest.dtype == np.uint32
    for direction in range(2):
        scaled = np.abs(w_hh[direction]).max() / inverses[direction]
        assert 2**14 <= scaled < 2**15
        assert np.log2(inverses[direction]).is_integer()
    # FP16 keeps 11 significant bits: each weight within half an ulp of its scaled value
    # (2^-11 relative), and the values below FP16's normal range lie below 2^-14 of the
    # largest, at most 2^-25 of it away
    got = unpack(words, inverses)
    largest = np.abs(w_hh).max(axis=(1, 2))[:, None, None]
    assert np.all(np.abs(got - w_hh) <= np.maximum(np.abs(w_hh) * 2**-11, largest * 2**-25))
    # with the rests, 22 significant bits (two FP16 roundings: 2^-22 relative), and the
    # small weights' rests at FP16's subnormal spacing, 2^-24 of the scaled range
    whole = got + unpack_rest(rest, inverses)
    assert np.all(np.abs(whole - w_hh) <= np.maximum(np.abs(w_hh) * 2**-21, largest * 2**-38))


def test_packing_pairs_neighbouring_weights_low_half_first() -> None:
    w_hh = np.zeros(SHAPE, np.float32)
    w_hh[0, 3, 4], w_hh[0, 3, 5] = 1.0, -2.0
    words, _, inverses = lstm.pack_recurrent(w_hh)
    low, high = words[0, 3, 2] & 0xFFFF, words[0, 3, 2] >> 16
    as_half = np.array([low, high], np.uint16).view(np.float16).astype(np.float64)
    assert list(as_half * inverses[0]) == [1.0, -2.0]


def test_packing_refuses_other_shapes_and_non_finite_weights() -> None:
    with pytest.raises(GeometryInvalid, match=r"\[2, 512, 128\], not \[2, 512, 64\]"):
        lstm.pack_recurrent(np.zeros((2, 512, 64), np.float32))
    bad = random_w_hh()
    bad[1, 7, 9] = np.nan
    with pytest.raises(WeightsOutOfContract, match="non-finite"):
        lstm.pack_recurrent(bad)


@pytest.mark.parametrize("tier", [PtxTier.SM75, PtxTier.SM80], ids=str)
def test_the_launch_signature_is_the_shipped_entry(tier: PtxTier) -> None:
    entries = Manifest.load().module(KernelModule.LSTM).tiers[tier].entries
    assert list(entries[lstm.KERNEL]) == ptx_kinds(lstm.RECURRENCE_SIGNATURE)


def test_a_plan_launches_blocks_of_16_sequences_per_direction(
    fake: FakeApi, h200: CudaRuntime
) -> None:
    runtime = h200
    items, steps = 37, 589
    gx = runtime.alloc_zeros(items * steps * 1024)
    y = runtime.alloc_zeros(items * steps * 256)
    with lstm.plan_lstm_recurrence(runtime, random_w_hh()) as plan:
        fake.read_params = (1, 3, 5)  # gx's, w's and w_rest's lengths (w_rest in uint4s)
        plan.enqueue(gx, y, items=items, steps=steps)
        with pytest.raises(BufferLengthError):
            plan.enqueue(gx, y, items=items + 1, steps=steps)
        with pytest.raises(InvalidArgument, match="positive"):
            plan.enqueue(gx, y, items=0, steps=steps)
    (launch,) = fake.launches
    assert launch[0] == f"fn:{lstm.KERNEL}"
    assert launch[1:3] == ((3, 2, 1), (lstm.LSTM_THREADS, 1, 1))
    assert launch[3] == lstm.LSTM_REST_WORDS * 4  # the rest in dynamic shared memory
    assert fake.param_values == [(launch[0], items * steps * 1024, 2 * 512 * 64, 2 * 8192)]


def test_a_device_with_too_little_shared_memory_refuses(runtime: CudaRuntime) -> None:
    """99 KiB a block (sm_86, sm_89, sm_120) cannot hold the 128 KiB of W_hh's rest: a
    `DeviceUnsupported`, the library's LSTM then runs."""
    with pytest.raises(DeviceUnsupported, match="131072 bytes of shared memory"):
        lstm.plan_lstm_recurrence(runtime, random_w_hh())


def test_the_kernels_static_shared_memory_counts_against_the_limit(fake: FakeApi) -> None:
    """A block limit of 128 KiB and 10 bytes holds the rest but not the kernel's own
    shared memory beside it (the fake's kernels have 42 bytes): refused before the
    driver's opt-in would be."""
    fake.shared_optin = lstm.LSTM_REST_WORDS * 4 + 10
    with CudaRuntime(0) as runtime, pytest.raises(DeviceUnsupported, match="beside its static"):
        lstm.plan_lstm_recurrence(runtime, random_w_hh())
    assert not [call for call in fake.attributes if call[1] == 8]  # no opt-in asked


def test_misaligned_pairs_are_refused(fake: FakeApi, h200: CudaRuntime) -> None:
    from tests.fake_driver import CaiView

    items, steps = 2, 5
    gx = h200.alloc_zeros(items * steps * 1024 + 1)
    y = h200.alloc_zeros(items * steps * 256)
    odd = CaiView(gx.ptr + 4, items * steps * 1024)
    with (
        lstm.plan_lstm_recurrence(h200, random_w_hh()) as plan,
        pytest.raises(BufferLayoutError, match=r"gx address \S+ is not 8-byte aligned"),
    ):
        plan.enqueue(odd, y, items=items, steps=steps)
    assert not fake.launches


def test_the_sm75_tier_refuses(fake: FakeApi) -> None:
    with (
        CudaRuntime(0, ptx_tier=PtxTier.SM75) as runtime,
        pytest.raises(DeviceUnsupported, match="sm80 tier"),
    ):
        lstm.plan_lstm_recurrence(runtime, random_w_hh())
