"""Plans on the trunk kernels: `ConvPlan` runs one convolution, `TrunkPlan` the whole
ResNet34 trunk from the fbank to the last block's NCHW output.

The tensor-core convolutions scale each chunk's input by a power of two from its largest
magnitude (`in_max`, one FP32 bit pattern per chunk). In a trunk, the layer that writes
an activation also raises its chunks' maxima (`out_max`) into a slot of the plan's
maxima buffer, which its first launch clears; a single convolution measures its input
first (`spk_trunk_chunk_max`).

A plan uploads its folded weights, allocates what it needs and prepares every launch
once; an enqueue checks its two buffers, writes their addresses (and the chunk count)
into the prepared launches and queues them, with no allocation and no synchronization,
so it can be captured in a CUDA graph. A last batch of 1 to 31 chunks runs on the same
launches: the kernels skip the absent chunks' blocks."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Literal

import numpy as np

from pyspk.candidate.errors import DeviceUnsupported, GeometryInvalid
from pyspk.candidate.framework import launchable_kernels
from pyspk.candidate.trunk.folding import FoldedConv, TrunkWeights
from pyspk.candidate.trunk.shapes import (
    CHUNK_MAX_KERNEL,
    CLEAR_KERNEL,
    CONTEXT,
    CONV_BK,
    CONV_HALF_OUT,
    CONV_HALF_RESIDUAL,
    CONV_NCHW,
    CONV_RELU,
    CONV_TMA_BOX,
    MAXIMA_THREADS,
    OUTPUT_SHAPE,
    TILE_FRAMES,
    TILE_GROUPS,
    TILE_ROWS,
    TRUNK_BATCH,
    TRUNK_BINS,
    TRUNK_BLOCKS,
    TRUNK_FRAMES,
    TrunkSite,
)
from pyspk.cuda.buffers import INT32, DeviceBuffer, device_address
from pyspk.cuda.errors import ClosedError, InvalidArgument
from pyspk.cuda.kernels import BOUND_STREAMS, buffer_params
from pyspk.cuda.lifetime import OrderedPlanLifetime
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.math import CudaMath
from pyspk.cuda.runtime import free_after_error
from pyspk.cuda.tensormap import TENSOR_MAP_BYTES, float32_map, words_map
from pyspk.cuda.tier import PtxTier

if TYPE_CHECKING:
    from pyspk.cuda.kernels import Kernel, Launch
    from pyspk.cuda.runtime import CudaRuntime

CONV_PARAMS = (
    *buffer_params("x"),
    *buffer_params("w"),
    *buffer_params("bias"),
    *buffer_params("residual"),
    *buffer_params("y"),
    *buffer_params("in_max"),
    *buffer_params("out_max"),
    ("items", "u32"),
    ("flags", "u32"),
    ("x_map", "ptr"),
)
STEM_PARAMS = (
    *buffer_params("x"),
    *buffer_params("w"),
    *buffer_params("bias"),
    *buffer_params("y"),
    *buffer_params("out_max"),
    ("items", "u32"),
)
CLEAR_PARAMS = buffer_params("maxima")
CHUNK_MAX_PARAMS = (
    *buffer_params("x"),
    ("item_len", "u32"),
    *buffer_params("maxima"),
    ("items", "u32"),
)
FBANK_ITEM = TRUNK_FRAMES * TRUNK_BINS  # floats of one chunk's fbank
OUTPUT_ITEM = OUTPUT_SHAPE[0] * OUTPUT_SHAPE[1] * OUTPUT_SHAPE[2]


# Whether trunk plans on the sm90 tier keep layer1's middle activations (each block's
# first convolution's output) in 16 bits, the FP16 planes its second convolution lands as
# they are (`ptx/src/trunk/trunktiles.cuh`; docs/performance.md, "Layer1's middle
# activations in 16 bits").
MIDDLES_DEFAULT = True

# Whether TF32 plans on the sm90 tier also keep the outputs of layer1's first two blocks
# in those FP16 planes (each block's second convolution writes them, the next block's
# convolutions read them): yes. On an H100 the trunk took 0.187 ms a chunk against 0.200
# with a 32-bit stream, in graphs in one process, at 2.45e-4 norm-wise against float64
# (cuDNN TF32 2.89e-4; docs/performance.md, "Layer1's residual stream in 16 bits").
STREAM16_DEFAULT = True

# Whether plans run the strips of layers 2 to 4 in their halves form on the sm90 tier by
# default: not, in either math. On the H200 (docs/performance.md, "The strips' halves
# form"), with the async copy engine's copies, the FP32 halves form was 2% and 0.5%
# faster in layers 3 and 4 and 18% slower in layer2 (0.355 against 0.337 ms a chunk for
# the trunk); the TF32 one slower in all three, by 21%, 4% and 31% (0.228 against 0.210).
HALVES_DEFAULT = False


# what a layer1 convolution does with 16-bit planes: writes its output so, reads its
# input so (`MIDDLE_KERNEL`), or both ("passes")
MiddleRole = Literal["writes", "reads", "passes"]


def _check_items(items: int) -> int:
    if isinstance(items, bool) or not isinstance(items, int) or not 1 <= items <= TRUNK_BATCH:
        raise InvalidArgument(f"{CONTEXT}: items must be an int from 1 to 32, not {items!r}")
    return items


class _Uploaded:
    """One convolution's packed weight and bias (`FoldedConv.packed`, `packed_bias`) on
    the device, and its kernel (its halves form where `halves` asks and it has one).
    `middle`: the convolution writes ("writes": with its bias the bound's factors,
    `packed_bias_bounded`), reads ("reads": `MIDDLE_KERNEL`) or both ("passes") an
    activation in 16 bits."""

    def __init__(
        self,
        runtime: CudaRuntime,
        math: CudaMath,
        conv: FoldedConv,
        halves: bool = False,
        middle: MiddleRole | None = None,
    ) -> None:
        self.site = conv.site
        loaded = runtime.load_kernels(KernelModule.TRUNK)
        self.math, self.tier, self.halves = math, loaded.tier, halves
        self.writes_middle = middle in ("writes", "passes")
        self.reads_middle = middle in ("reads", "passes")
        _, _, shared = conv.site.launch(math, loaded.tier, halves, self.reads_middle)
        name = conv.site.kernel(math, loaded.tier, halves, self.reads_middle)
        (self.kernel,) = launchable_kernels(runtime.device, loaded, [name], shared)
        self.weight = runtime.upload(_packed_weight(conv, math, loaded.tier))
        try:
            bias = conv.packed_bias_bounded() if self.writes_middle else conv.packed_bias()
            self.bias = runtime.upload(bias)
        except BaseException:
            free_after_error([self.weight])
            raise

    def buffers(self) -> list[DeviceBuffer]:
        return [self.weight, self.bias]

    def launch(
        self,
        x: tuple[int, int],
        y: tuple[int, int],
        *,
        in_max: tuple[int, int] = (0, 0),
        out_max: tuple[int, int] = (0, 0),
        residual: tuple[int, int] = (0, 0),
        flags: int = 0,
        items: int = TRUNK_BATCH,
        x_map: int = 0,
    ) -> Launch:
        """A launch on (address, length) buffers, prepared now; the stem takes no
        in_max, residual, flags or x_map (a tensor map of x: `TrunkPlan`'s strips)."""
        grid, block, shared = self.site.launch(self.math, self.tier, self.halves, self.reads_middle)
        weights = [self.weight.ptr, len(self.weight), self.bias.ptr, len(self.bias)]
        if self.site is TrunkSite.STEM:
            values = [*x, *weights, *y, *out_max, items]
            return self.kernel.launch(grid, block, shared, STEM_PARAMS, values)
        values = [*x, *weights, *residual, *y, *in_max, *out_max, items, flags, x_map]
        return self.kernel.launch(grid, block, shared, CONV_PARAMS, values)


def _packed_weight(conv: FoldedConv, math: CudaMath, tier: PtxTier) -> np.ndarray:
    """`conv`'s weight in the form its kernel in `math` on `tier` reads."""
    return conv.packed(conv.site.splits(math), conv.site.on_warpgroups(tier))


def _host_threads() -> int:
    """The CPUs this process may run on (its affinity where the OS reports one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _pack_ahead(weights: TrunkWeights, math: CudaMath, tier: PtxTier) -> None:
    """Packs every convolution's weight and bias as the plan will upload them, on up to
    8 host threads: numpy's conversions and copies let go of the GIL, and one after
    another the packing was 0.09 s of the 0.36 s that accelerating a pipeline took
    (H100 host). A form packed before (another plan of the same weights) is the kept
    array (`FoldedConv.packed`)."""

    def pack(conv: FoldedConv) -> None:
        _packed_weight(conv, math, tier)
        conv.packed_bias()

    threads = min(8, _host_threads())
    if threads < 2:
        for conv in weights.convs():
            pack(conv)
        return
    with ThreadPoolExecutor(threads, "pyspk-pack") as pool:
        list(pool.map(pack, weights.convs()))  # raises what a packing raised


def _maxima_kernel(runtime: CudaRuntime, name: str) -> Kernel:
    """The clear (`CLEAR_KERNEL`) or the chunk-max (`CHUNK_MAX_KERNEL`) kernel."""
    loaded = runtime.load_kernels(KernelModule.TRUNK)
    (kernel,) = launchable_kernels(runtime.device, loaded, [name], 0)
    return kernel


def _check_tier(runtime: CudaRuntime) -> PtxTier:
    """The runtime's loaded trunk tier; refuses a closed runtime and a tier below sm80."""
    if runtime.closed:
        raise ClosedError(f"{CONTEXT}: the runtime was closed; nothing was planned")
    tier = runtime.load_kernels(KernelModule.TRUNK).tier
    if tier < PtxTier.SM80:
        raise DeviceUnsupported(
            f"{CONTEXT}: the trunk kernels need the sm80 tier (tensor cores); the "
            f"loaded {tier} tier takes the library path"
        )
    return tier


class ConvPlan(OrderedPlanLifetime):
    """One convolution of the trunk (any site, the stem included) at batch 32 chunks:
    `enqueue(x, y, residual=None, items=32, relu=..., nchw=False)` on NHWC buffers (the
    stem reads the fbank `[items, 998, 80]`). Its chunk maxima buffer serves one enqueue
    at a time, whatever the streams: each enqueue waits for the last one on the GPU
    (`StreamOrder`)."""

    def __init__(
        self, runtime: CudaRuntime, math: CudaMath, conv: FoldedConv, halves: bool | None = None
    ) -> None:
        self.tier = _check_tier(runtime)  # sm90: the strips on wgmma
        self.math = math
        self.site = conv.site
        self.halves = HALVES_DEFAULT if halves is None else halves
        self._conv = _Uploaded(runtime, math, conv, self.halves)
        try:
            self._chunk_max = _maxima_kernel(runtime, CHUNK_MAX_KERNEL)
            self._maxima = runtime.alloc_zeros(TRUNK_BATCH)  # the input's, per chunk
        except BaseException:
            free_after_error(self._conv.buffers())
            raise
        super().__init__(runtime, [*self._conv.buffers(), self._maxima], CONTEXT)
        self._ordinal = runtime.ordinal

    def enqueue(
        self,
        x: object,
        y: object,
        residual: object | None = None,
        *,
        items: int = TRUNK_BATCH,
        relu: bool = True,
        nchw: bool = False,
        stream: int | None = None,
    ) -> None:
        """x `items` chunks of the site's input, y of its output (NCHW if `nchw`, else
        NHWC), residual (NHWC, as y) added before the ReLU. Prepares its launches per
        call (the input's chunk maxima, then the convolution): for tests and single
        layers; `TrunkPlan` is the graph-friendly path."""
        items = _check_items(items)
        shape = self.site.shape
        stem = self.site is TrunkSite.STEM
        if stem and (residual is not None or nchw or not relu):
            raise InvalidArgument(f"{CONTEXT}: the stem takes no residual and always ReLUs")
        x_len = items * (FBANK_ITEM if stem else shape.x_item)
        y_len = items * shape.y_item
        x_at = device_address(x, x_len, CONTEXT, "x", self._ordinal)
        y_at = device_address(y, y_len, CONTEXT, "y", self._ordinal, writable=True)
        res = (0, 0)
        if residual is not None:
            res = (device_address(residual, y_len, CONTEXT, "residual", self._ordinal), y_len)
        flags = (CONV_RELU if relu else 0) | (CONV_NCHW if nchw else 0)
        self._acquire()
        try:
            self._check_open()
            self.runtime.note_capture_user(self)
            queue = self.runtime.stream if stream is None else stream
            ordered = self._order.before(queue)
            if stem:
                self._conv.launch((x_at, x_len), (y_at, y_len), items=items).enqueue(queue)
            else:
                maxima = (self._maxima.ptr, len(self._maxima))
                values = [x_at, x_len, shape.x_item, *maxima, items]
                grid, block = (TRUNK_BATCH, 1, 1), MAXIMA_THREADS
                self._chunk_max.launch(grid, block, 0, CHUNK_MAX_PARAMS, values).enqueue(queue)
                launch = self._conv.launch(
                    (x_at, x_len),
                    (y_at, y_len),
                    in_max=maxima,
                    residual=res,
                    flags=flags,
                    items=items,
                )
                launch.enqueue(queue)
            self._order.after(queue, ordered)
        finally:
            self._release()


class TrunkPlan(OrderedPlanLifetime):
    """The whole trunk: fbank `[items, 998, 80]` -> `[items, 256, 10, 125]`, as the
    model's `forward_frames`. Owns its folded weights, three activation buffers of 32
    chunks of the widest layer (327 MB each), one for the shortcuts (164 MB) and the
    chunk maxima; they serve one enqueue at a time: each enqueue waits for the last one
    on the GPU, whatever the streams (`StreamOrder`). Graphs that hold the plan are
    ordered by the streams they replay on: replay them in turn."""

    def __init__(
        self,
        runtime: CudaRuntime,
        math: CudaMath,
        weights: TrunkWeights,
        halves: bool | None = None,
        middles: bool | None = None,
        stream16: bool | None = None,
    ) -> None:
        self.tier = _check_tier(runtime)  # sm90: the strips on wgmma
        self.math = math
        self.halves = HALVES_DEFAULT if halves is None else halves
        # layer1's middle activations in 16 bits: the sm90 tier's tile form alone has it
        self.middles = self.tier is PtxTier.SM90 and (
            MIDDLES_DEFAULT if middles is None else middles
        )
        self.stream16 = (
            self.middles
            and math is CudaMath.TF32
            and (STREAM16_DEFAULT if stream16 is None else stream16)
        )
        if not isinstance(weights, TrunkWeights):
            raise GeometryInvalid(CONTEXT, f"weights must be TrunkWeights, not {weights!r}")
        owned: list[DeviceBuffer] = []
        try:
            _pack_ahead(weights, math, self.tier)
            uploaded = []
            # in launch order, layer1's blocks (no shortcuts) are convolutions 1 to 6
            roles: dict[int, MiddleRole] = {}
            # with the 16-bit stream, every block output but the last is planes too: a
            # block after the first reads its input so, one before the last writes so
            last = TRUNK_BLOCKS[0] - 1
            for block in range(TRUNK_BLOCKS[0]):
                roles[1 + 2 * block] = "passes" if self.stream16 and block > 0 else "writes"
                roles[2 + 2 * block] = "passes" if self.stream16 and block < last else "reads"
            for index, conv in enumerate(weights.convs()):
                role = roles.get(index) if self.middles else None
                uploaded.append(_Uploaded(runtime, math, conv, self.halves, role))
                owned += uploaded[-1].buffers()
            widest = TRUNK_BATCH * TrunkSite.LAYER1_CONV.shape.y_item
            ping = [runtime.alloc_zeros(widest) for _ in range(3)]
            owned += ping
            shortcut = runtime.alloc_zeros(TRUNK_BATCH * TrunkSite.LAYER2_SHORTCUT.shape.y_item)
            owned.append(shortcut)
            # one slot of chunk maxima per activation the stem or a 3x3 convolution
            # writes (the last one's is raised but not read)
            slots = 1 + 2 * sum(TRUNK_BLOCKS)
            maxima = runtime.alloc_zeros(slots * TRUNK_BATCH)
            owned.append(maxima)
            clear = _maxima_kernel(runtime, CLEAR_KERNEL)
            self._launches = [
                clear.launch(1, MAXIMA_THREADS, 0, CLEAR_PARAMS, [maxima.ptr, len(maxima)]),
                *self._prepare(uploaded, ping, shortcut, maxima),
            ]
            self._strips = [
                (launch, conv.site)
                for launch, conv in zip(self._launches[1:], uploaded, strict=True)
                if conv.site.copies_by_tma(math, self.tier) and not conv.reads_middle
            ]
            self._maps = _strip_maps(runtime, self._strips, math, self.tier)
            self.strips_by_tma = self._maps is not None
            if self._maps is not None:
                owned.append(self._maps)
                self._map_strips(TRUNK_BATCH)
            readers = [
                launch
                for launch, conv in zip(self._launches[1:], uploaded, strict=True)
                if conv.reads_middle
            ]
            if readers:
                owned.append(_map_middles(runtime, readers, math))
            runtime.synchronize()
        except BaseException:
            free_after_error(owned)
            raise
        super().__init__(runtime, owned, CONTEXT)
        self._ordinal = runtime.ordinal
        self._items = TRUNK_BATCH
        self._bound: dict[object, list[Callable[[], None]]] = {}

    @staticmethod
    def _prepare(
        uploaded: list[_Uploaded],
        ping: list[DeviceBuffer],
        shortcut: DeviceBuffer,
        maxima: DeviceBuffer,
    ) -> list[Launch]:
        """Every convolution's launch in order. The block input, the first
        convolution's output and the block output rotate over the three buffers, each
        with its chunk maxima's slot; the input fbank and the output are written per
        enqueue."""

        def at(buffer: DeviceBuffer) -> tuple[int, int]:
            return (buffer.ptr, len(buffer))

        slots = iter(range(maxima.ptr, maxima.ptr + len(maxima) * 4, TRUNK_BATCH * 4))

        def slot() -> tuple[int, int]:
            return (next(slots), TRUNK_BATCH)

        convs = iter(uploaded)
        current_max = slot()
        launches = [next(convs).launch((0, 0), at(ping[0]), out_max=current_max)]
        current, middle, spare = ping
        current_planes = False  # whether the block input is a block output in FP16 planes
        for conv1 in convs:
            middle_max = slot()
            flags = CONV_RELU | (CONV_HALF_OUT if conv1.writes_middle else 0)
            launches.append(
                conv1.launch(
                    at(current), at(middle), in_max=current_max, out_max=middle_max, flags=flags
                )
            )
            residual = current
            conv2 = next(convs)
            if conv2.site.is_shortcut():
                launches.append(conv2.launch(at(current), at(shortcut), in_max=current_max))
                residual, conv2 = shortcut, next(convs)
            flags = CONV_RELU | (CONV_HALF_OUT if conv2.writes_middle else 0)
            flags |= CONV_HALF_RESIDUAL if current_planes else 0
            in_max = middle_max
            # a middle reader with a 16-bit output or residual takes two in_max slots:
            # the residual's chunk maxima, then the middle's
            if conv2.reads_middle and flags & (CONV_HALF_OUT | CONV_HALF_RESIDUAL):
                assert middle_max[0] == current_max[0] + TRUNK_BATCH * 4
                in_max = (current_max[0], 2 * TRUNK_BATCH)
            current_max = slot()
            launches.append(
                conv2.launch(
                    at(middle),
                    at(spare),
                    in_max=in_max,
                    out_max=current_max,
                    residual=at(residual),
                    flags=flags,
                )
            )
            current, spare = spare, current
            current_planes = conv2.writes_middle
        last = launches[-1]
        last.set("flags", CONV_RELU | CONV_NCHW)
        return launches

    def _map_strips(self, items: int) -> None:
        """Points each strip launch at its input's tensor map for `items` chunks (at
        none where the strips are copied by threads)."""
        for index, (launch, _) in enumerate(self._strips):
            assert self._maps is not None
            at = (index * TRUNK_BATCH + items - 1) * TENSOR_MAP_BYTES
            launch.set("x_map", self._maps.ptr + at if self.strips_by_tma else 0)

    def stage_strips_by_tma(self, enabled: bool) -> None:
        """Whether the strips and layer1's slabs (`TrunkSite.copies_by_tma`) stage by the
        async copy engine (the default on the sm90 tier) or by every thread's copies, as
        the other tiers do; the outputs are the same bits. For side-by-side measurement; a graph
        captured before the change keeps the staging it captured."""
        self._acquire()
        try:
            self.strips_by_tma = enabled and bool(self._strips)
            self._map_strips(self._items)
        finally:
            self._release()

    def enqueue(
        self, x: object, y: object, *, items: int = TRUNK_BATCH, stream: int | None = None
    ) -> None:
        """x: `items` chunks' fbank `[items, 998, 80]`, y: `[items, 256, 10, 125]`, both
        float32 C-contiguous on the plan's device; queued on `stream` (an int handle) or
        the runtime's stream."""
        items = _check_items(items)
        x_at = device_address(x, items * FBANK_ITEM, CONTEXT, "x", self._ordinal)
        y_at = device_address(y, items * OUTPUT_ITEM, CONTEXT, "y", self._ordinal, writable=True)
        first, last = self._launches[1], self._launches[-1]  # after the clear
        self._acquire()
        try:
            self._check_open()
            self.runtime.note_capture_user(self)
            if items != self._items:
                for launch in self._launches[1:]:  # all but the clear
                    launch.set("items", items)
                self._map_strips(items)
                self._items = items
            first.set("x", x_at)
            first.set("x_len", items * FBANK_ITEM)
            last.set("y", y_at)
            last.set("y_len", items * OUTPUT_ITEM)
            key = stream if stream is not None else self.runtime.stream
            bound = self._bound.get(key)
            if bound is None:
                if len(self._bound) >= BOUND_STREAMS:
                    self._bound.clear()
                bound = self._bound[key] = [launch.bind(key) for launch in self._launches]
            ordered = self._order.before(key)
            for call in bound:
                call()
            self._order.after(key, ordered)
        finally:
            self._release()


def _strip_maps(
    runtime: CudaRuntime, strips: list[tuple[Launch, TrunkSite]], math: CudaMath, tier: PtxTier
) -> DeviceBuffer | None:
    """The tensor maps of each launch's input (its `x`) for 1 to TRUNK_BATCH chunks, in
    one buffer: launch i's for `items` chunks at (i * TRUNK_BATCH + items - 1) *
    TENSOR_MAP_BYTES. A strip's map is of [chunks x positions][cin] rows in boxes of
    CONV_TMA_BOX rows, the tile form's of the [chunks][hin][win][cin] image in boxes of
    a slab; past `items` chunks they read zeros, as the copies fill them. None without
    launches."""
    if not strips:
        return None
    # the launches that read one buffer in one shape (a layer's convolutions take turns
    # on three) share its maps: 29 launches' 928 are 384 encodings
    encoded = functools.cache(float32_map)
    words = []
    for launch, site in strips:
        shape, x = site.shape, launch.value("x")
        for items in range(1, TRUNK_BATCH + 1):
            if site.in_tiles(math, tier):
                image = (items, shape.hin, shape.win, shape.cin)
                slab = (1, TILE_GROUPS * TILE_ROWS + 2, TILE_FRAMES + 2, CONV_BK)
                words.append(encoded(x, image, slab))
            else:
                rows = items * shape.positions
                words.append(encoded(x, (rows, shape.cin), (CONV_TMA_BOX, CONV_BK)))
    return runtime.upload(np.concatenate(words), INT32)


def _map_middles(runtime: CudaRuntime, readers: list[Launch], math: CudaMath) -> DeviceBuffer:
    """Points each reader of a 16-bit middle activation (`MIDDLE_KERNEL`) at a tensor map
    of its input, the FP16 planes `[chunks x channel blocks x parts][2 planes][hin][win]
    [8 k]` of TRUNK_BATCH chunks as 8-byte words (two a pixel's plane), in boxes of a
    part's two planes of a slab (a block takes only its own chunks' tiles, so no map per
    chunk count), uploaded in the returned buffer."""
    shape = TrunkSite.LAYER1_CONV.shape
    parts = 2 if TrunkSite.LAYER1_CONV.splits(math) else 1
    image = (TRUNK_BATCH * shape.cin // CONV_BK * parts, 2, shape.hin, shape.win * 2)
    slab = (1, 2, TILE_GROUPS * TILE_ROWS + 2, (TILE_FRAMES + 2) * 2)
    encoded = functools.cache(words_map)  # the readers share one buffer
    maps = runtime.upload(
        np.concatenate([encoded(launch.value("x"), image, slab) for launch in readers]), INT32
    )
    for index, launch in enumerate(readers):
        launch.set("x_map", maps.ptr + index * TENSOR_MAP_BYTES)
    return maps


def plan_conv(
    runtime: CudaRuntime, math: CudaMath | str, conv: FoldedConv, *, halves: bool | None = None
) -> ConvPlan:
    """A plan of one trunk convolution (folded); `DeviceUnsupported` below the sm80
    tier. `halves`: run the strips of layers 2 to 4 in their halves form on the
    sm90 tier (`TrunkSite.in_halves`; None: `HALVES_DEFAULT`)."""
    return ConvPlan(runtime, CudaMath.parse(math), conv, halves)


def plan_trunk(
    runtime: CudaRuntime,
    math: CudaMath | str,
    weights: TrunkWeights,
    *,
    halves: bool | None = None,
    middles: bool | None = None,
    stream16: bool | None = None,
) -> TrunkPlan:
    """A plan of the whole trunk at batch 32 chunks; `DeviceUnsupported` below the sm80
    tier. `halves` as `plan_conv` takes it; `middles`: layer1's middle activations in 16
    bits on the sm90 tier (None: `MIDDLES_DEFAULT`; other tiers have no such form);
    `stream16`: in TF32 math, the outputs of layer1's first two blocks too (None:
    `STREAM16_DEFAULT`)."""
    return TrunkPlan(runtime, CudaMath.parse(math), weights, halves, middles, stream16)
