// WeSpeaker's Kaldi fbank around cuFFT's real FFT: the frames before the transform, the
// log-mel features after it. The operations are those of the library's
// fbank (torchaudio's Kaldi fbank as pyannote calls it: no dither, snip_edges, a
// Hamming window, pre-emphasis 0.97, power spectrum, no energy, then the mean over
// time subtracted); the sums are FP64 in fixed orders, so every run gives the same bits.
#pragma once

#include "common.cuh"

constexpr u32 FBANK_WINDOW = 400;  // samples a frame (25 ms at 16 kHz)
constexpr u32 FBANK_SHIFT = 160;   // samples between frames (10 ms)
constexpr u32 FBANK_PADDED = 512;  // the transform's length: the window, zero-padded
constexpr u32 FBANK_THREADS = 256;  // a warp a frame
constexpr u32 MEL_BINS = 80;
constexpr u32 MEL_THREADS = 256;
constexpr u32 FFT_BINS = FBANK_PADDED / 2 + 1;
constexpr float FBANK_FLOOR = 1.1920928955078125e-07f;  // FP32's epsilon, the log's floor

// Frames: x [items][samples] (the chunks' waveforms) -> y [items][frames][FBANK_PADDED],
// frames = (samples - FBANK_WINDOW) / FBANK_SHIFT + 1. For frame f, with s the frame's
// samples times 2^15 (exact) and m their mean (an FP64 sum, rounded once):
// v[t] = s[t] - m, then (v[t] - 0.97 v[t - 1]) w[t] with v[-1] = v[0], each step one
// FP32 rounding in the library's order (no fused multiply-add), then zeros to
// FBANK_PADDED. w: the window's FBANK_WINDOW values.
// Launch: grid (ceil(frames / 8), items), blocks of FBANK_THREADS.
extern "C" __global__ void __launch_bounds__(FBANK_THREADS)
spk_trunk_fbank_frames(const float* __restrict__ x, u64 x_len, const float* __restrict__ w,
                       u64 w_len, float* __restrict__ y, u64 y_len, u32 items, u32 samples) {
    constexpr u32 WARPS = FBANK_THREADS / 32;
    const u32 frames = samples >= FBANK_WINDOW ? (samples - FBANK_WINDOW) / FBANK_SHIFT + 1 : 0;
    const bool valid = spk::launch_is((frames + WARPS - 1) / WARPS, items, 1, FBANK_THREADS) &
                       (items >= 1) & (frames >= 1) & (x_len == u64(items) * samples) &
                       (w_len == FBANK_WINDOW) & (y_len == u64(items) * frames * FBANK_PADDED);
    const u32 lane = threadIdx.x & 31, frame = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (!valid | (frame >= frames)) {
        return;  // uniform over the grid, then over the warp
    }
    const float* s = x + u64(blockIdx.y) * samples + u64(frame) * FBANK_SHIFT;
    double sum = 0.0;
    for (u32 t = lane; t < FBANK_WINDOW; t += 32) {
        sum += double(__ldg(s + t) * 32768.0f);
    }
    const float mean = float(spk::warp_sum(sum) / FBANK_WINDOW);
    float* out = y + (u64(blockIdx.y) * frames + frame) * FBANK_PADDED;
    for (u32 t = lane; t < FBANK_PADDED; t += 32) {
        float value = 0.0f;
        if (t < FBANK_WINDOW) {
            const float here = __fsub_rn(__ldg(s + t) * 32768.0f, mean);
            const float before = __fsub_rn(__ldg(s + (t > 0 ? t - 1 : 0)) * 32768.0f, mean);
            value = __fmul_rn(__fsub_rn(here, __fmul_rn(0.97f, before)), __ldg(w + t));
        }
        out[t] = value;
    }
}

// Log-mel, in two launches (a chunk's frames spread over many blocks, its means summed
// in a fixed order): spectrum [items][frames][FFT_BINS] complex (float pairs: the real
// transform of the frames) -> y [items][frames][MEL_BINS]. Mel bin m's filter is the
// weights banks[offset_m .. offset_m + count_m) over the transform's bins first_m
// onwards (ranges [MEL_BINS][3]: first, count, offset; count_m <= MEL_MAX_TERMS).
// spk_trunk_log_mel, for frame f: e = the sum over the filter of (re^2 + im^2) weight
// in FP64 from the first bin up, rounded once; y = log(max(e, FBANK_FLOOR)) (in FP64,
// rounded; NaN stays NaN); and each block's sums of y per mel bin over its frames (FP64,
// its warps in order) into sums [items][blocks][MEL_BINS].
// Launch: grid (blocks = ceil(frames / MEL_FRAMES), items), blocks of MEL_THREADS; warp
// w takes the block's frames w, w + 8, ...; a lane bins lane, lane + 32, lane + 64.
constexpr u32 MEL_FRAMES = 32;  // frames a block
constexpr u32 MEL_MAX_TERMS = 16;  // a filter's bins, loaded at once

extern "C" __global__ void __launch_bounds__(MEL_THREADS)
spk_trunk_log_mel(const float* __restrict__ spectrum, u64 spectrum_len,
                  const float* __restrict__ banks, u64 banks_len, const u32* __restrict__ ranges,
                  u64 ranges_len, float* __restrict__ y, u64 y_len, double* __restrict__ sums,
                  u64 sums_len, u32 items, u32 frames) {
    constexpr u32 WARPS = MEL_THREADS / 32, PER_LANE = (MEL_BINS + 31) / 32;
    __shared__ u32 first[MEL_BINS], count[MEL_BINS], offset[MEL_BINS];
    __shared__ double partial[WARPS][MEL_BINS];
    const u32 blocks = (frames + MEL_FRAMES - 1) / MEL_FRAMES;
    const bool valid = spk::launch_is(blocks, items, 1, MEL_THREADS) & (items >= 1) &
                       (frames >= 1) & (spectrum_len == u64(items) * frames * FFT_BINS * 2) &
                       (ranges_len == MEL_BINS * 3) & (y_len == u64(items) * frames * MEL_BINS) &
                       (sums_len == u64(items) * blocks * MEL_BINS);
    if (!valid) {
        return;  // uniform over the grid
    }
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x < MEL_BINS) {
        const u32 m = threadIdx.x, terms = __ldg(ranges + 3 * m + 1);
        first[m] = __ldg(ranges + 3 * m);
        offset[m] = __ldg(ranges + 3 * m + 2);
        // a filter longer than the loads or past the transform or the weights: none
        const bool inside = (terms <= MEL_MAX_TERMS) & (u64(first[m]) + terms <= FFT_BINS) &
                            (u64(offset[m]) + terms <= banks_len);
        count[m] = inside ? terms : 0;
    }
    __syncthreads();
    const float2* chunk =
        reinterpret_cast<const float2*>(spectrum) + u64(blockIdx.y) * frames * FFT_BINS;
    float* out = y + u64(blockIdx.y) * frames * MEL_BINS;
    double column[PER_LANE] = {};
    const u32 last = min(frames, (blockIdx.x + 1) * MEL_FRAMES);
#pragma unroll 1
    for (u32 frame = blockIdx.x * MEL_FRAMES + warp; frame < last; frame += WARPS) {
        const float2* row = chunk + u64(frame) * FFT_BINS;
#pragma unroll
        for (u32 j = 0; j < PER_LANE; ++j) {
            const u32 m = min(lane + 32 * j, MEL_BINS - 1);  // the lanes past the bins idle
            float2 z[MEL_MAX_TERMS];
            float weight[MEL_MAX_TERMS];
#pragma unroll
            for (u32 k = 0; k < MEL_MAX_TERMS; ++k) {  // every load issued before the sum
                const bool term = k < count[m];
                z[k] = term ? __ldg(row + first[m] + k) : make_float2(0.0f, 0.0f);
                weight[k] = term ? __ldg(banks + offset[m] + k) : 0.0f;
            }
            double energy = 0.0;  // the absent terms add +0: the sum is unchanged
#pragma unroll
            for (u32 k = 0; k < MEL_MAX_TERMS; ++k) {
                const double power =
                    fma(double(z[k].x), double(z[k].x), double(z[k].y) * double(z[k].y));
                energy = fma(power, double(weight[k]), energy);
            }
            float e = float(energy);
            e = e != e ? e : fmaxf(e, FBANK_FLOOR);
            const float logged = float(log(double(e)));
            if (lane + 32 * j < MEL_BINS) {
                out[u64(frame) * MEL_BINS + m] = logged;
                column[j] += double(logged);
            }
        }
    }
#pragma unroll
    for (u32 j = 0; j < PER_LANE; ++j) {
        if (lane + 32 * j < MEL_BINS) {
            partial[warp][lane + 32 * j] = column[j];
        }
    }
    __syncthreads();
    if (threadIdx.x < MEL_BINS) {
        double total = 0.0;
        for (u32 w = 0; w < WARPS; ++w) {
            total += partial[w][threadIdx.x];
        }
        sums[(u64(blockIdx.y) * blocks + blockIdx.x) * MEL_BINS + threadIdx.x] = total;
    }
}

// The means subtracted: each mel bin's mean over the chunk's frames (its blocks' sums
// added in order, divided, rounded once), subtracted from y in FP32. y and sums as
// spk_trunk_log_mel left them.
// Launch: grid (ceil(frames * MEL_BINS / CENTRE_SPAN), items), blocks of CENTRE_THREADS.
constexpr u32 CENTRE_THREADS = 256;
constexpr u32 CENTRE_SPAN = 4096;  // values of y a block

extern "C" __global__ void __launch_bounds__(CENTRE_THREADS)
spk_trunk_mel_centre(float* __restrict__ y, u64 y_len, const double* __restrict__ sums,
                     u64 sums_len, u32 items, u32 frames) {
    __shared__ float means[MEL_BINS];
    const u32 blocks = (frames + MEL_FRAMES - 1) / MEL_FRAMES;
    const u64 values = u64(frames) * MEL_BINS;
    const bool valid = spk::launch_is(u32((values + CENTRE_SPAN - 1) / CENTRE_SPAN), items, 1,
                                      CENTRE_THREADS) &
                       (items >= 1) & (frames >= 1) & (y_len == items * values) &
                       (sums_len == u64(items) * blocks * MEL_BINS);
    if (!valid) {
        return;  // uniform over the grid
    }
    if (threadIdx.x < MEL_BINS) {
        const double* chunk = sums + u64(blockIdx.y) * blocks * MEL_BINS;
        double total = 0.0;
        for (u32 b = 0; b < blocks; ++b) {
            total += chunk[u64(b) * MEL_BINS + threadIdx.x];
        }
        means[threadIdx.x] = float(total / frames);
    }
    __syncthreads();
    float* out = y + u64(blockIdx.y) * values;
    const u64 end = min(values, u64(blockIdx.x + 1) * CENTRE_SPAN);
    for (u64 i = u64(blockIdx.x) * CENTRE_SPAN + threadIdx.x; i < end; i += CENTRE_THREADS) {
        out[i] = __fsub_rn(out[i], means[i % MEL_BINS]);
    }
}
