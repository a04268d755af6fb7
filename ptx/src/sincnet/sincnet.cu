// The sincnet module: the first stage of segmentation-3.0's SincNet front end in one
// kernel, many chunks a launch: the sinc filterbank's convolution (80 filters of 251
// taps, stride 10, one input channel, no padding), then |y|, then MaxPool1d(3, 3).
//
//   y[item][f][p] = max over j < 3 of | sum over k < 251 of x[item][10 (3 p + j) + k] w[k][f] |
//
// Each sum is FP32 fused multiply-adds in tap order: on the H200 the bits of cuDNN's FP32
// convolution, which the engine's FP32 math relies on after a probe. The max propagates
// NaN as PyTorch's max-pool does.
//
// A block of SINC_THREADS threads: warp w owns the 8 filters 8 w + 0..7 and, in a tile
// of SINC_TILE pooled outputs, lane l the two pooled outputs l and l + 32; a thread's six
// conv positions are those outputs' (3 p + j), so the max needs no exchange. Shared
// memory returns 128 bytes a clock an SM, a broadcast read's included, and a lane reads
// 4 (filters + positions) bytes a tap for filters x positions fused multiply-adds: by
// that count a warp's tap took 19 clocks of reads for 12 of products at 16 filters x 3
// positions, and takes 14 at 8 x 6 (8 x 9 would balance them, but spills at 96
// registers). Blocks are persistent and walk the tiles (item, first pooled output). The filters stay in shared memory as
// [tap][80]: a warp's 8 filters at one tap are two broadcast 16-byte reads. The tile's
// input samples sit beside them; a lane reads x at 30 (l + 32 r) + 10 j + k as float
// pairs, and the 16 lanes of a half-warp then fall on 16 distinct bank pairs (30 l mod 32
// is even and distinct for l < 16); the last tap's single reads meet two to a bank, once
// a tile.
//
// Layouts: x [items][samples], w [251][80] (tap-major), y [items][80][pooled] with
// pooled = ((samples - 251) / 10 + 1) / 3, as PyTorch's (batch, channel, frame).

#include "common.cuh"
#include "sm80.cuh"

namespace spk {

constexpr u32 SINC_FILTERS = 80;
constexpr u32 SINC_TAPS = 251;
constexpr u32 SINC_STRIDE = 10;
constexpr u32 SINC_POOL = 3;
constexpr u32 SINC_THREADS = 320;  // 10 warps of 8 filters
constexpr u32 SINC_GROUP = 8;      // filters a warp
constexpr u32 SINC_OUTPUTS = 2;    // pooled outputs a lane, 32 apart
constexpr u32 SINC_TILE = 64;      // pooled outputs a tile
static_assert(SINC_THREADS / 32 * SINC_GROUP == SINC_FILTERS, "a warp a filter group");
static_assert(32 * SINC_OUTPUTS == SINC_TILE, "a warp's lanes cover the tile");
// input samples a tile reads: its last output's last tap, plus one; padded to 16 bytes
constexpr u32 SINC_SPAN = SINC_STRIDE * SINC_POOL * (SINC_TILE - 1) +
                          SINC_STRIDE * (SINC_POOL - 1) + SINC_TAPS;
constexpr u32 SINC_SPAN_PADDED = (SINC_SPAN + 3) / 4 * 4;
constexpr u32 SINC_SHARED_BYTES = (SINC_TAPS * SINC_FILTERS + SINC_SPAN_PADDED) * 4;
static_assert(SINC_TAPS % 2 == 1, "taps run in pairs, then the last one alone");

// The tensor-core kernel's (below).
constexpr u32 SINC_HALF_THREADS = 256;  // 8 warps: 4 row groups x 2 filter halves
constexpr u32 SINC_K = 256;             // taps padded to whole k16 steps
constexpr u32 SINC_K_STEPS = SINC_K / 16;
constexpr u32 SINC_N_TILES = SINC_FILTERS / 8;
constexpr u32 SINC_HALF_WORDS = SINC_K_STEPS * SINC_N_TILES * 32 * 4;
// sample pairs a tile's products read (its last output's padded last tap, plus one)
constexpr u32 SINC_HALF_PAIRS =
    (SINC_STRIDE * SINC_POOL * (SINC_TILE - 1) + SINC_STRIDE * (SINC_POOL - 1) + SINC_K) / 2;
constexpr u32 SINC_THREAD_PAIRS = (SINC_HALF_PAIRS + SINC_HALF_THREADS - 1) / SINC_HALF_THREADS;
constexpr u32 SINC_HALF_SHARED_BYTES =
    SINC_HALF_WORDS * 4 + SINC_THREAD_PAIRS * SINC_HALF_THREADS * 8;
static_assert(SINC_TILE == 64 && SINC_POOL == 3 && SINC_STRIDE == 10, "the rows' layout");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

// PyTorch's max-pool: a NaN wins
__device__ __forceinline__ float max_nan(float kept, float value) {
    return (value > kept) | (value != value) ? value : kept;
}
// A pooled output: the largest |sum| of its SINC_POOL positions, in position order
__device__ __forceinline__ float pooled_abs(float first, float second, float third) {
    static_assert(SINC_POOL == 3, "three positions a pooled output");
    return max_nan(max_nan(fabsf(first), fabsf(second)), fabsf(third));
}

// Whether a launch is one an entry takes (1-D blocks of `threads`, a row of blocks, the
// lengths of `items` chunks of `samples` and of `w_words` filter words, `shared` bytes of
// dynamic shared memory), and the chunk's pooled outputs (0 when too short for one).
__device__ __forceinline__ bool sinc_launch_is(u32 threads, u64 w_words, u32 shared, u64 x_len,
                                               const float* w, u64 w_len, u64 y_len, u32 items,
                                               u32 samples, u32& pooled) {
    const u32 positions = samples >= SINC_TAPS ? (samples - SINC_TAPS) / SINC_STRIDE + 1 : 0;
    pooled = positions / SINC_POOL;
    return (gridDim.y == 1) & (gridDim.z == 1) & (blockDim.x == threads) & (blockDim.y == 1) &
           (blockDim.z == 1) & (items > 0) & (pooled > 0) & (x_len == u64(items) * samples) &
           (w_len == w_words) & (y_len == u64(items) * SINC_FILTERS * pooled) & aligned16(w) &
           (dynamic_shared_bytes() >= shared);
}

__device__ __forceinline__ void sinc_front(const float* __restrict__ x, u64 x_len,
                                           const float* __restrict__ w, u64 w_len,
                                           float* __restrict__ y, u64 y_len, u32 items,
                                           u32 samples) {
    u32 pooled;
    if (!sinc_launch_is(SINC_THREADS, SINC_TAPS * SINC_FILTERS, SINC_SHARED_BYTES, x_len, w,
                        w_len, y_len, items, samples, pooled)) {
        return;  // uniform over the grid
    }
    extern __shared__ float4 shared4[];
    float* filters = reinterpret_cast<float*>(shared4);
    float* span = filters + SINC_TAPS * SINC_FILTERS;
    for (u32 i = threadIdx.x; i < SINC_TAPS * SINC_FILTERS / 4; i += SINC_THREADS) {
        shared4[i] = load4(w + 4 * i);
    }
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const saddr filters_at = shared_address(filters + SINC_GROUP * warp);
    const saddr span_at = shared_address(span + SINC_STRIDE * SINC_POOL * lane);
    constexpr u32 OUTPUT_STEP = SINC_STRIDE * SINC_POOL * 32;  // samples from a lane's output to its next
    const u32 per_item = (pooled + SINC_TILE - 1) / SINC_TILE;
    const u64 tiles = u64(items) * per_item;
    for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const u32 item = u32(tile / per_item);
        const u32 first = u32(tile % per_item) * SINC_TILE;
        const u32 start = SINC_STRIDE * SINC_POOL * first;
        const float* source = x + u64(item) * samples + start;
        const u32 available = samples - start;
        __syncthreads();  // the previous tile's reads are done (and the filters stored)
        for (u32 i = threadIdx.x; i < SINC_SPAN_PADDED; i += SINC_THREADS) {
            span[i] = i < available ? __ldg(source + i) : 0.0f;
        }
        __syncthreads();
        // acc[r][j][f]: output r's position j, filter f
        float acc[SINC_OUTPUTS][SINC_POOL][SINC_GROUP] = {};
#pragma unroll 2
        for (u32 k = 0; k < SINC_TAPS - 1; k += 2) {
            float wk[2][SINC_GROUP];
#pragma unroll
            for (u32 tap = 0; tap < 2; ++tap) {
#pragma unroll
                for (u32 q = 0; q < SINC_GROUP / 4; ++q) {
                    const float4 v = lds4(filters_at + ((k + tap) * SINC_FILTERS + 4 * q) * 4);
                    wk[tap][4 * q] = v.x, wk[tap][4 * q + 1] = v.y;
                    wk[tap][4 * q + 2] = v.z, wk[tap][4 * q + 3] = v.w;
                }
            }
#pragma unroll
            for (u32 r = 0; r < SINC_OUTPUTS; ++r) {
#pragma unroll
                for (u32 j = 0; j < SINC_POOL; ++j) {
                    const float2 in = lds2(span_at + (OUTPUT_STEP * r + SINC_STRIDE * j + k) * 4);
#pragma unroll
                    for (u32 f = 0; f < SINC_GROUP; ++f) {
                        acc[r][j][f] = fmaf(in.x, wk[0][f], acc[r][j][f]);
                    }
#pragma unroll
                    for (u32 f = 0; f < SINC_GROUP; ++f) {
                        acc[r][j][f] = fmaf(in.y, wk[1][f], acc[r][j][f]);
                    }
                }
            }
        }
        {  // the last tap
            const u32 k = SINC_TAPS - 1;
            float wk[SINC_GROUP];
#pragma unroll
            for (u32 q = 0; q < SINC_GROUP / 4; ++q) {
                const float4 v = lds4(filters_at + (k * SINC_FILTERS + 4 * q) * 4);
                wk[4 * q] = v.x, wk[4 * q + 1] = v.y, wk[4 * q + 2] = v.z, wk[4 * q + 3] = v.w;
            }
#pragma unroll
            for (u32 r = 0; r < SINC_OUTPUTS; ++r) {
#pragma unroll
                for (u32 j = 0; j < SINC_POOL; ++j) {
                    const float value = lds1(span_at + (OUTPUT_STEP * r + SINC_STRIDE * j + k) * 4);
#pragma unroll
                    for (u32 f = 0; f < SINC_GROUP; ++f) {
                        acc[r][j][f] = fmaf(value, wk[f], acc[r][j][f]);
                    }
                }
            }
        }
#pragma unroll
        for (u32 r = 0; r < SINC_OUTPUTS; ++r) {
            const u32 p = first + 32 * r + lane;
            if (p < pooled) {
                float* out = y + (u64(item) * SINC_FILTERS + SINC_GROUP * warp) * pooled + p;
#pragma unroll
                for (u32 f = 0; f < SINC_GROUP; ++f) {
                    out[u64(f) * pooled] = pooled_abs(acc[r][0][f], acc[r][1][f], acc[r][2][f]);
                }
            }
        }
    }
}

// The same stage on FP16 tensor-core products (TF32 math): each operand split into a
// high FP16 part and the FP16 rounding of its residual, d += x_lo w_hi + x_hi w_lo +
// x_hi w_hi per mma.sync.m16n8k16, straight into FP32 sums: about 22 significant bits a
// product, against TF32's 11 (the GPU tests bound the error by cuDNN TF32's). The samples
// take a power-of-two scale per tile (its largest finite magnitude into [2^14, 2^15)),
// the filters one per filter (host-packed), so every operand is inside FP16's range.
//
// A tile is SINC_TILE pooled outputs x 80 filters; warp w owns pooled rows 16 (w % 4)
// .. + 15 and filters 40 (w / 4) .. + 39 (5 n tiles). Its m tile j holds position j of
// each pooled output, so a thread's three m tiles hold the three positions of its own
// outputs and the max-pool needs no exchange. Row r of an m tile is pooled output
// 4 (r % 4) + r / 4 of the warp's 16: the rows' pairs of samples then fall on distinct
// bank pairs in each half-warp's 8-byte reads (15 pairs a row). A[r][k] is sample
// 30 q + 10 j + k, so a lane's fragment pair (k even) is one aligned pair of samples.
// The taps pad to SINC_K with zero weights; the last k step's A pairs past tap 250 are
// zeroed too, so a non-finite sample there reaches no output.
//
// Shared memory: the packed filters ([k step][n tile][lane][high b0, b1, low b0, b1]
// words, one 16-byte read a lane and n tile), then the tile's samples as pairs
// [high pair, low pair] (8 bytes a pair of samples).

__device__ __forceinline__ void sinc_front_halves(const float* __restrict__ x, u64 x_len,
                                                  const float* __restrict__ w, u64 w_len,
                                                  float* __restrict__ y, u64 y_len, u32 items,
                                                  u32 samples) {
    u32 pooled;
    if (!sinc_launch_is(SINC_HALF_THREADS, SINC_HALF_WORDS + SINC_FILTERS, SINC_HALF_SHARED_BYTES,
                        x_len, w, w_len, y_len, items, samples, pooled)) {
        return;  // uniform over the grid
    }
    extern __shared__ float4 shared4[];
    __shared__ u32 tile_largest[2];  // by tile parity: the bits of the largest |sample|
    const saddr weights = shared_address(shared4), span = weights + SINC_HALF_WORDS * 4;
    for (u32 i = threadIdx.x; i < SINC_HALF_WORDS / 4; i += SINC_HALF_THREADS) {
        sts4(weights + 16 * i, load4(w + 4 * i));
    }
    if (threadIdx.x < 2) {
        tile_largest[threadIdx.x] = 0;
    }
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const u32 row = 16 * (warp % 4) + 4 * (g % 4) + g / 4;  // row g; row g + 8 is row + 2
    const u32 first_tile = 5 * (warp / 4);                  // the warp's first n tile
    const saddr a_at = span + 8 * (15 * row + t);
    const saddr b_at = weights + 16 * (first_tile * 32 + lane);
    const u32 per_item = (pooled + SINC_TILE - 1) / SINC_TILE;
    const u64 tiles = u64(items) * per_item;

    float raw[SINC_THREAD_PAIRS][2];  // the next tile's samples, loaded a tile ahead
    auto load_tile = [&](u64 tile) {
        const u32 item = u32(tile / per_item);
        const u32 start = SINC_STRIDE * SINC_POOL * SINC_TILE * u32(tile % per_item);
        const float* source = x + u64(item) * samples + start;
        const u32 available = samples - start;
#pragma unroll
        for (u32 m = 0; m < SINC_THREAD_PAIRS; ++m) {
            const u32 pair = threadIdx.x + m * SINC_HALF_THREADS;
#pragma unroll
            for (u32 e = 0; e < 2; ++e) {
                const u32 i = 2 * pair + e;
                raw[m][e] = (pair < SINC_HALF_PAIRS) & (i < available) ? __ldg(source + i) : 0.0f;
            }
        }
    };
    if (blockIdx.x < tiles) {
        load_tile(blockIdx.x);
    }
    __syncthreads();  // tile_largest cleared
    u32 parity = 0;
    for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x, parity ^= 1) {
        float largest = 0.0f;  // of the finite samples (at most FLT_MAX): NaN and inf stay so
#pragma unroll
        for (u32 m = 0; m < SINC_THREAD_PAIRS; ++m) {
#pragma unroll
            for (u32 e = 0; e < 2; ++e) {
                const float magnitude = fabsf(raw[m][e]);
                largest = magnitude <= 3.40282347e38f ? fmaxf(largest, magnitude) : largest;
            }
        }
        largest = warp_max(largest);
        if (lane == 0) {
            atomicMax(&tile_largest[parity], __float_as_uint(largest));
        }
        __syncthreads();  // the largest complete; the last tile's products read no sample
        float scale, inverse;
        half_scale_of(__uint_as_float(tile_largest[parity]), scale, inverse);
        if (threadIdx.x == 0) {
            tile_largest[parity ^ 1] = 0;  // for the next tile, whose maxima follow a barrier
        }
#pragma unroll
        for (u32 m = 0; m < SINC_THREAD_PAIRS; ++m) {
            u32 high, low;
            f16_split(raw[m][0] * scale, raw[m][1] * scale, high, low);
            sts2(span + 8 * (threadIdx.x + m * SINC_HALF_THREADS), __uint_as_float(high),
                 __uint_as_float(low));
        }
        __syncthreads();
        const u64 next = tile + gridDim.x;
        if (next < tiles) {
            load_tile(next);  // in flight during the products
        }
        float acc[SINC_POOL][5][4] = {};
#pragma unroll 1
        for (u32 ks = 0; ks < SINC_K_STEPS; ++ks) {
            uint4 a_high[SINC_POOL], a_low[SINC_POOL];
#pragma unroll
            for (u32 j = 0; j < SINC_POOL; ++j) {
                const saddr at = a_at + 8 * (5 * j + 8 * ks);
                // [high pair, low pair] of rows g and g + 8 (row + 2), k pairs t and t + 4
                const float2 p0 = lds2(at), p1 = lds2(at + 8 * 30);
                const float2 p2 = lds2(at + 8 * 4), p3 = lds2(at + 8 * 34);
                a_high[j] = bits4(make_float4(p0.x, p1.x, p2.x, p3.x));
                a_low[j] = bits4(make_float4(p0.y, p1.y, p2.y, p3.y));
            }
            if (ks == SINC_K_STEPS - 1) {  // taps 248 + 2t, 249 + 2t: past 250 are padding
                const u32 keep = t == 0 ? 0xffffffffu : t == 1 ? 0x0000ffffu : 0u;
#pragma unroll
                for (u32 j = 0; j < SINC_POOL; ++j) {
                    a_high[j].z &= keep, a_high[j].w &= keep;
                    a_low[j].z &= keep, a_low[j].w &= keep;
                }
            }
#pragma unroll
            for (u32 n = 0; n < 5; ++n) {
                const uint4 b = bits4(lds4(b_at + 16 * 32 * (ks * SINC_N_TILES + n)));
                // each sum takes x_lo w_hi, x_hi w_lo, x_hi w_hi in turn; the three m tiles'
                // sums interleave, so no mma waits on the one just issued
#pragma unroll
                for (u32 j = 0; j < SINC_POOL; ++j) {
                    mma_f16(acc[j][n], a_low[j], b.x, b.y);
                }
#pragma unroll
                for (u32 j = 0; j < SINC_POOL; ++j) {
                    mma_f16(acc[j][n], a_high[j], b.z, b.w);
                }
#pragma unroll
                for (u32 j = 0; j < SINC_POOL; ++j) {
                    mma_f16(acc[j][n], a_high[j], b.x, b.y);
                }
            }
        }
        const u32 item = u32(tile / per_item);
        const u32 first = SINC_TILE * u32(tile % per_item);
        const float* filter_inverse = w + SINC_HALF_WORDS + 8 * first_tile + 2 * t;
#pragma unroll
        for (u32 n = 0; n < 5; ++n) {
#pragma unroll
            for (u32 e = 0; e < 4; ++e) {
                const u32 p = first + row + (e < 2 ? 0 : 2);
                const float kept = pooled_abs(acc[0][n][e], acc[1][n][e], acc[2][n][e]);
                const u32 f = 8 * (first_tile + n) + 2 * t + (e & 1);
                if (p < pooled) {
                    // the two powers of two multiplied first, exactly: one rounding, and
                    // kept * inverse cannot overflow for signals past about 2^100
                    y[(u64(item) * SINC_FILTERS + f) * pooled + p] =
                        kept * (inverse * __ldg(filter_inverse + 8 * n + (e & 1)));
                }
            }
        }
    }
}

#endif

}  // namespace spk

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SPK_SINC_BODY() spk::sinc_front(x, x_len, w, w_len, y, y_len, items, samples)
#define SPK_SINC_HALVES_BODY() \
    spk::sinc_front_halves(x, x_len, w, w_len, y, y_len, items, samples)
#else
#define SPK_SINC_BODY() SPK_TIER_STUB()
#define SPK_SINC_HALVES_BODY() SPK_TIER_STUB()
#endif

// x, w, y, items, samples; SINC_SHARED_BYTES of dynamic shared memory; any grid of
// 1-D blocks (the blocks walk the tiles)
extern "C" __global__ void __launch_bounds__(spk::SINC_THREADS, 2)
    spk_sinc_front(const float* __restrict__ x, u64 x_len, const float* __restrict__ w,
                   u64 w_len, float* __restrict__ y, u64 y_len, u32 items, u32 samples) {
    SPK_SINC_BODY();
}

// x, w (the packed FP16 filters, then 80 inverse scales), y, items, samples;
// SINC_HALF_SHARED_BYTES of dynamic shared memory; any grid of 1-D blocks
extern "C" __global__ void __launch_bounds__(spk::SINC_HALF_THREADS, 2)
    spk_sinc_front_f16x3(const float* __restrict__ x, u64 x_len, const float* __restrict__ w,
                         u64 w_len, float* __restrict__ y, u64 y_len, u32 items, u32 samples) {
    SPK_SINC_HALVES_BODY();
}
