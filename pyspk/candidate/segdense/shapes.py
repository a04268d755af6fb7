"""The fixed facts of the segdense area: its batches, kernel names and limits, the kinds
of launch its kernels tile a boundary with (fixing their grids and weight layouts),
their `Config`s, the split-K reductions, and the area's coverage and numerics contract.
The device rule (`selection`) picks among them."""

from __future__ import annotations

import enum

import attrs

from pyspk.candidate.framework import (
    BOUNDARIES,
    CONV_TAPS,
    DENSE_BOUNDARIES,
    SEGMENTATION_CONV_BOUNDARIES,
    AbsoluteSum,
    ArchitectureSpeed,
    Batches,
    BroadEvidence,
    Coverage,
    CoverageEntry,
    DenseSite,
    InfinityContract,
    Maths,
    NanContract,
    SignedZeroContract,
    SpecialValues,
)
from pyspk.cuda.tier import ComputeCapability, PtxTier

CONTEXT = "segdense plan"

# the batches every kernel is compiled for
BATCHES = (1, 32)
# output channels of a convolution padded to whole thread tiles
CONV_PADDED = 64
# taps of the five-tap convolutions (the framework's CONV_TAPS)
TAPS = CONV_TAPS
# most planes `spk_segdense_reduce_embed` adds: eight warps of up to 16 planes each,
# so the reduction takes one round trip to memory
EMBED_MAX_SPLITS = 128
# most planes `spk_segdense_reduce_embed_flat` adds, all held by one thread
FLAT_MAX_SPLITS = 40
# reduction rows a `Select` kernel recomputes in 3xTF32
SELECT_ROWS = 16
# reduction terms per stage of `spk_segdense_embed_b32_f16`: two warp groups of 16
HALF_STAGE = 32
# most reduction terms one `spk_segdense_embed_b32_f16` slice keeps in shared memory
HALF_SLICE = 320
# fewest slices that keep every FP16 slice within HALF_SLICE terms
HALF_MIN_SPLITS = -(
    -(DenseSite.EMBEDDING.dimensions()[2] // HALF_STAGE) // (HALF_SLICE // HALF_STAGE)
)
# dynamic shared memory of `spk_segdense_embed_b32_f16`: 96 row scales, the FP16 slice
# of 96 rows and a three-stage weight ring, which the cross-group reduction of 192
# threads' 64 accumulators reuses
_HALF_RING = 96 * (HALF_SLICE // 2 + 4) + 3 * (HALF_STAGE // 2) * (128 + 8)
_HALF_REDUCTION = 192 * 32 * 64 // 32
HALF_SHARED = 4 * (96 + max(_HALF_RING, _HALF_REDUCTION))


# every kernel of the module is named KERNEL_PREFIX + its stem
KERNEL_PREFIX = "spk_segdense_"


# --- kinds: how a kernel tiles its boundary, fixing its grid and operand layouts -------


@attrs.frozen
class Conv:
    """One block per `positions` output positions of one item; weights packed [k, 64] in
    the kernels' column order (`pack_conv_rows`)."""

    positions: int


@attrs.frozen
class TensorConv:
    """One block per `positions` output positions of one item on tensor cores; weights
    packed as mma fragments over `cin_pad` input channels: with `planes == 2` the value
    and residual TF32 planes of the 3xTF32 split (`pack_conv_mma`'s layout), with `planes == 1`
    scaled FP16 pairs (`pack_conv_half`), which the Config's shared bytes for one TF32
    plane also hold."""

    positions: int
    cin_pad: int
    planes: int


@attrs.frozen
class Fragments:
    """Weights a tensor-core GEMM reads as `pack_gemm_mma` lays them out: TF32 mma
    fragments in `planes` planes (2: value and residual), per column tile of the kind's
    `cols`; `paired` when the kernel reads the k of x in pairs, so w's k is permuted to
    match. With `half`, one plane of FP16 pair fragments scaled per column instead, then
    the inverse scales (`pack_gemm_half`), for scaled FP16 products."""

    planes: int
    paired: bool = False
    half: bool = False


@attrs.frozen
class Gemm:
    """One block per `rows x cols` output tile; weights [k, n], or `fragments` of them,
    followed by the indices of the `select` reduction rows the kernel recomputes in
    3xTF32 and those rows of w in FP32."""

    rows: int
    cols: int
    select: int
    fragments: Fragments | None = None


@attrs.frozen
class Classifier:
    """One block per `rows` output rows; weights [k, n]."""

    rows: int


@attrs.frozen
class Gemv:
    """One block per `cols` output columns; weights [n, k]."""

    cols: int


class SplitWeights(enum.Enum):
    """How a split-K kernel reads its weights."""

    # FP32 [k, n], or the kind's `fragments` of them
    FP32 = "fp32"
    # FP16 pairs of adjacent reduction rows as [k / 2, n] words, scaled by a power of two
    # per column, then the n inverse scales (`pack_half_columns`)
    SCALED_HALF = "scaled_half"


@attrs.frozen
class Split:
    """One block per `rows x cols` tile and reduction slice, then the fixed-order
    reduction of the `splits` partial planes."""

    rows: int
    cols: int
    splits: int
    weights: SplitWeights
    fragments: Fragments | None = None


Kind = Conv | TensorConv | Gemm | Classifier | Gemv | Split


def packs_on_host(kind: Kind) -> bool:
    """Whether the weight pack of `kind` scales the weight (FP16 products) or lists rows
    of it (Select), which the host computes from its values; every other pack is a
    layout of the weight (with TF32 roundings) that the gather kernel makes on the
    device."""
    match kind:
        case TensorConv(planes=1) | Split(weights=SplitWeights.SCALED_HALF):
            return True
        case Gemm(fragments=Fragments() as fragments):
            return fragments.half or kind.select > 0
    return False


@attrs.frozen
class Config:
    """One site kernel and its launch shape; `shared` is dynamic shared bytes per block."""

    kernel: str
    kind: Kind
    block: int
    shared: int

    @classmethod
    def conv(cls, kernel: str, positions: int, block: int) -> Config:
        return cls(kernel, Conv(positions), block, 0)

    @classmethod
    def tensor_conv(
        cls, kernel: str, positions: int, cin_pad: int, planes: int, block: int
    ) -> Config:
        """Shared memory for stages of 8 input channels, three deep, reused by the
        epilogue's 64-channel tile."""
        stages = 3
        stage = 8 * (positions + 16) + 2560 * planes
        epilogue = 64 * (positions + 8)
        floats = max(stages * stage, epilogue)
        return cls(kernel, TensorConv(positions, cin_pad, planes), block, 4 * floats)

    @classmethod
    def gemm(
        cls, kernel: str, rows: int, cols: int, block: int, fragments: Fragments | None = None
    ) -> Config:
        return cls(kernel, Gemm(rows, cols, 0, fragments), block, 0)

    @classmethod
    def select_gemm(cls, kernel: str, rows: int, cols: int, block: int) -> Config:
        """A GEMM on scaled FP16 products recomputing SELECT_ROWS reduction rows in
        3xTF32."""
        return cls(kernel, Gemm(rows, cols, SELECT_ROWS, Fragments(1, half=True)), block, 0)

    @classmethod
    def classifier(cls, kernel: str, rows: int, block: int) -> Config:
        return cls(kernel, Classifier(rows), block, 0)

    @classmethod
    def split(
        cls,
        kernel: str,
        cols: int,
        splits: int,
        block: int,
        fragments: Fragments | None = None,
    ) -> Config:
        """An embedding split-K kernel with 96-row tiles of `cols` columns."""
        return cls(kernel, Split(96, cols, splits, SplitWeights.FP32, fragments), block, 0)

    @classmethod
    def half_split(cls, kernel: str, splits: int) -> Config:
        return cls(
            kernel,
            Split(96, 128, splits, SplitWeights.SCALED_HALF),
            384,
            HALF_SHARED,
        )


# --- reductions --------------------------------------------------------------------

# embedding outputs at batch 32: 96 rows of 256 columns
_EMBED_ROWS, _EMBED_COLUMNS, _ = DenseSite.EMBEDDING.dimensions()
_REDUCTION_OUTPUTS = BATCHES[-1] * _EMBED_ROWS * _EMBED_COLUMNS
# split counts the rule picks on the development GPUs, with fixed-count reductions
_FIXED_REDUCTIONS = (18, 34, 36)


@attrs.frozen
class ReductionShape:
    """The split-K reduction kernel for a number of partial planes, and its launch."""

    kernel: str
    splits: int
    grid: int
    block: int


class Reduction:
    """The fixed-order reduction of split-K partial planes, bias added after the sum."""

    @staticmethod
    def shape(splits: int) -> ReductionShape:
        """Up to FLAT_MAX_SPLITS planes one thread loads all planes of four outputs before
        adding them, with no barrier; more would not fit its registers, so eight warps
        share them and meet in shared memory. Split counts picked on the development
        GPUs have fixed-count forms with no per-plane test."""
        if splits in _FIXED_REDUCTIONS:
            kernel = f"{KERNEL_PREFIX}reduce_e{splits}"
            return ReductionShape(kernel, splits, _REDUCTION_OUTPUTS // 4 // 128, 128)
        if splits <= FLAT_MAX_SPLITS:
            # 64-thread blocks spread the loads over more SMs than 48 blocks of 128 would
            return ReductionShape(
                f"{KERNEL_PREFIX}reduce_embed_flat", splits, _REDUCTION_OUTPUTS // 4 // 64, 64
            )
        kernel = f"{KERNEL_PREFIX}reduce_embed"
        return ReductionShape(kernel, splits, _REDUCTION_OUTPUTS // 128, 256)


# --- coverage and contracts ----------------------------------------------------------

DENSE_COVERAGE = Coverage((CoverageEntry(DENSE_BOUNDARIES, Batches.of(*BATCHES), Maths.ALL),))
SEGCONV_COVERAGE = Coverage(
    (CoverageEntry(SEGMENTATION_CONV_BOUNDARIES, Batches.of(*BATCHES), Maths.ALL),)
)
DRIVER_COVERAGE = Coverage((CoverageEntry(BOUNDARIES, Batches.of(*BATCHES), Maths.ALL),))

# finite operands give finite outputs within the FP32 range; NaN, infinity and the sign
# of zero are not established, since the FP16 and TF32 splits and the fused log-softmax
# do not follow IEEE order for them
SPECIAL_VALUES = SpecialValues(
    finite=AbsoluteSum(headroom=2),
    nan=NanContract.UNSPECIFIED,
    infinity=InfinityContract.UNSPECIFIED,
    signed_zero=SignedZeroContract.UNSPECIFIED,
)

# the measurements that let the sm80 module run by default beyond its tuning devices
BROAD_EVIDENCE = BroadEvidence.with_limits(
    (
        ArchitectureSpeed(ComputeCapability(8, 9), 1060),
        ArchitectureSpeed(ComputeCapability(12, 0), 1060),
    ),
    "segdense sm80: fused conv/pool producers and packed dense epilogues; reports on Ada "
    "and Blackwell, every measured case >=1.06x; A100 24/24",
    ComputeCapability(8, 0),
    PtxTier.SM80,
)
