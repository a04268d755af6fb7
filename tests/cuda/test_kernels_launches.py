"""Prepared launches on the fake driver: each parameter in its own slot of the
`kernelParams` block, rewritten in place between enqueues, values that do not fit
refused, and a failing launch named."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from pyspk.cuda.errors import DriverError
from pyspk.cuda.kernels import Launch, load_kernels
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.tier import ComputeCapability
from tests.fake_driver import CUstream, FakeApi, Handle, Result

PTX = Path(__file__).resolve().parents[2] / "ptx"


# -- prepared launches ----------------------------------------------------------------


def _launch(fake: FakeApi, signature, values, grid=(1, 2, 5), block=192, shared=0) -> Launch:
    loaded = load_kernels(KernelModule.SEGDENSE, ComputeCapability(9, 0), directory=PTX)
    return loaded.function("spk_segdense_embed_b32").launch(grid, block, shared, signature, values)


def _slots(launch: Launch) -> list[int]:
    """The addresses in the kernelParams array."""
    count = len(launch.signature)
    return list((ctypes.c_uint64 * count).from_address(launch.params_address))


def _read(address: int, kind: str) -> int:
    ctype = ctypes.c_uint32 if kind == "u32" else ctypes.c_uint64
    return ctype.from_address(address).value


SIGNATURE = ("ptr", "u64", "ptr", "u64", "u32")
VALUES = [0x7F00_0000_1000, 491520, 0x7F00_0020_0000, 24576 * 5, 5]


def test_parameter_block_holds_each_value(fake: FakeApi) -> None:
    launch = _launch(fake, SIGNATURE, VALUES)
    slots = _slots(launch)
    assert [_read(slot, kind) for slot, kind in zip(slots, SIGNATURE, strict=True)] == VALUES
    # one C-aligned block: 64-bit fields 8 bytes apart, the u32 right after the last
    assert [slot - slots[0] for slot in slots] == [0, 8, 16, 24, 32]
    assert [launch.value(i) for i in range(len(VALUES))] == VALUES


def test_set_rewrites_in_place(fake: FakeApi) -> None:
    launch = _launch(fake, SIGNATURE, VALUES)
    address, slots = launch.params_address, _slots(launch)
    launch.set(0, 0x7F00_0000_2000)
    launch.set(4, 7)
    assert launch.params_address == address
    assert _slots(launch) == slots
    assert _read(slots[0], "ptr") == 0x7F00_0000_2000
    assert _read(slots[4], "u32") == 7
    assert _read(slots[1], "u64") == 491520


def test_set_refuses_values_that_do_not_fit(fake: FakeApi) -> None:
    launch = _launch(fake, SIGNATURE, VALUES)
    with pytest.raises(ValueError, match="u32"):
        launch.set(4, 1 << 32)
    with pytest.raises(ValueError, match="u64"):
        launch.set(1, -1)
    with pytest.raises(TypeError, match="int"):
        launch.set(1, 2.0)
    launch.set(0, Handle(0x1234))  # driver pointer objects convert with int()
    assert launch.value(0) == 0x1234


def test_enqueue_passes_the_prepared_array(fake: FakeApi) -> None:
    launch = _launch(fake, SIGNATURE, VALUES, grid=(1, 2, 5), block=192, shared=0)
    stream = CUstream(0xABC)
    launch.enqueue(stream)
    launch.set(0, 0x7F00_0000_3000)
    launch.enqueue(stream)
    first, second = fake.launches
    assert first[0] == "fn:spk_segdense_embed_b32"
    assert first[1:4] == ((1, 2, 5), (192, 1, 1), 0)
    assert first[4] is stream
    assert first[5] == second[5] == launch.params_address
    assert isinstance(first[5], int)
    assert first[6] == 0


def test_enqueue_accepts_an_int_handle(fake: FakeApi) -> None:
    launch = _launch(fake, SIGNATURE, VALUES)
    launch.enqueue(0xABC)
    stream = fake.launches[0][4]
    assert isinstance(stream, CUstream) and int(stream) == 0xABC


def test_a_bound_launcher_keeps_its_parameter_block(fake: FakeApi) -> None:
    """A launcher from `bind` passes the parameter block's address: with its Launch
    dropped, the block must stay alive and hold its values (a freed block passed the
    kernel whatever the memory held next: an illegal address on the GPU)."""
    import gc

    launcher = _launch(fake, SIGNATURE, VALUES).bind(CUstream(0xABC))
    gc.collect()
    for _ in range(50):  # churn the allocator over where a freed block would lie
        _launch(fake, SIGNATURE, [0] * len(VALUES))
    launcher()
    address = fake.launches[-1][5]
    slots = list((ctypes.c_uint64 * len(SIGNATURE)).from_address(address))
    assert [_read(slot, kind) for slot, kind in zip(slots, SIGNATURE, strict=True)] == VALUES


def test_enqueue_failure_names_the_kernel(fake: FakeApi) -> None:
    launch = _launch(fake, SIGNATURE, VALUES)
    fake.launch_status = Result.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(DriverError, match=r"cuLaunchKernel\(spk_segdense_embed_b32\)"):
        launch.enqueue(CUstream(1))


def test_launch_refuses_a_bad_signature(fake: FakeApi) -> None:
    with pytest.raises(ValueError, match="kinds"):
        _launch(fake, ("ptr", "f32"), [0, 0])
    with pytest.raises(ValueError, match="2 values for 3 parameters"):
        _launch(fake, ("ptr", "u64", "u32"), [0, 0])
    with pytest.raises(ValueError, match="grid"):
        _launch(fake, SIGNATURE, VALUES, grid=(1, 0, 1))
