"""Compute capabilities and the PTX tiers the kernel module ships in."""

from __future__ import annotations

import enum
import functools
import os
import re
from collections.abc import Iterable

import attrs

from pyspk.cuda.errors import InvalidArgument

_CAPABILITY = re.compile(r"^\s*(\d+)\.(\d+)\s*$")


@functools.total_ordering
@attrs.frozen(order=False)
class ComputeCapability:
    """A CUDA compute capability, ordered by (major, minor) and written "8.9"."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> ComputeCapability:
        """Parse "8.9"; anything else is a `ValueError` naming the text."""
        match = _CAPABILITY.match(text)
        if match is None:
            raise InvalidArgument(f"compute capability {text!r} is not of the form MAJOR.MINOR")
        return cls(int(match.group(1)), int(match.group(2)))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ComputeCapability):
            return NotImplemented
        return (self.major, self.minor) < (other.major, other.minor)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def sm(self) -> str:
        """The exact-architecture name, "sm_89"."""
        return f"sm_{self.major}{self.minor}"


@functools.total_ordering
class PtxTier(enum.Enum):
    """A PTX target the kernel module is built for; a device runs tiers at or below it."""

    SM75 = (7, 5)
    SM80 = (8, 0)
    SM90 = (9, 0)
    SM120 = (12, 0)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, PtxTier):
            return NotImplemented
        return self.value < other.value

    def __str__(self) -> str:
        return f"sm{self.value[0]}{self.value[1]}"

    @property
    def capability(self) -> ComputeCapability:
        """The lowest compute capability that runs this tier."""
        return ComputeCapability(*self.value)

    @property
    def arch_specific(self) -> bool:
        """Whether the tier is built for its architecture's own features (sm90: sm_90a,
        for wgmma), so that only a device of exactly its capability runs it."""
        return self is PtxTier.SM90

    def runs_on(self, capability: ComputeCapability) -> bool:
        """Whether a device of `capability` runs this tier."""
        if self.arch_specific:
            return self.capability == capability
        return self.capability <= capability

    @classmethod
    def parse(cls, text: str) -> PtxTier:
        """Parse "sm80" (case and surrounding space ignored)."""
        wanted = text.strip().lower()
        for tier in cls:
            if str(tier) == wanted:
                return tier
        names = ", ".join(str(tier) for tier in cls)
        raise InvalidArgument(f"PTX tier {text!r} is not one of {names}")

    @classmethod
    def highest_for(
        cls, capability: ComputeCapability, among: Iterable[PtxTier] | None = None
    ) -> PtxTier | None:
        """The highest tier (of `among`, by default every tier) a device of `capability`
        runs, or None where it runs none."""
        runnable = [tier for tier in (cls if among is None else among) if tier.runs_on(capability)]
        return max(runnable) if runnable else None

    @classmethod
    def from_env(cls) -> PtxTier | None:
        """The tier `PYSPK_PTX_TIER` forces, or None when it is unset or empty."""
        value = os.environ.get("PYSPK_PTX_TIER", "")
        return cls.parse(value) if value.strip() else None


@attrs.frozen
class TierBuild:
    """How a shipped tier is built: the virtual architecture nvcc targets, the `.target`
    and the PTX ISA version its header is pinned to (low, so old drivers load it), and
    the real architectures its cubins are assembled for. `tools/kernels.py` builds and
    checks from this table; the loader reads the same names from the manifest."""

    name: str
    virtual: str
    target: str
    ptx_version: str
    archs: tuple[str, ...]


TIER_BUILDS = {
    PtxTier.SM75: TierBuild(
        "sm75",
        "compute_75",
        "sm_75",
        "6.3",
        ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_120"),
    ),
    PtxTier.SM80: TierBuild(
        "sm80", "compute_80", "sm_80", "7.0", ("sm_80", "sm_86", "sm_89", "sm_90", "sm_120")
    ),
    # Hopper's own features (wgmma): PTX ISA 8.0 is the first with them
    PtxTier.SM90: TierBuild("sm90", "compute_90a", "sm_90a", "8.0", ("sm_90a",)),
}
# the tiers every kernel module is built in; a device loads the highest it runs
SHIPPED_TIERS = (PtxTier.SM75, PtxTier.SM80)
# modules built in more tiers than those: the trunk's strips on wgmma in sm90
MODULE_TIERS = {"trunk": (PtxTier.SM75, PtxTier.SM80, PtxTier.SM90)}


def module_tiers(module: str) -> tuple[PtxTier, ...]:
    """The tiers the kernel module `module` ("segdense", "trunk", ...) is built in."""
    return MODULE_TIERS.get(module, SHIPPED_TIERS)


# the artifact layout the build writes and the loader reads, beside the manifest
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
CUBIN_DIR = "cubin"


def ptx_name(module: str, tier: str) -> str:
    """ "segdense.sm80.ptx": the PTX file of `module` in `tier`."""
    return f"{module}.{tier}.ptx"


def cubin_name(module: str, tier: str, arch: str) -> str:
    """ "cubin/segdense.sm80.sm_90.cubin": the cubin of that PTX for `arch`."""
    return f"{CUBIN_DIR}/{module}.{tier}.{arch}.cubin"


def loadable_tier(capability: ComputeCapability, forced: PtxTier | None = None) -> PtxTier:
    """The shipped tier a device of `capability` loads: the highest at or below it, or
    `forced` (e.g. from `PtxTier.from_env()`) when that is shipped and not above it.
    Raises ValueError naming the device and tier otherwise."""
    highest = PtxTier.highest_for(capability, SHIPPED_TIERS)
    if highest is None:
        raise InvalidArgument(
            f"compute capability {capability} is below the lowest shipped PTX tier "
            f"{SHIPPED_TIERS[0]}"
        )
    if forced is None:
        return highest
    if forced not in SHIPPED_TIERS:
        shipped = ", ".join(str(tier) for tier in SHIPPED_TIERS)
        raise InvalidArgument(f"PTX tier {forced} is not shipped (shipped: {shipped})")
    if forced.capability > capability:
        raise InvalidArgument(
            f"PTX tier {forced} needs compute capability {forced.capability}, "
            f"the device has {capability}"
        )
    return forced
