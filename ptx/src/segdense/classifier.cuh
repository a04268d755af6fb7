// classifier kernels of the segdense module (included by segdense.cu)
//
// Segmentation linear2: y = log_softmax(x @ w + bias) per row over the 7 classes,
// log_softmax(v) = v - max - ln(sum(exp(v - max))). x [m, 128], w [128, 7] and bias [7]
// as the caller holds them (no packing), y [m, 7], m = batch * ITEM_ROWS. Grid
// (ceil(m / ROWS), 1, 1): block b owns rows [ROWS b, ROWS b + ROWS); rows >= m of the
// last block are neither read nor written. FP32 SIMT, no atomics, fixed orders.
//
// Lanes: a row is shared by LANES consecutive lanes; lane j of the row takes the float4
// columns j, j + LANES, j + 2 LANES, ... of x (a warp's load touches whole 32-byte
// sectors), so its k-slice is the groups g = j + LANES i of four consecutive k, and the
// w rows of one group are 28 consecutive floats (seven aligned float4). The bias is
// added to the finished dot product; the log-softmax uses the IEEE expf/logf.
//
// Batch 1 (8 rows x 8 lanes, 64 threads): latency bound. Each lane loads its 16 x and
// the 112 w values of its slice straight into registers, all loads in flight at once.
// Order: lane j accumulates, by sequential fma from zero, its k ascending; an xor
// butterfly (4, 2, 1) adds the eight slice sums, so every lane of the row holds the
// same logits and evaluates the log-softmax; lane c stores class c.
//
// Batch 32 (144 rows, 256 threads; lane j of a row group takes rows r, r + 64 and, in
// warps 0 and 1, r + 128, 4 lanes per row): compensated, issue bound, two paths chosen
// by fp64_fast() (uniform).
// FP64 path (GA100/GH100-class parts, where a DFMA costs the FP64 pipe 2 cycles per
// warp, the same as two FP32 operations, and the 4-operation FP32 scheme below costs 4):
// every product is formed exactly and summed in FP64. x enters as x * 2^-896 built from
// its bits by three integer operations (exact for every finite x, zero and subnormals
// included; an F2F would share the FP64 pipe at a quarter rate), w as w * 2^896 (exact,
// finite for every finite float), staged in shared memory by threads 0..223 while x is
// in flight; the DFMA of the two is x w + acc rounded once in FP64. Error: the 32-term
// lane sums and the two cross-lane adds are within ~34 * 2^-53 * sum |x_k w_k| (no
// overflow or underflow below FLT range: the scaled operands stay normal or exact
// subnormals), and logit = RN_float(RN_double(dot + bias)), so |logit error| <=
// u |z| + ~2^-47 sum |terms|: one rounding where the FP32 scheme had two.
// Order (bit-exact emulation): per lane, acc[c] by sequential DFMA from zero over i
// ascending, component e ascending; reduce-scatter as in the FP32 path below (lane (h,
// l) ends with classes 4 h + 2 l, 4 h + 2 l + 1), each add in FP64.
// FP32 path (Turing tier and the parts with slow FP64): each row gets an offset
// o = 1.5 * 2^E,
// 2^E the smallest power of two >= 2 B, B = sum_k |x_k| * max|w| (E clamped to
// [-100, 125]), so the running sum t = o + partial stays in the binade [2^E, 2^(E+1))
// and each product is one step
//     t' = fma(x, w, t)          x w + t rounded onto t's fixed grid
//     q  = t' - t                exact (Sterbenz: t', t within a factor 2)
//     r += fma(x, w, -q)         the rounding error x w + t - t', rounded once
// Only the error terms round: the dot is (t - o) + r within u |dot| + ~(128 u)^2 B, the
// Dot2 bound with sum |x_k| max|w| in place of sum |x_k w_k| (about twice it for
// realistic operands; a class column much smaller than max|w| gets a looser bound).
// Dot2's TwoSum form costs 10 FP32 operations per product, this one 4.
// Order (for a bit-exact emulation): sum |x| per lane as four component chains over
// its float4 (i ascending), added (c0 + c1) + (c2 + c3), then the xor-1 and xor-2
// partners' sums added; t, r per lane over i ascending, component e ascending. The four
// lanes share o, so their t - o (multiples of one grid, below 2^E) add exactly. A
// reduce-scatter leaves lane (h, l) = (j >> 1, j & 1) classes 4 h + 2 l and 4 h + 2 l +
// 1 (class 7 is padding, -inf): each sum adds the xor-2 partner's value to its own,
// then the xor-1 partner's; dot = s + r, logit = dot + bias. Max and the sum of the
// lane's two exps are xor butterflies (1, 2), so the four lanes agree bit for bit.
// Warp 0 copies w into shared memory unchanged (and finds max|w|) while x is in
// flight; a thread's two rows share each w read.

#pragma once

#include "common.cuh"
#include "model.cuh"

namespace spk {
namespace cls {

constexpr u32 K = 128;
constexpr u32 N = 7;
constexpr u32 F4 = K / 4;  // float4 per x row

__device__ __forceinline__ float lane4(float4 v, u32 e) {
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

__device__ __forceinline__ bool buffers_ok(const float* x, u64 x_len, const float* w,
                                           u64 w_len, u64 bias_len, u64 y_len, u32 m) {
    return x_len == u64(m) * K & w_len == K * N & bias_len == N & y_len == u64(m) * N &
           aligned16(x) & aligned16(w);
}

// Log-softmax of one row's logits z[0..6], held by every lane of the row.
__device__ __forceinline__ void log_softmax7(const float (&z)[N], float (&out)[N]) {
    float top = z[0];
#pragma unroll
    for (u32 c = 1; c < N; ++c) {
        top = fmaxf(top, z[c]);
    }
    float sum = 0.0f;
#pragma unroll
    for (u32 c = 0; c < N; ++c) {
        sum += expf(z[c] - top);
    }
    const float lse = logf(sum);
#pragma unroll
    for (u32 c = 0; c < N; ++c) {
        out[c] = (z[c] - top) - lse;
    }
}

// 1.5 * 2^E for the smallest 2^E >= bound, E clamped to [-100, 125] (zero, inf and NaN
// land on a clamp): the compensated sum's running offset, always finite and normal.
__device__ __forceinline__ float offset_for(float bound) {
    constexpr u32 LO = (127u - 100u) << 23;
    constexpr u32 HI = (127u + 125u) << 23;
    u32 p = (__float_as_uint(bound) + 0x007fffffu) & 0xff800000u;
    p = min(max(p, LO), HI);
    return __uint_as_float(p | 0x00400000u);
}

// One compensated product on the offset accumulator t (see the header).
__device__ __forceinline__ void step(float& t, float& r, float x, float w) {
    const float next = fmaf(x, w, t);
    const float q = __fsub_rn(next, t);
    r = __fadd_rn(r, fmaf(x, w, -q));
    t = next;
}

// Batch 32 shapes.
constexpr u32 B32_M = 32 * ITEM_ROWS;
constexpr u32 B32_ROWS = 128;
constexpr u32 B32_THREADS = 256;
constexpr u32 B32_BLOCKS = (B32_M + B32_ROWS - 1) / B32_ROWS;  // launched: 148
constexpr u32 B32_WORK_ROWS = 144;  // rows of a working block: 131 of them cover m
static_assert((B32_M + B32_WORK_ROWS - 1) / B32_WORK_ROWS <= B32_BLOCKS, "working blocks");
constexpr u32 B32_LANES = 4;
constexpr u32 B32_STEPS = F4 / B32_LANES;  // float4 per lane per row

// The ends of a thread's R rows, each on its four lanes: lane (h, l) holds the logits of
// classes 4 h + 2 l and 4 h + 2 l + 1 (class 7 is padding, -inf); max and the sum of the
// lane's two exps are xor butterflies (1, 2), so the four lanes agree bit for bit. The
// rows advance step by step together, so their shuffle and exp/log latencies overlap;
// each row's operations and their order are those of a row alone.
template <u32 R>
__device__ __forceinline__ void b32_store(float (&z)[R][2], u32 sub, const u32 (&rows)[3],
                                          float* __restrict__ y) {
    const u32 c0 = sub * 2;  // = 4 h + 2 l
    const bool pad = c0 + 1 == N;
    float top[R], sum[R];
#pragma unroll
    for (u32 q = 0; q < R; ++q) {
        if (pad) {
            z[q][1] = -INFINITY;
        }
        top[q] = fmaxf(z[q][0], z[q][1]);
    }
    // v[q] = op(v[q], the partner's v[q]) over the butterfly (1, 2) of each row's lanes
    auto butterfly = [](float (&v)[R], auto op) {
#pragma unroll
        for (u32 lanes = 1; lanes < B32_LANES; lanes <<= 1) {
#pragma unroll
            for (u32 q = 0; q < R; ++q) {
                v[q] = op(v[q], __shfl_xor_sync(0xffffffffu, v[q], lanes));
            }
        }
    };
    butterfly(top, [](float a, float b) { return fmaxf(a, b); });
#pragma unroll
    for (u32 q = 0; q < R; ++q) {
        sum[q] = __fadd_rn(expf(z[q][0] - top[q]), expf(z[q][1] - top[q]));
    }
    butterfly(sum, [](float a, float b) { return __fadd_rn(a, b); });
#pragma unroll
    for (u32 q = 0; q < R; ++q) {
        const float lse = logf(sum[q]);
        if (rows[q] < B32_M) {
            float* y_row = y + u64(rows[q]) * N;
            y_row[c0] = (z[q][0] - top[q]) - lse;
            if (!pad) {
                y_row[c0 + 1] = (z[q][1] - top[q]) - lse;
            }
        }
    }
}

// x * 2^-896 as a double, exactly, for every finite x (zero and subnormals included):
// the float's sign, exponent and fraction moved into the double's fields unbiased
// (float exponent field e becomes double exponent field e; a subnormal float lands on
// the double subnormal of the same scaled value). Three ALU operations instead of an
// F2F, which shares the FP64 pipe at a quarter of the DFMA rate.
__device__ __forceinline__ double scaled_f64(float f) {
    const u32 b = __float_as_uint(f);
    const u32 hi = u32(int(b) >> 3) & 0x8fffffffu;
    return __hiloint2double(int(hi), int(b << 29));
}

__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// The reduce-scatter of each of R rows over its four lanes: lane (h, l) = (sub >> 1,
// sub & 1) ends with the row sums of slots 4 h + 2 l and 4 h + 2 l + 1 of v[q] (slot 7
// zero). Each sum adds the xor-2 partner's value to the own, then the xor-1 partner's.
template <class T, u32 R>
__device__ __forceinline__ void reduce_scatter(const T (&v)[R][8], u32 sub, T (&out)[R][2]) {
    const bool h = (sub & 2) != 0;
    const bool l = (sub & 1) != 0;
    T v4[R][4];
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
#pragma unroll
        for (u32 q = 0; q < R; ++q) {
            const T got = __shfl_xor_sync(0xffffffffu, h ? v[q][i] : v[q][i + 4], 2);
            v4[q][i] = add_rn(h ? v[q][i + 4] : v[q][i], got);
        }
    }
#pragma unroll
    for (u32 i = 0; i < 2; ++i) {
#pragma unroll
        for (u32 q = 0; q < R; ++q) {
            const T got = __shfl_xor_sync(0xffffffffu, l ? v4[q][i] : v4[q][i + 2], 1);
            out[q][i] = add_rn(l ? v4[q][i + 2] : v4[q][i], got);
        }
    }
}

// Finishes R rows of the FP64 path on their four lanes: the slice sums are
// reduce-scattered, then logit = RN_float(dot + bias) with the sum in FP64.
template <u32 R>
__device__ __forceinline__ void b32_finish64(const double (&s)[R][8], u32 sub, float bias0,
                                             float bias1, const u32 (&rows)[3],
                                             float* __restrict__ y) {
    double dot[R][2];
    reduce_scatter(s, sub, dot);
    float z[R][2];
#pragma unroll
    for (u32 q = 0; q < R; ++q) {
#pragma unroll
        for (u32 i = 0; i < 2; ++i) {
            z[q][i] = __double2float_rn(__dadd_rn(dot[q][i], double(i == 0 ? bias0 : bias1)));
        }
    }
    b32_store(z, sub, rows, y);
}

// Finishes R rows on their four lanes: (s, r) per class (s exact multiples of the row's
// grid) are reduce-scattered, then logits, log-softmax and the stores.
template <u32 R>
__device__ __forceinline__ void b32_finish(const float (&s)[R][8], const float (&r)[R][8],
                                           u32 sub, float bias0, float bias1,
                                           const u32 (&rows)[3], float* __restrict__ y) {
    float sum_s[R][2], sum_r[R][2];
    reduce_scatter(s, sub, sum_s);
    reduce_scatter(r, sub, sum_r);
    float z[R][2];
#pragma unroll
    for (u32 q = 0; q < R; ++q) {
#pragma unroll
        for (u32 i = 0; i < 2; ++i) {
            z[q][i] = __fadd_rn(__fadd_rn(sum_s[q][i], sum_r[q][i]), i == 0 ? bias0 : bias1);
        }
    }
    b32_store(z, sub, rows, y);
}

}  // namespace cls
}  // namespace spk

// Batch 1: m = 589, grid 74 x 64 threads, 8 rows per block, 8 lanes per row.
extern "C" __global__ void __launch_bounds__(64)
spk_segdense_classifier_b1(const float* __restrict__ x, u64 x_len, const float* __restrict__ w,
                           u64 w_len, const float* __restrict__ bias, u64 bias_len,
                           float* __restrict__ y, u64 y_len) {
    using namespace spk;
    using namespace spk::cls;
    constexpr u32 M = ITEM_ROWS;
    constexpr u32 ROWS = 8;
    constexpr u32 LANES = 8;
    constexpr u32 STEPS = F4 / LANES;  // float4 per lane
    if (!buffers_ok(x, x_len, w, w_len, bias_len, y_len, M) |
        !launch_is((M + ROWS - 1) / ROWS, 1, 1, ROWS * LANES)) {
        return;
    }
    const u32 j = threadIdx.x % LANES;
    const u32 row = blockIdx.x * ROWS + threadIdx.x / LANES;
    const bool valid = row < M;

    float4 xv[STEPS];
    float4 wv[STEPS][N];  // group g: w[4 g .. 4 g + 3][0 .. 6] as seven float4
    float b[N];
#pragma unroll
    for (u32 i = 0; i < STEPS; ++i) {
        const u32 g = j + LANES * i;
        xv[i] = valid ? load4(x + row * K + 4 * g) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (u32 v = 0; v < N; ++v) {
            wv[i][v] = load4(w + g * 4 * N + 4 * v);
        }
    }
#pragma unroll
    for (u32 c = 0; c < N; ++c) {
        b[c] = __ldg(bias + c);
    }
    loads_issued();

    float acc[N];
#pragma unroll
    for (u32 c = 0; c < N; ++c) {
        acc[c] = 0.0f;
    }
#pragma unroll
    for (u32 i = 0; i < STEPS; ++i) {
        const float wf[4 * N] = {
            wv[i][0].x, wv[i][0].y, wv[i][0].z, wv[i][0].w, wv[i][1].x, wv[i][1].y,
            wv[i][1].z, wv[i][1].w, wv[i][2].x, wv[i][2].y, wv[i][2].z, wv[i][2].w,
            wv[i][3].x, wv[i][3].y, wv[i][3].z, wv[i][3].w, wv[i][4].x, wv[i][4].y,
            wv[i][4].z, wv[i][4].w, wv[i][5].x, wv[i][5].y, wv[i][5].z, wv[i][5].w,
            wv[i][6].x, wv[i][6].y, wv[i][6].z, wv[i][6].w};
#pragma unroll
        for (u32 e = 0; e < 4; ++e) {
            const float xe = lane4(xv[i], e);
#pragma unroll
            for (u32 c = 0; c < N; ++c) {
                acc[c] = fmaf(xe, wf[e * N + c], acc[c]);
            }
        }
    }
    float z[N];
#pragma unroll
    for (u32 c = 0; c < N; ++c) {
        float s = acc[c];
#pragma unroll
        for (u32 lanes = LANES / 2; lanes > 0; lanes >>= 1) {
            s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, lanes));
        }
        z[c] = __fadd_rn(s, b[c]);
    }
    float out[N];
    log_softmax7(z, out);
    if (valid) {
#pragma unroll
        for (u32 c = 0; c < N; ++c) {
            if (j == c) {
                y[row * N + c] = out[c];
            }
        }
    }
}

namespace spk {
namespace cls {

// The products and the end of R rows of one thread (rows[q], valid[q]; R = 2 or 3).
// FP64 path: every product exact, summed in FP64 (see the header).
template <u32 R>
__device__ __forceinline__ void b32_rows_f64(const float4 (&xr)[3][B32_STEPS],
                                             const double* wsd, u32 sub, float bias0,
                                             float bias1, const u32 (&rows)[3],
                                             float* __restrict__ y) {
    double a[R][8];
#pragma unroll
    for (u32 q = 0; q < R; ++q) {
#pragma unroll
        for (u32 c = 0; c < 8; ++c) {
            a[q][c] = 0.0;
        }
    }
#pragma unroll
    for (u32 i = 0; i < B32_STEPS; ++i) {
        const double* wg = wsd + (sub + B32_LANES * i) * 4 * N;
        double wf[4 * N];
#pragma unroll
        for (u32 v = 0; v < 2 * N; ++v) {
            const dpair pair = ldsd2(shared_address(wg + 2 * v));
            wf[2 * v] = pair.x;
            wf[2 * v + 1] = pair.y;
        }
#pragma unroll
        for (u32 e = 0; e < 4; ++e) {
#pragma unroll
            for (u32 q = 0; q < R; ++q) {
                const double xq = scaled_f64(lane4(xr[q][i], e));
#pragma unroll
                for (u32 c = 0; c < N; ++c) {
                    a[q][c] = fma(xq, wf[e * N + c], a[q][c]);
                }
            }
        }
    }
    b32_finish64(a, sub, bias0, bias1, rows, y);
}

// FP32 path: the offset-compensated sum (see the header).
template <u32 R>
__device__ __forceinline__ void b32_rows_f32(const float4 (&xr)[3][B32_STEPS],
                                             const float* ws, float wmax, u32 sub,
                                             float bias0, float bias1, const u32 (&rows)[3],
                                             float* __restrict__ y) {
    // row offsets from sum |x| (fixed order, xor butterfly: the four lanes agree)
    float o[R];
#pragma unroll
    for (u32 q = 0; q < R; ++q) {
        float a[4];
#pragma unroll
        for (u32 e = 0; e < 4; ++e) {
            a[e] = fabsf(lane4(xr[q][0], e));
        }
#pragma unroll
        for (u32 i = 1; i < B32_STEPS; ++i) {
#pragma unroll
            for (u32 e = 0; e < 4; ++e) {
                a[e] = __fadd_rn(a[e], fabsf(lane4(xr[q][i], e)));
            }
        }
        float sx = __fadd_rn(__fadd_rn(a[0], a[1]), __fadd_rn(a[2], a[3]));
#pragma unroll
        for (u32 lanes = 1; lanes < B32_LANES; lanes <<= 1) {
            sx = __fadd_rn(sx, __shfl_xor_sync(0xffffffffu, sx, lanes));
        }
        o[q] = offset_for(__fmul_rn(sx, __fmul_rn(2.0f, wmax)));
    }

    float t[R][N], r[R][N];
#pragma unroll
    for (u32 q = 0; q < R; ++q) {
#pragma unroll
        for (u32 c = 0; c < N; ++c) {
            t[q][c] = o[q];
            r[q][c] = 0.0f;
        }
    }
#pragma unroll
    for (u32 i = 0; i < B32_STEPS; ++i) {
        const float* wg = ws + (sub + B32_LANES * i) * 4 * N;
        float4 wv[N];
#pragma unroll
        for (u32 v = 0; v < N; ++v) {
            wv[v] = lds4(wg + 4 * v);
        }
        const float wf[4 * N] = {
            wv[0].x, wv[0].y, wv[0].z, wv[0].w, wv[1].x, wv[1].y, wv[1].z, wv[1].w,
            wv[2].x, wv[2].y, wv[2].z, wv[2].w, wv[3].x, wv[3].y, wv[3].z, wv[3].w,
            wv[4].x, wv[4].y, wv[4].z, wv[4].w, wv[5].x, wv[5].y, wv[5].z, wv[5].w,
            wv[6].x, wv[6].y, wv[6].z, wv[6].w};
#pragma unroll
        for (u32 e = 0; e < 4; ++e) {
#pragma unroll
            for (u32 q = 0; q < R; ++q) {
                const float xq = lane4(xr[q][i], e);
#pragma unroll
                for (u32 c = 0; c < N; ++c) {
                    step(t[q][c], r[q][c], xq, wf[e * N + c]);
                }
            }
        }
    }
    float sum[R][8], err[R][8];
#pragma unroll
    for (u32 q = 0; q < R; ++q) {
#pragma unroll
        for (u32 c = 0; c < N; ++c) {
            sum[q][c] = __fsub_rn(t[q][c], o[q]);  // exact: t within a factor 2 of o
            err[q][c] = r[q][c];
        }
        sum[q][N] = 0.0f;
        err[q][N] = 0.0f;
    }
    b32_finish(sum, err, sub, bias0, bias1, rows, y);
}

}  // namespace cls
}  // namespace spk

// Batch 32: m = 18848, grid 148 x 256 threads (the Config table's 128-row blocks),
// compensated. Block b < 131 owns rows [144 b, 144 b + 144); blocks 131.. return at
// once. A row group r (0..63, four lanes) takes rows r and r + 64, and in warps 0 and 1
// (r < 16) also row r + 128. With 128 rows per block the 16 SMs that held two of the
// 148 blocks set the kernel's time; 144 rows put one working block on each SM, with the
// same bits. That block may take all the registers (at two blocks per SM, 128 each, the
// three-row warps spill).
extern "C" __global__ void __launch_bounds__(256, 1)
spk_segdense_classifier_b32(const float* __restrict__ x, u64 x_len,
                            const float* __restrict__ w, u64 w_len,
                            const float* __restrict__ bias, u64 bias_len,
                            float* __restrict__ y, u64 y_len) {
    using namespace spk;
    using namespace spk::cls;
    constexpr u32 M = B32_M;
    constexpr u32 LANES = B32_LANES;
    constexpr u32 STEPS = B32_STEPS;
    if (!buffers_ok(x, x_len, w, w_len, bias_len, y_len, M) |
        !launch_is(B32_BLOCKS, 1, 1, B32_THREADS)) {
        return;
    }
    const u32 block_row = blockIdx.x * B32_WORK_ROWS;
    if (block_row >= M) {
        return;  // block-uniform, before the barrier
    }
    // w copied as it is: group g (k = 4 g .. 4 g + 3) is the 28 floats at 28 g, seven
    // float4; the four lanes of a row (g = j + 4 i) read disjoint bank quadruples
    // FP64 path: w * 2^896 as doubles, same layout (group g: the 28 doubles at 28 g, 14
    // double pairs). FP32 path: w as floats in the same storage.
    __shared__ __align__(16) double wsd[K * N];
    __shared__ float w_max;
    float* const ws = reinterpret_cast<float*>(wsd);

    const u32 t = threadIdx.x;
    const u32 lane = t % 32;
    const u32 warp = t / 32;
    const u32 sub = lane % LANES;
    const u32 row = block_row + warp * 8 + lane / LANES;
    const u32 rows[3] = {row, row + 64, row + 128};
    const bool three = warp < 2;  // warp-uniform

    // FP64 path: this thread's float4 of w is requested before x, so that it arrives,
    // is staged and passes the barrier while x is still in flight
    const bool fast = fp64_fast();
    float4 w_part = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (fast && t < K * N / 4) {
        w_part = load4(w + 4 * t);
    }
    // every x load is issued before the barrier; a row >= m reads row m - 1 instead
    // (unpredicated loads at fixed offsets) and is computed but never stored
    float4 xr[3][STEPS];
#pragma unroll
    for (u32 q = 0; q < 3; ++q) {
        if (q < 2 || three) {
            const float* xp = x + u64(min(rows[q], M - 1)) * K + 4 * sub;
#pragma unroll
            for (u32 i = 0; i < STEPS; ++i) {
                xr[q][i] = load4(xp + 4 * LANES * i);
            }
        }
    }
    const u32 c0 = sub * 2;
    const float bias0 = __ldg(bias + c0);
    const float bias1 = c0 + 1 < N ? __ldg(bias + c0 + 1) : 0.0f;

    if (fast) {
        // w * 2^896 (exact and finite for every finite w): a product with x * 2^-896 is
        // x w exactly. Threads 0 .. 223 stage one float4 each.
        if (t < K * N / 4) {
            const float4 v = w_part;
            constexpr double UP = 0x1p896;
            *reinterpret_cast<double2*>(wsd + 4 * t) =
                make_double2(double(v.x) * UP, double(v.y) * UP);
            *reinterpret_cast<double2*>(wsd + 4 * t + 2) =
                make_double2(double(v.z) * UP, double(v.w) * UP);
        }
        __syncthreads();
        loads_issued();
        if (three) {
            b32_rows_f64<3>(xr, wsd, sub, bias0, bias1, rows, y);
        } else {
            b32_rows_f64<2>(xr, wsd, sub, bias0, bias1, rows, y);
        }
        return;
    }

    // warp 0 stages w (lane g: group g, seven float4) and its largest magnitude while
    // x is in flight
    if (warp == 0) {
        float4 wg[N];
#pragma unroll
        for (u32 v = 0; v < N; ++v) {
            wg[v] = load4(w + lane * 4 * N + 4 * v);
        }
        float wm = 0.0f;
#pragma unroll
        for (u32 v = 0; v < N; ++v) {
            store4(ws + lane * 4 * N + 4 * v, wg[v]);
            wm = fmaxf(fmaxf(wm, fmaxf(fabsf(wg[v].x), fabsf(wg[v].y))),
                       fmaxf(fabsf(wg[v].z), fabsf(wg[v].w)));
        }
#pragma unroll
        for (u32 lanes = 16; lanes > 0; lanes >>= 1) {
            wm = fmaxf(wm, __shfl_xor_sync(0xffffffffu, wm, lanes));
        }
        if (lane == 0) {
            w_max = wm;
        }
    }
    __syncthreads();
    const float wmax = w_max;
    loads_issued();
    if (three) {
        b32_rows_f32<3>(xr, ws, wmax, sub, bias0, bias1, rows, y);
    } else {
        b32_rows_f32<2>(xr, ws, wmax, sub, bias0, bias1, rows, y);
    }
}
