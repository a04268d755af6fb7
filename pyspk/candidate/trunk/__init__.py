"""The trunk area: the WeSpeaker ResNet34 trunk (its 36 convolutions, BatchNorm folded,
ReLU and the residual adds fused) as fixed-shape plans at batch 32 chunks of 80 mel
bins x 998 frames, on FP16 tensor cores with power-of-two scales: three products of
split operands in FP32 math, one in TF32 math.
Needs the sm80 tier; below it a plan refuses with `DeviceUnsupported` (take the
library path)."""

from pyspk.candidate.trunk.folding import BatchNorm, Block, FoldedConv, TrunkWeights
from pyspk.candidate.trunk.plan import ConvPlan, TrunkPlan, plan_conv, plan_trunk
from pyspk.candidate.trunk.shapes import (
    OUTPUT_SHAPE,
    TRUNK_BATCH,
    TRUNK_BINS,
    TRUNK_BLOCKS,
    TRUNK_FRAMES,
    ConvShape,
    TrunkSite,
    trunk_macs,
)

__all__ = [
    "OUTPUT_SHAPE",
    "TRUNK_BATCH",
    "TRUNK_BINS",
    "TRUNK_BLOCKS",
    "TRUNK_FRAMES",
    "BatchNorm",
    "Block",
    "ConvPlan",
    "ConvShape",
    "FoldedConv",
    "TrunkPlan",
    "TrunkSite",
    "TrunkWeights",
    "plan_conv",
    "plan_trunk",
    "trunk_macs",
]
