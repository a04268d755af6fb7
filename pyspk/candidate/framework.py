"""The plan framework every kernel area implements: boundaries and their specs,
coverage, numerics contracts, evidence of speed, phases, scratch and the candidate
protocols."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

import attrs

from pyspk.candidate.errors import DeviceUnsupported, GeometryInvalid, GeometryUnimplemented
from pyspk.cuda.errors import InvalidArgument, KernelMissingError
from pyspk.cuda.math import CudaMath
from pyspk.cuda.tier import ComputeCapability, PtxTier

if TYPE_CHECKING:
    from pyspk.cuda.device import DeviceAttributes
    from pyspk.cuda.kernels import Kernel, LoadedKernels

FLT_MAX = 3.4028234663852886e38

# kernels index their buffers with signed 32-bit integers
INDEX_LIMIT = 2**31
# static shared memory any block may use without opting in
DEFAULT_SHARED = 48 * 1024


# --- boundaries ------------------------------------------------------------------

_BOUNDARY_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")


@attrs.frozen
class BoundaryId:
    """A library boundary of the engine, by its dotted name ("resnet.seg_1")."""

    _name: str = attrs.field(alias="name")

    @classmethod
    def named(cls, name: str) -> BoundaryId:
        if not _BOUNDARY_NAME.fullmatch(name):
            raise InvalidArgument(f"boundary name {name!r} is not a dotted lower-case identifier")
        return cls(name)

    def name(self) -> str:
        return self._name

    def __str__(self) -> str:
        return self._name


SEGMENTATION_CONV_BOUNDARIES = ("sincnet.conv1", "sincnet.conv2")
DENSE_BOUNDARIES = ("linear0", "linear1", "linear2", "resnet.seg_1")
BOUNDARIES = SEGMENTATION_CONV_BOUNDARIES + DENSE_BOUNDARIES


class DenseSite(enum.Enum):
    """The dense boundaries: `value` is the boundary name."""

    LINEAR0 = "linear0"
    LINEAR1 = "linear1"
    CLASSIFIER = "linear2"
    EMBEDDING = "resnet.seg_1"

    def boundary(self) -> BoundaryId:
        return BoundaryId.named(self.value)

    def dimensions(self) -> tuple[int, int, int]:
        """(rows per batch item, n, k)."""
        return _DENSE_DIMENSIONS[self]


class SegConvSite(enum.Enum):
    """The segmentation convolutions: `value` is the boundary name."""

    CONV1 = "sincnet.conv1"
    CONV2 = "sincnet.conv2"

    def boundary(self) -> BoundaryId:
        return BoundaryId.named(self.value)

    def dimensions(self) -> tuple[int, int, int, int]:
        """(output positions, output channels, reduction cin*taps, NCW input length)."""
        return _CONV_DIMENSIONS[self]


_DENSE_DIMENSIONS = {
    DenseSite.LINEAR0: (589, 128, 256),
    DenseSite.LINEAR1: (589, 128, 128),
    DenseSite.CLASSIFIER: (589, 7, 128),
    DenseSite.EMBEDDING: (3, 256, 5120),
}
_CONV_DIMENSIONS = {
    SegConvSite.CONV1: (5321, 60, 400, 5325),
    SegConvSite.CONV2: (1769, 60, 300, 1773),
}
CONV_TAPS = 5


SiteT = TypeVar("SiteT", "DenseSite", "SegConvSite")


@attrs.frozen
class _Spec(Generic[SiteT]):
    """What both specs share: site, batch and math, and the construction checks, which
    validate the batch (a positive integer) and that every buffer fits 32-bit kernel
    indexing."""

    _site: SiteT = attrs.field(alias="site")
    _batch: int = attrs.field(alias="batch")
    _math: CudaMath = attrs.field(alias="math")

    def __attrs_post_init__(self) -> None:
        context = f"{self._site.value} spec"
        batch = self._batch
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise GeometryInvalid(context, f"batch {batch!r} is not a positive integer")
        largest = max(self.input_len(), self.weight_len(), self.output_len())
        if largest >= INDEX_LIMIT:
            raise GeometryUnimplemented(
                context, f"batch {batch} needs {largest} elements, past 32-bit kernel indexing"
            )

    def site(self) -> SiteT:
        return self._site

    def batch(self) -> int:
        return self._batch

    def math(self) -> CudaMath:
        return self._math

    def weight_len(self) -> int:
        """n * k: the weight of either layout."""
        dimensions = self._site.dimensions()
        return dimensions[1] * dimensions[2]

    def input_len(self) -> int:
        raise NotImplementedError

    def output_len(self) -> int:
        raise NotImplementedError


@attrs.frozen
class DenseSpec(_Spec[DenseSite]):
    """One dense boundary call: `y[m, n] = epilogue(x[m, k] @ W + b)`, m = batch * rows."""

    def rows(self) -> int:
        """m, the rows of the whole batch."""
        return self._batch * self._site.dimensions()[0]

    def input_len(self) -> int:
        return self.rows() * self._site.dimensions()[2]

    def bias_len(self) -> int:
        return self._site.dimensions()[1]

    def output_len(self) -> int:
        return self.rows() * self._site.dimensions()[1]


@attrs.frozen
class SegConvSpec(_Spec[SegConvSite]):
    """One valid five-tap NCW convolution call without bias: `[b, cin, L] -> [b, 60, L-4]`."""

    def input_channels(self) -> int:
        return self._site.dimensions()[2] // CONV_TAPS

    def input_len(self) -> int:
        return self._batch * self.input_channels() * self._site.dimensions()[3]

    def output_len(self) -> int:
        positions, n = self._site.dimensions()[:2]
        return self._batch * n * positions


# --- coverage ----------------------------------------------------------------------

# typed attrs converters: a bare `tuple` converter leaves mypy an unsolved type variable


def _int_tuple(items: Iterable[int]) -> tuple[int, ...]:
    return tuple(items)


def _str_tuple(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


def _entry_tuple(items: Iterable[CoverageEntry]) -> tuple[CoverageEntry, ...]:
    return tuple(items)


def _speed_tuple(items: Iterable[ArchitectureSpeed]) -> tuple[ArchitectureSpeed, ...]:
    return tuple(items)


@attrs.frozen
class Batches:
    """The batches a coverage entry admits: `only` lists them, None admits every batch."""

    only: tuple[int, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(_int_tuple)
    )

    @classmethod
    def all(cls) -> Batches:
        return cls(None)

    @classmethod
    def of(cls, *batches: int) -> Batches:
        return cls(batches)

    def covers(self, batch: int) -> bool:
        return self.only is None or batch in self.only


class Maths(enum.Enum):
    """The math modes a coverage entry admits."""

    ALL = "all"
    FP32 = "fp32"
    TF32 = "tf32"

    def covers(self, math: CudaMath) -> bool:
        return self is Maths.ALL or self.value == math.value


@attrs.frozen
class CoverageEntry:
    layers: tuple[str, ...] = attrs.field(converter=_str_tuple)
    batches: Batches
    maths: Maths

    def covers(self, layer: str, batch: int, math: CudaMath) -> bool:
        return layer in self.layers and self.batches.covers(batch) and self.maths.covers(math)


@attrs.frozen
class Coverage:
    """What an area plans: a union of coverage entries."""

    entries: tuple[CoverageEntry, ...] = attrs.field(converter=_entry_tuple)

    def covers(self, layer: str | BoundaryId, batch: int, math: CudaMath) -> bool:
        name = layer.name() if isinstance(layer, BoundaryId) else layer
        return any(entry.covers(name, batch, math) for entry in self.entries)


# --- numerics contracts ------------------------------------------------------------


@attrs.frozen
class AbsoluteSum:
    """Outputs are finite whenever, for every output, the float64 sum of the absolute
    values of its terms is at most FLT_MAX / headroom."""

    headroom: int

    def bound(self) -> float:
        return FLT_MAX / self.headroom

    def holds(self, absolute_sums: Any) -> bool:
        """Whether inputs whose per-output absolute sums are `absolute_sums` are covered."""
        import numpy as np

        return bool(np.all(np.asarray(absolute_sums, dtype=np.float64) <= self.bound()))


FiniteContract = AbsoluteSum


# what a kernel area promises for NaN, infinite and signed-zero operands: nothing
# (UNSPECIFIED), or that they reach the output as IEEE arithmetic would carry them
NanContract = enum.Enum("NanContract", {"UNSPECIFIED": "unspecified", "PROPAGATED": "propagated"})
InfinityContract = enum.Enum(
    "InfinityContract", {"UNSPECIFIED": "unspecified", "PROPAGATED": "propagated"}
)
SignedZeroContract = enum.Enum(
    "SignedZeroContract", {"UNSPECIFIED": "unspecified", "PRESERVED": "preserved"}
)


@attrs.frozen
class SpecialValues:
    """What a kernel area promises about special floating-point values."""

    finite: FiniteContract
    nan: NanContract
    infinity: InfinityContract
    signed_zero: SignedZeroContract


# --- evidence of speed ---------------------------------------------------------------

MINIMUM_BROAD_SPEEDUP_MILLI = 1050


@attrs.frozen
class ArchitectureSpeed:
    """The smallest speedup over the library measured on one architecture, in 1/1000."""

    capability: ComputeCapability
    minimum_speedup_milli: int


@attrs.frozen
class BroadEvidence:
    """Measurements that let an area run by default beyond the devices it was tuned on.

    Refuses fewer than two architectures, any speedup under 1.05x, and an architecture
    measured twice: one fast device is not evidence for a family."""

    architectures: tuple[ArchitectureSpeed, ...] = attrs.field(converter=_speed_tuple)
    note: str
    minimum_capability: ComputeCapability
    tier: PtxTier

    def __attrs_post_init__(self) -> None:
        if len(self.architectures) < 2:
            raise InvalidArgument(
                f"broad evidence needs at least two architectures, got {len(self.architectures)}"
            )
        for speed in self.architectures:
            if speed.minimum_speedup_milli < MINIMUM_BROAD_SPEEDUP_MILLI:
                raise InvalidArgument(
                    f"broad evidence on {speed.capability} is "
                    f"{speed.minimum_speedup_milli / 1000:.3f}x, under the 1.05x floor"
                )
        capabilities = [speed.capability for speed in self.architectures]
        repeated = sorted({str(c) for c in capabilities if capabilities.count(c) > 1})
        if repeated:
            raise InvalidArgument(f"broad evidence repeats capability {', '.join(repeated)}")

    @classmethod
    def with_limits(
        cls,
        architectures: Sequence[ArchitectureSpeed],
        note: str,
        minimum_capability: ComputeCapability,
        tier: PtxTier,
    ) -> BroadEvidence:
        return cls(tuple(architectures), note, minimum_capability, tier)


class Fp16Policy(enum.Enum):
    """Whether the engine admits scaled FP16 products where an area offers them."""

    ALLOW = "allow"
    FORBID = "forbid"


# --- phases and scratch --------------------------------------------------------------


class Op(enum.Enum):
    """The launches of one enqueue, as `Phases` sees them."""

    MAIN = "main"
    REDUCE = "reduce"


T = TypeVar("T")


@runtime_checkable
class Phases(Protocol):
    """Wraps each op of an enqueue, e.g. to time it; must call `launch` exactly once."""

    def op(self, op: Op, launch: Callable[[], T]) -> T: ...


class PassThroughPhases:
    """The default `Phases`: runs each op as it is."""

    def op(self, op: Op, launch: Callable[[], T]) -> T:
        return launch()


PASS_THROUGH = PassThroughPhases()


@runtime_checkable
class Scratch(Protocol):
    """Device memory a plan borrows for intermediate results (split-K partial planes).

    An outer pipeline may pass its own, shared between plans that never run at once."""

    @property
    def ptr(self) -> int: ...

    def __len__(self) -> int: ...


# --- candidate protocols ---------------------------------------------------------------


class DenseCandidate(Protocol):
    COVERAGE: ClassVar[Coverage]
    SPECIAL_VALUES: ClassVar[SpecialValues]

    @classmethod
    def implemented_pin(cls, spec: DenseSpec, tier: PtxTier, device: DeviceAttributes) -> Any: ...

    @classmethod
    def plan(
        cls, runtime: Any, kernels: Any, spec: DenseSpec, weight: Any, bias: Any, pin: Any
    ) -> DenseCandidate: ...

    def enqueue(self, x: Any, output: Any, phases: Phases = ...) -> None: ...


class SegConvCandidate(Protocol):
    COVERAGE: ClassVar[Coverage]
    SPECIAL_VALUES: ClassVar[SpecialValues]

    @classmethod
    def implemented_pin(cls, spec: SegConvSpec, tier: PtxTier, device: DeviceAttributes) -> Any: ...

    @classmethod
    def plan(
        cls, runtime: Any, kernels: Any, spec: SegConvSpec, weight: Any, pin: Any
    ) -> SegConvCandidate: ...

    def enqueue(self, x: Any, output: Any, phases: Phases = ...) -> None: ...


class DriverCandidate(Protocol):
    """An area the engine's registry routes boundaries to."""

    AREA: ClassVar[Any]

    @classmethod
    def driver_coverage(
        cls, tier: PtxTier, device: DeviceAttributes, fp16: Fp16Policy
    ) -> Coverage: ...

    @classmethod
    def broad_evidence(cls) -> BroadEvidence | None: ...

    # the pin a boundary gets from (boundary, batch, math, device, tier[, fp16]); the
    # tuning pins are None where a tuning run has no candidate
    driver_pin: ClassVar[
        Callable[[BoundaryId, int, CudaMath, DeviceAttributes, PtxTier, Fp16Policy], Any]
    ]
    tuning_fp32_pin: ClassVar[Callable[[BoundaryId, int, CudaMath, DeviceAttributes, PtxTier], Any]]
    tuning_tf32_pin: ClassVar[Callable[[BoundaryId, int, CudaMath, DeviceAttributes, PtxTier], Any]]


def launchable_kernels(
    device: DeviceAttributes, loaded: LoadedKernels, names: Sequence[str], shared: int
) -> list[Kernel]:
    """The kernels `names` of `loaded`, the first opted in to `shared` bytes of dynamic
    shared memory where that is above the default; `DeviceUnsupported` (take the
    library) where the device cannot give that much beside the kernel's static shared
    memory, or the module lacks a kernel."""
    optin = device.shared_optin_bytes
    if shared > max(DEFAULT_SHARED, optin):
        raise DeviceUnsupported(
            f"{names[0]} needs {shared} bytes of shared memory, the device allows {optin}"
        )
    try:
        kernels = [loaded.function(name) for name in names]
    except KernelMissingError as error:
        # a kernel the loaded module does not carry cannot serve here: a fallback
        missing = next(name for name in names if name not in loaded.entries)
        raise DeviceUnsupported(f"{missing} cannot run here: {error}; use the library") from error
    if shared > DEFAULT_SHARED:
        room = kernels[0].shared_room(optin)
        if shared > room:  # the driver would refuse the opt-in
            raise DeviceUnsupported(
                f"{names[0]} needs {shared} bytes of shared memory, the device allows "
                f"{room} beside its static shared memory"
            )
        kernels[0].set_max_dynamic_shared(shared)
    return kernels
