// embed_b32_f16 (included by segdense.cu): the batch-32 embedding split-K on FP16
// products with FP32 accumulation. sm80 tier only; the sm75 tier exports the name as a
// trapping stub. The fixed-order reduction kernels of segdense.cu add its partial
// planes and the bias.
//
// w: pack_half_columns' layout: word p n + c holds the FP16 pair (w[c][2p] s_c,
// w[c][2p + 1] s_c), low half first, and float k / 2 n + c holds 1 / s_c; the power of
// two s_c puts column c's largest magnitude in [2^14, 2^15). Grid (1, 2, splits),
// 16 <= splits <= 128, 384 threads, HALF_SHARED bytes of dynamic shared memory.
// Slice z covers the 32-term units [160 z / splits, 160 (z + 1) / splits), at most 10
// (320 terms). Four threads per x row load the row's slice, find its largest magnitude
// (xor shuffles), scale the row by the power of two s_r that puts it in [2^14, 2^15)
// (exponent clamped as half_scale clamps it) and store FP16 pairs to shared memory; the
// weights stream through a three-deep cp.async ring of 16 pair rows x 128 columns.
// Two groups of six warps (32 x 64 each) take the first and second 16 terms of every
// unit, chained in their accumulators; group 1's sums are added to group 0's, then
// partial = sum / (s_r s_c), exact scalings by two powers of two of half the exponent
// each (pow2_halves), so no step overflows or underflows unless the partial does (the
// FP16 range keeps every product and sum far inside FP32's).
// Error (u = 2^-24): each scaled operand rounds to FP16 with relative error 2^-11, or an
// absolute 2^-25 below FP16's normal range, so a term errs by at most
// 2^-10 |x w| + 2^-38 (max|x_r| |w| + max|w_c| |x|) and the chained mma as TF32's do.

#pragma once

#include "common.cuh"
#include "model.cuh"
#include "sm80.cuh"

namespace spk {
namespace half {

constexpr u32 ROWS = 96, COLS = 128, THREADS = 384, GROUP = 192;
constexpr u32 UNIT = 32;                       // terms per stage: two groups of 16
constexpr u32 UNITS = 5120 / UNIT;             // 160
constexpr u32 MIN_SPLITS = 16, MAX_UNITS = 10; // a slice holds at most 320 terms
constexpr u32 X_PITCH = MAX_UNITS * UNIT / 2 + 4;  // words per x row: 4 mod 32 banks
constexpr u32 W_PITCH = COLS + 8;                  // words per pair row: 8 mod 32 banks
constexpr u32 RING = 3;
constexpr u32 X_AT = ROWS;                          // after the row scales (words)
constexpr u32 W_AT = X_AT + ROWS * X_PITCH;
constexpr u32 W_STAGE = UNIT / 2 * W_PITCH;
constexpr u32 RED = GROUP * 64;                     // group 1's accumulators
constexpr u32 REGION = ROWS * X_PITCH + RING * W_STAGE > RED ? ROWS * X_PITCH + RING * W_STAGE
                                                            : RED;
constexpr u32 SHARED_BYTES = 4 * (ROWS + REGION);
// pyspk.candidate.segdense.selection.HALF_SHARED (`tools/kernels.py check` compares them)
static_assert(SHARED_BYTES == 89472, "HALF_SHARED");
static_assert(W_AT % 4 == 0 && W_PITCH % 4 == 0, "16-byte ring rows");

}  // namespace half
}  // namespace spk

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

namespace spk {
namespace half {

__device__ __forceinline__ void run(const float* __restrict__ x, u64 x_len,
                                    const float* __restrict__ w, u64 w_len,
                                    const float* __restrict__ bias, u64 bias_len,
                                    float* __restrict__ partials, u64 p_len) {
    const u32 splits = gridDim.z;
    if (x_len != u64(ROWS) * EMBED_K | w_len != u64(EMBED_K / 2) * EMBED_COLS + EMBED_COLS |
        bias_len != EMBED_COLS | splits < MIN_SPLITS | splits > EMBED_MAX_SPLITS |
        p_len != u64(splits) * EMBED_OUTPUTS | !aligned16(x) | !aligned16(w) |
        !aligned16(partials) | dynamic_shared_bytes() != SHARED_BYTES |
        !launch_is(1, EMBED_COLS / COLS, splits, THREADS)) {
        return;
    }
    extern __shared__ __align__(16) float smem[];
    const saddr base = shared_address(smem);
    const u32* const pairs = reinterpret_cast<const u32*>(w);

    const u32 t = threadIdx.x;
    const u32 z = blockIdx.z;
    const u32 col0 = blockIdx.y * COLS;
    const u32 first = z * UNITS / splits;
    const u32 units = (z + 1) * UNITS / splits - first;

    // unit i of the slice: pair rows (first + i) 16 .. + 16 of this block's columns
    auto issue = [&](u32 i) {
        const saddr at = base + 4 * (W_AT + (i % RING) * W_STAGE);
#pragma unroll
        for (u32 j = 0; j < 2; ++j) {
            const u32 copy = t + j * THREADS;  // 512 copies of 16 bytes
            if (copy < UNIT / 2 * COLS / 4) {
                const u32 r = copy / (COLS / 4);
                const u32 v = copy % (COLS / 4);
                const u32 pair = (first + i) * (UNIT / 2) + r;
                cp_async16_fill(at + 4 * (r * W_PITCH + 4 * v),
                                reinterpret_cast<const float*>(pairs + pair * EMBED_COLS + col0) +
                                    4 * v,
                                16);
            }
        }
    };
#pragma unroll
    for (u32 i = 0; i < RING - 1; ++i) {
        if (i < units) {
            issue(i);
        }
        cp_async_commit();
    }

    // x: thread t loads float4 t % 4 + 4 j of row t / 4's slice
    {
        const u32 row = t / 4;
        const u32 part = t % 4;
        const float* source = x + row * EMBED_K + first * UNIT;
        float4 v[MAX_UNITS * UNIT / 16];
        float largest = 0.0f;
#pragma unroll
        for (u32 j = 0; j < MAX_UNITS * UNIT / 16; ++j) {
            const u32 quad = part + 4 * j;
            v[j] = quad < units * UNIT / 4 ? load4(source + 4 * quad) : make_float4(0, 0, 0, 0);
            largest = fmaxf(largest, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)),
                                           fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
        }
        largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 1));
        largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 2));
        float scale, inverse;
        half_scale_of(largest, scale, inverse);
        const saddr to = base + 4 * (X_AT + row * X_PITCH);
#pragma unroll
        for (u32 j = 0; j < MAX_UNITS * UNIT / 16; ++j) {
            const u32 quad = part + 4 * j;
            if (quad < units * UNIT / 4) {
                const u32 low = f16_pair(v[j].x * scale, v[j].y * scale);
                const u32 high = f16_pair(v[j].z * scale, v[j].w * scale);
                sts2(to + 4 * 2 * quad, __uint_as_float(low), __uint_as_float(high));
            }
        }
        if (part == 0) {
            smem[row] = inverse;
        }
    }

    const u32 lane = t % 32;
    const u32 group = t / GROUP;
    const u32 warp = t % GROUP / 32;
    const u32 wr = warp / 2, wc = warp % 2;
    const u32 g = lane / 4, q = lane % 4;
    float acc[2][8][4];
    zero(acc);
    const saddr a_at = base + 4 * (X_AT + (wr * 32 + g) * X_PITCH + group * 8 + q);
    const u32 b_at = 4 * ((group * 8 + q) * W_PITCH + wc * 64 + g);

#pragma unroll 1
    for (u32 i = 0; i < units; ++i) {
        cp_async_wait<RING - 2>();
        __syncthreads();  // also publishes the x slice before the first unit
        if (i + RING - 1 < units) {
            issue(i + RING - 1);
        }
        cp_async_commit();
        const saddr a = a_at + 4 * i * (UNIT / 2);
        uint4 frag[2];
#pragma unroll
        for (u32 m = 0; m < 2; ++m) {
            const saddr r = a + 4 * m * 16 * X_PITCH;
            frag[m] = make_uint4(__float_as_uint(lds1(r)), __float_as_uint(lds1(r + 4 * 8 * X_PITCH)),
                                 __float_as_uint(lds1(r + 4 * 4)),
                                 __float_as_uint(lds1(r + 4 * (8 * X_PITCH + 4))));
        }
        const saddr b = base + 4 * (W_AT + (i % RING) * W_STAGE) + b_at;
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const u32 b0 = __float_as_uint(lds1(b + 4 * j * 8));
            const u32 b1 = __float_as_uint(lds1(b + 4 * (4 * W_PITCH + j * 8)));
#pragma unroll
            for (u32 m = 0; m < 2; ++m) {
                mma_f16(acc[m][j], frag[m], b0, b1);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // group 1 hands its sums over (the region held the x slice and the ring), group 0
    // adds them, unscales and stores plane z
    const saddr red = base + 4 * X_AT + 16 * (t % GROUP);
    if (group == 1) {
#pragma unroll
        for (u32 i = 0; i < 2; ++i) {
#pragma unroll
            for (u32 j = 0; j < 8; ++j) {
                const float* v = acc[i][j];
                sts4(red + 16 * GROUP * (i * 8 + j), make_float4(v[0], v[1], v[2], v[3]));
            }
        }
    }
    __syncthreads();
    if (group == 1) {
        return;
    }
    float* const plane = partials + u64(z) * EMBED_OUTPUTS;
#pragma unroll
    for (u32 i = 0; i < 2; ++i) {
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const float4 other = lds4(red + 16 * GROUP * (i * 8 + j));
            const float sum[4] = {acc[i][j][0] + other.x, acc[i][j][1] + other.y,
                                  acc[i][j][2] + other.z, acc[i][j][3] + other.w};
            const u32 col = col0 + wc * 64 + j * 8 + 2 * q;
            const int c0 = exponent_of(__ldg(w + (EMBED_K / 2) * EMBED_COLS + col));
            const int c1 = exponent_of(__ldg(w + (EMBED_K / 2) * EMBED_COLS + col + 1));
#pragma unroll
            for (u32 h = 0; h < 2; ++h) {
                const u32 row = wr * 32 + i * 16 + g + 8 * h;
                const int r = exponent_of(smem[row]);
                float a0, a1, b0, b1;
                pow2_halves(r + c0, a0, a1);
                pow2_halves(r + c1, b0, b1);
                stg2(plane + row * EMBED_COLS + col,
                     make_float2(sum[2 * h] * a0 * a1, sum[2 * h + 1] * b0 * b1));
            }
        }
    }
}

}  // namespace half
}  // namespace spk

#define SPK_HALF_BODY() spk::half::run(x, x_len, w, w_len, bias, bias_len, y, y_len)
#else
#define SPK_HALF_BODY() SPK_TIER_STUB()
#endif

SPK_DENSE_KERNEL(spk_segdense_embed_b32_f16, spk::half::THREADS, 1, SPK_HALF_BODY())

#undef SPK_HALF_BODY
