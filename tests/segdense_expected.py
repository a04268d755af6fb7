"""Expectations of the segdense device rule for the test_selection_* files and
test_area.py, derived by hand from the reference implementation's match arms, consts
and formulas, never from the code under test."""

from __future__ import annotations

from pyspk.candidate.segdense import (
    Classifier,
    Config,
    Conv,
    Fragments,
    Gemm,
    Gemv,
    Hardware,
    Split,
    SplitWeights,
    TensorConv,
)
from pyspk.cuda import ComputeCapability, CudaMath, DeviceAttributes, PtxTier

FP32 = CudaMath.FP32
TF32 = CudaMath.TF32
SM75 = PtxTier.SM75
SM80 = PtxTier.SM80
MATHS = (FP32, TF32)
K = 1024

# HALF_SHARED by hand: 4 bytes a word times 96 row scales plus the larger of the FP16
# slice of 96 rows with its three-stage weight ring and the cross-group reduction of
# 192 threads' 64 accumulators, which reuses that memory:
# ring = 96 * (320 / 2 + 4) + 3 * (32 / 2) * (128 + 8) = 15744 + 6528 = 22272
# reduction = 192 * 32 * 64 / 32 = 12288; 4 * (96 + 22272) = 89472
HAND_HALF_SHARED = 4 * (
    96 + max(96 * (320 // 2 + 4) + 3 * (32 // 2) * (128 + 8), 192 * 32 * 64 // 32)
)
# HALF_MIN_SPLITS, the fewest slices that keep every FP16 slice within 320 reduction
# terms of 32-term stages: (5120 / 32).div_ceil(320 / 32) = 160.div_ceil(10) = 16
HAND_HALF_MIN_SPLITS = 16

# Entries whose real kernel only the sm80 tier carries (the reference documents them
# as "sm80 tier:"); LINEAR1_B1_TF32 is SIMT on sm75
SM80_ONLY = {
    "CONV1_B32_TC",
    "CONV1_B32_X3",
    "CONV2_B32_TC",
    "CONV2_B32_X3",
    "LINEAR0_B1_TF32",
    "LINEAR0_B32_SELECT",
    "LINEAR1_B32_TF32",
    "EMBED_B32_TF32",
    "EMBED_B32_TF32_K2",
    "EMBED_B32_TF32_E64",
    "EMBED_B32_X3",
    "EMBED_B32_F16",
}
# Entries whose products are TF32 or FP16 (the rule pairs them only with TF32 math)
REDUCED_PRODUCTS = {
    "CONV1_B32_TC",
    "CONV2_B32_TC",
    "LINEAR0_B1_TF32",
    "LINEAR0_B32_SELECT",
    "LINEAR1_B1_TF32",
    "LINEAR1_B32_TF32",
    "EMBED_B32_TF32",
    "EMBED_B32_TF32_K2",
    "EMBED_B32_TF32_E64",
    "EMBED_B32_F16",
}
SPLIT_ENTRIES = {
    "EMBED_B32",
    "EMBED_B32_TF32",
    "EMBED_B32_TF32_K2",
    "EMBED_B32_TF32_E64",
    "EMBED_B32_X3",
    "EMBED_B32_F16",
}


def device(major: int, minor: int, sms: int, optin: int = 99 * K) -> DeviceAttributes:
    return DeviceAttributes(
        ComputeCapability(major, minor), multiprocessors=sms, shared_optin_bytes=optin
    )


def hardware(major: int, minor: int, sms: int, optin: int = 99 * K) -> Hardware:
    return Hardware(ComputeCapability(major, minor), sms, optin)


E64 = "EMBED_B32_TF32_E64"
F16 = "EMBED_B32_F16"
K2 = "EMBED_B32_TF32_K2"
TF = "EMBED_B32_TF32"

# (name, capability, SMs, opt-in, heavy, splits(2, 2), splits(4, 2), TF32 embedding pick)
DEVICES = [
    ("a100", (8, 0), 108, 163 * K, True, 108, 54, (E64, 54)),
    ("h200", (9, 0), 132, 227 * K, True, 128, 66, (E64, 66)),
    ("b200", (10, 0), 148, 227 * K, True, 128, 74, (E64, 74)),
    ("heavy-1sm", (8, 0), 1, 163 * K, True, 1, 1, (E64, 1)),
    ("heavy-34sm", (9, 0), 34, 227 * K, True, 34, 17, (E64, 17)),
    ("rtx3090", (8, 6), 82, 99 * K, False, 82, None, (F16, 41)),
    ("orin", (8, 7), 16, 163 * K, False, 16, None, (TF, 16)),
    ("rtx4060ti", (8, 9), 34, 99 * K, False, 34, None, (F16, 17)),
    ("ada-32sm", (8, 9), 32, 99 * K, False, 32, None, (F16, 16)),
    ("ada-31sm", (8, 9), 31, 99 * K, False, 31, None, (TF, 31)),
    ("ada-shared-at", (8, 9), 34, 89472, False, 34, None, (F16, 17)),
    ("ada-shared-below", (8, 9), 34, 89471, False, 34, None, (TF, 34)),
    ("ada-1sm", (8, 9), 1, 99 * K, False, 1, None, (TF, 1)),
    ("ada-256sm", (8, 9), 256, 99 * K, False, 128, None, (F16, 128)),
    ("rtx5060ti", (12, 0), 36, 99 * K, False, 36, None, (F16, 18)),
    ("bw-30sm", (12, 0), 30, 99 * K, False, 30, None, (K2, 15)),
    ("bw-48k", (12, 0), 36, 48 * K, False, 36, None, (K2, 18)),
    ("bw-32sm", (12, 0), 32, 99 * K, False, 32, None, (F16, 16)),
    ("bw-31sm", (12, 0), 31, 99 * K, False, 31, None, (K2, 15)),
    ("bw-shared-at", (12, 0), 36, 89472, False, 36, None, (F16, 18)),
    ("bw-shared-below", (12, 0), 36, 89471, False, 36, None, (K2, 18)),
    ("bw-1sm", (12, 0), 1, 99 * K, False, 1, None, (K2, 1)),
    ("bw-256sm-48k", (12, 0), 256, 48 * K, False, 128, None, (K2, 128)),
    ("bw-12.1-fits", (12, 1), 48, 99 * K, False, 48, None, (F16, 24)),
    ("bw-12.1-small", (12, 1), 20, 99 * K, False, 20, None, (K2, 10)),
    ("b300-10.3", (10, 3), 148, 227 * K, False, 128, None, (F16, 74)),
    ("cc11-small", (11, 0), 20, 99 * K, False, 20, None, (TF, 20)),
    ("cc11-fits", (11, 0), 40, 99 * K, False, 40, None, (F16, 20)),
    ("cc13-48k", (13, 0), 36, 48 * K, False, 36, None, (TF, 36)),
    ("cc13-fits", (13, 0), 36, 99 * K, False, 36, None, (F16, 18)),
]

# a tensor-core convolution's dynamic shared memory, 4 bytes a word: three stages of
# 8 * (128 + 16) + 2560 * planes words, or the 64 * (128 + 8)-word epilogue if larger
SHARED_TC = 4 * max(3 * (8 * (128 + 16) + 2560 * 1), 64 * (128 + 8))
SHARED_X3 = 4 * max(3 * (8 * (128 + 16) + 2560 * 2), 64 * (128 + 8))


def _split(
    kernel: str, cols: int, splits: int, block: int, fragments: Fragments | None = None
) -> Config:
    return Config(
        kernel=kernel,
        kind=Split(
            rows=96, cols=cols, splits=splits, weights=SplitWeights.FP32, fragments=fragments
        ),
        block=block,
        shared=0,
    )


# name -> (site, batch, config for `splits` slices), the reference's table of entries
# (each one's kernel, tile, block and shared memory); the tensor-core GEMMs'
# `fragments` (their weights packed as mma fragments) are pyspk's own
ENTRY_TABLE = {
    "CONV1_B1": (
        "CONV1",
        1,
        lambda s: Config(
            kernel="spk_segdense_conv1_b1", kind=Conv(positions=64), block=256, shared=0
        ),
    ),
    "CONV1_B32": (
        "CONV1",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv1_b32", kind=Conv(positions=128), block=128, shared=0
        ),
    ),
    "CONV1_B32_TC": (
        "CONV1",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv1_b32_tc",
            kind=TensorConv(positions=128, cin_pad=80, planes=1),
            block=128,
            shared=SHARED_TC,
        ),
    ),
    "CONV1_B32_X3": (
        "CONV1",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv1_b32_x3",
            kind=TensorConv(positions=128, cin_pad=80, planes=2),
            block=256,
            shared=SHARED_X3,
        ),
    ),
    "CONV2_B1": (
        "CONV2",
        1,
        lambda s: Config(
            kernel="spk_segdense_conv2_b1", kind=Conv(positions=32), block=256, shared=0
        ),
    ),
    "CONV2_B32": (
        "CONV2",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv2_b32", kind=Conv(positions=128), block=128, shared=0
        ),
    ),
    "CONV2_B32_TC": (
        "CONV2",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv2_b32_tc",
            kind=TensorConv(positions=128, cin_pad=64, planes=1),
            block=128,
            shared=SHARED_TC,
        ),
    ),
    "CONV2_B32_X3": (
        "CONV2",
        32,
        lambda s: Config(
            kernel="spk_segdense_conv2_b32_x3",
            kind=TensorConv(positions=128, cin_pad=64, planes=2),
            block=256,
            shared=SHARED_X3,
        ),
    ),
    "LINEAR0_B1": (
        "LINEAR0",
        1,
        lambda s: Config(
            kernel="spk_segdense_linear0_b1",
            kind=Gemm(rows=16, cols=32, select=0),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR0_B1_TF32": (
        "LINEAR0",
        1,
        lambda s: Config(
            kernel="spk_segdense_linear0_b1_tf32",
            kind=Gemm(rows=32, cols=32, select=0, fragments=Fragments(planes=1, paired=True)),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR0_B32": (
        "LINEAR0",
        32,
        lambda s: Config(
            kernel="spk_segdense_linear0_b32",
            kind=Gemm(rows=64, cols=128, select=0),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR0_B32_SELECT": (
        "LINEAR0",
        32,
        lambda s: Config(
            kernel="spk_segdense_linear0_b32_tf32",
            kind=Gemm(rows=64, cols=128, select=16, fragments=Fragments(planes=1, half=True)),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR1_B1": (
        "LINEAR1",
        1,
        lambda s: Config(
            kernel="spk_segdense_linear1_b1",
            kind=Gemm(rows=16, cols=32, select=0),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR1_B1_TF32": (
        "LINEAR1",
        1,
        lambda s: Config(
            kernel="spk_segdense_linear1_b1_tf32",
            kind=Gemm(rows=16, cols=32, select=0),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR1_B32": (
        "LINEAR1",
        32,
        lambda s: Config(
            kernel="spk_segdense_linear1_b32",
            kind=Gemm(rows=64, cols=128, select=0),
            block=128,
            shared=0,
        ),
    ),
    "LINEAR1_B32_TF32": (
        "LINEAR1",
        32,
        lambda s: Config(
            kernel="spk_segdense_linear1_b32_tf32",
            kind=Gemm(rows=64, cols=128, select=0, fragments=Fragments(planes=1, half=True)),
            block=128,
            shared=0,
        ),
    ),
    "CLASSIFIER_B1": (
        "LINEAR2",
        1,
        lambda s: Config(
            kernel="spk_segdense_classifier_b1", kind=Classifier(rows=8), block=64, shared=0
        ),
    ),
    "CLASSIFIER_B32": (
        "LINEAR2",
        32,
        lambda s: Config(
            kernel="spk_segdense_classifier_b32", kind=Classifier(rows=128), block=256, shared=0
        ),
    ),
    "EMBED_B1": (
        "EMBEDDING",
        1,
        lambda s: Config(kernel="spk_segdense_embed_b1", kind=Gemv(cols=2), block=256, shared=0),
    ),
    "EMBED_B32": ("EMBEDDING", 32, lambda s: _split("spk_segdense_embed_b32", 128, s, 192)),
    "EMBED_B32_TF32": (
        "EMBEDDING",
        32,
        lambda s: _split("spk_segdense_embed_b32_tf32", 128, s, 192, Fragments(1)),
    ),
    "EMBED_B32_TF32_K2": (
        "EMBEDDING",
        32,
        lambda s: _split("spk_segdense_embed_b32_tf32_k2", 128, s, 384, Fragments(1)),
    ),
    "EMBED_B32_TF32_E64": (
        "EMBEDDING",
        32,
        lambda s: _split("spk_segdense_embed_b32_tf32_e64", 64, s, 192, Fragments(1, paired=True)),
    ),
    "EMBED_B32_X3": (
        "EMBEDDING",
        32,
        lambda s: _split("spk_segdense_embed_b32_x3", 64, s, 192, Fragments(2)),
    ),
    "EMBED_B32_F16": (
        "EMBEDDING",
        32,
        lambda s: Config(
            kernel="spk_segdense_embed_b32_f16",
            kind=Split(rows=96, cols=128, splits=s, weights=SplitWeights.SCALED_HALF),
            block=384,
            shared=89472,
        ),
    ),
}


# boundary name -> the name of its Site member
BOUNDARY_SITES = {
    "sincnet.conv1": "CONV1",
    "sincnet.conv2": "CONV2",
    "linear0": "LINEAR0",
    "linear1": "LINEAR1",
    "linear2": "LINEAR2",
    "resnet.seg_1": "EMBEDDING",
}
