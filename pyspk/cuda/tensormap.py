"""Tensor maps for the async copy engine (TMA) of sm_90 and later: the 128-byte
descriptor (`cuTensorMapEncodeTiled`) that a kernel's `cp.async.bulk.tensor` reads, made
on the host and uploaded, 64-byte aligned, where the kernel finds it."""

from __future__ import annotations

import numpy as np

from pyspk.cuda import driver

TENSOR_MAP_BYTES = 128


def float32_map(address: int, dims: tuple[int, ...], box: tuple[int, ...]) -> np.ndarray:
    """A map of the row-major float32 array of shape `dims` (outermost first) at device
    `address`, boxes of shape `box`, zeros wherever a box leaves the array: the
    descriptor's bytes as 32 int32 words. The driver requires `address` and every row's
    stride 16-byte aligned."""
    return _tiled_map(address, dims, box, "FLOAT32", 4)


def words_map(address: int, dims: tuple[int, ...], box: tuple[int, ...]) -> np.ndarray:
    """`float32_map` of a row-major array of 8-byte words, whatever they hold (four FP16
    values each, say): a box's innermost extent may be 256 items, so in 8-byte words a box
    row reaches 2 KB."""
    return _tiled_map(address, dims, box, "UINT64", 8)


def _tiled_map(
    address: int, dims: tuple[int, ...], box: tuple[int, ...], data_type: str, item_bytes: int
) -> np.ndarray:
    api = driver.api()
    u64, u32 = api.cuuint64_t, api.cuuint32_t
    inner = dims[::-1]  # the driver lists dimensions innermost first
    strides, stride = [], item_bytes
    for extent in inner[:-1]:
        stride *= extent
        strides.append(u64(stride))
    tensor_map = driver.call(
        "cuTensorMapEncodeTiled",
        getattr(api.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{data_type}"),
        len(dims),
        address,
        [u64(extent) for extent in inner],
        strides,
        [u32(extent) for extent in box[::-1]],
        [u32(1)] * len(dims),
        api.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        api.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        api.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        api.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    return np.array([int(word) for word in tensor_map.opaque], dtype=np.uint64).view(np.int32)
