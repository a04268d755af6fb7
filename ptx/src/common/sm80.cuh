// Helpers of the sm80 tier: cp.async copies and their commit groups, TF32 and FP16
// rounding, the mma.sync tiles, the 3xTF32 split and the running power-of-two scales of
// FP16 operands. Empty in the sm75 tier, whose sm80-only entries are trapping stubs.

#pragma once

#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

namespace spk {

// Asynchronous 16-byte global -> shared copies (sm80 tier) and their commit groups.
__device__ __forceinline__ void cp_async16(float* shared, const float* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                     u32(__cvta_generic_to_shared(shared))),
                 "l"(global)
                 : "memory");
}
// The same copy that takes only the first `bytes` (0 or 16) from `global` and fills
// the rest with zeros; with 0 it reads nothing.
__device__ __forceinline__ void cp_async16_fill(saddr shared, const float* global, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared), "l"(global),
                 "r"(bytes)
                 : "memory");
}
// A 4-byte copy through L1 with the same zero fill (`bytes` 0 or 4): gathers of single floats.
__device__ __forceinline__ void cp_async4_fill(saddr shared, const float* global, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(shared), "l"(global),
                 "r"(bytes)
                 : "memory");
}
// Asks L2 to fetch the 128-byte line holding `global`; no data reaches the thread.
__device__ __forceinline__ void prefetch_l2(const float* global) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(global));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// `value` rounded to TF32 (ties away from zero), as the bits mma takes: the low 13 bits
// are zero, so the bits are also that value as a float.
__device__ __forceinline__ u32 tf32(float value) {
    u32 bits;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(value));
    return bits;
}

// d += a b over one m16n8k8 tile: a the 16 x 8 TF32 fragment, b the 8 x 8 one.
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint4 a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// Bytes of dynamic shared memory this launch provides: a kernel that needs more than 48
// KiB checks it, since a launch with less would overrun its tiles.
__device__ __forceinline__ u32 dynamic_shared_bytes() {
    u32 bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

// d += a b over one m16n8k16 tile of FP16 pairs (low half first), FP32 accumulation.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint4 a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// (low, high) rounded to FP16, ties to even, as one pair word with `low` in bits 0..15.
__device__ __forceinline__ u32 f16_pair(float low, float high) {
    u32 bits;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(high), "f"(low));
    return bits;
}

// The pair word `bits` (f16_pair's) as two floats: x the low half, y the high.
__device__ __forceinline__ float2 f16_unpair(u32 bits) {
    float2 v;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
        : "=f"(v.x), "=f"(v.y)
        : "r"(bits));
    return v;
}

// (a, b) rounded to FP16 as one pair word (`high`), and the pair of their residuals
// a - high, b - high (exact in FP32) rounded to FP16 (`low`).
__device__ __forceinline__ void f16_split(float a, float b, u32& high, u32& low) {
    high = f16_pair(a, b);
    const float2 h = f16_unpair(high);
    low = f16_pair(a - h.x, b - h.y);
}

// The power of two s = 2^(14 - e), e the exponent of `largest`, that puts `largest` in
// [2^14, 2^15), and 1 / s; the shift is clamped to -113..126 so both are normal floats,
// as `half_scale` computes it on the host.
__device__ __forceinline__ void half_scale_of(float largest, float& scale, float& inverse) {
    const int exponent = int((__float_as_uint(largest) >> 23) & 0xff) - 127;
    const int shift = min(max(14 - exponent, -113), 126);
    scale = __uint_as_float(u32(shift + 127) << 23);
    inverse = __uint_as_float(u32(127 - shift) << 23);
}
// half_scale_of's inverse from its scale, exact: for a normal power of two 2^e the bits of
// 2^-e are (254 << 23) - its bits (for epilogues whose registers cannot keep the inverse)
__device__ __forceinline__ float inverse_of_scale(float scale) {
    return __uint_as_float((254u << 23) - __float_as_uint(scale));
}

// A warp's running power-of-two scale for FP16 operands: `scale` puts the largest
// magnitude the warp has shown so far in [2^14, 2^15) (half_scale_of), `inverse` is 1 / it.
struct WarpScale {
    float largest, scale, inverse;
};
__device__ __forceinline__ WarpScale warp_scale_start() {
    WarpScale s{0.0f, 0.0f, 0.0f};
    half_scale_of(0.0f, s.scale, s.inverse);
    return s;
}
// Folds `m`, this lane's largest magnitude of the next operands, into the warp's scale.
// Where the scale changes (the same in every lane), the sums so far are multiplied by
// the ratio of the new and old scale, a power of two: every product stays in FP16's range.
template <u32 A, u32 B>
__device__ __forceinline__ void raise_warp_scale(float m, WarpScale& s, float (&acc)[A][B][4]) {
    s.largest = fmaxf(s.largest, warp_max(m));
    float next, next_inverse;
    half_scale_of(s.largest, next, next_inverse);
    if (next != s.scale) {
        const float ratio = next * s.inverse;
#pragma unroll
        for (u32 i = 0; i < A; ++i) {
#pragma unroll
            for (u32 j = 0; j < B; ++j) {
#pragma unroll
                for (u32 e = 0; e < 4; ++e) {
                    acc[i][j][e] *= ratio;
                }
            }
        }
        s.scale = next;
        s.inverse = next_inverse;
    }
}

// The exponent of a power of two (a normal float)
__device__ __forceinline__ int exponent_of(float power) {
    return int(__float_as_uint(power) >> 23) - 127;
}
// 2^e as 2^(e / 2) and 2^(e - e / 2), normal floats for |e| <= 252: multiplying by both
// in turn neither overflows nor underflows unless multiplying by 2^e does
__device__ __forceinline__ void pow2_halves(int e, float& first, float& second) {
    first = __uint_as_float(u32(e / 2 + 127) << 23);
    second = __uint_as_float(u32(e - e / 2 + 127) << 23);
}

// The TF32 value of `value` (`high`) and the TF32 value of its rounding residual (`low`,
// exact in FP32): high + low carries about 22 significant bits.
__device__ __forceinline__ void tf32_split(float value, u32& high, u32& low) {
    high = tf32(value);
    low = tf32(value - __uint_as_float(high));
}

// d += the three significant products of the 3xTF32 split, small ones first:
// a_lo b_hi, a_hi b_lo, a_hi b_hi (a_lo b_lo is below FP32 resolution of the product).
__device__ __forceinline__ void mma_split(float (&d)[4], uint4 a_hi, uint4 a_lo, u32 b_hi0,
                                          u32 b_hi1, u32 b_lo0, u32 b_lo1) {
    mma_tf32(d, a_lo, b_hi0, b_hi1);
    mma_tf32(d, a_hi, b_lo0, b_lo1);
    mma_tf32(d, a_hi, b_hi0, b_hi1);
}

}  // namespace spk

#endif
