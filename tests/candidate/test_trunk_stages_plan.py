"""The trunk area's plans of the embedding's stages around the trunk (the statistics
pooling, the fbank's log-mel) on the fake driver: every buffer checked, an output that
shares bytes with any other buffer refused, nothing launched then."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.candidate.trunk.fbank import mel_sums_len, plan_log_mel
from pyspk.candidate.trunk.pooling import plan_stats_pool
from pyspk.cuda import CudaRuntime
from pyspk.cuda.buffers import FLOAT64
from pyspk.errors import BufferLayoutError
from tests.fake_driver import CaiView, FakeApi


def float64_view(ptr: int, length: int) -> CaiView:
    view = CaiView(ptr, length)
    view.__cuda_array_interface__["typestr"] = "<f8"
    return view


def test_the_pool_refuses_an_output_over_either_input(fake: FakeApi, runtime: CudaRuntime) -> None:
    x, w = runtime.alloc_zeros(2 * 6 * 5), runtime.alloc_zeros(2 * 3 * 5)
    with plan_stats_pool(runtime) as plan:
        for name, source in (("x", x), ("w", w)):
            y = CaiView(source.ptr, 2 * 3 * 12)
            with pytest.raises(
                BufferLayoutError, match=rf"y shares bytes with {name}; .* in place"
            ):
                plan.enqueue(x, w, y, items=2, speakers=3, features=6, frames=5)
    assert not fake.launches


def test_the_log_mel_refuses_sums_over_the_spectrum_or_the_features(
    fake: FakeApi, runtime: CudaRuntime
) -> None:
    banks = np.zeros((257, 80), np.float32)
    banks[np.arange(80) + 1, np.arange(80)] = 1.0
    spectrum, y = runtime.alloc_zeros(2 * 3 * 257 * 2), runtime.alloc_zeros(2 * 3 * 80)
    sums_len = mel_sums_len(2, 3)
    with plan_log_mel(runtime, banks) as plan:
        with pytest.raises(
            BufferLayoutError, match=r"sums shares bytes with spectrum; .* in place"
        ):
            plan.enqueue(spectrum, y, float64_view(spectrum.ptr, sums_len), items=2, frames=3)
        with pytest.raises(BufferLayoutError, match=r"sums shares bytes with y$"):
            plan.enqueue(spectrum, y, float64_view(y.ptr, sums_len), items=2, frames=3)
        plan.enqueue(spectrum, y, runtime.alloc_zeros(sums_len, FLOAT64), items=2, frames=3)
    assert len(fake.launches) == 2  # the log-mel, then the centring
