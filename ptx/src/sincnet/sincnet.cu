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
// A block of SINC_THREADS threads: warp w owns the 16 filters 16 (w % 5) + 0..15 and the
// 32 pooled outputs 32 (w / 5) + lane of a tile of SINC_TILE; a thread's three conv
// positions 3 p + j are one pooled output's, so the max needs no exchange. Blocks are
// persistent and walk the tiles (item, first pooled output). The filters stay in shared
// memory as [tap][80]: a warp's 16 filters at one tap are four broadcast 16-byte reads.
// The tile's input samples sit beside them; a lane reads x at 30 lane + 10 j + k as
// float pairs, and the 16 lanes of a half-warp then fall on 16 distinct bank pairs
// (30 lane mod 32 is even and distinct for lane < 16); the last tap's single reads
// meet two to a bank, once a tile.
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
constexpr u32 SINC_THREADS = 320;  // 10 warps: 5 filter groups x 2 halves of a tile
constexpr u32 SINC_TILE = 64;      // pooled outputs a tile
// input samples a tile reads: its last output's last tap, plus one; padded to 16 bytes
constexpr u32 SINC_SPAN = SINC_STRIDE * SINC_POOL * (SINC_TILE - 1) +
                          SINC_STRIDE * (SINC_POOL - 1) + SINC_TAPS;
constexpr u32 SINC_SPAN_PADDED = (SINC_SPAN + 3) / 4 * 4;
constexpr u32 SINC_SHARED_BYTES = (SINC_TAPS * SINC_FILTERS + SINC_SPAN_PADDED) * 4;
static_assert(SINC_TAPS % 2 == 1, "taps run in pairs, then the last one alone");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

// PyTorch's max-pool: a NaN wins
__device__ __forceinline__ float max_nan(float kept, float value) {
    return (value > kept) | (value != value) ? value : kept;
}

__device__ __forceinline__ void sinc_front(const float* __restrict__ x, u64 x_len,
                                           const float* __restrict__ w, u64 w_len,
                                           float* __restrict__ y, u64 y_len, u32 items,
                                           u32 samples) {
    const u32 positions = samples >= SINC_TAPS ? (samples - SINC_TAPS) / SINC_STRIDE + 1 : 0;
    const u32 pooled = positions / SINC_POOL;
    const bool valid = (gridDim.y == 1) & (gridDim.z == 1) & (blockDim.x == SINC_THREADS) &
                       (blockDim.y == 1) & (blockDim.z == 1) & (items > 0) & (pooled > 0) &
                       (x_len == u64(items) * samples) & (w_len == SINC_TAPS * SINC_FILTERS) &
                       (y_len == u64(items) * SINC_FILTERS * pooled) & aligned16(w) &
                       (dynamic_shared_bytes() >= SINC_SHARED_BYTES);
    if (!valid) {
        return;  // uniform over the grid
    }
    extern __shared__ float4 shared4[];
    float* filters = reinterpret_cast<float*>(shared4);
    float* span = filters + SINC_TAPS * SINC_FILTERS;
    for (u32 i = threadIdx.x; i < SINC_TAPS * SINC_FILTERS / 4; i += SINC_THREADS) {
        shared4[i] = load4(w + 4 * i);
    }
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 group = warp % 5, half = warp / 5;
    const saddr filters_at = shared_address(filters + 16 * group);
    const saddr span_at = shared_address(span + SINC_STRIDE * SINC_POOL * (32 * half + lane));
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
        float acc[SINC_POOL][16] = {};
#pragma unroll 5
        for (u32 k = 0; k < SINC_TAPS - 1; k += 2) {
            float2 in[SINC_POOL];
#pragma unroll
            for (u32 j = 0; j < SINC_POOL; ++j) {
                in[j] = lds2(span_at + (SINC_STRIDE * j + k) * 4);
            }
#pragma unroll
            for (u32 tap = 0; tap < 2; ++tap) {
                float wk[16];
#pragma unroll
                for (u32 q = 0; q < 4; ++q) {
                    const float4 v = lds4(filters_at + ((k + tap) * SINC_FILTERS + 4 * q) * 4);
                    wk[4 * q] = v.x, wk[4 * q + 1] = v.y, wk[4 * q + 2] = v.z, wk[4 * q + 3] = v.w;
                }
#pragma unroll
                for (u32 j = 0; j < SINC_POOL; ++j) {
                    const float value = tap == 0 ? in[j].x : in[j].y;
#pragma unroll
                    for (u32 f = 0; f < 16; ++f) {
                        acc[j][f] = fmaf(value, wk[f], acc[j][f]);
                    }
                }
            }
        }
        {  // the last tap
            const u32 k = SINC_TAPS - 1;
            float wk[16];
#pragma unroll
            for (u32 q = 0; q < 4; ++q) {
                const float4 v = lds4(filters_at + (k * SINC_FILTERS + 4 * q) * 4);
                wk[4 * q] = v.x, wk[4 * q + 1] = v.y, wk[4 * q + 2] = v.z, wk[4 * q + 3] = v.w;
            }
#pragma unroll
            for (u32 j = 0; j < SINC_POOL; ++j) {
                const float value = lds1(span_at + (SINC_STRIDE * j + k) * 4);
#pragma unroll
                for (u32 f = 0; f < 16; ++f) {
                    acc[j][f] = fmaf(value, wk[f], acc[j][f]);
                }
            }
        }
        const u32 p = first + 32 * half + lane;
        if (p < pooled) {
            float* out = y + (u64(item) * SINC_FILTERS + 16 * group) * pooled + p;
#pragma unroll
            for (u32 f = 0; f < 16; ++f) {
                float kept = fabsf(acc[0][f]);
#pragma unroll
                for (u32 j = 1; j < SINC_POOL; ++j) {
                    kept = max_nan(kept, fabsf(acc[j][f]));
                }
                out[u64(f) * pooled] = kept;
            }
        }
    }
}

#endif

}  // namespace spk

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SPK_SINC_BODY() spk::sinc_front(x, x_len, w, w_len, y, y_len, items, samples)
#else
#define SPK_SINC_BODY() SPK_TIER_STUB()
#endif

// x, w, y, items, samples; SINC_SHARED_BYTES of dynamic shared memory; any grid of
// 1-D blocks (the blocks walk the tiles)
extern "C" __global__ void __launch_bounds__(spk::SINC_THREADS, 2)
    spk_sinc_front(const float* __restrict__ x, u64 x_len, const float* __restrict__ w,
                   u64 w_len, float* __restrict__ y, u64 y_len, u32 items, u32 samples) {
    SPK_SINC_BODY();
}
