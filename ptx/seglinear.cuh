// seglinear kernels of the segdense module (included by segdense.cu)
//
// linear0 and linear1 of the segmentation head: y = LeakyReLU(x @ w + bias), x [m, k]
// row-major, w [k, 128] row-major (unpacked), bias [128], y [m, 128], m = batch * 589,
// k = 256 (linear0) or 128 (linear1). FP32 SIMT, one launch, no workspace.
//
// Batch 32: 72 x 128 tiles, 128 threads of 9 x 8 outputs, x and w staged in steps of 8 k
// through double-buffered shared memory (one barrier per step). Each output is a
// sequential fma chain along k from zero, then + bias, then LeakyReLU.
//
// Batch 1: 18 x 32 tiles, 128 threads (the compensated linear1 body: 16 x 32). Warp s
// owns the k slice [s k/4, (s+1) k/4) of the whole tile (each lane a 4 x 4 block of the
// first 16 rows over that slice, and two outputs of rows 16..17), stages it in its own
// shared-memory region with its own loads and only __syncwarp, so the four warps never
// wait on each other until their partial tiles meet. Output = ((p0 + p1) + p2) + p3,
// then + bias, then LeakyReLU; p_s is a sequential fma chain from zero over slice s.
// On the sm80 tier each warp's slice arrives by cp.async in groups of 16 k, and the
// products of a group start as soon as it lands (the sm75 tier stages through registers).
// linear1_b1 accumulates each slice in float64 on the sm80 tier (`linear1_b1_f64`) and
// keeps a compensated float32 (hi, lo) pair per slice on the sm75 tier (`anchored_step`).

namespace spk {
namespace lin {

constexpr u32 N = 128;           // output columns of both layers
constexpr u32 ITEM_ROWS = 589;   // frames per 10 s chunk
constexpr u32 THREADS = 128;

// v if v >= 0 or v is NaN (both fail `v < 0`), else 0.01f v
__device__ __forceinline__ float leaky(float v) { return v < 0.0f ? 0.01f * v : v; }

__device__ __forceinline__ float4 bias_leaky4(float4 v, float4 b) {
    return make_float4(leaky(v.x + b.x), leaky(v.y + b.y), leaky(v.z + b.z), leaky(v.w + b.w));
}

// Asynchronous 16-byte global -> shared copies (sm80 tier; the helpers are in
// segdense.cu), in commit groups that a warp waits on one at a time.
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

// ---------------------------------------------------------------------------------------
// Batch 32: grid (295, 1, 1) x 128 threads; block b < 262 owns rows [72 b, 72 b + 72),
// blocks 262.. return at once
// ---------------------------------------------------------------------------------------
//
// Why 72 rows: the 295 blocks the Config table launches land two on most SMs of the H200
// and three on 31 of them, so with one 64-row tile per block those 31 SMs did half as
// much work again as the rest and set the kernel's time. 262 blocks of 72 rows cover
// m = 18848 with at most two working blocks per SM: 37.5 -> 32.2 us per enqueue of
// linear0_b32 and 19.7 -> 18.0 us of linear1_b32 in the benchmark of record, with the
// same output bits (each output's order is unchanged). Placement only moves the time,
// never a result.

constexpr u32 B32_M = 32 * ITEM_ROWS;  // 18848 = 261 * 72 + 56
constexpr u32 B32_LAUNCHED = (B32_M + 63) / 64;  // the Config table's grid: 64-row blocks
constexpr u32 B32_ROWS = 72;                     // 64 in the 8 x 8 tiles, 8 more
constexpr u32 B32_STEP = 8;                      // k per shared-memory stage
constexpr u32 B32_XSTRIDE = B32_ROWS + 4;        // 4 x stride = 16 banks: the transposed x
                                                 // stores of the two k halves never collide

template <u32 K>
__device__ __forceinline__ void gemm_b32(const float* __restrict__ x, u64 x_len,
                                         const float* __restrict__ w, u64 w_len,
                                         const float* __restrict__ bias, u64 bias_len,
                                         float* __restrict__ y, u64 y_len) {
    constexpr u32 M = B32_M;
    constexpr u32 STEP = B32_STEP;
    constexpr u32 STAGES = K / STEP;
    static_assert(K % STEP == 0 && STAGES >= 2, "whole steps, at least two");
    if (!buffers_ok<M, K>(x, x_len, w, w_len, bias, bias_len, y, y_len) |
        !launch_is(B32_LAUNCHED, 1, 1, THREADS)) {
        return;
    }
    const u32 row0 = blockIdx.x * B32_ROWS;
    if (row0 >= M) {
        return;  // block-uniform, before any barrier
    }
    // buffer b: xs[kk][r] = x[row0 + r, k0 + kk] (transposed so a lane reads 4 rows as
    // one float4), ws[kk][c] = w[k0 + kk, c]. One struct per buffer, so a single
    // alternating offset moves every staging and operand pointer to the other buffer.
    struct Buffer {
        float xs[STEP][B32_XSTRIDE];
        float ws[STEP][N];
    };
    __shared__ __align__(16) Buffer buffers[2];
    constexpr u32 FLIP = sizeof(Buffer) / sizeof(float);

    const u32 t = threadIdx.x;

    // Staging: a lane pair reads one 32-byte x row segment (the k halves) of rows 0..63,
    // threads 0..15 also of rows 64..71; each warp reads whole 512-byte w rows (k rows
    // t / 32 and t / 32 + 4). Rows past m (last block) re-read row m - 1: their products
    // are computed and never stored. Running pointers keep the per-step address work to
    // a few 64-bit adds.
    const u32 x_row = t >> 1;
    const u32 x_half = (t & 1) * 4;
    const bool extra_row = t < 16;
    const u32 x_row2 = 64 + (x_row & 7);
    const float* x_next = x + min(row0 + x_row, M - 1) * K + x_half;
    const float* x_next2 = x + min(row0 + x_row2, M - 1) * K + x_half;
    const float* w_next = w + (t >> 5) * N + (t & 31) * 4;
    float* x_put = &buffers[0].xs[x_half][x_row];
    float* x_put2 = &buffers[0].xs[x_half][x_row2];
    float* w_put = &buffers[0].ws[t >> 5][(t & 31) * 4];
    float4 next_x, next_x2, next_w0, next_w1;
    auto fetch = [&]() {
        next_x = load4(x_next);
        next_x2 = load4(x_next2);  // every thread: an in-bounds address, no predicate
        next_w0 = load4(w_next);
        next_w1 = load4(w_next + 4 * N);
        x_next += STEP;
        x_next2 += STEP;
        w_next += STEP * N;
        // keeps the next step's loads above this step's products (ptxas otherwise sinks
        // them mid-step): 39.3 -> 36.4 us per launch of linear0_b32 when its blocks took
        // 64 rows (before the 72-row blocks above)
        loads_issued();
    };
    auto put_x = [](float* xp, float4 v) {
        xp[0 * B32_XSTRIDE] = v.x;
        xp[1 * B32_XSTRIDE] = v.y;
        xp[2 * B32_XSTRIDE] = v.z;
        xp[3 * B32_XSTRIDE] = v.w;
    };
    auto stash = [&](u32 offset) {
        put_x(x_put + offset, next_x);
        if (extra_row) {
            put_x(x_put2 + offset, next_x2);
        }
        float* wp = w_put + offset;
        store4(wp, next_w0);
        store4(wp + 4 * N, next_w1);
    };

    // Tile: rows 4 rg + {0..3}, 32 + 4 rg + {0..3} and 64 + rg, columns 4 cg + {0..3}
    // and 64 + 4 cg + {0..3}. A warp spans 4 row groups x 8 column groups, so each of its
    // float4 reads per k touches 64 or 128 distinct bytes: one wavefront each.
    const u32 warp = t >> 5;
    const u32 lane = t & 31;
    const u32 rg = (warp >> 1) * 4 + (lane >> 3);
    const u32 cg = (warp & 1) * 8 + (lane & 7);
    const saddr x_get = shared_address(&buffers[0].xs[0][rg * 4]);
    const saddr x_get2 = shared_address(&buffers[0].xs[0][64 + rg]);
    const saddr w_get = shared_address(&buffers[0].ws[0][cg * 4]);
    float acc[8][8];
    float acc_extra[8];  // row 64 + rg
#pragma unroll
    for (u32 i = 0; i < 8; ++i) {
        acc_extra[i] = 0.0f;
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            acc[i][j] = 0.0f;
        }
    }
    auto compute = [&](u32 offset) {
        const saddr xp = x_get + 4 * offset;
        const saddr xq = x_get2 + 4 * offset;
        const saddr wp = w_get + 4 * offset;
#pragma unroll
        for (u32 kk = 0; kk < STEP; ++kk) {
            const float4 a0 = lds4(xp + 4 * (kk * B32_XSTRIDE));
            const float4 a1 = lds4(xp + 4 * (kk * B32_XSTRIDE + 32));
            const float a2 = lds1(xq + 4 * (kk * B32_XSTRIDE));
            const float4 b0 = lds4(wp + 4 * (kk * N));
            const float4 b1 = lds4(wp + 4 * (kk * N + 64));
            outer8x8(acc, a0, a1, b0, b1);
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (u32 j = 0; j < 8; ++j) {
                acc_extra[j] = fmaf(a2, b[j], acc_extra[j]);
            }
        }
    };

    fetch();
    stash(0);
    __syncthreads();
    u32 offset = 0;  // of the buffer being read: 0 or FLIP
    for (u32 stage = 0; stage + 1 < STAGES; ++stage) {
        // next step's loads fly during this step's products
        fetch();
        compute(offset);
        // the other buffer's readers all passed the previous barrier
        offset = FLIP - offset;
        stash(offset);
        __syncthreads();
    }
    // the epilogue's bias flies during the last step's products
    const float4 bias0 = load4(bias + cg * 4);
    const float4 bias1 = load4(bias + 64 + cg * 4);
    compute(offset);

#pragma unroll
    for (u32 i = 0; i < 9; ++i) {
        const u32 row = row0 + (i < 4 ? rg * 4 + i : i < 8 ? 32 + rg * 4 + (i & 3) : 64 + rg);
        const float* out_acc = i < 8 ? acc[i] : acc_extra;
        if (row < M) {
            float* out = y + row * N + cg * 4;
            store4(out, bias_leaky4(make_float4(out_acc[0], out_acc[1], out_acc[2],
                                                out_acc[3]),
                                    bias0));
            store4(out + 64, bias_leaky4(make_float4(out_acc[4], out_acc[5], out_acc[6],
                                                     out_acc[7]),
                                         bias1));
        }
    }
}

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
// SMs, and a second block nearly doubles an SM's time (the 16-row linear1_b1 on a grid
// of 132 blocks: 3.41 us per launch, of 136: 4.71 us; medians over CUDA graphs of 20
// launches). Working blocks picked by blockIdx.x alone would leave idle ones among the
// first 132 dispatched and send working ones to busy SMs (5.66 us). In the benchmark run
// that introduced it: linear1_b1 4.85 -> 3.91 us, linear0_b1 3.64 -> 3.24 us per enqueue.
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

// ---------------------------------------------------------------------------------------
// linear1 batch 1, compensated: the result is (nearly) the float64 value rounded once.
//
// Per slice (32 k) and output, take a power of two sigma >= 3 B, where B >= |every
// partial sum| (and |every product|). The running value S starts at sigma; each term does
//     s' = fma(a, b, S)    one rounding; S and s' stay within sigma +- B (+ 2^-18 sigma)
//     z  = s' - S          exact (Sterbenz: s' and S within a factor 2 of each other)
//     t  = fma(a, b, -z)   = S + a b - s', the rounding error of s' (itself rounded only
//                          below 2^-48 sigma)
//     lo += t,  S = s'
// so hi = S - sigma is exact and hi + lo is the slice sum to about 2^-45 sigma: the
// accuracy class of Dot2 (TwoProduct + TwoSum, ten operations a term) at four.
// B = L1(x row over the slice) * max|w column over the slice| (the L1 side on the
// activations, whose max is far above their mean). sigma = the power of two above
// 3.25 B, between 3.25 B and 6.5 B. Where that is not a finite normal float (huge
// operands, Inf, NaN) the lane falls back to Dot2 itself; where it is tiny, sigma is
// raised to 2^-102, which only moves more of the sum into lo.
// The four slice pairs, then the bias, are joined by TwoSum, the lo parts summed
// apart, and the result rounded once.
// ---------------------------------------------------------------------------------------

constexpr float SIGMA_RATIO = 3.25f;  // > 3 with room for the 2^-18 drift of S
constexpr int SIGMA_MIN_EXP = 25;     // 2^-102: ulp(sigma) / 2 is still normal
constexpr int SIGMA_MAX_EXP = 254;

__device__ __forceinline__ void two_sum(float a, float b, float& s, float& e) {
    s = __fadd_rn(a, b);
    const float bb = __fsub_rn(s, a);
    const float aa = __fsub_rn(s, bb);
    e = __fadd_rn(__fsub_rn(a, aa), __fsub_rn(b, bb));
}

__device__ __forceinline__ void anchored_step(float a, float b, float& hi, float& lo) {
    const float s = fmaf(a, b, hi);
    const float z = __fsub_rn(s, hi);
    lo = __fadd_rn(lo, fmaf(a, b, -z));
    hi = s;
}

__device__ __forceinline__ void dot2_step(float a, float b, float& hi, float& lo) {
    const float p = __fmul_rn(a, b);
    const float pe = fmaf(a, b, -p);
    float s, e;
    two_sum(hi, p, s, e);
    lo = __fadd_rn(lo, __fadd_rn(e, pe));
    hi = s;
}

__device__ __forceinline__ int biased_exponent(float v) {
    return int(__float_as_uint(v) >> 23);  // v >= 0: no sign bit
}

template <bool ANCHORED, u32 KS>
__device__ __forceinline__ void compensated_products(saddr x_get, saddr w_get, u32 rq,
                                                     float (&hi)[4][4], float (&lo)[4][4]) {
#pragma unroll 2
    for (u32 q = 0; q < KS / 4; ++q) {
        float4 a[4], b[4];
        operands<KS>(x_get, w_get, q, rq, a, b);
#pragma unroll
        for (u32 kk = 0; kk < 4; ++kk) {
#pragma unroll
            for (u32 i = 0; i < 4; ++i) {
                const float av = lane_of(a[i], kk);
#pragma unroll
                for (u32 j = 0; j < 4; ++j) {
                    if (ANCHORED) {
                        anchored_step(av, lane_of(b[kk], j), hi[i][j], lo[i][j]);
                    } else {
                        dot2_step(av, lane_of(b[kk], j), hi[i][j], lo[i][j]);
                    }
                }
            }
        }
    }
}

__device__ __forceinline__ void linear1_b1_compensated(const float* __restrict__ x, u64 x_len,
                                                       const float* __restrict__ w, u64 w_len,
                                                       const float* __restrict__ bias,
                                                       u64 bias_len, float* __restrict__ y,
                                                       u64 y_len, float* smem) {
    constexpr u32 K = 128;
    constexpr u32 KS = K / B1_WARPS;  // 32: one chunk per warp
    constexpr u32 REGION = (B1_ROWS + B1_COLS) * KS;
    static_assert(2 * B1_ROWS * B1_COLS <= REGION, "hi and lo partials fit the region");
    if (!b1_shape_ok<K>(x, x_len, w, w_len, bias, bias_len, y, y_len)) {
        return;
    }
    // smem: B1_WARPS * REGION floats of the caller's shared memory

    const u32 warp = threadIdx.x >> 5;
    const u32 lane = threadIdx.x & 31;
    const u32 row0 = blockIdx.x * B1_ROWS;
    const u32 col0 = blockIdx.y * B1_COLS;
    float* xs = smem + warp * REGION;
    float* ws = xs + B1_ROWS * KS;

    // Lane (rq, cq) holds x rows rq + 4 j and w columns 4 cq + {0..3} of the slice:
    // exactly the rows and columns of its own outputs, so its bounds need no exchange
    // beyond the lanes that share them.
    static_assert(KS == Chunk<K>::SK, "one chunk per slice");
    Chunk<K> stage;
    stage.fetch(x, w, row0, col0, warp * KS, lane);
    loads_issued();
    const u32 rq = lane >> 3;
    const u32 cq = lane & 7;

    float l1[4];  // SIGMA_RATIO * L1 of x rows rq + 4 i over the slice
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
        const float4 v = stage.xv[i];
        float m = (fabsf(v.x) + fabsf(v.y)) + (fabsf(v.z) + fabsf(v.w));
#pragma unroll
        for (u32 mask = 1; mask < 8; mask <<= 1) {
            m += __shfl_xor_sync(0xffffffffu, m, mask);
        }
        l1[i] = m * SIGMA_RATIO;
    }
    float4 cm = make_float4(0.f, 0.f, 0.f, 0.f);  // max |w| of columns 4 cq + {0..3}
#pragma unroll
    for (u32 j = 0; j < Chunk<K>::WN; ++j) {
        cm.x = fmaxf(cm.x, fabsf(stage.wv[j].x));
        cm.y = fmaxf(cm.y, fabsf(stage.wv[j].y));
        cm.z = fmaxf(cm.z, fabsf(stage.wv[j].z));
        cm.w = fmaxf(cm.w, fabsf(stage.wv[j].w));
    }
#pragma unroll
    for (u32 mask = 8; mask < 32; mask <<= 1) {
        cm.x = fmaxf(cm.x, __shfl_xor_sync(0xffffffffu, cm.x, mask));
        cm.y = fmaxf(cm.y, __shfl_xor_sync(0xffffffffu, cm.y, mask));
        cm.z = fmaxf(cm.z, __shfl_xor_sync(0xffffffffu, cm.z, mask));
        cm.w = fmaxf(cm.w, __shfl_xor_sync(0xffffffffu, cm.w, mask));
    }
    // biased exponent of sigma = that of the bound + 1 (the power of two above it)
    int se[4][4];
    int top = 0;
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
#pragma unroll
        for (u32 j = 0; j < 4; ++j) {
            se[i][j] = biased_exponent(l1[i] * lane_of(cm, j)) + 1;
            top = max(top, se[i][j]);
        }
    }

    stage.template stash<KS>(xs, ws, 0, lane);
    __syncwarp();
    const saddr x_get = shared_address(xs + rq * KS);
    const saddr w_get = shared_address(ws + cq * 4);

    float hi[4][4], lo[4][4];
    // (NaN / Inf bounds give exponent 256)
    if (top <= SIGMA_MAX_EXP) {
        float sigma[4][4];
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                sigma[i][j] = __int_as_float(max(se[i][j], SIGMA_MIN_EXP) << 23);
                hi[i][j] = sigma[i][j];
                lo[i][j] = 0.0f;
            }
        }
        compensated_products<true, KS>(x_get, w_get, rq, hi, lo);
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                hi[i][j] = __fsub_rn(hi[i][j], sigma[i][j]);
            }
        }
    } else {
        zero(hi);
        zero(lo);
        compensated_products<false, KS>(x_get, w_get, rq, hi, lo);
    }
    __syncwarp();
    put_block(xs, rq, cq, hi);
    put_block(xs + B1_ROWS * B1_COLS, rq, cq, lo);
    __syncthreads();

    const u32 t = threadIdx.x;
    const u32 offset = (t >> 3) * B1_COLS + (t & 7) * 4;
    const u32 row = row0 + (t >> 3);
    const u32 col = col0 + (t & 7) * 4;
    const saddr part = shared_address(smem + offset);
    float4 h[B1_WARPS], l[B1_WARPS];
#pragma unroll
    for (u32 s = 0; s < B1_WARPS; ++s) {
        h[s] = lds4(part + 4 * (s * REGION));
        l[s] = lds4(part + 4 * (s * REGION + B1_ROWS * B1_COLS));
    }
    const float4 b4 = load4(bias + col);
    float out[4];
#pragma unroll
    for (u32 e = 0; e < 4; ++e) {
        float sum = lane_of(h[0], e);
        float err = lane_of(l[0], e);
#pragma unroll
        for (u32 s = 1; s < B1_WARPS; ++s) {
            float r;
            two_sum(sum, lane_of(h[s], e), sum, r);
            err = __fadd_rn(err, __fadd_rn(r, lane_of(l[s], e)));
        }
        float r;
        two_sum(sum, lane_of(b4, e), sum, r);
        err = __fadd_rn(err, r);
        out[e] = leaky(__fadd_rn(sum, err));
    }
    if (row < ITEM_ROWS) {
        store4(y + row * N + col, make_float4(out[0], out[1], out[2], out[3]));
    }
}

// ---------------------------------------------------------------------------------------
// linear1 batch 1 in float64 accumulation (the default on the sm80 tier, where the FP64
// pipe runs at half the FP32 rate on the data-centre parts the plans target).
//
// Every product of two floats is exact in float64, so each warp's slice sum is a
// sequential float64 fma chain over its 32 k (relative error <= 32 * 2^-53 of the sum
// of |terms|); the four slices and then the bias are added in float64 in a fixed order,
// and the result is rounded to float once. That is the accuracy class of the
// compensated float32 kernel above (2^-45 sigma) with no bounds, no fallback and a
// quarter of the issue slots per term: one DFMA instead of four FP32 operations.
// Operands are converted to float64 once, when staged: a warp's region holds
// xd[16][32] and wd[32][32] doubles (12 KiB; the block uses exactly 48 KiB).
// Lane (rq, cq) owns rows rq + 4 i and columns 2 cq + {0, 1} and 16 + 2 cq + {0, 1}:
// its two w reads per k cover one 256-byte row contiguously across the warp.
// xd keeps 16-byte slot s of row r at s ^ 2 (r & 3): the four rows one operand read
// hits land on distinct bank quads.
// ---------------------------------------------------------------------------------------


__device__ __forceinline__ void stsd4(double* p, float4 v) {
    stsd2(p, double(v.x), double(v.y));
    stsd2(p + 2, double(v.z), double(v.w));
}


__device__ __forceinline__ void linear1_b1_f64(const float* __restrict__ x, u64 x_len,
                                               const float* __restrict__ w, u64 w_len,
                                               const float* __restrict__ bias, u64 bias_len,
                                               float* __restrict__ y, u64 y_len,
                                               double* dsm) {
    constexpr u32 K = 128;
    constexpr u32 KS = K / B1_WARPS;  // 32: one chunk per warp
    constexpr u32 XD = B1_ROWS * KS;  // doubles of xd
    constexpr u32 REGION = XD + KS * B1_COLS;
    static_assert(KS == Chunk<K>::SK, "one chunk per slice");
    static_assert(B1_WORK_ROWS * B1_COLS <= REGION, "the partial tile fits");
    u32 row0, col0;
    if (!b1_shape_ok<K>(x, x_len, w, w_len, bias, bias_len, y, y_len) |
        !b1_work(row0, col0)) {
        return;
    }
    // dsm: B1_WARPS * REGION doubles of the caller's shared memory

    const u32 warp = threadIdx.x >> 5;
    const u32 lane = threadIdx.x & 31;
    double* xd = dsm + warp * REGION;
    double* wd = xd + XD;

    Chunk<K> stage;
    stage.fetch(x, w, row0, col0, warp * KS, lane);
    ExtraRows<K, KS> extra;
    extra.fetch(x, row0, warp * KS, lane);
    loads_issued();
    const u32 t = threadIdx.x;
    const float4 b4 = ldg4_now(bias + col0 + (t & 7) * 4);
    {
        // lane (hi, lo) holds x rows hi + 4 j, k 4 lo + {0..3}: slots 2 lo, 2 lo + 1
        // (row & 3 = hi); and w k rows hi + 4 j, columns 4 lo + {0..3}
        const u32 hi = lane >> 3;
        const u32 lo = lane & 7;
        const u32 sw = 2 * hi;
#pragma unroll
        for (u32 j = 0; j < Chunk<K>::XN; ++j) {
            double* rowp = xd + (hi + 4 * j) * KS;
            const float4 v = stage.xv[j];
            stsd2(rowp + 2 * ((2 * lo) ^ sw), double(v.x), double(v.y));
            stsd2(rowp + 2 * ((2 * lo + 1) ^ sw), double(v.z), double(v.w));
        }
#pragma unroll
        for (u32 j = 0; j < Chunk<K>::WN; ++j) {
            stsd4(wd + (hi + 4 * j) * B1_COLS + lo * 4, stage.wv[j]);
        }
    }
    __syncwarp();

    const u32 rq = lane >> 3;
    const u32 cq = lane & 7;
    const saddr x_get = shared_address(xd + rq * KS);
    const saddr w_get = shared_address(wd + 2 * cq);
    const u32 sw = 2 * rq;  // row & 3 = rq for every row rq + 4 i
    double acc[4][4];
    zero(acc);
#pragma unroll
    for (u32 q = 0; q < KS / 4; ++q) {
        dpair a[4][2], b[4][2];
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
            a[i][0] = ldsd2(x_get + 8 * (4 * i * KS + 2 * ((2 * q) ^ sw)));
            a[i][1] = ldsd2(x_get + 8 * (4 * i * KS + 2 * ((2 * q + 1) ^ sw)));
        }
#pragma unroll
        for (u32 kk = 0; kk < 4; ++kk) {
            b[kk][0] = ldsd2(w_get + 8 * ((4 * q + kk) * B1_COLS));
            b[kk][1] = ldsd2(w_get + 8 * ((4 * q + kk) * B1_COLS + 16));
        }
#pragma unroll
        for (u32 kk = 0; kk < 4; ++kk) {
#pragma unroll
            for (u32 i = 0; i < 4; ++i) {
                const dpair ap = a[i][kk >> 1];
                const double av = (kk & 1) ? ap.y : ap.x;
                acc[i][0] = dfma(av, b[kk][0].x, acc[i][0]);
                acc[i][1] = dfma(av, b[kk][0].y, acc[i][1]);
                acc[i][2] = dfma(av, b[kk][1].x, acc[i][2]);
                acc[i][3] = dfma(av, b[kk][1].y, acc[i][3]);
            }
        }
    }
    double extra_acc[2] = {0.0, 0.0};
    extra.products(shared_address(wd), lane, extra_acc);
    // the warp's operands are dead: its region takes its partial tile part[18][32]
    __syncwarp();
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
        double* rowp = xd + (rq + 4 * i) * B1_COLS;
        stsd2(rowp + 2 * cq, acc[i][0], acc[i][1]);
        stsd2(rowp + 16 + 2 * cq, acc[i][2], acc[i][3]);
    }
    stsd2(xd + (B1_ROWS + (lane >> 4)) * B1_COLS + extra.col(lane), extra_acc[0],
          extra_acc[1]);
    __syncthreads();

    // thread t: tile row t / 8, columns 4 (t % 8) + {0..3}; threads below 16 also
    // row 16 + t / 8
    auto finish = [&](u32 tile_row) {
        const u32 offset = tile_row * B1_COLS + (t & 7) * 4;
        const saddr part = shared_address(dsm + offset);
        dpair h[B1_WARPS][2];
#pragma unroll
        for (u32 s = 0; s < B1_WARPS; ++s) {
            h[s][0] = ldsd2(part + 8 * (s * REGION));
            h[s][1] = ldsd2(part + 8 * (s * REGION + 2));
        }
        double sum[4] = {h[0][0].x, h[0][0].y, h[0][1].x, h[0][1].y};
#pragma unroll
        for (u32 s = 1; s < B1_WARPS; ++s) {
            sum[0] += h[s][0].x;
            sum[1] += h[s][0].y;
            sum[2] += h[s][1].x;
            sum[3] += h[s][1].y;
        }
        const u32 row = row0 + tile_row;
        if (row < ITEM_ROWS) {
            const float4 out = make_float4(
                float(sum[0] + double(b4.x)), float(sum[1] + double(b4.y)),
                float(sum[2] + double(b4.z)), float(sum[3] + double(b4.w)));
            stg4(y + row * N + col0 + (t & 7) * 4,
                 make_float4(leaky(out.x), leaky(out.y), leaky(out.z), leaky(out.w)));
        }
    };
    finish(t >> 3);
    if (t < B1_EXTRA * 8) {
        finish(B1_ROWS + (t >> 3));
    }
}

// linear1 batch 1: float64 accumulation where FP64 runs at half the FP32 rate, else the
// compensated FP32 kernel (FP64 at 1/64 would make the consumer parts several times
// slower). Both bodies share one static region, sized for the float64 one (48 KiB).
__device__ __forceinline__ void linear1_b1(const float* __restrict__ x, u64 x_len,
                                           const float* __restrict__ w, u64 w_len,
                                           const float* __restrict__ bias, u64 bias_len,
                                           float* __restrict__ y, u64 y_len) {
    constexpr u32 KS = 128 / B1_WARPS;
    __shared__ __align__(16) double storage[B1_WARPS * (B1_ROWS * KS + KS * B1_COLS)];
    if (fp64_fast()) {
        linear1_b1_f64(x, x_len, w, w_len, bias, bias_len, y, y_len, storage);
    } else {
        linear1_b1_compensated(x, x_len, w, w_len, bias, bias_len, y, y_len,
                               reinterpret_cast<float*>(storage));
    }
}

}  // namespace lin
}  // namespace spk

// Entries: every one checks its lengths, alignment and launch shape before writing.
#define SPK_LINEAR_ENTRY(NAME, BODY, MIN_BLOCKS)                                          \
    SPK_DENSE_KERNEL(NAME, spk::lin::THREADS, MIN_BLOCKS,                                  \
                     BODY(x, x_len, w, w_len, bias, bias_len, y, y_len))

// batch 1: at most two blocks per SM ever, registers are free
SPK_LINEAR_ENTRY(spk_segdense_linear0_b1, spk::lin::gemm_b1<256>, 1)
SPK_LINEAR_ENTRY(spk_segdense_linear1_b1, spk::lin::linear1_b1, 1)
// TF32 math keeps FP32 products here: a tensor-core form (16 x 32 tiles, k split four
// ways in the block, three stages) took 3.03 us in TF32 and 3.36 us with split weights
// against 2.57 us for this body (H200, main kernel, CUDA graphs of 20 launches)
SPK_LINEAR_ENTRY(spk_segdense_linear1_b1_tf32, spk::lin::gemm_b1<128>, 1)
// batch 32: up to three of the 295 blocks resident per SM, so ptxas may give each thread
// three blocks' share of the registers
SPK_LINEAR_ENTRY(spk_segdense_linear0_b32, spk::lin::gemm_b32<256>, 3)
SPK_LINEAR_ENTRY(spk_segdense_linear1_b32, spk::lin::gemm_b32<128>, 3)

#undef SPK_LINEAR_ENTRY
