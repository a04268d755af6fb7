"""The device rule of the segdense area: which kernel entry, launch shape and split
count each boundary runs, as a fixed function of the loaded PTX tier and the device's
attributes (never of run-time timing)."""

from __future__ import annotations

import enum
from typing import TypedDict

import attrs

from pyspk.candidate.errors import DeviceUnsupported, GeometryInvalid, GeometryUnimplemented
from pyspk.candidate.framework import (
    BoundaryId,
    DenseSite,
    Fp16Policy,
    SegConvSite,
)
from pyspk.candidate.segdense.shapes import (
    CONTEXT,
    EMBED_MAX_SPLITS,
    HALF_MIN_SPLITS,
    HALF_SHARED,
    KERNEL_PREFIX,
    Config,
    Fragments,
    Gemv,
    Split,
)
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import InvalidArgument
from pyspk.cuda.math import CudaMath
from pyspk.cuda.tier import ComputeCapability, PtxTier


@attrs.frozen
class Hardware:
    """The device attributes that choose among a site's kernel configurations."""

    capability: ComputeCapability
    # streaming multiprocessors this context may use
    multiprocessors: int
    # shared memory one block may opt in to, in bytes
    shared_optin: int

    @classmethod
    def of(cls, device: DeviceAttributes) -> Hardware:
        return cls(device.capability, device.multiprocessors, device.shared_optin_bytes)

    def tensor_heavy(self) -> bool:
        """Whether dense TF32 tensor throughput is several times the FP32 SIMT rate.

        8.0 (A100, A30), 9.0 (H100, H200) and 10.0 (B200) are the data-center parts with
        full-rate tensor cores; GeForce and workstation parts (8.6, 8.9, 12.x) run TF32 at
        about their FP32 rate, where three TF32 products cost more than one FP32 product.
        Unknown capabilities keep the SIMT kernels, which do not depend on the ratio."""
        return (self.capability.major, self.capability.minor) in ((8, 0), (9, 0), (10, 0))

    def consumer_blackwell(self) -> bool:
        """12.x, where the TF32 embedding split-K is fastest as one 384-thread block per
        SM (`EMBED_B32_TF32_K2`); on 8.9 two 192-thread blocks per SM (`EMBED_B32_TF32`)
        are, as measured on an RTX 5060 Ti and an RTX 4060 Ti (docs/performance.md)."""
        return self.capability.major == 12

    def half_split_fits(self) -> bool:
        """One resident block per SM gives `spk_segdense_embed_b32_f16` at least
        HALF_MIN_SPLITS slices, and a block can opt in to its shared memory."""
        residency = Entry.EMBED_B32_F16.split_resident()
        assert residency is not None  # EMBED_B32_F16 is a split-K entry
        slices = self.splits(*residency)
        return slices >= HALF_MIN_SPLITS and self.shared_optin >= HALF_SHARED

    def splits(self, tiles: int, resident: int) -> int:
        """Reduction slices for a split-K kernel of `tiles` output tiles and `resident`
        blocks per SM: one block per resident slot, so the single wave starts at once."""
        return min(max(self.multiprocessors * resident // tiles, 1), EMBED_MAX_SPLITS)

    def split_choice(self, entry: Entry) -> Choice:
        """Split-K `entry` with the slices its residency (`Entry.split_resident`) gives
        on this device."""
        residency = entry.split_resident()
        if residency is None:
            raise GeometryInvalid(CONTEXT, f"{entry.name} has no split-K slices")
        return Choice.split(entry, self.splits(*residency))


@enum.unique
class Site(enum.Enum):
    """The boundaries this area implements; `value` is the boundary name."""

    CONV1 = "sincnet.conv1"
    CONV2 = "sincnet.conv2"
    LINEAR0 = "linear0"
    LINEAR1 = "linear1"
    LINEAR2 = "linear2"
    EMBEDDING = "resnet.seg_1"

    @classmethod
    def of(cls, site: Site | DenseSite | SegConvSite | BoundaryId) -> Site:
        """The area's site of any of the vocabulary's names for a boundary: the engine's
        `BoundaryId`, the framework's `DenseSite` or `SegConvSite`, or a `Site`."""
        if isinstance(site, Site):
            return site
        if isinstance(site, BoundaryId):
            return cls.from_boundary(site)
        found = _FROM_FRAMEWORK.get(site)
        if found is None:
            raise InvalidArgument(
                f"{CONTEXT}: {site!r} is no Site, DenseSite, SegConvSite or BoundaryId"
            )
        return found

    @classmethod
    def from_boundary(cls, boundary: BoundaryId) -> Site:
        found = _BY_BOUNDARY.get(boundary)
        if found is None:
            raise GeometryUnimplemented(CONTEXT, f"unknown boundary {boundary}")
        return found

    def framework_site(self) -> DenseSite | SegConvSite:
        """The framework's site of this boundary (a `SegConvSite` for the convolutions)."""
        return _TO_FRAMEWORK[self]

    def boundary(self) -> BoundaryId:
        return self.framework_site().boundary()

    def dimensions(self) -> tuple[int, int, int, int]:
        """(rows per batch item, columns, reduction, NCW input length); convolution rows
        are output positions, and the input length is 0 for the dense sites. The
        framework's site tables hold the figures."""
        site = self.framework_site()
        if isinstance(site, SegConvSite):
            return site.dimensions()
        return (*site.dimensions(), 0)

    def is_conv(self) -> bool:
        return self in (Site.CONV1, Site.CONV2)

    def choice(
        self, batch: int, math: CudaMath, tier: PtxTier, hardware: Hardware
    ) -> Choice | None:
        """The kernel of this site for `batch`, `math`, the loaded PTX `tier` and the
        device, if the batch is one the kernels are compiled for."""
        if tier >= PtxTier.SM80:
            choice = self.tensor_choice(batch, math, hardware)
            if choice is not None:
                return choice
        return self.scalar_choice(batch, math, hardware)

    def scalar_choice(self, batch: int, math: CudaMath, hardware: Hardware) -> Choice | None:
        """The non-tensor kernel, with the same fixed-order reduction as the tensor ones."""
        if (self, batch) == (Site.EMBEDDING, 32):
            return hardware.split_choice(Entry.EMBED_B32)
        if (self, batch) == (Site.LINEAR1, 1) and math is CudaMath.TF32:
            # the FP32 kernel is compensated, which costs time and buys nothing against
            # TF32 library error; the TF32 kernel is the plain SIMT one in both tiers
            return Choice.fixed(Entry.LINEAR1_B1_TF32)
        entry = _SCALAR_ENTRIES.get((self, batch))
        return None if entry is None else Choice.fixed(entry)

    def tensor_choice(self, batch: int, math: CudaMath, hardware: Hardware) -> Choice | None:
        """The sm80-tier tensor-core kernel of this site, where one beats both the library
        and the SIMT kernel on this device."""
        heavy = hardware.tensor_heavy()
        tf32 = math is CudaMath.TF32
        if batch == 32 and heavy and self.is_conv():
            # where TF32 runs at about the FP32 rate the FP32 SIMT convolution already
            # beats the TF32 library and stays exact
            return Choice.fixed(_TENSOR_CONV[self, tf32])
        if (self, batch) == (Site.LINEAR0, 1) and tf32:
            return Choice.fixed(Entry.LINEAR0_B1_TF32)
        if (self, batch) == (Site.LINEAR0, 32) and tf32:
            # batch 1 keeps plain TF32: residual products' latency cost it most of its
            # margin over the library (docs/performance.md)
            return Choice.fixed(Entry.LINEAR0_B32_SELECT)
        if (self, batch) == (Site.LINEAR1, 32) and tf32:
            return Choice.fixed(Entry.LINEAR1_B32_TF32)
        if (self, batch) != (Site.EMBEDDING, 32):
            return None
        if tf32:
            if heavy:
                # the main kernel is short where TF32 mma runs at several times the FP32
                # rate, so 96 x 64 tiles fill one wave with half the slices (54 against
                # 108 on an A100; docs/performance.md)
                return hardware.split_choice(Entry.EMBED_B32_TF32_E64)
            if hardware.half_split_fits():
                # FP16 products run at twice the TF32 rate there; one 384-thread block/SM
                return hardware.split_choice(Entry.EMBED_B32_F16)
            return Site.tf32_embedding(hardware)
        if heavy:
            return hardware.split_choice(Entry.EMBED_B32_X3)
        return None

    @staticmethod
    def tf32_embedding(hardware: Hardware) -> Choice:
        """The batch-32 TF32 embedding kernel where TF32 runs at about the FP32 rate."""
        if hardware.consumer_blackwell():
            return hardware.split_choice(Entry.EMBED_B32_TF32_K2)
        return hardware.split_choice(Entry.EMBED_B32_TF32)

    def rule_choice(
        self, batch: int, math: CudaMath, tier: PtxTier, hardware: Hardware, fp16: Fp16Policy
    ) -> Choice | None:
        """The device rule's choice under the FP16 policy: `choice`, or with
        `Fp16Policy.FORBID` `choice_without_fp16`."""
        if fp16 is Fp16Policy.FORBID:
            return self.choice_without_fp16(batch, math, tier, hardware)
        return self.choice(batch, math, tier, hardware)

    def choice_without_fp16(
        self, batch: int, math: CudaMath, tier: PtxTier, hardware: Hardware
    ) -> Choice | None:
        """`choice` with no FP16 products (`Fp16Policy.FORBID`): the FP16 embedding's
        TF32 alternative, and for the other FP16 entries the kernel FP32 math picks
        (FP32 or 3xTF32 products, more exact than TF32 math asks)."""
        choice = self.choice(batch, math, tier, hardware)
        if choice is None or choice.entry.products() is not Products.FP16:
            return choice
        if choice.entry is Entry.EMBED_B32_F16:
            return Site.tf32_embedding(hardware)
        return self.choice(batch, CudaMath.FP32, tier, hardware)

    def tuning_tf32_choice(self, batch: int, math: CudaMath, hardware: Hardware) -> Choice | None:
        """The TF32 kernel that FP16 products replace, so a tuner can time an approved
        kernel of ours where the device rule picks the FP16 one."""
        default = self.tensor_choice(batch, math, hardware)
        if default is None or default.entry is not Entry.EMBED_B32_F16:
            return None
        return Site.tf32_embedding(hardware)


# the one table between the area's sites and the framework's; the other directions and
# the boundaries are derived from it
_TO_FRAMEWORK: dict[Site, DenseSite | SegConvSite] = {
    Site.CONV1: SegConvSite.CONV1,
    Site.CONV2: SegConvSite.CONV2,
    Site.LINEAR0: DenseSite.LINEAR0,
    Site.LINEAR1: DenseSite.LINEAR1,
    Site.LINEAR2: DenseSite.CLASSIFIER,
    Site.EMBEDDING: DenseSite.EMBEDDING,
}
_FROM_FRAMEWORK = {framework: site for site, framework in _TO_FRAMEWORK.items()}
_BY_BOUNDARY = {framework.boundary(): site for site, framework in _TO_FRAMEWORK.items()}


class Products(enum.Enum):
    """The precision of an entry's products on the sm80 tier."""

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"


@enum.unique
class Entry(enum.Enum):
    """One kernel entry; its site, batch, tile, block and shared memory are fixed, and
    split-K entries also take a slice count."""

    CONV1_B1 = "conv1_b1"
    CONV1_B32 = "conv1_b32"
    CONV1_B32_TC = "conv1_b32_tc"
    CONV1_B32_X3 = "conv1_b32_x3"
    CONV2_B1 = "conv2_b1"
    CONV2_B32 = "conv2_b32"
    CONV2_B32_TC = "conv2_b32_tc"
    CONV2_B32_X3 = "conv2_b32_x3"
    LINEAR0_B1 = "linear0_b1"
    LINEAR0_B1_TF32 = "linear0_b1_tf32"
    LINEAR0_B32 = "linear0_b32"
    LINEAR0_B32_SELECT = "linear0_b32_select"
    LINEAR1_B1 = "linear1_b1"
    # TF32 math: plain FP32 SIMT sums in both tiers, not linear1_b1's compensated ones
    LINEAR1_B1_TF32 = "linear1_b1_tf32"
    LINEAR1_B32 = "linear1_b32"
    LINEAR1_B32_TF32 = "linear1_b32_tf32"
    CLASSIFIER_B1 = "classifier_b1"
    CLASSIFIER_B32 = "classifier_b32"
    EMBED_B1 = "embed_b1"
    # split-K FP32 SIMT
    EMBED_B32 = "embed_b32"
    # split-K TF32, two resident blocks per SM
    EMBED_B32_TF32 = "embed_b32_tf32"
    # split-K TF32 with an in-block k-split, one block per SM
    EMBED_B32_TF32_K2 = "embed_b32_tf32_k2"
    # split-K TF32 on 96 x 64 tiles
    EMBED_B32_TF32_E64 = "embed_b32_tf32_e64"
    # split-K 3xTF32 on 96 x 64 tiles
    EMBED_B32_X3 = "embed_b32_x3"
    # split-K scaled FP16 products
    EMBED_B32_F16 = "embed_b32_f16"

    def site(self) -> Site:
        return _ENTRY_FACTS[self][0]

    def batch(self) -> int:
        return _ENTRY_FACTS[self][1]

    def tier(self) -> PtxTier:
        """The lowest PTX tier whose module carries this entry's real kernel (the sm75
        module holds trapping stubs of the sm80-only entries)."""
        return _ENTRY_FACTS[self][2]

    def products(self) -> Products:
        return _ENTRY_FACTS[self][3]

    def variant(self) -> str:
        """The entry's form within its site and batch, as `pyspk pins` labels it: "simt"
        for the FP32 SIMT kernels, else the tensor-core or split-K form ("x3", "e64")."""
        return _VARIANTS.get(self, "simt")

    def kernel(self) -> str:
        """The kernel's exported name: KERNEL_PREFIX and the entry's value (Select keeps
        the name of the TF32 kernel it grew from)."""
        return KERNEL_PREFIX + _KERNEL_STEMS.get(self, self.value)

    def config(self, splits: int) -> Config:
        """The launch shape, with `splits` reduction slices for a split-K entry."""
        return _CONFIGS[self](self.kernel(), splits)

    def is_split(self) -> bool:
        return isinstance(self.config(1).kind, Split)

    def split_resident(self) -> tuple[int, int] | None:
        """(output tiles, resident blocks per SM) that size this split-K entry's slice
        count in the device rule, or None for an entry without split-K."""
        return _SPLIT_RESIDENCY.get(self)


# every entry not listed is an FP32 SIMT kernel ("simt")
_VARIANTS = {
    Entry.CONV1_B32_TC: "tc",
    Entry.CONV2_B32_TC: "tc",
    Entry.CONV1_B32_X3: "x3",
    Entry.CONV2_B32_X3: "x3",
    Entry.EMBED_B32_X3: "x3",
    Entry.LINEAR0_B1_TF32: "tf32",
    Entry.LINEAR1_B1_TF32: "tf32",
    Entry.LINEAR1_B32_TF32: "tf32",
    Entry.EMBED_B32_TF32: "tf32",
    Entry.LINEAR0_B32_SELECT: "sel",
    Entry.EMBED_B32_TF32_E64: "e64",
    Entry.EMBED_B32_TF32_K2: "k2",
    Entry.EMBED_B32_F16: "f16",
}

_KERNEL_STEMS = {Entry.LINEAR0_B32_SELECT: "linear0_b32_tf32"}

# entry -> (site, batch, lowest tier with its real kernel, product precision)
_ENTRY_FACTS = {
    Entry.CONV1_B1: (Site.CONV1, 1, PtxTier.SM75, Products.FP32),
    Entry.CONV1_B32: (Site.CONV1, 32, PtxTier.SM75, Products.FP32),
    Entry.CONV1_B32_TC: (Site.CONV1, 32, PtxTier.SM80, Products.FP16),
    Entry.CONV1_B32_X3: (Site.CONV1, 32, PtxTier.SM80, Products.FP32),
    Entry.CONV2_B1: (Site.CONV2, 1, PtxTier.SM75, Products.FP32),
    Entry.CONV2_B32: (Site.CONV2, 32, PtxTier.SM75, Products.FP32),
    Entry.CONV2_B32_TC: (Site.CONV2, 32, PtxTier.SM80, Products.FP16),
    Entry.CONV2_B32_X3: (Site.CONV2, 32, PtxTier.SM80, Products.FP32),
    Entry.LINEAR0_B1: (Site.LINEAR0, 1, PtxTier.SM75, Products.FP32),
    Entry.LINEAR0_B1_TF32: (Site.LINEAR0, 1, PtxTier.SM80, Products.TF32),
    Entry.LINEAR0_B32: (Site.LINEAR0, 32, PtxTier.SM75, Products.FP32),
    Entry.LINEAR0_B32_SELECT: (Site.LINEAR0, 32, PtxTier.SM80, Products.FP16),
    Entry.LINEAR1_B1: (Site.LINEAR1, 1, PtxTier.SM75, Products.FP32),
    Entry.LINEAR1_B1_TF32: (Site.LINEAR1, 1, PtxTier.SM75, Products.TF32),
    Entry.LINEAR1_B32: (Site.LINEAR1, 32, PtxTier.SM75, Products.FP32),
    Entry.LINEAR1_B32_TF32: (Site.LINEAR1, 32, PtxTier.SM80, Products.FP16),
    Entry.CLASSIFIER_B1: (Site.LINEAR2, 1, PtxTier.SM75, Products.FP32),
    Entry.CLASSIFIER_B32: (Site.LINEAR2, 32, PtxTier.SM75, Products.FP32),
    Entry.EMBED_B1: (Site.EMBEDDING, 1, PtxTier.SM75, Products.FP32),
    Entry.EMBED_B32: (Site.EMBEDDING, 32, PtxTier.SM75, Products.FP32),
    Entry.EMBED_B32_TF32: (Site.EMBEDDING, 32, PtxTier.SM80, Products.TF32),
    Entry.EMBED_B32_TF32_K2: (Site.EMBEDDING, 32, PtxTier.SM80, Products.TF32),
    Entry.EMBED_B32_TF32_E64: (Site.EMBEDDING, 32, PtxTier.SM80, Products.TF32),
    Entry.EMBED_B32_X3: (Site.EMBEDDING, 32, PtxTier.SM80, Products.FP32),
    Entry.EMBED_B32_F16: (Site.EMBEDDING, 32, PtxTier.SM80, Products.FP16),
}

_SCALAR_ENTRIES = {
    (Site.CONV1, 1): Entry.CONV1_B1,
    (Site.CONV1, 32): Entry.CONV1_B32,
    (Site.CONV2, 1): Entry.CONV2_B1,
    (Site.CONV2, 32): Entry.CONV2_B32,
    (Site.LINEAR0, 1): Entry.LINEAR0_B1,
    (Site.LINEAR0, 32): Entry.LINEAR0_B32,
    (Site.LINEAR1, 1): Entry.LINEAR1_B1,
    (Site.LINEAR1, 32): Entry.LINEAR1_B32,
    (Site.LINEAR2, 1): Entry.CLASSIFIER_B1,
    (Site.LINEAR2, 32): Entry.CLASSIFIER_B32,
    (Site.EMBEDDING, 1): Entry.EMBED_B1,
}

# (site, TF32 math) -> the batch-32 tensor-core convolution
_TENSOR_CONV = {
    (Site.CONV1, True): Entry.CONV1_B32_TC,
    (Site.CONV1, False): Entry.CONV1_B32_X3,
    (Site.CONV2, True): Entry.CONV2_B32_TC,
    (Site.CONV2, False): Entry.CONV2_B32_X3,
}

# the (tiles, resident blocks per SM) each split-K entry is sized with in the rule
_SPLIT_RESIDENCY = {
    Entry.EMBED_B32: (2, 2),
    Entry.EMBED_B32_TF32: (2, 2),
    Entry.EMBED_B32_TF32_K2: (2, 1),
    Entry.EMBED_B32_TF32_E64: (4, 2),
    Entry.EMBED_B32_X3: (4, 2),
    Entry.EMBED_B32_F16: (2, 1),
}


@attrs.frozen
class Choice:
    """A kernel entry and, for split-K entries, its reduction slice count (1 to
    EMBED_MAX_SPLITS; 0 for other entries)."""

    entry: Entry
    splits: int = 0

    @classmethod
    def fixed(cls, entry: Entry) -> Choice:
        return cls(entry, 0)

    @classmethod
    def split(cls, entry: Entry, splits: int) -> Choice:
        return cls(entry, splits)

    def config(self) -> Config:
        return self.entry.config(self.splits)


_CONFIGS = {
    Entry.CONV1_B1: lambda kernel, _: Config.conv(kernel, 64, 256),
    Entry.CONV1_B32: lambda kernel, _: Config.conv(kernel, 128, 128),
    Entry.CONV1_B32_TC: lambda kernel, _: Config.tensor_conv(kernel, 128, 80, 1, 128),
    Entry.CONV1_B32_X3: lambda kernel, _: Config.tensor_conv(kernel, 128, 80, 2, 256),
    Entry.CONV2_B1: lambda kernel, _: Config.conv(kernel, 32, 256),
    Entry.CONV2_B32: lambda kernel, _: Config.conv(kernel, 128, 128),
    Entry.CONV2_B32_TC: lambda kernel, _: Config.tensor_conv(kernel, 128, 64, 1, 128),
    Entry.CONV2_B32_X3: lambda kernel, _: Config.tensor_conv(kernel, 128, 64, 2, 256),
    Entry.LINEAR0_B1: lambda kernel, _: Config.gemm(kernel, 16, 32, 128),
    Entry.LINEAR0_B1_TF32: lambda kernel, _: Config.gemm(
        kernel, 32, 32, 128, Fragments(1, paired=True)
    ),
    Entry.LINEAR0_B32: lambda kernel, _: Config.gemm(kernel, 64, 128, 128),
    Entry.LINEAR0_B32_SELECT: lambda kernel, _: Config.select_gemm(kernel, 64, 128, 128),
    Entry.LINEAR1_B1: lambda kernel, _: Config.gemm(kernel, 16, 32, 128),
    Entry.LINEAR1_B1_TF32: lambda kernel, _: Config.gemm(kernel, 16, 32, 128),
    Entry.LINEAR1_B32: lambda kernel, _: Config.gemm(kernel, 64, 128, 128),
    Entry.LINEAR1_B32_TF32: lambda kernel, _: Config.gemm(
        kernel, 64, 128, 128, Fragments(1, half=True)
    ),
    Entry.CLASSIFIER_B1: lambda kernel, _: Config.classifier(kernel, 8, 64),
    Entry.CLASSIFIER_B32: lambda kernel, _: Config.classifier(kernel, 128, 256),
    Entry.EMBED_B1: lambda kernel, _: Config(kernel, Gemv(2), 256, 0),
    Entry.EMBED_B32: lambda kernel, s: Config.split(kernel, 128, s, 192),
    Entry.EMBED_B32_TF32: lambda kernel, s: Config.split(kernel, 128, s, 192, Fragments(1)),
    Entry.EMBED_B32_TF32_K2: lambda kernel, s: Config.split(kernel, 128, s, 384, Fragments(1)),
    Entry.EMBED_B32_TF32_E64: lambda kernel, s: Config.split(
        kernel, 64, s, 192, Fragments(1, paired=True)
    ),
    Entry.EMBED_B32_X3: lambda kernel, s: Config.split(kernel, 64, s, 192, Fragments(2)),
    Entry.EMBED_B32_F16: Config.half_split,
}


# --- pins ----------------------------------------------------------------------------


def _unimplemented_batch(site: Site, batch: int) -> GeometryUnimplemented:
    return GeometryUnimplemented(
        CONTEXT, f"{site.value} batch {batch}; the kernels compile batches 1 and 32"
    )


class PinFields(TypedDict):
    """`SegdensePin.fields`: what a pin runs, as reports record it."""

    entry: str
    kernel: str
    splits: int | None
    block: int
    shared: int


@attrs.frozen
class SegdensePin:
    """The complete execution choice of one segdense plan: the entry the device rule
    picked, its split count, and the math mode and loaded tier it was picked for.

    The entry fixes the site and batch. The tier is the one the rule saw: sm80-tier
    kernels are trapping stubs in the sm75 module, so a plan refuses a module below it."""

    choice: Choice
    math: CudaMath
    tier: PtxTier

    @classmethod
    def measured_rtx4060ti_embedding(cls) -> SegdensePin:
        """The FP16 embedding pin validated on the 34-SM RTX 4060 Ti."""
        return cls(Choice.split(Entry.EMBED_B32_F16, 17), CudaMath.TF32, PtxTier.SM80)

    @classmethod
    def measured_rtx5060ti_embedding(cls) -> SegdensePin:
        """The FP16 embedding pin validated on the 36-SM RTX 5060 Ti."""
        return cls(Choice.split(Entry.EMBED_B32_F16, 18), CudaMath.TF32, PtxTier.SM80)

    @classmethod
    def select(
        cls,
        site: Site,
        batch: int,
        math: CudaMath,
        tier: PtxTier,
        device: DeviceAttributes,
        fp16: Fp16Policy = Fp16Policy.ALLOW,
    ) -> SegdensePin:
        """The configuration the device rule picks for this boundary on the module `tier`
        and `device`; with `Fp16Policy.FORBID`, one with no FP16 products."""
        choice = site.rule_choice(batch, math, tier, Hardware.of(device), fp16)
        if choice is None:
            raise _unimplemented_batch(site, batch)
        return cls(choice, math, tier)

    @classmethod
    def select_tuning_tf32(
        cls, site: Site, batch: int, math: CudaMath, tier: PtxTier, device: DeviceAttributes
    ) -> SegdensePin | None:
        """The TF32 kernel that FP16 products replace on this device, if they do."""
        if tier < PtxTier.SM80:
            return None
        choice = site.tuning_tf32_choice(batch, math, Hardware.of(device))
        return None if choice is None else cls(choice, math, tier)

    @classmethod
    def select_fp32(
        cls, site: Site, batch: int, math: CudaMath, tier: PtxTier, device: DeviceAttributes
    ) -> SegdensePin:
        """The scalar FP32 kernel, with the requested math mode kept in the pin."""
        choice = site.scalar_choice(batch, CudaMath.FP32, Hardware.of(device))
        if choice is None:
            raise _unimplemented_batch(site, batch)
        return cls(choice, math, tier)

    @classmethod
    def forced(
        cls, entry: Entry, math: CudaMath, tier: PtxTier, device: DeviceAttributes
    ) -> SegdensePin:
        """A pin for any entry, split-K entries taking the slice count the device rule
        gives that entry on `device`; for running entries the rule does not pick here.

        Refuses an entry the `tier` module only stubs, and reduced-precision products
        for FP32 math, which the rule never pairs either."""
        if entry.tier() > tier:
            raise DeviceUnsupported(
                f"{entry.config(1).kernel} needs the {entry.tier()} segdense module, "
                f"the pin is for {tier}"
            )
        if math is CudaMath.FP32 and entry.products() is not Products.FP32:
            raise GeometryInvalid(
                CONTEXT, f"{entry.name} multiplies in {entry.products().value}, not FP32"
            )
        residency = entry.split_resident()
        splits = 0 if residency is None else Hardware.of(device).splits(*residency)
        return cls(Choice(entry, splits), math, tier)

    def entry(self) -> Entry:
        return self.choice.entry

    def config(self) -> Config:
        return self.choice.config()

    def splits(self) -> int | None:
        """The split-K slice count, for split-K entries."""
        return self.choice.splits if self.choice.entry.is_split() else None

    def fields(self) -> PinFields:
        """What the pin runs, as reports record it: entry name, kernel, split-K slices
        (None without split-K), block threads and dynamic shared bytes."""
        config = self.config()
        return {
            "entry": self.entry().name,
            "kernel": config.kernel,
            "splits": self.splits(),
            "block": config.block,
            "shared": config.shared,
        }

    def check(self, site: Site, batch: int, math: CudaMath, tier: PtxTier) -> None:
        """Refuse a pin for another boundary or a module that lacks its kernels."""
        entry = self.choice.entry
        if (entry.site(), entry.batch(), self.math) != (site, batch, math):
            raise GeometryInvalid(
                CONTEXT,
                f"pin {entry.name} {self.math.name} cannot plan {site.value} batch {batch} "
                f"{math.name}",
            )
        if self.tier > tier:
            raise DeviceUnsupported(
                f"{self.config().kernel} needs the {self.tier} segdense module, "
                f"the loaded one is {tier}"
            )
