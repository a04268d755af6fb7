// How a stage of the trunk's convolutions reaches shared memory: the strips' rows and
// the weights of a ring stage, by every thread's cp.async copies (the sm80 tier, and
// the sm90 tier without a tensor map) or by the async copy engine from one thread (the
// sm90 tier). trunkconv.cuh includes it after its shapes (S: a ConvShape, L: its warp
// layout); the strip form and the halves form (trunkhalves.cuh) share it.

#pragma once

#include "common.cuh"
#include "sm80.cuh"
#include "sm90.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

namespace spk {

// This thread's copies of a strip (STRIP): strip row r (r = tid / 4 + i THREADS / 4)
// is the flat input pixel first + r, 16 channels from cb * BK, or zeros past either
// end of the items' pixels (as many as their output positions).
template <class S>
__device__ __forceinline__ void copy_strip(saddr a_base, const float* __restrict__ x, int first,
                                           u32 rows, u32 cb, u32 tid) {
    const u32 chunk = tid & 3;
#pragma unroll
    for (u32 i = 0; i < S::A_COPIES; ++i) {
        const u32 r = tid / 4 + i * (S::THREADS / 4);
        if (r < S::A_ROWS) {
            const int q = first + int(r);
            const bool in = (q >= 0) & (q < int(rows));
            const float* source = in ? x + (q * int(S::CIN) + int(cb * S::BK + chunk * 4)) : x;
            cp_async16_fill(a_base + (r * S::A_STRIDE + chunk * 4) * 4, source, in ? 16 : 0);
        }
    }
}

// Words of a convolution's packed weights (FoldedConv.packed): FP16 high and low
// parts of every k and column (SPLIT), else the high parts alone, half as many. Both
// forms of a strip refuse any other length.
template <class S, bool SPLIT>
__device__ __forceinline__ constexpr u64 packed_weight_words() {
    return u64(S::K) * S::COUT / (SPLIT ? 1 : 2);
}
// This thread's copies of ring stage ks's weights: each step's k block (tap, cb), 16-byte
// runs tid, tid + THREADS, ... of its 4 BN (SPLIT) or 2 BN. GroupTiles' weights hold a
// step's high plane, then its low one, each [COUT / 8][2][8][8] FP16 (wgmma_b_desc): the
// block's columns are one run of BN * 8 words per plane.
template <class S, class L, bool SPLIT>
__device__ __forceinline__ void copy_weights(saddr b_base, const float* __restrict__ w, u32 ks,
                                             u32 n0, u32 tid) {
    constexpr u32 B_WORDS = SPLIT ? S::BK : S::BK / 2, RUNS = B_WORDS / 4 * S::BN;
    const u32 cb = ks % S::CBLOCKS;
#pragma unroll
    for (u32 step = 0; step < S::STEPS; ++step) {
        const u32 tap = S::STRIP ? ks / S::CBLOCKS * S::KS + step : ks / S::CBLOCKS;
#pragma unroll
        for (u32 i = 0; i < (RUNS + S::THREADS - 1) / S::THREADS; ++i) {
            const u32 run = tid + i * S::THREADS;
            if (RUNS % S::THREADS == 0 || run < RUNS) {  // every thread's, or the first RUNS'
                const u64 k_block = tap * S::CBLOCKS + cb;
                const float* source =
                    L::WGMMA ? w + (k_block * S::COUT * B_WORDS + run / (2 * S::BN) * S::COUT * 8 +
                                    n0 * 8 + run % (2 * S::BN) * 4)
                             : w + (k_block * S::COUT + n0) * B_WORDS + run * 4;
                cp_async16_fill(b_base + (step * S::BN * S::BK + run * 4) * 4, source, 16);
            }
        }
    }
}

}  // namespace spk

#endif

#if defined(SPK_WGMMA)

namespace spk {

// (sm90) A strip by the async copy engine: its TMA_BOXES boxes of x_map (a 2D tensor map
// of the input's [items x POS][CIN] floats), rows first on, channels from cb * BK,
// on mbarrier `bar`; rows past either end of the items' pixels (the map's bounds) read
// zeros. One thread issues it.
template <class S>
__device__ __forceinline__ void tma_strip(saddr a_base, const void* x_map, int first, u32 cb,
                                          saddr bar) {
#pragma unroll
    for (u32 box = 0; box < S::TMA_BOXES; ++box) {
        tma_load_2d(a_base + box * S::TMA_BOX * S::A_STRIDE * 4, x_map, int(cb * S::BK),
                    first + int(box * S::TMA_BOX), bar);
    }
}
// Bytes of a ring stage's weights (GroupTiles' layout): per step, a plane (SPLIT: two) of
// BN columns' 8 words.
template <class S, bool SPLIT>
__device__ __forceinline__ constexpr u32 tma_weight_bytes() {
    return S::STEPS * (SPLIT ? 2 : 1) * S::BN * 8 * 4;
}
// (sm90) Ring stage ks's weights (GroupTiles' layout, as copy_weights lays them out) by
// bulk copies on mbarrier `bar`, one run a step and plane. One thread issues them.
template <class S, bool SPLIT>
__device__ __forceinline__ void tma_weights(saddr b_base, const float* __restrict__ w, u32 ks,
                                            u32 n0, saddr bar) {
    constexpr u32 B_WORDS = SPLIT ? S::BK : S::BK / 2, RUN = S::BN * 8 * 4;
    const u32 cb = ks % S::CBLOCKS;
#pragma unroll
    for (u32 step = 0; step < S::STEPS; ++step) {
        const u64 k_block = (ks / S::CBLOCKS * S::KS + step) * S::CBLOCKS + cb;
#pragma unroll
        for (u32 plane = 0; plane < (SPLIT ? 2 : 1); ++plane) {
            bulk_load(b_base + (step * S::BN * S::BK + plane * S::BN * 8) * 4,
                      w + (k_block * S::COUT * B_WORDS + plane * S::COUT * 8 + n0 * 8), RUN, bar);
        }
    }
}

}  // namespace spk

#endif
