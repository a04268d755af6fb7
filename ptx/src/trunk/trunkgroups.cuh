// The trunk 3x3s' warpgroup layout and products on Hopper's wgmma (the sm90 tier):
// GroupTiles, the one-product step (group_products, group_wait) and the three-product
// stage (group_stage_split). trunkconv.cuh's trunk_conv runs them where SPK_WGMMA is
// defined; elsewhere only the declarations exist, and no kernel calls them.

#pragma once

#include "common.cuh"
#include "sm90.cuh"

namespace spk {

// GroupTiles: wgmma (the sm90 tier's 3x3s, strips and stride 2). The block's THREADS / 128 warpgroups split
// its rows; a warpgroup owns GROUP_ROWS x BN as MI row tiles of 64 (warp w of the group
// their rows 16 w .. 16 w + 15) by NT column tiles of NW (S::GROUP_N or the block's
// width), one wgmma m64nNWk16 each.
template <class S>
struct GroupTiles {
    static constexpr bool WGMMA = true;
    static constexpr u32 GROUPS = S::THREADS / 128, GROUP_ROWS = S::BM / GROUPS;
    static constexpr u32 MI = GROUP_ROWS / 64, NJ = S::BN / 8, ROW_STEP = 64;
    static constexpr u32 NW = S::BN < S::GROUP_N ? S::BN : S::GROUP_N, NT = S::BN / NW;
    static constexpr u32 FRESH = NW / 8;  // 8-column tiles of a tile's fresh sums
    // sets of a fragments in one-product kernels: two let a step's products run while
    // the next step converts, where they fit (the 32-wide layer's four row tiles spill)
    static constexpr u32 A_SETS = MI <= 2 ? 2 : 1;
    // and of a_hi in three-product stages: two where a tile is one row tile, or 128
    // wide (up to 255 registers); the 64-wide layers' two row tiles spilled a second set
    static constexpr u32 SPLIT_SETS = MI == 1 || NW == 128 ? 2 : 1;
    static __device__ __forceinline__ u32 row0(u32 warp) {
        return warp / 4 * GROUP_ROWS + warp % 4 * 16;
    }
    static __device__ __forceinline__ u32 col0(u32) { return 0; }
    static_assert(S::THREADS % 128 == 0 && GROUP_ROWS % 64 == 0, "whole warpgroups of 64-row tiles");
};

// (trunkconv.cuh) this lane's a fragment of row tile mi in a step, converted to FP16
template <class S, class L, bool SPLIT>
__device__ __forceinline__ void row_fragment(saddr a_rows, saddr a_zero, u32 blocked, u32 mi,
                                             const float (&scale)[2], uint4& a_hi, uint4& a_lo);

// One row tile's products of a warpgroup (GroupTiles, one product) in a step: its warps'
// a fragment a_hi of the tile's rows, the step's weights at b_base (GroupTiles' layout:
// the high plane, BN * 32 bytes), straight into the running sums; group_wait waits for
// them. Every warp of the group calls both.
template <class S, class L>
__device__ __forceinline__ void group_products(float (&sums)[L::NJ][4], uint4 a_hi, saddr b_base);
template <class L, u32 STEPS>
__device__ __forceinline__ void group_wait(float (&acc)[L::MI][L::NJ][4], u32 step);
// A stage's products (GroupTiles, SPLIT: a strip's three steps, a stride-2 stage's one).
template <class S, class L>
__device__ __forceinline__ void group_stage_split(float (&acc)[L::MI][L::NJ][4],
                                                  float (&fresh)[L::FRESH][4], saddr a_stage,
                                                  u32 blocked_rows, u32 edges, u32 row0, u32 g,
                                                  u32 t, const float (&row_scale)[L::MI][2]);

#if defined(SPK_WGMMA)

// Once a tile's products are complete, its fresh sum (row tile mi, column tile nt) into
// the running sums. Every warp of the group calls it.
template <class L>
__device__ __forceinline__ void add_fresh_tile(float (&acc)[L::MI][L::NJ][4],
                                               float (&fresh)[L::FRESH][4], u32 mi, u32 nt) {
    wgmma_wait<0>();
    register_fence(fresh);
#pragma unroll
    for (u32 j = 0; j < L::FRESH; ++j) {
#pragma unroll
        for (u32 e = 0; e < 4; ++e) {
            acc[mi][nt * L::FRESH + j][e] += fresh[j][e];
        }
    }
}

template <class S, class L>
__device__ __forceinline__ void group_products(float (&sums)[L::NJ][4], uint4 a_hi, saddr b_base) {
    // descriptors count 16-byte units: a column tile is NW / 8 core-matrix rows of 256 bytes
    constexpr u64 TILE_STEP = L::FRESH * 256 / 16;
    const u64 high = wgmma_b_desc(b_base);
    wgmma_fence();  // after this thread's writes of a_hi and the sums
#pragma unroll
    for (u32 nt = 0; nt < L::NT; ++nt) {
        float (&tile)[L::FRESH][4] = *reinterpret_cast<float(*)[L::FRESH][4]>(&sums[nt * L::FRESH]);
        wgmma_f16<L::NW>(tile, a_hi, high + nt * TILE_STEP, 1);
    }
}
template <class L, u32 STEPS>
__device__ __forceinline__ void group_wait(float (&acc)[L::MI][L::NJ][4], u32 step) {
    // a stage's steps (unrolled) leave one group in flight while the next converts into
    // the other set of a fragments; the stage's last waits for all, before its slot of
    // the ring is refilled
    wgmma_commit();
    if (L::A_SETS == 1 || step + 1 == STEPS) {
        wgmma_wait<0>();
#pragma unroll
        for (u32 mi = 0; mi < L::MI; ++mi) {
            register_fence(acc[mi]);
        }
    } else if (step > 0) {
        wgmma_wait<1>();
    }
}

// A stage (GroupTiles, SPLIT): per row tile and column tile, the stage's steps' three
// products (a strip's three steps, a stride-2 3x3's one) in one fresh sum, added to the
// running sums once: in the strips one wait a stage and tile, where a wait per step
// drained the pipe three times as often. With L::SPLIT_SETS of two, a_hi alternates
// between two sets, so the next step converts while this step's a_hi products run;
// with one, each step waits before the next converts.
template <class S, class L>
__device__ __forceinline__ void group_stage_split(float (&acc)[L::MI][L::NJ][4],
                                                  float (&fresh)[L::FRESH][4], saddr a_stage,
                                                  u32 blocked_rows, u32 edges, u32 row0, u32 g,
                                                  u32 t, const float (&row_scale)[L::MI][2]) {
    constexpr u64 TILE_STEP = L::FRESH * 256 / 16, LOW_PLANE = S::BN * 32 / 16;
    constexpr u32 SETS = L::SPLIT_SETS;
    const saddr a_zero = a_stage + (S::ZERO_ROW * S::A_STRIDE + 4 * t) * 4;
    const saddr a_first = a_stage + ((row0 + g) * S::A_STRIDE + 4 * t) * 4;
    const saddr b_stage = a_stage + S::A_SLOT_ROWS * S::A_STRIDE * 4;
    uint4 a_hi[SETS], a_lo;
#pragma unroll
    for (u32 mi = 0; mi < L::MI; ++mi) {
#pragma unroll
        for (u32 nt = 0; nt < L::NT; ++nt) {
#pragma unroll
            for (u32 step = 0; step < S::STEPS; ++step) {
                const u32 blocked =
                    (blocked_rows | (step == 0 ? edges >> 16 : step == 2 ? edges >> 24 : 0)) & 0xff;
                uint4& high = a_hi[step % SETS];
                row_fragment<S, L, true>(a_first + step * S::A_STRIDE * 4, a_zero, blocked, mi,
                                         row_scale[mi], high, a_lo);
                const u64 b = wgmma_b_desc(b_stage + step * S::BN * S::BK * 4) + nt * TILE_STEP;
                wgmma_fence();  // after the conversion's writes (and the last adds of fresh)
                wgmma_f16<L::NW>(fresh, a_lo, b, step > 0);
                wgmma_commit();
                wgmma_f16<L::NW>(fresh, high, b + LOW_PLANE, 1);
                wgmma_f16<L::NW>(fresh, high, b, 1);
                wgmma_commit();
                if (step + 1 < S::STEPS) {  // the registers the next step converts into are free
                    if constexpr (SETS == 2) {
                        wgmma_wait<1>();
                    } else {
                        wgmma_wait<0>();
                    }
                }
            }
            add_fresh_tile<L>(acc, fresh, mi, nt);
        }
    }
}
#endif  // SPK_WGMMA

}  // namespace spk
