// segdense: fixed-shape FP32 kernels for the segmentation and embedding dense layers.
//
// Calling convention (DESIGN.md section 4): every buffer is a 64-bit pointer followed by
// its element count as `unsigned long long`; scalars are 32-bit unsigned. Each entry
// checks its lengths, the 16-byte alignment of every buffer it reads or writes as
// float4, and its exact launch shape, and returns before writing anything when one
// differs: a wrong launch leaves its output untouched instead of corrupting memory or
// faulting the context.
//
// Numerics: FP32 storage, products and sums; no float atomics, and every sum runs in
// a fixed order, so the same inputs give the same bits on every run.
//
// Tiers: this file compiles to the sm75 and the sm80 PTX. Both tiers must export the
// same entries with the same parameters; an entry that needs sm80 features (tensor
// cores, cp.async) keeps its body under `#if __CUDA_ARCH__ >= 800` and calls
// SPK_TIER_STUB() in the `#else` branch.
//
// Layout: shared helpers first, then one section per kernel family.

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

// ---------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------

typedef unsigned long long u64;
typedef unsigned int u32;

// The sm75 body of an sm80-only entry: fail loudly if a plan ever launches it there.
#define SPK_TIER_STUB() asm volatile("trap;")

namespace spk {

// True when the launch is exactly grid (gx, gy, gz) of 1-D blocks of `bx` threads.
// Every thread computes the same answer, so an early return never splits a barrier.
//
// The entry checks join their tests with & and |, never && and ||: short-circuit
// operators give one branch per test, and ptxas then reads each test's parameters only
// after the branch before it, a chain of constant-bank round trips ahead of the first
// load. Joined, the parameters are read together and one EXIT follows (timing
// harness, same output bits: linear1_b1 3.98 -> 3.87 us, linear1_b32 17.88 -> 17.58).
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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
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

// The power of two s = 2^(14 - e), e the exponent of `largest`, that puts `largest` in
// [2^14, 2^15), and 1 / s; the shift is clamped to -113..126 so both are normal floats,
// as `half_scale` computes it on the host.
__device__ __forceinline__ void half_scale_of(float largest, float& scale, float& inverse) {
    const int exponent = int((__float_as_uint(largest) >> 23) & 0xff) - 127;
    const int shift = min(max(14 - exponent, -113), 126);
    scale = __uint_as_float(u32(shift + 127) << 23);
    inverse = __uint_as_float(u32(127 - shift) << 23);
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
#pragma unroll
    for (u32 d = 1; d < 32; d *= 2) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    }
    s.largest = fmaxf(s.largest, m);
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
#endif

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

// ---------------------------------------------------------------------------------------
// Packs
// ---------------------------------------------------------------------------------------

// dst[kk * d2 + col] = col < d0 ? src[col * d1 + kk] : 0 for kk < d1, col < d2: the
// transpose of a [d0, d1] weight into [d1, d2] with zero columns d0..d2. Conv weights
// [60, k] -> [k, 64] and the embedding weight [256, 5120] -> [5120, 256].
// Launch: one thread per dst element, blocks of 1024, grid ceil(dst_len / 1024).
// Runs once per plan, so it keeps the plain strided gather.
extern "C" __global__ void __launch_bounds__(1024)
spk_segdense_pack(const float* __restrict__ src, u64 src_len, float* __restrict__ dst,
                  u64 dst_len, u32 d0, u32 d1, u32 d2) {
    if (d2 == 0 | d0 > d2 | src_len != u64(d0) * d1 | dst_len != u64(d1) * d2) {
        return;
    }
    const u64 blocks = (dst_len + 1023) / 1024;
    if (blocks > 0x7fffffffull | !spk::launch_is(u32(blocks), 1, 1, 1024)) {
        return;
    }

    const u64 index = u64(blockIdx.x) * 1024 + threadIdx.x;
    if (index >= dst_len) {
        return;
    }
    const u64 kk = index / d2;
    const u32 col = u32(index - kk * d2);
    dst[index] = col < d0 ? src[u64(col) * d1 + kk] : 0.0f;
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

constexpr u32 EMBED_ROWS = 96;     // 32 items x 3 masks
constexpr u32 EMBED_COLS = 256;
constexpr u32 EMBED_K = 5120;
constexpr u32 EMBED_OUTPUTS = EMBED_ROWS * EMBED_COLS;
constexpr u32 EMBED_MAX_SPLITS = 128;
constexpr u32 FLAT_MAX_SPLITS = 40;

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
#include "classifier.cuh"
