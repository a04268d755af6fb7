// seglinear kernels of the segdense module (included by segdense.cu): the entries of
// linear0 and linear1 of the segmentation head, y = LeakyReLU(x @ w + bias) with x [m, k]
// and w [k, 128] row-major (w unpacked), bias [128], y [m, 128], m = batch * ITEM_ROWS,
// k = 256 (linear0) or 128 (linear1). FP32 SIMT, one launch, no workspace. The bodies:
// seglinear_b32.cuh (batch 32), seglinear_b1.cuh (batch 1) and seglinear_b1_linear1.cuh
// (linear1 at batch 1, in float64 or compensated float32).

#pragma once

#include "common.cuh"
#include "linear.cuh"
#include "seglinear_b1.cuh"
#include "seglinear_b1_linear1.cuh"
#include "seglinear_b32.cuh"

// Entries: every one checks its lengths, alignment and launch shape before writing.
#define SPK_LINEAR_ENTRY(NAME, BODY, MIN_BLOCKS)                                          \
    SPK_DENSE_KERNEL(NAME, spk::lin::THREADS, MIN_BLOCKS,                                  \
                     BODY(x, x_len, w, w_len, bias, bias_len, y, y_len))

// batch 1: at most two blocks per SM ever, registers are free
SPK_LINEAR_ENTRY(spk_segdense_linear0_b1, spk::lin::gemm_b1<256>, 1)
SPK_LINEAR_ENTRY(spk_segdense_linear1_b1, spk::lin::linear1_b1, 1)
// TF32 math keeps FP32 products here: a tensor-core form (16 x 32 tiles, k split four
// ways in the block, three stages) was slower than this body, in TF32 and with split
// weights alike
SPK_LINEAR_ENTRY(spk_segdense_linear1_b1_tf32, spk::lin::gemm_b1<128>, 1)
// batch 32: up to three of the 295 blocks resident per SM, so ptxas may give each thread
// three blocks' share of the registers
SPK_LINEAR_ENTRY(spk_segdense_linear0_b32, spk::lin::gemm_b32<256>, 3)
SPK_LINEAR_ENTRY(spk_segdense_linear1_b32, spk::lin::gemm_b32<128>, 3)

#undef SPK_LINEAR_ENTRY
