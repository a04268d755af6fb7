"""BatchNorm folded into the trunk's convolutions, and the weights' device layout.

Inference BatchNorm is `y = (z - mean) * s + beta` with `s = gamma / sqrt(var + eps)`, so
a convolution followed by it is the convolution with weights `w * s` (per output
channel) and bias `beta - mean * s`. The fold runs in float64 from the running
statistics, read once at plan time.

Device layout: the stem reads FP32 `[tap][32]`. The tensor-core convolutions read each
weight column (output channel) scaled by a power of two that puts its largest magnitude
in [2^14, 2^15), split from float64 into an FP16 high part and the FP16 rounding of the
residual, as FP16 pair words (k = tap * cin + ci; a word holds k = 2 p in its low half
and 2 p + 1). Per stage of 16 k (pairs p = 0..7) and column, the words are ordered
high(t), high(t + 4), low(t), low(t + 4) for t = 0..3: one mma lane's fragments, read
as 16 bytes; a kernel of one product reads only the high words, packed without the
low ones. Their bias vector carries the columns' inverse scales after the bias."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from pyspk.candidate.errors import GeometryInvalid, WeightsOutOfContract
from pyspk.candidate.trunk.shapes import CONTEXT, TRUNK_BLOCKS, TrunkSite


@attrs.frozen
class BatchNorm:
    """One BatchNorm's inference parameters (each `[channels]`) and its epsilon."""

    gamma: np.ndarray
    beta: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    eps: float

    def scale_shift(self) -> tuple[np.ndarray, np.ndarray]:
        """float64 `s` and `beta - mean * s`."""
        scale = np.asarray(self.gamma, np.float64) / np.sqrt(
            np.asarray(self.var, np.float64) + float(self.eps)
        )
        return scale, np.asarray(self.beta, np.float64) - np.asarray(self.mean, np.float64) * scale


# The reduction order within a stage of 16 k (input channels) that the kernels' mma
# steps take: pair p = t of lane t's b fragment holds channels 4 t, 4 t + 1 and pair
# t + 4 channels 4 t + 2, 4 t + 3, so a lane's a fragment of one row is its four
# consecutive channels, one 16-byte shared memory read.
FRAGMENT_ORDER = np.array([0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15])


def _fragment_order(k: int) -> np.ndarray:
    """Row indices that put each stage of 16 of k rows in FRAGMENT_ORDER."""
    return (np.arange(k).reshape(-1, 16)[:, FRAGMENT_ORDER]).reshape(-1)


@attrs.frozen
class FoldedConv:
    """A convolution with its BatchNorm folded in: float64 weight `[cout, cin, ks, ks]`
    and bias `[cout]`, checked against the site's shape and finite."""

    site: TrunkSite
    weight: np.ndarray
    bias: np.ndarray
    # the arrays derived from the weight (`packed`'s forms, `column_shifts`,
    # `packed_bias`), each made once and kept read-only: a PlannedTrunk's two plans upload
    # the same ones, and packing was 0.23 of the 0.57 s that accelerating a pipeline took
    # (H100); the shifts were made three times a convolution (0.023 s of 0.38, H100)
    _derived: dict[tuple, np.ndarray] = attrs.field(init=False, factory=dict, eq=False, repr=False)

    @classmethod
    def fold(cls, site: TrunkSite, weight: npt.ArrayLike, norm: BatchNorm) -> FoldedConv:
        w = np.asarray(weight, np.float64)
        shape = site.shape.weight_shape
        if w.shape != shape:
            raise GeometryInvalid(CONTEXT, f"{site} takes a weight of shape {shape}, not {w.shape}")
        scale, shift = norm.scale_shift()
        if scale.shape != (shape[0],) or shift.shape != (shape[0],):
            raise GeometryInvalid(
                CONTEXT, f"{site}'s BatchNorm has {scale.size} channels, not {shape[0]}"
            )
        return cls.of(site, w * scale[:, None, None, None], shift)

    @classmethod
    def of(cls, site: TrunkSite, weight: npt.ArrayLike, bias: npt.ArrayLike) -> FoldedConv:
        """A convolution already folded: weight and bias as they are."""
        w, b = np.asarray(weight, np.float64), np.asarray(bias, np.float64)
        shape = site.shape.weight_shape
        if w.shape != shape or b.shape != (shape[0],):
            raise GeometryInvalid(
                CONTEXT,
                f"{site} takes weight {shape} and bias ({shape[0]},), not {w.shape} and {b.shape}",
            )
        # checked in FP32, the precision the kernels read: a fold that overflows there
        # is out of contract too
        for name, values in (("weight", w), ("bias", b)):
            if not np.isfinite(values.astype(np.float32)).all():
                raise WeightsOutOfContract(CONTEXT, f"{site}'s folded {name} is not finite in FP32")
        return cls(site, w, b)

    def _kept(self, key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
        """`make()`'s array, made on the first call for `key` and kept, read-only."""
        if key not in self._derived:
            made = make()
            made.flags.writeable = False
            self._derived[key] = made
        return self._derived[key]

    def column_shifts(self) -> np.ndarray:
        """Per output channel, the s of the weights' scale 2^s: their largest magnitude
        times it in [2^14, 2^15); 0 for a zero column; clamped to -113..126 so 2^-s is a
        normal FP32 number, as the kernels' activation scales are. Read-only."""
        return self._kept(("shifts",), self._column_shifts)

    def _column_shifts(self) -> np.ndarray:
        largest = np.abs(self.weight).reshape(self.weight.shape[0], -1).max(axis=1)
        _, exponent = np.frexp(largest)  # largest = f 2^exponent, f in [0.5, 1)
        return np.where(largest > 0, np.clip(15 - exponent, -113, 126), 0)

    def packed(self, split: bool = True, warpgroups: bool = False) -> np.ndarray:
        """The weight as the kernels read it, flat: the stem's FP32 `[tap][32]`; the
        others' FP16 pair words `[k / 16][cout][t][high(t), high(t + 4), low(t),
        low(t + 4)]` (without `split`, the high words only), as float32 bits, with the
        16 k of a stage in `FRAGMENT_ORDER`. With `warpgroups` (the wgmma kernels,
        `TrunkSite.on_warpgroups`), per stage the high plane then (`split`) the low one,
        each `[cout / 8][2][8][8]` FP16: per 8 columns, two 8 x 8 blocks (k 0..7 and
        8..15 of the stage, in the same order), row n of a block column n's 8 values.
        Packed once per form and kept, read-only."""
        return self._kept(("packed", split, warpgroups), lambda: self._pack(split, warpgroups))

    def _pack(self, split: bool, warpgroups: bool) -> np.ndarray:
        taps = self.weight.transpose(2, 3, 1, 0)  # [ky][kx][cin][cout], tap = ky * ks + kx
        if self.site is TrunkSite.STEM:
            return np.ascontiguousarray(taps.astype(np.float32)).reshape(-1)
        scaled = taps.reshape(-1, taps.shape[-1]) * np.exp2(self.column_shifts())
        scaled = scaled[_fragment_order(scaled.shape[0])]
        high = scaled.astype(np.float16)
        low = (scaled - high.astype(np.float64)).astype(np.float16)

        def words(halves: np.ndarray) -> np.ndarray:  # [k][cout] -> [k / 16][cout][t][2]
            bits = halves.view(np.uint16).astype(np.uint32)
            pairs = bits[0::2] | bits[1::2] << 16  # [p][cout], p = 8 stage + 4 half + t
            return pairs.reshape(-1, 2, 4, pairs.shape[-1]).transpose(0, 3, 2, 1)

        if warpgroups:
            # [k][cout] -> [k / 16][cout / 8][2][8][8]
            def planes(halves: np.ndarray) -> np.ndarray:
                blocks = halves.reshape(-1, 2, 8, halves.shape[-1] // 8, 8)
                return blocks.transpose(0, 3, 1, 4, 2)

            both = np.stack([planes(high), planes(low)], axis=1) if split else planes(high)
            return np.ascontiguousarray(both).reshape(-1).view(np.float32)
        stages = np.concatenate([words(high), words(low)], axis=-1) if split else words(high)
        return np.ascontiguousarray(stages).reshape(-1).view(np.float32)

    def packed_bias(self) -> np.ndarray:
        """The stem's bias; the others' bias, then their columns' inverse scales 2^-s.
        Read-only."""
        return self._kept(("bias",), self._pack_bias)

    def _pack_bias(self) -> np.ndarray:
        if self.site is TrunkSite.STEM:
            return self.bias.astype(np.float32)
        return np.concatenate([self.bias, np.exp2(-self.column_shifts())]).astype(np.float32)

    def packed_bias_bounded(self) -> np.ndarray:
        """`packed_bias`, then the two factors of a bound on the outputs' magnitude that
        the writer of a 16-bit middle activation scales them by before it knows them
        (`ptx/src/trunk/trunktiles.cuh`): for inputs no larger than m, |y| <= m r + b,
        r the largest row sum of |w| and b the largest |bias|, each rounded up to FP32.
        Read-only."""
        return self._kept(("bias", "bounded"), self._pack_bias_bounded)

    def _pack_bias_bounded(self) -> np.ndarray:
        rows = np.abs(self.weight).reshape(self.weight.shape[0], -1).sum(axis=1).max()
        factors = np.array([rows, np.abs(self.bias).max()])
        rounded = factors.astype(np.float32)
        rounded = np.where(rounded < factors, np.nextafter(rounded, np.float32(np.inf)), rounded)
        return np.concatenate([self.packed_bias(), rounded])


@attrs.frozen
class Block:
    """One BasicBlock: conv1 (+ bn1, ReLU), conv2 (+ bn2), the shortcut (None: the
    identity); the output is ReLU(conv2 + shortcut)."""

    conv1: FoldedConv
    conv2: FoldedConv
    shortcut: FoldedConv | None


@attrs.frozen
class TrunkWeights:
    """The whole trunk folded: the stem and the 16 blocks in order, each convolution on
    the site `TrunkSite.of_block` names."""

    stem: FoldedConv
    blocks: tuple[Block, ...]

    def __attrs_post_init__(self) -> None:
        if self.stem.site is not TrunkSite.STEM:
            raise GeometryInvalid(CONTEXT, f"the stem is on {self.stem.site}")
        expected = [
            TrunkSite.of_block(layer, block)
            for layer, count in enumerate(TRUNK_BLOCKS, start=1)
            for block in range(count)
        ]
        if len(self.blocks) != len(expected):
            raise GeometryInvalid(
                CONTEXT, f"ResNet34's trunk has {len(expected)} blocks, not {len(self.blocks)}"
            )
        for index, (block, sites) in enumerate(zip(self.blocks, expected, strict=True)):
            shortcut = block.shortcut.site if block.shortcut is not None else None
            if (block.conv1.site, block.conv2.site, shortcut) != sites:
                raise GeometryInvalid(
                    CONTEXT,
                    f"block {index} has sites {block.conv1.site}, "
                    f"{block.conv2.site}, {shortcut}; expected {sites}",
                )

    def convs(self) -> Sequence[FoldedConv]:
        """Every convolution in launch order: stem, then per block conv1, the shortcut,
        conv2."""
        order = [self.stem]
        for block in self.blocks:
            order.append(block.conv1)
            if block.shortcut is not None:
                order.append(block.shortcut)
            order.append(block.conv2)
        return order

    @classmethod
    def random(cls, seed: int, *, bias_scale: float = 0.1) -> TrunkWeights:
        """Random folded weights for tests: normal with He's standard deviation
        sqrt(2 / k), the second convolution of each block at half that, biases normal
        with `bias_scale`."""
        rng = np.random.default_rng(seed)

        def conv(site: TrunkSite, gain: float = 1.0) -> FoldedConv:
            shape = site.shape
            std = gain * np.sqrt(2.0 / shape.k)
            weight = rng.normal(0.0, std, shape.weight_shape)
            return FoldedConv.of(site, weight, rng.normal(0.0, bias_scale, shape.cout))

        blocks = []
        for layer, count in enumerate(TRUNK_BLOCKS, start=1):
            for index in range(count):
                first, second, shortcut = TrunkSite.of_block(layer, index)
                blocks.append(
                    Block(
                        conv(first),
                        conv(second, 0.5),
                        conv(shortcut) if shortcut is not None else None,
                    )
                )
        return cls(conv(TrunkSite.STEM), tuple(blocks))
