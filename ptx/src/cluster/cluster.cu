// The cluster module: scipy's `fast_linkage` (Müllner's generic algorithm, which
// `scipy.cluster.hierarchy.linkage` runs for the centroid and median methods) on one
// block, step for step, so that its dendrogram is scipy's to the bit; and the Euclidean
// distances it starts from, as scipy's `pdist` computes them.
//
// Exactness rests on three rules:
// - Every distance update is scipy's expression in its order of operations, each
//   operation rounded on its own (`__dmul_rn` and kin: the build contracts a*b+c into
//   FMAs elsewhere, which would change the bits).
// - Every scan for a nearest neighbour keeps scipy's choice among equal distances (the
//   lowest index) and its treatment of NaN (never chosen).
// - The binary heap of lower bounds is scipy's heap, operated by one thread in scipy's
//   order of calls: equal keys then leave the heap in scipy's arrangement.
// Where scipy would go on from a state it does not expect (no neighbour for a cluster,
// or a search for the closest pair that runs out of tries), the kernel stops and writes
// LINKAGE_STOPPED: the caller then runs scipy itself, which does whatever scipy does.
//
// Calling convention as in the other modules: every buffer is a pointer followed by its
// element count, scalars are 32-bit unsigned, and an entry whose lengths or launch shape
// differ from what its scalars imply returns before writing anything.

#include "common.cuh"

// One block of this many threads runs the merges. Warp 0 keeps the heap; the other
// warps update the distances (the pass) meanwhile, PASS_THREADS clusters at a time.
constexpr u32 LINKAGE_THREADS = 1024;
constexpr u32 LINKAGE_WARPS = LINKAGE_THREADS / 32;
constexpr u32 PASS_WARPS = LINKAGE_WARPS - 1;
constexpr u32 PASS_THREADS = PASS_WARPS * 32;
// The most points it takes: cluster ids fit the 16-bit live lists, and its distances (8
// bytes a pair, 17.2 GB at this count) must fit the device.
constexpr u32 LINKAGE_MAX_POINTS = 65536;
// Shared words: a pass's ballots of lowered bounds, one bit a live-list slot (the pass's
// warps in turn), or a compaction's counts of live clusters, one word per 32 slots.
constexpr u32 LINKAGE_FLAG_WORDS =
    (LINKAGE_MAX_POINTS + PASS_THREADS - 1) / PASS_THREADS * PASS_WARPS;
static_assert(LINKAGE_MAX_POINTS / 32 <= LINKAGE_FLAG_WORDS, "a compaction's words fit");
// The first scan: one warp per cluster, this many clusters per block.
constexpr u32 NEIGHBOUR_THREADS = 256;
constexpr u32 NEIGHBOUR_ROWS = 8;
static_assert(NEIGHBOUR_ROWS * 32 == NEIGHBOUR_THREADS, "one warp a row");
// The distances: one block per PDIST_TILE x PDIST_TILE pairs, one thread a pair, the
// tile's points staged PDIST_COLUMNS coordinates at a time.
constexpr u32 PDIST_TILE = 16;
constexpr u32 PDIST_THREADS = 256;
static_assert(PDIST_THREADS == PDIST_TILE * PDIST_TILE, "one thread a pair of the tile");
constexpr u32 PDIST_COLUMNS = 32;
// Status words (the caller starts the status at LINKAGE_UNRUN).
constexpr u32 LINKAGE_DONE = 0;
constexpr u32 LINKAGE_STOPPED = 1;
constexpr u32 LINKAGE_UNRUN = 2;
static_assert(LINKAGE_UNRUN != LINKAGE_DONE & LINKAGE_UNRUN != LINKAGE_STOPPED, "distinct");
// Methods, as scipy's `_hierarchy_distance_update.pxi` computes them.
constexpr u32 METHOD_CENTROID = 0;
constexpr u32 METHOD_MEDIAN = 1;
static_assert(METHOD_CENTROID + 1 == METHOD_MEDIAN, "the entry refuses method > METHOD_MEDIAN");
constexpr u32 NO_CLUSTER = 0xffffffffu;
// The top bit of a cluster's id word (ids stay below 2^17): set while it has a candidate
// and its bound equals its distance to it, d(c, neighbour[c]), which is scipy's test of
// the heap's top. A merge into y changes only the distances d(., y): the passes set the
// bit again for the clusters whose candidate is y, and y's own, cleared at the merge, is
// set when its new candidate is found. So the test reads no distance.
constexpr u32 BOUND_EXACT = 1u << 31;
static_assert(2 * LINKAGE_MAX_POINTS <= BOUND_EXACT, "ids below the flag");

namespace spk {
namespace linkage {

// The state arrays, n entries each: the heap's values (scipy's Heap.values), the lower
// bound of each cluster's nearest distance (min_dist), then the heap's key and index
// maps, cluster sizes, nearest-neighbour candidates and cluster ids, then two live lists
// (the clusters not yet merged away, ascending, one current and one a compaction writes).
// 40 bytes a cluster, in dynamic shared memory where it fits, else in the global
// workspace.
constexpr u32 STATE_BYTES_PER_CLUSTER = 40;
typedef unsigned short u16;

struct State {
    double* heap_value;
    double* bound;
    u32* key_at;
    u32* index_of;
    u32* size;
    u32* neighbour;
    u32* id;
    u16* lists;  // live list c at lists + c * n

    __device__ State(void* base, u32 n) {
        heap_value = static_cast<double*>(base);
        bound = heap_value + n;
        key_at = reinterpret_cast<u32*>(bound + n);
        index_of = key_at + n;
        size = index_of + n;
        neighbour = size + n;
        id = neighbour + n;
        lists = reinterpret_cast<u16*>(id + n);
    }
};

// Index of the pair (i, j), i < j, in the condensed matrix of n points.
__device__ __forceinline__ u64 pair_index(u64 n, u64 i, u64 j) {
    return n * i - i * (i + 1) / 2 + (j - i - 1);
}

// Where row `row` of the condensed matrix would start: pair (row, i), i > row, is at
// this index plus i.
__device__ __forceinline__ u64 row_origin(u64 n, u64 row) {
    return pair_index(n, row, row + 1) - (row + 1);
}

// The distance from a new cluster (x merged into y, nx and ny points) to cluster i, from
// d(x, i) and d(y, i): scipy's expression, its terms in d(x, y) alone formed once a merge
// (the same operations on the same values as scipy's per-cluster call).
struct MergedDistance {
    u32 method;
    int nx;  // the sizes as scipy's C ints
    int ny;
    double total;   // nx + ny
    double shared;  // centroid: nx ny d(x, y)^2 / (nx + ny); median: d(x, y)^2 / 4

    __device__ MergedDistance(u32 method_, double d_xy, u32 nx_, u32 ny_)
        : method(method_), nx(static_cast<int>(nx_)), ny(static_cast<int>(ny_)) {
        total = static_cast<double>(nx + ny);
        if (method == METHOD_MEDIAN) {
            shared = __dmul_rn(__dmul_rn(0.25, d_xy), d_xy);
        } else {  // size_x * size_y is an int product in scipy, then a double
            shared = __ddiv_rn(__dmul_rn(__dmul_rn(static_cast<double>(nx * ny), d_xy), d_xy),
                               total);
        }
    }
    __device__ __forceinline__ double operator()(double d_xi, double d_yi) const {
        if (method == METHOD_MEDIAN) {
            const double sum = __dadd_rn(__dmul_rn(d_xi, d_xi), __dmul_rn(d_yi, d_yi));
            return __dsqrt_rn(__dsub_rn(__dmul_rn(0.5, sum), shared));
        }
        const double kept =
            __dadd_rn(__dmul_rn(__dmul_rn(static_cast<double>(nx), d_xi), d_xi),
                      __dmul_rn(__dmul_rn(static_cast<double>(ny), d_yi), d_yi));
        return __dsqrt_rn(__ddiv_rn(__dsub_rn(kept, shared), total));
    }
};

// A nearest-neighbour candidate; `better` is scipy's scan order made associative: the
// smaller distance, the lower index among equals, NaN never.
struct Nearest {
    double distance;
    u32 index;
};

__device__ __forceinline__ Nearest nearest_none() {
    return {__longlong_as_double(0x7ff0000000000000ll), NO_CLUSTER};
}

__device__ __forceinline__ Nearest better(Nearest a, Nearest b) {
    const bool take = b.distance < a.distance | (b.distance == a.distance & b.index < a.index);
    return take ? b : a;
}

__device__ __forceinline__ Nearest warp_nearest(Nearest mine) {
    for (u32 offset = 16; offset > 0; offset >>= 1) {
        Nearest other;
        other.distance = __shfl_down_sync(0xffffffffu, mine.distance, offset);
        other.index = __shfl_down_sync(0xffffffffu, mine.index, offset);
        mine = better(mine, other);
    }
    return mine;
}

// scipy's Heap, run by one thread. A sift carries its element along the path and writes
// it once where it stops, where scipy swaps it with each parent or child it passes: the
// same comparisons, so the same arrangement, with the element's value in a register
// rather than read back after every swap.
struct Heap {
    State s;
    u32 count;

    __device__ __forceinline__ void place(u32 index, double value, u32 key) {
        s.heap_value[index] = value;
        s.key_at[index] = key;
        s.index_of[key] = index;
    }
    // The element (value, key), whose slot is `index`, toward the root.
    __device__ void sift_up(u32 index, double value, u32 key) {
        while (index > 0) {
            const u32 parent = (index - 1) >> 1;
            const double above = s.heap_value[parent];
            if (!(above > value)) {
                break;
            }
            place(index, above, s.key_at[parent]);
            index = parent;
        }
        place(index, value, key);
    }
    // The element (value, key), whose slot is `index`, toward the leaves.
    __device__ void sift_down(u32 index, double value, u32 key) {
        for (u32 child = 2 * index + 1; child < count; child = 2 * index + 1) {
            double below = s.heap_value[child];
            if (child + 1 < count) {
                const double right = s.heap_value[child + 1];
                if (right < below) {
                    ++child;
                    below = right;
                }
            }
            if (!(value > below)) {
                break;
            }
            place(index, below, s.key_at[child]);
            index = child;
        }
        place(index, value, key);
    }
    __device__ void sift_down(u32 index) {
        sift_down(index, s.heap_value[index], s.key_at[index]);
    }
    __device__ void change(u32 key, double value) {
        const u32 index = s.index_of[key];
        if (value < s.heap_value[index]) {
            sift_up(index, value, key);
        } else {
            sift_down(index, value, key);
        }
    }
    // scipy's: the top swapped with the last element, the heap one shorter, the new top
    // sifted down.
    __device__ void remove_min() {
        const u32 last = --count;
        const double value = s.heap_value[last];
        const u32 key = s.key_at[last];
        place(last, s.heap_value[0], s.key_at[0]);
        sift_down(0, value, key);
    }
};

// What thread 0 tells the block after looking at the heap's top.
enum Command : u32 { MERGE, RESCAN, STOP };

struct Broadcast {
    u32 command;
    u32 x;  // merged away (MERGE) or rescanned (RESCAN)
    u32 y;  // kept, now the merged cluster
    u32 nx;
    u32 ny;
    double distance;
    u32 slots;  // the live list's length after a compaction
    Nearest warp_best[LINKAGE_WARPS];
};

// Cluster `row`'s nearest live cluster of a higher index (scipy's find_min_dist), over
// the whole block and the live list's `slots`: each warp's candidate lands in warp_best.
__device__ void scan_row(const double* d, const State& s, const u16* live, u32 slots, u32 n,
                         u32 row, Broadcast& b) {
    Nearest best = nearest_none();
    const u64 start = row_origin(n, row);
    for (u32 slot = threadIdx.x; slot < slots; slot += LINKAGE_THREADS) {
        const u32 i = live[slot];
        if (i > row && s.size[i] != 0) {
            best = better(best, {d[start + i], i});
        }
    }
    best = warp_nearest(best);
    if ((threadIdx.x & 31) == 0) {
        b.warp_best[threadIdx.x >> 5] = best;
    }
}

// Warp 0: the block's candidate from warp_best (all lanes get it).
__device__ __forceinline__ Nearest block_nearest(const Broadcast& b) {
    return warp_nearest(b.warp_best[threadIdx.x & 31]);
}

// The whole block: the clusters of `from`'s `slots` still alive copied to `to` in the
// same (ascending) order; returns their count. `counts` holds a word per 32 slots: the
// flags of lowered bounds, which warp 0 may still be reading when the block arrives.
__device__ u32 compact(const State& s, const u16* from, u16* to, u32 slots, u32* counts,
                       Broadcast& b) {
    __syncthreads();
    const u32 t = threadIdx.x;
    const u32 lane = t & 31;
    const u32 rounds = (slots + LINKAGE_THREADS - 1) / LINKAGE_THREADS;
    for (u32 round = 0; round < rounds; ++round) {
        const u32 slot = round * LINKAGE_THREADS + t;
        const u32 alive = __ballot_sync(0xffffffffu, slot < slots && s.size[from[slot]] != 0);
        if (lane == 0) {
            counts[slot >> 5] = __popc(alive);
        }
    }
    __syncthreads();
    if (t < 32) {  // the words' counts into their first slots' places in `to`
        u32 carry = 0;
        for (u32 word = 0; word < rounds * LINKAGE_WARPS; word += 32) {
            const u32 count = counts[word + lane];
            u32 sum = count;
            for (u32 offset = 1; offset < 32; offset <<= 1) {
                const u32 below = __shfl_up_sync(0xffffffffu, sum, offset);
                sum += lane >= offset ? below : 0;
            }
            counts[word + lane] = carry + sum - count;
            carry += __shfl_sync(0xffffffffu, sum, 31);
        }
        if (t == 0) {
            b.slots = carry;
        }
    }
    __syncthreads();
    for (u32 round = 0; round < rounds; ++round) {
        const u32 slot = round * LINKAGE_THREADS + t;
        const bool mine = slot < slots && s.size[from[slot]] != 0;
        const u32 alive = __ballot_sync(0xffffffffu, mine);
        if (mine) {
            to[counts[slot >> 5] + __popc(alive & ((1u << lane) - 1))] = from[slot];
        }
    }
    __syncthreads();
    return b.slots;
}

}  // namespace linkage
}  // namespace spk

using namespace spk::linkage;

// neighbour[x], bound[x] = the nearest cluster above x and its distance, every cluster a
// single point (scipy's first pass). Launch: one warp per x < n - 1, NEIGHBOUR_ROWS a
// block, grid ceil((n - 1) / NEIGHBOUR_ROWS) of NEIGHBOUR_THREADS. The arrays are the
// global workspace's, laid out as State.
extern "C" __global__ void __launch_bounds__(NEIGHBOUR_THREADS)
spk_linkage_neighbours(const double* __restrict__ d, u64 d_len, u32* __restrict__ work,
                       u64 work_len, u32 n) {
    const u64 pairs = static_cast<u64>(n) * (n - 1) / 2;
    const u32 rows = (n - 1 + NEIGHBOUR_ROWS - 1) / NEIGHBOUR_ROWS;
    if (!spk::launch_is(rows, 1, 1, NEIGHBOUR_THREADS) | n < 2 | d_len != pairs |
        work_len != static_cast<u64>(n) * STATE_BYTES_PER_CLUSTER / 4) {
        return;
    }
    const State s(work, n);
    const u32 row = blockIdx.x * NEIGHBOUR_ROWS + (threadIdx.x >> 5);
    if (row >= n - 1) {
        return;
    }
    const u64 start = row_origin(n, row);
    Nearest best = nearest_none();
    for (u32 i = row + 1 + (threadIdx.x & 31); i < n; i += 32) {
        best = better(best, {__ldg(d + start + i), i});
    }
    best = warp_nearest(best);
    if ((threadIdx.x & 31) == 0) {
        s.neighbour[row] = best.index;
        s.bound[row] = best.distance;
    }
}

// The merges, after spk_linkage_neighbours: z[k] = (the lower id, the higher id, their
// distance, the merged size) for k < n - 1, as scipy's linkage matrix; d is overwritten.
// status[0] = LINKAGE_DONE, or LINKAGE_STOPPED where scipy must take over. Launch: one
// block of LINKAGE_THREADS; dynamic shared memory n * STATE_BYTES_PER_CLUSTER bytes to
// keep the state there (`in_shared` 1), else none (`in_shared` 0, the state stays in
// `work`).
extern "C" __global__ void __launch_bounds__(LINKAGE_THREADS, 1)
spk_linkage_merge(double* d, u64 d_len, u32* work, u64 work_len, double* __restrict__ z,
                  u64 z_len, u32* __restrict__ status, u64 status_len, u32 n, u32 method,
                  u32 in_shared) {
    extern __shared__ double dynamic[];
    __shared__ Broadcast b;
    __shared__ u32 flagged[LINKAGE_FLAG_WORDS];  // lowered bounds; a compaction's counts
    const u64 pairs = static_cast<u64>(n) * (n - 1) / 2;
    const u64 state_words = static_cast<u64>(n) * STATE_BYTES_PER_CLUSTER / 4;
    u32 shared_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(shared_bytes));
    const u32 wanted = in_shared ? n * STATE_BYTES_PER_CLUSTER : 0;
    if (!spk::launch_is(1, 1, 1, LINKAGE_THREADS) | n < 2 |
        n > LINKAGE_MAX_POINTS | method > METHOD_MEDIAN | in_shared > 1 |
        d_len != pairs | work_len != state_words | z_len != 4ull * (n - 1) | status_len != 1 |
        shared_bytes != wanted) {
        return;
    }
    const u32 t = threadIdx.x;
    const u32 lane = t & 31;
    const u32 warp = t >> 5;
    const State global_state(work, n);
    const State s(in_shared ? static_cast<void*>(dynamic) : static_cast<void*>(work), n);
    for (u32 i = t; i < n; i += LINKAGE_THREADS) {
        const double bound = i < n - 1 ? global_state.bound[i] : 0.0;
        const u32 neighbour = i < n - 1 ? global_state.neighbour[i] : NO_CLUSTER;
        s.bound[i] = bound;
        s.neighbour[i] = neighbour;
        s.heap_value[i] = bound;
        s.key_at[i] = i;
        s.index_of[i] = i;
        s.size[i] = 1;
        // the bounds are the first scan's distances; a point with no candidate (its
        // distances NaN) is rescanned when it comes to the top, and stops the kernel if
        // it still has none
        s.id[i] = neighbour != NO_CLUSTER ? i | BOUND_EXACT : i;
        s.lists[i] = static_cast<u16>(i);
    }
    __syncthreads();
    Heap heap{s, n - 1};  // used by thread 0 only
    bool stop = false;    // thread 0: a scan found no neighbour (NaN distances)
    if (t == 0) {
        for (u32 i = (n - 1) / 2; i-- > 0;) {
            heap.sift_down(i);
        }
    }
    // The passes run over the live list: ascending, so its slots keep scipy's order of
    // clusters, and compacted into the other list once a quarter of it has merged away
    // (every thread keeps the same `slots` and `current`: the list at lists + current).
    u32 slots = n;
    u32 current = 0;
    for (u32 k = 0; k < n - 1; ++k) {
        if (4 * (slots - (n - k)) > slots) {
            const u32 other = current == 0 ? n : 0;
            slots = compact(s, s.lists + current, s.lists + other, slots, flagged, b);
            current = other;
        }
        const u16* live = s.lists + current;
        // the closest pair: the heap's top once its bound is exact
        for (u32 tries = 0;; ++tries) {
            if (t == 0) {
                const u32 x = s.key_at[0];
                const double distance = s.heap_value[0];
                const u32 y = s.neighbour[x];
                const u32 id_x = s.id[x];
                b.x = x;
                if (stop | tries == n - k) {
                    b.command = STOP;
                } else if (id_x & BOUND_EXACT) {  // distance == d(x, y)
                    const u32 nx = s.size[x];
                    const u32 ny = s.size[y];
                    const u32 id_y = s.id[y] & ~BOUND_EXACT;
                    double* row = z + 4ull * k;
                    row[0] = static_cast<double>(min(id_x & ~BOUND_EXACT, id_y));
                    row[1] = static_cast<double>(max(id_x & ~BOUND_EXACT, id_y));
                    row[2] = distance;
                    row[3] = static_cast<double>(nx + ny);
                    s.size[x] = 0;
                    s.size[y] = nx + ny;
                    s.id[y] = n + k;  // its flag set again with its new candidate
                    b.command = MERGE;
                    b.y = y;
                    b.nx = nx;
                    b.ny = ny;
                    b.distance = distance;
                } else {
                    b.command = RESCAN;
                }
            }
            __syncthreads();
            const u32 command = b.command;
            if (command == STOP) {
                if (t == 0) {
                    *status = LINKAGE_STOPPED;
                }
                return;
            }
            if (command == MERGE) {
                break;
            }
            const u32 x = b.x;
            scan_row(d, s, live, slots, n, x, b);
            __syncthreads();
            if (t < 32) {
                const Nearest best = block_nearest(b);
                if (t == 0) {
                    stop = best.index == NO_CLUSTER;
                    s.neighbour[x] = best.index;
                    s.bound[x] = best.distance;
                    if (best.index != NO_CLUSTER) {
                        s.id[x] |= BOUND_EXACT;
                    }
                    heap.change(x, best.distance);
                }
            }
        }
        // Warp 0 takes x off the heap while the other warps update the merged cluster's
        // distances, the candidates that pointed at x, the bounds it lowers (flagged for
        // the heap) and its own nearest cluster above it: the heap's arrays are not theirs.
        const u32 x = b.x;
        const u32 y = b.y;
        const u32 passes = (slots + PASS_THREADS - 1) / PASS_THREADS;
        if (warp == 0) {
            if (t == 0) {
                heap.remove_min();
                b.warp_best[0] = nearest_none();
            }
        } else {
            const MergedDistance merged_distance(method, b.distance, b.nx, b.ny);
            Nearest best = nearest_none();
            for (u32 pass = 0; pass < passes; ++pass) {
                const u32 slot = pass * PASS_THREADS + t - 32;
                const u32 i = slot < slots ? live[slot] : y;
                bool lowered = false;
                if (i != y && s.size[i] != 0) {
                    const u64 at_y = i < y ? pair_index(n, i, y) : pair_index(n, y, i);
                    const u64 at_x = i < x ? pair_index(n, i, x) : pair_index(n, x, i);
                    const double merged = merged_distance(d[at_x], d[at_y]);
                    d[at_y] = merged;
                    if (i < x && s.neighbour[i] == x) {
                        s.neighbour[i] = y;
                    }
                    if (i < y && merged < s.bound[i]) {
                        s.neighbour[i] = y;
                        s.bound[i] = merged;
                        lowered = true;
                    }
                    if (i > y) {
                        best = better(best, {merged, i});
                    }
                    if (s.neighbour[i] == y) {  // d(i, y) is new
                        const u32 id = s.id[i] & ~BOUND_EXACT;
                        s.id[i] = s.bound[i] == merged ? id | BOUND_EXACT : id;
                    }
                }
                // a slot's bit at slot % 32 of word slot / 32 (a pass's warps in turn)
                const u32 ballot = __ballot_sync(0xffffffffu, lowered);
                if (lane == 0) {
                    flagged[slot >> 5] = ballot;
                }
            }
            best = warp_nearest(best);
            if (lane == 0) {
                b.warp_best[warp] = best;
            }
        }
        __syncthreads();
        if (t < 32) {
            // the lowered bounds into the heap in scipy's order (ascending cluster), then
            // y's nearest cluster
            const u32 words = passes * PASS_WARPS;
            for (u32 group = 0; group < words; group += 32) {
                const u32 mine = group + lane < words ? flagged[group + lane] : 0;
                u32 groups = __ballot_sync(0xffffffffu, mine != 0);
                while (groups != 0) {
                    const u32 g = __ffs(groups) - 1;
                    groups &= groups - 1;
                    u32 bits = __shfl_sync(0xffffffffu, mine, g);
                    if (t == 0) {
                        for (; bits != 0; bits &= bits - 1) {
                            const u32 i = live[(group + g) * 32 + __ffs(bits) - 1];
                            heap.change(i, s.bound[i]);
                        }
                    }
                }
            }
            const Nearest nearest = block_nearest(b);
            if (t == 0 && y < n - 1) {
                stop = nearest.index == NO_CLUSTER;
                s.neighbour[y] = nearest.index;
                s.bound[y] = nearest.distance;
                if (nearest.index != NO_CLUSTER) {
                    s.id[y] |= BOUND_EXACT;
                }
                heap.change(y, nearest.distance);
            }
        }
    }
    if (t == 0) {
        *status = LINKAGE_DONE;
    }
}

// d[pair (i, j)] = the Euclidean distance of points i < j, rows of the (n, dims) matrix
// `points`, as scipy's `pdist(points, "euclidean")` computes it: the squared
// differences summed coordinate after coordinate from zero, each operation rounded on
// its own (no FMA), then the square root. Launch: grid (tiles, tiles) of PDIST_THREADS,
// tiles = ceil(n / PDIST_TILE); block (x, y) takes points j of tile x and i of tile y,
// and the tiles below the diagonal (no pair i < j) return at once.
extern "C" __global__ void __launch_bounds__(PDIST_THREADS)
spk_pdist_euclidean(const double* __restrict__ points, u64 points_len, double* __restrict__ d,
                    u64 d_len, u32 n, u32 dims) {
    __shared__ double tile_i[PDIST_TILE][PDIST_COLUMNS + 1];  // +1: rows on other banks
    __shared__ double tile_j[PDIST_TILE][PDIST_COLUMNS + 1];
    const u32 tiles = (n + PDIST_TILE - 1) / PDIST_TILE;
    if (!spk::launch_is(tiles, tiles, 1, PDIST_THREADS) | n < 2 | dims < 1 |
        points_len != static_cast<u64>(n) * dims | d_len != static_cast<u64>(n) * (n - 1) / 2 |
        blockIdx.x < blockIdx.y) {
        return;  // the same for the whole block: no barrier is split
    }
    const u32 first_i = blockIdx.y * PDIST_TILE;
    const u32 first_j = blockIdx.x * PDIST_TILE;
    const u32 tx = threadIdx.x % PDIST_TILE;
    const u32 ty = threadIdx.x / PDIST_TILE;
    double sum = 0.0;
    for (u32 column = 0; column < dims; column += PDIST_COLUMNS) {
        const u32 width = min(PDIST_COLUMNS, dims - column);
        for (u32 k = threadIdx.x; k < PDIST_TILE * PDIST_COLUMNS; k += PDIST_THREADS) {
            const u32 row = k / PDIST_COLUMNS;
            const u32 c = k % PDIST_COLUMNS;
            const u32 i = first_i + row;
            const u32 j = first_j + row;
            const bool inside = c < width;
            tile_i[row][c] =
                inside & i < n ? __ldg(points + static_cast<u64>(i) * dims + column + c) : 0.0;
            tile_j[row][c] =
                inside & j < n ? __ldg(points + static_cast<u64>(j) * dims + column + c) : 0.0;
        }
        __syncthreads();
        for (u32 c = 0; c < width; ++c) {
            const double difference = __dsub_rn(tile_i[ty][c], tile_j[tx][c]);
            sum = __dadd_rn(sum, __dmul_rn(difference, difference));
        }
        __syncthreads();
    }
    const u32 i = first_i + ty;
    const u32 j = first_j + tx;
    if (i < j & j < n) {
        d[pair_index(n, i, j)] = __dsqrt_rn(sum);
    }
}
