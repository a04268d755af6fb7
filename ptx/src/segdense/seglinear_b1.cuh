// The batch-1 SIMT linears (linear0_b1, linear1_b1_tf32; entries in seglinear.cuh) and
// what linear1_b1's bodies (seglinear_b1_linear1.cuh) share with them: 18 x 32 tiles,
// 128 threads (the compensated linear1 body: 16 x 32). Warp s owns the k slice
// [s k/4, (s+1) k/4) of the whole tile (each lane a 4 x 4 block of the first 16 rows
// over that slice, and two outputs of rows 16..17), stages it in its own shared-memory
// region with its own loads and only __syncwarp, so the four warps never wait on each
// other until their partial tiles meet. Output = ((p0 + p1) + p2) + p3, then + bias,
// then LeakyReLU; p_s is a sequential fma chain from zero over slice s. On the sm80 tier
// each warp's slice arrives by cp.async in groups of 16 k, and the products of a group
// start as soon as it lands (the sm75 tier stages through registers).

#pragma once

#include "common.cuh"
#include "linear.cuh"
#include "model.cuh"
#include "sm80.cuh"

namespace spk {
namespace lin {

// ---------------------------------------------------------------------------------------
// Batch 1: grid (37, 4, 1) x 128 threads. gemm_b1 and the float64 linear1: the first 132
// blocks in launch order own 18 rows x 32 columns each (b1_work); the compensated
// linear1: block (bx, by) owns rows [16 bx, 16 bx + 16) and columns [32 by, 32 by + 32)
// ---------------------------------------------------------------------------------------

constexpr u32 B1_ROWS = 16;
constexpr u32 B1_COLS = 32;
constexpr u32 B1_GRID_X = (ITEM_ROWS + B1_ROWS - 1) / B1_ROWS;  // 37

// Grid use of gemm_b1 and of linear1's float64 body: the first B1_WORK blocks in launch
// order (x fastest) each own B1_WORK_ROWS rows x 32 columns; the other 16 return at
// once. The Config table's 37 x 4 blocks of 16 rows put two on 16 of the H200's 132
// SMs, and a second block nearly doubles an SM's time. Working blocks picked by
// blockIdx.x alone would leave idle ones among the first 132 dispatched and send
// working ones to busy SMs.
constexpr u32 B1_WORK_ROWS = 18;                                           // 16 + 2
constexpr u32 B1_ROW_BLOCKS = (ITEM_ROWS + B1_WORK_ROWS - 1) / B1_WORK_ROWS;  // 33
constexpr u32 B1_WORK = B1_ROW_BLOCKS * (N / B1_COLS);                        // 132
constexpr u32 B1_EXTRA = B1_WORK_ROWS - B1_ROWS;  // rows past the 16-row tile

// This block's first row and column, or false for a block with no work (uniform)
__device__ __forceinline__ bool b1_work(u32& row0, u32& col0) {
    const u32 work = blockIdx.y * B1_GRID_X + blockIdx.x;
    row0 = work % B1_ROW_BLOCKS * B1_WORK_ROWS;
    col0 = work / B1_ROW_BLOCKS * B1_COLS;
    return work < B1_WORK;
}
constexpr u32 B1_WARPS = THREADS / 32;

// A warp's region holds xs[16][KS] then ws[KS][32] for its slice of KS = k / 4; after
// the products it holds the warp's partial tile part[16][32] (and lo[16][32]).
// xs keeps each x row k-contiguous but stores its float4 number q at slot q ^ (row & 3):
// a row is a multiple of 32 banks long, and the swizzle puts the four rows one operand
// read hits (rows rq + 4 i, rq = 0..3) on distinct bank quads.
__device__ __forceinline__ u32 swz(u32 row) { return row & 3; }

// 32 k (from k0) of the warp's tile in registers: x with 8 lanes per row, so lane
// (rr, kl) = (lane / 8, lane % 8) holds rows rr + 4 j; w with 8 lanes per 32-column row,
// lane (kr, c4) holds k rows kr + 4 j, columns 4 c4 + {0..3}. Rows past m (last tile)
// re-read row m - 1, never stored.
template <u32 K>
struct Chunk {
    static constexpr u32 SK = 32;
    static constexpr u32 XN = B1_ROWS / 4;  // float4 of x per lane
    static constexpr u32 WN = SK / 4;       // float4 of w per lane
    float4 xv[XN];
    float4 wv[WN];

    __device__ __forceinline__ void fetch(const float* x, const float* w, u32 row0, u32 col0,
                                          u32 k0, u32 lane) {
        const u32 hi = lane >> 3;
        const u32 lo = lane & 7;
#pragma unroll
        for (u32 j = 0; j < XN; ++j) {
            const u32 row = min(row0 + hi + 4 * j, ITEM_ROWS - 1);
            xv[j] = load4(x + row * K + k0 + lo * 4);
        }
#pragma unroll
        for (u32 j = 0; j < WN; ++j) {
            wv[j] = load4(w + (k0 + hi + 4 * j) * N + col0 + lo * 4);
        }
    }

    // `kq` = float4 number, within the slice, of the chunk's first k. A quarter-warp
    // stores one 128-byte row of xs or ws: no bank conflicts.
    template <u32 KS>
    __device__ __forceinline__ void stash(float* xs, float* ws, u32 kq, u32 lane) const {
        const u32 hi = lane >> 3;
        const u32 lo = lane & 7;
        const u32 slot = (kq + lo) ^ swz(hi);
#pragma unroll
        for (u32 j = 0; j < XN; ++j) {
            store4(xs + (hi + 4 * j) * KS + slot * 4, xv[j]);
        }
#pragma unroll
        for (u32 j = 0; j < WN; ++j) {
            store4(ws + (kq * 4 + hi + 4 * j) * B1_COLS + lo * 4, wv[j]);
        }
    }
};

// Operands of four k (float4 number q of the slice) for lane (rq, cq): a[i] = x of row
// rq + 4 i over those k, b[kk] = w of k 4 q + kk over columns 4 cq + {0..3}.
// `xs`, `ws`: shared addresses of the lane's row rq of xs and columns 4 cq of ws.
template <u32 KS>
__device__ __forceinline__ void operands(saddr xs, saddr ws, u32 q, u32 rq, float4 (&a)[4],
                                         float4 (&b)[4]) {
    const saddr xq = xs + 16 * (q ^ swz(rq));
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
        a[i] = lds4(xq + 4 * (4 * i * KS));
    }
#pragma unroll
    for (u32 kk = 0; kk < 4; ++kk) {
        b[kk] = lds4(ws + 4 * ((q * 4 + kk) * B1_COLS));
    }
}

__device__ __forceinline__ float lane_of(float4 v, u32 e) {
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

template <u32 K>
__device__ __forceinline__ bool b1_shape_ok(const float* x, u64 x_len, const float* w,
                                            u64 w_len, const float* bias, u64 bias_len,
                                            const float* y, u64 y_len) {
    return buffers_ok<ITEM_ROWS, K>(x, x_len, w, w_len, bias, bias_len, y, y_len) &
           launch_is(B1_GRID_X, N / B1_COLS, 1, THREADS);
}

// Writes the lane's 4 x 4 block (rows rq + 4 i, columns 4 cq + {0..3}) of a [16][32] tile
__device__ __forceinline__ void put_block(float* part, u32 rq, u32 cq, const float (&v)[4][4]) {
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
        store4(part + (rq + 4 * i) * B1_COLS + cq * 4,
               make_float4(v[i][0], v[i][1], v[i][2], v[i][3]));
    }
}

__device__ __forceinline__ double dfma(double a, double b, double c) { return __fma_rn(a, b, c); }
// (nvcc 13 splits some of these vector stores into scalar ones when left to itself)
__device__ __forceinline__ void stsd2(double* p, double a, double b) {
    asm volatile("st.shared.v2.f64 [%0], {%1, %2};" ::"r"(shared_address(p)),
                 "d"(a), "d"(b)
                 : "memory");
}

// Element-type dispatch for code shared by the float32 and float64 bodies
__device__ __forceinline__ float2 lds_pair(saddr address, float) { return lds2(address); }
__device__ __forceinline__ dpair lds_pair(saddr address, double) { return ldsd2(address); }
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return dfma(a, b, c); }

// Tile rows 16 and 17, kept out of shared memory (the 16-row operands fill it): lane
// (e, c) = (lane / 16, lane % 16) holds x row 16 + e over the warp's slice of KS k and
// sums columns 2 c, 2 c + 1 of it as sequential fma chains from zero, the order of the
// tile's other outputs. Rows past m re-read row m - 1, never stored.
template <u32 K, u32 KS>
struct ExtraRows {
    float4 xe[KS / 4];

    __device__ __forceinline__ u32 col(u32 lane) const { return (lane & 15) * 2; }
    __device__ __forceinline__ void fetch(const float* x, u32 row0, u32 k0, u32 lane) {
        const float* row = x + min(row0 + B1_ROWS + (lane >> 4), ITEM_ROWS - 1) * K + k0;
#pragma unroll
        for (u32 j = 0; j < KS / 4; ++j) {
            xe[j] = load4(row + 4 * j);
        }
    }
    // `w_row0`: shared address of the slice's w row 0, columns 0.. in elements of T
    template <class T>
    __device__ __forceinline__ void products(saddr w_row0, u32 lane, T (&acc)[2]) const {
        const saddr w_get = w_row0 + sizeof(T) * col(lane);
#pragma unroll
        for (u32 k = 0; k < KS; ++k) {
            const auto b = lds_pair(w_get + sizeof(T) * (k * B1_COLS), T());
            const T a = T(lane_of(xe[k / 4], k % 4));
            acc[0] = fma_rn(a, b.x, acc[0]);
            acc[1] = fma_rn(a, b.y, acc[1]);
        }
    }
};

template <u32 K>
__device__ __forceinline__ void gemm_b1(const float* __restrict__ x, u64 x_len,
                                        const float* __restrict__ w, u64 w_len,
                                        const float* __restrict__ bias, u64 bias_len,
                                        float* __restrict__ y, u64 y_len) {
    constexpr u32 KS = K / B1_WARPS;  // k per warp
    constexpr u32 CHUNKS = KS / Chunk<K>::SK;
    constexpr u32 REGION = (B1_ROWS + B1_COLS) * KS;
    static_assert(KS % Chunk<K>::SK == 0 && B1_WORK_ROWS * B1_COLS <= REGION,
                  "partials fit");
    u32 row0, col0;
    if (!b1_shape_ok<K>(x, x_len, w, w_len, bias, bias_len, y, y_len) |
        !b1_work(row0, col0)) {
        return;
    }
    __shared__ __align__(16) float smem[B1_WARPS * REGION];

    const u32 warp = threadIdx.x >> 5;
    const u32 lane = threadIdx.x & 31;
    float* xs = smem + warp * REGION;
    float* ws = xs + B1_ROWS * KS;
    ExtraRows<K, KS> extra;
    extra.fetch(x, row0, warp * KS, lane);
    // the epilogue's bias, fetched now so its round trip hides under the products
    const float4 bias4 = ldg4_now(bias + col0 + (threadIdx.x & 7) * 4);

    const u32 rq = lane >> 3;
    const u32 cq = lane & 7;
    float acc[4][4];
    zero(acc);
    const saddr x_get = shared_address(xs + rq * KS);
    const saddr w_get = shared_address(ws + cq * 4);
    auto products = [&](u32 q0, u32 q1) {
#pragma unroll
        for (u32 q = q0; q < q1; ++q) {
            float4 a[4], b[4];
            operands<KS>(x_get, w_get, q, rq, a, b);
#pragma unroll
            for (u32 kk = 0; kk < 4; ++kk) {
#pragma unroll
                for (u32 i = 0; i < 4; ++i) {
                    const float av = lane_of(a[i], kk);
                    acc[i][0] = fmaf(av, b[kk].x, acc[i][0]);
                    acc[i][1] = fmaf(av, b[kk].y, acc[i][1]);
                    acc[i][2] = fmaf(av, b[kk].z, acc[i][2]);
                    acc[i][3] = fmaf(av, b[kk].w, acc[i][3]);
                }
            }
        }
    };
#ifdef SPK_LIN_ASYNC
    // The slice lands in groups of 16 k (copies straight to shared memory, all in
    // flight at once); the products of a group start as soon as it is in. Group g:
    // lane (lane / 4, lane % 4) copies x rows lane / 4 + 8 j, float4 4 g + lane % 4
    // (slot swizzled within the group's four), and w k rows 16 g + lane / 8 + 4 j,
    // columns 4 (lane % 8) + {0..3}. Rows past m re-read row m - 1, never stored.
    constexpr u32 GROUPS = KS / 16;
    static_assert(GROUPS >= 2 && GROUPS <= 4, "wait_group immediates below");
    {
        const u32 xr = lane >> 2;
        const u32 xq = lane & 3;
        const u32 wr = lane >> 3;
        const u32 wc = (lane & 7) * 4;
        const float* xsrc[2];
#pragma unroll
        for (u32 j = 0; j < 2; ++j) {
            xsrc[j] = x + min(row0 + xr + 8 * j, ITEM_ROWS - 1) * K + warp * KS + xq * 4;
        }
        const float* wsrc = w + (warp * KS + wr) * N + col0 + wc;
#pragma unroll
        for (u32 g = 0; g < GROUPS; ++g) {
#pragma unroll
            for (u32 j = 0; j < 2; ++j) {
                const u32 row = xr + 8 * j;
                cp_async16(xs + row * KS + ((4 * g + xq) ^ swz(row)) * 4, xsrc[j] + 16 * g);
            }
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                const u32 kr = 16 * g + wr + 4 * j;
                cp_async16(ws + kr * B1_COLS + wc, wsrc + (16 * g + 4 * j) * N);
            }
            cp_async_commit();
        }
    }
#pragma unroll
    for (u32 g = 0; g < GROUPS; ++g) {
        if (GROUPS - 1 - g == 3) cp_async_wait<3>();
        if (GROUPS - 1 - g == 2) cp_async_wait<2>();
        if (GROUPS - 1 - g == 1) cp_async_wait<1>();
        if (GROUPS - 1 - g == 0) cp_async_wait<0>();
        __syncwarp();
        products(4 * g, 4 * g + 4);
    }
#else
    // The whole slice in one memory round trip. (Computing a first chunk while later
    // ones land does not pay: ptxas puts all but the first few loads on one scoreboard,
    // so the first chunk's stores would wait for every load anyway.)
    {
        Chunk<K> chunk[CHUNKS];
#pragma unroll
        for (u32 c = 0; c < CHUNKS; ++c) {
            chunk[c].fetch(x, w, row0, col0, warp * KS + c * Chunk<K>::SK, lane);
        }
        loads_issued();
#pragma unroll
        for (u32 c = 0; c < CHUNKS; ++c) {
            chunk[c].template stash<KS>(xs, ws, c * Chunk<K>::SK / 4, lane);
        }
    }
    __syncwarp();
    products(0, KS / 4);
#endif
    float extra_acc[2] = {0.0f, 0.0f};
    extra.products(shared_address(ws), lane, extra_acc);
    // the warp's own operands are dead: its region takes its partial tile [18][32]
    __syncwarp();
    put_block(xs, rq, cq, acc);
    *reinterpret_cast<float2*>(xs + (B1_ROWS + (lane >> 4)) * B1_COLS + extra.col(lane)) =
        make_float2(extra_acc[0], extra_acc[1]);
    __syncthreads();

    // thread t: tile row t / 8, columns 4 (t % 8) + {0..3}; threads below 16 also
    // row 16 + t / 8
    const u32 t = threadIdx.x;
    auto finish = [&](u32 tile_row) {
        const saddr part = shared_address(smem + tile_row * B1_COLS + (t & 7) * 4);
        float4 sum = lds4(part);
#pragma unroll
        for (u32 s = 1; s < B1_WARPS; ++s) {
            add4(sum, lds4(part + 4 * (s * REGION)));
        }
        const u32 row = row0 + tile_row;
        if (row < ITEM_ROWS) {
            store4(y + row * N + col0 + (t & 7) * 4, bias_leaky4(sum, bias4));
        }
    };
    finish(t >> 3);
    if (t < B1_EXTRA * 8) {
        finish(B1_ROWS + (t >> 3));
    }
}

}  // namespace lin
}  // namespace spk
