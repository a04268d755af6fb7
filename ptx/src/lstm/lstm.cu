// The lstm module: the recurrence of one bidirectional LSTM layer of hidden size 128
// (segmentation-3.0's), both directions at once, many sequences a launch.
//
// The input projections (x W_ih^T + b_ih + b_hh for every step) are one GEMM done
// before the launch; this kernel runs what must run step after step: for each step t,
// gates = gx[t] + h[t-1] W_hh^T, then c = f c + i g and h = o tanh(c). One block owns
// ROWS sequences of one direction for all the steps. W_hh is scaled by a power of two
// into FP16's normal range and held as its FP16 value (in registers) and the FP16 value
// of its rest (in shared memory); h[t-1] likewise, both parts in shared memory; c in
// registers (FP32). The products run on FP16 tensor cores with FP32 sums, on operands
// of 22 significant bits: the recurrence's error is far below the TF32 projection's.
//
// Layouts: gx [items][steps][2][512] (direction, then the gates i, f, g, o of the 128
// units each, as PyTorch orders W_ih's rows), y [items][steps][256] (forward units,
// then backward, as nn.LSTM's output), w [2][512][64] words, each the FP16 pair
// (W_hh[row][2k], W_hh[row][2k+1]) of the direction's scaled weights, low half first;
// w_rest [2][LSTM_REST_WORDS] the pairs of the rests, in the B fragments' order.
// `inverse0` and `inverse1` are the FP32 bits of each direction's 1 / scale.

#include "common.cuh"
#include "sm80.cuh"

#include <cuda_fp16.h>

namespace spk {

constexpr u32 LSTM_THREADS = 256;  // 8 warps, 16 units (64 gate columns) each

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

constexpr u32 LSTM_HIDDEN = 128;
constexpr u32 LSTM_GATES = 4 * LSTM_HIDDEN;
constexpr u32 LSTM_ROWS = 16;  // sequences a block: one m16 tile
constexpr u32 LSTM_PAIRS = LSTM_HIDDEN / 2;
// h's rows in shared memory, padded from 64 words so the A fragments' eight rows fall
// on distinct banks
constexpr u32 LSTM_H_STRIDE = LSTM_PAIRS + 4;
// steps ahead the projections are fetched into L2: a step's own loads then wait for L2,
// not for device memory
constexpr u32 LSTM_AHEAD = 2;
// words of one direction's W_hh rest: 8 warps x 8 tiles x 8 k-steps x 32 lanes x 2
constexpr u32 LSTM_REST_WORDS = 8 * 8 * 8 * 32 * 2;
static_assert(LSTM_THREADS == LSTM_ROWS * 16, "one prefetched line a thread");

// __expf and __fdividef: about 2 ulp each, far below the operands' TF32-sized rounding
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
__device__ __forceinline__ float tanh_of(float x) { return 2.0f * sigmoid(2.0f * x) - 1.0f; }

__device__ __forceinline__ void lstm_recurrence(const float* __restrict__ gx, u64 gx_len,
                                                const u32* __restrict__ w, u64 w_len,
                                                const uint4* __restrict__ w_rest, u64 w_rest_len,
                                                float* __restrict__ y, u64 y_len, u32 items,
                                                u32 steps, u32 inverse0, u32 inverse1) {
    // [step parity][FP16 value, FP16 rest]
    __shared__ u32 h_pairs[2][2][LSTM_ROWS * LSTM_H_STRIDE];
    // the rest of the block's direction's W_hh, in fragment order: [warp][tile][k] x 32
    // lanes x 2 words, so that a warp reads 256 consecutive bytes
    extern __shared__ uint4 rest_shared[];
    const u64 step_gates = 2ull * LSTM_GATES;
    const bool valid = launch_is((items + LSTM_ROWS - 1) / LSTM_ROWS, 2, 1, LSTM_THREADS) &
                       (items > 0) & (steps > 0) & (gx_len == u64(items) * steps * step_gates) &
                       (y_len == u64(items) * steps * 2 * LSTM_HIDDEN) &
                       (w_len == 2ull * LSTM_GATES * LSTM_PAIRS) &
                       (w_rest_len == 2ull * LSTM_REST_WORDS / 4) &
                       (dynamic_shared_bytes() >= LSTM_REST_WORDS * 4);
    if (!valid) {
        return;  // uniform over the grid
    }
    const u32 direction = blockIdx.y;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 quad = lane & 3, group = lane >> 2;
    const float inverse = __uint_as_float(direction == 0 ? inverse0 : inverse1);

    // W_hh's B fragments: n-tile 2 g + half holds gate g's units warp*16 + half*8 + 0..7
    u32 wb[8][8][2];
    const u32* wd = w + u64(direction) * LSTM_GATES * LSTM_PAIRS;
#pragma unroll
    for (u32 tile = 0; tile < 8; ++tile) {
        const u32 row = (tile >> 1) * LSTM_HIDDEN + warp * 16 + (tile & 1) * 8 + group;
#pragma unroll
        for (u32 k = 0; k < 8; ++k) {
            wb[tile][k][0] = __ldg(wd + row * LSTM_PAIRS + k * 8 + quad);
            wb[tile][k][1] = __ldg(wd + row * LSTM_PAIRS + k * 8 + 4 + quad);
        }
    }
    const uint4* rest = w_rest + u64(direction) * (LSTM_REST_WORDS / 4);
    for (u32 i = threadIdx.x; i < LSTM_REST_WORDS / 4; i += LSTM_THREADS) {
        rest_shared[i] = __ldg(rest + i);
    }
    const saddr rest_at = shared_address(rest_shared) + (warp * 64 * 32 + lane) * 8;
    for (u32 i = threadIdx.x; i < 2 * LSTM_ROWS * LSTM_H_STRIDE; i += LSTM_THREADS) {
        h_pairs[0][i / (LSTM_ROWS * LSTM_H_STRIDE)][i % (LSTM_ROWS * LSTM_H_STRIDE)] = 0u;
    }  // h before the first step
    // this thread's sequences (rows group and group + 8 of the block's) and units
    // (warp*16 + half*8 + 2 quad + 0..1)
    const u32 first = blockIdx.x * LSTM_ROWS;
    bool live[2];
    const float* gx_row[2];
    float* y_row[2];
#pragma unroll
    for (u32 r = 0; r < 2; ++r) {
        const u32 item = first + group + 8 * r;
        live[r] = item < items;
        const u32 safe = live[r] ? item : 0;
        gx_row[r] = gx + (u64(safe) * steps * 2 + direction) * LSTM_GATES + warp * 16 + 2 * quad;
        y_row[r] = y + u64(safe) * steps * 2 * LSTM_HIDDEN + direction * LSTM_HIDDEN + warp * 16 +
                   2 * quad;
    }
    float c[2][2][2] = {};  // [row][half][unit]
    __syncthreads();

    // the line of the projections this thread asks L2 for, LSTM_AHEAD steps ahead: one
    // of the 16 lines of 128 bytes (512 floats) of each of the block's 16 sequences
    const u32 fetch_row = threadIdx.x >> 4, fetch_line = threadIdx.x & 15;
    const bool fetch_live = first + fetch_row < items;
    const float* fetch_base = gx + (u64(fetch_live ? first + fetch_row : 0) * steps * 2 + direction) *
                                       LSTM_GATES +
                              fetch_line * 32;
    for (u32 s = 0; s < steps; ++s) {
        const u32 t = direction == 0 ? s : steps - 1 - s;
        if (fetch_live & (s + LSTM_AHEAD < steps)) {
            const u32 ahead = direction == 0 ? s + LSTM_AHEAD : steps - 1 - s - LSTM_AHEAD;
            prefetch_l2(fetch_base + u64(ahead) * step_gates);
        }
        // this step's projections, loaded first: the product below hides their latency
        float2 g_in[2][4][2];  // [row][gate][half]
#pragma unroll
        for (u32 r = 0; r < 2; ++r) {
#pragma unroll
            for (u32 gate = 0; gate < 4; ++gate) {
#pragma unroll
                for (u32 half = 0; half < 2; ++half) {
                    const float* at = gx_row[r] + u64(t) * step_gates + gate * LSTM_HIDDEN + half * 8;
                    g_in[r][gate][half] = live[r] ? __ldg(reinterpret_cast<const float2*>(at))
                                                  : make_float2(0.0f, 0.0f);
                }
            }
        }
        // h[t-1] W_hh^T over the warp's 64 gate columns, each operand as the sum of its
        // FP16 value and the FP16 value of its rest: the three products above FP32's
        // resolution, the small ones first (w_rest h, w h_rest, w h)
        float acc[8][4] = {};
        const u32* h_now = h_pairs[s & 1][0];
        const u32* h_rest = h_pairs[s & 1][1];
#pragma unroll
        for (u32 k = 0; k < 8; ++k) {
            const u32 near = group * LSTM_H_STRIDE + k * 8 + quad;
            const u32 far = near + 8 * LSTM_H_STRIDE;
            const uint4 a = make_uint4(h_now[near], h_now[far], h_now[near + 4], h_now[far + 4]);
            const uint4 a_rest =
                make_uint4(h_rest[near], h_rest[far], h_rest[near + 4], h_rest[far + 4]);
#pragma unroll
            for (u32 tile = 0; tile < 8; ++tile) {
                const float2 b_rest = lds2(rest_at + (tile * 8 + k) * 32 * 8);
                mma_f16(acc[tile], a, __float_as_uint(b_rest.x), __float_as_uint(b_rest.y));
                mma_f16(acc[tile], a_rest, wb[tile][k][0], wb[tile][k][1]);
                mma_f16(acc[tile], a, wb[tile][k][0], wb[tile][k][1]);
            }
        }
        // the cell: accumulator e of tile 2 g + half is (row e / 2, unit 2 quad + e % 2)
        u32(&h_next)[2][LSTM_ROWS * LSTM_H_STRIDE] = h_pairs[(s + 1) & 1];
#pragma unroll
        for (u32 r = 0; r < 2; ++r) {
#pragma unroll
            for (u32 half = 0; half < 2; ++half) {
                float h[2];
#pragma unroll
                for (u32 e = 0; e < 2; ++e) {
                    float pre[4];
#pragma unroll
                    for (u32 gate = 0; gate < 4; ++gate) {
                        const float2 in = g_in[r][gate][half];
                        pre[gate] = fmaf(acc[2 * gate + half][2 * r + e], inverse, e ? in.y : in.x);
                    }
                    const float ig = sigmoid(pre[0]), fg = sigmoid(pre[1]);
                    const float gg = tanh_of(pre[2]), og = sigmoid(pre[3]);
                    c[r][half][e] = fmaf(fg, c[r][half][e], ig * gg);
                    h[e] = og * tanh_of(c[r][half][e]);
                }
                const u32 at = (group + 8 * r) * LSTM_H_STRIDE + warp * 8 + half * 4 + quad;
                const u32 value = f16_pair(h[0], h[1]);
                const __half2 rounded = *reinterpret_cast<const __half2*>(&value);
                h_next[0][at] = value;
                h_next[1][at] = f16_pair(h[0] - __low2float(rounded), h[1] - __high2float(rounded));
                if (live[r]) {
                    stg2(y_row[r] + u64(t) * 2 * LSTM_HIDDEN + half * 8, make_float2(h[0], h[1]));
                }
            }
        }
        __syncthreads();
    }
}

#endif

}  // namespace spk

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SPK_LSTM_BODY()                                                                   \
    spk::lstm_recurrence(gx, gx_len, w, w_len, w_rest, w_rest_len, y, y_len, items, steps, \
                         inverse0, inverse1)
#else
#define SPK_LSTM_BODY() SPK_TIER_STUB()
#endif

// gx, w, w_rest (in 16-byte units), y, items, steps, and each direction's 1 / scale as
// FP32 bits; LSTM_REST_WORDS * 4 bytes of dynamic shared memory
extern "C" __global__ void __launch_bounds__(spk::LSTM_THREADS, 1)
    spk_lstm_recurrence(const float* __restrict__ gx, u64 gx_len, const u32* __restrict__ w,
                        u64 w_len, const uint4* __restrict__ w_rest, u64 w_rest_len,
                        float* __restrict__ y, u64 y_len, u32 items, u32 steps, u32 inverse0,
                        u32 inverse1) {
    SPK_LSTM_BODY();
}
