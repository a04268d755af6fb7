// segconv kernels of the segdense module (included by segdense.cu)
//
// Valid five-tap NCW convolutions without bias, FP32 SIMT (both tiers):
//   y[b][o][p] = sum_{ci, tap} w[(ci * 5 + tap) * 64 + slot(o)] * x[b][ci][p + tap]
// x [b, cin, L]; w the packed [cin * 5, 64] weight, each row in slot order (below);
// y [b, 60, P], P = L - 4. Grid (ceil(P / POS), b, 1): block (x, y) owns positions
// [POS x, POS x + POS) of item y and all 60 channels.
//
// Thread tile: 4 consecutive positions x 15 channels (60 accumulators), no padded
// channel computed. A block of GROUPS * POS threads holds GROUPS copies of its
// POS x 60 tile; group g sums the input channels ci = g (mod GROUPS). The batch-1
// grids have one block per SM, so splitting the reduction over groups is what keeps
// all eight warps of the SM busy with the same number of products.
//
// Order of each output (what a bit-exact emulation must follow): a partial sum runs by
// sequential fma from zero over its ci ascending and, inside one ci, taps 0..4.
// GROUPS > 1: group g's partial g_g covers the ci = g (mod GROUPS); h_j = g_j +
// g_{j + GROUPS/2} for j < GROUPS/2, and the output is ((h_0 + h_1) + h_2) + ....
// GROUPS = 1: partial b_k covers ci [20 k, 20 k + 20) and the output is
// ((b_0 + b_1) + b_2) + ...: blocks of 100 products rather than one chain of 400
// halve the typical error (the GPU tests hold it to twice the library's).
//
// Staging: stage st covers ci [st * ROWS, st * ROWS + ROWS), ROWS = S * GROUPS (row
// s * GROUPS + g is group g's s-th ci of the stage). Its x window (ROWS rows of
// POS + 4 positions) and its ROWS * 5 contiguous weight rows are loaded into registers
// during stage st - 1's products and stored to the idle one of two shared buffers;
// one barrier per stage.
//
// Slot order (`pack_conv_rows` at plan time): a packed weight row holds channel
// o = 15 cg + 4 q + e at column slot(o) = 16 q + 4 cg + e and zeros in columns 51, 55,
// 59 and 63 (q = 3, e = 3), so channel group cg reads channels 15 cg + 4 q + {0..3} as
// one aligned float4 (the four channel groups of a warp: 64 contiguous bytes) and a
// stage's rows are copied to shared memory unchanged, one float4 store each, with no
// remapping and no padding rows against bank conflicts.

#pragma once

#include "common.cuh"

namespace spk {
namespace conv {

constexpr u32 TAPS = 5;
constexpr u32 OUT = 60;       // output channels
constexpr u32 PACKED = 64;    // packed weight row: OUT channels and 4 zeros, slot order
constexpr u32 TILE_CH = 15;   // channels per thread
constexpr u32 TILE_POS = 4;   // positions per thread

// An opaque copy: left alone, the compiler recomputes thread-index arithmetic from
// %tid.x inside the stage loop instead of holding the result in a register.
__device__ __forceinline__ u32 held(u32 value) {
    asm("" : "+r"(value));
    return value;
}

template <u32 CIN_, u32 L_, u32 BATCH_, u32 POS_, u32 GROUPS_, u32 S_>
struct Shape {
    static constexpr u32 CIN = CIN_, L = L_, BATCH = BATCH_, POS = POS_, GROUPS = GROUPS_,
                         S = S_;
    static constexpr u32 P = L - 4;
    static constexpr u32 THREADS = GROUPS * POS;  // POS / 4 position groups x 4 cg
    static constexpr u32 BLOCKS = (P + POS - 1) / POS;
    static constexpr u32 ROWS = S * GROUPS;       // input channels per stage
    static constexpr u32 STAGES = (CIN + ROWS - 1) / ROWS;
    static constexpr bool EXACT = CIN % ROWS == 0;  // every stage row is a real ci
    static constexpr u32 XCOLS = POS + 4;
    static constexpr u32 XS = ROWS * XCOLS;
    static constexpr u32 WCI = TAPS * PACKED;     // one ci's weights in w
    static constexpr u32 WS = ROWS * WCI;
    static constexpr u32 STAGE = XS + WS;         // floats per buffer
    static constexpr u32 WF4 = ROWS * WCI / 4;    // weight float4 per stage
    static constexpr u32 WLOADS = (WF4 + THREADS - 1) / THREADS;
    static constexpr u32 HALO = 4 * ROWS;         // x columns POS..POS+3 of each row
    static constexpr u32 TILE = OUT * POS;        // one output tile, [60][POS]
    static constexpr u32 PARTIALS = GROUPS / 2;   // tiles in shared for the combine
    static constexpr u32 BLOCK_CI = 20;           // GROUPS = 1: ci per partial b_k
    static constexpr u32 FLUSH = BLOCK_CI / S;    // stages per partial
    // GROUPS = 1 keeps its running total in a tile beside the stage buffers; the
    // combine of GROUPS > 1 reuses the stage buffers once the products are done
    static constexpr u32 TOTAL_AT = GROUPS == 1 ? 2 * STAGE : 0;  // floats
    static constexpr u32 OUTBOUND = GROUPS == 1 ? 2 * STAGE + TILE : PARTIALS * TILE;
    static constexpr u32 SHARED = 2 * STAGE > OUTBOUND ? 2 * STAGE : OUTBOUND;

    static_assert(POS % 32 == 0, "whole warps per group");
    static_assert(GROUPS == 1 ? THREADS == POS : GROUPS % 2 == 0 && THREADS % POS == 0,
                  "one group, or pairs combined first");
    static_assert(HALO <= THREADS, "one halo element per thread at most");
    static_assert(WF4 % 32 == 0, "weight loads by whole warps");
    static_assert(XCOLS % 4 == 0 && TILE % 4 == 0, "float4 alignment");
    static_assert(XS % 4 == 0 && STAGE % 4 == 0, "float4 weight rows");
    static_assert(SHARED * 4 <= 48 * 1024, "static shared limit");
    static_assert(ROWS <= CIN, "a moved last stage stays inside the input");
    static_assert(GROUPS > 1 || (BLOCK_CI % S == 0 && CIN % BLOCK_CI == 0 && EXACT),
                  "whole partials of whole stages");
};

// Out through shared tiles: the last stage's barrier is behind every thread, so the
// stage buffers are free. GROUPS == 1 stores the total the stage loop kept; otherwise
// the groups' partials are combined in group order first.
template <class K>
__device__ __forceinline__ void write_out(float (&acc)[TILE_POS][TILE_CH], float* smem, u32 t,
                                          u32 g, u32 pg, u32 cg, u32 pos0,
                                          float* __restrict__ y) {
    auto tile_row = [&](u32 row) { return smem + row * K::POS + pg * 4; };
    // Consecutive threads store consecutive positions of a channel: a thread stores
    // position p = t % POS (THREADS is a multiple of POS) of channels t / POS + CH_STEP j.
    constexpr u32 CH_STEP = K::THREADS / K::POS;
    const u32 p = t % K::POS;
    const u32 o0 = t / K::POS;
    const bool in_range = pos0 + p < K::P;
    float* const yo = y + (u64(blockIdx.y) * OUT + o0) * K::P + pos0 + p;
    const float* const part = smem + o0 * K::POS + p;

    if constexpr (K::GROUPS == 1) {
        // the last partial went into the total before the loop's final barrier
        if (in_range) {
#pragma unroll
            for (u32 o = 0; o < OUT; ++o) {
                yo[o * K::P] = part[K::TOTAL_AT + o * K::POS];
            }
        }
    } else {
        // Combine: groups HALF.. write their partials, groups ..HALF add them in (h_g),
        // every thread sums the h_g of its outputs in group order.
        constexpr u32 HALF = K::PARTIALS;
        if (g >= HALF) {
#pragma unroll
            for (u32 c = 0; c < TILE_CH; ++c) {
                store4(tile_row((g - HALF) * OUT + TILE_CH * cg + c),
                       make_float4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]));
            }
        }
        __syncthreads();
        if (g < HALF) {
            // written over the partial just read: no other thread touches these addresses
#pragma unroll
            for (u32 c = 0; c < TILE_CH; ++c) {
                float* at = tile_row(g * OUT + TILE_CH * cg + c);
                const float4 other = lds4(at);
                store4(at, make_float4(acc[0][c] + other.x, acc[1][c] + other.y,
                                       acc[2][c] + other.z, acc[3][c] + other.w));
            }
        }
        __syncthreads();
        if (in_range) {
#pragma unroll
            for (u32 j = 0; j < (OUT + CH_STEP - 1) / CH_STEP; ++j) {
                if (OUT % CH_STEP == 0 || o0 + j * CH_STEP < OUT) {
                    float sum = part[j * CH_STEP * K::POS];
#pragma unroll
                    for (u32 h = 1; h < HALF; ++h) {
                        sum += part[h * K::TILE + j * CH_STEP * K::POS];
                    }
                    yo[j * CH_STEP * K::P] = sum;
                }
            }
        }
    }
}

// The whole kernel for one shape; returns without writing on any mismatch.
template <class K>
__device__ __forceinline__ void run(const float* __restrict__ x, u64 x_len,
                                    const float* __restrict__ w, u64 w_len,
                                    float* __restrict__ y, u64 y_len) {
    if (x_len != u64(K::BATCH) * K::CIN * K::L | w_len != u64(K::CIN) * K::WCI |
        y_len != u64(K::BATCH) * OUT * K::P | !aligned16(w) |
        !launch_is(K::BLOCKS, K::BATCH, 1, K::THREADS)) {
        return;
    }
    __shared__ __align__(16) float smem[K::SHARED];

    const u32 t = threadIdx.x;
    const u32 pos0 = blockIdx.x * K::POS;
    const u32 item = blockIdx.y * K::CIN * K::L;  // < 2^24: offsets fit 32 bits

    // Compute role: group g; 8 position groups x 4 channel groups per warp. Lane bits
    // 0, 2, 3 give pg % 8 and bits 1, 4 give cg, so lanes i and i ^ 1 share every
    // weight address and lanes i and i ^ 2 every x address: shared memory then packs
    // two lanes per returned register, and an LDS.128 costs two cycles of the SM's
    // 128 B/cycle return instead of four.
    const u32 g = t / K::POS;
    const u32 u = t % K::POS;
    const u32 lane = u % 32;
    const u32 pg = (u / 32) * 8 + (lane & 1) + ((lane >> 2) & 3) * 2;
    const u32 cg = ((lane >> 1) & 1) + (lane >> 4) * 2;
    const u32 x_tile = held(g * K::XCOLS + pg * 4);
    const u32 w_tile = held(K::XS + g * K::WCI + 4 * cg);

    // Staging role. x: column t % POS of stage rows t / POS + GROUPS j, and threads
    // below HALO one of the 4 halo columns. A position past the row end reads the row's
    // last element instead: it only reaches outputs p >= P, which are never stored.
    const u32 x_row = t / K::POS;
    const u32 x_col = t % K::POS;
    const u32 h_row = t / 4;
    const u32 h_col = K::POS + t % 4;
    const bool has_halo = t < K::HALO;
    // element offsets from x and w rather than pointers: fewer registers held
    const u32 x_src = held(item + x_row * K::L + min(pos0 + x_col, K::L - 1));
    const u32 h_src =
        held(item + (has_halo ? h_row : 0) * K::L + min(pos0 + h_col, K::L - 1));
    const u32 x_dst = held(x_row * K::XCOLS + x_col);
    const u32 h_dst = held(has_halo ? h_row * K::XCOLS + h_col : 0);
    // w: float4 t + THREADS j of the stage's contiguous weight rows, in place
    const u32 w_src = t * 4;
    const u32 w_dst = K::XS + t * 4;

    float xr[K::S];
    float xh = 0.0f;
    float4 wr[K::WLOADS];

    // First ci of the rows staged for a stage. An inexact shape's last stage is moved
    // back to end at CIN (it restages a few rows of the stage before), so that every
    // staged row is real and no load needs a predicate; the products then start at
    // row stage * ROWS - first(stage).
    auto first = [](u32 stage) {
        return K::EXACT ? stage * K::ROWS : min(stage * K::ROWS, K::CIN - K::ROWS);
    };
    auto fetch = [&](u32 stage) {
        const u32 ci0 = first(stage);
#pragma unroll
        for (u32 j = 0; j < K::S; ++j) {
            xr[j] = __ldg(x + x_src + (ci0 + j * K::GROUPS) * K::L);
        }
        // every thread loads (an in-bounds address), threads >= HALO store nothing
        xh = __ldg(x + h_src + ci0 * K::L);
#pragma unroll
        for (u32 j = 0; j < K::WLOADS; ++j) {
            if ((j + 1) * K::THREADS <= K::WF4 || t + j * K::THREADS < K::WF4) {
                wr[j] = load4(w + w_src + ci0 * K::WCI + j * K::THREADS * 4);
            }
        }
    };
    auto stash = [&](u32 offset) {
#pragma unroll
        for (u32 j = 0; j < K::S; ++j) {
            smem[x_dst + offset + j * K::GROUPS * K::XCOLS] = xr[j];
        }
        if (has_halo) {
            smem[h_dst + offset] = xh;
        }
#pragma unroll
        for (u32 j = 0; j < K::WLOADS; ++j) {
            if ((j + 1) * K::THREADS <= K::WF4 || t + j * K::THREADS < K::WF4) {
                store4(smem + w_dst + offset + j * K::THREADS * 4, wr[j]);
            }
        }
    };

    float acc[TILE_POS][TILE_CH];
    zero(acc);

    // This thread's part of a [rows][POS] tile in shared memory: rows 15 cg + c,
    // columns 4 pg .. 4 pg + 3 (one float4 per channel).
    auto tile_row = [&](u32 row) { return smem + row * K::POS + pg * 4; };

    fetch(0);
    stash(0);
    __syncthreads();
    for (u32 stage = 0; stage < K::STAGES; ++stage) {
        const u32 offset = (stage & 1) * K::STAGE;
        // Unconditional, so the loads stay ahead of the products: the last stage
        // refetches itself into the idle buffer, which nothing reads again.
        fetch(min(stage + 1, K::STAGES - 1));
        // Every warp computes, also past P in the last block: skipping those warps
        // with a branch costs the batch-32 shapes registers (and spills).
        {
            const u32 shift = stage * K::ROWS - first(stage);  // 0 but in a moved stage
            const u32 x_at = x_tile + offset + shift * K::XCOLS;
            const u32 w_at = w_tile + offset + shift * K::WCI;
            // uniform per warp: a group is whole warps. A row that every stage has
            // (folded per s) skips the test: no branch then keeps the row's shared
            // loads behind the previous products or the barrier
            auto has_row = [&](u32 s) {
                const bool always =
                    K::EXACT || (K::STAGES - 1) * K::ROWS + (s + 1) * K::GROUPS <= K::CIN;
                return always || stage * K::ROWS + s * K::GROUPS + g < K::CIN;
            };
            float xv[K::S][TILE_POS + TAPS - 1];
            float wv[K::S][TAPS][TILE_CH];
            auto read_row = [&](u32 s) {
                const float* xt = smem + x_at + s * K::GROUPS * K::XCOLS;
                const float4 xa = lds4(xt);
                const float4 xb = lds4(xt + 4);
                const float xq[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                for (u32 i = 0; i < 8; ++i) {
                    xv[s][i] = xq[i];
                }
                const float* wt = smem + w_at + s * K::GROUPS * K::WCI;
#pragma unroll
                for (u32 tap = 0; tap < TAPS; ++tap) {
                    const float4 w0 = lds4(wt + tap * PACKED);
                    const float4 w1 = lds4(wt + tap * PACKED + 16);
                    const float4 w2 = lds4(wt + tap * PACKED + 32);
                    const float4 w3 = lds4(wt + tap * PACKED + 48);
                    const float quads[16] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y,
                                             w1.z, w1.w, w2.x, w2.y, w2.z, w2.w,
                                             w3.x, w3.y, w3.z, w3.w};
#pragma unroll
                    for (u32 c = 0; c < TILE_CH; ++c) {
                        wv[s][tap][c] = quads[c];
                    }
                }
            };
            // Position by position, each over all taps and channels. Every accumulator
            // takes its input channels and taps in order whatever the loop nest, so the
            // nest is free: this is the one ptxas schedules best.
            auto products = [&](u32 s) {
#pragma unroll
                for (u32 p = 0; p < TILE_POS; ++p) {
#pragma unroll
                    for (u32 tap = 0; tap < TAPS; ++tap) {
#pragma unroll
                        for (u32 c = 0; c < TILE_CH; ++c) {
                            acc[p][c] = fmaf(xv[s][p + tap], wv[s][tap][c], acc[p][c]);
                        }
                    }
                }
            };
            // Where every stage has all its rows (EXACT), the stage's shared reads all
            // come before its products; otherwise (conv2_b1) row by row, which is faster
            // there. Either way each accumulator's order is the same.
#pragma unroll
            for (u32 s = 0; s < K::S; ++s) {
                if (has_row(s)) {
                    read_row(s);
                    if constexpr (!K::EXACT) {
                        products(s);
                    }
                }
            }
            if constexpr (K::EXACT) {
#pragma unroll
                for (u32 s = 0; s < K::S; ++s) {
                    products(s);
                }
            }
        }
        // the idle buffer's readers finished before the previous barrier
        stash(K::STAGE - offset);
        if constexpr (K::GROUPS == 1) {
            if ((stage + 1) % K::FLUSH == 0) {
                // total = total + b_k (b_0 alone first), in this thread's own slots
                if (stage + 1 == K::FLUSH) {
#pragma unroll
                    for (u32 c = 0; c < TILE_CH; ++c) {
                        store4(tile_row(TILE_CH * cg + c) + K::TOTAL_AT,
                               make_float4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]));
                    }
                } else {
#pragma unroll
                    for (u32 c = 0; c < TILE_CH; ++c) {
                        float* at = tile_row(TILE_CH * cg + c) + K::TOTAL_AT;
                        const float4 total = lds4(at);
                        store4(at, make_float4(total.x + acc[0][c], total.y + acc[1][c],
                                               total.z + acc[2][c], total.w + acc[3][c]));
                    }
                }
                zero(acc);
            }
        }
        __syncthreads();
    }

    write_out<K>(acc, smem, t, g, pg, cg, pos0, y);
}

// S = 2 everywhere keeps the stage loop near 11 KB of code, inside the per-partition
// instruction cache.
//                    CIN   L  BATCH POS GROUPS S
using Conv1B1 = Shape<80, 5325, 1, 64, 4, 2>;
using Conv1B32 = Shape<80, 5325, 32, 128, 1, 2>;
using Conv2B1 = Shape<60, 1773, 1, 32, 8, 2>;
using Conv2B32 = Shape<60, 1773, 32, 128, 1, 2>;

}  // namespace conv
}  // namespace spk

#define SPK_CONV_ENTRY(NAME, SHAPE, MIN_BLOCKS)                                           \
    SPK_CONV_KERNEL(NAME, SHAPE::THREADS, MIN_BLOCKS,                                      \
                    spk::conv::run<SHAPE>(x, x_len, w, w_len, y, y_len))

// conv1 batch 1: grid 84 x 256 threads; four groups of two warps, 20 ci each.
SPK_CONV_ENTRY(spk_segdense_conv1_b1, spk::conv::Conv1B1, 1)
// conv1 batch 32: grid (42, 32) x 128 threads, one group; three blocks per SM.
SPK_CONV_ENTRY(spk_segdense_conv1_b32, spk::conv::Conv1B32, 3)
// conv2 batch 1: grid 56 x 256 threads; eight one-warp groups with 8 ci (groups 0..3)
// or 7 (4..7): warps w and w + 4 share an SM sub-partition, 15 ci per pair.
SPK_CONV_ENTRY(spk_segdense_conv2_b1, spk::conv::Conv2B1, 1)
// conv2 batch 32: grid (14, 32) x 128 threads, one group; three blocks per SM.
SPK_CONV_ENTRY(spk_segdense_conv2_b32, spk::conv::Conv2B32, 3)

#undef SPK_CONV_ENTRY
