// The model's shapes and constants that the kernels are compiled for and that pyspk
// states too: `tools/kernels.py check` reads each literal constant below from this file
// and fails when it differs from its Python value (named beside it).

#pragma once

#include "common.cuh"

namespace spk {

// Rows of one batch item in the segmentation head: the frames of a 10 s chunk
// (DenseSite.LINEAR0.dimensions()[0] in pyspk.candidate.framework).
constexpr u32 ITEM_ROWS = 589;

// The negative slope of the head's LeakyReLU (pyspk.reference.LEAKY_SLOPE).
constexpr float LEAKY_SLOPE = 0.01f;

// The batch-32 embedding: 96 rows (32 items x 3 masks) of 256 columns, k = 5120; the
// split-K kernels write up to EMBED_MAX_SPLITS partial planes of EMBED_OUTPUTS floats
// (EMBED_MAX_SPLITS and FLAT_MAX_SPLITS in pyspk.candidate.segdense.selection).
constexpr u32 EMBED_ROWS = 96;     // 32 items x 3 masks
constexpr u32 EMBED_COLS = 256;
constexpr u32 EMBED_K = 5120;
constexpr u32 EMBED_OUTPUTS = EMBED_ROWS * EMBED_COLS;
constexpr u32 EMBED_MAX_SPLITS = 128;  // planes the eight-warp reduction adds
constexpr u32 FLAT_MAX_SPLITS = 40;    // planes the one-thread-per-output reduction adds

// v if v >= 0 or v is NaN (both fail `v < 0`), else LEAKY_SLOPE v
__device__ __forceinline__ float leaky(float v) { return v < 0.0f ? LEAKY_SLOPE * v : v; }

}  // namespace spk
