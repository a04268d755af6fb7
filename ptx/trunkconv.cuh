// The ResNet34 trunk's convolutions as implicit GEMMs on tensor cores (sm80 tier).
//
// Layout: activations NHWC (channels innermost), FP32; weights as FP16 pair words
// [k / 2][co][high, low] with BatchNorm folded in (the plan's bias), k = tap * CIN + ci,
// so one reduction step of 16 input channels of one tap is a contiguous 64-byte run of
// every output position's input pixel.
//
// GEMM: rows = output positions (item, ho, wo), columns = output channels, reduction
// k = (ky * KS + kx) * CIN + ci. A block owns 256 positions by BN channels (BN = 64, or
// 32 where the layer has 32), eight or four warps of 64 positions x 32 channels, each a
// 4 x 4 grid of m16n8k16 tiles. Stages of 16 reduction elements flow through a
// CONV_STAGES-deep cp.async ring; padding and positions past the batch's items are
// zero-filled copies that read nothing.
//
// Maths, on FP16 products (twice TF32's mma.sync rate: 620 against 310 TFLOPS measured):
// every operand is scaled by a power of two into FP16's range, so the scaling itself is
// exact. A weight column n is scaled at plan time by 2^s_n, putting its largest
// magnitude in [2^14, 2^15). An activation row is scaled by its chunk's own power of
// two, from the largest magnitude of that chunk's input (in_max, written by the layer
// that produced it), into the same range: chunks at any level keep their own accuracy.
// SPLIT (FP32 math) splits both operands into an FP16 high part and the FP16 rounding of
// the residual (the weights on the host from float64; the activations here), about 22
// significant bits each as in 3xTF32, and takes three products a_lo b_hi, a_hi b_lo,
// a_hi b_hi. Plain (TF32 math) takes a_hi b_hi: 11 significant bits per operand, TF32's.
// Values below 2^-38 of their chunk's (or column's) largest fall into FP16's subnormals
// and keep fewer bits: their absolute error stays below 2^-39 of the largest.
//
// Sums (SPLIT): each stage's products go to a fresh accumulator that is then added to
// the running sum in FP32 (round to nearest). The tensor cores align an mma's products to
// its largest term, the accumulator included, and drop the bits below: adding straight
// into a running sum that has grown over K = 288..2304 terms measured 9-13x cuDNN
// FP32's error per layer with 3xTF32 (docs/performance.md). Plain adds straight into
// the running sum: there the operands' rounding dominates. Every sum runs in a fixed
// order (k ascending; then scales, + bias, + residual), so a run's bits repeat.
//
// Epilogue: the sum times the row's and the column's inverse scales (exact), + bias,
// + residual (NHWC, the block's shortcut), ReLU where flags bit 0 is set; flags bit 1
// writes the output NCHW (the trunk's last layer, for the pooling). Where out_max is
// given, each chunk's largest output magnitude is raised into it with atomicMax on the
// float bits (order-free, so deterministic): the next layer's in_max.

#pragma once

#include "common.cuh"
#include "sm80.cuh"

namespace spk {

constexpr u32 TRUNK_BATCH = 32;
constexpr u32 TRUNK_BINS = 80;      // fbank mel bins: the trunk's height
constexpr u32 TRUNK_FRAMES = 998;   // fbank frames of a 10 s chunk: the trunk's width
constexpr u32 CONV_BM = 256;        // output positions per block
constexpr u32 CONV_BK = 16;         // reduction elements per stage
constexpr u32 CONV_STAGES = 3;
constexpr u32 CONV_RELU = 1;  // epilogue flags
constexpr u32 CONV_NCHW = 2;

template <u32 CIN_, u32 COUT_, u32 HIN_, u32 WIN_, u32 STRIDE_, u32 KS_>
struct ConvShape {
    static constexpr u32 CIN = CIN_, COUT = COUT_, HIN = HIN_, WIN = WIN_;
    static constexpr u32 STRIDE = STRIDE_, KS = KS_, PAD = KS_ / 2;
    static constexpr u32 HOUT = (HIN + 2 * PAD - KS) / STRIDE + 1;
    static constexpr u32 WOUT = (WIN + 2 * PAD - KS) / STRIDE + 1;
    static constexpr u32 POS = HOUT * WOUT;  // output positions per item
    static constexpr u32 K = KS * KS * CIN;
    static constexpr u32 KTILES = K / CONV_BK;
    static constexpr u32 CBLOCKS = CIN / CONV_BK;  // stages per tap
    static constexpr u32 BN = COUT < 64 ? COUT : 64;
    static constexpr u32 THREADS = 4 * BN;   // 4 x (BN / 32) warps
    // Row strides in words. The fragment reads are 8-byte pairs, served per half warp:
    // 24 puts the A reads (row g, column 2 t) of a half warp in 32 distinct banks
    // (24 g + 2 t mod 32), 2 BN + 8 the B reads (row t, column pair g: 8 t + 2 g).
    static constexpr u32 A_STRIDE = CONV_BK + 8, B_STRIDE = 2 * BN + 8;
    static constexpr u32 STAGE_WORDS = CONV_BM * A_STRIDE + CONV_BK / 2 * B_STRIDE;
    static constexpr u32 SHARED = CONV_STAGES * STAGE_WORDS * 4;
    static constexpr u32 A_COPIES = CONV_BM * 4 / THREADS;  // 16-byte copies per thread
    static constexpr u64 X_ITEM = u64(HIN) * WIN * CIN, Y_ITEM = u64(POS) * COUT;
    static constexpr u32 GRID_X = (TRUNK_BATCH * POS + CONV_BM - 1) / CONV_BM;
    static constexpr u32 GRID_Y = COUT / BN;
    static_assert(CIN % CONV_BK == 0 && COUT % 32 == 0, "channel counts the tiles divide");
    static_assert(POS > CONV_BM, "a block's rows span at most two items");
    static_assert(u64(TRUNK_BATCH) * HIN * WIN * CIN < (1ull << 31), "32-bit offsets");
};

// Raises maxima[item] and maxima[item + 1] to the largest of this warp's `first` and
// `second` (magnitudes, as float bits: their order is the unsigned one). Every lane of
// the warp calls it; an item at or past `items` is left alone.
__device__ __forceinline__ void raise_chunk_maxima(u32* maxima, u32 item, u32 items, float first,
                                                   float second) {
#pragma unroll
    for (u32 d = 1; d < 32; d *= 2) {
        first = fmaxf(first, __shfl_xor_sync(0xffffffffu, first, d));
        second = fmaxf(second, __shfl_xor_sync(0xffffffffu, second, d));
    }
    if ((threadIdx.x & 31) == 0) {
        if (item < items) {
            atomicMax(maxima + item, __float_as_uint(first));
        }
        if (item + 1 < items) {
            atomicMax(maxima + item + 1, __float_as_uint(second));
        }
    }
}

}  // namespace spk

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

namespace spk {

// (a, b) rounded to FP16 as one pair word (`high`), and the pair of their residuals
// a - high, b - high (exact in FP32) rounded to FP16 (`low`).
__device__ __forceinline__ void f16_split(float a, float b, u32& high, u32& low) {
    high = f16_pair(a, b);
    float ha, hb;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
        : "=f"(ha), "=f"(hb)
        : "r"(high));
    low = f16_pair(a - ha, b - hb);
}

template <class S, bool SPLIT>
__device__ __forceinline__ void trunk_conv(const float* __restrict__ x, u64 x_len,
                                           const float* __restrict__ w, u64 w_len,
                                           const float* __restrict__ bias, u64 bias_len,
                                           const float* __restrict__ residual, u64 residual_len,
                                           float* __restrict__ y, u64 y_len,
                                           const u32* __restrict__ in_max, u64 in_max_len,
                                           u32* __restrict__ out_max, u64 out_max_len, u32 items,
                                           u32 flags) {
    const bool valid = launch_is(S::GRID_X, S::GRID_Y, 1, S::THREADS) & (items >= 1) &
                       (items <= TRUNK_BATCH) & (x_len >= items * S::X_ITEM) &
                       (w_len == u64(S::K) * S::COUT) & (bias_len == 2 * S::COUT) &
                       ((residual_len == 0) | (residual_len >= items * S::Y_ITEM)) &
                       (y_len >= items * S::Y_ITEM) & (in_max_len >= items) &
                       ((out_max_len == 0) | (out_max_len >= items)) & (flags < 4) &
                       aligned16(x) & aligned16(w) & aligned16(residual) & aligned16(y) &
                       (dynamic_shared_bytes() >= S::SHARED);
    const u32 rows = items * S::POS;
    const u32 m0 = blockIdx.x * CONV_BM;
    if (!valid | (m0 >= rows)) {
        return;  // uniform over the block: no barrier is split
    }
    extern __shared__ __align__(16) float shared[];
    const saddr base = shared_address(shared);
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 g = lane >> 2, t = lane & 3;
    const u32 wm = warp & 3, wn = warp >> 2;
    const u32 n0 = blockIdx.y * S::BN;

    // This thread's A copies: one 16-byte chunk (4 channels) of A_COPIES positions.
    // Offsets are of the tap (0, 0) pixel; a row past the items gets an origin no tap
    // reaches, so its copies are zero fills.
    const u32 chunk = tid & 3;
    int origin[S::A_COPIES];
    int corner_h[S::A_COPIES], corner_w[S::A_COPIES];
#pragma unroll
    for (u32 i = 0; i < S::A_COPIES; ++i) {
        const u32 m = m0 + tid / 4 + i * (S::THREADS / 4);
        const u32 item = m / S::POS, p = m % S::POS;
        const int h = int(p / S::WOUT) * int(S::STRIDE) - int(S::PAD);
        const int v = int(p % S::WOUT) * int(S::STRIDE) - int(S::PAD);
        corner_h[i] = m < rows ? h : -int(S::HIN) - 8;
        corner_w[i] = v;
        origin[i] = ((int(item) * int(S::HIN) + h) * int(S::WIN) + v) * int(S::CIN) + int(chunk) * 4;
    }
    // This thread's B copy: one 16-byte run (two columns' high and low pair words).
    const u32 b_row = tid / (S::BN / 2), b_col = (tid % (S::BN / 2)) * 4;

    auto load_stage = [&](u32 kt) {
        const u32 slot = kt % CONV_STAGES;
        const saddr a_base = base + slot * S::STAGE_WORDS * 4;
        const saddr b_base = a_base + CONV_BM * S::A_STRIDE * 4;
        const u32 tap = kt / S::CBLOCKS, cb = kt % S::CBLOCKS;
        const int dy = int(tap / S::KS), dx = int(tap % S::KS);
        const int offset = (dy * int(S::WIN) + dx) * int(S::CIN) + int(cb * CONV_BK);
#pragma unroll
        for (u32 i = 0; i < S::A_COPIES; ++i) {
            const u32 r = tid / 4 + i * (S::THREADS / 4);
            const bool inside = (u32(corner_h[i] + dy) < S::HIN) & (u32(corner_w[i] + dx) < S::WIN);
            const float* source = inside ? x + (origin[i] + offset) : x;
            cp_async16_fill(a_base + (r * S::A_STRIDE + chunk * 4) * 4, source, inside ? 16 : 0);
        }
        const float* source = w + u64(kt * CONV_BK / 2 + b_row) * (2 * S::COUT) + 2 * n0 + b_col;
        cp_async16_fill(b_base + (b_row * S::B_STRIDE + b_col) * 4, source, 16);
    };

    // The scales of this thread's fragment rows (wm * 64 + mi * 16 + 8 * half + g): the
    // power of two that puts the row's chunk's largest input in [2^14, 2^15).
    float row_scale[4][2];
#pragma unroll
    for (u32 mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (u32 half = 0; half < 2; ++half) {
            const u32 m = m0 + wm * 64 + mi * 16 + half * 8 + g;
            const float largest = m < rows ? __uint_as_float(__ldg(in_max + m / S::POS)) : 0.0f;
            float inverse;
            half_scale_of(largest, row_scale[mi][half], inverse);
        }
    }

    float acc[4][4][4];
    zero(acc);
#pragma unroll
    for (u32 s = 0; s < CONV_STAGES - 1; ++s) {
        if (s < S::KTILES) {
            load_stage(s);
        }
        cp_async_commit();  // one group per slot, even empty: wait<STAGES-2> stays exact
    }
#pragma unroll 1
    for (u32 kt = 0; kt < S::KTILES; ++kt) {
        cp_async_wait<CONV_STAGES - 2>();
        __syncthreads();  // stage kt landed for all; slot (kt - 1) % STAGES is free
        if (kt + CONV_STAGES - 1 < S::KTILES) {
            load_stage(kt + CONV_STAGES - 1);
        }
        cp_async_commit();
        const saddr a_base = base + (kt % CONV_STAGES) * S::STAGE_WORDS * 4;
        const saddr b_base = a_base + CONV_BM * S::A_STRIDE * 4;
        uint4 a_hi[4], a_lo[SPLIT ? 4 : 1];
#pragma unroll
        for (u32 mi = 0; mi < 4; ++mi) {
            // a0..a3: (row g, k 2t), (row g + 8, k 2t), (row g, k 2t + 8), (row g + 8, k 2t + 8)
            const saddr at = a_base + ((wm * 64 + mi * 16 + g) * S::A_STRIDE + 2 * t) * 4;
            const float2 v[4] = {lds2(at), lds2(at + 8 * S::A_STRIDE * 4), lds2(at + 32),
                                 lds2(at + 8 * S::A_STRIDE * 4 + 32)};
            u32 hi[4], lo[4];
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                const float s = row_scale[mi][j & 1];
                if constexpr (SPLIT) {
                    f16_split(v[j].x * s, v[j].y * s, hi[j], lo[j]);
                } else {
                    hi[j] = f16_pair(v[j].x * s, v[j].y * s);
                }
            }
            a_hi[mi] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            if constexpr (SPLIT) {
                a_lo[mi] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            }
        }
#pragma unroll
        for (u32 nj = 0; nj < 4; ++nj) {
            // b0: k pair t, b1: k pair t + 4, of column g; each word pair is (high, low)
            const saddr bt = b_base + (t * S::B_STRIDE + 2 * (wn * 32 + nj * 8 + g)) * 4;
            const float2 b0 = lds2(bt), b1 = lds2(bt + 4 * S::B_STRIDE * 4);
            const u32 h0 = __float_as_uint(b0.x), h1 = __float_as_uint(b1.x);
            if constexpr (SPLIT) {
                float part[4][4];  // this stage's fresh sums of the column tile
                zero(part);
#pragma unroll
                for (u32 mi = 0; mi < 4; ++mi) {
                    mma_f16(part[mi], a_lo[mi], h0, h1);
                    mma_f16(part[mi], a_hi[mi], __float_as_uint(b0.y), __float_as_uint(b1.y));
                    mma_f16(part[mi], a_hi[mi], h0, h1);
#pragma unroll
                    for (u32 e = 0; e < 4; ++e) {
                        acc[mi][nj][e] += part[mi][e];
                    }
                }
            } else {
#pragma unroll
                for (u32 mi = 0; mi < 4; ++mi) {
                    mma_f16(acc[mi][nj], a_hi[mi], h0, h1);
                }
            }
        }
    }
    cp_async_wait<0>();

    float2 bias_pair[4], column_inverse[4];
#pragma unroll
    for (u32 nj = 0; nj < 4; ++nj) {
        const u32 n = n0 + wn * 32 + nj * 8 + 2 * t;
        bias_pair[nj] = __ldg(reinterpret_cast<const float2*>(bias + n));
        column_inverse[nj] = __ldg(reinterpret_cast<const float2*>(bias + S::COUT + n));
    }
    const bool relu = flags & CONV_RELU, nchw = flags & CONV_NCHW;
    const u32 first_item = m0 / S::POS;
    float largest_first = 0.0f, largest_next = 0.0f;  // of first_item's rows, the next item's
#pragma unroll
    for (u32 mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (u32 half = 0; half < 2; ++half) {
            const u32 m = m0 + wm * 64 + mi * 16 + half * 8 + g;
            if (m >= rows) {
                continue;
            }
            const u32 item = m / S::POS;
            // 1 / the scale, exact: for a normal power of two 2^e the bits of 2^-e are
            // (254 << 23) - its bits
            const float row_inverse = __uint_as_float((254u << 23) - __float_as_uint(row_scale[mi][half]));
#pragma unroll
            for (u32 nj = 0; nj < 4; ++nj) {
                const u32 n = n0 + wn * 32 + nj * 8 + 2 * t;
                float v0 = fmaf(acc[mi][nj][2 * half] * row_inverse, column_inverse[nj].x,
                                bias_pair[nj].x);
                float v1 = fmaf(acc[mi][nj][2 * half + 1] * row_inverse, column_inverse[nj].y,
                                bias_pair[nj].y);
                if (residual_len != 0) {
                    const float2 r = __ldg(reinterpret_cast<const float2*>(residual + m * S::COUT + n));
                    v0 += r.x;
                    v1 += r.y;
                }
                if (relu) {
                    v0 = fmaxf(v0, 0.0f);
                    v1 = fmaxf(v1, 0.0f);
                }
                const float big = fmaxf(fabsf(v0), fabsf(v1));
                if (item == first_item) {
                    largest_first = fmaxf(largest_first, big);
                } else {
                    largest_next = fmaxf(largest_next, big);
                }
                if (nchw) {
                    y[(item * S::COUT + n) * S::POS + m % S::POS] = v0;
                    y[(item * S::COUT + n + 1) * S::POS + m % S::POS] = v1;
                } else {
                    stg2(y + m * S::COUT + n, make_float2(v0, v1));
                }
            }
        }
    }
    if (out_max_len != 0) {
        raise_chunk_maxima(out_max, first_item, items, largest_first, largest_next);
    }
}

}  // namespace spk

#endif
