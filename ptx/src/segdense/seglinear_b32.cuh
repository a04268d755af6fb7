// The batch-32 SIMT linears (linear0_b32, linear1_b32; entries in seglinear.cuh): 72 x
// 128 tiles, 128 threads of 9 x 8 outputs, x and w staged in steps of 8 k through
// double-buffered shared memory (one barrier per step). Each output is a sequential fma
// chain along k from zero, then + bias, then LeakyReLU.

#pragma once

#include "common.cuh"
#include "linear.cuh"
#include "model.cuh"

namespace spk {
namespace lin {

// ---------------------------------------------------------------------------------------
// Batch 32: grid (295, 1, 1) x 128 threads; block b < 262 owns rows [72 b, 72 b + 72),
// blocks 262.. return at once
// ---------------------------------------------------------------------------------------
//
// Why 72 rows: the 295 blocks the Config table launches land two on most SMs of the H200
// and three on 31 of them, so with one 64-row tile per block those 31 SMs did half as
// much work again as the rest and set the kernel's time. 262 blocks of 72 rows cover
// m = 18848 with at most two working blocks per SM, with the same output bits (each
// output's order is unchanged). Placement only moves the time, never a result.

constexpr u32 B32_M = 32 * ITEM_ROWS;  // 18848 = 261 * 72 + 56
constexpr u32 B32_LAUNCHED = (B32_M + 63) / 64;  // the Config table's grid: 64-row blocks
constexpr u32 B32_ROWS = 72;                     // 64 in the 8 x 8 tiles, 8 more
constexpr u32 B32_STEP = 8;                      // k per shared-memory stage
constexpr u32 B32_XSTRIDE = B32_ROWS + 4;        // 4 x stride = 16 banks: the transposed x
                                                 // stores of the two k halves never collide

template <u32 K>
__device__ __forceinline__ void gemm_b32(const float* __restrict__ x, u64 x_len,
                                         const float* __restrict__ w, u64 w_len,
                                         const float* __restrict__ bias, u64 bias_len,
                                         float* __restrict__ y, u64 y_len) {
    constexpr u32 M = B32_M;
    constexpr u32 STEP = B32_STEP;
    constexpr u32 STAGES = K / STEP;
    static_assert(K % STEP == 0 && STAGES >= 2, "whole steps, at least two");
    if (!buffers_ok<M, K>(x, x_len, w, w_len, bias, bias_len, y, y_len) |
        !launch_is(B32_LAUNCHED, 1, 1, THREADS)) {
        return;
    }
    const u32 row0 = blockIdx.x * B32_ROWS;
    if (row0 >= M) {
        return;  // block-uniform, before any barrier
    }
    // buffer b: xs[kk][r] = x[row0 + r, k0 + kk] (transposed so a lane reads 4 rows as
    // one float4), ws[kk][c] = w[k0 + kk, c]. One struct per buffer, so a single
    // alternating offset moves every staging and operand pointer to the other buffer.
    struct Buffer {
        float xs[STEP][B32_XSTRIDE];
        float ws[STEP][N];
    };
    __shared__ __align__(16) Buffer buffers[2];
    constexpr u32 FLIP = sizeof(Buffer) / sizeof(float);

    const u32 t = threadIdx.x;

    // Staging: a lane pair reads one 32-byte x row segment (the k halves) of rows 0..63,
    // threads 0..15 also of rows 64..71; each warp reads whole 512-byte w rows (k rows
    // t / 32 and t / 32 + 4). Rows past m (last block) re-read row m - 1: their products
    // are computed and never stored. Running pointers keep the per-step address work to
    // a few 64-bit adds.
    const u32 x_row = t >> 1;
    const u32 x_half = (t & 1) * 4;
    const bool extra_row = t < 16;
    const u32 x_row2 = 64 + (x_row & 7);
    const float* x_next = x + min(row0 + x_row, M - 1) * K + x_half;
    const float* x_next2 = x + min(row0 + x_row2, M - 1) * K + x_half;
    const float* w_next = w + (t >> 5) * N + (t & 31) * 4;
    float* x_put = &buffers[0].xs[x_half][x_row];
    float* x_put2 = &buffers[0].xs[x_half][x_row2];
    float* w_put = &buffers[0].ws[t >> 5][(t & 31) * 4];
    float4 next_x, next_x2, next_w0, next_w1;
    auto fetch = [&]() {
        next_x = load4(x_next);
        next_x2 = load4(x_next2);  // every thread: an in-bounds address, no predicate
        next_w0 = load4(w_next);
        next_w1 = load4(w_next + 4 * N);
        x_next += STEP;
        x_next2 += STEP;
        w_next += STEP * N;
        // keeps the next step's loads above this step's products (ptxas otherwise sinks
        // them mid-step)
        loads_issued();
    };
    auto put_x = [](float* xp, float4 v) {
        xp[0 * B32_XSTRIDE] = v.x;
        xp[1 * B32_XSTRIDE] = v.y;
        xp[2 * B32_XSTRIDE] = v.z;
        xp[3 * B32_XSTRIDE] = v.w;
    };
    auto stash = [&](u32 offset) {
        put_x(x_put + offset, next_x);
        if (extra_row) {
            put_x(x_put2 + offset, next_x2);
        }
        float* wp = w_put + offset;
        store4(wp, next_w0);
        store4(wp + 4 * N, next_w1);
    };

    // Tile: rows 4 rg + {0..3}, 32 + 4 rg + {0..3} and 64 + rg, columns 4 cg + {0..3}
    // and 64 + 4 cg + {0..3}. A warp spans 4 row groups x 8 column groups, so each of its
    // float4 reads per k touches 64 or 128 distinct bytes: one wavefront each.
    const u32 warp = t >> 5;
    const u32 lane = t & 31;
    const u32 rg = (warp >> 1) * 4 + (lane >> 3);
    const u32 cg = (warp & 1) * 8 + (lane & 7);
    const saddr x_get = shared_address(&buffers[0].xs[0][rg * 4]);
    const saddr x_get2 = shared_address(&buffers[0].xs[0][64 + rg]);
    const saddr w_get = shared_address(&buffers[0].ws[0][cg * 4]);
    float acc[8][8];
    float acc_extra[8];  // row 64 + rg
#pragma unroll
    for (u32 i = 0; i < 8; ++i) {
        acc_extra[i] = 0.0f;
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            acc[i][j] = 0.0f;
        }
    }
    auto compute = [&](u32 offset) {
        const saddr xp = x_get + 4 * offset;
        const saddr xq = x_get2 + 4 * offset;
        const saddr wp = w_get + 4 * offset;
#pragma unroll
        for (u32 kk = 0; kk < STEP; ++kk) {
            const float4 a0 = lds4(xp + 4 * (kk * B32_XSTRIDE));
            const float4 a1 = lds4(xp + 4 * (kk * B32_XSTRIDE + 32));
            const float a2 = lds1(xq + 4 * (kk * B32_XSTRIDE));
            const float4 b0 = lds4(wp + 4 * (kk * N));
            const float4 b1 = lds4(wp + 4 * (kk * N + 64));
            outer8x8(acc, a0, a1, b0, b1);
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (u32 j = 0; j < 8; ++j) {
                acc_extra[j] = fmaf(a2, b[j], acc_extra[j]);
            }
        }
    };

    fetch();
    stash(0);
    __syncthreads();
    u32 offset = 0;  // of the buffer being read: 0 or FLIP
    for (u32 stage = 0; stage + 1 < STAGES; ++stage) {
        // next step's loads fly during this step's products
        fetch();
        compute(offset);
        // the other buffer's readers all passed the previous barrier
        offset = FLIP - offset;
        stash(offset);
        __syncthreads();
    }
    // the epilogue's bias flies during the last step's products
    const float4 bias0 = load4(bias + cg * 4);
    const float4 bias1 = load4(bias + 64 + cg * 4);
    compute(offset);

#pragma unroll
    for (u32 i = 0; i < 9; ++i) {
        const u32 row = row0 + (i < 4 ? rg * 4 + i : i < 8 ? 32 + rg * 4 + (i & 3) : 64 + rg);
        const float* out_acc = i < 8 ? acc[i] : acc_extra;
        if (row < M) {
            float* out = y + row * N + cg * 4;
            store4(out, bias_leaky4(make_float4(out_acc[0], out_acc[1], out_acc[2],
                                                out_acc[3]),
                                    bias0));
            store4(out + 64, bias_leaky4(make_float4(out_acc[4], out_acc[5], out_acc[6],
                                                     out_acc[7]),
                                         bias1));
        }
    }
}

}  // namespace lin
}  // namespace spk
