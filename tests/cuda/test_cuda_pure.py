"""The pure half of pyspk.cuda: capabilities, PTX tiers and their selection, math modes,
device attributes, the CudaError family and check_len. No GPU or driver needed."""

from __future__ import annotations

import itertools

import attrs
import pytest

import pyspk
import pyspk.errors
from pyspk.cuda import ComputeCapability, CudaMath, DeviceAttributes, PtxTier, check_len
from pyspk.cuda.tier import SHIPPED_TIERS, loadable_tier, module_tiers
from pyspk.errors import (
    ArtifactError,
    BufferLengthError,
    CudaError,
    DriverError,
    KernelMissingError,
    NoDeviceError,
    NoDriverError,
    PlanError,
)

CC = ComputeCapability

# --- ComputeCapability -------------------------------------------------------------


def test_capability_fields_and_equality() -> None:
    capability = CC(8, 9)
    assert (capability.major, capability.minor) == (8, 9)
    assert CC(12, 0) == CC(12, 0)
    assert CC(8, 9) != CC(8, 6)
    assert hash(CC(8, 9)) == hash(CC(8, 9))


def test_capability_order() -> None:
    ordered = [
        CC(7, 5),
        CC(8, 0),
        CC(8, 6),
        CC(8, 7),
        CC(8, 9),
        CC(9, 0),
        CC(10, 0),
        CC(10, 3),
        CC(11, 0),
        CC(12, 0),
        CC(12, 1),
    ]
    assert sorted(reversed(ordered)) == ordered
    for low, high in itertools.pairwise(ordered):
        assert low < high
        assert high > low
        assert low <= high
        assert not high < low
    # numeric, not textual: "10.0" sorts after "9.0"
    assert CC(10, 0) > CC(9, 0)
    assert CC(8, 10) > CC(8, 9)
    assert CC(8, 10) < CC(9, 0)
    assert CC(8, 9) <= CC(8, 9)
    assert CC(8, 9) >= CC(8, 9)


@pytest.mark.parametrize(
    ("capability", "text"), [((8, 9), "8.9"), ((12, 0), "12.0"), ((7, 5), "7.5"), ((10, 3), "10.3")]
)
def test_capability_str_and_parse(capability: tuple[int, int], text: str) -> None:
    assert str(CC(*capability)) == text
    assert CC.parse(text) == CC(*capability)


@pytest.mark.parametrize(
    "text", ["", "89", "8.", ".9", "8,9", "a.b", "8.9.1", "sm_89", "8.x", "-8.9"]
)
def test_capability_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        CC.parse(text)


# --- PtxTier -----------------------------------------------------------------------


def test_tier_members_and_order() -> None:
    assert [tier.name for tier in PtxTier] == ["SM75", "SM80", "SM90", "SM120"]
    assert PtxTier.SM75 < PtxTier.SM80 < PtxTier.SM90 < PtxTier.SM120
    assert PtxTier.SM120 > PtxTier.SM90 > PtxTier.SM80 > PtxTier.SM75
    assert PtxTier.SM80 >= PtxTier.SM80
    assert PtxTier.SM80 <= PtxTier.SM80
    assert not PtxTier.SM80 < PtxTier.SM80
    assert sorted([PtxTier.SM120, PtxTier.SM75, PtxTier.SM90, PtxTier.SM80]) == list(PtxTier)
    assert max(PtxTier) is PtxTier.SM120


@pytest.mark.parametrize(
    ("tier", "text"),
    [
        (PtxTier.SM75, "sm75"),
        (PtxTier.SM80, "sm80"),
        (PtxTier.SM90, "sm90"),
        (PtxTier.SM120, "sm120"),
    ],
)
def test_tier_str_and_parse(tier: PtxTier, text: str) -> None:
    assert str(tier) == text
    assert f"{tier}" == text
    assert PtxTier.parse(text) is tier
    assert PtxTier.parse(text.upper()) is tier
    assert PtxTier.parse(text.capitalize()) is tier


@pytest.mark.parametrize(
    "text", ["", "sm_80", "sm86", "sm89", "80", "8.0", "SM8O", "tf32", "sm7", "compute_80"]
)
def test_tier_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        PtxTier.parse(text)


def test_tier_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPK_PTX_TIER", raising=False)
    assert PtxTier.from_env() is None
    monkeypatch.setenv("PYSPK_PTX_TIER", "")
    assert PtxTier.from_env() is None
    monkeypatch.setenv("PYSPK_PTX_TIER", "sm75")
    assert PtxTier.from_env() is PtxTier.SM75
    monkeypatch.setenv("PYSPK_PTX_TIER", "SM80")
    assert PtxTier.from_env() is PtxTier.SM80
    for bad in ("sm70", "sm_75", "fast"):
        monkeypatch.setenv("PYSPK_PTX_TIER", bad)
        with pytest.raises(ValueError):
            PtxTier.from_env()


@pytest.mark.parametrize(
    ("capability", "tier"),
    [
        ((6, 1), None),
        ((7, 0), None),
        ((7, 2), None),
        ((7, 5), PtxTier.SM75),
        ((8, 0), PtxTier.SM80),
        ((8, 6), PtxTier.SM80),
        ((8, 9), PtxTier.SM80),
        # sm90 is built for sm_90a, which only compute capability 9.0 runs
        ((9, 0), PtxTier.SM90),
        ((10, 0), PtxTier.SM80),
        ((11, 0), PtxTier.SM80),
        ((12, 0), PtxTier.SM120),
        ((12, 1), PtxTier.SM120),
        ((13, 0), PtxTier.SM120),
    ],
)
def test_highest_for(capability: tuple[int, int], tier: PtxTier | None) -> None:
    assert PtxTier.highest_for(CC(*capability)) is tier


def test_shipped_tiers() -> None:
    # every kernel module ships in sm75 and sm80; the trunk also in sm90 (wgmma)
    assert tuple(SHIPPED_TIERS) == (PtxTier.SM75, PtxTier.SM80)
    assert module_tiers("segdense") == SHIPPED_TIERS
    assert module_tiers("trunk") == (PtxTier.SM75, PtxTier.SM80, PtxTier.SM90)


def test_arch_specific_tier_runs_on_its_capability_only() -> None:
    assert PtxTier.SM90.arch_specific and not PtxTier.SM80.arch_specific
    assert PtxTier.SM90.runs_on(CC(9, 0))
    for other in (CC(8, 9), CC(9, 1), CC(10, 0), CC(12, 0)):
        assert not PtxTier.SM90.runs_on(other)
    assert PtxTier.SM80.runs_on(CC(12, 0)) and not PtxTier.SM80.runs_on(CC(7, 5))
    trunk = module_tiers("trunk")
    assert PtxTier.highest_for(CC(9, 0), trunk) is PtxTier.SM90
    assert PtxTier.highest_for(CC(10, 0), trunk) is PtxTier.SM80


@pytest.mark.parametrize(
    ("capability", "tier"),
    [
        ((7, 5), PtxTier.SM75),
        ((8, 0), PtxTier.SM80),
        ((8, 6), PtxTier.SM80),
        ((8, 9), PtxTier.SM80),
        ((9, 0), PtxTier.SM80),
        ((10, 0), PtxTier.SM80),
        ((12, 0), PtxTier.SM80),
        ((12, 1), PtxTier.SM80),
    ],
)
def test_loadable_tier_highest_shipped(capability: tuple[int, int], tier: PtxTier) -> None:
    assert loadable_tier(CC(*capability)) is tier
    assert loadable_tier(CC(*capability), None) is tier
    # forcing a lower shipped tier, or the same one, is allowed
    assert loadable_tier(CC(*capability), PtxTier.SM75) is PtxTier.SM75
    assert loadable_tier(CC(*capability), tier) is tier


def test_loadable_tier_refusals() -> None:
    with pytest.raises(ValueError):
        loadable_tier(CC(7, 5), PtxTier.SM80)  # above the device
    with pytest.raises(ValueError):
        loadable_tier(CC(9, 0), PtxTier.SM90)  # not shipped
    with pytest.raises(ValueError):
        loadable_tier(CC(12, 0), PtxTier.SM120)  # not shipped
    for capability in (CC(7, 0), CC(6, 1), CC(5, 0)):
        with pytest.raises(ValueError):
            loadable_tier(capability)
        with pytest.raises(ValueError):
            loadable_tier(capability, PtxTier.SM75)


def test_loadable_tier_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPK_PTX_TIER", "sm75")
    assert loadable_tier(CC(8, 9), PtxTier.from_env()) is PtxTier.SM75
    monkeypatch.delenv("PYSPK_PTX_TIER")
    assert loadable_tier(CC(8, 9), PtxTier.from_env()) is PtxTier.SM80


# --- CudaMath ----------------------------------------------------------------------


def test_cuda_math() -> None:
    assert [math.name for math in CudaMath] == ["FP32", "TF32"]
    assert CudaMath.FP32 != CudaMath.TF32
    assert CudaMath.parse("tf32") is CudaMath.TF32
    assert CudaMath.parse("FP32") is CudaMath.FP32
    assert CudaMath.parse(str(CudaMath.TF32)) is CudaMath.TF32
    with pytest.raises(ValueError):
        CudaMath.parse("fp16")


# --- DeviceAttributes --------------------------------------------------------------


def test_device_attribute_defaults() -> None:
    device = DeviceAttributes(CC(8, 9))
    assert device.capability == CC(8, 9)
    assert device.multiprocessors == 1
    assert device.shared_optin_bytes == 99 * 1024 == 101376
    assert device.l2_bytes == 4 * 1024 * 1024
    assert device.name == "test device"


def test_device_attribute_fields() -> None:
    device = DeviceAttributes(CC(12, 0), multiprocessors=36)
    assert (device.capability, device.multiprocessors) == (CC(12, 0), 36)
    device = DeviceAttributes(
        CC(9, 0),
        multiprocessors=132,
        shared_optin_bytes=227 * 1024,
        l2_bytes=50 * 1024 * 1024,
        name="H100",
    )
    assert (device.multiprocessors, device.shared_optin_bytes, device.l2_bytes, device.name) == (
        132,
        232448,
        52428800,
        "H100",
    )
    assert device == DeviceAttributes(CC(9, 0), 132, 227 * 1024, 50 * 1024 * 1024, "H100")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        device.multiprocessors = 2  # type: ignore[misc]


@pytest.mark.parametrize("count", [0, -1])
def test_device_attributes_refuse_no_multiprocessors(count: int) -> None:
    with pytest.raises(ValueError):
        DeviceAttributes(CC(8, 9), multiprocessors=count)


# --- errors ------------------------------------------------------------------------


def test_check_len() -> None:
    assert check_len("segdense plan", 24576, 24576) is None
    assert check_len("segdense plan", 0, 0, "bias") is None
    with pytest.raises(BufferLengthError) as caught:
        check_len("segdense plan", 24576, 24575, "output")
    error = caught.value
    message = str(error)
    for part in ("segdense plan", "output", "24576", "24575"):
        assert part in message
    assert (error.context, error.buffer, error.expected, error.actual) == (
        "segdense plan",
        "output",
        24576,
        24575,
    )
    with pytest.raises(BufferLengthError) as caught:
        check_len("conv1 plan", 10, 11)
    assert "conv1 plan" in str(caught.value)
    assert "10" in str(caught.value)
    assert "11" in str(caught.value)


def test_buffer_length_error_keeps_expected_and_actual_apart() -> None:
    with pytest.raises(BufferLengthError) as caught:
        check_len("ctx", 5, 7, "weight")
    assert (caught.value.expected, caught.value.actual) == (5, 7)
    assert isinstance(caught.value, CudaError)


def test_driver_error() -> None:
    error = DriverError("cuModuleLoadData", "CUDA_ERROR_INVALID_PTX", "invalid PTX", 218)
    message = str(error)
    for part in ("cuModuleLoadData", "CUDA_ERROR_INVALID_PTX", "218"):
        assert part in message


CUDA_ERRORS = [
    DriverError,
    NoDriverError,
    NoDeviceError,
    BufferLengthError,
    KernelMissingError,
    ArtifactError,
]


@pytest.mark.parametrize("cls", CUDA_ERRORS, ids=lambda cls: cls.__name__)
def test_cuda_error_family(cls: type) -> None:
    assert issubclass(cls, CudaError)
    assert getattr(pyspk.errors, cls.__name__) is cls
    assert not issubclass(cls, PlanError)


def test_cuda_error_from_pyspk() -> None:
    assert pyspk.CudaError is CudaError
    assert not issubclass(CudaError, PlanError)
    assert not issubclass(PlanError, CudaError)
