// The stride-1 3x3s of layers 2 to 4 on the sm90 tier, the strip converted once per
// block ("halves"): both wgmma operands in shared memory. FP32 math (SPLIT) converts to
// high and low FP16 parts for three products; TF32 math to the high part, one product.
//
// In the strip form (trunkconv.cuh, group_stage_split) every warp converts its own a
// fragments of every step (in layer3 and layer4 again for each of two column tiles: 192
// of a warp's 569 instructions a stage of layer3 convert, docs/performance.md). Here the
// block converts a stage's strip once, into the FP16 high and low parts of the three
// taps' operands, each 256 rows (row r: strip row r + dx, or zero where tap (dy, dx) of
// output row r leaves the image), K-major without swizzling as the 2D-tile form lays out
// its slab: plane k / 8 of the step's 16 k, [row][8 k], the k in the weights'
// FRAGMENT_ORDER. A strip pixel takes its own chunk's scale: a tap that reads a pixel of
// another chunk leaves the image, and is zero.
//
// The products, their order and their fresh sums are the strip form's (per row tile and
// column tile, a stage's three taps' a_lo b_hi, a_hi b_lo, a_hi b_hi in one fresh sum,
// added once; in TF32 math each tap's a_hi b straight into the running sums), on the
// same FP16 operands: the outputs are the same bits.
//
// One barrier a stage where a block has the SM to itself (128 columns: layers 3 and 4).
// Stage j's products read halves set j % 2 and weights slot j % 2; while a warpgroup's
// first tile's products run, the block converts stage j + 1's strip (landed a stage
// earlier) into the other set. Past the barrier, the strip two stages on and the next
// stage's weights are copied into the slots the barrier freed. Layer2's two blocks an SM
// keep one set each: a block converts after its products, behind a second barrier, while
// the other block's products run.

#pragma once

#include "trunkconv.cuh"

namespace spk {

// an operand's pad rows either side of the tile's 256: they take a converted strip
// row's writes for rows r = s - dx outside the tile, so that no write needs a test
constexpr u32 HALVES_PAD_ROWS = 2;

// the unsigned type of a mask: u64 where WIDE, else u32
template <bool WIDE>
struct Unsigned {
    using type = u32;
};
template <>
struct Unsigned<true> {
    using type = u64;
};

template <class S, bool SPLIT>
struct HalvesShape : S {
    static constexpr u32 A_BYTES = S::A_ROWS * CONV_BK * 4;  // a stage's FP32 strip
    // its weights in the strip form's slot: high then low plane a step (TF32: the high
    // plane alone, the rest of the slot unused)
    static constexpr u32 B_BYTES = S::STEPS * S::BN * CONV_BK * 4;
    static constexpr u32 PAD_ROWS = HALVES_PAD_ROWS, OPERAND_ROWS = CONV_BM + 2 * PAD_ROWS;
    static constexpr u32 PLANE = OPERAND_ROWS * 16;  // bytes between an operand's two k planes
    static constexpr u32 OPERAND = 2 * PLANE;        // one tap's high (or low) part
    static constexpr u32 PARTS = SPLIT ? 2 : 1;      // high and low, or high alone
    static constexpr u32 SET = S::STEPS * PARTS * OPERAND;  // a stage's three taps' parts
    // sets of converted operands: two where a block has the SM to itself (128 columns),
    // so the next stage converts while this one's products run; one where two blocks
    // share an SM (64 columns), each converting while the other's products run
    static constexpr u32 SETS = S::BN == 128 ? 2 : 1;
    static constexpr u32 SHARED = 2 * (A_BYTES + B_BYTES) + SETS * SET;
    // whether a launch given a tensor map copies by the async copy engine: layer2's (one
    // set) keeps the threads' copies, with which the engine's spilled 68 bytes
    static constexpr bool TMA_COPIES = SETS == 2;
    // strip rows a thread converts: rows tid / 4 + i THREADS / 4, four channels each (the
    // last round's rows past the strip's are none)
    static constexpr u32 ROUNDS = (S::A_ROWS * 4 + S::THREADS - 1) / S::THREADS;
    static_assert((ROUNDS - 1) * S::THREADS / 4 <= CONV_BM, "only the last round passes the tile");
    static_assert(A_BYTES % 128 == 0 && B_BYTES % 16 == 0,
                  "the async copy engine's slots: boxes 128-byte aligned, bulk copies 16");
    static_assert(S::STRIP && S::BN >= 64 && S::THREADS == 4 * S::BN && S::TILES == 1,
                  "one tile of 256 rows a block, warpgroups of whole 64-row tiles");
    // a kernel row's bits of `blocked` (a thread's rounds x the taps dx)
    static constexpr u32 ROW_BITS = ROUNDS * S::KS;
    using Mask = typename Unsigned<(ROW_BITS * S::KS > 32)>::type;
};

}  // namespace spk

#if defined(SPK_WGMMA)

namespace spk {

// A tile's products (row tile mi, column tile nt) into `fresh`: per tap dx, a_lo b_hi
// (the first starts the sum), a_hi b_lo, a_hi b_hi, both operands in shared memory (set:
// the stage's operands from the warpgroup's first row; b_stage: its weights); committed.
template <class S, class L, class P>
__device__ __forceinline__ void halves_products(float (&fresh)[L::FRESH][4], saddr set,
                                                saddr b_stage, u32 mi, u32 nt) {
    constexpr u64 TILE_STEP = L::FRESH * 256 / 16, LOW_PLANE = S::BN * 32 / 16;
    wgmma_fence();  // after the last adds of fresh
#pragma unroll
    for (u32 dx = 0; dx < S::KS; ++dx) {
        const u64 b = wgmma_b_desc(b_stage + dx * S::BN * CONV_BK * 4) + nt * TILE_STEP;
        const saddr high = set + dx * P::PARTS * P::OPERAND + mi * L::ROW_STEP * 16;
        const u64 a_high = wgmma_desc(high, P::PLANE, 128);
        wgmma_f16_shared(fresh, wgmma_desc(high + P::OPERAND, P::PLANE, 128), b, dx > 0);
        wgmma_f16_shared(fresh, a_high, b + LOW_PLANE, 1);
        wgmma_f16_shared(fresh, a_high, b, 1);
    }
    wgmma_commit();
}
// A stage's products in one-product (TF32) math: per row tile and column tile, each
// tap's a_hi b straight into the running sums, in tap order as the strip form adds them
// (group_products); committed as one group.
template <class S, class L, class P>
__device__ __forceinline__ void halves_products_one(float (&acc)[L::MI][L::NJ][4], saddr set,
                                                    saddr b_stage) {
    // descriptors count 16-byte units: each operand is a constant offset from the first
    constexpr u64 TILE_STEP = L::FRESH * 256 / 16, B_TAP = S::BN * CONV_BK * 4 / 16;
    constexpr u64 A_TAP = P::OPERAND / 16, A_ROWS = L::ROW_STEP * 16 / 16;
    const u64 a = wgmma_desc(set, P::PLANE, 128), b = wgmma_b_desc(b_stage);
    wgmma_fence();  // after the last stage's waits on the sums
#pragma unroll
    for (u32 mi = 0; mi < L::MI; ++mi) {
#pragma unroll
        for (u32 nt = 0; nt < L::NT; ++nt) {
            float (&tile)[L::FRESH][4] =
                *reinterpret_cast<float(*)[L::FRESH][4]>(&acc[mi][nt * L::FRESH]);
#pragma unroll
            for (u32 dx = 0; dx < S::KS; ++dx) {
                wgmma_f16_shared(tile, a + dx * A_TAP + mi * A_ROWS, b + dx * B_TAP + nt * TILE_STEP,
                                 1);
            }
        }
    }
    wgmma_commit();
}
template <class S, bool SPLIT, bool TMA>
__device__ __forceinline__ void trunk_conv_halves_by(const float* __restrict__ x, u64 x_len,
                                                  const float* __restrict__ w, u64 w_len,
                                                  const float* __restrict__ bias, u64 bias_len,
                                                  const float* __restrict__ residual,
                                                  u64 residual_len, float* __restrict__ y,
                                                  u64 y_len, const u32* __restrict__ in_max,
                                                  u64 in_max_len, u32* __restrict__ out_max,
                                                  u64 out_max_len, u32 items, u32 flags,
                                                  const void* __restrict__ x_map) {
    using P = HalvesShape<S, SPLIT>;
    using L = GroupTiles<S>;
    constexpr u32 NJ = L::NJ, STAGES = S::KSTAGES;
    const bool valid = launch_is(S::GRID_X, S::GRID_Y, 1, S::THREADS) & (items >= 1) &
                       (items <= TRUNK_BATCH) & (x_len >= items * S::X_ITEM) &
                       (w_len == packed_weight_words<S, SPLIT>()) & (bias_len == 2 * S::COUT) &
                       ((residual_len == 0) | (residual_len >= items * S::Y_ITEM)) &
                       (y_len >= items * S::Y_ITEM) & (in_max_len >= items) &
                       ((out_max_len == 0) | (out_max_len >= items)) & (flags < 4) &
                       aligned16(x) & aligned16(w) & aligned16(residual) & aligned16(y) &
                       (dynamic_shared_bytes() >= P::SHARED);
    const u32 rows = items * S::POS, m0 = blockIdx.x * CONV_BM;
    if (!valid | (m0 >= rows)) {
        return;  // uniform over the block: no barrier is split
    }
    extern __shared__ __align__(128) float shared[];
    const saddr strips = shared_address(shared), weights = strips + 2 * P::A_BYTES;
    // TMA: thread 0 copies by the async copy engine through x_map (a 2D tensor map of the
    // input's [items x POS][CIN] floats), each batch (a strip and a stage's weights) on
    // one of two mbarriers; else every thread copies its share by cp.async.
    constexpr bool tma = TMA;
    __shared__ __align__(8) u64 ring[2];
    const saddr bars = shared_address(ring);
    const saddr halves = weights + 2 * P::B_BYTES;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const u32 g = lane >> 2, t = lane & 3, chunk = tid & 3;
    const u32 row0 = L::row0(warp), n0 = blockIdx.y * S::BN;

    // The strip rows this thread converts: their pixels' scales (a tile's rows span at
    // most two chunks: pixels from `second` on take the next chunk's) and, per kernel
    // row dy, bit dy * ROW_BITS + i * 3 + dx of `blocked` where tap (dy, dx) of output row r =
    // strip row - dx leaves the image (for r outside the tile the bit zeroes a pad row;
    // none for rows past the strip).
    const u32 first_item = m0 / S::POS;
    const int second = int((first_item + 1) * S::POS);
    float scales[2], inverse;
    half_scale_of(__uint_as_float(__ldg(in_max + first_item)), scales[0], inverse);
    half_scale_of(first_item + 1 < items ? __uint_as_float(__ldg(in_max + first_item + 1)) : 0.0f,
                  scales[1], inverse);
    typename P::Mask blocked = 0;
#pragma unroll
    for (u32 i = 0; i < P::ROUNDS; ++i) {
#pragma unroll
        for (u32 dx = 0; dx < S::KS; ++dx) {
            const u32 s = tid / 4 + i * (S::THREADS / 4);
            const u32 p = (m0 + s - dx) % S::POS;
            const u32 h = p / S::WOUT, v = p % S::WOUT;
            const bool side = (dx == 0 && v == 0) || (dx == 2 && v == S::WOUT - 1);
            const typename P::Mask bit = s < S::A_ROWS ? typename P::Mask(1) << (i * 3 + dx) : 0;
            blocked |= (side || h == 0 ? bit : 0) | (side ? bit << P::ROW_BITS : 0) |
                       (side || h == S::HOUT - 1 ? bit << 2 * P::ROW_BITS : 0);
        }
    }

    // One batch of copies: stage `strip`'s FP32 strip and stage `weight`'s weights into
    // their slots (a stage past the last: none), by every thread's cp.async (one group),
    // or (tma) by thread 0 on mbarrier `bar`.
    auto copy_batch = [&](u32 strip, u32 weight, saddr bar) {
        const int first = int(m0) + (int(strip / S::CBLOCKS) - 1) * int(S::WIN) - 1;
        const saddr strip_slot = strips + strip % 2 * P::A_BYTES;
        const saddr weight_slot = weights + weight % 2 * P::B_BYTES;
        if constexpr (!tma) {
            if (strip < STAGES) {
                copy_strip<S>(strip_slot, x, first, rows, strip % S::CBLOCKS, tid);
            }
            if (weight < STAGES) {
                copy_weights<S, L, SPLIT>(weight_slot, w, weight, n0, tid);
            }
            cp_async_commit();
            return;
        }
        const u32 bytes = (strip < STAGES ? P::A_BYTES : 0) +
                          (weight < STAGES ? tma_weight_bytes<S, SPLIT>() : 0);
        if ((tid == 0) & (bytes != 0)) {
            mbarrier_expect(bar, bytes);
            fence_proxy_async();  // after the block's reads of the slots' last stages
            if (strip < STAGES) {
                tma_strip<S>(strip_slot, x_map, first, strip % S::CBLOCKS, bar);
            }
            if (weight < STAGES) {
                tma_weights<S, SPLIT>(weight_slot, w, weight, n0, bar);
            }
        }
    };
    // this thread's four words of operand row r = s - dx (a pad row outside the tile)
    auto operand_row = [&](saddr set, u32 s, u32 dx) {
        return set + dx * P::PARTS * P::OPERAND + (P::PAD_ROWS + s - dx) * 16 + chunk * 4;
    };
    // stage j's strip as the three taps' FP16 operands, high and low, in set j % 2: every
    // strip row into each tap's operand, then zeros over the rows whose tap leaves the
    // image (few: the image's edges), the same thread's writes in program order
    auto convert = [&](u32 j) {
        const u32 dy = j / S::CBLOCKS;
        const int first = int(m0) + (int(dy) - 1) * int(S::WIN) - 1;
        const saddr strip = strips + j % 2 * P::A_BYTES, set = halves + j % P::SETS * P::SET;
        // (one product: a round at a time, beside the sums of every tile in flight)
#pragma unroll(SPLIT ? P::ROUNDS : 1)
        for (u32 i = 0; i < P::ROUNDS; ++i) {
            const u32 s = tid / 4 + i * (S::THREADS / 4);
            if (i + 1 < P::ROUNDS || s < S::A_ROWS) {
                const float4 v = lds4(strip + (s * S::A_STRIDE + chunk * 4) * 4);
                const float scale = first + int(s) < second ? scales[0] : scales[1];
                u32 high[2], low[2];
                if constexpr (SPLIT) {
                    f16_split(v.x * scale, v.y * scale, high[0], low[0]);
                    f16_split(v.z * scale, v.w * scale, high[1], low[1]);
                } else {
                    high[0] = f16_pair(v.x * scale, v.y * scale);
                    high[1] = f16_pair(v.z * scale, v.w * scale);
                }
#pragma unroll
                for (u32 dx = 0; dx < S::KS; ++dx) {
                    const saddr at = operand_row(set, s, dx);
                    sts1(at, high[0]);
                    sts1(at + P::PLANE, high[1]);
                    if constexpr (SPLIT) {
                        sts1(at + P::OPERAND, low[0]);
                        sts1(at + P::OPERAND + P::PLANE, low[1]);
                    }
                }
            }
        }
        const u32 taps = u32(blocked >> (dy * P::ROW_BITS)) & ((1u << P::ROW_BITS) - 1);
        if (taps != 0) {
#pragma unroll
            for (u32 i = 0; i < P::ROUNDS; ++i) {
#pragma unroll
                for (u32 dx = 0; dx < S::KS; ++dx) {
                    if ((taps >> (i * 3 + dx)) & 1) {
                        const saddr at = operand_row(set, tid / 4 + i * (S::THREADS / 4), dx);
                        sts1(at, 0u);
                        sts1(at + P::PLANE, 0u);
                        if constexpr (SPLIT) {
                            sts1(at + P::OPERAND, 0u);
                            sts1(at + P::OPERAND + P::PLANE, 0u);
                        }
                    }
                }
            }
        }
    };
    // two sets: stage j + 1 converts into the other set while stage j's products run
    auto convert_beside = [&](u32 j) {
        if constexpr (P::SETS == 2) {
            if (j + 1 < STAGES) {
                convert(j + 1);
            }
        }
    };

    // Batches: before the loop strip 0 (on mbarrier 1), then strip 1 and weights 0 (on
    // mbarrier 0); stage j, past its barrier, strip j + 2 and weights j + 1, batch j + 1 on
    // mbarrier (j + 1) % 2. Batch b is waited for at stage b, phase (b + 1) / 2 of its
    // mbarrier (mbarrier 1's first phase is strip 0's).
    if constexpr (tma) {
        tma_ring_init<2>(bars, x_map, tid);
    }
    copy_batch(0, STAGES, bars + 8);
    copy_batch(1, 0, bars);
    if constexpr (tma) {
        mbarrier_wait(bars + 8, 0);
    } else {
        cp_async_wait<1>();
        __syncthreads();  // strip 0 landed for all
    }
    convert(0);

    float acc[L::MI][NJ][4];
    float fresh[L::FRESH][4];
    zero(acc);
    zero(fresh);  // (the first product of each tile starts it anew; defined all the same)
    const u32 group_rows = warp / 4 * L::GROUP_ROWS * 16;  // the warpgroup's first row, bytes
#pragma unroll 1
    for (u32 j = 0; j < STAGES; ++j) {
        if constexpr (tma) {  // batch j: strip j + 1 and weights j
            mbarrier_wait(bars + j % 2 * 8, (j + 1) / 2 & 1);
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async();  // this thread's halves (and cp.async copies), to wgmma's proxy
        __syncthreads();  // ...for all; stage j - 1's products are complete in every group
        // strip j + 2 into strip j's slot (converted before the barrier), weights j + 1
        // into weights j - 1's
        copy_batch(j + 2, j + 1, bars + (j + 1) % 2 * 8);
        if ((residual_len != 0) & (j == STAGES - 1)) {
            // the tile's shortcut rows into L2 a stage before its epilogue reads them
            prefetch_rows<S, S::THREADS>(residual, m0, rows, n0, tid);
        }
        const saddr set = halves + j % P::SETS * P::SET + (P::PAD_ROWS * 16 + group_rows);
        const saddr b_stage = weights + j % 2 * P::B_BYTES;
        if constexpr (SPLIT) {
            // per row tile and column tile, the strip form's order (group_stage_split); the
            // first tile's products run while the block converts the next stage (two sets)
            halves_products<S, L, P>(fresh, set, b_stage, 0, 0);
            convert_beside(j);
            add_fresh_tile<L>(acc, fresh, 0, 0);
#pragma unroll
            for (u32 tile = 1; tile < L::MI * L::NT; ++tile) {
                halves_products<S, L, P>(fresh, set, b_stage, tile / L::NT, tile % L::NT);
                add_fresh_tile<L>(acc, fresh, tile / L::NT, tile % L::NT);
            }
        } else {
            // every tile's products in flight while the block converts the next stage
            halves_products_one<S, L, P>(acc, set, b_stage);
            convert_beside(j);
            wgmma_wait<0>();
#pragma unroll
            for (u32 mi = 0; mi < L::MI; ++mi) {
                register_fence(acc[mi]);
            }
        }
        if constexpr (P::SETS == 1) {
            if (j + 1 < STAGES) {
                __syncthreads();  // every group's products of the one set are complete
                convert(j + 1);
            }
        }
    }
    float row_scale[L::MI][2];
    tile_rows<S, L>(m0, rows, in_max, row0, g, row_scale);
    store_tile<S, L>(acc, row_scale, m0, rows, items, row0, n0, g, t, bias, residual,
                     residual_len, y, out_max, out_max_len, flags);
}

}  // namespace spk

#endif
