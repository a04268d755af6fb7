"""The trunk area's fixed facts: the ResNet34 trunk's convolutions at batch 32 chunks of
80 mel bins x 998 frames, one site per distinct shape, and the launch of each.

The launch constants mirror `ptx/src/trunk/trunkconv.cuh` and `ptx/src/trunk/trunk.cu`
(`tools/kernels.py check` holds them equal)."""

from __future__ import annotations

import enum
from functools import cached_property

import attrs

from pyspk.cuda.math import CudaMath
from pyspk.cuda.tier import PtxTier

TRUNK_BATCH = 32
TRUNK_BINS = 80  # fbank mel bins: the trunk's image height
TRUNK_FRAMES = 998  # fbank frames of a 10 s chunk at 16 kHz: the image width
TRUNK_BLOCKS = (3, 4, 6, 3)  # BasicBlocks per layer (ResNet34)
TRUNK_CHANNELS = (32, 64, 128, 256)
CONV_BM = 256  # output positions per block
CONV_BK = 16  # reduction elements per step (a stage holds one, or a strip's three)
# rows of a strip's box by the async copy engine on the sm90 tier (a tensor map's box of
# CONV_BK channels): three boxes make a strip of CONV_BM + 2 rows
CONV_TMA_BOX = 86
CONV_STAGES = 3
# (sm90 tier) the copy ring of the strips by (block channels, three products) and of
# the stride-2 3x3s by block channels, as ptx/src/trunk/trunkconv.cuh's ring_stages
CONV_SM90_STRIP_STAGES_NARROW = 3
CONV_SM90_STRIP_STAGES_WIDE = 4
CONV_SM90_STRIP_STAGES_WIDE_SPLIT = 2
CONV_SM90_DOWN_STAGES_NARROW = 5
CONV_SM90_DOWN_STAGES_WIDE = 6
# (sm90 tier) threads of the strips 128 wide in FP32 math: two warpgroups of m64n128 tiles
CONV_SM90_WIDE_SPLIT_THREADS = 256
SM90_STRIP_STAGES = {
    (128, False): CONV_SM90_STRIP_STAGES_WIDE,
    (128, True): CONV_SM90_STRIP_STAGES_WIDE_SPLIT,
    (64, False): CONV_SM90_STRIP_STAGES_NARROW,
    (64, True): CONV_SM90_STRIP_STAGES_NARROW,
}
SM90_DOWN_STAGES = {128: CONV_SM90_DOWN_STAGES_WIDE, 64: CONV_SM90_DOWN_STAGES_NARROW}
CONV_RELU = 1  # epilogue flags
CONV_NCHW = 2
# (layer1's tile form) write the block's middle activation in 16 bits, the FP16 planes
# its second convolution's `MIDDLE_KERNEL` lands as they are (`TrunkSite.kernel`'s middle)
CONV_HALF_OUT = 4
# (layer1's middle reader) its residual is a block output in those FP16 planes
CONV_HALF_RESIDUAL = 8
# (the middle's reader) stages landed ahead: one product, three
MIDDLE_AHEAD = 3
MIDDLE_AHEAD_SPLIT = 1
# layer1's 2D-tile form (the sm90 tier: `TrunkSite.in_tiles`): warpgroups a
# block, output rows a warpgroup, output frames a tile row, tiles a block, slab copies
# in flight
TILE_GROUPS = 1
TILE_ROWS = 4
TILE_FRAMES = 64
TILE_TILES = 8
TILE_AHEAD = 1
# the halves form of the strips of layers 2 to 4 (the sm90 tier:
# `TrunkSite.in_halves`): pad rows either side of an FP16 operand's 256
HALVES_PAD_ROWS = 2
STEM_THREADS = 256
STEM_TILE_BINS = 8  # a stem block's tile of positions
STEM_TILE_FRAMES = 32
MAXIMA_THREADS = 256  # the clear and chunk-max kernels' block
KERNEL_PREFIX = "spk_trunk_"
CLEAR_KERNEL = KERNEL_PREFIX + "clear"
CHUNK_MAX_KERNEL = KERNEL_PREFIX + "chunk_max"
CONTEXT = "trunk plan"
TILES_KERNEL = KERNEL_PREFIX + "layer1_tiles"  # + "_f16x3" or "_f16", as the site's
MIDDLE_KERNEL = KERNEL_PREFIX + "layer1_middle"  # likewise
HALVES_SITES = ("layer2_conv", "layer3_conv", "layer4_conv")  # the sites with a halves form


@attrs.frozen
class ConvShape:
    """One convolution: channels in and out, input height and width, stride, kernel size
    (3 with padding 1, or 1 without), and the launch the kernels check."""

    cin: int
    cout: int
    hin: int
    win: int
    stride: int
    ks: int

    @property
    def pad(self) -> int:
        return self.ks // 2

    @property
    def hout(self) -> int:
        return (self.hin + 2 * self.pad - self.ks) // self.stride + 1

    @property
    def wout(self) -> int:
        return (self.win + 2 * self.pad - self.ks) // self.stride + 1

    @property
    def positions(self) -> int:
        """Output positions per chunk."""
        return self.hout * self.wout

    @property
    def k(self) -> int:
        return self.ks * self.ks * self.cin

    @property
    def x_item(self) -> int:
        return self.hin * self.win * self.cin

    @property
    def y_item(self) -> int:
        return self.positions * self.cout

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        """The framework's `[cout, cin, ks, ks]`."""
        return (self.cout, self.cin, self.ks, self.ks)

    @property
    def block_channels(self) -> int:
        return min(self.cout, 128)

    @property
    def threads(self) -> int:
        return 4 * self.block_channels

    def threads_on(self, warpgroups: bool, split: bool) -> int:
        """`threads` for the kernel on warpgroups (the sm90 tier) or not, with three
        products (`split`) or one: the strips 128 wide on warpgroups with three products
        take `CONV_SM90_WIDE_SPLIT_THREADS`."""
        if warpgroups and split and self.strip and self.block_channels == 128:
            return CONV_SM90_WIDE_SPLIT_THREADS
        return self.threads

    @property
    def strip(self) -> bool:
        """A stride-1 3x3: a pipeline stage is one kernel row of 16 input channels, its
        three taps read from one run of CONV_BM + 2 input pixels."""
        return self.stride == 1 and self.ks == 3

    @property
    def shared(self) -> int:
        """Bytes of the copy ring: per stage, the FP32 activation rows (CONV_BK words; a
        strip's 258, a row of zeros and a pad row) and, per step of CONV_BK, the weights'
        FP16 pair words (CONV_BK per column)."""
        return self.shared_on(warpgroups=False, split=True)

    def shared_on(self, warpgroups: bool, split: bool) -> int:
        """`shared` for the kernel on warpgroups (the sm90 tier) or not, with three
        products (`split`) or one."""
        rows, steps = (CONV_BM + 4, 3) if self.strip else (CONV_BM, 1)
        stage = (rows + steps * self.block_channels) * CONV_BK
        return self.stages_on(warpgroups, split) * stage * 4

    @property
    def stages(self) -> int:
        """Depth of the copy ring: two where a stage is three steps (a strip), three
        otherwise; every block stays within sm_86's 99 KB."""
        return 2 if self.strip else CONV_STAGES

    def stages_on(self, warpgroups: bool, split: bool) -> int:
        """`stages`, but on warpgroups (the sm90 tier) the strips 64 or more wide ring
        as `SM90_STRIP_STAGES` says, the stride-2 3x3s as `SM90_DOWN_STAGES`."""
        if warpgroups and self.strip:
            return SM90_STRIP_STAGES.get((self.block_channels, split), self.stages)
        if warpgroups and self.ks == 3:
            return SM90_DOWN_STAGES[self.block_channels]
        return self.stages

    @property
    def tiles_per_block(self) -> int:
        """Output tiles of CONV_BM positions a block takes in turn, its copy ring running
        on from one to the next: four in the 32-wide layer, whose sums are short."""
        return 4 if self.strip and self.block_channels == 32 else 1

    @property
    def grid(self) -> tuple[int, int, int]:
        tiles = -(-TRUNK_BATCH * self.positions // CONV_BM)
        return (-(-tiles // self.tiles_per_block), self.cout // self.block_channels, 1)

    def tile_launch(
        self,
        split: bool,
        groups: int = TILE_GROUPS,
        rows: int = TILE_ROWS,
        tiles: int = TILE_TILES,
        ahead: int = TILE_AHEAD,
        middle: bool = False,
    ) -> tuple[tuple[int, int, int], int, int]:
        """(grid, block threads, dynamic shared bytes) of the 2D-tile form (its build's
        constants by default): a tile `groups` x `rows` output rows by TILE_FRAMES frames,
        each row in ceil(wout / TILE_FRAMES) runs, `tiles` a block; per block the weights
        (K x cout FP16, high and low with `split`), `ahead` + 1 FP32 slabs of the tile's
        rows and frames with their border, 16 channels, and FP16 slabs: two, or with
        `split` one of high and low parts. `middle`: the reader of a 16-bit middle
        activation, no FP32 slab, and MIDDLE_AHEAD + 2 FP16 slabs (`split`:
        MIDDLE_AHEAD_SPLIT + 1 of high and low)."""
        count = TRUNK_BATCH * self.hout // (groups * rows) * -(-self.wout // TILE_FRAMES)
        pixels = (groups * rows + 2) * (TILE_FRAMES + 2)
        weights = self.k * self.cout * (4 if split else 2)
        if middle:
            sets = MIDDLE_AHEAD_SPLIT + 1 if split else MIDDLE_AHEAD + 2
            slabs = sets * (2 if split else 1) * pixels * CONV_BK * 2
        else:
            slabs = (ahead + 1) * pixels * CONV_BK * 4 + 2 * pixels * CONV_BK * 2
        return (-(-count // tiles), 1, 1), 128 * groups, weights + slabs

    def halves_launch(self, split: bool) -> tuple[tuple[int, int, int], int, int]:
        """(grid, block threads, dynamic shared bytes) of the halves form
        (`ptx/src/trunk/trunkhalves.cuh`): the strip form's grid and blocks; two slots
        each of a stage's FP32 strip (CONV_BM + 2 rows of CONV_BK floats) and of its three
        steps' weights (room for FP16 high and low: CONV_BK words a column; one product
        fills the high half), and one or two sets (two where a block of 128 columns has
        the SM to itself) of its three taps' FP16 operands (`split`: high and low, else
        high; two k planes of CONV_BM + 2 HALVES_PAD_ROWS rows of 16 bytes each)."""
        strip = (CONV_BM + 2) * CONV_BK * 4
        weights = 3 * self.block_channels * CONV_BK * 4
        operands = 3 * (2 if split else 1) * 2 * (CONV_BM + 2 * HALVES_PAD_ROWS) * 16
        sets = 2 if self.block_channels == 128 else 1
        return self.grid, self.threads, 2 * (strip + weights) + sets * operands

    def macs(self) -> int:
        """Multiply-adds per chunk."""
        return self.positions * self.cout * self.k


class TrunkSite(enum.Enum):
    """One distinct convolution of the trunk. `DOWN` is a layer's first, stride-2 3x3;
    `SHORTCUT` its 1x1 stride-2 projection; `CONV` every other 3x3 of the layer."""

    STEM = "stem"
    LAYER1_CONV = "layer1_conv"
    LAYER2_DOWN = "layer2_down"
    LAYER2_SHORTCUT = "layer2_shortcut"
    LAYER2_CONV = "layer2_conv"
    LAYER3_DOWN = "layer3_down"
    LAYER3_SHORTCUT = "layer3_shortcut"
    LAYER3_CONV = "layer3_conv"
    LAYER4_DOWN = "layer4_down"
    LAYER4_SHORTCUT = "layer4_shortcut"
    LAYER4_CONV = "layer4_conv"

    def __str__(self) -> str:
        return self.value

    @cached_property
    def shape(self) -> ConvShape:
        return _SHAPES[self]

    def kernel(
        self,
        math: CudaMath,
        tier: PtxTier | None = None,
        halves: bool = False,
        middle: bool = False,
    ) -> str:
        """The exported kernel that runs the site in `math` on `tier` (None: the form
        every tensor-core tier has): the stem's one SIMT FP32 entry serves both maths;
        the others are `_f16x3` (three scaled FP16 products, FP32 math) or `_f16` (one,
        TF32 math), but the 1x1 shortcuts run `_f16x3` in both: a small share of the
        work, and the library keeps at least one of them in FP32 under TF32 math.
        Layer1's convolutions on the sm90 tier: `TILES_KERNEL`'s, or with `middle` (a
        block's second, on its middle activation in 16 bits) `MIDDLE_KERNEL`'s; with
        `halves`, the strips of layers 2 to 4 there: their halves form's (`in_halves`)."""
        if self is TrunkSite.STEM:
            return KERNEL_PREFIX + self.value
        name = TILES_KERNEL if self.in_tiles(math, tier) else KERNEL_PREFIX + self.value
        if middle and self.in_tiles(math, tier):
            name = MIDDLE_KERNEL
        if self.in_halves(math, tier, halves):
            name = KERNEL_PREFIX + self.value.replace("_conv", "_halves")
        return f"{name}_{'f16x3' if self.splits(math) else 'f16'}"

    def in_tiles(self, math: CudaMath | None, tier: PtxTier | None) -> bool:
        """Whether the site runs its 2D-tile form (`ptx/src/trunk/trunktiles.cuh`, both
        wgmma operands in shared memory): layer1's convolutions on the sm90 tier, where
        the strip form converts each activation once per tap and warp."""
        return self is TrunkSite.LAYER1_CONV and math is not None and tier is PtxTier.SM90

    def in_halves(self, math: CudaMath | None, tier: PtxTier | None, halves: bool) -> bool:
        """Whether the site runs its halves form (`ptx/src/trunk/trunkhalves.cuh`: the
        block converts each stage's strip to FP16 once, both wgmma operands in shared
        memory), where `halves` asks for it: the strips of layers 2 to 4 in either math
        on the sm90 tier. The outputs are the strip form's bits."""
        return halves and self.value in HALVES_SITES and math is not None and tier is PtxTier.SM90

    def splits(self, math: CudaMath) -> bool:
        """Whether the site's kernel takes three products of split operands (and reads
        the weights' low parts): in FP32 math, and for the shortcuts in both."""
        return math is CudaMath.FP32 or self.is_shortcut()

    def is_shortcut(self) -> bool:
        return self.value.endswith("_shortcut")

    def on_warpgroups(self, tier: PtxTier) -> bool:
        """Whether the site's kernel in `tier` runs on warpgroup MMA (wgmma): the 3x3s
        of the sm90 tier (the strips and each layer's stride-2 first convolution), which
        read the weights in `FoldedConv.packed`'s warpgroup layout."""
        return tier is PtxTier.SM90 and self is not TrunkSite.STEM and self.shape.ks == 3

    def copies_by_tma(self, math: CudaMath, tier: PtxTier) -> bool:
        """Whether the site's kernel stages its input by the async copy engine when given
        a tensor map of it (`x_map`): the stride-1 3x3s on warpgroups, their strips by a
        map of [positions][cin] rows, and layer1's tile form (`in_tiles`) its slabs by a
        map of the [items][hin][win][cin] image."""
        return self.shape.strip and self.on_warpgroups(tier)

    def launch(
        self,
        math: CudaMath | None = None,
        tier: PtxTier | None = None,
        halves: bool = False,
        middle: bool = False,
    ) -> tuple[tuple[int, int, int], int, int]:
        """(grid, block threads, dynamic shared bytes) of `kernel(math, tier, halves,
        middle)`."""
        if math is not None and self.in_tiles(math, tier):
            return self.shape.tile_launch(self.splits(math), middle=middle)
        if math is not None and self.in_halves(math, tier, halves):
            return self.shape.halves_launch(self.splits(math))
        if self is TrunkSite.STEM:
            tiles = TRUNK_BINS // STEM_TILE_BINS * -(-TRUNK_FRAMES // STEM_TILE_FRAMES)
            return (tiles, TRUNK_BATCH, 1), STEM_THREADS, 0
        warpgroups = tier is not None and self.on_warpgroups(tier)
        split = math is None or self.splits(math)
        threads = self.shape.threads_on(warpgroups, split)
        return self.shape.grid, threads, self.shape.shared_on(warpgroups, split)

    @classmethod
    def of_block(cls, layer: int, block: int) -> tuple[TrunkSite, TrunkSite, TrunkSite | None]:
        """The sites of BasicBlock `block` of layer `layer` (1-based): its first and
        second convolutions and its shortcut (None: the identity)."""
        conv = cls(f"layer{layer}_conv")
        if layer == 1 or block > 0:
            return conv, conv, None
        return cls(f"layer{layer}_down"), conv, cls(f"layer{layer}_shortcut")


def _layer_shapes() -> dict[TrunkSite, ConvShape]:
    shapes = {TrunkSite.STEM: ConvShape(1, 32, TRUNK_BINS, TRUNK_FRAMES, 1, 3)}
    height, width, cin = TRUNK_BINS, TRUNK_FRAMES, TRUNK_CHANNELS[0]
    for layer, cout in enumerate(TRUNK_CHANNELS, start=1):
        if layer > 1:
            shapes[TrunkSite(f"layer{layer}_down")] = ConvShape(cin, cout, height, width, 2, 3)
            shortcut = ConvShape(cin, cout, height, width, 2, 1)
            shapes[TrunkSite(f"layer{layer}_shortcut")] = shortcut
            height, width = shortcut.hout, shortcut.wout
        shapes[TrunkSite(f"layer{layer}_conv")] = ConvShape(cout, cout, height, width, 1, 3)
        cin = cout
    return shapes


_SHAPES = _layer_shapes()
OUTPUT_SHAPE = (
    TRUNK_CHANNELS[-1],
    TrunkSite.LAYER4_CONV.shape.hout,
    TrunkSite.LAYER4_CONV.shape.wout,
)  # per chunk, NCHW: (256, 10, 125)


def trunk_macs() -> int:
    """Multiply-adds of the whole trunk per chunk."""
    total = TrunkSite.STEM.shape.macs()
    for layer, blocks in enumerate(TRUNK_BLOCKS, start=1):
        for block in range(blocks):
            for site in TrunkSite.of_block(layer, block):
                total += site.shape.macs() if site is not None else 0
    return total
