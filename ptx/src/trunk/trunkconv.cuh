// The ResNet34 trunk's convolutions as implicit GEMMs on tensor cores (sm80 tier).
//
// Layout: activations NHWC (channels innermost), FP32, so one reduction step of 16
// input channels of one tap is a contiguous 64-byte run of every output position's input
// pixel. Weights (BatchNorm folded in, the plan's bias) as FP16 pair words, k = tap * CIN
// + ci, each step's 16 k in the order that makes a lane's a fragment of one row its four
// consecutive channels (pair p = t holds channels 4 t, 4 t + 1, pair t + 4 channels
// 4 t + 2, 4 t + 3: FRAGMENT_ORDER in pyspk.candidate.trunk.folding): per step and column
// n, for t = 0..3 the words high(p = t), high(p = t + 4) and, SPLIT, low(p = t),
// low(p = t + 4) that are lane t's b fragments, [K / 16][CO][4][4 or 2], one 16- or
// 8-byte load.
//
// GEMM: rows = output positions (item, ho, wo), columns = output channels, reduction
// k = (ky * KS + kx) * CIN + ci. A block owns 256 positions by BN channels (BN = 128, or
// the layer's 32 or 64): the wider the block, the fewer times the activations cross L2.
// Its warps own 32 positions x 64 channels in the 3x3 layers 64 or more wide (but the
// stride-2 64-wide one), 64 x 32 elsewhere, each a grid of 16 m16n8k16 tiles. Steps of
// 16 reduction elements flow through a cp.async ring (ring_stages deep, STEPS per
// stage); padding and positions past the batch's items are zero-filled copies that read
// nothing, or (STRIP) a row of zeros read in place of the strip row.
//
// Maths, on FP16 products (twice TF32's mma.sync rate, docs/performance.md):
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
// Sums (SPLIT): each step's products (in the sm90 strips, each stage's three steps':
// group_stage_split) go to a fresh accumulator that is then added to the running sum
// in FP32 (round to nearest). The tensor cores align an mma's products to
// its largest term, the accumulator included, and drop the bits below: adding straight
// into a running sum that has grown over K = 288..2304 terms measured 9-13x cuDNN
// FP32's error per layer with 3xTF32 (docs/performance.md). Plain adds straight into
// the running sum: there the operands' rounding dominates. Every sum runs in a fixed
// order (the steps in the ring's order, k ascending within a step; then scales, + bias,
// + residual), so a run's bits repeat.
//
// Epilogue: the sum times the row's and the column's inverse scales (exact), + bias,
// + residual (NHWC, the block's shortcut), ReLU where flags bit 0 is set; flags bit 1
// writes the output NCHW (the trunk's last layer, for the pooling). Where out_max is
// given, each chunk's largest output magnitude is raised into it with atomicMax on the
// float bits (order-free, so deterministic): the next layer's in_max.

#pragma once

#include "common.cuh"
#include "sm80.cuh"
#include "sm90.cuh"

namespace spk {

constexpr u32 TRUNK_BATCH = 32;
constexpr u32 TRUNK_BINS = 80;      // fbank mel bins: the trunk's height
constexpr u32 TRUNK_FRAMES = 998;   // fbank frames of a 10 s chunk: the trunk's width
constexpr u32 CONV_BM = 256;        // output positions per block
constexpr u32 CONV_BK = 16;         // reduction elements per step
constexpr u32 CONV_STAGES = 3;
// (sm90 tier) the strips' copy ring: with two slots a stage's copies, issued one stage
// ahead, kept the one-product strips waiting on the async copy engine (17% of layer3's
// warp samples on an H100). Three slots in the 64-wide strips (a fourth would not fit
// their two blocks an SM); in the 128-wide (one block) four in TF32 math and two in
// FP32, where deeper rings measured slower (docs/performance.md, "The strips' copy ring
// on the sm90 tier").
constexpr u32 CONV_SM90_STRIP_STAGES_NARROW = 3;
constexpr u32 CONV_SM90_STRIP_STAGES_WIDE = 4;
constexpr u32 CONV_SM90_STRIP_STAGES_WIDE_SPLIT = 2;
// (sm90 tier) the stride-2 3x3s' ring, a tap of 16 channels a slot: with three, their
// TF32 kernels took 4% to 9% longer on an H200 (FP32 alike); four to six slots measured
// alike
constexpr u32 CONV_SM90_DOWN_STAGES_NARROW = 5;
constexpr u32 CONV_SM90_DOWN_STAGES_WIDE = 6;
// rows of a strip's box by the async copy engine (sm90): 86 rows of 64 bytes are a whole
// number of 128 bytes, and three make the strip; the host's tensor maps use the same box
constexpr u32 CONV_TMA_BOX = 86;
// (sm90 strips) residual pairs a thread's epilogue loads in one batch: four column tiles
// of one row tile, two of two (16 pairs spilled in every sm90 strip)
constexpr u32 EPILOGUE_PAIRS = 8;
// (sm90 strips 128 wide, three products) threads a block: two warpgroups of two 64-row
// tiles, each product m64n128, so one converted fragment serves all 128 columns (four
// warpgroups of m64n64 products converted each fragment twice: 192 of a stage's 569
// instructions a warp were conversions); at up to 255 registers, one block an SM. On an
// H100 layer4 2% faster, layer3 0.3%; three or four ring slots gained nothing more
constexpr u32 CONV_SM90_WIDE_SPLIT_THREADS = 256;
constexpr u32 CONV_RELU = 1;  // epilogue flags
constexpr u32 CONV_NCHW = 2;

// 16-byte A copies per thread and stage for `rows` rows of 16 channels (four copies a
// row) among `threads` threads: the last round partly
constexpr u32 a_copies(u32 rows, u32 threads) { return (rows * 4 + threads - 1) / threads; }

template <u32 CIN_, u32 COUT_, u32 HIN_, u32 WIN_, u32 STRIDE_, u32 KS_>
struct ConvShape {
    static constexpr u32 CIN = CIN_, COUT = COUT_, HIN = HIN_, WIN = WIN_;
    static constexpr u32 STRIDE = STRIDE_, KS = KS_, PAD = KS_ / 2;
    static constexpr u32 HOUT = (HIN + 2 * PAD - KS) / STRIDE + 1;
    static constexpr u32 WOUT = (WIN + 2 * PAD - KS) / STRIDE + 1;
    static constexpr u32 POS = HOUT * WOUT;  // output positions per item
    static constexpr u32 BM = CONV_BM, BK = CONV_BK;  // (as trunkgroups.cuh sees them)
    static constexpr u32 K = KS * KS * CIN;
    static constexpr u32 KTILES = K / CONV_BK;
    static constexpr u32 CBLOCKS = CIN / CONV_BK;  // steps per tap
    static constexpr u32 BN = COUT < 128 ? COUT : 128;
    // Warp tiles of MI x NJ m16n8k16 tiles (16 accumulator tiles): 32 x 64 in the 3x3
    // layers 128 wide, and 64 wide at stride 1, so a warp converts half the rows it would
    // at 64 x 32 for the same products (the stride-1 64-wide layer: 513.4 against 601.8
    // us per launch in FP32 math); 64 x 32 elsewhere, where 32 x 64 spilled registers on
    // sm_80 to sm_120 (docs/performance.md).
    static constexpr u32 NJ = KS == 3 && (BN >= 128 || (BN == 64 && STRIDE == 1)) ? 8 : 4, MI = 16 / NJ;
    static constexpr u32 WARPS_M = CONV_BM / (16 * MI), WARPS_N = BN / (8 * NJ);
    static constexpr u32 THREADS = 32 * WARPS_M * WARPS_N;  // = 4 BN
    // 16 warps per SM: the blocks' registers (up to 128 per thread) allow no more; the
    // 32-wide layer's four blocks of 4 warps (three, at up to 168 registers, measured
    // 849.2 against 735.9 us per launch in FP32 math).
    static constexpr u32 MIN_BLOCKS = 512 / THREADS;
    // A stride-1 3x3 (STRIP) stages one kernel row dy of 16 input channels: its taps dx
    // = 0, 1, 2 read one run of A_ROWS = 258 consecutive input pixels (NHWC, flat), row r
    // at r + dx, as the flat input index of an output position is its own + (dy - 1)
    // WIN + dx - 1. So the activations cross L2 once per kernel row, not per tap, and a
    // ring stage holds STEPS = 3 steps of 16. A tap that leaves the image reads the
    // stage's row of zeros instead (ZERO_ROW).
    static constexpr bool STRIP = STRIDE == 1 && KS == 3;
    static constexpr u32 STEPS = STRIP ? KS : 1;  // steps of CONV_BK per stage
    static constexpr u32 A_ROWS = STRIP ? CONV_BM + 2 : CONV_BM;
    static constexpr u32 KSTAGES = K / (STEPS * CONV_BK);
    // Two stages where a stage is three steps (STRIP), three otherwise: every block stays
    // within the 99 KB of sm_86 and sm_89 (the 32-wide layer, a strip, fits four blocks
    // an SM). On the sm90 tier the strips 64 or more wide and the stride-2 3x3s ring
    // deeper: ring_stages.
    static constexpr u32 STAGES = STRIP ? 2 : CONV_STAGES;
    // A row stride in words. The A fragment reads are 16 bytes (a lane's four channels
    // of one row), served per quarter warp: rows g, g + 1 at 16 g + 4 t cover the banks,
    // as do the B reads, 16 bytes (8 with one product) at 16 g + 4 t (8 g + 2 t) words.
    // (Two 8-byte reads per row at stride 24 measured 0.580 against 0.542 ms per chunk
    // in FP32 math with the rest as now: the wider rows kept three blocks an SM in the
    // 32-wide layer.)
    static constexpr u32 A_STRIDE = CONV_BK;
    // (STRIP) after the strip, a row of zeros that a tap outside the image reads
    // instead: there its strip row holds another position's pixel (of this chunk, or at
    // a chunk's first and last position of the next), which must not reach the sums even
    // if not finite, as a zero scale would let it (0 x NaN). Never a copy's target.
    static constexpr u32 ZERO_ROW = A_ROWS, A_SLOT_ROWS = STRIP ? A_ROWS + 2 : A_ROWS;
    // (STRIP on the sm90 tier) the strip arrives by the async copy engine in boxes of
    // TMA_BOX rows, each box's shared address 128-byte aligned, the slot a whole number
    // of 128 bytes (the pad row after the zero row)
    static constexpr u32 TMA_BOX = CONV_TMA_BOX, TMA_BOXES = A_ROWS / TMA_BOX;
    static constexpr u32 STAGE_WORDS = A_SLOT_ROWS * A_STRIDE + STEPS * BN * CONV_BK;
    static constexpr u32 A_COPIES = a_copies(A_ROWS, THREADS);
    static constexpr u64 X_ITEM = u64(HIN) * WIN * CIN, Y_ITEM = u64(POS) * COUT;
    // Output tiles of CONV_BM rows per block (STRIP only): its ring runs on from one
    // tile's last stage to the next tile's first, so the 32-wide layer's short sums (K =
    // 288, six stages) wait less on each tile's first copies (four tiles: 896.1 against
    // 975.7 us per launch in FP32 math, at stride 24 words).
    static constexpr u32 TILES = STRIP && BN == 32 ? 4 : 1;
    static constexpr u32 GRID_X = ((TRUNK_BATCH * POS + CONV_BM - 1) / CONV_BM + TILES - 1) / TILES;
    static constexpr u32 GRID_Y = COUT / BN;
    static_assert(CIN % CONV_BK == 0 && COUT % 32 == 0, "channel counts the tiles divide");
    static_assert(!STRIP || (TMA_BOXES * TMA_BOX == A_ROWS && STAGE_WORDS % 32 == 0 &&
                             TMA_BOX * A_STRIDE % 32 == 0),
                  "a strip's boxes and slots 128-byte aligned");
    // columns of a warpgroup's wgmma tile (GroupTiles): 64 keeps a tile's fresh sums at
    // 32 registers a thread beside 16 warps an SM
    static constexpr u32 GROUP_N = 64;
    static_assert(POS > CONV_BM, "a block's rows span at most two items");
    static_assert(u64(TRUNK_BATCH) * HIN * WIN * CIN < (1ull << 31), "32-bit offsets");
};

// Shape S launched as CONV_SM90_WIDE_SPLIT_THREADS threads of m64n128 warpgroup tiles
// (the sm90 tier's 128-wide strips in FP32 math): the same rows, sums and ring.
template <class S>
struct WideGroups : S {
    static constexpr u32 THREADS = CONV_SM90_WIDE_SPLIT_THREADS, MIN_BLOCKS = 1, GROUP_N = 128;
    static constexpr u32 A_COPIES = a_copies(S::A_ROWS, THREADS);
    static_assert(S::STRIP && S::BN == GROUP_N, "the 128-wide strips");
};

// Raises maxima[item] and maxima[item + 1] to the largest of the block's `first` and
// `second` (magnitudes, as float bits: their order is the unsigned one), with at most one
// atomic per chunk and tile: the same-address atomics of every warp measured 422 us in
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

// How a block's warps share its CONV_BM x BN tile. Each warp's sums are MI x NJ tiles of
// 16 x 8 (rows row0 + mi ROW_STEP + 8 half + g, columns col0 + 8 nj + 2 t, the mma
// accumulator layout), whichever instruction computes them.
//
// WarpTiles: mma.sync, each warp a grid of S::MI x S::NJ tiles (the sm80 tier).
template <class S>
struct WarpTiles {
    static constexpr bool WGMMA = false;
    static constexpr u32 MI = S::MI, NJ = S::NJ, ROW_STEP = 16;
    static constexpr u32 FRESH = 1;  // (unused: warp_products keeps its own fresh sums)
    static constexpr u32 A_SETS = 1;
    static __device__ __forceinline__ u32 row0(u32 warp) { return (warp % S::WARPS_M) * 16 * MI; }
    static __device__ __forceinline__ u32 col0(u32 warp) { return (warp / S::WARPS_M) * 8 * NJ; }
};

}  // namespace spk

#include "trunkgroups.cuh"
#include "trunkstage.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

namespace spk {

// The epilogue of one tile (rows m0 on, this thread's fragment rows, L's, and columns
// n0 + nj * 8 + 2 t): the sums times the row's and the column's inverse scales (exact), + bias,
// + residual, ReLU, stored NHWC or NCHW; each chunk's largest output raised into out_max.
// Every thread of the block calls it.
template <class S, class L>
__device__ __forceinline__ void store_tile(const float (&acc)[L::MI][L::NJ][4],
                                           const float (&row_scale)[L::MI][2], u32 m0, u32 rows,
                                           u32 items, u32 row0, u32 n0, u32 g, u32 t,
                                           const float* __restrict__ bias,
                                           const float* __restrict__ residual, u64 residual_len,
                                           float* __restrict__ y, u32* __restrict__ out_max,
                                           u64 out_max_len, u32 flags) {
    const bool relu = flags & CONV_RELU, nchw = flags & CONV_NCHW;
    const u32 first_item = m0 / S::POS;
    float largest_first = 0.0f, largest_next = 0.0f;  // of first_item's rows, the next item's
    // The sm90 strips issue a batch of column tiles' loads (bias, inverse scales,
    // residual pairs) before using the first. Loaded where each was used, every residual
    // pair waited on the L2 in turn (a third of layer2's FP32 warp samples); a column
    // tile at a time, each tile's loads still waited in turn (16 waits a tile in
    // layer3's sm_90a SASS, 4 in batches, and its TF32 launches 5% faster). Elsewhere
    // the registers are not there (the sm80 tier and the sm90 shortcuts spilled): a
    // column tile at a time, the residual read where it is added.
    constexpr bool READ_FIRST = L::WGMMA && S::STRIP;
    constexpr u32 BATCH = READ_FIRST ? EPILOGUE_PAIRS / (2 * L::MI) : 1;  // column tiles
    static_assert(L::NJ % BATCH == 0, "whole batches of column tiles");
#pragma unroll
    for (u32 nj0 = 0; nj0 < L::NJ; nj0 += BATCH) {
        float2 bias_pair[BATCH], column_inverse[BATCH], read[BATCH][L::MI][2];
#pragma unroll
        for (u32 b = 0; b < BATCH; ++b) {
            const u32 n = n0 + (nj0 + b) * 8 + 2 * t;
            bias_pair[b] = __ldg(reinterpret_cast<const float2*>(bias + n));
            column_inverse[b] = __ldg(reinterpret_cast<const float2*>(bias + S::COUT + n));
#pragma unroll
            for (u32 mi = 0; mi < L::MI; ++mi) {
#pragma unroll
                for (u32 half = 0; half < 2; ++half) {
                    const u32 m = m0 + row0 + mi * L::ROW_STEP + half * 8 + g;
                    const bool in = READ_FIRST & (residual_len != 0) & (m < rows);
                    read[b][mi][half] =
                        in ? __ldg(reinterpret_cast<const float2*>(residual + m * S::COUT + n))
                           : make_float2(0.0f, 0.0f);
                }
            }
        }
#pragma unroll
        for (u32 b = 0; b < BATCH; ++b) {
            const u32 nj = nj0 + b, n = n0 + nj * 8 + 2 * t;
#pragma unroll
            for (u32 mi = 0; mi < L::MI; ++mi) {
#pragma unroll
                for (u32 half = 0; half < 2; ++half) {
                    const u32 m = m0 + row0 + mi * L::ROW_STEP + half * 8 + g;
                    if (m >= rows) {
                        continue;
                    }
                    const u32 item = m / S::POS;
                    const float row_inverse = inverse_of_scale(row_scale[mi][half]);
                    float v0 = fmaf(acc[mi][nj][2 * half] * row_inverse, column_inverse[b].x,
                                    bias_pair[b].x);
                    float v1 = fmaf(acc[mi][nj][2 * half + 1] * row_inverse, column_inverse[b].y,
                                    bias_pair[b].y);
                    if (residual_len != 0) {
                        const float2 r =
                            READ_FIRST
                                ? read[b][mi][half]
                                : __ldg(reinterpret_cast<const float2*>(residual + m * S::COUT + n));
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
    }
    if (out_max_len != 0) {
        raise_chunk_maxima<S::THREADS / 32>(out_max, first_item, items, largest_first, largest_next);
    }
}

// This lane's a fragment of row tile mi in a step (a_hi, and with SPLIT a_lo): rows g,
// g + 8 of the tile (a_rows + the tile's offset; a blocked row of a STRIP, bit mi * 2 +
// half of `blocked`, reads the zero row at a_zero) at k pairs t, t, t + 4, t + 4, which
// hold channels 4t, 4t + 1 and 4t + 2, 4t + 3 (the weights' FRAGMENT_ORDER), times the
// rows' scales, rounded (split) to FP16.
template <class S, class L, bool SPLIT>
__device__ __forceinline__ void row_fragment(saddr a_rows, saddr a_zero, u32 blocked, u32 mi,
                                             const float (&scale)[2], uint4& a_hi, uint4& a_lo) {
    const u32 top_at = mi * L::ROW_STEP * S::A_STRIDE * 4;
    const u32 bottom_at = top_at + 8 * S::A_STRIDE * 4;
    const bool top_off = S::STRIP && ((blocked >> (mi * 2)) & 1);
    const bool bottom_off = S::STRIP && ((blocked >> (mi * 2 + 1)) & 1);
    const float4 top = lds4(top_off ? a_zero : a_rows + top_at);
    const float4 bottom = lds4(bottom_off ? a_zero : a_rows + bottom_at);
    const float2 v[4] = {make_float2(top.x, top.y), make_float2(bottom.x, bottom.y),
                         make_float2(top.z, top.w), make_float2(bottom.z, bottom.w)};
    u32 hi[4], lo[4];
#pragma unroll
    for (u32 e = 0; e < 4; ++e) {
        const float s = scale[e & 1];
        if constexpr (SPLIT) {
            f16_split(v[e].x * s, v[e].y * s, hi[e], lo[e]);
        } else {
            hi[e] = f16_pair(v[e].x * s, v[e].y * s);
        }
    }
    a_hi = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    if constexpr (SPLIT) {
        a_lo = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
}

// The residual rows m0 .. m0 + CONV_BM - 1 (those below `rows`), columns n0 .. n0 + BN -
// 1, fetched into L2 by THREADS threads (thread `tid` of them) a stage before the
// epilogue reads them: there each read waits on the L2 instead of on device memory.
template <class S, u32 THREADS>
__device__ __forceinline__ void prefetch_rows(const float* __restrict__ residual, u32 m0, u32 rows,
                                              u32 n0, u32 tid) {
    constexpr u32 LINES = S::BN / 32;  // 128-byte lines per row
#pragma unroll
    for (u32 i = tid; i < CONV_BM * LINES; i += THREADS) {
        const u32 m = m0 + i / LINES;
        if (m < rows) {
            prefetch_l2(residual + (u64(m) * S::COUT + n0 + i % LINES * 32));
        }
    }
}

// One step's products of a warp (WarpTiles): its a fragments a_hi (and a_lo), the step's
// weights at b_base (per column 16 words: high(t), high(t + 4), low(t), low(t + 4) of
// each t; without SPLIT 8, the high ones); SPLIT sums a column tile's three products in a
// fresh accumulator first (docs/performance.md, "Fresh sums for 3xTF32").
template <class S, class L, bool SPLIT>
__device__ __forceinline__ void warp_products(float (&acc)[L::MI][L::NJ][4], const uint4 (&a_hi)[L::MI],
                                              const uint4 (&a_lo)[SPLIT ? L::MI : 1], saddr b_base,
                                              u32 col0, u32 g, u32 t) {
    constexpr u32 MI = L::MI, NJ = L::NJ, B_WORDS = SPLIT ? CONV_BK : CONV_BK / 2;
#pragma unroll
    for (u32 nj = 0; nj < NJ; ++nj) {
        // column g's b0, b1 (k pairs t, t + 4): high (and low) as one read, 16 g + 4 t
        // or 8 g + 2 t words: each quarter (half) warp's reads cover the banks
        const saddr bt = b_base + ((col0 + nj * 8 + g) * B_WORDS + B_WORDS / 4 * t) * 4;
        const float4 b = SPLIT ? lds4(bt) : make_float4(0, 0, 0, 0);
        const float2 high = SPLIT ? make_float2(b.x, b.y) : lds2(bt);
        const u32 h0 = __float_as_uint(high.x), h1 = __float_as_uint(high.y);
        if constexpr (SPLIT) {
            float part[MI][4];  // this step's fresh sums of the column tile
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

// The warp layout of shape S's kernel in this compilation: warpgroups in the 3x3s (the
// strips and the stride-2 ones) where wgmma exists (the sm90 tier), mma.sync warps
// everywhere else (the 1x1 shortcuts too).
template <bool GROUPS, class S>
struct TilesFor {
    using type = WarpTiles<S>;
};
template <class S>
struct TilesFor<true, S> {
    using type = GroupTiles<S>;
};
#if defined(SPK_WGMMA)
template <class S>
using TierTiles = typename TilesFor<S::KS == 3, S>::type;
#else
template <class S>
using TierTiles = WarpTiles<S>;
#endif

// The scales of this thread's fragment rows of the tile from m0 (row0 + mi ROW_STEP + 8
// half + g): the power of two that puts the row's chunk's largest input in [2^14, 2^15),
// 0 past the items; returns (STRIP) `edges`: bit mi * 2 + half of byte 0 (1, 2, 3) set
// where the row is in the image's top (bottom) row, (first, last column), whose taps dy
// = 0 (2) (dx = 0, 2) fall outside.
template <class S, class L>
__device__ __forceinline__ u32 tile_rows(u32 m0, u32 rows, const u32* __restrict__ in_max, u32 row0,
                                         u32 g, float (&row_scale)[L::MI][2]) {
    u32 edges = 0;
#pragma unroll
    for (u32 mi = 0; mi < L::MI; ++mi) {
#pragma unroll
        for (u32 half = 0; half < 2; ++half) {
            const u32 m = m0 + row0 + mi * L::ROW_STEP + half * 8 + g;
            const float largest = m < rows ? __uint_as_float(__ldg(in_max + m / S::POS)) : 0.0f;
            float inverse;
            half_scale_of(largest, row_scale[mi][half], inverse);
            if constexpr (S::STRIP) {
                row_scale[mi][half] = m < rows ? row_scale[mi][half] : 0.0f;
                const u32 p = m % S::POS, h = p / S::WOUT, v = p % S::WOUT;
                const u32 bit = 1u << (mi * 2 + half);
                edges |= (h == 0 ? bit : 0) | (h == S::HOUT - 1 ? bit << 8 : 0) |
                         (v == 0 ? bit << 16 : 0) | (v == S::WOUT - 1 ? bit << 24 : 0);
            }
        }
    }
    return edges;
}

// Slots of shape S's copy ring in the math that SPLIT says: on the sm90 tier the strips'
// CONV_SM90_STRIP_STAGES_* and the stride-2 3x3s' CONV_SM90_DOWN_STAGES_*.
template <class S, bool SPLIT>
__device__ __forceinline__ constexpr u32 ring_stages() {
#if defined(SPK_WGMMA)
    if (S::STRIP && S::BN >= 128) {
        return SPLIT ? CONV_SM90_STRIP_STAGES_WIDE_SPLIT : CONV_SM90_STRIP_STAGES_WIDE;
    }
    if (S::STRIP && S::BN >= 64) {
        return CONV_SM90_STRIP_STAGES_NARROW;
    }
    if (!S::STRIP && S::KS == 3) {
        return S::BN >= 128 ? CONV_SM90_DOWN_STAGES_WIDE : CONV_SM90_DOWN_STAGES_NARROW;
    }
#endif
    return S::STAGES;
}

template <class S, class L, bool SPLIT>
__device__ __forceinline__ void trunk_conv(const float* __restrict__ x, u64 x_len,
                                           const float* __restrict__ w, u64 w_len,
                                           const float* __restrict__ bias, u64 bias_len,
                                           const float* __restrict__ residual, u64 residual_len,
                                           float* __restrict__ y, u64 y_len,
                                           const u32* __restrict__ in_max, u64 in_max_len,
                                           u32* __restrict__ out_max, u64 out_max_len, u32 items,
                                           u32 flags, const void* __restrict__ x_map) {
    constexpr u32 MI = L::MI, NJ = L::NJ, STAGES = ring_stages<S, SPLIT>();
    // Given x_map (a 2D tensor map of the input's [items x POS][CIN] floats in global
    // memory), the strips on the sm90 tier stage by the async copy engine: one thread
    // issues a stage's boxes of the strip and its weight runs, and every thread waits on
    // the slot's mbarrier. Without one, every thread copies its share (cp.async).
    const bool tma = S::STRIP && L::WGMMA && x_map != nullptr;
    const bool valid = launch_is(S::GRID_X, S::GRID_Y, 1, S::THREADS) & (items >= 1) &
                       (items <= TRUNK_BATCH) & (x_len >= items * S::X_ITEM) &
                       (w_len == packed_weight_words<S, SPLIT>()) & (bias_len == 2 * S::COUT) &
                       ((residual_len == 0) | (residual_len >= items * S::Y_ITEM)) &
                       (y_len >= items * S::Y_ITEM) & (in_max_len >= items) &
                       ((out_max_len == 0) | (out_max_len >= items)) & (flags < 4) &
                       aligned16(x) & aligned16(w) & aligned16(residual) & aligned16(y) &
                       (dynamic_shared_bytes() >= STAGES * S::STAGE_WORDS * 4);
    const u32 rows = items * S::POS;
    const u32 tile_count = (rows + CONV_BM - 1) / CONV_BM, tile0 = blockIdx.x * S::TILES;
    if (!valid | (tile0 >= tile_count)) {
        return;  // uniform over the block: no barrier is split
    }
    // this block's tiles of CONV_BM rows, tile0 onwards, as one stream of ring stages
    const u32 stage_count = min(S::TILES, tile_count - tile0) * S::KSTAGES;
    extern __shared__ __align__(128) float shared[];
    const saddr base = shared_address(shared);
    __shared__ __align__(8) u64 slot_full[STAGES];
    const saddr full = shared_address(slot_full);
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 g = lane >> 2, t = lane & 3;
    const u32 row0 = L::row0(warp), col0 = L::col0(warp);
    const u32 n0 = blockIdx.y * S::BN;

    // This thread's A copies: one 16-byte chunk (4 channels) of A_COPIES rows. Without
    // STRIP (one tile), offsets are of the tap (0, 0) pixel; a row past the items gets an
    // origin no tap reaches, so its copies are zero fills; bit tap of inside[i] is set
    // where that tap of the copy's position is in the image.
    const u32 chunk = tid & 3;
    constexpr u32 OWN = S::STRIP ? 1 : S::A_COPIES;
    int origin[OWN];
    u32 inside[OWN];
    if constexpr (!S::STRIP) {
#pragma unroll
        for (u32 i = 0; i < OWN; ++i) {
            const u32 m = tile0 * CONV_BM + tid / 4 + i * (S::THREADS / 4);
            const u32 item = m / S::POS, p = m % S::POS;
            const int h = int(p / S::WOUT) * int(S::STRIDE) - int(S::PAD);
            const int v = int(p % S::WOUT) * int(S::STRIDE) - int(S::PAD);
            inside[i] = 0;
#pragma unroll
            for (u32 tap = 0; tap < S::KS * S::KS; ++tap) {
                const bool in =
                    (u32(h + int(tap / S::KS)) < S::HIN) & (u32(v + int(tap % S::KS)) < S::WIN);
                inside[i] |= u32(in & (m < rows)) << tap;
            }
            origin[i] = ((int(item) * int(S::HIN) + h) * int(S::WIN) + v) * int(S::CIN) + int(chunk) * 4;
        }
    }

    auto load_stage = [&](u32 j) {  // the block's stage j: tile tile0 + j / KSTAGES
        const saddr a_base = base + (j % STAGES) * S::STAGE_WORDS * 4;
        const saddr b_base = a_base + S::A_SLOT_ROWS * S::A_STRIDE * 4;
        const u32 ks = j % S::KSTAGES, cb = ks % S::CBLOCKS;
#if defined(SPK_WGMMA)
        if (S::STRIP && tma) {
            if (tid != 0) {
                return;
            }
            const int first = int((tile0 + j / S::KSTAGES) * CONV_BM) +
                              (int(ks / S::CBLOCKS) - 1) * int(S::WIN) - 1;
            const saddr bar = full + (j % STAGES) * 8;
            mbarrier_expect(bar, S::A_ROWS * CONV_BK * 4 + tma_weight_bytes<S, SPLIT>());
            fence_proxy_async();  // after the block's reads of the slot's last stage
            tma_strip<S>(a_base, x_map, first, cb, bar);
            tma_weights<S, SPLIT>(b_base, w, ks, n0, bar);
            return;
        }
#endif
        if constexpr (S::STRIP) {
            // strip row r: the flat input pixel m0 + r + (dy - 1) WIN - 1
            const int first = int((tile0 + j / S::KSTAGES) * CONV_BM) +
                              (int(ks / S::CBLOCKS) - 1) * int(S::WIN) - 1;
            copy_strip<S>(a_base, x, first, rows, cb, tid);
        } else {
            const u32 tap = ks / S::CBLOCKS;
            const int dy = int(tap / S::KS), dx = int(tap % S::KS);
            const int offset = (dy * int(S::WIN) + dx) * int(S::CIN) + int(cb * CONV_BK);
#pragma unroll
            for (u32 i = 0; i < S::A_COPIES; ++i) {
                const u32 r = tid / 4 + i * (S::THREADS / 4);
                const bool in = (inside[i] >> tap) & 1;
                const float* source = in ? x + (origin[i] + offset) : x;
                cp_async16_fill(a_base + (r * S::A_STRIDE + chunk * 4) * 4, source, in ? 16 : 0);
            }
        }
        copy_weights<S, L, SPLIT>(b_base, w, ks, n0, tid);
    };

    // The tile in the sums: its first row m0, its rows' scales and edges (tile_rows).
    u32 m0 = 0, edges = 0;
    float row_scale[MI][2];
    auto enter_tile = [&](u32 tile) {
        m0 = tile * CONV_BM;
        edges = tile_rows<S, L>(m0, rows, in_max, row0, g, row_scale);
    };
    enter_tile(tile0);

    if constexpr (S::STRIP) {  // the zero rows, before the main loop's first barrier
        for (u32 i = tid; i < STAGES * S::A_STRIDE; i += S::THREADS) {
            shared[i / S::A_STRIDE * S::STAGE_WORDS + S::ZERO_ROW * S::A_STRIDE + i % S::A_STRIDE] = 0.0f;
        }
    }
#if defined(SPK_WGMMA)
    if (tma) {  // the barriers before any wait, and the zero rows before the copies
        tma_ring_init<STAGES>(full, x_map, tid);
    }
#endif
    float acc[MI][NJ][4];
    zero(acc);
    uint4 a_sets[SPLIT ? 1 : L::A_SETS][MI];
    float fresh[SPLIT ? L::FRESH : 1][4];  // (GroupTiles, SPLIT) a tile's stage
    zero(fresh);
#pragma unroll
    for (u32 j = 0; j < STAGES - 1; ++j) {
        if (j < stage_count) {
            load_stage(j);
        }
        cp_async_commit();  // one group per slot, even empty: wait<STAGES-2> stays exact
    }
#pragma unroll 1
    for (u32 j = 0; j < stage_count; ++j) {
#if defined(SPK_WGMMA)
        if (tma) {
            mbarrier_wait(full + (j % STAGES) * 8, j / STAGES & 1);
        } else {
            cp_async_wait<STAGES - 2>();
            if constexpr (L::WGMMA) {
                fence_proxy_async();  // wgmma reads the weights through the async proxy
            }
        }
#else
        cp_async_wait<STAGES - 2>();
#endif
        __syncthreads();  // stage j landed for all; slot (j - 1) % STAGES is free
        if (j + STAGES - 1 < stage_count) {
            load_stage(j + STAGES - 1);
        }
        cp_async_commit();
        const saddr a_stage = base + (j % STAGES) * S::STAGE_WORDS * 4;
        const u32 ks = j % S::KSTAGES, dy = ks / S::CBLOCKS;
        if (S::STRIP && (residual_len != 0) & (ks == S::KSTAGES - 1)) {
            // the tile's shortcut rows into L2 a stage before its epilogue reads them:
            // there each read waits on the L2 instead of on device memory (only the
            // stride-1 3x3s, the blocks' second convolutions, take a residual)
            prefetch_rows<S, S::THREADS>(residual, m0, rows, n0, tid);
        }
        const u32 blocked_rows = dy == 0 ? edges : dy == S::KS - 1 ? edges >> 8 : 0;
        if constexpr (L::WGMMA && SPLIT) {  // (GroupTiles) a stage's three steps at once
            group_stage_split<S, L>(acc, fresh, a_stage, blocked_rows, edges, row0, g, t, row_scale);
        } else {
#pragma unroll(!SPLIT && L::A_SETS > 1 ? S::STEPS : 1)
            for (u32 step = 0; step < S::STEPS; ++step) {
                // rows whose tap (dy, dx = step) is outside the image (STRIP)
                const u32 blocked =
                    (blocked_rows | (step == 0 ? edges >> 16 : step == 2 ? edges >> 24 : 0)) & 0xff;
                // this lane's first fragment row (strip row r + dx), and the zero row, as
                // byte addresses: each fragment row is a constant offset from the first, so
                // its read takes one select (blocked or not) and an immediate offset
                const saddr a_rows = a_stage + ((row0 + g + step) * S::A_STRIDE + 4 * t) * 4;
                const saddr a_zero = a_stage + (S::ZERO_ROW * S::A_STRIDE + 4 * t) * 4;
                const saddr b_base = a_stage + (S::A_SLOT_ROWS * S::A_STRIDE + step * S::BN * CONV_BK) * 4;
                // (GroupTiles, one product) a step's a fragments alternate between
                // A_SETS sets, so the next step's conversion overlaps this step's products
                uint4(&a_hi)[MI] = a_sets[SPLIT ? 0 : step % L::A_SETS];
                uint4 a_lo[SPLIT ? MI : 1];
#pragma unroll
                for (u32 mi = 0; mi < MI; ++mi) {
                    row_fragment<S, L, SPLIT>(a_rows, a_zero, blocked, mi, row_scale[mi], a_hi[mi],
                                              a_lo[SPLIT ? mi : 0]);
                    if constexpr (L::WGMMA) {  // each row tile's products as soon as it is converted
                        group_products<S, L>(acc[mi], a_hi[mi], b_base);
                    }
                }
                if constexpr (L::WGMMA) {
                    group_wait<L, S::STEPS>(acc, step);
                } else {
                    warp_products<S, L, SPLIT>(acc, a_hi, a_lo, b_base, col0, g, t);
                }
            }
        }
        if (S::TILES > 1 && ks == S::KSTAGES - 1 && j + 1 < stage_count) {
            store_tile<S, L>(acc, row_scale, m0, rows, items, row0, col0 + n0, g, t, bias, residual,
                             residual_len, y, out_max, out_max_len, flags);
            zero(acc);
            enter_tile(tile0 + (j + 1) / S::KSTAGES);
        }
    }
    cp_async_wait<0>();
    store_tile<S, L>(acc, row_scale, m0, rows, items, row0, col0 + n0, g, t, bias, residual,
                     residual_len, y, out_max, out_max_len, flags);
}

}  // namespace spk

#endif
