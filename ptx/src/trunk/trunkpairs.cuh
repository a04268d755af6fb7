// Layer1's 3x3 convolutions on the sm90 tier in row pairs: two warpgroups, the second's
// output rows one image row below the first's, share one copy of each input row.
//
// Layer1's convolutions have a quarter of layer3's products per activation byte (32
// channels at the full 80 x 998), and the strip form (trunkconv.cuh) stages each input
// row once per kernel row: 3.02 input pixels per output, plus each stage's weights. A
// block here owns a tile of two 256-position runs, rows m0 .. m0 + 255 (warpgroup 0) and
// the same columns of the next image row, m0 + WIN .. (warpgroup 1). Warpgroup 0's tap dy
// reads the strip of input row offset e = dy, warpgroup 1's the strip of e = dy + 1, so
// the four strips e = 0 .. 3 (each CONV_BM + 2 pixels from m0 + (e - 1) WIN - 1, as in
// the strip form) serve both: 2.02 pixels per output. The weights (all nine taps, at
// most 36 KB) stay in shared memory for the block's tiles, out of the copy ring.
//
// A tile's stages run e-major (e = 0 .. 3, then the channel block), so each warpgroup
// meets its kernel rows and channel blocks in the strip form's order: its sums, and so
// its outputs, are the strip form's bits. Both groups work in the same stages: in the
// stage of strip e, kernel row e - 1, warpgroup 1 from that strip and warpgroup 0 from
// strip e - 1, which the ring still holds (a tile's e = 0 stages only copy).
//
// Measured against the strip form by tools/trunk_forms.py and not planned: it saves the
// L2 reads and not the per-warp conversions that bound layer1 (docs/performance.md).
//
// Tiles: an item's 80 rows are 40 pairs, a pair's first row 998 positions in runs of 256
// (the fourth 230 long: its last 26 rows are computed and not stored), 160 tiles an item.

#pragma once

#include "trunkconv.cuh"

namespace spk {

constexpr u32 PAIR_GROUPS = 2;  // warpgroups a block: image rows a tile
constexpr u32 PAIR_TILES = 2;   // tiles a block takes in turn, its ring running on
constexpr u32 PAIR_STAGES = 4;  // copy ring depth: the strips a stage reads, and one ahead

template <class S>
struct PairShape : S {
    static constexpr u32 THREADS = 128 * PAIR_GROUPS, MIN_BLOCKS = 512 / THREADS;
    static constexpr u32 SEGMENTS = (S::WOUT + CONV_BM - 1) / CONV_BM;  // runs a row
    static constexpr u32 ITEM_TILES = S::HOUT / PAIR_GROUPS * SEGMENTS;
    static constexpr u32 STRIPS = PAIR_GROUPS + S::KS - 1;  // input rows a tile reads
    static constexpr u32 KSTAGES = STRIPS * S::CBLOCKS;     // stages a tile
    // a stage's groups read its strip and the LAG before it; AHEAD copies run ahead
    static constexpr u32 LAG = (PAIR_GROUPS - 1) * S::CBLOCKS, AHEAD = PAIR_STAGES - 1 - LAG;
    static constexpr u32 GRID_X = (TRUNK_BATCH * ITEM_TILES + PAIR_TILES - 1) / PAIR_TILES;
    // the weights' words with SPLIT (K x COUT FP16 high and low), then the ring
    static constexpr u32 W_WORDS = S::K * S::COUT, A_STAGE_WORDS = S::A_SLOT_ROWS * S::A_STRIDE;
    static constexpr u32 SHARED = (W_WORDS + PAIR_STAGES * A_STAGE_WORDS) * 4;
    static constexpr u32 A_COPIES = (S::A_ROWS * 4 + THREADS - 1) / THREADS;
    static_assert(S::STRIP && S::BN == S::COUT && S::HOUT % PAIR_GROUPS == 0, "row pairs of one block column");
    static_assert(AHEAD >= 1, "the ring holds the strips a stage reads and one copy ahead");
};

}  // namespace spk

#if defined(SPK_WGMMA)

namespace spk {

template <class S, bool SPLIT>
__device__ __forceinline__ void trunk_conv_pairs(const float* __restrict__ x, u64 x_len,
                                                 const float* __restrict__ w, u64 w_len,
                                                 const float* __restrict__ bias, u64 bias_len,
                                                 const float* __restrict__ residual,
                                                 u64 residual_len, float* __restrict__ y, u64 y_len,
                                                 const u32* __restrict__ in_max, u64 in_max_len,
                                                 u32* __restrict__ out_max, u64 out_max_len,
                                                 u32 items, u32 flags) {
    using P = PairShape<S>;
    using L = GroupTiles<S>;  // one warpgroup's 256 x BN: MI row tiles of 64
    constexpr u32 MI = L::MI, NJ = L::NJ;
    constexpr u32 B_WORDS = SPLIT ? CONV_BK : CONV_BK / 2, W_LEN = S::K * S::COUT * B_WORDS / CONV_BK;
    const bool valid = launch_is(P::GRID_X, 1, 1, P::THREADS) & (items >= 1) &
                       (items <= TRUNK_BATCH) & (x_len >= items * S::X_ITEM) & (w_len == W_LEN) &
                       (bias_len == 2 * S::COUT) &
                       ((residual_len == 0) | (residual_len >= items * S::Y_ITEM)) &
                       (y_len >= items * S::Y_ITEM) & (in_max_len >= items) &
                       ((out_max_len == 0) | (out_max_len >= items)) & (flags < 4) &
                       aligned16(x) & aligned16(w) & aligned16(residual) & aligned16(y) &
                       (dynamic_shared_bytes() >= P::SHARED);
    const u32 rows = items * S::POS;
    const u32 tile_count = items * P::ITEM_TILES, tile0 = blockIdx.x * PAIR_TILES;
    if (!valid | (tile0 >= tile_count)) {
        return;  // uniform over the block: no barrier is split
    }
    const u32 stage_count = min(PAIR_TILES, tile_count - tile0) * P::KSTAGES;
    extern __shared__ __align__(16) float shared[];
    const saddr weights = shared_address(shared), ring = weights + P::W_WORDS * 4;
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 group = warp / 4, g = lane >> 2, t = lane & 3, chunk = tid & 3;
    const u32 row0 = warp % 4 * 16;  // the warp's first row in its group's run

    // tile -> its first run's first position; `run` its length (256, or the last 230)
    auto tile_start = [](u32 tile, u32& run) {
        const u32 item = tile / P::ITEM_TILES, pair = tile % P::ITEM_TILES / P::SEGMENTS;
        const u32 column = tile % P::SEGMENTS * CONV_BM;
        run = min(CONV_BM, S::WOUT - column);
        return item * S::POS + pair * PAIR_GROUPS * S::WOUT + column;
    };
    // the weights, once, in the ring's first copy group
    for (u32 i = tid; i < W_LEN / 4; i += P::THREADS) {
        cp_async16_fill(weights + i * 16, w + i * 4, 16);
    }
    auto load_stage = [&](u32 j) {  // strip e of the tile's channel block cb
        const saddr a_base = ring + (j % PAIR_STAGES) * P::A_STAGE_WORDS * 4;
        const u32 ks = j % P::KSTAGES, e = ks / S::CBLOCKS, cb = ks % S::CBLOCKS;
        u32 run;
        const int first = int(tile_start(tile0 + j / P::KSTAGES, run)) + (int(e) - 1) * int(S::WIN) - 1;
#pragma unroll
        for (u32 i = 0; i < P::A_COPIES; ++i) {
            const u32 r = tid / 4 + i * (P::THREADS / 4);
            if (r < S::A_ROWS) {
                const int q = first + int(r);
                const bool in = (q >= 0) & (q < int(rows));
                const float* source = in ? x + (q * int(S::CIN) + int(cb * CONV_BK + chunk * 4)) : x;
                cp_async16_fill(a_base + (r * S::A_STRIDE + chunk * 4) * 4, source, in ? 16 : 0);
            }
        }
    };

    // This group's run of the tile: first position m0, rows below `limit` stored. Scales
    // and edge bits as in trunk_conv: 0 scale for the rows past the run.
    u32 m0 = 0, limit = 0, edges = 0;
    float row_scale[MI][2];
    auto enter_tile = [&](u32 tile) {
        u32 run;
        m0 = tile_start(tile, run) + group * S::WOUT;
        limit = m0 + run;
        edges = 0;
#pragma unroll
        for (u32 mi = 0; mi < MI; ++mi) {
#pragma unroll
            for (u32 half = 0; half < 2; ++half) {
                const u32 m = m0 + row0 + mi * L::ROW_STEP + half * 8 + g;
                const float largest = m < limit ? __uint_as_float(__ldg(in_max + m / S::POS)) : 0.0f;
                float inverse;
                half_scale_of(largest, row_scale[mi][half], inverse);
                row_scale[mi][half] = m < limit ? row_scale[mi][half] : 0.0f;
                const u32 p = m % S::POS, h = p / S::WOUT, v = p % S::WOUT;
                const u32 bit = 1u << (mi * 2 + half);
                edges |= (h == 0 ? bit : 0) | (h == S::HOUT - 1 ? bit << 8 : 0) |
                         (v == 0 ? bit << 16 : 0) | (v == S::WOUT - 1 ? bit << 24 : 0);
            }
        }
    };
    enter_tile(tile0);

    for (u32 i = tid; i < PAIR_STAGES * S::A_STRIDE; i += P::THREADS) {  // the zero rows
        sts1(ring + (i / S::A_STRIDE * P::A_STAGE_WORDS + S::ZERO_ROW * S::A_STRIDE + i % S::A_STRIDE) * 4, 0);
    }
    float acc[MI][NJ][4];
    zero(acc);
    uint4 a_hi[MI], a_lo[SPLIT ? MI : 1];
    float fresh[SPLIT ? L::FRESH : 1][4];
    zero(fresh);
#pragma unroll
    for (u32 j = 0; j < P::AHEAD; ++j) {
        if (j < stage_count) {
            load_stage(j);
        }
        cp_async_commit();
    }
#pragma unroll 1
    for (u32 j = 0; j < stage_count; ++j) {
        cp_async_wait<P::AHEAD - 1>();
        fence_proxy_async();  // wgmma reads the weights through the async proxy
        __syncthreads();      // stage j landed for all; stage j - LAG - 1's slot is free
        if (j + P::AHEAD < stage_count) {
            load_stage(j + P::AHEAD);
        }
        cp_async_commit();
        const u32 ks = j % P::KSTAGES, e = ks / S::CBLOCKS, cb = ks % S::CBLOCKS;
        if ((residual_len != 0) & (ks == P::KSTAGES - 1)) {
            prefetch_rows<S, 128>(residual, m0, limit, 0, tid % 128);
        }
        // every group takes kernel row dy = e - (GROUPS - 1) of channel block cb, group
        // g from strip e - (GROUPS - 1 - g), (GROUPS - 1 - g) CBLOCKS stages back: all
        // groups work in the same stages (none in a tile's first CBLOCKS)
        if (e >= PAIR_GROUPS - 1) {  // uniform over the block
            const u32 dy = e - (PAIR_GROUPS - 1);
            const u32 strip = j - (PAIR_GROUPS - 1 - group) * S::CBLOCKS;
            const saddr a_stage = ring + (strip % PAIR_STAGES) * P::A_STAGE_WORDS * 4;
            const u32 blocked_rows = dy == 0 ? edges : dy == S::KS - 1 ? edges >> 8 : 0;
#pragma unroll 1
            for (u32 step = 0; step < S::STEPS; ++step) {
                const u32 blocked =
                    (blocked_rows | (step == 0 ? edges >> 16 : step == 2 ? edges >> 24 : 0)) & 0xff;
                const saddr a_rows = a_stage + ((row0 + g + step) * S::A_STRIDE + 4 * t) * 4;
                const saddr a_zero = a_stage + (S::ZERO_ROW * S::A_STRIDE + 4 * t) * 4;
                const u32 k_block = (dy * S::KS + step) * S::CBLOCKS + cb;
                const saddr b_base = weights + k_block * S::COUT * B_WORDS * 4;
#pragma unroll
                for (u32 mi = 0; mi < MI; ++mi) {
                    row_fragment<S, L, SPLIT>(a_rows, a_zero, blocked, mi, row_scale[mi], a_hi[mi],
                                              a_lo[SPLIT ? mi : 0]);
                    group_products<S, L, SPLIT>(acc[mi], fresh, a_hi[mi], a_lo[SPLIT ? mi : 0], b_base);
                }
                group_wait<L, SPLIT, S::STEPS>(acc, step);
            }
        }
        if (ks == P::KSTAGES - 1 && j + 1 < stage_count) {
            store_tile<P, L>(acc, row_scale, m0, limit, items, row0, 0, g, t, bias, residual,
                             residual_len, y, out_max, out_max_len, flags);
            zero(acc);
            enter_tile(tile0 + (j + 1) / P::KSTAGES);
        }
    }
    cp_async_wait<0>();
    store_tile<P, L>(acc, row_scale, m0, limit, items, row0, 0, g, t, bias, residual, residual_len,
                     y, out_max, out_max_len, flags);
}

}  // namespace spk

#endif
