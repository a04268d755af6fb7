// Tensor-core GEMMs of the segdense module (included by segdense.cu): the linears in TF32
// math (linear0_b1_tf32 on TF32 products; linear1_b32_tf32 and the Select entry
// linear0_b32_tf32 on scaled FP16 products), the split-K embeddings on FP32 weights
// (embed_b32_tf32, _tf32_k2, _tf32_e64, _x3) and, at the end, the split-K embedding on
// scaled FP16 products (embed_b32_f16).
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
// or not. Weights are copied through L2 only: through L1 (.ca, where row tiles share
// them) Select took 16.45 against 15.72 us, linear1_b32 9.14 against 8.94.
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
// Scaled FP16 for the batch-32 linears: in the benchmark of record Select 17.33 -> 14.62 us
// and linear1_b32 9.29 -> 8.63 per enqueue; in the timing harness (medians of CUDA graphs
// of 20 launches), before the bias moved to shared memory, 15.92 -> 14.48 and 8.81 -> 8.50
// against their TF32 forms with the other changes here, rel-L2 equal to five digits. Each
// k-step issues half the mma of two TF32 ones and the weights are half the bytes; what it
// adds is the scale, so it pays only with one scale per warp (one shuffle tree per k-step)
// and two k-steps per stage. With one k-step per stage and three stages, one scale per warp
// took Select 15.16 and linear1 8.96 us, one per row 16.15 and 9.55 (four stages: 16.41 and
// 9.81). Select's listed x columns are gathered into shared memory behind the prologue and
// its rows of w copied into the ring slot the last stage leaves free, so its tail reads
// shared memory only: 17.28 -> 16.45 us in its TF32 form, whose tail read them from global
// memory after the loop.
//
// Measured on the H200 (main kernel, CUDA graphs of 20 launches, medians): two k-steps
// per group and stage over one, linear0_b1 3.80 / 4.20 us, linear1_b32 11.26 / 11.95,
// Select 20.91 / 21.73, embed tf32 13.93 / 15.42, x3 10.28 / 12.55 (e64: 8.28 / 6.98,
// so it keeps one). Weights split into TF32 value and residual (only x's rounding left,
// 0.74x the TF32 error): linear0_b1 3.80 against 3.35 us of plain TF32 (rel-L2 2.06e-4
// against 2.76e-4; cuBLAS's TF32 path: equal to TF32's within 1e-4 of it, either side),
// linear1_b32 15.2 against 11.2 us and e64 8.2 against 7.0, so all multiply in TF32.
// Output pairs stored by stg2: through a float2 cast the split-K kernels' partial stores
// became scalar ones, and one instruction per pair took
// embed tf32 from 14.27 to 7.36 us, k2 9.41 to 6.79, e64 6.87 to 6.13, x3 10.04 to 8.81
// (the f16 entry's stores took the same path). Staging the partial tile in shared memory
// for 16-byte stores then gained nothing, so the fragments store directly. Copy addresses
// as one source pointer per operand plus constants, rather than recomputed per copy:
// Select 20.91 to 20.24 us, linear0_b1 4.40 to 4.21, the others within 0.25. Tried and
// left out: an L2 prefetch of each block's slice at its start (Select 1.9 us slower,
// linear1_b32 1.3, e64 1.0, x3 0.9) and four stages for e64 and x3 (0.16, 0.24 us slower).
// w packed as rounded fragments (one 16-byte read per lane and pair of tiles, no rounding
// in the loop) over [k, n] rows rounded as read: Select 19.35 -> 17.37 us, linear1_b32
// 10.40 -> 9.21, linear0_b1 4.04 -> 3.92, embed tf32 7.30 -> 7.06, k2 6.67 -> 6.33, e64
// 6.07 -> 5.81, x3 8.71 -> 8.22, the same bits. PAIRED on top (x read by 8-byte loads, the
// k of w permuted to match, the same bits again): linear0_b1 3.73, e64 5.72 (5.63 against
// 5.80 in a second run), but (TF32 forms) Select 18.84, linear1_b32 9.30 and embed tf32
// 7.11, so only those two pair (k2 and x3 have no shared memory left for it).

namespace spk {
namespace gemm {

// HALF: scaled FP16 products (m16n8k16); SELECT: HALF with the 16 selected k in 3xTF32
enum class Products { TF32, SPLIT, HALF, SELECT };
enum class Out { LEAKY, PARTIAL };

constexpr u32 SELECT_ROWS = 16;  // as the reference's SELECT_ROWS

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
    static_assert(!G::HALF || (G::M % lin::ITEM_ROWS == 0 && G::WM < lin::ITEM_ROWS), "items");
    const u32 next_item = (warp_row0 / lin::ITEM_ROWS + 1) * lin::ITEM_ROWS;
    return ItemScales{warp_scale_start(), warp_scale_start(), min(next_item - warp_row0, G::WM)};
}
// Folds this lane's largest magnitudes of the next operands of each item (`m_first`,
// `m_second`) into the items' scales. A warp of one item (the branch is warp-uniform)
// keeps the one-scale path; a warp of two reduces each item's largest on its own and
// rescales each accumulator row by its item's ratio (1 where a scale stays).
template <class G>
__device__ __forceinline__ void raise_item_scales(float m_first, float m_second, ItemScales& s,
                                                  float (&acc)[G::MT][G::NT][4]) {
    if (s.split >= G::WM) {
        raise_warp_scale(m_first, s.first, acc);
        return;
    }
    float ratio[2];
#pragma unroll
    for (u32 item = 0; item < 2; ++item) {
        WarpScale& scale = item == 0 ? s.first : s.second;
        float m = item == 0 ? m_first : m_second;
#pragma unroll
        for (u32 d = 1; d < 32; d *= 2) {
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
        }
        scale.largest = fmaxf(scale.largest, m);
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
// x rows scaled by their item's running scale in the warp (raise_item_scales). Scales
// per warp and item rather than per row: one shuffle tree per k-step (two in the warps
// that span two items) instead of one per row.
template <class G>
__device__ __forceinline__ void half_step(saddr a, saddr b, float (&acc)[G::MT][G::NT][4],
                                          ItemScales& scales) {
    const u32 g = threadIdx.x % 32 / 4;
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
            if (i * 16 + 8 * h + g >= scales.split) {
                m_second = fmaxf(m_second, m);
            } else {
                m_first = fmaxf(m_first, m);
            }
        }
    }
    raise_item_scales<G>(m_first, m_second, scales, acc);
    uint4 frag[G::MT];
#pragma unroll
    for (u32 i = 0; i < G::MT; ++i) {
        float s[2];
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
            s[h] = i * 16 + 8 * h + g >= scales.split ? scales.second.scale : scales.first.scale;
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
#pragma unroll
        for (u32 kk = 0; kk < G::BKS; ++kk) {
            if constexpr (G::HALF) {
                half_step<G>(stage_at + a_at + 4 * 16 * kk,
                             stage_at + b_at + 4 * kk * G::BN / 16 * G::PAIR, acc, item_scales);
                continue;
            }
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
                    v = make_float2(lin::leaky(v.x + b.x), lin::leaky(v.y + b.y));
                } else if constexpr (!SPLIT_K) {
                    v = make_float2(lin::leaky(v.x + bias2[j].x), lin::leaky(v.y + bias2[j].y));
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

// ---------------------------------------------------------------------------------------
// embed_b32_f16: the batch-32 embedding split-K on FP16 products with FP32 accumulation.
//
// w: pack_half_columns' layout: word p n + c holds the FP16 pair (w[c][2p] s_c,
// w[c][2p + 1] s_c), low half first, and float k / 2 n + c holds 1 / s_c; the power of
// two s_c puts column c's largest magnitude in [2^14, 2^15). Grid (1, 2, splits),
// 16 <= splits <= 128, 384 threads, HALF_SHARED bytes of dynamic shared memory.
// Slice z covers the 32-term units [160 z / splits, 160 (z + 1) / splits), at most 10
// (320 terms). Four threads per x row load the row's slice, find its largest magnitude
// (xor shuffles), scale the row by the power of two s_r that puts it in [2^14, 2^15)
// (exponent clamped as half_scale clamps it) and store FP16 pairs to shared memory; the
// weights stream through a three-deep cp.async ring of 16 pair rows x 128 columns.
// Two groups of six warps (32 x 64 each) take the first and second 16 terms of every
// unit, chained in their accumulators; group 1's sums are added to group 0's, then
// partial = sum / (s_r s_c), exact scalings by two powers of two of half the exponent
// each (pow2_halves), so no step overflows or underflows unless the partial does (the
// FP16 range keeps every product and sum far inside FP32's).
// Error (u = 2^-24): each scaled operand rounds to FP16 with relative error 2^-11, or an
// absolute 2^-25 below FP16's normal range, so a term errs by at most
// 2^-10 |x w| + 2^-38 (max|x_r| |w| + max|w_c| |x|) and the chained mma as TF32's do.

namespace spk {
namespace half {

constexpr u32 ROWS = 96, COLS = 128, THREADS = 384, GROUP = 192;
constexpr u32 UNIT = 32;                       // terms per stage: two groups of 16
constexpr u32 UNITS = 5120 / UNIT;             // 160
constexpr u32 MIN_SPLITS = 16, MAX_UNITS = 10; // a slice holds at most 320 terms
constexpr u32 X_PITCH = MAX_UNITS * UNIT / 2 + 4;  // words per x row: 4 mod 32 banks
constexpr u32 W_PITCH = COLS + 8;                  // words per pair row: 8 mod 32 banks
constexpr u32 RING = 3;
constexpr u32 X_AT = ROWS;                          // after the row scales (words)
constexpr u32 W_AT = X_AT + ROWS * X_PITCH;
constexpr u32 W_STAGE = UNIT / 2 * W_PITCH;
constexpr u32 RED = GROUP * 64;                     // group 1's accumulators
constexpr u32 REGION = ROWS * X_PITCH + RING * W_STAGE > RED ? ROWS * X_PITCH + RING * W_STAGE
                                                            : RED;
constexpr u32 SHARED_BYTES = 4 * (ROWS + REGION);   // HALF_SHARED of the Config table
static_assert(SHARED_BYTES == 89472, "the reference's HALF_SHARED");
static_assert(W_AT % 4 == 0 && W_PITCH % 4 == 0, "16-byte ring rows");

}  // namespace half
}  // namespace spk

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

namespace spk {
namespace half {

__device__ __forceinline__ void run(const float* __restrict__ x, u64 x_len,
                                    const float* __restrict__ w, u64 w_len,
                                    const float* __restrict__ bias, u64 bias_len,
                                    float* __restrict__ partials, u64 p_len) {
    const u32 splits = gridDim.z;
    if (x_len != u64(ROWS) * EMBED_K | w_len != u64(EMBED_K / 2) * EMBED_COLS + EMBED_COLS |
        bias_len != EMBED_COLS | splits < MIN_SPLITS | splits > EMBED_MAX_SPLITS |
        p_len != u64(splits) * EMBED_OUTPUTS | !aligned16(x) | !aligned16(w) |
        !aligned16(partials) | dynamic_shared_bytes() != SHARED_BYTES |
        !launch_is(1, EMBED_COLS / COLS, splits, THREADS)) {
        return;
    }
    extern __shared__ __align__(16) float smem[];
    const saddr base = shared_address(smem);
    const u32* const pairs = reinterpret_cast<const u32*>(w);

    const u32 t = threadIdx.x;
    const u32 z = blockIdx.z;
    const u32 col0 = blockIdx.y * COLS;
    const u32 first = z * UNITS / splits;
    const u32 units = (z + 1) * UNITS / splits - first;

    // unit i of the slice: pair rows (first + i) 16 .. + 16 of this block's columns
    auto issue = [&](u32 i) {
        const saddr at = base + 4 * (W_AT + (i % RING) * W_STAGE);
#pragma unroll
        for (u32 j = 0; j < 2; ++j) {
            const u32 copy = t + j * THREADS;  // 512 copies of 16 bytes
            if (copy < UNIT / 2 * COLS / 4) {
                const u32 r = copy / (COLS / 4);
                const u32 v = copy % (COLS / 4);
                const u32 pair = (first + i) * (UNIT / 2) + r;
                cp_async16_fill(at + 4 * (r * W_PITCH + 4 * v),
                                reinterpret_cast<const float*>(pairs + pair * EMBED_COLS + col0) +
                                    4 * v,
                                16);
            }
        }
    };
#pragma unroll
    for (u32 i = 0; i < RING - 1; ++i) {
        if (i < units) {
            issue(i);
        }
        cp_async_commit();
    }

    // x: thread t loads float4 t % 4 + 4 j of row t / 4's slice
    {
        const u32 row = t / 4;
        const u32 part = t % 4;
        const float* source = x + row * EMBED_K + first * UNIT;
        float4 v[MAX_UNITS * UNIT / 16];
        float largest = 0.0f;
#pragma unroll
        for (u32 j = 0; j < MAX_UNITS * UNIT / 16; ++j) {
            const u32 quad = part + 4 * j;
            v[j] = quad < units * UNIT / 4 ? load4(source + 4 * quad) : make_float4(0, 0, 0, 0);
            largest = fmaxf(largest, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)),
                                           fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
        }
        largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 1));
        largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 2));
        float scale, inverse;
        half_scale_of(largest, scale, inverse);
        const saddr to = base + 4 * (X_AT + row * X_PITCH);
#pragma unroll
        for (u32 j = 0; j < MAX_UNITS * UNIT / 16; ++j) {
            const u32 quad = part + 4 * j;
            if (quad < units * UNIT / 4) {
                const u32 low = f16_pair(v[j].x * scale, v[j].y * scale);
                const u32 high = f16_pair(v[j].z * scale, v[j].w * scale);
                sts2(to + 4 * 2 * quad, __uint_as_float(low), __uint_as_float(high));
            }
        }
        if (part == 0) {
            smem[row] = inverse;
        }
    }

    const u32 lane = t % 32;
    const u32 group = t / GROUP;
    const u32 warp = t % GROUP / 32;
    const u32 wr = warp / 2, wc = warp % 2;
    const u32 g = lane / 4, q = lane % 4;
    float acc[2][8][4];
    zero(acc);
    const saddr a_at = base + 4 * (X_AT + (wr * 32 + g) * X_PITCH + group * 8 + q);
    const u32 b_at = 4 * ((group * 8 + q) * W_PITCH + wc * 64 + g);

#pragma unroll 1
    for (u32 i = 0; i < units; ++i) {
        cp_async_wait<RING - 2>();
        __syncthreads();  // also publishes the x slice before the first unit
        if (i + RING - 1 < units) {
            issue(i + RING - 1);
        }
        cp_async_commit();
        const saddr a = a_at + 4 * i * (UNIT / 2);
        uint4 frag[2];
#pragma unroll
        for (u32 m = 0; m < 2; ++m) {
            const saddr r = a + 4 * m * 16 * X_PITCH;
            frag[m] = make_uint4(__float_as_uint(lds1(r)), __float_as_uint(lds1(r + 4 * 8 * X_PITCH)),
                                 __float_as_uint(lds1(r + 4 * 4)),
                                 __float_as_uint(lds1(r + 4 * (8 * X_PITCH + 4))));
        }
        const saddr b = base + 4 * (W_AT + (i % RING) * W_STAGE) + b_at;
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const u32 b0 = __float_as_uint(lds1(b + 4 * j * 8));
            const u32 b1 = __float_as_uint(lds1(b + 4 * (4 * W_PITCH + j * 8)));
#pragma unroll
            for (u32 m = 0; m < 2; ++m) {
                mma_f16(acc[m][j], frag[m], b0, b1);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // group 1 hands its sums over (the region held the x slice and the ring), group 0
    // adds them, unscales and stores plane z
    const saddr red = base + 4 * X_AT + 16 * (t % GROUP);
    if (group == 1) {
#pragma unroll
        for (u32 i = 0; i < 2; ++i) {
#pragma unroll
            for (u32 j = 0; j < 8; ++j) {
                const float* v = acc[i][j];
                sts4(red + 16 * GROUP * (i * 8 + j), make_float4(v[0], v[1], v[2], v[3]));
            }
        }
    }
    __syncthreads();
    if (group == 1) {
        return;
    }
    float* const plane = partials + u64(z) * EMBED_OUTPUTS;
#pragma unroll
    for (u32 i = 0; i < 2; ++i) {
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const float4 other = lds4(red + 16 * GROUP * (i * 8 + j));
            const float sum[4] = {acc[i][j][0] + other.x, acc[i][j][1] + other.y,
                                  acc[i][j][2] + other.z, acc[i][j][3] + other.w};
            const u32 col = col0 + wc * 64 + j * 8 + 2 * q;
            const int c0 = exponent_of(__ldg(w + (EMBED_K / 2) * EMBED_COLS + col));
            const int c1 = exponent_of(__ldg(w + (EMBED_K / 2) * EMBED_COLS + col + 1));
#pragma unroll
            for (u32 h = 0; h < 2; ++h) {
                const u32 row = wr * 32 + i * 16 + g + 8 * h;
                const int r = exponent_of(smem[row]);
                float a0, a1, b0, b1;
                pow2_halves(r + c0, a0, a1);
                pow2_halves(r + c1, b0, b1);
                stg2(plane + row * EMBED_COLS + col,
                     make_float2(sum[2 * h] * a0 * a1, sum[2 * h + 1] * b0 * b1));
            }
        }
    }
}

}  // namespace half
}  // namespace spk

#define SPK_HALF_BODY() spk::half::run(x, x_len, w, w_len, bias, bias_len, y, y_len)
#else
#define SPK_HALF_BODY() SPK_TIER_STUB()
#endif

SPK_DENSE_KERNEL(spk_segdense_embed_b32_f16, spk::half::THREADS, 1, SPK_HALF_BODY())

#undef SPK_HALF_BODY
