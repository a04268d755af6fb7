// segdense: fixed-shape FP32 kernels for the segmentation and embedding dense layers.
//
// Calling convention and entry checks: common.cuh. Every entry returns before writing
// anything when a length, an alignment or its launch shape differs.
//
// Numerics: FP32 storage, products and sums; no float atomics, and every sum runs in
// a fixed order, so the same inputs give the same bits on every run.
//
// Tiers: this file compiles to the sm75 and the sm80 PTX. Both tiers must export the
// same entries with the same parameters; an entry that needs sm80 features (tensor
// cores, cp.async) keeps its body under `#if __CUDA_ARCH__ >= 800` and calls
// SPK_TIER_STUB() in the `#else` branch.
//
// Layout: the shared helpers are in common.cuh (both tiers) and sm80.cuh (sm80 tier),
// the model's constants in model.cuh; this file holds the weight pack and the
// embedding's reductions and SIMT kernels, then includes one header per kernel family.
// The order of the entries here and in the family headers is the order of the PTX.

#include "common.cuh"
#include "model.cuh"

// ---------------------------------------------------------------------------------------
// Packs
// ---------------------------------------------------------------------------------------

// dst[i] from map[i]: the weight element src[map[i] & 0x3fffffff], in bits 30..31 what
// to write: 0 the element, 1 its TF32 rounding, 2 the TF32 rounding of its residual
// (value - TF32(value), exact in FP32), 3 zero. The roundings are cvt.rna's (ties away
// from zero; `round_tf32` in packing.py) in integer arithmetic, so both tiers give the
// same bits. bad[0] (zeroed by the caller) counts the weight elements that are not
// finite: a map reads every element once in mode 0 or 1 (mode 2 reads it again), so
// the plan refuses non-finite weights without reading them on the host.
// Launch: one thread per dst element, blocks of 1024, grid ceil(dst_len / 1024).
__device__ __forceinline__ float tf32_rounded(float value) {
    return __uint_as_float((__float_as_uint(value) + 0x1000u) & 0xffffe000u);
}

extern "C" __global__ void __launch_bounds__(1024)
spk_segdense_pack_gather(const float* __restrict__ src, u64 src_len,
                         const float* __restrict__ map, u64 map_len, float* __restrict__ dst,
                         u64 dst_len, float* __restrict__ bad, u64 bad_len) {
    const u64 blocks = (dst_len + 1023) / 1024;
    if (map_len != dst_len | bad_len != 1 | blocks > 0x7fffffffull |
        !spk::launch_is(u32(blocks), 1, 1, 1024)) {
        return;
    }
    const u64 index = u64(blockIdx.x) * 1024 + threadIdx.x;
    if (index >= dst_len) {
        return;
    }
    const u32 entry = __float_as_uint(map[index]);
    const u32 mode = entry >> 30, from = entry & 0x3fffffffu;
    float value = 0.0f;
    if (mode != 3 & from < src_len) {
        value = src[from];
        if (mode < 2 & (__float_as_uint(value) & 0x7f800000u) == 0x7f800000u) {
            atomicAdd(bad, 1.0f);  // whole counts below 2^24: exact in any order
        }
        if (mode != 0) {
            const float high = tf32_rounded(value);
            value = mode == 1 ? high : tf32_rounded(value - high);
        }
    }
    dst[index] = value;
}

// ---------------------------------------------------------------------------------------
// Embedding split-K reductions
//
// The batch-32 embedding main kernel writes `splits` partial planes of OUTPUTS floats
// (96 rows x 256 columns); plane s is partials[s * OUTPUTS, (s + 1) * OUTPUTS). Each
// reduction writes y[i] = sum + bias[i % 256], the bias added after the whole sum.
// Summation orders, which the GPU tests emulate bit for bit:
//   reduce_e18 / e34 / e36 / embed_flat:  ((p0 + p1) + p2) + ... + p[splits-1]
//   reduce_embed:  warp w (0..7) sums g_w = ((p_w + p_{w+8}) + p_{w+16}) + ...
//                  from its first plane; then ((g0 + g1) + g2) + ... + g7, skipping
//                  the groups of warps w >= splits, which hold no plane.
// ---------------------------------------------------------------------------------------

namespace spk {

__device__ __forceinline__ bool reduce_buffers_ok(const float* partials, u64 p_len,
                                                  const float* bias, u64 bias_len,
                                                  const float* y, u64 y_len, u32 splits) {
    return p_len == u64(splits) * EMBED_OUTPUTS & bias_len == EMBED_COLS &
           y_len == EMBED_OUTPUTS & aligned16(partials) & aligned16(bias) & aligned16(y);
}

// Sums planes 0..splits-1 of four consecutive outputs at `offset` in plane order,
// then adds the bias. All MAX loads are issued before the first add, so one thread
// keeps every plane's load in flight at once; only the adds depend on `splits`.
template <u32 MAX, bool EXACT>
__device__ __forceinline__ void reduce_sequential4(const float* __restrict__ partials,
                                                   const float* __restrict__ bias,
                                                   float* __restrict__ y, u32 splits,
                                                   u32 offset) {
    float4 plane[MAX];
#pragma unroll
    for (u32 s = 0; s < MAX; ++s) {
        // past `splits` the load repeats the last plane (an L1 hit, never added):
        // unpredicated loads all stay ahead of the fence
        const u32 source = EXACT ? s : min(s, splits - 1);
        plane[s] = load4(partials + u64(source) * EMBED_OUTPUTS + offset);
    }
    const float4 bias4 = load4(bias + offset % EMBED_COLS);
    loads_issued();
    float4 sum = plane[0];
#pragma unroll
    for (u32 s = 1; s < MAX; ++s) {
        if (EXACT || s < splits) {
            add4(sum, plane[s]);
        }
    }
    add4(sum, bias4);
    store4(y + offset, sum);
}

// A fixed plane count: grid 48 x 128 threads, four outputs per thread.
template <u32 SPLITS>
__device__ __forceinline__ void reduce_fixed(const float* partials, u64 p_len,
                                             const float* bias, u64 bias_len, float* y,
                                             u64 y_len, u32 splits) {
    if (splits != SPLITS |
        !reduce_buffers_ok(partials, p_len, bias, bias_len, y, y_len, splits) |
        !launch_is(EMBED_OUTPUTS / 4 / 128, 1, 1, 128)) {
        return;
    }
    const u32 offset = (blockIdx.x * 128 + threadIdx.x) * 4;
    reduce_sequential4<SPLITS, true>(partials, bias, y, splits, offset);
}

}  // namespace spk

#define SPK_REDUCE_FIXED(SPLITS)                                                          \
    extern "C" __global__ void __launch_bounds__(128) spk_segdense_reduce_e##SPLITS(     \
        const float* __restrict__ partials, u64 p_len, const float* __restrict__ bias,   \
        u64 bias_len, float* __restrict__ y, u64 y_len, u32 splits) {                    \
        spk::reduce_fixed<SPLITS>(partials, p_len, bias, bias_len, y, y_len, splits);    \
    }

SPK_REDUCE_FIXED(18)
SPK_REDUCE_FIXED(34)
SPK_REDUCE_FIXED(36)

// 1 to 40 planes: grid 96 x 64 threads (more, smaller blocks spread the loads over
// more SMs), four outputs per thread, every plane held in registers.
extern "C" __global__ void __launch_bounds__(64)
spk_segdense_reduce_embed_flat(const float* __restrict__ partials, u64 p_len,
                               const float* __restrict__ bias, u64 bias_len,
                               float* __restrict__ y, u64 y_len, u32 splits) {
    using namespace spk;
    if (splits < 1 | splits > FLAT_MAX_SPLITS |
        !reduce_buffers_ok(partials, p_len, bias, bias_len, y, y_len, splits) |
        !launch_is(EMBED_OUTPUTS / 4 / 64, 1, 1, 64)) {
        return;
    }
    const u32 offset = (blockIdx.x * 64 + threadIdx.x) * 4;
    reduce_sequential4<FLAT_MAX_SPLITS, false>(partials, bias, y, splits, offset);
}

// 1 to 128 planes: grid 192 x 256 threads (eight warps); block b covers outputs
// [128 b, 128 b + 128), each lane four of them. Warp w adds planes w, w + 8, ... (at
// most 16, all loads in flight together); the eight group sums meet in shared memory
// and threads 0..127 add them in warp order, then the bias.
extern "C" __global__ void __launch_bounds__(256)
spk_segdense_reduce_embed(const float* __restrict__ partials, u64 p_len,
                          const float* __restrict__ bias, u64 bias_len,
                          float* __restrict__ y, u64 y_len, u32 splits) {
    using namespace spk;
    constexpr u32 WARPS = 8;
    constexpr u32 SPAN = 128;  // outputs per block
    constexpr u32 PER_WARP = EMBED_MAX_SPLITS / WARPS;
    if (splits < 1 | splits > EMBED_MAX_SPLITS |
        !reduce_buffers_ok(partials, p_len, bias, bias_len, y, y_len, splits) |
        !launch_is(EMBED_OUTPUTS / SPAN, 1, 1, WARPS * 32)) {
        return;
    }
    __shared__ __align__(16) float groups[WARPS * SPAN];

    const u32 warp = threadIdx.x >> 5;
    const u32 lane = threadIdx.x & 31;
    const u32 start = blockIdx.x * SPAN;
    if (warp < splits) {
        const float* source = partials + start + lane * 4;
        float4 plane[PER_WARP];
#pragma unroll
        for (u32 j = 0; j < PER_WARP; ++j) {
            if (warp + j * WARPS < splits) {
                plane[j] = load4(source + u64(warp + j * WARPS) * EMBED_OUTPUTS);
            }
        }
        loads_issued();
        float4 sum = plane[0];
#pragma unroll
        for (u32 j = 1; j < PER_WARP; ++j) {
            if (warp + j * WARPS < splits) {
                add4(sum, plane[j]);
            }
        }
        store4(groups + warp * SPAN + lane * 4, sum);
    }
    __syncthreads();

    const u32 t = threadIdx.x;
    if (t < SPAN) {
        float total = groups[t];
#pragma unroll
        for (u32 g = 1; g < WARPS; ++g) {
            if (g < splits) {
                total += groups[g * SPAN + t];
            }
        }
        const u32 index = start + t;
        y[index] = total + bias[index % EMBED_COLS];
    }
}

// ---------------------------------------------------------------------------------------
// Embedding projection: y[r, c] = sum_k x[r, k] w[c, k] + bias[c], k = 5120
// ---------------------------------------------------------------------------------------

// Batch 1: three rows, weight unpacked [256, 5120]. Grid 128 x 256 threads, block b
// owns columns 2b and 2b + 1. Memory-bound on the 5 MB weight, which each block reads
// once as float4 with all loads issued up front.
// Order: thread t accumulates, by sequential fma from zero, k = 4 (t + 256 j) + e for
// j = 0..4, e = 0..3; an xor butterfly (16, 8, 4, 2, 1) sums each warp; the eight warp
// sums are added in warp order; the bias is added last.
extern "C" __global__ void __launch_bounds__(256)
spk_segdense_embed_b1(const float* __restrict__ x, u64 x_len, const float* __restrict__ w,
                      u64 w_len, const float* __restrict__ bias, u64 bias_len,
                      float* __restrict__ y, u64 y_len) {
    using namespace spk;
    constexpr u32 ROWS = 3;
    constexpr u32 COLS = 2;  // per block
    constexpr u32 THREADS = 256;
    constexpr u32 STEPS = EMBED_K / 4 / THREADS;  // float4 per thread per row
    if (x_len != ROWS * EMBED_K | w_len != u64(EMBED_COLS) * EMBED_K |
        bias_len != EMBED_COLS | y_len != ROWS * EMBED_COLS | !aligned16(x) |
        !aligned16(w) | !launch_is(EMBED_COLS / COLS, 1, 1, THREADS)) {
        return;
    }
    __shared__ float warp_sums[THREADS / 32][ROWS * COLS];

    const u32 t = threadIdx.x;
    const u32 col0 = blockIdx.x * COLS;
    float4 wv[COLS][STEPS];
    float4 xv[ROWS][STEPS];
#pragma unroll
    for (u32 j = 0; j < STEPS; ++j) {
        const u32 k = (t + j * THREADS) * 4;
#pragma unroll
        for (u32 c = 0; c < COLS; ++c) {
            wv[c][j] = load4(w + u64(col0 + c) * EMBED_K + k);
        }
#pragma unroll
        for (u32 r = 0; r < ROWS; ++r) {
            xv[r][j] = load4(x + r * EMBED_K + k);
        }
    }
    loads_issued();

    float sum[ROWS][COLS];
#pragma unroll
    for (u32 r = 0; r < ROWS; ++r) {
#pragma unroll
        for (u32 c = 0; c < COLS; ++c) {
            float s = 0.0f;
#pragma unroll
            for (u32 j = 0; j < STEPS; ++j) {
                s = fmaf(xv[r][j].x, wv[c][j].x, s);
                s = fmaf(xv[r][j].y, wv[c][j].y, s);
                s = fmaf(xv[r][j].z, wv[c][j].z, s);
                s = fmaf(xv[r][j].w, wv[c][j].w, s);
            }
#pragma unroll
            for (u32 lanes = 16; lanes > 0; lanes >>= 1) {
                s += __shfl_xor_sync(0xffffffffu, s, lanes);
            }
            sum[r][c] = s;
        }
    }

    if ((t & 31) == 0) {
#pragma unroll
        for (u32 r = 0; r < ROWS; ++r) {
#pragma unroll
            for (u32 c = 0; c < COLS; ++c) {
                warp_sums[t >> 5][r * COLS + c] = sum[r][c];
            }
        }
    }
    __syncthreads();

    if (t < ROWS * COLS) {
        float total = warp_sums[0][t];
#pragma unroll
        for (u32 g = 1; g < THREADS / 32; ++g) {
            total += warp_sums[g][t];
        }
        const u32 r = t / COLS;
        const u32 col = col0 + t % COLS;
        y[r * EMBED_COLS + col] = total + bias[col];
    }
}

// Batch 32: FP32 SIMT split-K main kernel. m = 96 rows, weight PACKED [5120, 256]
// (k-major). Grid (1, 2, splits): blockIdx.y picks 128 columns, blockIdx.z the
// reduction slice; 192 threads, each an 8 x 8 register tile (12 row groups x 16
// column groups), x and w staged through double-buffered shared memory in steps of
// 8 k. Slice z covers the contiguous k range of units [first, first + units) of 8 k:
// the 640 units split as 640 / splits each, the first 640 % splits slices one more.
// Block (y, z) writes its 96 x 128 part of plane z; every element of the plane is
// written, products taken by sequential fma along k from zero. The bias is accepted
// (and its length checked) for the common dense signature; the reduction adds it.
namespace spk {
constexpr u32 SPLIT_TILE_COLS = 128;
constexpr u32 SPLIT_STEP = 8;                        // k per shared-memory stage
constexpr u32 SPLIT_UNITS = EMBED_K / SPLIT_STEP;    // 640
constexpr u32 SPLIT_X_STRIDE = EMBED_ROWS + 4;       // padding keeps the transposed
                                                     // x stores free of bank conflicts
}  // namespace spk

extern "C" __global__ void __launch_bounds__(192, 2)
spk_segdense_embed_b32(const float* __restrict__ x, u64 x_len, const float* __restrict__ w,
                       u64 w_len, const float* __restrict__ bias, u64 bias_len,
                       float* __restrict__ partials, u64 p_len) {
    using namespace spk;
    constexpr u32 THREADS = 192;
    constexpr u32 STEP = SPLIT_STEP;
    constexpr u32 TILE = SPLIT_TILE_COLS;
    const u32 splits = gridDim.z;
    if (x_len != EMBED_ROWS * EMBED_K | w_len != u64(EMBED_K) * EMBED_COLS |
        bias_len != EMBED_COLS | splits < 1 | splits > EMBED_MAX_SPLITS |
        p_len != u64(splits) * EMBED_OUTPUTS | !aligned16(x) | !aligned16(w) |
        !aligned16(partials) | !launch_is(1, EMBED_COLS / TILE, splits, THREADS)) {
        return;
    }
    __shared__ __align__(16) float xs[2][STEP][SPLIT_X_STRIDE];
    __shared__ __align__(16) float ws[2][STEP][TILE];

    const u32 z = blockIdx.z;
    const u32 per = SPLIT_UNITS / splits;
    const u32 extra = SPLIT_UNITS % splits;
    const u32 units = per + (z < extra ? 1u : 0u);
    const u32 k0 = (z * per + min(z, extra)) * STEP;
    const u32 col0 = blockIdx.y * TILE;
    const u32 t = threadIdx.x;

    // Staging: thread t loads half a row of the x step (a pair of threads reads one
    // 32-byte sector) and one or two float4 of the w step (256 float4 over 192 threads).
    const u32 x_row = t >> 1;
    const u32 x_half = (t & 1) * 4;
    const float* x_source = x + x_row * EMBED_K + k0 + x_half;
    const u32 w_row = t / 32;
    const u32 w_col = (t % 32) * 4;
    const bool w_second = t < 2 * 32;  // rows 6 and 7 of the step
    const float* w_source = w + u64(k0 + w_row) * EMBED_COLS + col0 + w_col;
    const float* w_source2 = w_source + 6 * EMBED_COLS;

    float4 next_x = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 next_w = next_x;
    float4 next_w2 = next_x;
    auto fetch = [&](u32 unit) {
        next_x = load4(x_source + unit * STEP);
        next_w = load4(w_source + u64(unit) * STEP * EMBED_COLS);
        if (w_second) {
            next_w2 = load4(w_source2 + u64(unit) * STEP * EMBED_COLS);
        }
    };
    auto stash = [&](u32 buffer) {
        xs[buffer][x_half + 0][x_row] = next_x.x;
        xs[buffer][x_half + 1][x_row] = next_x.y;
        xs[buffer][x_half + 2][x_row] = next_x.z;
        xs[buffer][x_half + 3][x_row] = next_x.w;
        store4(&ws[buffer][w_row][w_col], next_w);
        if (w_second) {
            store4(&ws[buffer][w_row + 6][w_col], next_w2);
        }
    };

    // Tile: rows 4 rg + {0..3} and 48 + 4 rg + {0..3}; columns 4 cg + {0..3} and
    // 64 + 4 cg + {0..3}, so each operand is two float4 shared-memory reads.
    const u32 rg = t / 16;
    const u32 cg = t % 16;
    float acc[8][8];
    zero(acc);

    if (units > 0) {
        fetch(0);
        stash(0);
    }
    __syncthreads();
    for (u32 unit = 0; unit < units; ++unit) {
        const u32 buffer = unit & 1;
        // Unconditional, so the loads stay ahead of the products instead of being
        // merged into a branch after them; the last step refetches its own unit and
        // stashes it into the idle buffer, which nothing reads again.
        fetch(min(unit + 1, units - 1));
#pragma unroll
        for (u32 kk = 0; kk < STEP; ++kk) {
            const float4 a0 = *reinterpret_cast<const float4*>(&xs[buffer][kk][rg * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&xs[buffer][kk][48 + rg * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&ws[buffer][kk][cg * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&ws[buffer][kk][64 + cg * 4]);
            spk::outer8x8(acc, a0, a1, b0, b1);
        }
        // the other buffer's readers finished before the previous barrier
        stash(buffer ^ 1);
        __syncthreads();
    }

    float* plane = partials + u64(z) * EMBED_OUTPUTS + col0;
#pragma unroll
    for (u32 i = 0; i < 8; ++i) {
        const u32 row = (i < 4 ? 0 : 48) + rg * 4 + (i & 3);
        float* out = plane + row * EMBED_COLS;
        store4(out + cg * 4, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        store4(out + 64 + cg * 4, make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]));
    }
}

// ---------------------------------------------------------------------------------------
// Segmentation families, one file each, after the shared helpers they use
// ---------------------------------------------------------------------------------------

#include "segconv.cuh"
#include "segconv_mma.cuh"
#include "seglinear.cuh"
#include "seggemm_mma.cuh"
#include "seggemm_half.cuh"
#include "classifier.cuh"
