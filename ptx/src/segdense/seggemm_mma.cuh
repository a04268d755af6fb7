// Tensor-core GEMMs of the segdense module (included by segdense.cu): the linears in TF32
// math (linear0_b1_tf32 on TF32 products; linear1_b32_tf32 and the Select entry
// linear0_b32_tf32 on scaled FP16 products) and the split-K embeddings on FP32 weights
// (embed_b32_tf32, _tf32_k2, _tf32_e64, _x3). The split-K embedding on scaled FP16
// products (embed_b32_f16) is in seggemm_half.cuh.
// sm80 tier only; the sm75 tier exports the same names as trapping stubs.
//
// y[m, n] = x[m, k] w[k, n]: x row-major; w as packed at plan time
// (pyspk/candidate/segdense/packing.py), per column tile of BN the k-steps in order, per
// k-step the pairs of 8-column mma tiles, per pair a 16-byte word quad per lane ((b0, b1)
// of both tiles): pack_gemm_mma's TF32-rounded b fragments for mma.sync.m16n8k8, one
// plane or two (value, residual), or (HALF) pack_gemm_half's FP16 pair fragments for
// m16n8k16, each column times the power of two s_c that puts its largest magnitude in
// [2^14, 2^15), followed by the n inverse scales. FP32 accumulation; x rows are the
// fragment rows.
//
// Block tile BM x BN of output (x, y) = (rows, columns); split-K entries take slice z
// of the reduction from blockIdx.z and write partial plane z, which the fixed-order
// reduction kernels of segdense.cu add with the bias. The block's warps form KSPLIT
// groups; in a group, warp (wr, wc) owns rows wr WM .. + WM and columns wc WN .. + WN.
// A stage is KSPLIT BKS k-steps of KSTEP (8, or 16 for HALF; group g takes the g-th BKS
// of every stage), STAGES deep in a cp.async ring with one commit group per stage, empty
// or not. Weights are copied through L2 only (.cg): through L1 (.ca, where row tiles
// share them) Select and linear1_b32 were slower.
// Shared rows of x: KT + 4 floats, or KT + 8 where x is read in pairs (PAIRED, HALF), so
// each fragment read of a warp hits distinct banks; w stages as packed, each lane's
// quads consecutive. x rows past m are zero-filled (copied from nowhere).
//
// Products (a = x, b = w): TF32 rounds both (b at plan time, with the bits cvt.rna
// gives); SPLIT is 3xTF32. HALF: each warp scales the x rows of each batch item among
// its rows by one running power of two s_x that puts the largest magnitude they have
// shown in [2^14, 2^15) (half_step) and rounds them to FP16; the sums are unscaled by
// 1 / (s_x s_c) after the last k-step.
// SELECT is HALF with the 16 listed k (selected_rows: largest sum of squares) packed as
// zeros and recomputed in 3xTF32 from FP32 copies: the list follows the scales, then
// those rows of w.
// Order of each output: per group, the k-steps of its stages in order, each chained
// into the accumulator (TF32, HALF) or summed from zero in its own fragment and then
// added in FP32 (SPLIT: a_lo b_hi, a_hi b_lo, a_hi b_hi); HALF then unscales; SELECT then
// adds, per slot of 8 listed k, such a fragment of the three products (from zero) to the
// unscaled sums; groups 1.. KSPLIT-1 are added to group 0 in order; then + bias and
// LeakyReLU (linears) or the partial store.
//
// Error bounds (u = 2^-24, s = the k-steps one accumulator chains, sum|terms| of the
// output), checked by the GPU tests: TF32 (SELECT only lowers the products' part)
// (2^-10 + 2^-22 + 18 s u) sum|terms|; HALF the same plus FP16's range term: an operand
// below FP16's normal range rounds by an absolute 2^-25 of its scaled value, so
// 2^-38 (max|x| sum|w_c| + max|w_c| sum|x_r|), max|x| over the warp's rows of r's
// item; 3xTF32 (12 + 36 + s + 1) u sum|terms|; the k-split, bias, reduction and
// LeakyReLU add a rounding each.
//
// Why this form (the measurements behind each choice: docs/performance.md). Scaled FP16
// issues, per k-step, half the mma of two TF32 ones and copies half the weight bytes;
// what it adds is the scale, so it pays only while the scale costs one shuffle tree per
// k-step (one scale per warp and batch item, not per row) and two k-steps share each
// stage. Two k-steps per group and stage everywhere but e64, which keeps one. w is packed
// as rounded fragments (one 16-byte read per lane and pair of tiles, no rounding in the
// loop); x is read in pairs (PAIRED) only by linear0_b1 and e64, where it paid (k2 and
// x3 have no shared memory left for it). The TF32 forms keep w in one plane: a value and
// residual plane (only x's rounding left, 0.74x the TF32 error) cost more time than the
// margin over the library allows. Output pairs are stored by stg2: through a float2 cast
// nvcc 13 made the split-K partial stores scalar ones. Copy addresses are one source
// pointer per operand plus constants. Select's listed x columns are gathered into shared
// memory behind the prologue and its rows of w copied into the ring slot the last stage
// leaves free, so its tail reads shared memory only.

#pragma once

#include "common.cuh"
#include "model.cuh"
#include "sm80.cuh"

namespace spk {
namespace gemm {

// HALF: scaled FP16 products (m16n8k16); SELECT: HALF with the 16 selected k in 3xTF32
enum class Products { TF32, SPLIT, HALF, SELECT };
enum class Out { LEAKY, PARTIAL };

// pyspk.candidate.segdense.selection.SELECT_ROWS (`tools/kernels.py check` compares them)
constexpr u32 SELECT_ROWS = 16;

template <u32 M_, u32 N_, u32 K_, u32 BM_, u32 BN_, u32 WM_, u32 WN_, u32 KSPLIT_, u32 BKS_,
          u32 STAGES_, Products PRODUCTS_, Out OUT_, bool PAIRED_ = false>
struct Shape {
    static constexpr u32 M = M_, N = N_, K = K_, BM = BM_, BN = BN_, WM = WM_, WN = WN_,
                         KSPLIT = KSPLIT_, STAGES = STAGES_;
    static constexpr u32 BKS = BKS_;  // k-steps (of KSTEP) per group and stage
    static constexpr Products PRODUCTS = PRODUCTS_;
    static constexpr bool HALF = PRODUCTS == Products::HALF || PRODUCTS == Products::SELECT;
    static constexpr u32 KSTEP = HALF ? 16 : 8;  // k of one mma
    static constexpr Out OUT = OUT_;
    static constexpr u32 MT = WM / 16, NT = WN / 8;
    static constexpr u32 WARPS_N = BN / WN;
    static constexpr u32 GROUP = BM / WM * WARPS_N * 32;  // threads per k-group
    static constexpr u32 THREADS = GROUP * KSPLIT;
    static constexpr u32 KT = KSTEP * BKS * KSPLIT;       // k per stage
    static constexpr u32 STEPS = K / KT;                  // stages over the whole k
    // x's k read in pairs: mma k-slots q and q + 4 of a k-step are its columns 2 q, 2 q + 1
    static constexpr bool PAIRED = PAIRED_;
    // w: TF32 planes (the value; for SPLIT also the residual), or one plane of FP16 pairs
    // (HALF), in fragment order
    static constexpr u32 PLANES = PRODUCTS == Products::SPLIT ? 2 : 1;
    static constexpr u32 PAIR = PLANES * 128;  // words of one k-step x 16 columns
    static constexpr u32 A_ROW = KT + (PAIRED || HALF ? 8 : 4);  // HALF reads x in pairs
    static constexpr u32 A_STAGE = BM * A_ROW;
    static constexpr u32 B_STAGE = KT / KSTEP * BN / 16 * PAIR;
    static constexpr u32 PER_WORD = HALF ? 2 : 1;  // weights per packed word
    static constexpr u32 SCALES = HALF ? N : 0;  // HALF: the inverse column scales follow
    static constexpr u32 STAGE = A_STAGE + B_STAGE;
    static constexpr u32 A_COPIES = BM * KT / 4, B_COPIES = B_STAGE / 4;
    static constexpr u32 RING = STAGES * STAGE;
    static constexpr u32 RED = (KSPLIT - 1) * GROUP * MT * NT * 4;
    static constexpr u32 SELECT = PRODUCTS == Products::SELECT ? SELECT_ROWS : 0;
    static constexpr u32 SLOTS = SELECT / 8 / KSPLIT;      // selected k-steps per group
    // Select: x's selected columns after the ring (rows of SELECT + 4 floats, so a
    // fragment's rows g and columns q hit distinct banks), and the selected rows of w
    // (BN + 8 floats each) in the ring slot that the last STAGES - 1 stages leave free
    static constexpr u32 SEL_X_ROW = SELECT + 4, SEL_W_ROW = BN + 8;
    static constexpr u32 SEL_X = SELECT > 0 ? BM * SEL_X_ROW : 0;
    static constexpr u32 SEL_W_SLOT = STEPS % STAGES;
    // HALF: the block's inverse column scales, then its bias
    static constexpr u32 COL_AT = RING + SEL_X;
    static constexpr u32 USED = COL_AT + (HALF ? 2 * BN : 0);
    static constexpr u32 SHARED = USED > RED ? USED : RED;  // floats, static
    // the planes (HALF: and scales), then (Select) the selected k and their rows in FP32
    static constexpr u32 PLANE_WORDS = K * N * PLANES / PER_WORD;
    static constexpr u32 W_LEN = PLANE_WORDS + SCALES + SELECT * (1 + N);
    static constexpr u32 GRID_X = (M + BM - 1) / BM, GRID_Y = N / BN;

    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 8 == 0, "tiles");
    static_assert(K % KT == 0 && N % BN == 0 && STAGES >= 2, "whole stages and tiles");
    static_assert(PAIRED || HALF ? A_ROW % 32 == 8 || A_ROW % 32 == 24 : A_ROW % 8 == 4,
                  "conflict-free x fragments");
    static_assert(!HALF || (KSPLIT == 1 && !PAIRED), "HALF: one k-group, its own x pairs");
    static_assert(NT % 2 == 0, "w fragments of column pairs");
    static_assert(SELECT % (8 * KSPLIT) == 0, "whole selected k-steps per group");
    static_assert(SELECT == 0 || (STEPS >= STAGES && SELECT * SEL_W_ROW <= STAGE &&
                                  THREADS % SELECT == 0 && BM * SELECT % THREADS == 0 &&
                                  SELECT * BN % (4 * THREADS) == 0),
                  "Select's copies and their room");
    static_assert(SHARED * 4 <= 48 * 1024, "static shared memory");
    static_assert(OUT == Out::LEAKY || (PRODUCTS != Products::SELECT && GRID_X == 1),
                  "split-K tiles hold every row");
};

}  // namespace gemm
}  // namespace spk

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

namespace spk {
namespace gemm {

// One tile of mma fragments per thread: a 16 x 8 x-fragment from shared row `row` of
// the stage (rows g and g + 8, columns t and t + 4) rounded, or split, for the mma.
template <class G>
__device__ __forceinline__ void a_fragment(saddr at, uint4& hi, uint4& lo) {
    float v[4];
    if constexpr (G::PAIRED) {
        const float2 top = lds2(at), bottom = lds2(at + 4 * 8 * G::A_ROW);
        v[0] = top.x, v[1] = bottom.x, v[2] = top.y, v[3] = bottom.y;
    } else {
        v[0] = lds1(at), v[1] = lds1(at + 4 * 8 * G::A_ROW), v[2] = lds1(at + 4 * 4),
        v[3] = lds1(at + 4 * (8 * G::A_ROW + 4));
    }
    u32 h[4], l[4];
#pragma unroll
    for (u32 e = 0; e < 4; ++e) {
        if constexpr (G::PRODUCTS == Products::SPLIT) {
            tf32_split(v[e], h[e], l[e]);
        } else {
            h[e] = tf32(v[e]);
            l[e] = 0;
        }
    }
    hi = make_uint4(h[0], h[1], h[2], h[3]);
    lo = make_uint4(l[0], l[1], l[2], l[3]);
}

// The running scales of a warp's x rows: one per batch item among its WM rows, so no
// item's rounding depends on another item's magnitudes. A warp's rows span at most two
// items (WM < ITEM_ROWS); rows from `split` on belong to the second.
struct ItemScales {
    WarpScale first, second;
    u32 split;  // WM where the warp's rows are one item's
};
template <class G>
__device__ __forceinline__ ItemScales item_scales_start(u32 warp_row0) {
    static_assert(!G::HALF || (G::M % ITEM_ROWS == 0 && G::WM < ITEM_ROWS), "items");
    const u32 next_item = (warp_row0 / ITEM_ROWS + 1) * ITEM_ROWS;
    return ItemScales{warp_scale_start(), warp_scale_start(), min(next_item - warp_row0, G::WM)};
}
// Folds this lane's largest magnitudes of the next operands of each item (`m_first`,
// `m_second`) into the scales of a warp whose rows span two items: each item's largest
// is reduced on its own, and each accumulator row rescaled by its item's ratio (1 where
// a scale stays).
template <class G>
__device__ __forceinline__ void raise_item_scales(float m_first, float m_second, ItemScales& s,
                                                  float (&acc)[G::MT][G::NT][4]) {
    float ratio[2];
#pragma unroll
    for (u32 item = 0; item < 2; ++item) {
        WarpScale& scale = item == 0 ? s.first : s.second;
        scale.largest = fmaxf(scale.largest, warp_max(item == 0 ? m_first : m_second));
        float next, next_inverse;
        half_scale_of(scale.largest, next, next_inverse);
        ratio[item] = next * scale.inverse;  // powers of two: exactly 1 where unchanged
        scale.scale = next;
        scale.inverse = next_inverse;
    }
    if (ratio[0] != 1.0f || ratio[1] != 1.0f) {
        const u32 g = threadIdx.x % 32 / 4;
#pragma unroll
        for (u32 i = 0; i < G::MT; ++i) {
#pragma unroll
            for (u32 h = 0; h < 2; ++h) {  // rows g and g + 8 of tile i
                const float r = i * 16 + 8 * h + g >= s.split ? ratio[1] : ratio[0];
#pragma unroll
                for (u32 j = 0; j < G::NT; ++j) {
                    acc[i][j][2 * h] *= r;
                    acc[i][j][2 * h + 1] *= r;
                }
            }
        }
    }
}

// One k-step of 16 on scaled FP16 products: x rows g and g + 8 of each 16-row tile at
// `a` (columns 2 q, 2 q + 1 and 2 q + 8, 2 q + 9), w's packed pair fragments at `b`, the
// x rows scaled by their item's running scale in the warp. Scales per warp and item
// rather than per row: one shuffle tree per k-step instead of one per row. TWO: the
// warp's rows span two items (two trees, raise_item_scales); a warp of one item is
// compiled apart, with no per-row selection of scales.
template <class G, bool TWO>
__device__ __forceinline__ void half_step(saddr a, saddr b, float (&acc)[G::MT][G::NT][4],
                                          ItemScales& scales) {
    const u32 g = threadIdx.x % 32 / 4;
    const u32 split = TWO ? scales.split : G::WM;  // rows from `split` on: the second item
    float2 front[G::MT][2], back[G::MT][2];
    float m_first = 0.0f, m_second = 0.0f;
#pragma unroll
    for (u32 i = 0; i < G::MT; ++i) {
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
            const saddr at = a + 4 * (i * 16 + 8 * h) * G::A_ROW;
            front[i][h] = lds2(at);
            back[i][h] = lds2(at + 4 * 8);
            const float m = fmaxf(fmaxf(fabsf(front[i][h].x), fabsf(front[i][h].y)),
                                  fmaxf(fabsf(back[i][h].x), fabsf(back[i][h].y)));
            if (i * 16 + 8 * h + g >= split) {
                m_second = fmaxf(m_second, m);
            } else {
                m_first = fmaxf(m_first, m);
            }
        }
    }
    if constexpr (TWO) {
        raise_item_scales<G>(m_first, m_second, scales, acc);
    } else {
        raise_warp_scale(m_first, scales.first, acc);
    }
    uint4 frag[G::MT];
#pragma unroll
    for (u32 i = 0; i < G::MT; ++i) {
        float s[2];
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
            s[h] = i * 16 + 8 * h + g >= split ? scales.second.scale : scales.first.scale;
        }
        frag[i] = make_uint4(f16_pair(front[i][0].x * s[0], front[i][0].y * s[0]),
                             f16_pair(front[i][1].x * s[1], front[i][1].y * s[1]),
                             f16_pair(back[i][0].x * s[0], back[i][0].y * s[0]),
                             f16_pair(back[i][1].x * s[1], back[i][1].y * s[1]));
    }
#pragma unroll
    for (u32 p = 0; p < G::NT / 2; ++p) {
        const float4 v = lds4(b + 4 * p * G::PAIR);  // (b0, b1) of column tiles 2 p, 2 p + 1
#pragma unroll
        for (u32 half = 0; half < 2; ++half) {
            const u32 b0 = __float_as_uint(half ? v.z : v.x);
            const u32 b1 = __float_as_uint(half ? v.w : v.y);
#pragma unroll
            for (u32 i = 0; i < G::MT; ++i) {
                mma_f16(acc[i][2 * p + half], frag[i], b0, b1);
            }
        }
    }
}

// A stage's BKS k-steps of scaled FP16 products (half_step), from its x at `a` and its
// packed w at `b`.
template <class G, bool TWO>
__device__ __forceinline__ void half_stage(saddr a, saddr b, float (&acc)[G::MT][G::NT][4],
                                           ItemScales& scales) {
#pragma unroll
    for (u32 kk = 0; kk < G::BKS; ++kk) {
        half_step<G, TWO>(a + 4 * 16 * kk, b + 4 * kk * G::BN / 16 * G::PAIR, acc, scales);
    }
}

// The in-block k-split's meeting: groups 1.. leave their sums in shared memory and
// group 0 adds them in group order; false for the threads of groups 1.., which are done.
template <class G>
__device__ __forceinline__ bool meet_groups(float (&acc)[G::MT][G::NT][4], saddr base, u32 group,
                                            u32 t) {
    cp_async_wait<0>();
    __syncthreads();
    const saddr mine = base + 4 * ((group - 1) * G::GROUP + t % G::GROUP) * 4;
    constexpr u32 PITCH = 4 * G::GROUP * 4;  // bytes between a thread's float4s
    if (group > 0) {
#pragma unroll
        for (u32 i = 0; i < G::MT; ++i) {
#pragma unroll
            for (u32 j = 0; j < G::NT; ++j) {
                const float* a = acc[i][j];
                sts4(mine + (i * G::NT + j) * (G::KSPLIT - 1) * PITCH,
                     make_float4(a[0], a[1], a[2], a[3]));
            }
        }
    }
    __syncthreads();
    if (group > 0) {
        return false;
    }
#pragma unroll
    for (u32 other = 1; other < G::KSPLIT; ++other) {
        const saddr from = base + 4 * ((other - 1) * G::GROUP + t) * 4;
#pragma unroll
        for (u32 i = 0; i < G::MT; ++i) {
#pragma unroll
            for (u32 j = 0; j < G::NT; ++j) {
                const float4 v = lds4(from + (i * G::NT + j) * (G::KSPLIT - 1) * PITCH);
                acc[i][j][0] += v.x;
                acc[i][j][1] += v.y;
                acc[i][j][2] += v.z;
                acc[i][j][3] += v.w;
            }
        }
    }
    return true;
}

template <class G>
__device__ __forceinline__ void run(const float* __restrict__ x, u64 x_len,
                                    const float* __restrict__ w, u64 w_len,
                                    const float* __restrict__ bias, u64 bias_len,
                                    float* __restrict__ y, u64 y_len) {
    constexpr bool SPLIT_K = G::OUT == Out::PARTIAL;
    const u32 splits = SPLIT_K ? gridDim.z : 1;
    const u64 outputs = u64(G::M) * G::N;
    if (x_len != u64(G::M) * G::K | w_len != G::W_LEN |
        bias_len != G::N | y_len != splits * outputs | splits < 1 |
        splits > EMBED_MAX_SPLITS | !aligned16(x) | !aligned16(w) | !aligned16(y) |
        (G::HALF && !aligned16(bias)) |
        !launch_is(G::GRID_X, G::GRID_Y, splits, G::THREADS)) {
        return;
    }
    __shared__ __align__(16) float smem[G::SHARED];
    const saddr base = shared_address(smem);

    const u32 t = threadIdx.x;
    const u32 lane = t % 32;
    const u32 group = t / G::GROUP;
    const u32 warp = t % G::GROUP / 32;
    const u32 wr = warp / G::WARPS_N;
    const u32 wc = warp % G::WARPS_N;
    const u32 g = lane / 4;
    const u32 q = lane % 4;
    const u32 row0 = blockIdx.x * G::BM;
    const u32 col0 = blockIdx.y * G::BN;
    const u32 z = SPLIT_K ? blockIdx.z : 0;
    // slice z: stages [z STEPS / splits, (z + 1) STEPS / splits)
    const u32 first = z * G::STEPS / splits;
    const u32 stages = (z + 1) * G::STEPS / splits - first;
    const u32 k0 = first * G::KT;

    // the bias is read now, its latency hidden behind the main loop (HALF: copied to
    // shared memory with the scales, which keeps Select's registers from spilling)
    float2 bias2[G::NT];
    if constexpr (!SPLIT_K && !G::HALF) {
#pragma unroll
        for (u32 j = 0; j < G::NT; ++j) {
            const u32 col = col0 + wc * G::WN + j * 8 + 2 * q;
            bias2[j] = make_float2(__ldg(bias + col), __ldg(bias + col + 1));
        }
    }

    // Copy i of a stage is copy 0 moved THREADS copies on: A_STEP rows of x, B_STEP rows
    // of w further, at the same column. So each thread keeps one source pointer per
    // operand, advanced by a stage's k, and one shared offset, and every copy's address
    // is those plus constants; rows past m are a mask fixed for the whole loop.
    // A column tile's stages of w lie one after another, each as the ring holds it.
    static_assert(G::THREADS % (G::KT / 4) == 0, "copy rows");
    constexpr u32 A_STEP = G::THREADS / (G::KT / 4);
    const u32 a_r = t / (G::KT / 4), a_v = t % (G::KT / 4);
    const float* x_from = x + u64(row0 + a_r) * G::K + k0 + 4 * a_v;
    const float* w_from =
        w + (u64(col0) * G::K + u64(k0) * G::BN) * G::PLANES / G::PER_WORD + 4 * t;
    const saddr a_to = base + 4 * (a_r * G::A_ROW + 4 * a_v);
    const saddr b_to = base + 4 * (G::A_STAGE + 4 * t);
    u32 real = 0;
#pragma unroll
    for (u32 i = 0; i < (G::A_COPIES + G::THREADS - 1) / G::THREADS; ++i) {
        real |= u32(row0 + a_r + i * A_STEP < G::M) << i;
    }
    auto issue = [&](u32 stage, u32 slot) {
        const u32 at = 4 * slot * G::STAGE;
#pragma unroll
        for (u32 i = 0; i < (G::A_COPIES + G::THREADS - 1) / G::THREADS; ++i) {
            if (G::A_COPIES % G::THREADS == 0 || t + i * G::THREADS < G::A_COPIES) {
                const bool r = (real >> i) & 1;
                cp_async16_fill(a_to + at + 4 * i * A_STEP * G::A_ROW,
                                r ? x_from + u64(i) * A_STEP * G::K + stage * G::KT : x,
                                r ? 16 : 0);
            }
        }
#pragma unroll
        for (u32 i = 0; i < (G::B_COPIES + G::THREADS - 1) / G::THREADS; ++i) {
            if (G::B_COPIES % G::THREADS == 0 || t + i * G::THREADS < G::B_COPIES) {
                cp_async16_fill(b_to + at + 4 * 4 * i * G::THREADS,
                                w_from + u64(stage) * G::B_STAGE + 4 * i * G::THREADS, 16);
            }
        }
    };
    const float* const scales = w + G::PLANE_WORDS;
    if constexpr (G::HALF) {  // with the first stage: the block's column scales and bias
        static_assert(G::BN / 2 <= G::THREADS && !SPLIT_K, "one copy per thread");
        if (t < G::BN / 4) {
            cp_async16_fill(base + 4 * (G::COL_AT + 4 * t), scales + col0 + 4 * t, 16);
        } else if (t < G::BN / 2) {
            const u32 v = t - G::BN / 4;
            cp_async16_fill(base + 4 * (G::COL_AT + G::BN + 4 * v), bias + col0 + 4 * v, 16);
        }
    }
#pragma unroll
    for (u32 s = 0; s < G::STAGES - 1; ++s) {
        if (s < stages) {
            issue(s, s);
        }
        cp_async_commit();
    }
    // Select: the list follows the planes, then the listed rows of w in FP32. Thread t
    // gathers entry t % SELECT of rows t / SELECT + i THREADS / SELECT (zero past m) into
    // the room after the ring, landing with the first stage issued in the loop; an index
    // past k reads x's column k - 1 (a corrupt list only miscomputes).
    const float* const selected_w = scales + G::SCALES + G::SELECT;
    if constexpr (G::SELECT > 0) {
        const u32 entry = t % G::SELECT;
        const u32 k = min(__ldg(reinterpret_cast<const u32*>(selected_w) - G::SELECT + entry),
                          G::K - 1);
#pragma unroll
        for (u32 i = 0; i < G::BM * G::SELECT / G::THREADS; ++i) {
            const u32 r = t / G::SELECT + i * (G::THREADS / G::SELECT);
            const bool real = row0 + r < G::M;
            cp_async4_fill(base + 4 * (G::RING + r * G::SEL_X_ROW + entry),
                           real ? x + u64(row0 + r) * G::K + k : x, real ? 4 : 0);
        }
    }

    float acc[G::MT][G::NT][4];
    zero(acc);
    // group g takes the stage's k-steps g BKS .. g BKS + BKS - 1
    const u32 a_at = 4 * ((wr * G::WM + g) * G::A_ROW + group * G::KSTEP * G::BKS +
                          (G::PAIRED || G::HALF ? 2 * q : q));
    // w: pair p of k-step s of the stage at (s BN / 16 + p) PAIR, lane l's float4 at 4 l
    const u32 b_at = 4 * (G::A_STAGE + (group * G::BKS * G::BN / 16 + wc * G::WN / 16) * G::PAIR +
                          4 * lane);

    ItemScales item_scales = item_scales_start<G>(row0 + wr * G::WM);

    // the ring slot of this stage and of the one issued in it, STAGES - 1 ahead
    u32 slot = 0, ahead = G::STAGES - 1;
#pragma unroll 1
    for (u32 stage = 0; stage < stages; ++stage) {
        cp_async_wait<G::STAGES - 2>();
        __syncthreads();
        if (stage + G::STAGES - 1 < stages) {
            issue(stage + G::STAGES - 1, ahead);
        }
        if constexpr (G::SELECT > 0) {
            if (stage + G::STAGES - 1 == stages) {
                // the slot of stage - 1 (SEL_W_SLOT) is read no more: Select's rows of w
#pragma unroll
                for (u32 i = 0; i < G::SELECT * G::BN / 4 / G::THREADS; ++i) {
                    const u32 copy = t + i * G::THREADS;
                    const u32 r = copy / (G::BN / 4), v = copy % (G::BN / 4);
                    cp_async16_fill(base + 4 * (G::SEL_W_SLOT * G::STAGE + r * G::SEL_W_ROW +
                                                4 * v),
                                    selected_w + r * G::N + col0 + 4 * v, 16);
                }
            }
        }
        cp_async_commit();

        const saddr stage_at = base + 4 * slot * G::STAGE;
        slot = slot + 1 == G::STAGES ? 0 : slot + 1;
        ahead = ahead + 1 == G::STAGES ? 0 : ahead + 1;
        if constexpr (G::HALF) {
            // warp-uniform, once per stage, so a stage's k-steps stay one straight run
            if (item_scales.split >= G::WM) {
                half_stage<G, false>(stage_at + a_at, stage_at + b_at, acc, item_scales);
            } else {
                half_stage<G, true>(stage_at + a_at, stage_at + b_at, acc, item_scales);
            }
            continue;
        }
#pragma unroll
        for (u32 kk = 0; kk < G::BKS; ++kk) {
            const saddr at = stage_at + 4 * 8 * kk;  // x columns 8 kk ..
            uint4 a_hi[G::MT], a_lo[G::MT];
#pragma unroll
            for (u32 i = 0; i < G::MT; ++i) {
                a_fragment<G>(at + a_at + 4 * i * 16 * G::A_ROW, a_hi[i], a_lo[i]);
            }
#pragma unroll
            for (u32 p = 0; p < G::NT / 2; ++p) {
                // (b0, b1) of column tiles 2 p and 2 p + 1: one float4 per plane
                const saddr b = stage_at + b_at + 4 * (kk * G::BN / 16 + p) * G::PAIR;
                const float4 high = lds4(b);
                const float4 low = G::PLANES == 2 ? lds4(b + 4 * 128) : high;
#pragma unroll
                for (u32 half = 0; half < 2; ++half) {
                    const u32 j = 2 * p + half;
                    const u32 h0 = __float_as_uint(half ? high.z : high.x);
                    const u32 h1 = __float_as_uint(half ? high.w : high.y);
                    const u32 l0 = __float_as_uint(half ? low.z : low.x);
                    const u32 l1 = __float_as_uint(half ? low.w : low.y);
#pragma unroll
                    for (u32 i = 0; i < G::MT; ++i) {
                        if constexpr (G::PRODUCTS == Products::SPLIT) {
                            float chunk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                            mma_split(chunk, a_hi[i], a_lo[i], h0, h1, l0, l1);
#pragma unroll
                            for (u32 e = 0; e < 4; ++e) {
                                acc[i][j][e] += chunk[e];
                            }
                        } else {
                            mma_tf32(acc[i][j], a_hi[i], h0, h1);
                        }
                    }
                }
            }
        }
    }

    if constexpr (G::HALF) {
        // acc / (s_r s_c) as two powers of two of half the exponent each (pow2_halves):
        // neither step overflows or underflows unless the result does
        int col_exponent[G::NT][2];
#pragma unroll
        for (u32 j = 0; j < G::NT; ++j) {
#pragma unroll
            for (u32 e = 0; e < 2; ++e) {
                const u32 col = wc * G::WN + j * 8 + 2 * q + e;
                col_exponent[j][e] = exponent_of(lds1(base + 4 * (G::COL_AT + col)));
            }
        }
#pragma unroll
        for (u32 i = 0; i < G::MT; ++i) {
#pragma unroll
            for (u32 h = 0; h < 2; ++h) {  // rows g and g + 8 of tile i, by their item
                const WarpScale& row_scale =
                    i * 16 + 8 * h + g >= item_scales.split ? item_scales.second
                                                            : item_scales.first;
                const int x_exponent = exponent_of(row_scale.inverse);
#pragma unroll
                for (u32 j = 0; j < G::NT; ++j) {
#pragma unroll
                    for (u32 e = 0; e < 2; ++e) {
                        float f1, f2;
                        pow2_halves(x_exponent + col_exponent[j][e], f1, f2);
                        acc[i][j][2 * h + e] = acc[i][j][2 * h + e] * f1 * f2;
                    }
                }
            }
        }
    }

    // Select: the products of the selected k (zero in the FP16 plane) in 3xTF32, from
    // the copies above once the main loop's registers are free: per slot of 8, a fresh
    // fragment takes a_lo b_hi, a_hi b_lo, a_hi b_hi and the unscaled sum adds it. Slot s
    // of group g holds list entries 8 (g SLOTS + s) + {q, q + 4}.
    if constexpr (G::SLOTS > 0) {
        cp_async_wait<0>();
        __syncthreads();
        const saddr sel_x = base + 4 * (G::RING + (wr * G::WM + g) * G::SEL_X_ROW + q);
        const saddr sel_w = base + 4 * (G::SEL_W_SLOT * G::STAGE + q * G::SEL_W_ROW +
                                        wc * G::WN + g);
#pragma unroll 1  // unrolled, it spills on sm_120 (12 bytes)
        for (u32 s = 0; s < G::SLOTS; ++s) {
            const u32 slot = group * G::SLOTS + s;
            uint4 x_hi[G::MT], x_lo[G::MT];
#pragma unroll
            for (u32 i = 0; i < G::MT; ++i) {
                const saddr at = sel_x + 4 * (i * 16 * G::SEL_X_ROW + 8 * slot);
                const float v[4] = {lds1(at), lds1(at + 4 * 8 * G::SEL_X_ROW), lds1(at + 4 * 4),
                                    lds1(at + 4 * (8 * G::SEL_X_ROW + 4))};
                u32 h[4], l[4];
#pragma unroll
                for (u32 e = 0; e < 4; ++e) {
                    tf32_split(v[e], h[e], l[e]);
                }
                x_hi[i] = make_uint4(h[0], h[1], h[2], h[3]);
                x_lo[i] = make_uint4(l[0], l[1], l[2], l[3]);
            }
#pragma unroll
            for (u32 j = 0; j < G::NT; ++j) {
                const saddr at = sel_w + 4 * (8 * slot * G::SEL_W_ROW + j * 8);
                u32 h0, h1, l0, l1;
                tf32_split(lds1(at), h0, l0);
                tf32_split(lds1(at + 4 * 4 * G::SEL_W_ROW), h1, l1);
#pragma unroll
                for (u32 i = 0; i < G::MT; ++i) {
                    float chunk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_split(chunk, x_hi[i], x_lo[i], h0, h1, l0, l1);
#pragma unroll
                    for (u32 e = 0; e < 4; ++e) {
                        acc[i][j][e] += chunk[e];
                    }
                }
            }
        }
    }

    if constexpr (G::KSPLIT > 1) {
        if (!meet_groups<G>(acc, base, group, t)) {
            return;
        }
    }

    // c0, c1: row g, columns 2 q, 2 q + 1 of the fragment; c2, c3: row g + 8
    float* const out = y + z * outputs;
#pragma unroll
    for (u32 i = 0; i < G::MT; ++i) {
#pragma unroll
        for (u32 j = 0; j < G::NT; ++j) {
            const u32 col = col0 + wc * G::WN + j * 8 + 2 * q;
#pragma unroll
            for (u32 half = 0; half < 2; ++half) {
                const u32 r = row0 + wr * G::WM + i * 16 + g + 8 * half;
                float2 v = make_float2(acc[i][j][2 * half], acc[i][j][2 * half + 1]);
                if constexpr (G::HALF) {
                    const float2 b = lds2(base + 4 * (G::COL_AT + G::BN + col - col0));
                    v = make_float2(leaky(v.x + b.x), leaky(v.y + b.y));
                } else if constexpr (!SPLIT_K) {
                    v = make_float2(leaky(v.x + bias2[j].x), leaky(v.y + bias2[j].y));
                }
                if (r < G::M) {
                    stg2(out + u64(r) * G::N + col, v);
                }
            }
        }
    }
}

}  // namespace gemm
}  // namespace spk

#define SPK_GEMM_BODY(SHAPE) spk::gemm::run<SHAPE>(x, x_len, w, w_len, bias, bias_len, y, y_len)
#else
#define SPK_GEMM_BODY(SHAPE) SPK_TIER_STUB()
#endif

namespace spk {
namespace gemm {
using P = Products;
//                  M      N    K     BM  BN   WM  WN KSPLIT BKS STAGES        PAIRED
using Linear0B1 = Shape<589, 128, 256, 32, 32, 16, 32, 2, 2, 3, P::TF32, Out::LEAKY, true>;
using Linear0B32 = Shape<18848, 128, 256, 64, 128, 32, 64, 1, 2, 2, P::SELECT, Out::LEAKY>;
using Linear1B32 = Shape<18848, 128, 128, 64, 128, 32, 64, 1, 2, 2, P::HALF, Out::LEAKY>;
using EmbedTf32 = Shape<96, 256, 5120, 96, 128, 32, 64, 1, 2, 2, P::TF32, Out::PARTIAL>;
using EmbedTf32K2 = Shape<96, 256, 5120, 96, 128, 32, 64, 2, 1, 3, P::TF32, Out::PARTIAL>;
using EmbedTf32E64 = Shape<96, 256, 5120, 96, 64, 32, 64, 2, 1, 3, P::TF32, Out::PARTIAL, true>;
using EmbedX3 = Shape<96, 256, 5120, 96, 64, 32, 32, 1, 2, 3, P::SPLIT, Out::PARTIAL>;
}  // namespace gemm
}  // namespace spk

#define SPK_GEMM_ENTRY(NAME, SHAPE, MIN_BLOCKS)                                           \
    SPK_DENSE_KERNEL(NAME, SHAPE::THREADS, MIN_BLOCKS, SPK_GEMM_BODY(SHAPE))

SPK_GEMM_ENTRY(spk_segdense_linear0_b1_tf32, spk::gemm::Linear0B1, 1)
// batch 32: 295 blocks, all resident at three per SM
SPK_GEMM_ENTRY(spk_segdense_linear0_b32_tf32, spk::gemm::Linear0B32, 3)
SPK_GEMM_ENTRY(spk_segdense_linear1_b32_tf32, spk::gemm::Linear1B32, 3)
// split-K: the rule sizes the slices for two resident blocks per SM (k2: one)
SPK_GEMM_ENTRY(spk_segdense_embed_b32_tf32, spk::gemm::EmbedTf32, 2)
SPK_GEMM_ENTRY(spk_segdense_embed_b32_tf32_k2, spk::gemm::EmbedTf32K2, 1)
SPK_GEMM_ENTRY(spk_segdense_embed_b32_tf32_e64, spk::gemm::EmbedTf32E64, 2)
SPK_GEMM_ENTRY(spk_segdense_embed_b32_x3, spk::gemm::EmbedX3, 2)

#undef SPK_GEMM_ENTRY
#undef SPK_GEMM_BODY
