// The ResNet34 trunk's convolutions as implicit GEMMs on tensor cores (sm80 tier).
//
// Layout: activations NHWC (channels innermost), FP32, so one reduction step of 16
// input channels of one tap is a contiguous 64-byte run of every output position's input
// pixel. Weights (BatchNorm folded in, the plan's bias) as FP16 pair words, k = tap * CIN
// + ci, a word holding k = 2 p, 2 p + 1: per stage of 16 k and per column n, for t = 0..3
// the words high(p = t), high(p = t + 4) and, SPLIT, low(p = t), low(p = t + 4) that are
// lane t's b fragments, [K / 16][CO][4][4 or 2], read as one 16- or 8-byte load.
//
// GEMM: rows = output positions (item, ho, wo), columns = output channels, reduction
// k = (ky * KS + kx) * CIN + ci. A block owns 256 positions by BN channels (BN = 128, or
// the layer's 32 or 64): the wider the block, the fewer times the activations cross L2.
// Its warps own 32 positions x 64 channels in the 128-wide 3x3 layers, 64 x 32 elsewhere,
// each a grid of 16 m16n8k16 tiles. Stages of 16 reduction elements flow through a
// cp.async ring (ConvShape::STAGES deep); padding and positions past the batch's items
// are zero-filled copies that read nothing.
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
// Values below 2^-28 of their chunk's (or column's) largest, and low parts of values
// below 2^-17 of it, fall into FP16's subnormals and keep fewer bits: their absolute
// error stays below 2^-39 of the largest.
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
    static constexpr u32 BN = COUT < 128 ? COUT : 128;
    // Warp tiles of MI x NJ m16n8k16 tiles (16 accumulator tiles): 32 x 64 in the
    // 128-wide 3x3 layers, so a warp converts half the rows it would at 64 x 32 for the
    // same products; 64 x 32 elsewhere, where 32 x 64 spilled registers on sm_80 to
    // sm_120 (docs/performance.md).
    static constexpr u32 NJ = BN >= 128 && KS == 3 ? 8 : 4, MI = 16 / NJ;
    static constexpr u32 WARPS_M = CONV_BM / (16 * MI), WARPS_N = BN / (8 * NJ);
    static constexpr u32 THREADS = 32 * WARPS_M * WARPS_N;  // = 4 BN
    // 16 warps per SM: the blocks' registers (up to 128 per thread) allow no more. The
    // 32-wide layer's blocks of 4 warps keep two stages, so four fit an SM's shared
    // memory (with three, two fit: 885.9 us per launch in FP32 math against 643.9 for
    // the 64-wide layer with the same products).
    static constexpr u32 STAGES = BN == 32 ? 2 : CONV_STAGES;
    static constexpr u32 MIN_BLOCKS = 512 / THREADS;
    // A row stride in words. The A fragment reads are 8-byte pairs, served per half warp:
    // 24 puts a half warp's (row g, column 2 t) in 32 distinct banks (24 g + 2 t mod 32).
    // The B reads are 16 bytes (8 with one product), served per quarter (half) warp:
    // 16 g + 4 t (8 g + 2 t) words cover the banks.
    static constexpr u32 A_STRIDE = CONV_BK + 8;
    static constexpr u32 STAGE_WORDS = CONV_BM * A_STRIDE + BN * CONV_BK;
    static constexpr u32 SHARED = STAGES * STAGE_WORDS * 4;
    static constexpr u32 A_COPIES = CONV_BM * 4 / THREADS;  // 16-byte copies per thread
    static constexpr u64 X_ITEM = u64(HIN) * WIN * CIN, Y_ITEM = u64(POS) * COUT;
    static constexpr u32 GRID_X = (TRUNK_BATCH * POS + CONV_BM - 1) / CONV_BM;
    static constexpr u32 GRID_Y = COUT / BN;
    static_assert(CIN % CONV_BK == 0 && COUT % 32 == 0, "channel counts the tiles divide");
    static_assert(THREADS == 4 * BN, "at most one B copy per thread");
    static_assert(POS > CONV_BM, "a block's rows span at most two items");
    static_assert(u64(TRUNK_BATCH) * HIN * WIN * CIN < (1ull << 31), "32-bit offsets");
};

// Raises maxima[item] and maxima[item + 1] to the largest of the block's `first` and
// `second` (magnitudes, as float bits: their order is the unsigned one), with at most one
// atomic per chunk and block: the same-address atomics of every warp measured 422 us in
// the stem at batch 32. A zero is skipped (the cleared maximum is already at least that);
// an item at or past `items` is left alone. Every thread of the block calls it.
template <u32 WARPS>
__device__ __forceinline__ void raise_chunk_maxima(u32* maxima, u32 item, u32 items, float first,
                                                   float second) {
    __shared__ float warps[2][WARPS];
    first = warp_max(first);
    second = warp_max(second);
    if ((threadIdx.x & 31) == 0) {
        warps[0][threadIdx.x >> 5] = first;
        warps[1][threadIdx.x >> 5] = second;
    }
    __syncthreads();
    if (threadIdx.x < 2) {  // thread 0 the first chunk, thread 1 the next
        float largest = 0.0f;
#pragma unroll
        for (u32 w = 0; w < WARPS; ++w) {
            largest = fmaxf(largest, warps[threadIdx.x][w]);
        }
        if ((item + threadIdx.x < items) & (largest > 0.0f)) {
            atomicMax(maxima + item + threadIdx.x, __float_as_uint(largest));
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
    constexpr u32 MI = S::MI, NJ = S::NJ;
    // words per column per stage: the four b words of each t (high pairs, then low),
    // or without SPLIT the two high ones
    constexpr u32 B_WORDS = SPLIT ? CONV_BK : CONV_BK / 2;
    const bool valid = launch_is(S::GRID_X, S::GRID_Y, 1, S::THREADS) & (items >= 1) &
                       (items <= TRUNK_BATCH) & (x_len >= items * S::X_ITEM) &
                       (w_len == u64(S::K) * S::COUT * B_WORDS / CONV_BK) & (bias_len == 2 * S::COUT) &
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
    const u32 row0 = (warp % S::WARPS_M) * 16 * MI, col0 = (warp / S::WARPS_M) * 8 * NJ;
    const u32 n0 = blockIdx.y * S::BN;

    // This thread's A copies: one 16-byte chunk (4 channels) of A_COPIES positions.
    // Offsets are of the tap (0, 0) pixel; a row past the items gets an origin no tap
    // reaches, so its copies are zero fills.
    // Bit tap of inside[i] is set where that tap of the copy's position is in the image.
    const u32 chunk = tid & 3;
    int origin[S::A_COPIES];
    u32 inside[S::A_COPIES];
#pragma unroll
    for (u32 i = 0; i < S::A_COPIES; ++i) {
        const u32 m = m0 + tid / 4 + i * (S::THREADS / 4);
        const u32 item = m / S::POS, p = m % S::POS;
        const int h = int(p / S::WOUT) * int(S::STRIDE) - int(S::PAD);
        const int v = int(p % S::WOUT) * int(S::STRIDE) - int(S::PAD);
        inside[i] = 0;
#pragma unroll
        for (u32 tap = 0; tap < S::KS * S::KS; ++tap) {
            const bool in = (u32(h + int(tap / S::KS)) < S::HIN) & (u32(v + int(tap % S::KS)) < S::WIN);
            inside[i] |= u32(in & (m < rows)) << tap;
        }
        origin[i] = ((int(item) * int(S::HIN) + h) * int(S::WIN) + v) * int(S::CIN) + int(chunk) * 4;
    }

    auto load_stage = [&](u32 kt) {
        const saddr a_base = base + (kt % S::STAGES) * S::STAGE_WORDS * 4;
        const saddr b_base = a_base + CONV_BM * S::A_STRIDE * 4;
        const u32 tap = kt / S::CBLOCKS, cb = kt % S::CBLOCKS;
        const int dy = int(tap / S::KS), dx = int(tap % S::KS);
        const int offset = (dy * int(S::WIN) + dx) * int(S::CIN) + int(cb * CONV_BK);
#pragma unroll
        for (u32 i = 0; i < S::A_COPIES; ++i) {
            const u32 r = tid / 4 + i * (S::THREADS / 4);
            const bool in = (inside[i] >> tap) & 1;
            const float* source = in ? x + (origin[i] + offset) : x;
            cp_async16_fill(a_base + (r * S::A_STRIDE + chunk * 4) * 4, source, in ? 16 : 0);
        }
        // B: one 16-byte run per thread (SPLIT) or per thread of the first half
        if (SPLIT || tid < S::THREADS / 2) {
            const float* source = w + (u64(kt) * S::COUT + n0) * B_WORDS + tid * 4;
            cp_async16_fill(b_base + tid * 16, source, 16);
        }
    };

    // The scales of this thread's fragment rows (row0 + mi * 16 + 8 * half + g): the
    // power of two that puts the row's chunk's largest input in [2^14, 2^15).
    float row_scale[MI][2];
#pragma unroll
    for (u32 mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (u32 half = 0; half < 2; ++half) {
            const u32 m = m0 + row0 + mi * 16 + half * 8 + g;
            const float largest = m < rows ? __uint_as_float(__ldg(in_max + m / S::POS)) : 0.0f;
            float inverse;
            half_scale_of(largest, row_scale[mi][half], inverse);
        }
    }

    float acc[MI][NJ][4];
    zero(acc);
#pragma unroll
    for (u32 s = 0; s < S::STAGES - 1; ++s) {
        if (s < S::KTILES) {
            load_stage(s);
        }
        cp_async_commit();  // one group per slot, even empty: wait<STAGES-2> stays exact
    }
#pragma unroll 1
    for (u32 kt = 0; kt < S::KTILES; ++kt) {
        cp_async_wait<S::STAGES - 2>();
        __syncthreads();  // stage kt landed for all; slot (kt - 1) % STAGES is free
        if (kt + S::STAGES - 1 < S::KTILES) {
            load_stage(kt + S::STAGES - 1);
        }
        cp_async_commit();
        const saddr a_base = base + (kt % S::STAGES) * S::STAGE_WORDS * 4;
        const saddr b_base = a_base + CONV_BM * S::A_STRIDE * 4;
        uint4 a_hi[MI], a_lo[SPLIT ? MI : 1];
#pragma unroll
        for (u32 mi = 0; mi < MI; ++mi) {
            // a0..a3: (row g, k 2t), (row g + 8, k 2t), (row g, k 2t + 8), (row g + 8, k 2t + 8)
            const saddr at = a_base + ((row0 + mi * 16 + g) * S::A_STRIDE + 2 * t) * 4;
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
        for (u32 nj = 0; nj < NJ; ++nj) {
            // column g's b0, b1 (k pairs t, t + 4): high (and low) as one read, 16 g + 4 t
            // or 8 g + 2 t words: each quarter (half) warp's reads cover the banks
            const saddr bt = b_base + ((col0 + nj * 8 + g) * B_WORDS + B_WORDS / 4 * t) * 4;
            const float4 b = SPLIT ? lds4(bt) : make_float4(0, 0, 0, 0);
            const float2 high = SPLIT ? make_float2(b.x, b.y) : lds2(bt);
            const u32 h0 = __float_as_uint(high.x), h1 = __float_as_uint(high.y);
            if constexpr (SPLIT) {
                float part[MI][4];  // this stage's fresh sums of the column tile
                zero(part);
#pragma unroll
                for (u32 mi = 0; mi < MI; ++mi) {
                    mma_f16(part[mi], a_lo[mi], h0, h1);
                    mma_f16(part[mi], a_hi[mi], __float_as_uint(b.z), __float_as_uint(b.w));
                    mma_f16(part[mi], a_hi[mi], h0, h1);
#pragma unroll
                    for (u32 e = 0; e < 4; ++e) {
                        acc[mi][nj][e] += part[mi][e];
                    }
                }
            } else {
#pragma unroll
                for (u32 mi = 0; mi < MI; ++mi) {
                    mma_f16(acc[mi][nj], a_hi[mi], h0, h1);
                }
            }
        }
    }
    cp_async_wait<0>();

    const bool relu = flags & CONV_RELU, nchw = flags & CONV_NCHW;
    const u32 first_item = m0 / S::POS;
    float largest_first = 0.0f, largest_next = 0.0f;  // of first_item's rows, the next item's
#pragma unroll
    for (u32 nj = 0; nj < NJ; ++nj) {
        const u32 n = n0 + col0 + nj * 8 + 2 * t;
        const float2 bias_pair = __ldg(reinterpret_cast<const float2*>(bias + n));
        const float2 column_inverse = __ldg(reinterpret_cast<const float2*>(bias + S::COUT + n));
#pragma unroll
        for (u32 mi = 0; mi < MI; ++mi) {
#pragma unroll
            for (u32 half = 0; half < 2; ++half) {
                const u32 m = m0 + row0 + mi * 16 + half * 8 + g;
                if (m >= rows) {
                    continue;
                }
                const u32 item = m / S::POS;
                // 1 / the scale, exact: for a normal power of two 2^e the bits of 2^-e
                // are (254 << 23) - its bits (derived, not kept: registers are the limit)
                const float row_inverse =
                    __uint_as_float((254u << 23) - __float_as_uint(row_scale[mi][half]));
                float v0 =
                    fmaf(acc[mi][nj][2 * half] * row_inverse, column_inverse.x, bias_pair.x);
                float v1 =
                    fmaf(acc[mi][nj][2 * half + 1] * row_inverse, column_inverse.y, bias_pair.y);
                if (residual_len != 0) {
                    const float2 r =
                        __ldg(reinterpret_cast<const float2*>(residual + m * S::COUT + n));
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
        raise_chunk_maxima<S::THREADS / 32>(out_max, first_item, items, largest_first, largest_next);
    }
}

}  // namespace spk

#endif
