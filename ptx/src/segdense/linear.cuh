// Shared by the SIMT linears (seglinear*.cuh): their output width and block size, the
// fused bias and LeakyReLU, the load issued in place and the buffer checks.

#pragma once

#include "common.cuh"
#include "model.cuh"

namespace spk {
namespace lin {

constexpr u32 N = 128;           // output columns of both layers
constexpr u32 THREADS = 128;

__device__ __forceinline__ float4 bias_leaky4(float4 v, float4 b) {
    return make_float4(leaky(v.x + b.x), leaky(v.y + b.y), leaky(v.z + b.z), leaky(v.w + b.w));
}

// Asynchronous 16-byte global -> shared copies (sm80 tier; the helpers are in
// sm80.cuh), in commit groups that a warp waits on one at a time.
#if __CUDA_ARCH__ >= 800
#define SPK_LIN_ASYNC 1
#endif
// A global load issued exactly here (ptxas sinks plain loads towards their first use,
// which would put a whole round trip after the last barrier).
__device__ __forceinline__ float4 ldg4_now(const float* p) {
    float4 v;
    asm volatile("ld.volatile.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
}

template <u32 M, u32 K>
__device__ __forceinline__ bool buffers_ok(const float* x, u64 x_len, const float* w,
                                           u64 w_len, const float* bias, u64 bias_len,
                                           const float* y, u64 y_len) {
    return x_len == u64(M) * K & w_len == u64(K) * N & bias_len == N &
           y_len == u64(M) * N & aligned16(x) & aligned16(w) & aligned16(bias) &
           aligned16(y);
}

}  // namespace lin
}  // namespace spk
