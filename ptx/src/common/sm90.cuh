// Helpers of the sm90 tier: Hopper's warpgroup MMA (wgmma) with its register fragments of
// A and shared memory descriptors of B, its fences, and the async-proxy fence. Defined
// only where the compilation targets sm_90a (SPK_WGMMA), the one architecture that runs
// wgmma; the other tiers' kernels never call them.

#pragma once

#include "common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SPK_WGMMA 1

namespace spk {

// The descriptor of a K-major FP16 operand at `address` (16-byte aligned) without
// swizzling: 8 x 8 core matrices of 128 contiguous bytes (8 rows of 16 bytes), the two k
// halves of a step `leading` bytes apart and each next 8 rows `stride` bytes on. Bits
// 0-13 address / 16, 16-29 leading / 16, 32-45 stride / 16; swizzle and base offset 0.
__device__ __forceinline__ u64 wgmma_desc(saddr address, u32 leading, u32 stride) {
    return u64((address & 0x3ffff) >> 4) | (u64(leading >> 4) << 16) | (u64(stride >> 4) << 32);
}
// A B operand of packed weights: the k halves 128 bytes apart, the next 8 columns 256 on.
__device__ __forceinline__ u64 wgmma_b_desc(saddr address) { return wgmma_desc(address, 128, 256); }

// Orders this thread's earlier register and shared memory accesses before the warpgroup's
// next wgmma, which reads and writes its operands asynchronously.
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// Waits until at most N of the warpgroup's committed groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Makes this thread's generic-proxy writes to shared memory (cp.async, st.shared) visible
// to the async proxy, through which wgmma reads its shared operands.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The async copy engine (TMA) into shared memory, completing on an mbarrier: `full`
// counts one arrival (the thread that issues a stage's copies, with the bytes to expect)
// and the copies' bytes; a phase completes when both are in.
__device__ __forceinline__ void mbarrier_init(saddr bar, u32 arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_expect(saddr bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
// Waits until the phase of `parity` (0 or 1) of the mbarrier at `bar` completed.
__device__ __forceinline__ void mbarrier_wait(saddr bar, u32 parity) {
    asm volatile(
        "{\n .reg .pred done;\n"
        "SPK_WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra SPK_WAIT_%=;\n}" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// Fetches the tensor map at `map` (global memory, written before the launch, so no
// proxy fence is needed) ahead of its first use.
__device__ __forceinline__ void tensormap_prefetch(const void* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}
// A ring of SLOTS mbarriers at `full` (8 bytes apart) readied by thread 0, one arrival
// each (the thread that issues a slot's copies), and the tensor map fetched; the block's
// barrier orders the barriers' initialisation (and any earlier shared writes) before use.
template <u32 SLOTS>
__device__ __forceinline__ void tma_ring_init(saddr full, const void* map, u32 tid) {
    if (tid == 0) {
#pragma unroll
        for (u32 slot = 0; slot < SLOTS; ++slot) {
            mbarrier_init(full + slot * 8, 1);
        }
        fence_mbarrier_init();
        tensormap_prefetch(map);
    }
    __syncthreads();
}
// A box of a 2D tensor map at coordinates (inner, outer) to `dst` (128-byte aligned);
// coordinates outside the tensor read zeros.
__device__ __forceinline__ void tma_load_2d(saddr dst, const void* map, int inner, int outer,
                                            saddr bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"(map), "r"(inner), "r"(outer), "r"(bar)
        : "memory");
}
// A box of a 4D tensor map at coordinates (c0 innermost .. c3) to `dst` (128-byte
// aligned); coordinates outside the tensor read zeros.
__device__ __forceinline__ void tma_load_4d(saddr dst, const void* map, int c0, int c1, int c2,
                                            int c3, saddr bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}
// `bytes` (a multiple of 16) contiguous bytes from `src` to `dst` (both 16-byte aligned).
__device__ __forceinline__ void bulk_load(saddr dst, const void* src, u32 bytes, saddr bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}

// This lane's part of a 16 x 16 FP16 fragment in the m16n8k16 A layout (wgmma_f16's a),
// read from shared memory: lane l gives the address of row (l & 7) + 8 ((l >> 3) & 1) of
// the k half l >> 4, each row 16 contiguous bytes.
__device__ __forceinline__ uint4 ldmatrix4(saddr address) {
    uint4 v;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(address)
                 : "memory");
    return v;
}

// Pins each register of `values` at this point of the program: a read of a wgmma's
// result placed after its wait stays after it.
template <u32 A, u32 B>
__device__ __forceinline__ void register_fence(float (&values)[A][B]) {
#pragma unroll
    for (u32 i = 0; i < A; ++i) {
#pragma unroll
        for (u32 j = 0; j < B; ++j) {
            asm volatile("" : "+f"(values[i][j])::"memory");
        }
    }
}

// The asm output operands of a wgmma's sums d[J][4] (J = 4, 8, 16: N = 32, 64, 128), in order.
#define SPK_WGMMA_SUMS16(d)                                                                    \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]),             \
        "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
#define SPK_WGMMA_SUMS32(d)                                                                    \
    SPK_WGMMA_SUMS16(d), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),          \
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),             \
        "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),             \
        "+f"(d[7][2]), "+f"(d[7][3])
#define SPK_WGMMA_SUMS64(d)                                                                    \
    SPK_WGMMA_SUMS32(d), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),          \
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]),            \
        "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]),        \
        "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]),        \
        "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),        \
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]),        \
        "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])

// d = a b (+ d where `accumulate` is not 0) over one m64nNk16 tile of the warpgroup,
// FP32 sums: a this warp's 16 x 16 FP16 fragment (the m16n8k16 A layout of mma.sync,
// rows 16 w .. 16 w + 15 for warp w of the group), b the descriptor of the N x 16
// operand, d this thread's N / 2 sums (the m16n8 accumulator layout, per 8 columns).
template <u32 N>
__device__ __forceinline__ void wgmma_f16(float (&d)[N / 8][4], uint4 a, u64 b, u32 accumulate);
template <>
__device__ __forceinline__ void wgmma_f16<32>(float (&d)[4][4], uint4 a, u64 b, u32 accumulate) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %21, 0; "
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0; }"
        : SPK_WGMMA_SUMS16(d)
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "l"(b), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmma_f16<64>(float (&d)[8][4], uint4 a, u64 b, u32 accumulate) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %37, 0; "
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0; }"
        : SPK_WGMMA_SUMS32(d)
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "l"(b), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmma_f16<128>(float (&d)[16][4], uint4 a, u64 b, u32 accumulate) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %69, 0; "
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0; }"
        : SPK_WGMMA_SUMS64(d)
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "l"(b), "r"(accumulate));
}

// d = a b (+ d where `accumulate` is not 0) over one m64nNk16 tile (N = 8 J) with both
// operands in shared memory: a and b their descriptors (wgmma_desc), d as in wgmma_f16.
template <u32 J>
__device__ __forceinline__ void wgmma_f16_shared(float (&d)[J][4], u64 a, u64 b, u32 accumulate);
template <>
__device__ __forceinline__ void wgmma_f16_shared<4>(float (&d)[4][4], u64 a, u64 b,
                                                          u32 accumulate) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %18, 0; "
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, 0, 0; }"
        : SPK_WGMMA_SUMS16(d)
        : "l"(a), "l"(b), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmma_f16_shared<8>(float (&d)[8][4], u64 a, u64 b,
                                                          u32 accumulate) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %34, 0; "
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0; }"
        : SPK_WGMMA_SUMS32(d)
        : "l"(a), "l"(b), "r"(accumulate));
}

}  // namespace spk

#endif
