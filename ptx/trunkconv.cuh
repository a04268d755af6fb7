// The ResNet34 trunk's convolutions as implicit GEMMs on tensor cores (sm80 tier).
//
// Layout: activations NHWC (channels innermost), weights [tap][ci][co] with BatchNorm
// folded in (the plan's bias), so one reduction step of 16 input channels of one tap is
// a contiguous 64-byte run of every output position's input pixel.
//
// GEMM: rows = output positions (item, ho, wo), columns = output channels, reduction
// k = (ky * KS + kx) * CIN + ci. A block owns 256 positions by BN channels (BN = 64, or
// 32 where the layer has 32), eight or four warps of 64 positions x 32 channels, each a
// 4 x 4 grid of m16n8k8 tiles. Stages of 16 reduction elements flow through a
// CONV_STAGES-deep cp.async ring; padding and positions past the batch's items are
// zero-filled copies that read nothing.
//
// Maths: TF32 rounds both operands (cvt.rna) and takes one product per tile. SPLIT
// (FP32 math) is 3xTF32: both operands split into a TF32 high part and the TF32
// rounding of the residual, three products a_lo b_hi, a_hi b_lo, a_hi b_hi into one FP32
// accumulator (mma_split): about 22 significant bits per operand, products and sums in
// FP32.
//
// Sums (SPLIT): each stage's products go to a fresh accumulator that is then added to
// the running sum in FP32 (round to nearest). The tensor cores align an mma's products to
// its largest term, the accumulator included, and drop the bits below: adding straight
// into a running sum that has grown over K = 288..2304 terms measured 9-13x cuDNN
// FP32's error per layer with 3xTF32 (docs/performance.md). TF32 adds straight into
// the running sum: there the operands' rounding dominates, and the fresh sums measured
// the same error at 1.3x the time. Every sum runs in a fixed
// order (k ascending; then + bias, + residual), so a run's bits repeat.
//
// Epilogue: + bias, + residual (NHWC, the block's shortcut), ReLU where flags bit 0 is
// set; flags bit 1 writes the output NCHW (the trunk's last layer, for the pooling).

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
    // Row strides in floats: 20 puts the A-fragment reads (row g, column t) of a warp in
    // 32 distinct banks (20 g + t mod 32), BN + 8 the B-fragment reads (8 t + g).
    static constexpr u32 A_STRIDE = CONV_BK + 4, B_STRIDE = BN + 8;
    static constexpr u32 STAGE_FLOATS = CONV_BM * A_STRIDE + CONV_BK * B_STRIDE;
    static constexpr u32 SHARED = CONV_STAGES * STAGE_FLOATS * 4;
    static constexpr u32 A_COPIES = CONV_BM * 4 / THREADS;  // 16-byte copies per thread
    static constexpr u64 X_ITEM = u64(HIN) * WIN * CIN, Y_ITEM = u64(POS) * COUT;
    static constexpr u32 GRID_X = (TRUNK_BATCH * POS + CONV_BM - 1) / CONV_BM;
    static constexpr u32 GRID_Y = COUT / BN;
    static_assert(CIN % CONV_BK == 0 && COUT % 32 == 0, "channel counts the tiles divide");
    static_assert(u64(TRUNK_BATCH) * HIN * WIN * CIN < (1ull << 31), "32-bit offsets");
};

}  // namespace spk

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

namespace spk {

template <class S, bool SPLIT>
__device__ __forceinline__ void trunk_conv(const float* __restrict__ x, u64 x_len,
                                           const float* __restrict__ w, u64 w_len,
                                           const float* __restrict__ bias, u64 bias_len,
                                           const float* __restrict__ residual, u64 residual_len,
                                           float* __restrict__ y, u64 y_len, u32 items,
                                           u32 flags) {
    const bool valid = launch_is(S::GRID_X, S::GRID_Y, 1, S::THREADS) & (items >= 1) &
                       (items <= TRUNK_BATCH) & (x_len >= items * S::X_ITEM) &
                       (w_len == u64(S::K) * S::COUT) & (bias_len == S::COUT) &
                       ((residual_len == 0) | (residual_len >= items * S::Y_ITEM)) &
                       (y_len >= items * S::Y_ITEM) & (flags < 4) & aligned16(x) &
                       aligned16(w) & aligned16(residual) & aligned16(y) &
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
    const u32 b_row = tid / (S::BN / 4), b_col = (tid % (S::BN / 4)) * 4;

    auto load_stage = [&](u32 kt) {
        const u32 slot = kt % CONV_STAGES;
        const saddr a_base = base + slot * S::STAGE_FLOATS * 4;
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
        const float* source = w + u64(kt * CONV_BK + b_row) * S::COUT + n0 + b_col;
        cp_async16_fill(b_base + (b_row * S::B_STRIDE + b_col) * 4, source, 16);
    };

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
        const saddr a_base = base + (kt % CONV_STAGES) * S::STAGE_FLOATS * 4;
        const saddr b_base = a_base + CONV_BM * S::A_STRIDE * 4;
        float part[SPLIT ? 4 : 1][4][4];  // SPLIT's fresh stage sums; TF32 adds to acc
        zero(part);
#pragma unroll
        for (u32 ks = 0; ks < CONV_BK / 8; ++ks) {
            uint4 a_hi[4], a_lo[4];
#pragma unroll
            for (u32 mi = 0; mi < 4; ++mi) {
                const saddr at = a_base + ((wm * 64 + mi * 16 + g) * S::A_STRIDE + ks * 8 + t) * 4;
                const float v[4] = {lds1(at), lds1(at + 8 * S::A_STRIDE * 4), lds1(at + 16),
                                    lds1(at + 8 * S::A_STRIDE * 4 + 16)};
                if (SPLIT) {
                    tf32_split(v[0], a_hi[mi].x, a_lo[mi].x);
                    tf32_split(v[1], a_hi[mi].y, a_lo[mi].y);
                    tf32_split(v[2], a_hi[mi].z, a_lo[mi].z);
                    tf32_split(v[3], a_hi[mi].w, a_lo[mi].w);
                } else {
                    a_hi[mi] = make_uint4(tf32(v[0]), tf32(v[1]), tf32(v[2]), tf32(v[3]));
                }
            }
#pragma unroll
            for (u32 nj = 0; nj < 4; ++nj) {
                const saddr bt = b_base + ((ks * 8 + t) * S::B_STRIDE + wn * 32 + nj * 8 + g) * 4;
                const float b0 = lds1(bt), b1 = lds1(bt + 4 * S::B_STRIDE * 4);
                if (SPLIT) {
                    u32 h0, l0, h1, l1;
                    tf32_split(b0, h0, l0);
                    tf32_split(b1, h1, l1);
#pragma unroll
                    for (u32 mi = 0; mi < 4; ++mi) {
                        mma_split(part[mi][nj], a_hi[mi], a_lo[mi], h0, h1, l0, l1);
                    }
                } else {
                    const u32 h0 = tf32(b0), h1 = tf32(b1);
#pragma unroll
                    for (u32 mi = 0; mi < 4; ++mi) {
                        mma_tf32(acc[mi][nj], a_hi[mi], h0, h1);
                    }
                }
            }
        }
#pragma unroll
        for (u32 mi = 0; mi < 4; ++mi) {
#pragma unroll
            for (u32 nj = 0; nj < 4; ++nj) {
#pragma unroll
                for (u32 e = 0; e < 4; ++e) {
                    if (SPLIT) {
                        acc[mi][nj][e] += part[mi][nj][e];
                    }
                }
            }
        }
    }
    cp_async_wait<0>();

    float2 bias_pair[4];
#pragma unroll
    for (u32 nj = 0; nj < 4; ++nj) {
        bias_pair[nj] = __ldg(reinterpret_cast<const float2*>(bias + n0 + wn * 32 + nj * 8 + 2 * t));
    }
    const bool relu = flags & CONV_RELU, nchw = flags & CONV_NCHW;
#pragma unroll
    for (u32 mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (u32 half = 0; half < 2; ++half) {
            const u32 m = m0 + wm * 64 + mi * 16 + half * 8 + g;
            if (m >= rows) {
                continue;
            }
#pragma unroll
            for (u32 nj = 0; nj < 4; ++nj) {
                const u32 n = n0 + wn * 32 + nj * 8 + 2 * t;
                float v0 = acc[mi][nj][2 * half] + bias_pair[nj].x;
                float v1 = acc[mi][nj][2 * half + 1] + bias_pair[nj].y;
                if (residual_len != 0) {
                    const float2 r = __ldg(reinterpret_cast<const float2*>(residual + m * S::COUT + n));
                    v0 += r.x;
                    v1 += r.y;
                }
                if (relu) {
                    v0 = fmaxf(v0, 0.0f);
                    v1 = fmaxf(v1, 0.0f);
                }
                if (nchw) {
                    const u32 item = m / S::POS, p = m % S::POS;
                    y[(item * S::COUT + n) * S::POS + p] = v0;
                    y[(item * S::COUT + n + 1) * S::POS + p] = v1;
                } else {
                    stg2(y + m * S::COUT + n, make_float2(v0, v1));
                }
            }
        }
    }
}

}  // namespace spk

#endif
