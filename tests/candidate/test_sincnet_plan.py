"""The sincnet area without a GPU (the fake driver): the pooled length, the filters'
upload, the plan's checks, its persistent launch, and the sm75 tier's refusal. The
kernel's results are tested on the H200 (tests/gpu/test_sincnet_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.candidate.sincnet import plan as sincnet
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
def test_the_launch_signature_is_the_shipped_entry(tier: PtxTier) -> None:
    entries = Manifest.load().module(KernelModule.SINCNET).tiers[tier].entries
    assert list(entries[sincnet.KERNEL]) == ptx_kinds(sincnet.SIGNATURE)


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
