"""Trunk plans on the fake driver: the launch sequence (kernels, grids, shared bytes,
the buffer rotation of the blocks, the chunk maxima's slots, the fused epilogues),
partial batches, the enqueue's checks and the tier refusal."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from pyspk.candidate.trunk import (
    OUTPUT_SHAPE,
    TRUNK_BATCH,
    TRUNK_BINS,
    TRUNK_FRAMES,
    FoldedConv,
    TrunkSite,
    TrunkWeights,
    plan_conv,
    plan_trunk,
)
from pyspk.candidate.trunk.plan import (
    CHUNK_MAX_PARAMS,
    CLEAR_PARAMS,
    CONV_PARAMS,
    STEM_PARAMS,
)
from pyspk.candidate.trunk.shapes import CONV_NCHW, CONV_RELU
from pyspk.cuda.math import CudaMath
from pyspk.cuda.tier import PtxTier
from pyspk.errors import BufferLengthError, ClosedError, DeviceUnsupported, InvalidArgument

FBANK = TRUNK_FRAMES * TRUNK_BINS
OUTPUT = int(np.prod(OUTPUT_SHAPE))


@pytest.fixture(scope="module")
def weights() -> TrunkWeights:
    return TrunkWeights.random(0)


def params(launch: tuple, names: tuple) -> dict[str, int]:
    """The parameter values a fake launch received, by name."""
    pointers = ctypes.cast(launch[5], ctypes.POINTER(ctypes.c_void_p))
    values = {}
    for index, (name, kind) in enumerate(names):
        ctype = ctypes.c_uint32 if kind == "u32" else ctypes.c_uint64
        values[name] = ctypes.cast(pointers[index], ctypes.POINTER(ctype))[0]
    return values


def trunk_launches(
    fake, runtime, math, weights, items=TRUNK_BATCH, halves=None, middles=None, stream16=None
):
    plan = plan_trunk(runtime, math, weights, halves=halves, middles=middles, stream16=stream16)
    x = runtime.alloc_zeros(items * FBANK)
    y = runtime.alloc_zeros(items * OUTPUT)
    before = len(fake.launches)
    plan.enqueue(x, y, items=items)
    return plan, x, y, fake.launches[before:]


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_the_trunk_is_a_clear_and_36_convolutions_in_block_order(
    fake, runtime, weights, math
) -> None:
    plan, x, y, launches = trunk_launches(fake, runtime, math, weights)
    clear, launches = launches[0], launches[1:]
    assert clear[0] == "fn:spk_trunk_clear" and clear[1:3] == ((1, 1, 1), (256, 1, 1))
    maxima = params(clear, CLEAR_PARAMS)
    assert maxima["maxima_len"] == 33 * 32  # the stem's slot and two per block
    expected = [conv.site for conv in weights.convs()]
    assert len(launches) == len(expected) == 36
    assert [launch[0] for launch in launches] == [f"fn:{site.kernel(math)}" for site in expected]
    for launch, site in zip(launches, expected, strict=True):
        grid, threads, shared = site.launch()
        assert launch[1:4] == (grid, (threads, 1, 1), shared)
        if site is not TrunkSite.STEM:
            # the weight words the kernel checks: high and low pairs, or high alone
            shape, given = site.shape, params(launch, CONV_PARAMS)
            words = shape.k * shape.cout // (1 if site.splits(math) else 2)
            assert (given["w_len"], given["bias_len"]) == (words, 2 * shape.cout)
    # TF32 math runs one product except on the shortcuts
    assert any(not site.splits(math) for site in expected) == (math is CudaMath.TF32)
    stem = params(launches[0], STEM_PARAMS)
    assert (stem["x"], stem["x_len"], stem["items"]) == (x.ptr, 32 * FBANK, 32)
    convs = [params(launch, CONV_PARAMS) for launch in launches[1:]]
    # every block's input feeds its first convolution and its shortcut (or is the
    # residual); the first convolution's output feeds the second
    # and each reads the chunk maxima of its input from the slot its producer raised
    current, current_max = stem["y"], stem["out_max"]
    slots = [current_max]
    index = 0
    for block in weights.blocks:
        first = convs[index]
        assert first["x"] == current and first["flags"] == CONV_RELU and first["residual_len"] == 0
        assert first["in_max"] == current_max
        index += 1
        residual = current
        if block.shortcut is not None:
            shortcut = convs[index]
            assert shortcut["x"] == current and shortcut["flags"] == 0
            assert (shortcut["in_max"], shortcut["out_max_len"]) == (current_max, 0)
            residual = shortcut["y"]
            index += 1
        second = convs[index]
        assert second["x"] == first["y"] and second["residual"] == residual
        assert second["y"] not in (current, first["y"], residual)
        assert second["in_max"] == first["out_max"]
        current, current_max = second["y"], second["out_max"]
        slots += [first["out_max"], second["out_max"]]
        index += 1
    assert slots == [maxima["maxima"] + 4 * 32 * slot for slot in range(33)]
    assert all(c["in_max_len"] == 32 for c in convs)
    assert convs[-1]["flags"] == CONV_RELU | CONV_NCHW
    assert (convs[-1]["y"], convs[-1]["y_len"]) == (y.ptr, 32 * OUTPUT)
    assert all(c["flags"] == CONV_RELU for c in convs[:-1] if c["residual_len"])
    plan.close()


def test_a_partial_batch_sets_the_count_in_every_launch(fake, runtime, weights) -> None:
    plan, _, _, launches = trunk_launches(fake, runtime, CudaMath.TF32, weights, items=5)
    launches = launches[1:]  # after the clear, which clears every slot
    assert params(launches[0], STEM_PARAMS)["items"] == 5
    assert {params(launch, CONV_PARAMS)["items"] for launch in launches[1:]} == {5}
    assert params(launches[-1], CONV_PARAMS)["y_len"] == 5 * OUTPUT
    plan.close()


def test_enqueue_checks_before_launching(fake, runtime, weights) -> None:
    plan = plan_trunk(runtime, CudaMath.FP32, weights)
    x = runtime.alloc_zeros(2 * FBANK)
    y = runtime.alloc_zeros(2 * OUTPUT)
    before = len(fake.launches)
    with pytest.raises(BufferLengthError):
        plan.enqueue(x, y)  # 32 chunks asked of buffers of 2
    for items in (0, 33, 2.0, True):
        with pytest.raises(InvalidArgument, match="items"):
            plan.enqueue(x, y, items=items)
    assert len(fake.launches) == before
    plan.close()
    plan.close()
    with pytest.raises(ClosedError):
        plan.enqueue(x, y, items=2)


@pytest.mark.parametrize("single", [False, True], ids=["trunk", "convolution"])
def test_an_enqueue_on_another_stream_waits_for_the_last(fake, runtime, weights, single) -> None:
    """The plan's buffers serve one enqueue at a time on the GPU: every enqueue after the
    first waits for the event recorded after the last one, on its own stream too (stream
    handles are not unique: every thread's per-thread default stream shares one); one
    into a capturing stream neither waits nor records; `close()` destroys the event."""
    if single:
        shape = TrunkSite.LAYER2_DOWN.shape
        conv = FoldedConv.of(
            TrunkSite.LAYER2_DOWN, np.ones(shape.weight_shape), np.zeros(shape.cout)
        )
        plan = plan_conv(runtime, CudaMath.FP32, conv)
        x = runtime.alloc_zeros(TRUNK_BATCH * shape.x_item)
        y = runtime.alloc_zeros(TRUNK_BATCH * shape.y_item)
    else:
        plan = plan_trunk(runtime, CudaMath.FP32, weights)
        x = runtime.alloc_zeros(TRUNK_BATCH * FBANK)
        y = runtime.alloc_zeros(TRUNK_BATCH * OUTPUT)
    (event,) = fake.events
    one, two, capturing = 0x51, 0x52, 0x53
    fake.event_calls.clear()
    plan.enqueue(x, y, stream=one)
    plan.enqueue(x, y, stream=one)
    plan.enqueue(x, y, stream=two)
    fake.capturing[capturing] = []
    plan.enqueue(x, y, stream=capturing)
    plan.enqueue(x, y, stream=one)
    assert fake.event_calls == [
        ("record", event, one),
        ("wait", one, event),
        ("record", event, one),
        ("wait", two, event),
        ("record", event, two),
        ("wait", one, event),
        ("record", event, one),
    ]
    del fake.capturing[capturing]
    plan.close()
    assert fake.events == set()


def test_the_sm75_tier_refuses(fake, weights) -> None:
    from pyspk.cuda import CudaRuntime

    with (
        CudaRuntime(0, ptx_tier=PtxTier.SM75) as sm75,
        pytest.raises(DeviceUnsupported, match="sm80 tier"),
    ):
        plan_trunk(sm75, CudaMath.FP32, weights)


def test_every_site_has_both_kernels() -> None:
    names = {site.kernel(math) for site in TrunkSite for math in CudaMath}
    # the stem's one SIMT kernel serves both maths, the shortcuts' three-product ones too
    assert len(names) == 18


def test_a_single_convolution_measures_its_input_first(fake, runtime, monkeypatch) -> None:
    from pyspk.cuda.kernels import Kernel

    kept = []  # the plan's launches live for one enqueue; the fake keeps their addresses
    prepare = Kernel.launch
    monkeypatch.setattr(Kernel, "launch", lambda *a, **k: kept.append(prepare(*a, **k)) or kept[-1])
    site = TrunkSite.LAYER2_DOWN
    shape = site.shape
    conv = FoldedConv.of(site, np.ones(shape.weight_shape), np.zeros(shape.cout))
    x = runtime.alloc_zeros(3 * shape.x_item)
    y = runtime.alloc_zeros(3 * shape.y_item)
    with plan_conv(runtime, CudaMath.FP32, conv) as plan:
        before = len(fake.launches)
        plan.enqueue(x, y, items=3)
        chunk_max, launch = fake.launches[before:]
    assert chunk_max[0] == "fn:spk_trunk_chunk_max" and chunk_max[1:3] == ((32, 1, 1), (256, 1, 1))
    measured = params(chunk_max, CHUNK_MAX_PARAMS)
    assert (measured["x"], measured["item_len"], measured["items"]) == (x.ptr, shape.x_item, 3)
    values = params(launch, CONV_PARAMS)
    assert (values["in_max"], values["in_max_len"]) == (measured["maxima"], 32)
    assert (values["out_max_len"], values["items"]) == (0, 3)


def test_layer1_runs_its_tile_form_on_the_sm90_tier() -> None:
    """The 2D-tile form serves layer1's convolutions on sm90 alone, in both maths; every
    other site and tier keeps its kernel and launch (but the sm90 strips' deeper copy
    ring, and the 128-wide strips' two warpgroups in FP32 math, below)."""
    from pyspk.candidate.trunk.shapes import TILES_KERNEL

    layer1 = TrunkSite.LAYER1_CONV
    for math in CudaMath:
        suffix = "f16x3" if math is CudaMath.FP32 else "f16"
        assert layer1.kernel(math, PtxTier.SM90) == f"{TILES_KERNEL}_{suffix}"
        assert layer1.launch(math, PtxTier.SM90) == layer1.shape.tile_launch(layer1.splits(math))
        # 32 chunks of 80 rows in tiles of 4 rows x 64 frames (16 runs a row), 8 a block
        (grid, _, _), threads, shared = layer1.launch(math, PtxTier.SM90)
        assert (grid, threads) == (32 * 20 * 16 // 8, 128)
        assert 2 * (shared + 1024) <= 228 * 1024  # two blocks an SM on the H200
    for site in TrunkSite:
        for math in CudaMath:
            for tier in (None, PtxTier.SM80, PtxTier.SM90):
                if site is layer1 and tier is PtxTier.SM90:
                    continue
                assert site.kernel(math, tier) == site.kernel(math)
                grid, threads, shared = site.launch(math, tier)
                wide_split = site.shape.strip and site.shape.block_channels == 128
                if tier is PtxTier.SM90 and math is CudaMath.FP32 and wide_split:
                    # layers 3 and 4: two warpgroups of m64n128 tiles, one block an SM
                    assert (grid, threads) == (site.launch()[0], 256)
                else:
                    assert (grid, threads) == site.launch()[:2]
                if not (tier is PtxTier.SM90 and site.on_warpgroups(tier)):
                    assert shared == site.launch()[2]


def test_the_sm90_rings_as_deep_as_their_blocks_fit() -> None:
    """On the sm90 tier the strips 64 wide ring three slots in both maths, the 128-wide
    four in TF32 math and two in FP32 (what measured fastest), the stride-2 3x3s five
    (64 wide) and six (four to six measured alike); each launch's blocks an SM (two of
    256 threads, one of 512) fit the H200's 227 KB; the sm80 tier keeps two slots in the
    strips, three elsewhere."""
    wide = {TrunkSite("layer3_conv"), TrunkSite("layer4_conv")}
    downs = {TrunkSite(f"layer{layer}_down"): 5 if layer == 2 else 6 for layer in (2, 3, 4)}
    for site in (TrunkSite("layer2_conv"), *wide, *downs):
        for math in CudaMath:
            _, threads, shared = site.launch(math, PtxTier.SM90)
            slot = site.shape.shared // site.shape.stages
            slots = (2 if site.splits(math) else 4) if site in wide else downs.get(site, 3)
            assert shared == slots * slot
            assert 512 // threads * (shared + 1024) <= 227 * 1024
            assert site.launch(math, PtxTier.SM80)[2] == (3 if site in downs else 2) * slot


@pytest.fixture
def hopper(fake, monkeypatch):
    """The fake device as compute capability 9.0 (the sm90 tier)."""
    attribute = fake.cuDeviceGetAttribute

    def hopper(which, device):
        status, value = attribute(which, device)
        major, minor = (
            fake.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            fake.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        )
        return (status, {major: 9, minor: 0}.get(which, value))

    monkeypatch.setattr(fake, "cuDeviceGetAttribute", hopper)
    monkeypatch.setattr(fake, "shared_optin", 232448)  # an sm_90's 227 KiB a block
    return fake


def test_a_trunk_plan_on_the_sm90_tier_launches_the_tile_form(hopper, weights) -> None:
    """On compute capability 9.0 the plan loads the sm90 tier and launches layer1's six
    convolutions on the tile form with its geometry, in both maths (with its middle
    activations in FP32: the 16-bit form's launches are checked below)."""
    from pyspk.cuda import CudaRuntime

    fake = hopper
    layer1 = TrunkSite.LAYER1_CONV
    with CudaRuntime(0) as runtime:
        for math in CudaMath:
            _, _, _, launches = trunk_launches(fake, runtime, math, weights, middles=False)
            ours = [launch for launch in launches if "layer1" in launch[0]]
            grid, threads, shared = layer1.launch(math, PtxTier.SM90)
            assert len(ours) == 6
            assert all(launch[0] == f"fn:{layer1.kernel(math, PtxTier.SM90)}" for launch in ours)
            assert all(launch[1:4] == (grid, (threads, 1, 1), shared) for launch in ours)


@pytest.mark.parametrize("halves", [False, True], ids=["strips", "halves"])
@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_the_sm90_strips_get_tensor_maps_of_their_inputs(hopper, weights, math, halves) -> None:
    """On the sm90 tier each stride-1 3x3 past layer1 (23 launches, in either form) takes
    a tensor map of its input, [items x positions][cin] floats in boxes of 86 rows of CONV_BK
    channels, and each of layer1's six tile-form launches one of its input image,
    [items][hin][win][cin], in boxes of a slab; a partial batch points them at the maps
    for its chunks; the other launches take none (x_map 0: the kernels copy by
    cp.async)."""
    from pyspk.candidate.trunk.plan import CONV_PARAMS
    from pyspk.candidate.trunk.shapes import CONV_BK, CONV_TMA_BOX, TILE_FRAMES, TILE_ROWS
    from pyspk.cuda import CudaRuntime
    from pyspk.cuda.buffers import INT32

    fake = hopper
    with CudaRuntime(0) as runtime:
        for items in (TRUNK_BATCH, 5):
            # the plan held: its launches' parameters live in it
            plan, _, _, launches = trunk_launches(
                fake, runtime, math, weights, items=items, halves=halves, middles=False
            )
            convs = [launch for launch in launches if "clear" not in launch[0]]
            mapped = {"strips": 0, "tiles": 0}
            for launch in convs:
                values = params(launch, CONV_PARAMS) if "stem" not in launch[0] else {}
                site = next(
                    (
                        s
                        for s in TrunkSite
                        if launch[0] == f"fn:{s.kernel(math, PtxTier.SM90, halves)}"
                    ),
                    None,
                )
                if site is None or not site.copies_by_tma(math, PtxTier.SM90):
                    assert values.get("x_map", 0) == 0
                    continue
                words = list(runtime.read(values["x_map"], 32, None, INT32).view(np.uint64))
                shape, x = site.shape, values["x"]
                if site.in_tiles(math, PtxTier.SM90):
                    mapped["tiles"] += 1
                    row, image = shape.cin * 4, shape.cin * 4 * shape.win
                    assert words[:14] == [
                        7, 4, x, shape.cin, shape.win, shape.hin, items,
                        row, image, image * shape.hin,
                        CONV_BK, TILE_FRAMES + 2, TILE_ROWS + 2, 1,
                    ]  # fmt: skip
                else:
                    mapped["strips"] += 1
                    rows = items * shape.positions
                    assert words[:11] == [
                        7, 2, x, shape.cin, rows, shape.cin * 4,
                        CONV_BK, CONV_TMA_BOX, 1, 1, 0,
                    ]  # fmt: skip
            assert mapped == {"strips": 23, "tiles": 6}
            plan.close()


def test_the_strips_copied_by_threads_take_no_tensor_map(hopper, weights) -> None:
    """`stage_strips_by_tma(False)` sends every strip back to the threads' copies (x_map
    0), and True to its map again."""
    from pyspk.candidate.trunk.plan import CONV_PARAMS
    from pyspk.cuda import CudaRuntime

    fake = hopper

    def strip_maps(plan, x, y) -> list[int]:
        before = len(fake.launches)
        plan.enqueue(x, y)
        strips = [launch for launch in fake.launches[before:] if "_conv_" in launch[0]]
        return [params(launch, CONV_PARAMS)["x_map"] for launch in strips]

    with CudaRuntime(0) as runtime:
        plan, x, y, _ = trunk_launches(fake, runtime, CudaMath.TF32, weights)
        assert plan.strips_by_tma and all(strip_maps(plan, x, y))
        plan.stage_strips_by_tma(False)
        assert not plan.strips_by_tma and not any(strip_maps(plan, x, y))
        plan.stage_strips_by_tma(True)
        assert all(strip_maps(plan, x, y))
        plan.close()


def test_the_strips_of_layers_2_to_4_have_a_halves_form_in_both_maths_on_sm90() -> None:
    """Asked for, the halves form serves the strips of layers 2 to 4 on sm90 alone, in
    either math (FP32: `_f16x3`, high and low operands; TF32: `_f16`, high ones), with
    the strip form's grid and blocks, and as many blocks an SM of an H200 as the strip
    form has (one for layers 3 and 4, two for layer2); every other site and tier keeps
    its kernel and launch."""
    sites = {TrunkSite.LAYER2_CONV: 2, TrunkSite.LAYER3_CONV: 3, TrunkSite.LAYER4_CONV: 4}
    for site, layer in sites.items():
        for math, suffix, parts in ((CudaMath.FP32, "f16x3", 2), (CudaMath.TF32, "f16", 1)):
            assert site.in_halves(math, PtxTier.SM90, True)
            assert (
                site.kernel(math, PtxTier.SM90, True) == f"spk_trunk_layer{layer}_halves_{suffix}"
            )
            grid, threads, shared = site.launch(math, PtxTier.SM90, True)
            assert (grid, threads) == (site.shape.grid, site.shape.threads)
            # two slots of the strip (258 rows of 64 bytes) and of the weights (3 steps of
            # 64 bytes a column), and one set of the taps' operands (3 taps x parts x 2
            # planes x 260 rows of 16 bytes) a block of an SM's 16 warps
            columns, blocks = (64, 2) if layer == 2 else (128, 1)
            operands = 3 * parts * 2 * 260 * 16
            assert shared == 2 * (258 * 64 + 3 * columns * 64) + operands * (3 - blocks)
            assert blocks * (shared + 1024) <= 228 * 1024 and threads * blocks == 512
    for site in TrunkSite:
        for math in CudaMath:
            for tier in (None, PtxTier.SM80, PtxTier.SM90):
                if site in sites and tier is PtxTier.SM90:
                    continue
                assert not site.in_halves(math, tier, True)
                assert site.kernel(math, tier, True) == site.kernel(math, tier)
                assert site.launch(math, tier, True) == site.launch(math, tier)


@pytest.mark.parametrize("halves", [None, False, True], ids=str)
def test_a_trunk_plan_launches_the_halves_form_where_asked(hopper, weights, halves) -> None:
    """On compute capability 9.0, a plan with `halves` launches the stride-1 convolutions
    of layers 2 to 4 (7, 11 and 5) on the halves form in either math, and nothing else
    changes; by default (None), the strip form."""
    from pyspk.candidate.trunk.plan import HALVES_DEFAULT
    from pyspk.cuda import CudaRuntime

    fake = hopper
    asked = HALVES_DEFAULT if halves is None else halves
    with CudaRuntime(0) as runtime:
        for math in CudaMath:
            plan, _, _, launches = trunk_launches(fake, runtime, math, weights, halves=halves)
            assert plan.halves is asked
            expected = [conv.site for conv in weights.convs()]
            # layer1's blocks' second convolutions read their middles in 16 bits, and with
            # the 16-bit residual stream (TF32 math) the last two blocks' first ones their
            # inputs
            planes = (2, 4, 6) + ((3, 5) if plan.stream16 else ())
            assert plan.stream16 is (math is CudaMath.TF32)
            reads = [index in planes for index in range(len(expected))]
            kernels = [launch[0].removeprefix("fn:") for launch in launches[1:]]
            assert kernels == [
                site.kernel(math, PtxTier.SM90, asked, middle)
                for site, middle in zip(expected, reads, strict=True)
            ]
            on = [name for name in kernels if "_halves_" in name]
            assert len(on) == (7 + 11 + 5 if asked else 0)
            for launch, site, middle in zip(launches[1:], expected, reads, strict=True):
                grid, threads, shared = site.launch(math, PtxTier.SM90, asked, middle)
                assert launch[1:4] == (grid, (threads, 1, 1), shared)
            plan.close()


def test_a_convolution_plan_runs_the_halves_form_where_asked(hopper) -> None:
    from pyspk.cuda import CudaRuntime

    fake = hopper
    site = TrunkSite.LAYER4_CONV
    shape = site.shape
    conv = FoldedConv.of(site, np.ones(shape.weight_shape), np.zeros(shape.cout))
    with CudaRuntime(0) as runtime:
        x = runtime.alloc_zeros(2 * shape.x_item)
        y = runtime.alloc_zeros(2 * shape.y_item)
        for halves, kernel in (
            (True, "spk_trunk_layer4_halves_f16x3"),
            (False, site.kernel(CudaMath.FP32)),
        ):
            with plan_conv(runtime, CudaMath.FP32, conv, halves=halves) as plan:
                before = len(fake.launches)
                plan.enqueue(x, y, items=2)
                _, launch = fake.launches[before:]
            assert launch[0] == f"fn:{kernel}"
            assert launch[3] == site.launch(CudaMath.FP32, PtxTier.SM90, halves)[2]


def test_the_plan_packs_every_convolution_ahead_on_host_threads(fake, runtime, monkeypatch):
    """Before it uploads anything the plan packs each convolution's weight, once and in
    the form its kernel reads, and its bias on a pool of host threads (in the calling
    thread where the process has one CPU); the upload then takes those kept arrays. A
    packing that fails stops the plan, nothing allocated."""
    import threading

    from pyspk.candidate.trunk import plan as trunk_plan

    packed: list[tuple] = []  # (what, convolution, form, thread)
    real_pack, real_bias = FoldedConv._pack, FoldedConv._pack_bias

    def pack(self, split, warpgroups):
        thread = threading.current_thread().name
        packed.append(("weight", id(self), (split, warpgroups), thread))
        return real_pack(self, split, warpgroups)

    def pack_bias(self):
        packed.append(("bias", id(self), None, threading.current_thread().name))
        return real_bias(self)

    monkeypatch.setattr(FoldedConv, "_pack", pack)
    monkeypatch.setattr(FoldedConv, "_pack_bias", pack_bias)
    tier = runtime.load_kernels(trunk_plan.KernelModule.TRUNK).tier
    for cpus, pool in ((4, True), (1, False)):
        monkeypatch.setattr(trunk_plan, "_host_threads", lambda cpus=cpus: cpus)
        packed.clear()
        fresh = TrunkWeights.random(5)
        plan_trunk(runtime, CudaMath.FP32, fresh).close()
        expected = []
        for conv in fresh.convs():
            form = (conv.site.splits(CudaMath.FP32), conv.site.on_warpgroups(tier))
            expected += [("weight", id(conv), form), ("bias", id(conv), None)]
        assert sorted(entry[:3] for entry in packed) == sorted(expected)  # each once
        threads = {entry[3] for entry in packed}
        if pool:
            assert all(name.startswith("pyspk-pack") for name in threads)
        else:
            assert threads == {threading.current_thread().name}

    def failing(self, split, warpgroups):
        if self.site is TrunkSite.LAYER3_CONV:
            raise MemoryError("no room to pack")
        return real_pack(self, split, warpgroups)

    monkeypatch.setattr(FoldedConv, "_pack", failing)
    monkeypatch.setattr(trunk_plan, "_host_threads", lambda: 4)
    before = dict(fake.memory)
    with pytest.raises(MemoryError, match="no room to pack"):
        plan_trunk(runtime, CudaMath.FP32, TrunkWeights.random(6))
    assert fake.memory.keys() == before.keys()


def test_launches_reading_one_buffer_in_one_shape_share_their_tensor_maps(hopper, weights):
    """The 29 mapped launches (layer1's six tiles, 23 strips) read three activation
    buffers in four layers' shapes: the plan encodes those 12 inputs' maps, one for each
    of 1 to 32 chunks, and each launch points at its input's (their words are checked
    above)."""
    from pyspk.cuda import CudaRuntime

    with CudaRuntime(0) as runtime:
        for math in CudaMath:
            before = hopper.calls.count("cuTensorMapEncodeTiled")
            plan = plan_trunk(runtime, math, weights, middles=False)
            assert len(plan._strips) == 29
            inputs = {(launch.value("x"), site.shape) for launch, site in plan._strips}
            assert len(inputs) == 12
            encoded = hopper.calls.count("cuTensorMapEncodeTiled") - before
            assert encoded == len(inputs) * TRUNK_BATCH
            plan.close()
            # with the 16-bit middles (and 32-bit block outputs), layer1's three readers
            # share one map of their buffer (whatever the chunks), and its writers read
            # the two block inputs'
            before = hopper.calls.count("cuTensorMapEncodeTiled")
            plan = plan_trunk(runtime, math, weights, stream16=False)
            assert len(plan._strips) == 26
            inputs = {(launch.value("x"), site.shape) for launch, site in plan._strips}
            assert len(inputs) == 11
            encoded = hopper.calls.count("cuTensorMapEncodeTiled") - before
            assert encoded == len(inputs) * TRUNK_BATCH + 1
            plan.close()


@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_layer1_keeps_its_middles_in_16_bits_on_the_sm90_tier(hopper, weights, math) -> None:
    """By default a plan on the sm90 tier has each layer1 block's first convolution write
    its output as FP16 planes (CONV_HALF_OUT, its bias followed by the bound's two
    factors) and the second read them with `MIDDLE_KERNEL`: its input the writer's output,
    its scale the writer's raised bound (the same chunk maxima slot), a tensor map of the
    planes as 8-byte words of TRUNK_BATCH chunks in boxes of a part's two planes of a
    slab, whatever the chunks; in FP32 math the planes are the high and low parts. (With
    32-bit block outputs: TF32 math's default 16-bit stream is the next test's.)"""
    from pyspk.candidate.trunk.plan import CONV_PARAMS, MIDDLES_DEFAULT
    from pyspk.candidate.trunk.shapes import (
        CONV_HALF_OUT,
        CONV_RELU,
        MIDDLE_KERNEL,
        TILE_FRAMES,
        TILE_ROWS,
    )
    from pyspk.cuda import CudaRuntime
    from pyspk.cuda.buffers import INT32

    assert MIDDLES_DEFAULT
    layer1 = TrunkSite.LAYER1_CONV
    suffix = "f16x3" if layer1.splits(math) else "f16"
    parts = 2 if layer1.splits(math) else 1
    shape = layer1.shape
    with CudaRuntime(0) as runtime:
        for items in (TRUNK_BATCH, 5):
            plan, _, _, launches = trunk_launches(
                hopper, runtime, math, weights, items=items, stream16=False
            )
            assert plan.middles
            ours = [params(launch, CONV_PARAMS) for launch in launches[2:8]]
            names = [launch[0] for launch in launches[2:8]]
            assert (
                names
                == [f"fn:{layer1.kernel(math, PtxTier.SM90)}", f"fn:{MIDDLE_KERNEL}_{suffix}"] * 3
            )
            for block, (writer, reader) in enumerate(zip(ours[::2], ours[1::2], strict=True)):
                conv = weights.blocks[block].conv1
                assert writer["flags"] == CONV_RELU | CONV_HALF_OUT
                assert writer["bias_len"] == 2 * shape.cout + 2
                bias = runtime.read(writer["bias"], writer["bias_len"], None)
                assert np.array_equal(bias, conv.packed_bias_bounded())
                assert (reader["x"], reader["in_max"]) == (writer["y"], writer["out_max"])
                assert reader["bias_len"] == 2 * shape.cout and reader["items"] == items
                words = list(runtime.read(reader["x_map"], 32, None, INT32).view(np.uint64))
                row = shape.win * 16
                assert words[:14] == [
                    4, 4, reader["x"], shape.win * 2, shape.hin, 2, TRUNK_BATCH * 2 * parts,
                    row, row * shape.hin, row * shape.hin * 2,
                    (TILE_FRAMES + 2) * 2, TILE_ROWS + 2, 2, 1,
                ]  # fmt: skip
            grid, threads, shared = layer1.launch(math, PtxTier.SM90, middle=True)
            assert launches[3][1:4] == (grid, (threads, 1, 1), shared)
            plan.close()
        plan = plan_trunk(runtime, math, weights, middles=False)
        assert not plan.middles
        plan.close()


def test_layer1s_residual_stream_in_16_bits_is_wired_through_its_blocks(hopper, weights) -> None:
    """With `stream16` (TF32 math, the default), layer1's first two blocks write their
    outputs as the planes (CONV_HALF_OUT, with the bound's factors), the next block's
    convolutions read them (its first convolution by `MIDDLE_KERNEL`, a tensor map of
    them, its second as the residual, CONV_HALF_RESIDUAL), and a reader that writes or
    reads planes takes in_max as two slots, its residual's chunk maxima then its
    middle's; FP32 math keeps 32-bit block outputs, and `stream16=False` does in TF32."""
    from pyspk.candidate.trunk.plan import CONV_PARAMS, STREAM16_DEFAULT
    from pyspk.candidate.trunk.shapes import (
        CONV_HALF_OUT,
        CONV_HALF_RESIDUAL,
        CONV_RELU,
        MIDDLE_KERNEL,
    )
    from pyspk.cuda import CudaRuntime

    assert STREAM16_DEFAULT
    layer1 = TrunkSite.LAYER1_CONV
    slot = TRUNK_BATCH * 4
    with CudaRuntime(0) as runtime:
        plan, _, _, launches = trunk_launches(hopper, runtime, "tf32", weights)
        assert plan.stream16  # the default
        ours = [params(launch, CONV_PARAMS) for launch in launches[2:9]]
        names = [launch[0] for launch in launches[2:8]]
        middle = f"fn:{MIDDLE_KERNEL}_f16"
        assert names == [f"fn:{layer1.kernel('tf32', PtxTier.SM90)}"] + [middle] * 5
        writers, readers = ours[0:6:2], ours[1:6:2]
        for block in range(3):
            writer, reader = writers[block], readers[block]
            assert writer["flags"] == CONV_RELU | CONV_HALF_OUT
            assert writer["bias_len"] == 2 * layer1.shape.cout + 2
            assert (reader["x"], reader["in_max"] + slot) == (writer["y"], writer["out_max"])
            assert reader["in_max_len"] == 2 * TRUNK_BATCH
            assert reader["in_max"] == writer["in_max"]  # the block input's slot
            expected = CONV_RELU | (CONV_HALF_OUT if block < 2 else 0)
            expected |= CONV_HALF_RESIDUAL if block > 0 else 0
            assert reader["flags"] == expected
            assert reader["residual"] == writer["x"]
            assert reader["bias_len"] == 2 * layer1.shape.cout + (2 if block < 2 else 0)
            if block > 0:  # the block input is the last reader's planes and its bound
                assert (writer["x"], writer["in_max"]) == (
                    readers[block - 1]["y"],
                    readers[block - 1]["out_max"],
                )
                assert writer["x_map"] != 0
        # layer2's first convolutions read layer1's last output in 32 bits
        assert ours[6]["x"] == readers[2]["y"] and ours[6]["in_max"] == readers[2]["out_max"]
        plan.close()
        plan = plan_trunk(runtime, "fp32", weights, stream16=True)
        assert not plan.stream16
        plan.close()
        plan = plan_trunk(runtime, "tf32", weights, stream16=False)
        assert plan.middles and not plan.stream16
        plan.close()


def test_the_middles_reader_lands_its_slabs_without_an_fp32_ring() -> None:
    """The reader's shared memory: the weights (FP16, high and low in FP32 math) and
    MIDDLE_AHEAD + 2 one-part FP16 slabs (TF32) or MIDDLE_AHEAD_SPLIT + 1 two-part ones
    (FP32) of 6 x 66 pixels x 16 channels; two blocks an SM of an H200 either way. No
    tier but sm90 has the form."""
    from pyspk.candidate.trunk.shapes import MIDDLE_AHEAD, MIDDLE_AHEAD_SPLIT, MIDDLE_KERNEL

    layer1 = TrunkSite.LAYER1_CONV
    slab = 6 * 66 * 16 * 2  # bytes of one part: two k planes of 16 bytes a pixel
    for math, sets, parts, suffix in (
        (CudaMath.TF32, MIDDLE_AHEAD + 2, 1, "f16"),
        (CudaMath.FP32, MIDDLE_AHEAD_SPLIT + 1, 2, "f16x3"),
    ):
        assert layer1.kernel(math, PtxTier.SM90, middle=True) == f"{MIDDLE_KERNEL}_{suffix}"
        grid, threads, shared = layer1.launch(math, PtxTier.SM90, middle=True)
        assert (grid, threads) == layer1.launch(math, PtxTier.SM90)[:2]
        assert shared == 288 * 32 * 2 * parts + sets * parts * slab
        assert 2 * (shared + 1024) <= 228 * 1024
        for tier in (None, PtxTier.SM80):
            assert layer1.kernel(math, tier, middle=True) == layer1.kernel(math, tier)
        assert TrunkSite.LAYER2_CONV.kernel(math, PtxTier.SM90, middle=True) == (
            TrunkSite.LAYER2_CONV.kernel(math, PtxTier.SM90)
        )


def test_the_middles_bound_is_above_every_output() -> None:
    """`packed_bias_bounded`'s factors, r (the largest row sum of |w|) and b (the largest
    |bias|), each FP32 at or above its float64 value and within one unit of it; and for
    inputs no larger than m, every output of the convolution is within m r + b."""
    site = TrunkSite.LAYER1_CONV
    conv = TrunkWeights.random(3).blocks[0].conv1
    bounded = conv.packed_bias_bounded()
    assert np.array_equal(bounded[:-2], conv.packed_bias()) and bounded.dtype == np.float32
    rows = np.abs(conv.weight).reshape(site.shape.cout, -1).sum(axis=1).max()
    largest_bias = np.abs(conv.bias).max()
    for got, exact in zip(bounded[-2:], (rows, largest_bias), strict=True):
        assert exact <= float(got) <= float(np.nextafter(np.float32(exact), np.float32(np.inf)))
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, (site.shape.cin, 6, 6))  # m = 1
    x[:, 2:5, 2:5] = np.sign(conv.weight[0])  # the first channel's worst input
    taps = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(1, 2))  # [ci][y][x][3][3]
    y = np.einsum("oikl,iyxkl->oyx", conv.weight, taps) + conv.bias[:, None, None]
    assert np.abs(y).max() <= float(bounded[-2]) + float(bounded[-1])
    assert np.abs(y[0, 2, 2]) >= np.abs(conv.weight[0]).sum() - largest_bias  # it is reached
