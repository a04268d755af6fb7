// Tensor-core convolutions of the segdense module (included by segdense.cu): the
// batch-32 entries conv{1,2}_b32_{tc,x3} (their weights packed by spk_segdense_pack_gather).
// sm80 tier only; the sm75 tier exports the same names as trapping stubs.
//
// Implicit GEMM: y[b][o][p] = sum_k A[o][k] B[k][p] over the input channels ci and taps,
// A the weight (60 output channels padded to 64, CIN input channels padded to CIN_PAD),
// B = x[b][ci][p + tap], with FP32 accumulation on mma.sync: the output channels are the
// fragment rows (four 16-channel tiles), positions the columns. x3 multiplies in 3xTF32
// (m16n8k8, k = ci * 5 + tap), tc in scaled FP16 (m16n8k16, tap-major: below).
//
// Grid (ceil(P / 128), 32) as the Config table gives it: block (x, y) owns positions
// [128 x, 128 x + 128) of item y and all 64 channels. Its warps split that tile WARPS_M
// ways over the channel tiles and WARPS_N ways over the positions (tc: four warps of
// 64 channels x 32 positions).
//
// x3 staging: a stage is 8 input channels (40 k, five k-steps of 8), three stages deep
// in a cp.async ring with one commit group per stage, empty or not, so that waiting for
// all but the newest group always means "the stage about to be read has landed".
//   x: 8 rows of 136 floats at a pitch of 144. L = 1 (mod 4) and CIN L = 0 (mod 4), so
//      the row of channel ci starts ci mod 4 floats past a 16-byte boundary in every
//      item and block; row r of a stage is copied from that boundary in 16-byte pieces
//      and read at column p + tap + r % 4. The pitch (16 mod 32 banks) keeps the two
//      channels a k-quad spans in disjoint banks: B reads are conflict-free.
//   w: the packed fragments of the stage's 5 k-steps, 2560 floats per TF32 plane.
// Pieces wholly past the input's end, and channels past CIN, are zero-filled; a window
// that runs past its row's end reads the next row, which reaches only positions >= P,
// never stored.
//
// Epilogue: the accumulators go to shared memory as [64][136] (pitch 8 mod 32 banks:
// each half-warp's float2 stores hit 32 distinct banks) and leave in rows, consecutive
// threads storing consecutive positions.
//
// x3 numerics: a = a_hi + a_lo + e_a with a_hi = tf32(a), a_lo = tf32(a - a_hi),
// |e_a| <= 2^-22 |a|, likewise b. Per k-step of 8 terms, a fresh FP32 fragment P takes
// a_lo b_hi, then a_hi b_lo, then a_hi b_hi (small terms first, from zero, so the tensor
// core's truncating alignment does not bias the running sum), and the running
// accumulator adds P with one rounded FP32 addition. Dropping a_lo b_lo and the
// residuals e costs at most 3 * 2^-22 |a b| per term; each of the three mma truncates at
// most 2^-23 per addend of its chain (|P| <= (1 + 2^-10) sum|a b| over its 8 terms); the
// k / 8 accumulator additions round once each. Hence for every output
//     |y - exact| <= (12 + 2 * 9 * 2 + k / 8 + 1) u sum_k |a_k b_k|,   u = 2^-24,
// which the GPU tests check (FP32 SIMT summation of k terms: (k + 2) u).

#pragma once

#include "common.cuh"
#include "sm80.cuh"

namespace spk {
namespace tconv {

constexpr u32 OUT = 60;          // output channels
constexpr u32 PADDED = 64;       // channels of the packed weight: four 16-row tiles
constexpr u32 TAPS = 5;
constexpr u32 POS = 128;         // positions per block
constexpr u32 STAGE_CI = 8;      // input channels per stage
constexpr u32 KSTEPS = STAGE_CI * TAPS / 8;      // k-steps of 8 per stage
constexpr u32 STEP_FLOATS = 4 * 32 * 4;          // one k-step: 4 tiles x 32 lanes x 4
constexpr u32 W_STAGE = KSTEPS * STEP_FLOATS;    // 2560 floats per plane and stage
constexpr u32 X_PITCH = POS + 16;
constexpr u32 X_VECS = 34;                       // 16-byte pieces per staged row
constexpr u32 X_STAGE = STAGE_CI * X_PITCH;
constexpr u32 OUT_PITCH = POS + 8;
constexpr u32 RING = 3;

// The Config table's dynamic shared bytes for `planes` TF32 planes (Config.tensor_conv):
// three stages of this layout, or the output tile if larger. The tc kernel's FP16 layout
// fits in the figure of one plane.
constexpr u32 config_shared_bytes(u32 planes) {
    return 4 * (RING * (X_STAGE + planes * W_STAGE) > PADDED * OUT_PITCH
                    ? RING * (X_STAGE + planes * W_STAGE)
                    : PADDED * OUT_PITCH);
}

static_assert(X_VECS * 4 >= POS + TAPS - 1 + 3, "a row covers its shift and the halo");
static_assert(X_VECS * 4 <= X_PITCH, "a row fits its pitch");

// The 3xTF32 kernel: value and residual planes of the weight
template <u32 CIN_, u32 CIN_PAD_, u32 L_, u32 THREADS_, u32 WARPS_M_>
struct Shape {
    static constexpr u32 CIN = CIN_, CIN_PAD = CIN_PAD_, L = L_, THREADS = THREADS_,
                         WARPS_M = WARPS_M_;
    static constexpr u32 PLANES = 2;
    static constexpr u32 BATCH = 32;
    static constexpr u32 P = L - 4;
    static constexpr u32 BLOCKS = (P + POS - 1) / POS;
    static constexpr u32 WARPS = THREADS / 32;
    static constexpr u32 WARPS_N = WARPS / WARPS_M;
    static constexpr u32 M_TILES = 4 / WARPS_M;             // 16-channel tiles per warp
    static constexpr u32 N_TILES = POS / 8 / WARPS_N;       // 8-position tiles per warp
    static constexpr u32 STAGES = CIN_PAD / STAGE_CI;
    static constexpr u32 PLANE = CIN_PAD * TAPS * PADDED;   // packed floats per plane
    static constexpr u32 STAGE = X_STAGE + PLANES * W_STAGE;
    static constexpr u32 SHARED_BYTES = config_shared_bytes(PLANES);
    static constexpr u32 X_COPIES = STAGE_CI * X_VECS;
    static constexpr u32 W_COPIES = PLANES * W_STAGE / 4;

    static_assert(L % 4 == 1 && CIN * L % 4 == 0, "row ci starts ci mod 4 past 16 bytes");
    static_assert(CIN_PAD % STAGE_CI == 0 && CIN <= CIN_PAD, "whole stages");
    static_assert(WARPS % WARPS_M == 0 && 4 % WARPS_M == 0 && POS % (8 * WARPS_N) == 0,
                  "the warps tile the block's 64 x 128 outputs");
    static_assert(W_COPIES % THREADS == 0, "every thread copies as many weight pieces");
    static_assert(THREADS % POS == 0, "the epilogue stores whole rows of positions");
    static_assert(STAGES >= RING - 1, "the prologue fills the ring");
};

}  // namespace tconv
}  // namespace spk

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

namespace spk {
namespace tconv {

template <class K>
__device__ __forceinline__ void run(const float* __restrict__ x, u64 x_len,
                                    const float* __restrict__ w, u64 w_len,
                                    float* __restrict__ y, u64 y_len) {
    constexpr u64 X_LEN = u64(K::BATCH) * K::CIN * K::L;
    if (x_len != X_LEN | w_len != u64(K::PLANES) * K::PLANE |
        y_len != u64(K::BATCH) * OUT * K::P | !aligned16(x) | !aligned16(w) |
        dynamic_shared_bytes() != K::SHARED_BYTES |
        !launch_is(K::BLOCKS, K::BATCH, 1, K::THREADS)) {
        return;
    }
    extern __shared__ __align__(16) float smem[];
    const saddr base = shared_address(smem);

    const u32 t = threadIdx.x;
    const u32 lane = t % 32;
    const u32 warp = t / 32;
    const u32 pos0 = blockIdx.x * POS;
    const u32 item = blockIdx.y * K::CIN * K::L;  // < 2^24: offsets fit 32 bits

    // Staging copies of thread t: x pieces t + THREADS j (row r, piece v), w pieces
    // t + THREADS j of the stage's contiguous planes.
    auto load_stage = [&](u32 stage, u32 buffer) {
        const saddr at = base + 4 * buffer * K::STAGE;
        const u32 ci0 = stage * STAGE_CI;
#pragma unroll
        for (u32 j = 0; j < (K::X_COPIES + K::THREADS - 1) / K::THREADS; ++j) {
            const u32 copy = t + j * K::THREADS;
            if (K::X_COPIES % K::THREADS == 0 || copy < K::X_COPIES) {
                const u32 r = copy / X_VECS;
                const u32 v = copy % X_VECS;
                const u32 source = item + (ci0 + r) * K::L + pos0 - r % 4 + 4 * v;
                const bool real = ci0 + r < K::CIN & u64(source) + 4 <= X_LEN;
                cp_async16_fill(at + 4 * (r * X_PITCH + 4 * v), x + (real ? source : 0),
                                real ? 16 : 0);
            }
        }
#pragma unroll
        for (u32 j = 0; j < K::W_COPIES / K::THREADS; ++j) {
            const u32 copy = t + j * K::THREADS;
            const u32 plane = copy / (W_STAGE / 4);
            const u32 piece = copy % (W_STAGE / 4);
            // through L2 only (.cg): copied through L1, where the SM's blocks could
            // share them, they were slower
            cp_async16_fill(at + 4 * (X_STAGE + plane * W_STAGE + 4 * piece),
                            w + plane * K::PLANE + stage * W_STAGE + 4 * piece, 16);
        }
        cp_async_commit();
    };

    // Compute role: warp (wm, wn) owns channel tiles wm M_TILES + i and position tiles
    // wn N_TILES + j. B element (k, n) of lane (g = lane / 4, q = lane % 4) for k-step s
    // is k = 8 s + q (b0) or 8 s + 4 + q (b1), n = g: x row ci = k / 5, column
    // n + tap + ci % 4. Its byte offset within a stage:
    const u32 wm = warp / K::WARPS_N;
    const u32 wn = warp % K::WARPS_N;
    const u32 q = lane % 4;
    const u32 column = wn * K::N_TILES * 8 + lane / 4;
    auto b_offset = [&](u32 s, u32 h) {
        const u32 k = 8 * s + 4 * h + q;
        const u32 ci = k / TAPS;
        return 4 * (ci * X_PITCH + ci % 4 + k % TAPS + column);
    };
    const u32 a_offset = 4 * (X_STAGE + (wm * K::M_TILES * 32 + lane) * 4);

    float acc[K::M_TILES][K::N_TILES][4];
    zero(acc);

#pragma unroll
    for (u32 stage = 0; stage < RING - 1; ++stage) {
        load_stage(stage, stage);
    }
    u32 buffer = 0;
#pragma unroll 1
    for (u32 stage = 0; stage < K::STAGES; ++stage) {
        cp_async_wait<RING - 2>();  // this thread's copies of `stage` have landed
        __syncthreads();            // everyone's have, and the ring slot below is idle
        const u32 next = stage + RING - 1;
        const u32 next_buffer = buffer == 0 ? RING - 1 : buffer - 1;
        if (next < K::STAGES) {
            load_stage(next, next_buffer);
        } else {
            cp_async_commit();  // an empty group keeps the wait count meaning one stage
        }

        const saddr at = base + 4 * buffer * K::STAGE;
#pragma unroll
        for (u32 s = 0; s < KSTEPS; ++s) {
            uint4 a_hi[K::M_TILES];
            uint4 a_lo[K::M_TILES];
            u32 b_hi[K::N_TILES][2];
            u32 b_lo[K::N_TILES][2];
#pragma unroll
            for (u32 i = 0; i < K::M_TILES; ++i) {
                const saddr a_at = at + a_offset + 4 * (s * STEP_FLOATS + i * 32 * 4);
                a_hi[i] = bits4(lds4(a_at));
                a_lo[i] = bits4(lds4(a_at + 4 * W_STAGE));
            }
#pragma unroll
            for (u32 j = 0; j < K::N_TILES; ++j) {
#pragma unroll
                for (u32 h = 0; h < 2; ++h) {
                    tf32_split(lds1(at + b_offset(s, h) + 4 * 8 * j), b_hi[j][h], b_lo[j][h]);
                }
            }
#pragma unroll
            for (u32 i = 0; i < K::M_TILES; ++i) {
#pragma unroll
                for (u32 j = 0; j < K::N_TILES; ++j) {
                    float fresh[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_split(fresh, a_hi[i], a_lo[i], b_hi[j][0], b_hi[j][1], b_lo[j][0],
                              b_lo[j][1]);
#pragma unroll
                    for (u32 e = 0; e < 4; ++e) {
                        acc[i][j][e] += fresh[e];
                    }
                }
            }
        }
        buffer = buffer == RING - 1 ? 0 : buffer + 1;
    }
    cp_async_wait<0>();  // only empty groups remain; the ring becomes the output tile
    __syncthreads();

    // Fragment (i, j): c0, c1 at channel 16 tile + g, positions 8 tile_n + 2 q + {0, 1};
    // c2, c3 eight channels further.
#pragma unroll
    for (u32 i = 0; i < K::M_TILES; ++i) {
#pragma unroll
        for (u32 j = 0; j < K::N_TILES; ++j) {
            const u32 channel = (wm * K::M_TILES + i) * 16 + lane / 4;
            const u32 position = (wn * K::N_TILES + j) * 8 + 2 * q;
            const saddr out = base + 4 * (channel * OUT_PITCH + position);
            sts2(out, acc[i][j][0], acc[i][j][1]);
            sts2(out + 4 * 8 * OUT_PITCH, acc[i][j][2], acc[i][j][3]);
        }
    }
    __syncthreads();

    constexpr u32 ROWS_AT_ONCE = K::THREADS / POS;
    const u32 p = t % POS;
    if (pos0 + p < K::P) {
        float* const yo = y + (u64(blockIdx.y) * OUT + t / POS) * K::P + pos0 + p;
        const saddr from = base + 4 * ((t / POS) * OUT_PITCH + p);
#pragma unroll 4
        for (u32 o = 0; o < OUT; o += ROWS_AT_ONCE) {
            yo[o * K::P] = lds1(from + 4 * o * OUT_PITCH);
        }
    }
}

}  // namespace tconv
}  // namespace spk

#define SPK_TCONV_BODY(SHAPE) spk::tconv::run<SHAPE>(x, x_len, w, w_len, y, y_len)
#else
#define SPK_TCONV_BODY(SHAPE) SPK_TIER_STUB()
#endif

// tc: scaled FP16 products (m16n8k16, FP32 accumulation), which TF32 math allows. Against
// TF32 m16n8k8 on the same tiles it issues half the mma (the H200 runs m16n8k16 at twice
// the FLOP rate: benchmarks/h200-mma-ceiling.txt) and copies half the weight bytes.
//   w: pack_conv_half at plan time: per stage of 16 input channels and per tap, the A
//      fragments as FP16 pairs of adjacent input channels (k runs tap-major inside a
//      stage), channel o times the power of two s_o that puts its largest magnitude in
//      [2^14, 2^15); then the 64 inverse scales. Three stages deep in a cp.async ring.
//   x: each warp loads its own window (its 32 positions and the 4 after, 16 channels)
//      into registers a stage ahead, scales it by a power of two s_x of its own that puts
//      the largest magnitude seen so far in [2^14, 2^15), and stores it as FP16 channel
//      pairs, [8 pairs][40 words] (8 mod 32 banks: B reads are conflict-free), in one of
//      two buffers. When a stage raises that largest, s_x shrinks and the accumulators are
//      scaled by the ratio, a power of two: every product stays in FP16's range and every
//      sum far inside FP32's. Positions past the row and channels past CIN load as zero.
//   out: acc / s_x / s_o, as two powers of two of half the exponent each, neither of which
//      overflows or underflows unless the result does.
// Error (u = 2^-24): each scaled operand rounds to FP16 (ties to even) with relative
// error 2^-11, or by an absolute 2^-25 of its scaled value below FP16's normal range, so a
// term errs by at most 2^-10 |x w| + 2^-38 (max|x| |w| + max|w_o| |x|), max|x| over the
// item at most; the chained mma truncate as TF32's do.
namespace spk {
namespace hconv {

constexpr u32 STAGE_CI = 16;                      // input channels per stage
constexpr u32 STEP_WORDS = 4 * 32 * 4;            // one tap: 4 tiles x 32 lanes x 4 pairs
constexpr u32 W_STAGE = tconv::TAPS * STEP_WORDS; // 2560 pair words per stage
constexpr u32 THREADS = 128, WARPS = THREADS / 32;
constexpr u32 WINDOW = tconv::POS / WARPS + tconv::TAPS - 1;  // 36 positions per warp
constexpr u32 X_PITCH = 40;                       // words per pair row: 8 mod 32 banks
constexpr u32 X_WARP = STAGE_CI / 2 * X_PITCH;
constexpr u32 X_BUFFER = WARPS * X_WARP;
constexpr u32 W_AT = 2 * X_BUFFER;                // two x buffers, then the weight ring
constexpr u32 RING = 3;
constexpr u32 WORDS = W_AT + RING * W_STAGE;

static_assert(WINDOW <= X_PITCH && X_PITCH % 32 == 8, "conflict-free B reads");
static_assert(W_STAGE / 4 % THREADS == 0, "every thread copies as many weight pieces");

template <u32 CIN_, u32 CIN_PAD_, u32 L_>
struct Shape {
    static constexpr u32 CIN = CIN_, CIN_PAD = CIN_PAD_, L = L_;
    static constexpr u32 BATCH = 32, P = L - 4;
    static constexpr u32 BLOCKS = (P + tconv::POS - 1) / tconv::POS;
    static constexpr u32 STAGES = CIN_PAD / STAGE_CI;
    static constexpr u32 PAIRS = CIN_PAD * tconv::TAPS * tconv::PADDED / 2;
    static constexpr u32 W_LEN = PAIRS + tconv::PADDED;  // pair words, then inverse scales
    static constexpr u32 SHARED_BYTES = tconv::config_shared_bytes(1);
    static_assert(CIN_PAD % STAGE_CI == 0 && CIN <= CIN_PAD && STAGES >= RING - 1, "stages");
    static_assert(4 * WORDS <= SHARED_BYTES, "x buffers and ring fit the Config's bytes");
};

}  // namespace hconv
}  // namespace spk

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

namespace spk {
namespace hconv {

template <class K>
__device__ __forceinline__ void run(const float* __restrict__ x, u64 x_len,
                                    const float* __restrict__ w, u64 w_len,
                                    float* __restrict__ y, u64 y_len) {
    using tconv::OUT;
    using tconv::OUT_PITCH;
    using tconv::POS;
    using tconv::TAPS;
    if (x_len != u64(K::BATCH) * K::CIN * K::L | w_len != K::W_LEN |
        y_len != u64(K::BATCH) * OUT * K::P | !aligned16(w) |
        dynamic_shared_bytes() != K::SHARED_BYTES |
        !launch_is(K::BLOCKS, K::BATCH, 1, THREADS)) {
        return;
    }
    extern __shared__ __align__(16) float smem[];
    const saddr base = shared_address(smem);

    const u32 t = threadIdx.x;
    const u32 lane = t % 32;
    const u32 warp = t / 32;
    const u32 pos0 = blockIdx.x * POS;
    const u32 item = blockIdx.y * K::CIN * K::L;  // < 2^24: offsets fit 32 bits

    auto issue = [&](u32 stage) {
        const saddr at = base + 4 * (W_AT + stage % RING * W_STAGE);
#pragma unroll
        for (u32 j = 0; j < W_STAGE / 4 / THREADS; ++j) {
            const u32 copy = t + j * THREADS;
            // through L2 only (.cg): through L1, shared by the SM's four blocks (the
            // half-size weight nearly fits), they were slower
            cp_async16_fill(at + 16 * copy, w + stage * W_STAGE + 4 * copy, 16);
        }
        cp_async_commit();
    };

    // x of the warp's window: this lane's position (16 channels) and, for the 4 after
    // the warp's 32, position 32 + lane % 4 of pair lane / 4. Positions past the row's
    // end and channels past CIN are zero, so they never set a scale. They are loaded
    // under the condition: from a clamped address and then zeroed they were slower.
    const u32 main_at = pos0 + warp * 32 + lane;
    const u32 halo_at = pos0 + warp * 32 + 32 + lane % 4;
    const u32 halo_pair = lane / 4;
    const bool main_in = main_at < K::L;
    const bool halo_in = halo_at < K::L;
    const float* const x_main = x + item + (main_in ? main_at : 0);
    const float* const x_halo = x + item + 2 * halo_pair * K::L + (halo_in ? halo_at : 0);
    float xm[STAGE_CI];
    float xh[2];
    // channel r of a stage exists in every stage when r < CIN % 16 (all, where 16
    // divides CIN): only the rest need the test, which keeps conv2 from spilling on
    // sm_80.
    auto channel_in = [](u32 ci0, u32 r) {
        constexpr u32 ALWAYS = K::CIN % STAGE_CI == 0 ? STAGE_CI : K::CIN % STAGE_CI;
        return r < ALWAYS | ci0 + r < K::CIN;
    };
    auto fetch = [&](u32 stage) {
        const u32 ci0 = stage * STAGE_CI;
#pragma unroll
        for (u32 r = 0; r < STAGE_CI; ++r) {
            xm[r] = main_in & channel_in(ci0, r) ? __ldg(x_main + (ci0 + r) * K::L) : 0.0f;
        }
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
            const bool real = halo_in & channel_in(ci0, 2 * halo_pair + h);
            xh[h] = real ? __ldg(x_halo + (ci0 + h) * K::L) : 0.0f;
        }
    };

    float acc[4][4][4];
    zero(acc);
    WarpScale x_scale = warp_scale_start();
    auto stash = [&](u32 buffer) {
        float m = fmaxf(fabsf(xh[0]), fabsf(xh[1]));
#pragma unroll
        for (u32 r = 0; r < STAGE_CI; ++r) {
            m = fmaxf(m, fabsf(xm[r]));
        }
        raise_warp_scale(m, x_scale, acc);
        const float scale = x_scale.scale;
        const saddr at = base + 4 * (buffer * X_BUFFER + warp * X_WARP);
#pragma unroll
        for (u32 p = 0; p < STAGE_CI / 2; ++p) {
            sts1(at + 4 * (p * X_PITCH + lane), f16_pair(xm[2 * p] * scale, xm[2 * p + 1] * scale));
        }
        sts1(at + 4 * (halo_pair * X_PITCH + 32 + lane % 4),
             f16_pair(xh[0] * scale, xh[1] * scale));
    };

    // x is fetched a stage ahead of its stash, right after the previous stash, weights
    // two stages ahead, so the x loads fly during a whole stage's products
    issue(0);
    issue(1);
    fetch(0);
    stash(0);
    fetch(1);
    const u32 g = lane / 4, q = lane % 4;
#pragma unroll 1
    for (u32 stage = 0; stage < K::STAGES; ++stage) {
        cp_async_wait<RING - 2>();  // this thread's weight copies of `stage` have landed
        __syncthreads();            // everyone's, and every warp's x; the slot below is idle
        if (stage + RING - 1 < K::STAGES) {
            issue(stage + RING - 1);
        } else {
            cp_async_commit();
        }
        const saddr a_at = base + 4 * (W_AT + stage % RING * W_STAGE + lane * 4);
        const saddr b_at = base + 4 * (stage % 2 * X_BUFFER + warp * X_WARP + q * X_PITCH + g);
#pragma unroll
        for (u32 tap = 0; tap < TAPS; ++tap) {
            uint4 a[4];
#pragma unroll
            for (u32 i = 0; i < 4; ++i) {
                a[i] = bits4(lds4(a_at + 4 * (tap * STEP_WORDS + i * 128)));
            }
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                const u32 b0 = __float_as_uint(lds1(b_at + 4 * (8 * j + tap)));
                const u32 b1 = __float_as_uint(lds1(b_at + 4 * (4 * X_PITCH + 8 * j + tap)));
#pragma unroll
                for (u32 i = 0; i < 4; ++i) {
                    mma_f16(acc[i][j], a[i], b0, b1);
                }
            }
        }
        if (stage + 1 < K::STAGES) {
            stash((stage + 1) % 2);
            if (stage + 2 < K::STAGES) {
                fetch(stage + 2);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // acc / s_x / s_o as two powers of two, each half the exponent: neither step can
    // overflow or underflow unless the result does
    const int x_exponent = exponent_of(x_scale.inverse);
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
            const u32 channel = 16 * i + g + 8 * h;
            float f1, f2;
            pow2_halves(x_exponent + exponent_of(__ldg(w + K::PAIRS + channel)), f1, f2);
            const saddr out = base + 4 * (channel * OUT_PITCH + 2 * q);
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                sts2(out + 4 * (warp * 32 + 8 * j), acc[i][j][2 * h] * f1 * f2,
                     acc[i][j][2 * h + 1] * f1 * f2);
            }
        }
    }
    __syncthreads();

    const u32 p = t % POS;
    if (pos0 + p < K::P) {
        float* const yo = y + u64(blockIdx.y) * OUT * K::P + pos0 + p;
        const saddr from = base + 4 * p;
#pragma unroll 4
        for (u32 o = 0; o < OUT; ++o) {
            yo[o * K::P] = lds1(from + 4 * o * OUT_PITCH);
        }
    }
}

}  // namespace hconv
}  // namespace spk

#define SPK_HCONV_BODY(SHAPE) spk::hconv::run<SHAPE>(x, x_len, w, w_len, y, y_len)
#else
#define SPK_HCONV_BODY(SHAPE) SPK_TIER_STUB()
#endif

namespace spk {
namespace tconv {
// x3: eight warps of 32 channels x 32 positions, a fresh fragment per k-step, one block
// per SM (the fastest of the forms measured).
//                   CIN CIN_PAD   L  THREADS WARPS_M
using Conv1X3 = Shape<80, 80, 5325, 256, 2>;
using Conv2X3 = Shape<60, 64, 1773, 256, 2>;
}  // namespace tconv
namespace hconv {
using Conv1Tc = Shape<80, 80, 5325>;
using Conv2Tc = Shape<60, 64, 1773>;
}  // namespace hconv
}  // namespace spk

// tc: 128 registers, four blocks per SM; x3: 240 registers, one block per SM
SPK_CONV_KERNEL(spk_segdense_conv1_b32_tc, spk::hconv::THREADS, 4,
                SPK_HCONV_BODY(spk::hconv::Conv1Tc))
SPK_CONV_KERNEL(spk_segdense_conv1_b32_x3, spk::tconv::Conv1X3::THREADS, 1,
                SPK_TCONV_BODY(spk::tconv::Conv1X3))
SPK_CONV_KERNEL(spk_segdense_conv2_b32_tc, spk::hconv::THREADS, 4,
                SPK_HCONV_BODY(spk::hconv::Conv2Tc))
SPK_CONV_KERNEL(spk_segdense_conv2_b32_x3, spk::tconv::Conv2X3::THREADS, 1,
                SPK_TCONV_BODY(spk::tconv::Conv2X3))

#undef SPK_TCONV_BODY
#undef SPK_HCONV_BODY
#undef SPK_PACK_CONV_MMA_BODY
