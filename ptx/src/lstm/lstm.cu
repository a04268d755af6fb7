// The lstm module: the recurrence of one bidirectional LSTM layer of hidden size 128
// (segmentation-3.0's), both directions at once, many sequences a launch.
//
// The input projections (x W_ih^T + b_ih + b_hh for every step) are one GEMM done
// before the launch; this kernel runs what must run step after step: for each step t,
// gates = gx[t] + h[t-1] W_hh^T, then c = f c + i g and h = o tanh(c). One block owns
// ROWS sequences of one direction for all the steps: W_hh stays in its registers (FP16,
// scaled by a power of two into FP16's normal range), h[t-1] in shared memory (its FP16
// value and the FP16 value of the rest: 22 significant bits) and c in registers (FP32).
// The products run on FP16 tensor cores with FP32 sums: W_hh carries 11 significant
// bits, as cuDNN's TF32 math rounds it, and h twice as many (measured: with h in one
// FP16 the error against float64 was 1.24 times cuDNN TF32's, docs/performance.md).
//
// Layouts: gx [items][steps][2][512] (direction, then the gates i, f, g, o of the 128
// units each, as PyTorch orders W_ih's rows), y [items][steps][256] (forward units,
// then backward, as nn.LSTM's output), w [2][512][64] words, each the FP16 pair
// (W_hh[row][2k], W_hh[row][2k+1]) of the direction's scaled weights, low half first.
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

// __expf and __fdividef: about 2 ulp each, far below the operands' TF32-sized rounding
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
__device__ __forceinline__ float tanh_of(float x) { return 2.0f * sigmoid(2.0f * x) - 1.0f; }

__device__ __forceinline__ void lstm_recurrence(const float* __restrict__ gx, u64 gx_len,
                                                const u32* __restrict__ w, u64 w_len,
                                                float* __restrict__ y, u64 y_len, u32 items,
                                                u32 steps, u32 inverse0, u32 inverse1) {
    // [step parity][FP16 value, FP16 rest]
    __shared__ u32 h_pairs[2][2][LSTM_ROWS * LSTM_H_STRIDE];
    const u64 step_gates = 2ull * LSTM_GATES;
    const bool valid = launch_is((items + LSTM_ROWS - 1) / LSTM_ROWS, 2, 1, LSTM_THREADS) &
                       (items > 0) & (steps > 0) & (gx_len == u64(items) * steps * step_gates) &
                       (y_len == u64(items) * steps * 2 * LSTM_HIDDEN) &
                       (w_len == 2ull * LSTM_GATES * LSTM_PAIRS);
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

    for (u32 s = 0; s < steps; ++s) {
        const u32 t = direction == 0 ? s : steps - 1 - s;
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
        // h[t-1] W_hh^T over the warp's 64 gate columns: h as the sum of its FP16 value
        // and the FP16 value of the rest, the small product first
        float acc[8][4] = {};
#pragma unroll
        for (u32 part = 2; part-- > 0;) {
            const u32* h_now = h_pairs[s & 1][part];
#pragma unroll
            for (u32 k = 0; k < 8; ++k) {
                uint4 a;
                a.x = h_now[group * LSTM_H_STRIDE + k * 8 + quad];
                a.y = h_now[(group + 8) * LSTM_H_STRIDE + k * 8 + quad];
                a.z = h_now[group * LSTM_H_STRIDE + k * 8 + 4 + quad];
                a.w = h_now[(group + 8) * LSTM_H_STRIDE + k * 8 + 4 + quad];
#pragma unroll
                for (u32 tile = 0; tile < 8; ++tile) {
                    mma_f16(acc[tile], a, wb[tile][k][0], wb[tile][k][1]);
                }
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
#define SPK_LSTM_BODY() \
    spk::lstm_recurrence(gx, gx_len, w, w_len, y, y_len, items, steps, inverse0, inverse1)
#else
#define SPK_LSTM_BODY() SPK_TIER_STUB()
#endif

// gx, w, y, items, steps, and each direction's 1 / scale as FP32 bits
extern "C" __global__ void __launch_bounds__(spk::LSTM_THREADS, 1)
    spk_lstm_recurrence(const float* __restrict__ gx, u64 gx_len, const u32* __restrict__ w,
                        u64 w_len, float* __restrict__ y, u64 y_len, u32 items, u32 steps,
                        u32 inverse0, u32 inverse1) {
    SPK_LSTM_BODY();
}
