// Layer1's 3x3 convolutions on the sm90 tier in 2D tiles, the activations converted once
// a stage into FP16 in shared memory: one FP16 product (TF32 math, both wgmma operands in
// shared memory) or, SPLIT, three of high and low parts (FP32, the a fragments read
// from there into registers, each serving up to three output rows).
//
// In the strip form every warp converts its own a fragments for every tap, and with 32
// output channels each converted fragment serves only 32 columns: layer1 took 2.4x a
// layer3 convolution's time for the same products in TF32 math (docs/performance.md).
// Here a block stages an input slab of SLAB_ROWS image rows x SLAB_PIXELS frames (its
// tile's rows and frames with a one-pixel border, zero-filled outside the image, so no
// tap needs a redirect) of 16 channels, converts it once to scaled FP16 in shared
// memory, and every tap's product reads it there by descriptor: the slab row r + dy from
// frame dx on is 64 consecutive 16-byte rows, which is what a K-major operand without
// swizzling is.
//
// The slab's FP16 layout: plane k / 8 of the step's 16 k, [slab pixel][8 k], the k in
// the weights' FRAGMENT_ORDER (channels 4t, 4t + 1 at k 2t, 2t + 1 of plane 0, channels
// 4t + 2, 4t + 3 at the same k of plane 1), so the packed weights serve unchanged.
//
// A block owns TILE_GROUPS warpgroups of TILE_ROWS output rows x 64 frames of one chunk,
// one m64n32 accumulator per row; the last of a row's 16 runs of 64 frames starts at
// WOUT - 64, overlapping the one before: those outputs are computed twice, alike, and
// written twice. The weights (18 KB, SPLIT 36 KB) stay in shared memory. Per stage (one
// channel block of one tile): the FP32 slab lands by cp.async in a ring of TILE_AHEAD + 1
// slots and the block converts it into FP16. One product: into one of two FP16 slabs, and
// each warpgroup issues its 9 x TILE_ROWS products without waiting: they run while the
// block converts the next stage. SPLIT: into one set of high and low slabs, the stage's
// products complete before the next conversion (tile_products_held). One chunk's scale
// serves the whole tile.
//
// A block's middle activation (its first convolution's output, which only its second
// reads) can stay in 16 bits: the first convolution's epilogue (CONV_HALF_OUT) writes the
// FP16 slab planes themselves, [chunk][channel block][part][plane][row][frame][8 k], so
// the second (MIDDLE) lands them by the async copy engine straight into its FP16 sets,
// with no FP32 slab and no conversion, in half the bytes in one-product math. The writer
// cannot know its chunk's largest output while it writes, so it scales by a bound known
// before: |x| <= in_max, so |y| <= in_max x the largest row sum of |w| + the largest |b|
// (the two factors after the bias and inverse scales); it raises that bound as the
// chunk's maximum, and the reader's scale from it is the writer's.

#pragma once

#include "trunkconv.cuh"

namespace spk {

constexpr u32 TILE_GROUPS = 1;   // warpgroups a block
constexpr u32 TILE_ROWS = 4;     // output rows a warpgroup
constexpr u32 TILE_FRAMES = 64;  // output frames a tile row: wgmma's M
constexpr u32 TILE_TILES = 8;    // tiles a block takes in turn
constexpr u32 TILE_AHEAD = 1;    // slab copies in flight ahead of the stage converted
constexpr u32 CONVERT_BATCH = 4;  // a thread's slab reads in flight in a conversion
constexpr u32 CONV_HALF_OUT = 4;  // epilogue flag: write the middle activation in 16 bits
// (MIDDLE, one product) the residual is a block output in the same FP16 planes, scaled by
// its chunk's bound (in_max's first slot span: see trunk_conv_tiles)
constexpr u32 CONV_HALF_RESIDUAL = 8;
// (MIDDLE) stages landed ahead of the one whose products are issued: one product, whose
// products run on past their stage (wgmma_wait<1>), and three, whose stage waits for them.
// One product: 3 the fewest sets of the fastest (an H100's three readers 981.5 us, 2
// ahead 1084.7, 4 983.8, 5 1017.2)
constexpr u32 MIDDLE_AHEAD = 3;
constexpr u32 MIDDLE_AHEAD_SPLIT = 1;

template <class S, bool SPLIT, bool MIDDLE = false>
struct SlabShape : S {
    static constexpr u32 THREADS = 128 * TILE_GROUPS, MIN_BLOCKS = 2;
    static constexpr u32 OUT_ROWS = TILE_GROUPS * TILE_ROWS;  // a tile's output rows
    static constexpr u32 RUNS = (S::WOUT + TILE_FRAMES - 1) / TILE_FRAMES;  // 64-frame runs a row
    static constexpr u32 ITEM_TILES = S::HOUT / OUT_ROWS * RUNS;
    static constexpr u32 SLAB_ROWS = OUT_ROWS + 2, SLAB_PIXELS = TILE_FRAMES + 2;
    static constexpr u32 PIXELS = SLAB_ROWS * SLAB_PIXELS;
    static constexpr u32 PARTS = SPLIT ? 2 : 1;  // FP16 parts: high and low, or high alone
    static constexpr u32 RAW_BYTES = PIXELS * CONV_BK * 4;
    static constexpr u32 PLANE = PIXELS * 16;  // bytes between the two k planes
    static constexpr u32 HALF_BYTES = 2 * PLANE;  // one part's two planes
    // SPLIT: the weights' high and low FP16, the slab's high and low planes in one set
    // (two sets and their sums' temporaries would leave one block an SM); else two sets.
    // MIDDLE: no FP32 slab; sets for the stages landing ahead, the one whose products are
    // issued, and (one product) the one whose products may still run
    static constexpr u32 W_BYTES = S::K * S::COUT * (SPLIT ? 4 : 2);
    static constexpr u32 AHEAD = SPLIT ? MIDDLE_AHEAD_SPLIT : MIDDLE_AHEAD;  // MIDDLE's
    static constexpr u32 SLOTS = TILE_AHEAD + 1, RAW_RING = MIDDLE ? 0 : SLOTS * RAW_BYTES;
    static constexpr u32 HALF_SETS = MIDDLE ? AHEAD + (SPLIT ? 1 : 2) : (SPLIT ? 1 : 2);
    static constexpr u32 RING = MIDDLE ? HALF_SETS : SLOTS;  // mbarriers of the copies
    static constexpr u32 SET_BYTES = PARTS * HALF_BYTES;
    static constexpr u32 SHARED = W_BYTES + RAW_RING + HALF_SETS * SET_BYTES;
    // the middle's slab boxes a chunk: one a channel block, part and plane
    static constexpr u32 COMBOS = S::CBLOCKS * PARTS * 2;
    // whether CONV_HALF_OUT is served: not by the three-product reader (FP32 math keeps
    // its block outputs in 32 bits)
    static constexpr bool WRITES_HALF = !(MIDDLE && SPLIT);
    static constexpr u32 COPIES = PIXELS * 4;  // 16-byte copies (and conversions) a stage
    static constexpr u32 GRID_X = (TRUNK_BATCH * ITEM_TILES + TILE_TILES - 1) / TILE_TILES;
    static_assert(S::STRIP && S::BN == S::COUT && S::COUT == 32 && S::HOUT % OUT_ROWS == 0,
                  "one block column of 32 channels");
    static_assert(W_BYTES % 128 == 0 && RAW_BYTES % 128 == 0, "slabs 128-byte aligned (TMA)");
};

// A warpgroup's accumulators as store_tile reads them: row tile mi is output row mi of
// the group (a row stride of WOUT positions), warp w its frames 16 w .. 16 w + 15.
template <class S>
struct SlabTiles {
    static constexpr bool WGMMA = true;
    static constexpr u32 MI = TILE_ROWS, NJ = S::BN / 8, ROW_STEP = S::WOUT;
};

}  // namespace spk

#if defined(SPK_WGMMA)

namespace spk {

// Fresh sums of the SPLIT form in flight: a row and tap's three products are only 48
// clocks of tensor work at m64n32k16, so a fresh sum is added only FRESH_SETS - 1
// rounds after its products were issued.
constexpr u32 FRESH_SETS = 2;
constexpr u32 HELD_AHEAD = 1;  // row and offset pairs whose fragments are read ahead

// One stage's products of a warpgroup in one product (TF32 math): for each of its
// TILE_ROWS output rows and each tap, the slab rows the tap reads (by descriptor) times
// the tap's weights, straight into the running sums, committed as one group that runs on
// while the block converts the next stage.
template <class S, class P>
__device__ __forceinline__ void tile_products(float (&acc)[TILE_ROWS][S::BN / 8][4], saddr slab,
                                              saddr weights, u32 cb) {
    wgmma_fence();
#pragma unroll
    for (u32 mi = 0; mi < TILE_ROWS; ++mi) {
#pragma unroll
        for (u32 tap = 0; tap < 9; ++tap) {
            const saddr rows = slab + ((mi + tap / 3) * P::SLAB_PIXELS + tap % 3) * 16;
            const saddr b_at = weights + (tap * S::CBLOCKS + cb) * S::COUT * 32;
            wgmma_f16_shared(acc[mi], wgmma_desc(rows, P::PLANE, 128), wgmma_b_desc(b_at), 1);
        }
    }
    wgmma_commit();
}

// One stage's products of a warpgroup in three (SPLIT, FP32 math). A round is one output
// row mi and tap: a_lo b_hi, a_hi b_lo, a_hi b_hi in one fresh sum (the first product
// starts it), added to the row's running sums once complete, in the order of the
// rounds; FRESH_SETS fresh sums take turns, so the sums are added while later rounds'
// products run. The a fragments are held in registers: a warp reads slab row s's high
// and low fragments from frame dx on once (ldmatrix, HELD_AHEAD pairs before their
// products) and issues the rounds of every output row that reads them, mi = s - dy for
// dy = 0 .. 2. With wgmma reading them from shared memory for each round and product,
// a round read 9 KB there, now 3 KB and 4 KB a row and offset pair. A row's taps still
// come in order (s = mi + dy ascending, then dx).
template <class S, class P>
__device__ __forceinline__ void tile_products_held(float (&acc)[TILE_ROWS][S::BN / 8][4],
                                                   saddr slab, saddr weights, u32 cb) {
    // FRESH_SETS - 1 rounds stay in flight, and a pair's fragments are read HELD_AHEAD
    // pairs before its products: a set of fragments is read again only once every round
    // that used it is complete (each pair has at least one round)
    constexpr u32 NJ = S::BN / 8, LOW_PLANE = S::COUT * 32, LAG = FRESH_SETS - 1;
    constexpr u32 PAIRS = (TILE_ROWS + 2) * 3, A_SETS = FRESH_SETS + HELD_AHEAD;
    const u32 lane = threadIdx.x & 31;
    const saddr lane_rows = slab + ((threadIdx.x >> 5) % 4 * 16 + (lane & 7) + (lane & 8)) * 16 +
                            (lane >> 4) * P::PLANE;
    float fresh[FRESH_SETS][NJ][4];
    uint4 a_hi[A_SETS], a_lo[A_SETS];
    u32 row_of[FRESH_SETS];  // each fresh sum's output row
    auto add_fresh = [&](u32 set) {
        register_fence(fresh[set]);
#pragma unroll
        for (u32 nj = 0; nj < NJ; ++nj) {
#pragma unroll
            for (u32 e = 0; e < 4; ++e) {
                acc[row_of[set]][nj][e] += fresh[set][nj][e];
            }
        }
    };
    // pair = slab row s x 3 + frame offset dx
    auto load_pair = [&](u32 pair) {
        const saddr rows = lane_rows + (pair / 3 * P::SLAB_PIXELS + pair % 3) * 16;
        a_hi[pair % A_SETS] = ldmatrix4(rows);
        a_lo[pair % A_SETS] = ldmatrix4(rows + P::HALF_BYTES);
    };
#pragma unroll
    for (u32 pair = 0; pair < HELD_AHEAD; ++pair) {
        load_pair(pair);
    }
    u32 n = 0;
#pragma unroll
    for (u32 pair = 0; pair < PAIRS; ++pair) {
        const u32 s = pair / 3, dx = pair % 3, set = pair % A_SETS;
        if (pair + HELD_AHEAD < PAIRS) {
            load_pair(pair + HELD_AHEAD);
        }
#pragma unroll
        for (u32 mi = s < 2 ? 0 : s - 2; mi <= s && mi < TILE_ROWS; ++mi) {
            const u32 tap = (s - mi) * 3 + dx;
            const saddr b_at = weights + (tap * S::CBLOCKS + cb) * S::COUT * 64;
            const u64 b = wgmma_b_desc(b_at);
            float (&sum)[NJ][4] = fresh[n % FRESH_SETS];
            row_of[n % FRESH_SETS] = mi;
            wgmma_fence();  // after the fragments' loads and the adds of this fresh sum
            wgmma_f16<32>(sum, a_lo[set], b, 0);
            wgmma_f16<32>(sum, a_hi[set], wgmma_b_desc(b_at + LOW_PLANE), 1);
            wgmma_f16<32>(sum, a_hi[set], b, 1);
            wgmma_commit();
            if (n >= LAG) {
                wgmma_wait<LAG>();  // round n - LAG is complete
                add_fresh((n - LAG) % FRESH_SETS);
            }
            ++n;
        }
    }
    wgmma_wait<0>();
#pragma unroll
    for (u32 r = n - LAG; r < n; ++r) {
        add_fresh(r % FRESH_SETS);
    }
}

// store_tile for a tile: all of its rows lie in one chunk (`item`), so no row is tested
// against the batch or split between chunks, and each of a thread's outputs is at a
// constant offset from its first (`first`, its position m0 + row0 + g). The arithmetic is
// store_tile's, in its order; its row and chunk tests and divisions were about two thirds
// of the tile epilogue's instructions and a quarter of the kernel's (sm_90a SASS).
// CONV_HALF_OUT: the outputs times `out_scale` (the scale of `bound`) as the middle's FP16
// planes (SlabShape's COMBOS boxes a chunk), and `bound` raised as the chunk's maximum.
template <class S>
__device__ __forceinline__ void store_slab_tile(const float (&acc)[TILE_ROWS][S::BN / 8][4],
                                                float scale, u32 item, u32 items, u32 first,
                                                u32 t, const float* __restrict__ bias,
                                                u64 residual_len, float* __restrict__ y,
                                                u32* __restrict__ out_max, u64 out_max_len,
                                                u32 flags,
                                                const float2 (&held)[TILE_ROWS][S::BN / 8][2],
                                                float out_scale, float bound) {
    const bool relu = flags & CONV_RELU, nchw = flags & CONV_NCHW;
    const float row_inverse = inverse_of_scale(scale);
    float2 bias_pair[S::BN / 8], column_inverse[S::BN / 8];  // all read before the first use
#pragma unroll
    for (u32 nj = 0; nj < S::BN / 8; ++nj) {
        const u32 n = nj * 8 + 2 * t;
        bias_pair[nj] = __ldg(reinterpret_cast<const float2*>(bias + n));
        column_inverse[nj] = __ldg(reinterpret_cast<const float2*>(bias + S::COUT + n));
    }
    // output (mi, nj, half) of this thread: its channels nj 8 + 2 t and + 1
    auto output = [&](u32 mi, u32 nj, u32 half) {
        float v0 = fmaf(acc[mi][nj][2 * half] * row_inverse, column_inverse[nj].x,
                        bias_pair[nj].x);
        float v1 = fmaf(acc[mi][nj][2 * half + 1] * row_inverse, column_inverse[nj].y,
                        bias_pair[nj].y);
        if (residual_len != 0) {
            v0 += held[mi][nj][half].x;
            v1 += held[mi][nj][half].y;
        }
        return relu ? make_float2(fmaxf(v0, 0.0f), fmaxf(v1, 0.0f)) : make_float2(v0, v1);
    };
    if (S::WRITES_HALF && (flags & CONV_HALF_OUT)) {
        // FRAGMENT_ORDER puts this thread's channels of nj = 2 cb + s (channel block cb) in
        // pair slot 2 s + t / 2 of plane t % 2; lane ^ 2 holds the plane's other two slots,
        // so the pair completes 16-byte rows: (SPLIT) one stores the high part's, the
        // other the low part's, or (one part) one the first pixel row's, the other the
        // second's (half). A row: words ((chunk COMBOS + combo) POS + position) 4 + slot.
        const u32 second = t / 2;
        u32* const middle = reinterpret_cast<u32*>(y) +
                            ((u64(item) * S::COMBOS + t % 2) * S::POS + first % S::POS) * 4;
#pragma unroll
        for (u32 mi = 0; mi < TILE_ROWS; ++mi) {
#pragma unroll
            for (u32 cb = 0; cb < S::BN / 16; ++cb) {
                u32 words[2][2][S::PARTS];  // [half][s][part]
#pragma unroll
                for (u32 half = 0; half < 2; ++half) {
#pragma unroll
                    for (u32 s = 0; s < 2; ++s) {
                        const float2 v = output(mi, 2 * cb + s, half);
                        if constexpr (S::PARTS == 2) {
                            f16_split(v.x * out_scale, v.y * out_scale, words[half][s][0],
                                      words[half][s][1]);
                        } else {
                            words[half][s][0] = f16_pair(v.x * out_scale, v.y * out_scale);
                        }
                    }
                }
                // per round, the row this thread stores (SPLIT: of pixel row `round`, its
                // part `second`; else of pixel row `second`): its own words in slots
                // 2 s + second, the other's in 2 s + 1 - second (selects, not indices, keep
                // the words in registers)
#pragma unroll
                for (u32 round = 0; round < S::PARTS; ++round) {
                    u32 row[4];
#pragma unroll
                    for (u32 s = 0; s < 2; ++s) {
                        u32 keep, sent;
                        if constexpr (S::PARTS == 2) {
                            keep = second ? words[round][s][1] : words[round][s][0];
                            sent = second ? words[round][s][0] : words[round][s][1];
                        } else {
                            keep = second ? words[1][s][0] : words[0][s][0];
                            sent = second ? words[0][s][0] : words[1][s][0];
                        }
                        const u32 other = __shfl_xor_sync(0xffffffffu, sent, 2);
                        row[2 * s] = second ? other : keep;
                        row[2 * s + 1] = second ? keep : other;
                    }
                    const u32 half = S::PARTS == 2 ? round : second;
                    const u32 combo = (cb * S::PARTS + (S::PARTS == 2 ? second : 0)) * 2;
                    u32* at = middle + (u64(combo) * S::POS + mi * S::WOUT + half * 8) * 4;
                    *reinterpret_cast<uint4*>(at) = make_uint4(row[0], row[1], row[2], row[3]);
                }
            }
        }
        if (out_max_len != 0) {
            raise_chunk_maxima<S::THREADS / 32>(out_max, item, items, bound, 0.0f);
        }
        return;
    }
    // NHWC: [m][COUT]; NCHW: [item][COUT][POS]
    float* const out = nchw ? y + (u64(item) * S::COUT + 2 * t) * S::POS + first % S::POS
                            : y + u64(first) * S::COUT + 2 * t;
    const u32 row_step = nchw ? 1 : S::COUT, column_step = nchw ? S::POS : 1;
    float largest = 0.0f;
#pragma unroll
    for (u32 nj = 0; nj < S::BN / 8; ++nj) {
#pragma unroll
        for (u32 mi = 0; mi < TILE_ROWS; ++mi) {
#pragma unroll
            for (u32 half = 0; half < 2; ++half) {
                const float2 v = output(mi, nj, half);
                largest = fmaxf(largest, fmaxf(fabsf(v.x), fabsf(v.y)));
                float* at = out + (mi * S::WOUT + half * 8) * row_step + nj * 8 * column_step;
                if (nchw) {
                    at[0] = v.x;
                    at[S::POS] = v.y;
                } else {
                    stg2(at, v);
                }
            }
        }
    }
    if (out_max_len != 0) {
        raise_chunk_maxima<S::THREADS / 32>(out_max, item, items, largest, 0.0f);
    }
}

template <class S, bool SPLIT, bool MIDDLE = false>
__device__ __forceinline__ void trunk_conv_tiles(const float* __restrict__ x, u64 x_len,
                                                 const float* __restrict__ w, u64 w_len,
                                                 const float* __restrict__ bias, u64 bias_len,
                                                 const float* __restrict__ residual,
                                                 u64 residual_len, float* __restrict__ y, u64 y_len,
                                                 const u32* __restrict__ in_max, u64 in_max_len,
                                                 u32* __restrict__ out_max, u64 out_max_len,
                                                 u32 items, u32 flags, const void* x_map) {
    using P = SlabShape<S, SPLIT, MIDDLE>;
    using L = SlabTiles<S>;
    constexpr u32 MI = L::MI, NJ = L::NJ;
    static_assert(!MIDDLE || S::CIN == S::COUT, "a middle activation is a block's own width");
    // the middle in 16 bits takes PARTS halves a value: its floats a chunk
    constexpr u64 MIDDLE_ITEM = u64(S::Y_ITEM) * P::PARTS / 2;
    // A block's output in 16 bits (one product): its reader (MIDDLE) writes it as the
    // planes (CONV_HALF_OUT) and reads the block input so (CONV_HALF_RESIDUAL), and the
    // next block's first convolution lands it as a MIDDLE kernel. Such a reader's in_max
    // spans two slots, the residual's chunk maxima then the middle's: a written bound is
    // the middle's bound through the weights plus the residual's.
    const bool half_out = P::WRITES_HALF & ((flags & CONV_HALF_OUT) != 0);
    const bool half_residual = MIDDLE & !SPLIT & ((flags & CONV_HALF_RESIDUAL) != 0);
    const bool two_slots = MIDDLE & (residual_len != 0) & (half_out | half_residual);
    const bool valid = launch_is(P::GRID_X, 1, 1, P::THREADS) & (items >= 1) &
                       (items <= TRUNK_BATCH) &
                       (x_len >= items * (MIDDLE ? MIDDLE_ITEM : S::X_ITEM)) &
                       (w_len == P::W_BYTES / 4) & (bias_len == 2 * S::COUT + (half_out ? 2 : 0)) &
                       ((residual_len == 0) |
                        (residual_len >= items * (half_residual ? MIDDLE_ITEM : S::Y_ITEM))) &
                       (y_len >= items * (half_out ? MIDDLE_ITEM : S::Y_ITEM)) &
                       (in_max_len >= (two_slots ? TRUNK_BATCH : 0) + items) &
                       ((out_max_len == 0) | (out_max_len >= items)) &
                       (flags < (MIDDLE ? 16u : 8u)) &
                       (half_out == ((flags & CONV_HALF_OUT) != 0)) &
                       (half_residual == ((flags & CONV_HALF_RESIDUAL) != 0)) &
                       (!half_out | (((residual_len == 0) | MIDDLE) &
                                     ((flags & CONV_NCHW) == 0) & (out_max_len != 0))) &
                       (!half_residual | (residual_len != 0)) &
                       (!MIDDLE | (x_map != nullptr)) & aligned16(x) & aligned16(w) &
                       aligned16(residual) & aligned16(y) & (dynamic_shared_bytes() >= P::SHARED);
    const u32 tile_count = items * P::ITEM_TILES, tile0 = blockIdx.x * TILE_TILES;
    if (!valid | (tile0 >= tile_count)) {
        return;  // uniform over the block: no barrier is split
    }
    const u32 stage_count = min(TILE_TILES, tile_count - tile0) * S::CBLOCKS;
    extern __shared__ __align__(128) float shared[];
    const saddr weights = shared_address(shared), raw = weights + P::W_BYTES;
    const saddr half = raw + P::RAW_RING;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const u32 group = warp / 4, g = lane >> 2, t = lane & 3;

    // tile -> item, its first output row and frame (the last run ends at WOUT)
    auto tile_at = [](u32 tile, u32& item, u32& h0, u32& v0) {
        item = tile / P::ITEM_TILES;
        h0 = tile % P::ITEM_TILES / P::RUNS * P::OUT_ROWS;
        v0 = min(tile % P::RUNS * TILE_FRAMES, S::WOUT - TILE_FRAMES);
    };
    for (u32 i = tid; i < P::W_BYTES / 16; i += P::THREADS) {  // the weights, once
        cp_async16_fill(weights + i * 16, w + i * 4, 16);
    }
    // Given x_map (a 4D tensor map of the input, [items][HIN][WIN][CIN] floats), thread 0
    // stages each slab as one box by the async copy engine (zeros outside the image and
    // the batch), completing on the slot's mbarrier; without one every thread copies.
    const bool tma = x_map != nullptr;
    __shared__ __align__(8) u64 slot_full[P::RING];
    const saddr full = shared_address(slot_full);
    // MIDDLE: thread 0 lands stage j's FP16 planes in set j % HALF_SETS, a part's two
    // planes as one box of the middle's 4D map of 8-byte words ([chunk, channel block,
    // part][plane][HIN][WIN x 2]): a box row is a slab row's 66 pixels, 1056 contiguous
    // bytes (with boxes of one pixel's 16 bytes a row the reader ran 22% slower than the
    // converting form in TF32 math, H100)
    auto load_middle = [&](u32 j) {
        u32 item, h0, v0;
        tile_at(tile0 + j / S::CBLOCKS, item, h0, v0);
        const u32 box = (item * S::CBLOCKS + j % S::CBLOCKS) * P::PARTS;
        const saddr set = half + j % P::HALF_SETS * P::SET_BYTES, bar = full + j % P::RING * 8;
        mbarrier_expect(bar, P::SET_BYTES);
#pragma unroll
        for (u32 part = 0; part < P::PARTS; ++part) {
            tma_load_4d(set + part * P::HALF_BYTES, x_map, (int(v0) - 1) * 2, int(h0) - 1, 0,
                        int(box + part), bar);
        }
    };
    auto load_stage = [&](u32 j) {  // channel block cb of the slab of tile j / CBLOCKS
        u32 item, h0, v0;
        tile_at(tile0 + j / S::CBLOCKS, item, h0, v0);
        const u32 cb = j % S::CBLOCKS;
        const saddr slot = raw + j % P::SLOTS * P::RAW_BYTES;
        if (tma) {
            if (tid == 0) {
                const saddr bar = full + j % P::SLOTS * 8;
                mbarrier_expect(bar, P::RAW_BYTES);
                fence_proxy_async();  // after the block's reads of the slot's last slab
                tma_load_4d(slot, x_map, int(cb * CONV_BK), int(v0) - 1, int(h0) - 1, int(item),
                            bar);
            }
            return;
        }
        const float* chunk = x + u64(item) * S::X_ITEM + cb * CONV_BK;
        for (u32 c = tid; c < P::COPIES; c += P::THREADS) {
            const u32 pixel = c / 4, row = pixel / P::SLAB_PIXELS, frame = pixel % P::SLAB_PIXELS;
            const u32 h = h0 + row - 1, v = v0 + frame - 1;  // wraps past the image: outside
            const bool in = (h < S::HIN) & (v < S::WIN);
            const float* source = in ? chunk + ((h * S::WIN + v) * S::CIN + c % 4 * 4) : x;
            cp_async16_fill(slot + c * 16, source, in ? 16 : 0);
        }
    };
    // the FP32 slab of stage j, times the chunk's scale, as FP16 pairs in FRAGMENT_ORDER
    // (SPLIT: high, and the low slab HALF_BYTES on): 16-byte copy c's four channels to
    // bytes 4c of each plane. A thread's shared reads are issued CONVERT_BATCH at a time
    // before their conversions: one read, then its use, had the conversion's products
    // wait on each read in turn (short scoreboard, the most sampled stall of the SPLIT
    // kernel).
    auto convert_stage = [&](u32 j, float scale) {
        constexpr u32 ROUNDS = (P::COPIES + P::THREADS - 1) / P::THREADS;
        const saddr slot = raw + j % P::SLOTS * P::RAW_BYTES;
        const saddr target = half + j % P::HALF_SETS * P::SET_BYTES;
#pragma unroll
        for (u32 r0 = 0; r0 < ROUNDS; r0 += CONVERT_BATCH) {
            float4 v[CONVERT_BATCH];
#pragma unroll
            for (u32 b = 0; b < CONVERT_BATCH; ++b) {
                const u32 c = tid + (r0 + b) * P::THREADS;
                if ((r0 + b < ROUNDS) && (c < P::COPIES)) {
                    v[b] = lds4(slot + c * 16);
                }
            }
#pragma unroll
            for (u32 b = 0; b < CONVERT_BATCH; ++b) {
                const u32 c = tid + (r0 + b) * P::THREADS;
                if (!((r0 + b < ROUNDS) && (c < P::COPIES))) {
                    continue;
                }
                const saddr at = target + c * 4;
                if constexpr (SPLIT) {
                    u32 high[2], low[2];
                    f16_split(v[b].x * scale, v[b].y * scale, high[0], low[0]);
                    f16_split(v[b].z * scale, v[b].w * scale, high[1], low[1]);
                    sts1(at, high[0]);
                    sts1(at + P::PLANE, high[1]);
                    sts1(at + P::HALF_BYTES, low[0]);
                    sts1(at + P::HALF_BYTES + P::PLANE, low[1]);
                } else {
                    sts1(at, f16_pair(v[b].x * scale, v[b].y * scale));
                    sts1(at + P::PLANE, f16_pair(v[b].z * scale, v[b].w * scale));
                }
            }
        }
    };

    u32 m0 = 0, tile_item = 0;
    float scale = 0.0f, out_scale = 0.0f, bound = 0.0f, residual_inverse = 0.0f;
    const u32* const middle_max = in_max + (two_slots ? TRUNK_BATCH : 0);
    auto enter_tile = [&](u32 tile) {
        u32 h0, v0;
        tile_at(tile, tile_item, h0, v0);
        m0 = tile_item * S::POS + (h0 + group * TILE_ROWS) * S::WOUT + v0;
        float inverse;
        const float largest = __uint_as_float(__ldg(middle_max + tile_item));
        half_scale_of(largest, scale, inverse);
        const float residual_bound = two_slots ? __uint_as_float(__ldg(in_max + tile_item)) : 0.0f;
        if (half_residual) {
            float unused;
            half_scale_of(residual_bound, unused, residual_inverse);
        }
        if (half_out) {  // the output's bound and scale (see the top of the file)
            bound = fmaf(largest, __ldg(bias + 2 * S::COUT), __ldg(bias + 2 * S::COUT + 1)) +
                    residual_bound;
            half_scale_of(bound, out_scale, inverse);
        }
    };
    enter_tile(tile0);

    if (tma) {
        tma_ring_init<P::RING>(full, x_map, tid);
    }
    float acc[MI][NJ][4];
    zero(acc);
    if constexpr (MIDDLE) {
        cp_async_commit();  // the weights
        if (tid == 0) {
#pragma unroll
            for (u32 j = 0; j < P::AHEAD; ++j) {
                if (j < stage_count) {
                    load_middle(j);
                }
            }
        }
    } else {
#pragma unroll
        for (u32 j = 0; j < TILE_AHEAD; ++j) {
            if (j < stage_count) {
                load_stage(j);
            }
            cp_async_commit();
        }
    }
#pragma unroll 1
    for (u32 j = 0; j < stage_count; ++j) {
        const u32 cb = j % S::CBLOCKS;
        if constexpr (!SPLIT) {
            wgmma_wait<1>();  // this group's products of stage j - 2 have read their FP16 slab
        }
        if (tma) {
            mbarrier_wait(full + j % P::RING * 8, j / P::RING & 1);
            cp_async_wait<0>();  // the weights' copies (the block's only cp.async)
        } else {
            cp_async_wait<TILE_AHEAD - 1>();
        }
        if constexpr (MIDDLE) {
            fence_proxy_async();  // the weights, to wgmma's async proxy
        }
        // slab j landed; its FP16 set and slot (j - 1) % SLOTS are free (MIDDLE: the set
        // of stage j + AHEAD, whose products, of stage j - 1 or j - 2, are complete)
        __syncthreads();
        if constexpr (MIDDLE) {
            if ((tid == 0) & (j + P::AHEAD < stage_count)) {
                fence_proxy_async();  // after the block's ldmatrix reads of that set
                load_middle(j + P::AHEAD);
            }
        } else {
            if (j + TILE_AHEAD < stage_count) {
                load_stage(j + TILE_AHEAD);
            }
            cp_async_commit();
            convert_stage(j, scale);
            fence_proxy_async();  // the FP16 slab and the weights, to wgmma's async proxy
            __syncthreads();
        }
        const u32 first = m0 + warp % 4 * 16 + g;  // this thread's first output position
        // the residual, read while the tile's last products run: in a SPLIT stage, which
        // waits for its products, before them; else after they are issued
        float2 held[MI][NJ][2];
        auto hold_residual = [&] {
            if (residual_len == 0) {
                return;  // store_slab_tile reads none
            }
            if (half_residual) {
                // this thread's channels nj 8 + 2 t and + 1 of pixel p: channel block nj / 2,
                // plane t % 2, word 2 (nj % 2) + t / 2 of the pixel's 16-byte row, where
                // store_slab_tile's CONV_HALF_OUT put them
                const u32* words = reinterpret_cast<const u32*>(residual) +
                                   ((u64(tile_item) * P::COMBOS + t % 2) * S::POS + first % S::POS) * 4 +
                                   t / 2;
#pragma unroll
                for (u32 mi = 0; mi < MI; ++mi) {
#pragma unroll
                    for (u32 nj = 0; nj < NJ; ++nj) {
#pragma unroll
                        for (u32 h = 0; h < 2; ++h) {
                            const u64 at = (u64(nj / 2 * 2) * S::POS + mi * S::WOUT + h * 8) * 4 +
                                           nj % 2 * 2;
                            const float2 v = f16_unpair(__ldg(words + at));
                            held[mi][nj][h] = make_float2(v.x * residual_inverse,
                                                          v.y * residual_inverse);
                        }
                    }
                }
                return;
            }
            const float* from = residual + (u64(first) * S::COUT + 2 * t);
#pragma unroll
            for (u32 mi = 0; mi < MI; ++mi) {
#pragma unroll
                for (u32 nj = 0; nj < NJ; ++nj) {
#pragma unroll
                    for (u32 h = 0; h < 2; ++h) {
                        const float* at = from + ((mi * S::WOUT + h * 8) * S::COUT + nj * 8);
                        held[mi][nj][h] = __ldg(reinterpret_cast<const float2*>(at));
                    }
                }
            }
        };
        if (SPLIT && cb == S::CBLOCKS - 1) {
            hold_residual();
        }
        // the group's output row mi, tap (dy, dx): slab row group * TILE_ROWS + mi + dy
        // from frame dx on, 64 consecutive 16-byte rows of each plane
        const saddr slab = half + j % P::HALF_SETS * P::SET_BYTES +
                           (group * TILE_ROWS * P::SLAB_PIXELS) * 16;
        if constexpr (SPLIT) {
            tile_products_held<S, P>(acc, slab, weights, cb);
        } else {
            tile_products<S, P>(acc, slab, weights, cb);
        }
        if (!SPLIT && cb == S::CBLOCKS - 1) {
            hold_residual();
        }
        if (cb == S::CBLOCKS - 1) {
            wgmma_wait<0>();
#pragma unroll
            for (u32 mi = 0; mi < MI; ++mi) {
                register_fence(acc[mi]);
            }
            store_slab_tile<P>(acc, scale, tile_item, items, first, t, bias, residual_len, y,
                               out_max, out_max_len, flags, held, out_scale, bound);
            zero(acc);
            if (j + 1 < stage_count) {
                enter_tile(tile0 + (j + 1) / S::CBLOCKS);
            }
        }
    }
    cp_async_wait<0>();
}

}  // namespace spk

#endif
