// linear1_b1's two bodies (entry in seglinear.cuh): float64 accumulation where FP64 runs
// at half the FP32 rate (`linear1_b1_f64`), else a compensated float32 (hi, lo) pair per
// slice (`linear1_b1_compensated`, also the sm75 tier's). Both keep the batch-1 tiles,
// slices and warp regions of seglinear_b1.cuh.

#pragma once

#include "common.cuh"
#include "linear.cuh"
#include "model.cuh"
#include "seglinear_b1.cuh"

namespace spk {
namespace lin {

// ---------------------------------------------------------------------------------------
// linear1 batch 1, compensated: the result is (nearly) the float64 value rounded once.
//
// Per slice (32 k) and output, take a power of two sigma >= 3 B, where B >= |every
// partial sum| (and |every product|). The running value S starts at sigma; each term does
//     s' = fma(a, b, S)    one rounding; S and s' stay within sigma +- B (+ 2^-18 sigma)
//     z  = s' - S          exact (Sterbenz: s' and S within a factor 2 of each other)
//     t  = fma(a, b, -z)   = S + a b - s', the rounding error of s' (itself rounded only
//                          below 2^-48 sigma)
//     lo += t,  S = s'
// so hi = S - sigma is exact and hi + lo is the slice sum to about 2^-45 sigma: the
// accuracy class of Dot2 (TwoProduct + TwoSum, ten operations a term) at four.
// B = L1(x row over the slice) * max|w column over the slice| (the L1 side on the
// activations, whose max is far above their mean). sigma = the power of two above
// 3.25 B, between 3.25 B and 6.5 B. Where that is not a finite normal float (huge
// operands, Inf, NaN) the lane falls back to Dot2 itself; where it is tiny, sigma is
// raised to 2^-102, which only moves more of the sum into lo.
// The four slice pairs, then the bias, are joined by TwoSum, the lo parts summed
// apart, and the result rounded once.
// ---------------------------------------------------------------------------------------

constexpr float SIGMA_RATIO = 3.25f;  // > 3 with room for the 2^-18 drift of S
constexpr int SIGMA_MIN_EXP = 25;     // 2^-102: ulp(sigma) / 2 is still normal
constexpr int SIGMA_MAX_EXP = 254;

__device__ __forceinline__ void two_sum(float a, float b, float& s, float& e) {
    s = __fadd_rn(a, b);
    const float bb = __fsub_rn(s, a);
    const float aa = __fsub_rn(s, bb);
    e = __fadd_rn(__fsub_rn(a, aa), __fsub_rn(b, bb));
}

__device__ __forceinline__ void anchored_step(float a, float b, float& hi, float& lo) {
    const float s = fmaf(a, b, hi);
    const float z = __fsub_rn(s, hi);
    lo = __fadd_rn(lo, fmaf(a, b, -z));
    hi = s;
}

__device__ __forceinline__ void dot2_step(float a, float b, float& hi, float& lo) {
    const float p = __fmul_rn(a, b);
    const float pe = fmaf(a, b, -p);
    float s, e;
    two_sum(hi, p, s, e);
    lo = __fadd_rn(lo, __fadd_rn(e, pe));
    hi = s;
}

__device__ __forceinline__ int biased_exponent(float v) {
    return int(__float_as_uint(v) >> 23);  // v >= 0: no sign bit
}

template <bool ANCHORED, u32 KS>
__device__ __forceinline__ void compensated_products(saddr x_get, saddr w_get, u32 rq,
                                                     float (&hi)[4][4], float (&lo)[4][4]) {
#pragma unroll 2
    for (u32 q = 0; q < KS / 4; ++q) {
        float4 a[4], b[4];
        operands<KS>(x_get, w_get, q, rq, a, b);
#pragma unroll
        for (u32 kk = 0; kk < 4; ++kk) {
#pragma unroll
            for (u32 i = 0; i < 4; ++i) {
                const float av = lane_of(a[i], kk);
#pragma unroll
                for (u32 j = 0; j < 4; ++j) {
                    if (ANCHORED) {
                        anchored_step(av, lane_of(b[kk], j), hi[i][j], lo[i][j]);
                    } else {
                        dot2_step(av, lane_of(b[kk], j), hi[i][j], lo[i][j]);
                    }
                }
            }
        }
    }
}

__device__ __forceinline__ void linear1_b1_compensated(const float* __restrict__ x, u64 x_len,
                                                       const float* __restrict__ w, u64 w_len,
                                                       const float* __restrict__ bias,
                                                       u64 bias_len, float* __restrict__ y,
                                                       u64 y_len, float* smem) {
    constexpr u32 K = 128;
    constexpr u32 KS = K / B1_WARPS;  // 32: one chunk per warp
    constexpr u32 REGION = (B1_ROWS + B1_COLS) * KS;
    static_assert(2 * B1_ROWS * B1_COLS <= REGION, "hi and lo partials fit the region");
    if (!b1_shape_ok<K>(x, x_len, w, w_len, bias, bias_len, y, y_len)) {
        return;
    }
    // smem: B1_WARPS * REGION floats of the caller's shared memory

    const u32 warp = threadIdx.x >> 5;
    const u32 lane = threadIdx.x & 31;
    const u32 row0 = blockIdx.x * B1_ROWS;
    const u32 col0 = blockIdx.y * B1_COLS;
    float* xs = smem + warp * REGION;
    float* ws = xs + B1_ROWS * KS;

    // Lane (rq, cq) holds x rows rq + 4 j and w columns 4 cq + {0..3} of the slice:
    // exactly the rows and columns of its own outputs, so its bounds need no exchange
    // beyond the lanes that share them.
    static_assert(KS == Chunk<K>::SK, "one chunk per slice");
    Chunk<K> stage;
    stage.fetch(x, w, row0, col0, warp * KS, lane);
    loads_issued();
    const u32 rq = lane >> 3;
    const u32 cq = lane & 7;

    float l1[4];  // SIGMA_RATIO * L1 of x rows rq + 4 i over the slice
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
        const float4 v = stage.xv[i];
        float m = (fabsf(v.x) + fabsf(v.y)) + (fabsf(v.z) + fabsf(v.w));
#pragma unroll
        for (u32 mask = 1; mask < 8; mask <<= 1) {
            m += __shfl_xor_sync(0xffffffffu, m, mask);
        }
        l1[i] = m * SIGMA_RATIO;
    }
    float4 cm = make_float4(0.f, 0.f, 0.f, 0.f);  // max |w| of columns 4 cq + {0..3}
#pragma unroll
    for (u32 j = 0; j < Chunk<K>::WN; ++j) {
        cm.x = fmaxf(cm.x, fabsf(stage.wv[j].x));
        cm.y = fmaxf(cm.y, fabsf(stage.wv[j].y));
        cm.z = fmaxf(cm.z, fabsf(stage.wv[j].z));
        cm.w = fmaxf(cm.w, fabsf(stage.wv[j].w));
    }
#pragma unroll
    for (u32 mask = 8; mask < 32; mask <<= 1) {
        cm.x = fmaxf(cm.x, __shfl_xor_sync(0xffffffffu, cm.x, mask));
        cm.y = fmaxf(cm.y, __shfl_xor_sync(0xffffffffu, cm.y, mask));
        cm.z = fmaxf(cm.z, __shfl_xor_sync(0xffffffffu, cm.z, mask));
        cm.w = fmaxf(cm.w, __shfl_xor_sync(0xffffffffu, cm.w, mask));
    }
    // biased exponent of sigma = that of the bound + 1 (the power of two above it)
    int se[4][4];
    int top = 0;
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
#pragma unroll
        for (u32 j = 0; j < 4; ++j) {
            se[i][j] = biased_exponent(l1[i] * lane_of(cm, j)) + 1;
            top = max(top, se[i][j]);
        }
    }

    stage.template stash<KS>(xs, ws, 0, lane);
    __syncwarp();
    const saddr x_get = shared_address(xs + rq * KS);
    const saddr w_get = shared_address(ws + cq * 4);

    float hi[4][4], lo[4][4];
    // (NaN / Inf bounds give exponent 256)
    if (top <= SIGMA_MAX_EXP) {
        float sigma[4][4];
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                sigma[i][j] = __int_as_float(max(se[i][j], SIGMA_MIN_EXP) << 23);
                hi[i][j] = sigma[i][j];
                lo[i][j] = 0.0f;
            }
        }
        compensated_products<true, KS>(x_get, w_get, rq, hi, lo);
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                hi[i][j] = __fsub_rn(hi[i][j], sigma[i][j]);
            }
        }
    } else {
        zero(hi);
        zero(lo);
        compensated_products<false, KS>(x_get, w_get, rq, hi, lo);
    }
    __syncwarp();
    put_block(xs, rq, cq, hi);
    put_block(xs + B1_ROWS * B1_COLS, rq, cq, lo);
    __syncthreads();

    const u32 t = threadIdx.x;
    const u32 offset = (t >> 3) * B1_COLS + (t & 7) * 4;
    const u32 row = row0 + (t >> 3);
    const u32 col = col0 + (t & 7) * 4;
    const saddr part = shared_address(smem + offset);
    float4 h[B1_WARPS], l[B1_WARPS];
#pragma unroll
    for (u32 s = 0; s < B1_WARPS; ++s) {
        h[s] = lds4(part + 4 * (s * REGION));
        l[s] = lds4(part + 4 * (s * REGION + B1_ROWS * B1_COLS));
    }
    const float4 b4 = load4(bias + col);
    float out[4];
#pragma unroll
    for (u32 e = 0; e < 4; ++e) {
        float sum = lane_of(h[0], e);
        float err = lane_of(l[0], e);
#pragma unroll
        for (u32 s = 1; s < B1_WARPS; ++s) {
            float r;
            two_sum(sum, lane_of(h[s], e), sum, r);
            err = __fadd_rn(err, __fadd_rn(r, lane_of(l[s], e)));
        }
        float r;
        two_sum(sum, lane_of(b4, e), sum, r);
        err = __fadd_rn(err, r);
        out[e] = leaky(__fadd_rn(sum, err));
    }
    if (row < ITEM_ROWS) {
        store4(y + row * N + col, make_float4(out[0], out[1], out[2], out[3]));
    }
}

// ---------------------------------------------------------------------------------------
// linear1 batch 1 in float64 accumulation (the default on the sm80 tier, where the FP64
// pipe runs at half the FP32 rate on the data-centre parts the plans target).
//
// Every product of two floats is exact in float64, so each warp's slice sum is a
// sequential float64 fma chain over its 32 k (relative error <= 32 * 2^-53 of the sum
// of |terms|); the four slices and then the bias are added in float64 in a fixed order,
// and the result is rounded to float once. That is the accuracy class of the
// compensated float32 kernel above (2^-45 sigma) with no bounds, no fallback and a
// quarter of the issue slots per term: one DFMA instead of four FP32 operations.
// Operands are converted to float64 once, when staged: a warp's region holds
// xd[16][32] and wd[32][32] doubles (12 KiB; the block uses exactly 48 KiB).
// Lane (rq, cq) owns rows rq + 4 i and columns 2 cq + {0, 1} and 16 + 2 cq + {0, 1}:
// its two w reads per k cover one 256-byte row contiguously across the warp.
// xd keeps 16-byte slot s of row r at s ^ 2 (r & 3): the four rows one operand read
// hits land on distinct bank quads.
// ---------------------------------------------------------------------------------------

__device__ __forceinline__ void stsd4(double* p, float4 v) {
    stsd2(p, double(v.x), double(v.y));
    stsd2(p + 2, double(v.z), double(v.w));
}

__device__ __forceinline__ void linear1_b1_f64(const float* __restrict__ x, u64 x_len,
                                               const float* __restrict__ w, u64 w_len,
                                               const float* __restrict__ bias, u64 bias_len,
                                               float* __restrict__ y, u64 y_len,
                                               double* dsm) {
    constexpr u32 K = 128;
    constexpr u32 KS = K / B1_WARPS;  // 32: one chunk per warp
    constexpr u32 XD = B1_ROWS * KS;  // doubles of xd
    constexpr u32 REGION = XD + KS * B1_COLS;
    static_assert(KS == Chunk<K>::SK, "one chunk per slice");
    static_assert(B1_WORK_ROWS * B1_COLS <= REGION, "the partial tile fits");
    u32 row0, col0;
    if (!b1_shape_ok<K>(x, x_len, w, w_len, bias, bias_len, y, y_len) |
        !b1_work(row0, col0)) {
        return;
    }
    // dsm: B1_WARPS * REGION doubles of the caller's shared memory

    const u32 warp = threadIdx.x >> 5;
    const u32 lane = threadIdx.x & 31;
    double* xd = dsm + warp * REGION;
    double* wd = xd + XD;

    Chunk<K> stage;
    stage.fetch(x, w, row0, col0, warp * KS, lane);
    ExtraRows<K, KS> extra;
    extra.fetch(x, row0, warp * KS, lane);
    loads_issued();
    const u32 t = threadIdx.x;
    const float4 b4 = ldg4_now(bias + col0 + (t & 7) * 4);
    {
        // lane (hi, lo) holds x rows hi + 4 j, k 4 lo + {0..3}: slots 2 lo, 2 lo + 1
        // (row & 3 = hi); and w k rows hi + 4 j, columns 4 lo + {0..3}
        const u32 hi = lane >> 3;
        const u32 lo = lane & 7;
        const u32 sw = 2 * hi;
#pragma unroll
        for (u32 j = 0; j < Chunk<K>::XN; ++j) {
            double* rowp = xd + (hi + 4 * j) * KS;
            const float4 v = stage.xv[j];
            stsd2(rowp + 2 * ((2 * lo) ^ sw), double(v.x), double(v.y));
            stsd2(rowp + 2 * ((2 * lo + 1) ^ sw), double(v.z), double(v.w));
        }
#pragma unroll
        for (u32 j = 0; j < Chunk<K>::WN; ++j) {
            stsd4(wd + (hi + 4 * j) * B1_COLS + lo * 4, stage.wv[j]);
        }
    }
    __syncwarp();

    const u32 rq = lane >> 3;
    const u32 cq = lane & 7;
    const saddr x_get = shared_address(xd + rq * KS);
    const saddr w_get = shared_address(wd + 2 * cq);
    const u32 sw = 2 * rq;  // row & 3 = rq for every row rq + 4 i
    double acc[4][4];
    zero(acc);
#pragma unroll
    for (u32 q = 0; q < KS / 4; ++q) {
        dpair a[4][2], b[4][2];
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
            a[i][0] = ldsd2(x_get + 8 * (4 * i * KS + 2 * ((2 * q) ^ sw)));
            a[i][1] = ldsd2(x_get + 8 * (4 * i * KS + 2 * ((2 * q + 1) ^ sw)));
        }
#pragma unroll
        for (u32 kk = 0; kk < 4; ++kk) {
            b[kk][0] = ldsd2(w_get + 8 * ((4 * q + kk) * B1_COLS));
            b[kk][1] = ldsd2(w_get + 8 * ((4 * q + kk) * B1_COLS + 16));
        }
#pragma unroll
        for (u32 kk = 0; kk < 4; ++kk) {
#pragma unroll
            for (u32 i = 0; i < 4; ++i) {
                const dpair ap = a[i][kk >> 1];
                const double av = (kk & 1) ? ap.y : ap.x;
                acc[i][0] = dfma(av, b[kk][0].x, acc[i][0]);
                acc[i][1] = dfma(av, b[kk][0].y, acc[i][1]);
                acc[i][2] = dfma(av, b[kk][1].x, acc[i][2]);
                acc[i][3] = dfma(av, b[kk][1].y, acc[i][3]);
            }
        }
    }
    double extra_acc[2] = {0.0, 0.0};
    extra.products(shared_address(wd), lane, extra_acc);
    // the warp's operands are dead: its region takes its partial tile part[18][32]
    __syncwarp();
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
        double* rowp = xd + (rq + 4 * i) * B1_COLS;
        stsd2(rowp + 2 * cq, acc[i][0], acc[i][1]);
        stsd2(rowp + 16 + 2 * cq, acc[i][2], acc[i][3]);
    }
    stsd2(xd + (B1_ROWS + (lane >> 4)) * B1_COLS + extra.col(lane), extra_acc[0],
          extra_acc[1]);
    __syncthreads();

    // thread t: tile row t / 8, columns 4 (t % 8) + {0..3}; threads below 16 also
    // row 16 + t / 8
    auto finish = [&](u32 tile_row) {
        const u32 offset = tile_row * B1_COLS + (t & 7) * 4;
        const saddr part = shared_address(dsm + offset);
        dpair h[B1_WARPS][2];
#pragma unroll
        for (u32 s = 0; s < B1_WARPS; ++s) {
            h[s][0] = ldsd2(part + 8 * (s * REGION));
            h[s][1] = ldsd2(part + 8 * (s * REGION + 2));
        }
        double sum[4] = {h[0][0].x, h[0][0].y, h[0][1].x, h[0][1].y};
#pragma unroll
        for (u32 s = 1; s < B1_WARPS; ++s) {
            sum[0] += h[s][0].x;
            sum[1] += h[s][0].y;
            sum[2] += h[s][1].x;
            sum[3] += h[s][1].y;
        }
        const u32 row = row0 + tile_row;
        if (row < ITEM_ROWS) {
            const float4 out = make_float4(
                float(sum[0] + double(b4.x)), float(sum[1] + double(b4.y)),
                float(sum[2] + double(b4.z)), float(sum[3] + double(b4.w)));
            stg4(y + row * N + col0 + (t & 7) * 4,
                 make_float4(leaky(out.x), leaky(out.y), leaky(out.z), leaky(out.w)));
        }
    };
    finish(t >> 3);
    if (t < B1_EXTRA * 8) {
        finish(B1_ROWS + (t >> 3));
    }
}

// linear1 batch 1: float64 accumulation where FP64 runs at half the FP32 rate, else the
// compensated FP32 kernel (FP64 at 1/64 would make the consumer parts several times
// slower). Both bodies share one static region, sized for the float64 one (48 KiB).
__device__ __forceinline__ void linear1_b1(const float* __restrict__ x, u64 x_len,
                                           const float* __restrict__ w, u64 w_len,
                                           const float* __restrict__ bias, u64 bias_len,
                                           float* __restrict__ y, u64 y_len) {
    constexpr u32 KS = 128 / B1_WARPS;
    __shared__ __align__(16) double storage[B1_WARPS * (B1_ROWS * KS + KS * B1_COLS)];
    if (fp64_fast()) {
        linear1_b1_f64(x, x_len, w, w_len, bias, bias_len, y, y_len, storage);
    } else {
        linear1_b1_compensated(x, x_len, w, w_len, bias, bias_len, y, y_len,
                               reinterpret_cast<float*>(storage));
    }
}

}  // namespace lin
}  // namespace spk
