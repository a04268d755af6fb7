// Shared by every kernel module (segdense, trunk, cluster, lstm, sincnet): the integer
// types, the entry signatures, the launch and buffer checks, global and shared-memory
// accesses through one PTX instruction each, and the small register-tile helpers. Both
// tiers.
//
// Calling convention: every buffer is a 64-bit pointer followed by its element count as
// `unsigned long long`; scalars are 32-bit unsigned. Each entry checks its lengths, the
// 16-byte alignment of every buffer it reads or writes as float4, and its exact launch
// shape, and returns before writing anything when one differs: a wrong launch leaves
// its output untouched instead of corrupting memory or faulting the context.

#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;

// An entry of the convolution signature (x, w, y) and one of the dense signature
// (x, w, bias, y), each buffer a pointer and its length; BODY is a statement over them.
#define SPK_CONV_KERNEL(NAME, THREADS, MIN_BLOCKS, BODY)                                  \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)                     \
        NAME(const float* __restrict__ x, u64 x_len, const float* __restrict__ w,          \
             u64 w_len, float* __restrict__ y, u64 y_len) {                               \
        BODY;                                                                              \
    }
#define SPK_DENSE_KERNEL(NAME, THREADS, MIN_BLOCKS, BODY)                                 \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) NAME(                \
        const float* __restrict__ x, u64 x_len, const float* __restrict__ w, u64 w_len,   \
        const float* __restrict__ bias, u64 bias_len, float* __restrict__ y, u64 y_len) { \
        BODY;                                                                              \
    }

// The sm75 body of an sm80-only entry: fail loudly if a plan ever launches it there.
#define SPK_TIER_STUB() asm volatile("trap;")

namespace spk {

// True when the launch is exactly grid (gx, gy, gz) of 1-D blocks of `bx` threads.
// Every thread computes the same answer, so an early return never splits a barrier.
//
// The entry checks join their tests with & and |, never && and ||: short-circuit
// operators give one branch per test, and ptxas then reads each test's parameters only
// after the branch before it, a chain of constant-bank round trips ahead of the first
// load. Joined, the parameters are read together and one EXIT follows, with the same
// output bits.
__device__ __forceinline__ bool launch_is(u32 gx, u32 gy, u32 gz, u32 bx) {
    return gridDim.x == gx & gridDim.y == gy & gridDim.z == gz & blockDim.x == bx &
           blockDim.y == 1 & blockDim.z == 1;
}

// float4 accesses fault on a misaligned address, which would poison the context.
__device__ __forceinline__ bool aligned16(const void* pointer) {
    return (reinterpret_cast<u64>(pointer) & 15ull) == 0;
}

__device__ __forceinline__ float4 load4(const float* pointer) {
    return __ldg(reinterpret_cast<const float4*>(pointer));
}

__device__ __forceinline__ void store4(float* pointer, float4 value) {
    *reinterpret_cast<float4*>(pointer) = value;
}

// Global stores of 16 and 8 bytes kept as one instruction each. Through a cast as in
// store4, nvcc 13 split some of them (a linear's output rows, the split-K partial planes)
// into scalar stores, each of which half-writes its sectors.
__device__ __forceinline__ void stg4(float* pointer, float4 v) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(pointer), "f"(v.x), "f"(v.y),
                 "f"(v.z), "f"(v.w)
                 : "memory");
}
__device__ __forceinline__ void stg2(float* pointer, float2 v) {
    asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(pointer), "f"(v.x), "f"(v.y) : "memory");
}

// Shared-memory operand reads go through one PTX load each, at 32-bit shared addresses
// computed once. Left to itself, nvcc 13 may split float4 reads in unrolled loops into
// overlapping partial loads marked with a `used_bytes_mask` pragma, which needs PTX ISA
// 8.3: the pinned 6.3 / 7.0 headers would not assemble. The clobber keeps each read
// after the stores and __syncwarp / __syncthreads before it. Every kernel family reads
// shared memory through these.
typedef u32 saddr;
__device__ __forceinline__ saddr shared_address(const void* pointer) {
    return u32(__cvta_generic_to_shared(pointer));
}
__device__ __forceinline__ float4 lds4(saddr address) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(address)
                 : "memory");
    return v;
}
__device__ __forceinline__ float lds1(saddr address) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(address) : "memory");
    return v;
}
__device__ __forceinline__ void sts1(saddr address, u32 bits) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(address), "r"(bits) : "memory");
}
__device__ __forceinline__ float2 lds2(saddr address) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(address)
                 : "memory");
    return v;
}
typedef double2 dpair;
__device__ __forceinline__ dpair make_dpair(double a, double b) { return make_double2(a, b); }
__device__ __forceinline__ dpair ldsd2(saddr address) {
    double2 v;
    asm volatile("ld.shared.v2.f64 {%0, %1}, [%2];"
                 : "=d"(v.x), "=d"(v.y)
                 : "r"(address)
                 : "memory");
    return v;
}

__device__ __forceinline__ void sts4(saddr address, float4 v) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(address), "f"(v.x), "f"(v.y),
                 "f"(v.z), "f"(v.w)
                 : "memory");
}
__device__ __forceinline__ void sts2(saddr address, float a, float b) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(address), "f"(a), "f"(b) : "memory");
}

// The bits of four floats, as mma fragment registers take them
__device__ __forceinline__ uint4 bits4(float4 v) {
    return make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z),
                      __float_as_uint(v.w));
}

// The same read at a pointer, for code that keeps pointers rather than shared addresses
__device__ __forceinline__ float4 lds4(const float* pointer) {
    return lds4(shared_address(pointer));
}

// Placed between a thread's independent loads and the arithmetic that uses them.
// Left alone, ptxas issues only a few loads ahead of their first use to save
// registers, which turns one memory round trip into several; memory operations
// cannot move across a CTA-scope fence, so every load above it is in flight at once.
__device__ __forceinline__ void loads_issued() {
    asm volatile("fence.acq_rel.cta;" ::: "memory");
}

// The largest `m` of the warp's lanes, in every lane.
__device__ __forceinline__ float warp_max(float m) {
#pragma unroll
    for (u32 d = 1; d < 32; d *= 2) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    }
    return m;
}

// The sum of the warp's lanes' `value`, in every lane: a butterfly in a fixed order, so
// the same inputs give the same bits.
__device__ __forceinline__ double warp_sum(double value) {
#pragma unroll
    for (u32 d = 16; d > 0; d >>= 1) {
        value += __shfl_xor_sync(0xffffffffu, value, d);
    }
    return value;
}

// Every element of a thread's 2-D register tile to zero
template <class T, u32 M, u32 N>
__device__ __forceinline__ void zero(T (&tile)[M][N]) {
#pragma unroll
    for (u32 i = 0; i < M; ++i) {
#pragma unroll
        for (u32 j = 0; j < N; ++j) {
            tile[i][j] = T(0);
        }
    }
}

// The same for a tile of mma accumulator fragments
template <class T, u32 M, u32 N, u32 E>
__device__ __forceinline__ void zero(T (&tile)[M][N][E]) {
#pragma unroll
    for (u32 i = 0; i < M; ++i) {
        zero(tile[i]);
    }
}

__device__ __forceinline__ void add4(float4& sum, float4 term) {
    sum.x += term.x;
    sum.y += term.y;
    sum.z += term.z;
    sum.w += term.w;
}

// True where FP64 runs at half the FP32 rate (GA100, GH100, GB100: 64 warp slots per
// SM); the consumer parts (48 slots) and Turing run FP64 at 1/32 .. 1/64 and take the
// FP32 path. Uniform over the grid, so both paths may hold a barrier.
__device__ __forceinline__ bool fp64_fast() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u32 slots;
    asm("mov.u32 %0, %%nwarpid;" : "=r"(slots));
    return slots >= 64;
#else
    return false;
#endif
}

// acc[i][j] += a[i] b[j] over an 8 x 8 register tile, one fma each: the inner step of the
// SIMT GEMMs, whose k order it leaves to the caller's loop.
__device__ __forceinline__ void outer8x8(float (&acc)[8][8], float4 a0, float4 a1, float4 b0,
                                         float4 b1) {
    const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
    for (u32 i = 0; i < 8; ++i) {
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
    }
}

}  // namespace spk
