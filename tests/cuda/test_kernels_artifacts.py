"""Kernel artifacts without a GPU: the manifest, hash refusal, tier and file choice, the
committed artifacts being current, loading against a fake driver, and the parameter
block of prepared launches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pyspk.candidate.segdense import EMBED_MAX_SPLITS, Conv, Entry, Reduction, TensorConv
from pyspk.cuda.errors import ArtifactError, CudaError, KernelMissingError
from pyspk.cuda.kernels import load_kernels
from pyspk.cuda.manifest import (
    Artifact,
    KernelModule,
    Manifest,
    artifact_dir,
    choose_artifact,
    read_artifact,
)
from pyspk.cuda.tier import ComputeCapability, PtxTier
from tests.fake_driver import FakeApi
from tests.repo import load_tool

ROOT = Path(__file__).resolve().parents[2]
PTX = ROOT / "ptx"


def _expected_entries() -> dict[str, tuple[str, ...]]:
    """Every kernel the Config table, the reductions and the packs name, with the
    parameter list of the kernels' calling convention, where a buffer is a 64-bit device
    pointer and its 64-bit element count: a convolution takes x, w and y, every other
    entry x, w, bias and y, a reduction partials, bias, y and a 32-bit slice count, and the
    gather pack src, map, dst and its non-finite flag. 31 entries."""
    buffers = ("u64", "u64")
    entries = {}
    for entry in Entry:
        config = entry.config(1)
        operands = 3 if isinstance(config.kind, (Conv, TensorConv)) else 4
        entries[config.kernel] = buffers * operands
    for splits in range(1, EMBED_MAX_SPLITS + 1):
        entries[Reduction.shape(splits).kernel] = (*buffers * 3, "u32")
    entries["spk_segdense_pack_gather"] = buffers * 4
    return entries


ENTRIES = _expected_entries()
assert len(ENTRIES) == 31


tool = load_tool("kernels")


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A private copy of the artifact directory to tamper with."""
    target = tmp_path / "ptx"
    shutil.copytree(PTX, target)
    return target


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPK_PTX_TIER", raising=False)
    monkeypatch.delenv("PYSPK_FORCE_PTX_JIT", raising=False)


def segdense() -> Manifest:
    return Manifest.load(PTX)


# -- manifest -------------------------------------------------------------------------


def test_module_names() -> None:
    assert str(KernelModule.SEGDENSE) == "segdense"
    assert str(KernelModule.SEGDENSE) == "segdense"


def test_artifact_dir_is_the_source_tree_without_a_wheel() -> None:
    packaged = ROOT / "pyspk" / "_ptx"
    assert artifact_dir() == (packaged if packaged.is_dir() else PTX)


def test_manifest_lists_both_tiers_with_the_same_entries() -> None:
    module = segdense().module(KernelModule.SEGDENSE)
    assert set(module.tiers) == {PtxTier.SM75, PtxTier.SM80}
    sm75, sm80 = module.tiers[PtxTier.SM75], module.tiers[PtxTier.SM80]
    assert dict(sm75.entries) == ENTRIES
    assert dict(sm80.entries) == ENTRIES
    assert (sm75.ptx, sm75.ptx_version, sm75.target) == ("segdense.sm75.ptx", "6.3", "sm_75")
    assert (sm80.ptx, sm80.ptx_version, sm80.target) == ("segdense.sm80.ptx", "7.0", "sm_80")
    assert set(sm75.cubins) == {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_120"}
    assert set(sm80.cubins) == {"sm_80", "sm_86", "sm_89", "sm_90", "sm_120"}
    assert sm80.cubins["sm_90"].file == "cubin/segdense.sm80.sm_90.cubin"
    assert set(module.sources) == {
        "segdense.cu",
        "common.cuh",
        "sm80.cuh",
        "model.cuh",
        "segconv.cuh",
        "segconv_mma.cuh",
        "linear.cuh",
        "seglinear.cuh",
        "seglinear_b1.cuh",
        "seglinear_b1_linear1.cuh",
        "seglinear_b32.cuh",
        "seggemm_mma.cuh",
        "seggemm_half.cuh",
        "classifier.cuh",
    }


def test_manifest_records_toolchain_and_flags() -> None:
    manifest = segdense()
    assert set(manifest.toolchain) == {"nvcc", "ptxas"}
    assert "-ptx" in manifest.flags["nvcc"]
    assert not any("fast" in flag for flag in manifest.flags["nvcc"])


def _edit_manifest(directory: Path, edit) -> None:
    path = directory / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format=2), "format 2"),
        (lambda d: d["modules"]["segdense"]["tiers"]["sm80"].pop("sha256"), "sm80.sha256"),
        (
            lambda d: d["modules"]["segdense"]["tiers"]["sm80"].update(ptx="../elsewhere.ptx"),
            "not a plain relative path",
        ),
        (lambda d: d["modules"]["segdense"]["tiers"].update(sm61={}), "PTX tier 'sm61'"),
        (
            lambda d: d["modules"]["segdense"]["tiers"]["sm75"]["cubins"]["sm_75"].update(
                sha256="XYZ"
            ),
            "SHA-256",
        ),
    ],
)
def test_malformed_manifest_is_refused(copy: Path, edit, message: str) -> None:
    _edit_manifest(copy, edit)
    with pytest.raises(ArtifactError, match=message):
        Manifest.load(copy)


def test_missing_manifest_says_how_to_build(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"tools/kernels\.py build"):
        Manifest.load(tmp_path)


def test_unknown_module_is_refused() -> None:
    with pytest.raises(ArtifactError, match="no module 'other'"):
        segdense().module("other")


# -- hashes ---------------------------------------------------------------------------


def test_intact_artifact_reads() -> None:
    module = segdense().module("segdense")
    artifact = choose_artifact(module, ComputeCapability(9, 0))
    assert read_artifact(PTX, artifact) == (PTX / artifact.file).read_bytes()


@pytest.mark.parametrize("force_ptx", [False, True], ids=["cubin", "ptx"])
def test_tampered_artifact_is_refused(copy: Path, force_ptx: bool) -> None:
    module = Manifest.load(copy).module("segdense")
    artifact = choose_artifact(module, ComputeCapability(9, 0), force_ptx=force_ptx)
    path = copy / artifact.file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=Path(artifact.file).name.replace(".", r"\.")):
        read_artifact(copy, artifact)


def test_missing_artifact_is_refused(copy: Path) -> None:
    (copy / "cubin" / "segdense.sm80.sm_90.cubin").unlink()
    module = Manifest.load(copy).module("segdense")
    artifact = choose_artifact(module, ComputeCapability(9, 0))
    with pytest.raises(ArtifactError, match=r"segdense\.sm80\.sm_90\.cubin"):
        read_artifact(copy, artifact)


# -- choice ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "tier", "arch"),
    [
        ((7, 5), PtxTier.SM75, "sm_75"),
        ((8, 0), PtxTier.SM80, "sm_80"),
        ((8, 6), PtxTier.SM80, "sm_86"),
        ((8, 7), PtxTier.SM80, None),  # no cubin ships for 8.7: JIT
        ((8, 9), PtxTier.SM80, "sm_89"),
        ((9, 0), PtxTier.SM80, "sm_90"),
        ((10, 0), PtxTier.SM80, None),
        ((12, 0), PtxTier.SM80, "sm_120"),
        ((12, 1), PtxTier.SM80, None),
    ],
)
def test_highest_tier_and_exact_cubin(
    capability: tuple[int, int], tier: PtxTier, arch: str | None
) -> None:
    module = segdense().module("segdense")
    artifact = choose_artifact(module, ComputeCapability(*capability))
    assert artifact.tier is tier
    assert artifact.arch == arch
    if arch is None:
        assert artifact.file == f"segdense.{tier}.ptx"
        assert artifact.describe() == f"segdense.{tier}.ptx (JIT)"
    else:
        assert artifact.file == f"cubin/segdense.{tier}.{arch}.cubin"
        assert artifact.describe() == f"segdense.{tier} cubin {arch}"


def test_lower_tier_on_request() -> None:
    module = segdense().module("segdense")
    artifact = choose_artifact(module, ComputeCapability(9, 0), PtxTier.SM75)
    assert (artifact.tier, artifact.arch) == (PtxTier.SM75, "sm_90")
    assert artifact.describe() == "segdense.sm75 cubin sm_90"


def test_forced_tier_above_the_device_is_refused() -> None:
    module = segdense().module("segdense")
    with pytest.raises(ArtifactError, match=r"sm80 segdense tier.*compute capability 7\.5"):
        choose_artifact(module, ComputeCapability(7, 5), PtxTier.SM80)


@pytest.mark.parametrize(
    ("capability", "described"),
    [
        ((9, 0), "trunk.sm90 cubin sm_90a"),  # wgmma: Hopper's own tier
        ((8, 9), "trunk.sm80 cubin sm_89"),
        ((10, 0), "trunk.sm80.ptx (JIT)"),  # sm_90a code runs on 9.0 alone
        ((12, 0), "trunk.sm80 cubin sm_120"),
    ],
)
def test_the_trunk_ships_an_sm90_tier_for_9_0_alone(
    capability: tuple[int, int], described: str
) -> None:
    module = Manifest.load(PTX).module(KernelModule.TRUNK)
    assert set(module.tiers) == {PtxTier.SM75, PtxTier.SM80, PtxTier.SM90}
    sm90 = module.tiers[PtxTier.SM90]
    assert (sm90.ptx_version, sm90.target, set(sm90.cubins)) == ("8.0", "sm_90a", {"sm_90a"})
    assert dict(sm90.entries) == dict(module.tiers[PtxTier.SM80].entries)
    assert choose_artifact(module, ComputeCapability(*capability)).describe() == described
    with pytest.raises(ArtifactError, match=r"sm90 runs only on compute capability 9\.0"):
        choose_artifact(module, ComputeCapability(10, 0), PtxTier.SM90)


def test_tier_not_shipped_is_refused() -> None:
    module = segdense().module("segdense")
    with pytest.raises(ArtifactError, match="ships no sm90 tier"):
        choose_artifact(module, ComputeCapability(9, 0), PtxTier.SM90)


def test_device_below_every_tier_is_refused() -> None:
    module = segdense().module("segdense")
    with pytest.raises(ArtifactError, match=r"no segdense tier runs on compute capability 6\.1"):
        choose_artifact(module, ComputeCapability(6, 1))


def test_force_ptx() -> None:
    module = segdense().module("segdense")
    artifact = choose_artifact(module, ComputeCapability(9, 0), force_ptx=True)
    assert artifact == Artifact(
        "segdense", PtxTier.SM80, "segdense.sm80.ptx", module.tiers[PtxTier.SM80].sha256
    )


# -- the committed artifacts are current ----------------------------------------------


def test_committed_artifacts_are_current() -> None:
    assert tool.verify_artifacts(PTX) == []


def test_check_notices_a_changed_source(copy: Path) -> None:
    source = copy / "src" / "segdense" / "segdense.cu"
    source.write_text(source.read_text() + "\n// edited\n")
    assert any("segdense.cu changed" in problem for problem in tool.verify_artifacts(copy))


def test_check_notices_an_unpinned_header(copy: Path) -> None:
    path = copy / "segdense.sm75.ptx"
    text = path.read_text().replace(".version 6.3", ".version 9.0", 1)
    path.write_text(text)
    problems = tool.verify_artifacts(copy)
    assert any("header .version 9.0" in problem for problem in problems)
    assert any("segdense.sm75.ptx has SHA-256" in problem for problem in problems)


def test_check_reports_a_manifest_the_loader_refuses(copy: Path) -> None:
    _edit_manifest(copy, lambda d: d["modules"]["segdense"]["tiers"]["sm75"].pop("ptx"))
    assert tool.verify_artifacts(copy) == [
        "the loader refuses the manifest: manifest.json: modules.segdense.tiers.sm75.ptx "
        "is missing or not a non-empty string"
    ]


def test_check_notices_a_stray_cubin(copy: Path) -> None:
    (copy / "cubin" / "segdense.sm80.sm_100.cubin").write_bytes(b"old")
    assert tool.verify_artifacts(copy) == [
        "cubin/segdense.sm80.sm_100.cubin is not in the manifest (a stale artifact?)"
    ]


# -- the CUDA sources and the constants they share with pyspk ---------------------------


def test_sources_are_short_and_guarded() -> None:
    assert tool.source_problems(PTX) == []


def test_check_notices_a_long_or_unguarded_header(copy: Path) -> None:
    header = copy / "src" / "segdense" / "linear.cuh"
    header.write_text(header.read_text().replace("#pragma once\n", ""))
    family = copy / "src" / "segdense" / "segconv.cuh"
    text = family.read_text()
    family.write_text(text + "// note\n" * (701 - text.count("\n")))
    assert tool.source_problems(copy) == [
        "linear.cuh has no include guard: add `#pragma once`",
        "segconv.cuh has 701 lines, more than 700: split it along a seam of its kernel "
        "family, or move measurement notes to docs/performance.md",
    ]


def test_cuda_constants_and_kernel_names_match_pyspk() -> None:
    found, problems = tool.cuda_constants(PTX)
    assert problems == []
    assert found["ITEM_ROWS"] == ("589", 589)
    assert found["LEAKY_SLOPE"] == ("0.01f", 0.01)
    assert found["SELECT_ROWS"] == ("16", 16)
    assert found["EMBED_MAX_SPLITS"] == ("128", 128)
    assert tool.pyspk_problems(PTX) == []


def test_a_cuda_constant_unlike_pyspk_is_named_with_both_values(copy: Path) -> None:
    model = copy / "src" / "segdense" / "model.cuh"
    text = model.read_text()
    assert "constexpr u32 ITEM_ROWS = 589;" in text
    model.write_text(
        text.replace("constexpr u32 ITEM_ROWS = 589;", "constexpr u32 ITEM_ROWS = 590;")
    )
    assert tool.pyspk_problems(copy) == [
        f"ITEM_ROWS differs: 590 in ptx/src/segdense/model.cuh, 589 in "
        f"DenseSite.{site}.dimensions()[0]"
        for site in ("LINEAR0", "LINEAR1", "CLASSIFIER")
    ]


def test_a_python_constant_unlike_the_kernels_is_named_with_both_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspk import reference
    from pyspk.candidate.segdense import shapes

    monkeypatch.setattr(reference, "LEAKY_SLOPE", 0.02)
    monkeypatch.setattr(shapes, "SELECT_ROWS", 17)
    monkeypatch.setattr(shapes, "EMBED_MAX_SPLITS", 64)
    assert tool.pyspk_problems(PTX) == [
        "LEAKY_SLOPE differs: 0.01f in ptx/src/segdense/model.cuh, 0.02 in "
        "pyspk.reference.LEAKY_SLOPE",
        "EMBED_MAX_SPLITS differs: 128 in ptx/src/segdense/model.cuh, 64 in "
        "shapes.EMBED_MAX_SPLITS",
        "SELECT_ROWS differs: 16 in ptx/src/segdense/seggemm_mma.cuh, 17 in shapes.SELECT_ROWS",
    ]


def test_a_constant_is_defined_once(copy: Path) -> None:
    classifier = copy / "src" / "segdense" / "classifier.cuh"
    classifier.write_text(
        classifier.read_text() + "namespace spk { constexpr u32 ITEM_ROWS = 589; }\n"
    )
    assert tool.pyspk_problems(copy) == [
        "ITEM_ROWS is defined in classifier.cuh, model.cuh: define it once, in model.cuh, "
        "where tools/kernels.py reads it"
    ]


def test_every_kernel_pyspk_names_is_exported(copy: Path) -> None:
    ptx = copy / "segdense.sm80.ptx"
    text = ptx.read_text()
    assert text.count(".entry spk_segdense_embed_b1(") == 1
    ptx.write_text(text.replace(".entry spk_segdense_embed_b1(", ".entry spk_segdense_embed_b1x("))
    assert tool.pyspk_problems(copy) == [
        "kernel spk_segdense_embed_b1 (Entry.EMBED_B1) is not exported by segdense.sm80.ptx"
    ]


def _nvcc_missing() -> bool:
    try:
        tool.find_tool("nvcc")
    except tool.ToolError:
        return True
    return False


@pytest.mark.skipif(_nvcc_missing(), reason="needs the CUDA toolkit's nvcc")
def test_a_header_that_does_not_stand_alone_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "src" / "segdense"
    folder.mkdir(parents=True)
    (tmp_path / "src" / "common").mkdir()
    (tmp_path / "src" / "common" / "types.cuh").write_text(
        "#pragma once\ntypedef unsigned int u32;\n"
    )
    (folder / "user.cuh").write_text(
        "#pragma once\n__device__ inline u32 twice(u32 v) { return 2 * v; }\n"
    )
    problems = tool.header_problems(tmp_path)
    assert [problem.splitlines()[0] for problem in problems] == [
        f"user.cuh does not compile on its own for {tier.virtual} (a header includes every "
        "header it uses):"
        for tier in tool.TIERS
    ]
    (folder / "user.cuh").write_text(
        '#pragma once\n#include "types.cuh"\n__device__ inline u32 twice(u32 v) { return 2 * v; }\n'
    )
    assert tool.header_problems(tmp_path) == []


def test_missing_toolkit_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tool.shutil, "which", lambda name: None)
    monkeypatch.setattr(tool, "DEFAULT_CUDA_HOMES", ())
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    with pytest.raises(tool.ToolError, match="nvcc was not found on PATH"):
        tool.toolchain()
    assert tool.main(["check"]) == 1


PTX_SAMPLE = """//
.version 9.0
.target sm_75
.address_size 64

.visible .entry first(
\t.param .u64 first_param_0,
\t.param .u32 first_param_1
)
{
\tret;
}
.visible .entry second()
{
	ret;
}
.visible .entry third(
	.param .align 8 .b8 third_param_0[16],
	.param .u64 .ptr .global .align 4 third_param_1
)
{
\tret;
}
"""


def test_ptx_parsing_and_header_pinning() -> None:
    assert tool.parse_entries(PTX_SAMPLE) == {
        "first": ["u64", "u32"],
        "second": [],
        "third": ["b8[16]", "u64"],
    }
    sm75 = tool.tier_by_name("sm75")
    pinned = tool.pin_header(PTX_SAMPLE, sm75)
    assert tool.header(pinned) == ("6.3", "sm_75")
    with pytest.raises(tool.ToolError, match="targets"):
        tool.pin_header(PTX_SAMPLE, tool.tier_by_name("sm80"))


def test_entry_differences_between_tiers() -> None:
    problems = tool._entry_differences(
        "segdense",
        {"sm75": {"a": ["u64"], "b": ["u32"]}, "sm80": {"a": ["u32"], "c": []}},
    )
    assert problems == [
        "segdense: entry b is exported by the sm75 tier only",
        "segdense: entry c is exported by the sm80 tier only",
        "segdense: entry a takes (u64) in sm75 but (u32) in sm80",
    ]


def test_ptxas_resources_and_spills() -> None:
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
        "ptxas info    : Function properties for k\n"
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 192 bytes smem\n"
    )
    resources = tool.parse_resources(log)
    assert resources == {
        "k": {
            "registers": 40,
            "barriers": 1,
            "shared_bytes": 192,
            "stack_bytes": 8,
            "spill_store_bytes": 4,
            "spill_load_bytes": 4,
        }
    }
    assert tool.spills(resources) == ["k spills (4 bytes stored, 4 loaded)"]
    assert tool.spills({"k": {**resources["k"], "spill_store_bytes": 0}}) == [
        "k spills (0 bytes stored, 4 loaded)"
    ]
    assert tool.spills({"k": {"registers": 128, "spill_store_bytes": 0}}) == []


# -- loading against a fake driver ----------------------------------------------------


def test_load_resolves_every_entry(fake: FakeApi) -> None:
    loaded = load_kernels(KernelModule.SEGDENSE, ComputeCapability(9, 0), directory=PTX)
    assert loaded.tier is PtxTier.SM80
    assert loaded.artifact == "segdense.sm80 cubin sm_90"
    assert loaded.entries == tuple(sorted(ENTRIES))
    assert fake.loaded == [(PTX / "cubin/segdense.sm80.sm_90.cubin").read_bytes()]
    assert loaded.function("spk_segdense_pack_gather").handle == "fn:spk_segdense_pack_gather"
    with pytest.raises(KernelMissingError, match="no entry 'spk_segdense_nothing'"):
        loaded.function("spk_segdense_nothing")
    loaded.unload()
    loaded.unload()
    assert fake.unloaded == ["module"]
    with pytest.raises(CudaError, match="unloaded"):
        loaded.function("spk_segdense_pack_gather")


def test_env_lowers_the_tier_and_forces_jit(fake: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPK_PTX_TIER", "sm75")
    monkeypatch.setenv("PYSPK_FORCE_PTX_JIT", "1")
    loaded = load_kernels(KernelModule.SEGDENSE, ComputeCapability(9, 0), directory=PTX)
    assert loaded.tier is PtxTier.SM75
    assert loaded.artifact == "segdense.sm75.ptx (JIT)"
    image = fake.loaded[0]
    assert image.endswith(b"\0") and image.count(b"\0") == 1
    assert image[:-1] == (PTX / "segdense.sm75.ptx").read_bytes()


def test_explicit_tier_wins_over_env(fake: FakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPK_PTX_TIER", "sm75")
    loaded = load_kernels(
        KernelModule.SEGDENSE, ComputeCapability(8, 6), PtxTier.SM80, directory=PTX
    )
    assert loaded.artifact == "segdense.sm80 cubin sm_86"


def test_forced_tier_above_the_device_loads_nothing(
    fake: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPK_PTX_TIER", "sm80")
    with pytest.raises(ArtifactError, match=r"capability 7\.5\) runs tiers up to sm75"):
        load_kernels(KernelModule.SEGDENSE, ComputeCapability(7, 5), directory=PTX)
    assert fake.loaded == []


def test_tampered_bytes_never_reach_the_driver(fake: FakeApi, copy: Path) -> None:
    path = copy / "cubin/segdense.sm80.sm_90.cubin"
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(ArtifactError, match=r"segdense\.sm80\.sm_90\.cubin"):
        load_kernels(KernelModule.SEGDENSE, ComputeCapability(9, 0), directory=copy)
    assert fake.loaded == []


def test_missing_entry_fails_the_load_and_unloads(
    fake: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.missing = frozenset({"spk_segdense_reduce_e34"})
    with pytest.raises(KernelMissingError, match="spk_segdense_reduce_e34"):
        load_kernels(KernelModule.SEGDENSE, ComputeCapability(8, 9), directory=PTX)
    assert fake.unloaded == ["module"]


def test_max_dynamic_shared_is_set_once(fake: FakeApi) -> None:
    loaded = load_kernels(KernelModule.SEGDENSE, ComputeCapability(9, 0), directory=PTX)
    kernel = loaded.function("spk_segdense_embed_b32")
    kernel.set_max_dynamic_shared(70000)
    kernel.set_max_dynamic_shared(70000)
    assert fake.attributes == [("fn:spk_segdense_embed_b32", 8, 70000)]
    kernel.set_max_dynamic_shared(80000)
    assert len(fake.attributes) == 2
    assert kernel.attribute("NUM_REGS") == 42
