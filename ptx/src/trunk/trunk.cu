// trunk: fixed-shape kernels for the WeSpeaker ResNet34 trunk at batch 32 chunks of
// 80 mel bins x 998 frames, with BatchNorm folded into each convolution's weights and a
// bias at plan time.
//
// Calling convention and entry checks: common.cuh. Every entry returns before writing
// anything when a length, an alignment or its launch shape differs. Lengths may exceed
// what `items` (1 to 32 chunks) uses: a plan's buffers hold 32 chunks and a last batch
// of fewer runs on them, its absent chunks neither read nor written.
//
// Tiers: both tiers export the same entries; the tensor-core convolutions trap in the
// sm75 tier, whose plans take the library path.

#include "common.cuh"
#include "trunkconv.cuh"
#include "trunktiles.cuh"
#include "trunkhalves.cuh"
#include "trunkfbank.cuh"

// The 1 -> 32 stem: fbank [item][frame][bin] (the model's (B, T, F) input, read as the
// convolution's (bin, frame) image), weights [tap][32], bias [32], output NHWC
// [item][bin][frame][32], ReLU. FP32 fma over the nine taps in order, then + bias. Where
// out_max is given, each chunk's largest output is raised into it (raise_chunk_maxima).
// Launch: grid (STEM_TILES, 32), blocks of STEM_THREADS; a block owns a tile of
// STEM_TILE_BINS x STEM_TILE_FRAMES positions of item blockIdx.y. It stages the tile's
// input patch (with its one-pixel border) in shared memory, read along the bins that are
// contiguous in the fbank. A thread owns four channels, whose 36 weights and 4 biases
// it holds in registers, and STEM_RUN consecutive frames of one bin, sliding its 3 x 3
// window along them (three patch reads a position): reading the weights from shared
// memory at every position made the kernel bound by its shared-memory instructions.
// The eight threads of a position store its 128 output bytes together.
constexpr u32 STEM_THREADS = 256;
constexpr u32 STEM_TILE_BINS = 8;
constexpr u32 STEM_TILE_FRAMES = 32;
constexpr u32 STEM_RUN = STEM_TILE_BINS * STEM_TILE_FRAMES * 8 / STEM_THREADS;  // 8 frames
constexpr u32 STEM_FRAME_TILES = (spk::TRUNK_FRAMES + STEM_TILE_FRAMES - 1) / STEM_TILE_FRAMES;
constexpr u32 STEM_TILES = spk::TRUNK_BINS / STEM_TILE_BINS * STEM_FRAME_TILES;
constexpr u32 STEM_POS = spk::TRUNK_BINS * spk::TRUNK_FRAMES;

extern "C" __global__ void __launch_bounds__(STEM_THREADS)
spk_trunk_stem(const float* __restrict__ x, u64 x_len, const float* __restrict__ w, u64 w_len,
               const float* __restrict__ bias, u64 bias_len, float* __restrict__ y, u64 y_len,
               u32* __restrict__ out_max, u64 out_max_len, u32 items) {
    // a patch row of frames is PATCH_STRIDE words: the four runs a warp reads at once
    // start STEM_RUN frames apart, 88 words, on four different banks
    constexpr u32 PATCH_BINS = STEM_TILE_BINS + 2, PATCH_FRAMES = STEM_TILE_FRAMES + 2;
    constexpr u32 PATCH_STRIDE = PATCH_BINS + 1;
    static_assert(STEM_TILE_FRAMES % STEM_RUN == 0, "a run stays in its tile");
    __shared__ float patch[PATCH_FRAMES][PATCH_STRIDE];
    const bool valid = spk::launch_is(STEM_TILES, spk::TRUNK_BATCH, 1, STEM_THREADS) &
                       (items >= 1) & (items <= spk::TRUNK_BATCH) &
                       (x_len >= u64(items) * STEM_POS) & (w_len == 9 * 32) & (bias_len == 32) &
                       (y_len >= u64(items) * STEM_POS * 32) &
                       ((out_max_len == 0) | (out_max_len >= items)) & spk::aligned16(y);
    const u32 item = blockIdx.y;
    if (!valid | (item >= items)) {
        return;  // uniform over the block
    }
    const int bin0 = int(blockIdx.x / STEM_FRAME_TILES * STEM_TILE_BINS);
    const int frame0 = int(blockIdx.x % STEM_FRAME_TILES * STEM_TILE_FRAMES);
    const float* chunk = x + u64(item) * STEM_POS;
    for (u32 i = threadIdx.x; i < PATCH_FRAMES * PATCH_BINS; i += STEM_THREADS) {
        const int f = frame0 - 1 + int(i / PATCH_BINS), b = bin0 - 1 + int(i % PATCH_BINS);
        const bool inside = (u32(b) < spk::TRUNK_BINS) & (u32(f) < spk::TRUNK_FRAMES);
        patch[i / PATCH_BINS][i % PATCH_BINS] =
            inside ? __ldg(chunk + u32(f) * spk::TRUNK_BINS + u32(b)) : 0.0f;
    }
    const u32 quad = threadIdx.x % 8;  // channels 4 quad .. 4 quad + 3
    float weight[9][4], offset[4];
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
#pragma unroll
        for (u32 tap = 0; tap < 9; ++tap) {
            weight[tap][j] = __ldg(w + tap * 32 + quad * 4 + j);
        }
        offset[j] = __ldg(bias + quad * 4 + j);
    }
    __syncthreads();
    // this thread's run: bin tb, frames tf0 .. tf0 + STEM_RUN - 1 of the tile; the
    // four runs of a warp lie side by side in the frames
    const u32 slot = threadIdx.x / 8;
    const u32 tb = slot / (STEM_TILE_FRAMES / STEM_RUN);
    const u32 tf0 = slot % (STEM_TILE_FRAMES / STEM_RUN) * STEM_RUN;
    float* out = y + (u64(item) * STEM_POS + (u32(bin0) + tb) * spk::TRUNK_FRAMES) * 32 + quad * 4;
    // window[dx][dy]: at the run's frame i, patch frame tf0 + i + dx, bin tb + dy (tap
    // dy * 3 + dx)
    float window[3][3];
#pragma unroll
    for (u32 dx = 0; dx < 2; ++dx) {
#pragma unroll
        for (u32 dy = 0; dy < 3; ++dy) {
            window[dx][dy] = patch[tf0 + dx][tb + dy];
        }
    }
    float largest = 0.0f;
#pragma unroll
    for (u32 i = 0; i < STEM_RUN; ++i) {
#pragma unroll
        for (u32 dy = 0; dy < 3; ++dy) {
            window[2][dy] = patch[tf0 + i + 2][tb + dy];
        }
        float v[4];
#pragma unroll
        for (u32 j = 0; j < 4; ++j) {
            float sum = 0.0f;
#pragma unroll
            for (u32 tap = 0; tap < 9; ++tap) {
                sum = fmaf(window[tap % 3][tap / 3], weight[tap][j], sum);
            }
            v[j] = fmaxf(sum + offset[j], 0.0f);
        }
        const u32 frame = u32(frame0) + tf0 + i;
        if (frame < spk::TRUNK_FRAMES) {
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                largest = fmaxf(largest, v[j]);
            }
            spk::stg4(out + u64(frame) * 32, make_float4(v[0], v[1], v[2], v[3]));
        }
#pragma unroll
        for (u32 dy = 0; dy < 3; ++dy) {
            window[0][dy] = window[1][dy];
            window[1][dy] = window[2][dy];
        }
    }
    if (out_max_len != 0) {
        spk::raise_chunk_maxima<STEM_THREADS / 32>(out_max, item, items, largest, 0.0f);
    }
}

constexpr u32 MAXIMA_THREADS = 256;

// maxima[0 .. len) = 0: the trunk's first launch, before its layers raise them.
// Launch: one block of MAXIMA_THREADS.
extern "C" __global__ void __launch_bounds__(MAXIMA_THREADS)
spk_trunk_clear(u32* __restrict__ maxima, u64 maxima_len) {
    if (!spk::launch_is(1, 1, 1, MAXIMA_THREADS)) {
        return;
    }
    for (u64 i = threadIdx.x; i < maxima_len; i += MAXIMA_THREADS) {
        maxima[i] = 0;
    }
}

// maxima[i] = the largest |x| of chunk i (item_len floats each, i < items), as float
// bits: a single convolution's in_max, where no earlier layer wrote it.
// Launch: one block of MAXIMA_THREADS per chunk of the batch, grid 32.
extern "C" __global__ void __launch_bounds__(MAXIMA_THREADS)
spk_trunk_chunk_max(const float* __restrict__ x, u64 x_len, u32 item_len,
                    u32* __restrict__ maxima, u64 maxima_len, u32 items) {
    __shared__ float warps[MAXIMA_THREADS / 32];
    const bool valid = spk::launch_is(spk::TRUNK_BATCH, 1, 1, MAXIMA_THREADS) & (items >= 1) &
                       (items <= spk::TRUNK_BATCH) & (x_len >= u64(items) * item_len) &
                       (maxima_len >= items);
    if (!valid | (blockIdx.x >= items)) {
        return;  // uniform over the block
    }
    const float* chunk = x + u64(blockIdx.x) * item_len;
    float largest = 0.0f;
    for (u32 i = threadIdx.x; i < item_len; i += MAXIMA_THREADS) {
        largest = fmaxf(largest, fabsf(__ldg(chunk + i)));
    }
    largest = spk::warp_max(largest);
    if ((threadIdx.x & 31) == 0) {
        warps[threadIdx.x >> 5] = largest;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (u32 i = 1; i < MAXIMA_THREADS / 32; ++i) {
            largest = fmaxf(largest, warps[i]);
        }
        maxima[blockIdx.x] = __float_as_uint(largest);
    }
}

// One convolution entry: x, w, bias (bias, then the columns' inverse scales), residual
// (length 0: none), y, in_max, out_max (length 0: none), items, flags. LAUNCH names the
// launch's threads and blocks an SM, BODY the device function.
#define SPK_CONV_ARGUMENTS                                                                     \
    x, x_len, w, w_len, bias, bias_len, residual, residual_len, y, y_len, in_max, in_max_len, \
        out_max, out_max_len, items, flags, x_map
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SPK_TRUNK_BODY(SHAPE, SPLIT) \
    spk::trunk_conv<SHAPE, spk::TierTiles<SHAPE>, SPLIT>(SPK_CONV_ARGUMENTS)
#else
#define SPK_TRUNK_BODY(SHAPE, SPLIT) SPK_TIER_STUB()
#endif
// the 2D-tile form exists where wgmma does (the sm90 tier); it traps elsewhere
#if defined(SPK_WGMMA)
#define SPK_TILES_BODY(SHAPE, SPLIT, MIDDLE) \
    spk::trunk_conv_tiles<SHAPE, SPLIT, MIDDLE>(SPK_CONV_ARGUMENTS)
#else
#define SPK_TILES_BODY(SHAPE, SPLIT, MIDDLE) SPK_TIER_STUB()
#endif
// the halves form (the strips of layers 2 to 4) likewise: by the async copy engine
// where given a tensor map of the input (TrunkPlan's) and its shape takes one, else by
// every thread's copies (ConvPlan)
#if defined(SPK_WGMMA)
#define SPK_HALVES_BODY(SHAPE, SPLIT)                                             \
    if (spk::HalvesShape<SHAPE, SPLIT>::TMA_COPIES && x_map != nullptr) {         \
        spk::trunk_conv_halves_by<SHAPE, SPLIT, true>(SPK_CONV_ARGUMENTS);       \
    } else {                                                                      \
        spk::trunk_conv_halves_by<SHAPE, SPLIT, false>(SPK_CONV_ARGUMENTS);      \
    }
#else
#define SPK_HALVES_BODY(SHAPE, SPLIT) SPK_TIER_STUB()
#endif
#define SPK_TRUNK_ENTRY(NAME, LAUNCH, BODY)                                                     \
    extern "C" __global__ void __launch_bounds__(LAUNCH::THREADS, LAUNCH::MIN_BLOCKS) NAME(     \
        const float* __restrict__ x, u64 x_len, const float* __restrict__ w, u64 w_len,      \
        const float* __restrict__ bias, u64 bias_len, const float* __restrict__ residual,    \
        u64 residual_len, float* __restrict__ y, u64 y_len, const u32* __restrict__ in_max, \
        u64 in_max_len, u32* __restrict__ out_max, u64 out_max_len, u32 items, u32 flags,    \
        const void* __restrict__ x_map) {                                                     \
        BODY;                                                                                \
    }
#define SPK_TRUNK_CONV(NAME, SHAPE, SPLIT) SPK_TRUNK_ENTRY(NAME, SHAPE, SPK_TRUNK_BODY(SHAPE, SPLIT))
#define SPK_TRUNK_SPLIT(SITE, SHAPE) SPK_TRUNK_CONV(spk_trunk_##SITE##_f16x3, SHAPE, true)
#define SPK_TRUNK_SHAPE(SITE, SHAPE)                      \
    SPK_TRUNK_CONV(spk_trunk_##SITE##_f16, SHAPE, false) \
    SPK_TRUNK_SPLIT(SITE, SHAPE)
#define SPK_TRUNK_TILES(NAME, SHAPE, LAUNCH, SPLIT, MIDDLE) \
    SPK_TRUNK_ENTRY(NAME, LAUNCH, SPK_TILES_BODY(SHAPE, SPLIT, MIDDLE))

// Shapes: (CIN, COUT, HIN, WIN, STRIDE, KS), one per distinct convolution of the trunk.
// The 1x1 shortcuts run the three products in both maths: 0.5% of the trunk's work, and
// cuDNN's TF32 math keeps at least one of them in FP32 (measured: 1.1e-7 where TF32
// gives 2.9e-4). Every entry's launch bound is its shape's blocks an SM: with a bound
// of one, ptxas gave layer 2's shortcut 180 registers, one block of 8 warps an SM.
typedef spk::ConvShape<32, 32, 80, 998, 1, 3> Layer1Conv;
typedef spk::ConvShape<32, 64, 80, 998, 2, 3> Layer2Down;
typedef spk::ConvShape<32, 64, 80, 998, 2, 1> Layer2Shortcut;
typedef spk::ConvShape<64, 64, 40, 499, 1, 3> Layer2Conv;
typedef spk::ConvShape<64, 128, 40, 499, 2, 3> Layer3Down;
typedef spk::ConvShape<64, 128, 40, 499, 2, 1> Layer3Shortcut;
typedef spk::ConvShape<128, 128, 20, 250, 1, 3> Layer3Conv;
typedef spk::ConvShape<128, 256, 20, 250, 2, 3> Layer4Down;
typedef spk::ConvShape<128, 256, 20, 250, 2, 1> Layer4Shortcut;
typedef spk::ConvShape<256, 256, 10, 125, 1, 3> Layer4Conv;

SPK_TRUNK_SHAPE(layer1_conv, Layer1Conv)
// layer1 in 2D tiles (the sm90 tier's; trunktiles.cuh)
typedef spk::SlabShape<Layer1Conv, false> Layer1Tiles;
typedef spk::SlabShape<Layer1Conv, true> Layer1TilesSplit;
SPK_TRUNK_TILES(spk_trunk_layer1_tiles_f16, Layer1Conv, Layer1Tiles, false, false)
SPK_TRUNK_TILES(spk_trunk_layer1_tiles_f16x3, Layer1Conv, Layer1TilesSplit, true, false)
// a block's second convolution on its middle activation in 16 bits (trunktiles.cuh)
typedef spk::SlabShape<Layer1Conv, false, true> Layer1Middle;
typedef spk::SlabShape<Layer1Conv, true, true> Layer1MiddleSplit;
SPK_TRUNK_TILES(spk_trunk_layer1_middle_f16, Layer1Conv, Layer1Middle, false, true)
SPK_TRUNK_TILES(spk_trunk_layer1_middle_f16x3, Layer1Conv, Layer1MiddleSplit, true, true)
SPK_TRUNK_SHAPE(layer2_down, Layer2Down)
SPK_TRUNK_SPLIT(layer2_shortcut, Layer2Shortcut)
SPK_TRUNK_SHAPE(layer2_conv, Layer2Conv)
// the 128-wide strips' three-product entries on the sm90 tier: m64n128 warpgroup tiles
#if defined(SPK_WGMMA)
typedef spk::WideGroups<Layer3Conv> Layer3ConvSplit;
typedef spk::WideGroups<Layer4Conv> Layer4ConvSplit;
#else
typedef Layer3Conv Layer3ConvSplit;
typedef Layer4Conv Layer4ConvSplit;
#endif
SPK_TRUNK_SHAPE(layer3_down, Layer3Down)
SPK_TRUNK_SPLIT(layer3_shortcut, Layer3Shortcut)
SPK_TRUNK_CONV(spk_trunk_layer3_conv_f16, Layer3Conv, false)
SPK_TRUNK_SPLIT(layer3_conv, Layer3ConvSplit)
SPK_TRUNK_SHAPE(layer4_down, Layer4Down)
SPK_TRUNK_SPLIT(layer4_shortcut, Layer4Shortcut)
SPK_TRUNK_CONV(spk_trunk_layer4_conv_f16, Layer4Conv, false)
SPK_TRUNK_SPLIT(layer4_conv, Layer4ConvSplit)
// the strips of layers 2 to 4 converted once per block (the sm90 tier's; trunkhalves.cuh)
#define SPK_TRUNK_HALVES(SITE, SHAPE)                                                  \
    SPK_TRUNK_ENTRY(spk_trunk_##SITE##_halves_f16, SHAPE, SPK_HALVES_BODY(SHAPE, false)) \
    SPK_TRUNK_ENTRY(spk_trunk_##SITE##_halves_f16x3, SHAPE, SPK_HALVES_BODY(SHAPE, true))
SPK_TRUNK_HALVES(layer2, Layer2Conv)
SPK_TRUNK_HALVES(layer3, Layer3Conv)
SPK_TRUNK_HALVES(layer4, Layer4Conv)

// Statistics pooling of the trunk's output (pyannote's StatsPool with (batch, speakers,
// frames) weights, after TSTP's reshape): for chunk i, speaker s and feature row r of
// x [items][features][frames], with w [items][speakers][frames],
//   v1 = sum_t w + 1e-8, mean = sum_t w x / v1,
//   std = sqrt(sum_t w (x - mean)^2 / (v1 - sum_t w^2 / v1 + 1e-8)),
// into y [items][speakers][2 features]: the means, then the deviations.
// The two data sums are FP64 in a fixed order (a lane's frames in turn, then a butterfly
// over the warp), so every run gives the same bits; v1 and the denominator are the
// library's FP32 expressions over the weights' sums rounded to FP32 (with 0/1 weights
// those sums are exact, so these are the library's values: a speaker absent from the
// chunk gets 0 and 0, one active frame a deviation of 0), and the mean is rounded to
// FP32 before the centring, as the library's mean tensor is.
// Launch: grid (ceil(features / POOL_ROWS), items), blocks of POOL_THREADS; each warp
// takes the block's rows warp, warp + 8, ..., each lane the frames lane + 32 j.
constexpr u32 POOL_THREADS = 256;
constexpr u32 POOL_ROWS = 64;
constexpr u32 POOL_MAX_FRAMES = 128;
constexpr u32 POOL_MAX_SPEAKERS = 8;

extern "C" __global__ void __launch_bounds__(POOL_THREADS)
spk_trunk_stats_pool(const float* __restrict__ x, u64 x_len, const float* __restrict__ w,
                     u64 w_len, float* __restrict__ y, u64 y_len, u32 items, u32 speakers,
                     u32 features, u32 frames) {
    constexpr u32 PER_LANE = POOL_MAX_FRAMES / 32;
    __shared__ float weights[POOL_MAX_SPEAKERS][POOL_MAX_FRAMES];
    __shared__ float v1[POOL_MAX_SPEAKERS], denominator[POOL_MAX_SPEAKERS];
    const bool valid = spk::launch_is((features + POOL_ROWS - 1) / POOL_ROWS, items, 1,
                                      POOL_THREADS) &
                       (items >= 1) & (speakers >= 1) & (speakers <= POOL_MAX_SPEAKERS) &
                       (features >= 1) & (frames >= 1) & (frames <= POOL_MAX_FRAMES) &
                       (x_len == u64(items) * features * frames) &
                       (w_len == u64(items) * speakers * frames) &
                       (y_len == u64(items) * speakers * 2 * features);
    if (!valid) {
        return;  // uniform over the grid
    }
    const u32 item = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (u32 i = threadIdx.x; i < POOL_MAX_SPEAKERS * POOL_MAX_FRAMES; i += POOL_THREADS) {
        const u32 s = i / POOL_MAX_FRAMES, t = i % POOL_MAX_FRAMES;
        weights[s][t] = (s < speakers) & (t < frames)
                            ? __ldg(w + (u64(item) * speakers + s) * frames + t)
                            : 0.0f;
    }
    __syncthreads();
    if (warp < speakers) {
        double sum = 0.0, squares = 0.0;
#pragma unroll
        for (u32 j = 0; j < PER_LANE; ++j) {
            const double weight = weights[warp][lane + 32 * j];
            sum += weight;
            squares = fma(weight, weight, squares);
        }
        sum = spk::warp_sum(sum);
        squares = spk::warp_sum(squares);
        if (lane == 0) {
            const float first = float(sum) + 1e-8f;
            v1[warp] = first;
            denominator[warp] = (first - float(squares) / first) + 1e-8f;
        }
    }
    __syncthreads();
    const float* chunk = x + u64(item) * features * frames;
    float* out = y + u64(item) * speakers * 2 * features;
#pragma unroll 1
    for (u32 row = blockIdx.x * POOL_ROWS + warp; row < min(features, (blockIdx.x + 1) * POOL_ROWS);
         row += POOL_THREADS / 32) {
        double value[PER_LANE];
#pragma unroll
        for (u32 j = 0; j < PER_LANE; ++j) {
            const u32 t = lane + 32 * j;
            value[j] = t < frames ? __ldg(chunk + u64(row) * frames + t) : 0.0f;
        }
#pragma unroll 1
        for (u32 s = 0; s < speakers; ++s) {
            double sum = 0.0;
#pragma unroll
            for (u32 j = 0; j < PER_LANE; ++j) {
                sum = fma(double(weights[s][lane + 32 * j]), value[j], sum);
            }
            const float mean = float(spk::warp_sum(sum) / double(v1[s]));
            double spread = 0.0;
#pragma unroll
            for (u32 j = 0; j < PER_LANE; ++j) {
                const double centred = value[j] - double(mean);
                spread = fma(double(weights[s][lane + 32 * j]), centred * centred, spread);
            }
            spread = spk::warp_sum(spread);
            if (lane == 0) {
                out[u64(s) * 2 * features + row] = mean;
                out[u64(s) * 2 * features + features + row] =
                    float(sqrt(spread / double(denominator[s])));
            }
        }
    }
}
