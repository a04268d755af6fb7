#!/usr/bin/env python3
"""Build and check the kernel artifacts under ptx/.

    python tools/kernels.py build            regenerate the PTX tiers, cubins and manifest
    python tools/kernels.py check            verify that the artifacts are current
    python tools/kernels.py check --rebuild  also rebuild into a temporary directory and
                                             compare every file byte for byte

`build` compiles each module's CUDA source with nvcc to one PTX file per tier, pins the
PTX ISA version in its header low enough for old drivers, assembles each tier with ptxas
into exact-architecture cubins, and writes ptx/manifest.json (toolchain, flags, SHA-256 of
every source and artifact, each tier's entries with their parameter lists, and ptxas's
resource use per cubin). The output has no timestamps and sorted keys, so a rebuild with
the same toolchain reproduces it byte for byte.

`check` verifies the hashes, the pinned headers, that every tier exports the same entries
with the same parameters, that no cubin spills, that every CUDA source stays within
MAX_SOURCE_LINES lines, that every header has an include guard and compiles on its own
(so it includes what it uses), that the constants the CUDA sources share with pyspk
(rows per item, the LeakyReLU slope, split and selected-row counts, ...) equal pyspk's and
that every kernel pyspk names is exported by every tier, and that the installed ptxas
assembles every tier for every listed architecture. Exit status 0 when everything
holds, else 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspk.cuda.errors import ArtifactError
from pyspk.cuda.manifest import Manifest
from pyspk.cuda.tier import (
    CUBIN_DIR,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    TIER_BUILDS,
    TierBuild,
    module_tiers,
)
from pyspk.cuda.tier import cubin_name as artifact_cubin_name
from pyspk.cuda.tier import ptx_name as artifact_ptx_name

ROOT = Path(__file__).resolve().parent.parent
PTX_DIR = ROOT / "ptx"
DEFAULT_CUDA_HOMES = ("/usr/local/cuda",)


# the tier table and the artifact names: one source, shared with the loader
Tier = TierBuild
TIERS = tuple(TIER_BUILDS.values())  # every tier: each header compiles alone in each


def tiers_of(module: str) -> tuple[Tier, ...]:
    """The tiers `module` is built in (`pyspk.cuda.tier.module_tiers`)."""
    return tuple(TIER_BUILDS[tier] for tier in module_tiers(module))


MODULES = ("segdense", "trunk", "cluster", "lstm", "sincnet")
# Explicit IEEE FP32 behaviour, whatever the nvcc defaults or profile say: the kernels'
# fixed summation orders are only reproducible without fast-math rewrites.
NVCC_FLAGS = (
    "-ptx",
    "-std=c++17",
    "-O3",
    "--fmad=true",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "-I.",
    "-I../common",
)
# the CUDA sources under ptx_dir: one folder per module and one shared by all; headers
# are included by name, and nvcc runs in the module's folder
SOURCES = "src"
COMMON = "common"
PTXAS_FLAGS = ("-O3",)
# the most lines one CUDA source may have: past it, split the family along a natural seam
# or move measurement prose to docs/performance.md
MAX_SOURCE_LINES = 700

_VERSION_LINE = re.compile(r"^\.version\s+(\d+\.\d+)\s*$", re.MULTILINE)
_TARGET_LINE = re.compile(r"^\.target\s+(\S+?)\s*$", re.MULTILINE)
_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)", re.DOTALL)
_PARAM_TYPE = re.compile(r"^\.([busf]\d+)$")
_PARAM_ARRAY = re.compile(r"(\[\d+\])$")
_RELEASE = re.compile(r"release\s+([\d.]+),\s*V([\d.]+)")
_BUILD = re.compile(r"^Build\s+(\S+)", re.MULTILINE)
_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PTXAS_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once\b", re.MULTILINE)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_INT_LITERAL = re.compile(r"^(\d+)[uU]?$")
_FLOAT_LITERAL = re.compile(r"^(\d+\.\d*(?:[eE][+-]?\d+)?)[fF]$")


class ToolError(Exception):
    """A build step failed or a tool is missing; the message says what to do."""


# -- small helpers --------------------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def progress(line: str) -> None:
    print(line, flush=True)


def dump_manifest(manifest: Mapping[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def tier_by_name(name: str) -> Tier:
    for tier in TIERS:
        if tier.name == name:
            return tier
    raise KeyError(name)


def ptx_name(module: str, tier: Tier) -> str:
    return artifact_ptx_name(module, tier.name)


def cubin_name(module: str, tier: Tier, arch: str) -> str:
    return artifact_cubin_name(module, tier.name, arch)


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.MULTILINE)


def source_path(ptx_dir: Path, name: str, module: str | None = None) -> Path:
    """Where the source `name` lives: in `module`'s folder (any module's where None) or
    the common one; the common folder's path where it is nowhere."""
    modules = MODULES if module is None else (module,)
    for folder in (*modules, COMMON):
        path = ptx_dir / SOURCES / folder / name
        if path.is_file():
            return path
    return ptx_dir / SOURCES / COMMON / name


def source_files(ptx_dir: Path, module: str) -> list[str]:
    """The module's source and every header it includes, directly or through another
    header, by name (`source_path` finds each)."""
    names, pending = [f"{module}.cu"], [f"{module}.cu"]
    while pending:
        path = source_path(ptx_dir, pending.pop(), module)
        if not path.is_file():
            continue  # verify_artifacts reports it
        for header in _INCLUDE.findall(_COMMENT.sub("", path.read_text(encoding="utf-8"))):
            if header not in names:
                names.append(header)
                pending.append(header)
    return [names[0], *sorted(names[1:])]


def find_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        homes = (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *DEFAULT_CUDA_HOMES)
        for home in homes:
            if home and (Path(home) / "bin" / name).is_file():
                found = str(Path(home) / "bin" / name)
                break
    if found is None:
        raise ToolError(
            f"{name} was not found on PATH, nor under CUDA_HOME/bin or /usr/local/cuda/bin: "
            "the kernel artifacts are built and checked with the CUDA toolkit's nvcc and "
            "ptxas; install the toolkit (the manifest records the release used) or put its "
            "bin directory on PATH"
        )
    return found


def run(command: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ToolError(
            f"{' '.join(command)} failed with status {result.returncode}:\n"
            f"{result.stdout}{result.stderr}".rstrip()
        )
    return result


def toolchain() -> dict[str, str]:
    """`{"nvcc": "13.0.88 (cuda_13.0.r13.0/compiler.36424714_0)", "ptxas": ...}`."""
    versions = {}
    for name in ("nvcc", "ptxas"):
        text = run([find_tool(name), "--version"]).stdout
        release = _RELEASE.search(text)
        build = _BUILD.search(text)
        if release is None:
            raise ToolError(f"cannot read the version of {name} from:\n{text}")
        versions[name] = release.group(2) + (f" ({build.group(1)})" if build else "")
    return versions


# -- PTX text -------------------------------------------------------------------------


def pin_header(text: str, tier: Tier) -> str:
    """Rewrite the `.version` line to the tier's pinned ISA; the `.target` must match."""
    versions = _VERSION_LINE.findall(text)
    if len(versions) != 1:
        raise ToolError(f"expected one .version line in the {tier.name} PTX, found {versions}")
    targets = _TARGET_LINE.findall(text)
    if targets != [tier.target]:
        raise ToolError(f"the {tier.name} PTX targets {targets}, expected [{tier.target!r}]")
    return _VERSION_LINE.sub(f".version {tier.ptx_version}", text, count=1)


def header(text: str) -> tuple[str | None, str | None]:
    """The PTX's (`.version`, `.target`)."""
    version = _VERSION_LINE.search(text)
    target = _TARGET_LINE.search(text)
    return (version.group(1) if version else None, target.group(1) if target else None)


def parse_entries(text: str) -> dict[str, list[str]]:
    """Each `.entry` of a PTX file and its parameter types in order (`u64`, `u32`)."""
    entries: dict[str, list[str]] = {}
    for match in _ENTRY.finditer(text):
        name, body = match.group(1), match.group(2)
        params = []
        for declaration in filter(None, (part.strip() for part in body.split(","))):
            # `.param [.ptr .global] [.align N] .TYPE name[[N]]`
            tokens = declaration.split()
            types = [m.group(1) for m in map(_PARAM_TYPE.match, tokens) if m]
            if tokens[0] != ".param" or len(types) != 1:
                raise ToolError(f"cannot read the parameter {declaration!r} of entry {name}")
            array = _PARAM_ARRAY.search(tokens[-1])
            params.append(types[0] + (array.group(1) if array else ""))
        if name in entries:
            raise ToolError(f"entry {name} appears twice in one PTX file")
        entries[name] = params
    return entries


def parse_resources(log: str) -> dict[str, dict[str, int]]:
    """ptxas -v lines per entry: registers, barriers, static shared bytes, stack, spills."""
    resources: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in log.splitlines():
        entry = _PTXAS_ENTRY.search(line)
        if entry:
            current = resources.setdefault(entry.group(1), {})
            continue
        if current is None:
            continue
        frame = _PTXAS_FRAME.search(line)
        if frame:
            current["stack_bytes"] = int(frame.group(1))
            current["spill_store_bytes"] = int(frame.group(2))
            current["spill_load_bytes"] = int(frame.group(3))
        used = _PTXAS_USED.search(line)
        if used:
            current["registers"] = int(used.group(1))
            current["barriers"] = int(used.group(2) or 0)
            current["shared_bytes"] = int(used.group(3) or 0)
    return resources


def spills(resources: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The entries that spill registers to local memory: every cubin must fit without."""
    return [
        f"{entry} spills ({usage.get('spill_store_bytes', 0)} bytes stored, "
        f"{usage.get('spill_load_bytes', 0)} loaded)"
        for entry, usage in sorted(resources.items())
        if usage.get("spill_store_bytes", 0) or usage.get("spill_load_bytes", 0)
    ]


# -- build ----------------------------------------------------------------------------


def compile_ptx(source_dir: Path, module: str, tier: Tier) -> str:
    """nvcc's PTX for one tier, header pinned. Runs in the module's source folder with a
    relative file name so no absolute path can reach the output."""
    with tempfile.TemporaryDirectory(prefix="pyspk-ptx-") as scratch:
        out = Path(scratch) / ptx_name(module, tier)
        command = [find_tool("nvcc"), *NVCC_FLAGS, f"-arch={tier.virtual}"]
        run([*command, f"{module}.cu", "-o", str(out)], cwd=source_dir / SOURCES / module)
        return pin_header(out.read_text(encoding="utf-8"), tier)


def assemble(ptx_path: Path, arch: str, out_path: Path) -> dict[str, dict[str, int]]:
    """ptxas one PTX file for `arch`; returns the per-entry resources it reports."""
    command = [find_tool("ptxas"), *PTXAS_FLAGS, "-v", f"-arch={arch}"]
    result = run([*command, ptx_path.name, "-o", str(out_path)], cwd=ptx_path.parent)
    return parse_resources(result.stdout + result.stderr)


def build(source_dir: Path, out_dir: Path, say: Callable[[str], None] = progress) -> None:
    """Build every module from `source_dir` into `out_dir` (which may be the same)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="pyspk-build-"))
    try:
        manifest = _build_into(source_dir, staging, say)
        _install(staging, out_dir, manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _build_into(source_dir: Path, staging: Path, say: Callable[[str], None]) -> dict[str, Any]:
    (staging / CUBIN_DIR).mkdir()
    modules: dict[str, Any] = {}
    for module in MODULES:
        sources = {
            name: sha256(source_path(source_dir, name, module).read_bytes())
            for name in source_files(source_dir, module)
        }
        tiers: dict[str, Any] = {}
        for tier in tiers_of(module):
            say(
                f"nvcc     {module}.cu -> {ptx_name(module, tier)} "
                f"({tier.virtual}, .version {tier.ptx_version})"
            )
            text = compile_ptx(source_dir, module, tier)
            ptx_path = staging / ptx_name(module, tier)
            ptx_path.write_text(text, encoding="utf-8")
            tiers[tier.name] = {
                "ptx": ptx_name(module, tier),
                "sha256": sha256(ptx_path.read_bytes()),
                "ptx_version": tier.ptx_version,
                "target": tier.target,
                "entries": parse_entries(text),
                "cubins": {},
            }
        _check_same_entries(module, {name: body["entries"] for name, body in tiers.items()})

        jobs = [(tier, arch) for tier in tiers_of(module) for arch in tier.archs]
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            futures = {
                (tier.name, arch): pool.submit(
                    assemble,
                    staging / ptx_name(module, tier),
                    arch,
                    staging / cubin_name(module, tier, arch),
                )
                for tier, arch in jobs
            }
            for tier, arch in jobs:
                resources = futures[(tier.name, arch)].result()
                file = cubin_name(module, tier, arch)
                say(f"ptxas    {ptx_name(module, tier)} -> {file}")
                problems = spills(resources)
                if problems:
                    raise ToolError(f"{file}: " + "; ".join(problems))
                tiers[tier.name]["cubins"][arch] = {
                    "file": file,
                    "sha256": sha256((staging / file).read_bytes()),
                    "resources": resources,
                }
        modules[module] = {"sources": sources, "tiers": tiers}

    manifest = {
        "format": MANIFEST_FORMAT,
        "toolchain": toolchain(),
        "flags": {"nvcc": list(NVCC_FLAGS), "ptxas": list(PTXAS_FLAGS)},
        "modules": modules,
    }
    (staging / MANIFEST_NAME).write_bytes(dump_manifest(manifest))
    return manifest


def _install(staging: Path, out_dir: Path, manifest: Mapping[str, Any]) -> None:
    """Copy the staged artifacts into `out_dir`, dropping cubins the build no longer makes."""
    wanted = set(_artifact_files(manifest))
    cubins = out_dir / CUBIN_DIR
    if cubins.is_dir():
        for stale in cubins.glob("*.cubin"):
            if f"{CUBIN_DIR}/{stale.name}" not in wanted:
                stale.unlink()
    cubins.mkdir(exist_ok=True)
    for name in [*sorted(wanted), MANIFEST_NAME]:
        shutil.copyfile(staging / name, out_dir / name)


def _artifact_files(manifest: Mapping[str, Any]) -> list[str]:
    files = []
    for module in manifest.get("modules", {}).values():
        for tier in module.get("tiers", {}).values():
            files.append(tier["ptx"])
            files.extend(cubin["file"] for cubin in tier.get("cubins", {}).values())
    return files


def _check_same_entries(module: str, per_tier: Mapping[str, Mapping[str, list[str]]]) -> None:
    problems = _entry_differences(module, per_tier)
    if problems:
        raise ToolError("\n".join(problems))


def _entry_differences(module: str, per_tier: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Entries or parameter lists that differ between the tiers of `module`."""
    problems = []
    names = sorted(per_tier)
    if not names:
        return [f"{module}: no tiers"]
    first = names[0]
    for other in names[1:]:
        a, b = per_tier[first], per_tier[other]
        for entry in sorted(set(a) ^ set(b)):
            where = first if entry in a else other
            problems.append(f"{module}: entry {entry} is exported by the {where} tier only")
        for entry in sorted(set(a) & set(b)):
            if list(a[entry]) != list(b[entry]):
                problems.append(
                    f"{module}: entry {entry} takes ({', '.join(a[entry])}) in {first} but "
                    f"({', '.join(b[entry])}) in {other}"
                )
    return problems


# -- the CUDA sources and pyspk -------------------------------------------------------


def _constexpr(name: str) -> re.Pattern[str]:
    return re.compile(rf"\bconstexpr\s+(?:u32|int|float)\s+{name}\s*=\s*([^;]+?)\s*;")


# The trunk area's constants, each `pyspk.candidate.trunk.shapes.<name>`, and their source
TRUNK_CONSTANTS = {
    **dict.fromkeys(
        (
            "TRUNK_BATCH",
            "TRUNK_BINS",
            "TRUNK_FRAMES",
            "CONV_BM",
            "CONV_BK",
            "CONV_STAGES",
            "CONV_SM90_STRIP_STAGES_NARROW",
            "CONV_SM90_STRIP_STAGES_WIDE",
            "CONV_SM90_STRIP_STAGES_WIDE_SPLIT",
            "CONV_SM90_DOWN_STAGES_NARROW",
            "CONV_SM90_DOWN_STAGES_WIDE",
            "CONV_SM90_WIDE_SPLIT_THREADS",
            "CONV_TMA_BOX",
            "CONV_RELU",
            "CONV_NCHW",
        ),
        "trunkconv.cuh",
    ),
    **dict.fromkeys(
        (
            "TILE_GROUPS",
            "TILE_ROWS",
            "TILE_FRAMES",
            "TILE_TILES",
            "TILE_AHEAD",
            "CONV_HALF_OUT",
            "CONV_HALF_RESIDUAL",
            "MIDDLE_AHEAD",
            "MIDDLE_AHEAD_SPLIT",
        ),
        "trunktiles.cuh",
    ),
    "HALVES_PAD_ROWS": "trunkhalves.cuh",
    "STEM_THREADS": "trunk.cu",
    "STEM_TILE_BINS": "trunk.cu",
    "STEM_TILE_FRAMES": "trunk.cu",
    "MAXIMA_THREADS": "trunk.cu",
}

# The trunk module's pooling constants, each `pyspk.candidate.trunk.pooling.<name>`, in trunk.cu
POOL_CONSTANTS = ("POOL_THREADS", "POOL_ROWS", "POOL_MAX_FRAMES", "POOL_MAX_SPEAKERS")

# The trunk module's fbank constants, each `pyspk.candidate.trunk.fbank.<name>`, in trunkfbank.cuh
FBANK_CONSTANTS = (
    "FBANK_WINDOW",
    "FBANK_SHIFT",
    "FBANK_PADDED",
    "FBANK_THREADS",
    "MEL_BINS",
    "MEL_THREADS",
    "MEL_FRAMES",
    "MEL_MAX_TERMS",
    "CENTRE_THREADS",
    "CENTRE_SPAN",
    "FBANK_FLOOR",
)

# The cluster module's constants, each `pyspk.candidate.cluster.plan.<name>`, all in cluster.cu
LINKAGE_CONSTANTS = (
    "LINKAGE_THREADS",
    "NEIGHBOUR_THREADS",
    "NEIGHBOUR_ROWS",
    "STATE_BYTES_PER_CLUSTER",
    "LINKAGE_DONE",
    "LINKAGE_STOPPED",
    "LINKAGE_UNRUN",
    "PDIST_TILE",
    "PDIST_THREADS",
)

# The lstm module's constants, each `pyspk.candidate.lstm.plan.<name>`, all in lstm.cu
LSTM_CONSTANTS = ("LSTM_HIDDEN", "LSTM_ROWS", "LSTM_THREADS")

# The sincnet module's constants, each `pyspk.candidate.sincnet.plan.<name>`, in sincnet.cu
SINC_CONSTANTS = (
    "SINC_FILTERS",
    "SINC_TAPS",
    "SINC_STRIDE",
    "SINC_POOL",
    "SINC_THREADS",
    "SINC_TILE",
    "SINC_HALF_THREADS",
    "SINC_K",
)

# Constants the CUDA sources share with pyspk: name -> (the source that defines it, the
# pattern whose group 1 is its literal value). A `constexpr` one must be defined exactly
# once in all the sources, in that file.
CUDA_CONSTANTS: dict[str, tuple[str, re.Pattern[str]]] = {
    "ITEM_ROWS": ("model.cuh", _constexpr("ITEM_ROWS")),
    "LEAKY_SLOPE": ("model.cuh", _constexpr("LEAKY_SLOPE")),
    "EMBED_ROWS": ("model.cuh", _constexpr("EMBED_ROWS")),
    "EMBED_COLS": ("model.cuh", _constexpr("EMBED_COLS")),
    "EMBED_K": ("model.cuh", _constexpr("EMBED_K")),
    "EMBED_MAX_SPLITS": ("model.cuh", _constexpr("EMBED_MAX_SPLITS")),
    "FLAT_MAX_SPLITS": ("model.cuh", _constexpr("FLAT_MAX_SPLITS")),
    "SELECT_ROWS": ("seggemm_mma.cuh", _constexpr("SELECT_ROWS")),
    # embed_b32_f16's dynamic shared bytes, asserted against the launch's figure
    "HALF_SHARED": (
        "seggemm_half.cuh",
        re.compile(r"\bstatic_assert\(\s*SHARED_BYTES\s*==\s*([^,]+?)\s*,"),
    ),
    **{name: (home, _constexpr(name)) for name, home in TRUNK_CONSTANTS.items()},
    **{name: ("trunk.cu", _constexpr(name)) for name in POOL_CONSTANTS},
    **{name: ("trunkfbank.cuh", _constexpr(name)) for name in FBANK_CONSTANTS},
    **{name: ("cluster.cu", _constexpr(name)) for name in LINKAGE_CONSTANTS},
    "LINKAGE_MAX_POINTS": ("cluster.cu", _constexpr("LINKAGE_MAX_POINTS")),
    **{name: ("lstm.cu", _constexpr(name)) for name in LSTM_CONSTANTS},
    **{name: ("sincnet.cu", _constexpr(name)) for name in SINC_CONSTANTS},
}


def source_problems(ptx_dir: Path = PTX_DIR) -> list[str]:
    """Every CUDA source within MAX_SOURCE_LINES lines and every header with an include
    guard (`#pragma once`), without running any tool."""
    problems = []
    for module in MODULES:
        for name in source_files(ptx_dir, module):
            path = source_path(ptx_dir, name, module)
            if not path.is_file():
                continue  # verify_artifacts reports it
            text = path.read_text(encoding="utf-8")
            lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
            if lines > MAX_SOURCE_LINES:
                problems.append(
                    f"{name} has {lines} lines, more than {MAX_SOURCE_LINES}: split it along "
                    "a seam of its kernel family, or move measurement notes to "
                    "docs/performance.md"
                )
            if name.endswith(".cuh") and not _PRAGMA_ONCE.search(_COMMENT.sub("", text)):
                problems.append(f"{name} has no include guard: add `#pragma once`")
    return problems


def _literal(text: str) -> int | float | None:
    integer = _INT_LITERAL.match(text)
    if integer:
        return int(integer.group(1))
    real = _FLOAT_LITERAL.match(text)
    return float(real.group(1)) if real else None


def cuda_constants(ptx_dir: Path = PTX_DIR) -> tuple[dict[str, tuple[str, int | float]], list[str]]:
    """Each of CUDA_CONSTANTS as the sources define it, `{name: (literal as written,
    value)}`, and the problems in reading them: missing, not a literal, or a `constexpr`
    defined more than once or outside its file."""
    sources = {}
    for module in MODULES:
        for name in source_files(ptx_dir, module):
            path = source_path(ptx_dir, name, module)
            if path.is_file():
                sources[name] = _COMMENT.sub("", path.read_text(encoding="utf-8"))
    found: dict[str, tuple[str, int | float]] = {}
    problems = []
    for constant, (home, pattern) in CUDA_CONSTANTS.items():
        places = [
            (name, m.group(1)) for name, code in sources.items() for m in pattern.finditer(code)
        ]
        if len(places) != 1 or places[0][0] != home:
            where = ", ".join(name for name, _ in places) or "no source"
            problems.append(
                f"{constant} is defined in {where}: define it once, in {home}, where "
                "tools/kernels.py reads it"
            )
            continue
        text = places[0][1]
        value = _literal(text)
        if value is None:
            problems.append(
                f"{constant} in {home} is `{text}`, not a literal tools/kernels.py can read"
            )
            continue
        found[constant] = (text, value)
    return found, problems


def python_constants() -> dict[str, list[tuple[str, int | float]]]:
    """pyspk's value of each of CUDA_CONSTANTS, read now: `{name: [(where, value), ...]}`."""
    from pyspk import reference
    from pyspk.candidate.cluster import plan as linkage
    from pyspk.candidate.framework import DenseSite
    from pyspk.candidate.lstm import plan as lstm
    from pyspk.candidate.segdense import shapes
    from pyspk.candidate.sincnet import plan as sincnet
    from pyspk.candidate.trunk import fbank, pooling
    from pyspk.candidate.trunk import shapes as trunk_shapes

    def dimension(site: DenseSite, axis: int) -> tuple[str, int]:
        return f"DenseSite.{site.name}.dimensions()[{axis}]", site.dimensions()[axis]

    batch = max(shapes.BATCHES)
    heads = (DenseSite.LINEAR0, DenseSite.LINEAR1, DenseSite.CLASSIFIER)
    return {
        "ITEM_ROWS": [dimension(site, 0) for site in heads],
        "LEAKY_SLOPE": [("pyspk.reference.LEAKY_SLOPE", reference.LEAKY_SLOPE)],
        "EMBED_ROWS": [
            (
                "max(BATCHES) * DenseSite.EMBEDDING.dimensions()[0]",
                batch * DenseSite.EMBEDDING.dimensions()[0],
            )
        ],
        "EMBED_COLS": [dimension(DenseSite.EMBEDDING, 1)],
        "EMBED_K": [dimension(DenseSite.EMBEDDING, 2)],
        "EMBED_MAX_SPLITS": [("shapes.EMBED_MAX_SPLITS", shapes.EMBED_MAX_SPLITS)],
        "FLAT_MAX_SPLITS": [("shapes.FLAT_MAX_SPLITS", shapes.FLAT_MAX_SPLITS)],
        "SELECT_ROWS": [("shapes.SELECT_ROWS", shapes.SELECT_ROWS)],
        "HALF_SHARED": [("shapes.HALF_SHARED", shapes.HALF_SHARED)],
        **{
            name: [(f"trunk.shapes.{name}", getattr(trunk_shapes, name))]
            for name in TRUNK_CONSTANTS
        },
        **{name: [(f"trunk.pooling.{name}", getattr(pooling, name))] for name in POOL_CONSTANTS},
        **{name: [(f"trunk.fbank.{name}", getattr(fbank, name))] for name in FBANK_CONSTANTS},
        **{name: [(f"cluster.plan.{name}", getattr(linkage, name))] for name in LINKAGE_CONSTANTS},
        "LINKAGE_MAX_POINTS": [("cluster.plan.MAX_POINTS", linkage.MAX_POINTS)],
        **{name: [(f"lstm.plan.{name}", getattr(lstm, name))] for name in LSTM_CONSTANTS},
        **{name: [(f"sincnet.plan.{name}", getattr(sincnet, name))] for name in SINC_CONSTANTS},
    }


def python_kernels() -> dict[str, dict[str, str]]:
    """Per module, every kernel pyspk launches by name and who names it: each segdense
    Entry's Config and each split count's reduction; each trunk site in both maths."""
    from pyspk.candidate.segdense import selection, shapes
    from pyspk.candidate.trunk import fbank, pooling
    from pyspk.candidate.trunk import shapes as trunk_shapes
    from pyspk.candidate.trunk.shapes import TrunkSite
    from pyspk.cuda.math import CudaMath
    from pyspk.cuda.tier import PtxTier

    segdense: dict[str, str] = {}
    for entry in selection.Entry:
        segdense.setdefault(entry.config(1).kernel, f"Entry.{entry.name}")
    for splits in range(1, shapes.EMBED_MAX_SPLITS + 1):
        segdense.setdefault(shapes.Reduction.shape(splits).kernel, f"Reduction.shape({splits})")
    trunk = {
        site.kernel(math, tier, halves, middle): (
            f"TrunkSite.{site.name}.kernel({math}, {tier}, {halves}, {middle})"
        )
        for site in TrunkSite
        for math in CudaMath
        for tier in (None, PtxTier.SM90)
        for halves in (False, True)
        for middle in (False, True)
    }
    trunk[trunk_shapes.CLEAR_KERNEL] = "shapes.CLEAR_KERNEL"
    trunk[trunk_shapes.CHUNK_MAX_KERNEL] = "shapes.CHUNK_MAX_KERNEL"
    trunk[pooling.POOL_KERNEL] = "pooling.POOL_KERNEL"
    trunk[fbank.FRAMES_KERNEL] = "fbank.FRAMES_KERNEL"
    trunk[fbank.LOG_MEL_KERNEL] = "fbank.LOG_MEL_KERNEL"
    trunk[fbank.CENTRE_KERNEL] = "fbank.CENTRE_KERNEL"
    cluster = {
        name: "pyspk.candidate.cluster"
        for name in ("spk_linkage_neighbours", "spk_linkage_merge", "spk_pdist_euclidean")
    }
    lstm = {"spk_lstm_recurrence": "pyspk.candidate.lstm"}
    sincnet = {
        name: "pyspk.candidate.sincnet" for name in ("spk_sinc_front", "spk_sinc_front_f16x3")
    }
    return {
        "segdense": segdense,
        "trunk": trunk,
        "cluster": cluster,
        "lstm": lstm,
        "sincnet": sincnet,
    }


def _same(cuda: int | float, python: Any) -> bool:
    if isinstance(cuda, float):  # a float literal: the FP32 value the kernels compute with
        return struct.pack("<f", cuda) == struct.pack("<f", float(python))
    return isinstance(python, int) and not isinstance(python, bool) and cuda == python


def pyspk_problems(ptx_dir: Path = PTX_DIR) -> list[str]:
    """Constants of CUDA_CONSTANTS that differ from pyspk's, and kernels pyspk names that
    some tier's PTX does not export, without running any tool."""
    found, problems = cuda_constants(ptx_dir)
    try:
        expected = python_constants()
        kernels = python_kernels()
    except Exception as error:  # an import or attribute error in pyspk
        return [*problems, f"cannot read pyspk's constants and kernel names: {error!r}"]
    for constant, (home, _) in CUDA_CONSTANTS.items():
        if constant not in found:
            continue
        text, value = found[constant]
        for where, python in expected[constant]:
            if not _same(value, python):
                home_path = source_path(ptx_dir, home).relative_to(ptx_dir).as_posix()
                problems.append(
                    f"{constant} differs: {text} in ptx/{home_path}, {python!r} in {where}"
                )
    for module in MODULES:
        for tier in tiers_of(module):
            path = ptx_dir / ptx_name(module, tier)
            if not path.is_file():
                continue  # verify_artifacts reports it
            exported = parse_entries(path.read_text(encoding="utf-8"))
            problems.extend(
                f"kernel {kernel} ({who}) is not exported by {path.name}"
                for kernel, who in sorted(kernels[module].items())
                if kernel not in exported
            )
    return problems


def _header_alone(folder: Path, header: str, tier: Tier, scratch: Path) -> str | None:
    """nvcc's complaint when `header` (in the source `folder`), included twice by a file
    of its own, does not compile for `tier` with the build's flags; None when it does."""
    stem = f"{header.replace('.', '_')}.{tier.name}"
    unit = scratch / f"{stem}.cu"
    unit.write_text(f'#include "{header}"\n#include "{header}"\n', encoding="utf-8")
    command = [find_tool("nvcc"), *NVCC_FLAGS, f"-arch={tier.virtual}"]
    result = subprocess.run(
        [*command, str(unit), "-o", str(scratch / f"{stem}.ptx")],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode == 0:
        return None
    lines = (result.stdout + result.stderr).strip().splitlines()
    if len(lines) > 12:
        lines = [*lines[:12], f"... ({len(lines) - 12} more lines)"]
    return "\n".join(lines)


def header_problems(ptx_dir: Path = PTX_DIR) -> list[str]:
    """Headers that do not compile on their own in some tier (each is compiled alone,
    with the build's nvcc flags, for every tier's virtual architecture, in parallel)."""
    headers = sorted((path.name, path.parent) for path in (ptx_dir / SOURCES).glob("*/*.cuh"))
    problems = []
    with tempfile.TemporaryDirectory(prefix="pyspk-headers-") as scratch:
        jobs = [(header, folder, tier) for header, folder in headers for tier in TIERS]
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            futures = {
                (header, tier): pool.submit(_header_alone, folder, header, tier, Path(scratch))
                for header, folder, tier in jobs
            }
            for (header, tier), future in futures.items():
                error = future.result()
                if error is not None:
                    problems.append(
                        f"{header} does not compile on its own for {tier.virtual} (a "
                        f"header includes every header it uses):\n{error}"
                    )
    return problems


# -- check ----------------------------------------------------------------------------


def verify_artifacts(ptx_dir: Path = PTX_DIR) -> list[str]:
    """Problems with the artifacts in `ptx_dir`, without running any tool: hashes of
    sources, PTX and cubins against the manifest, pinned headers, entries parsed from each
    PTX against the manifest and across tiers, the tier and architecture lists and flags
    against this tool's, no spills, and no stray artifact files. Empty when current."""
    problems: list[str] = []
    try:
        manifest = json.loads((ptx_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return [f"{MANIFEST_NAME} cannot be read: {error}; run `python tools/kernels.py build`"]
    # the loader must accept what the tool wrote; its parse also vouches for the shape
    # of every field the checks below index
    try:
        Manifest.parse(manifest, ptx_dir)
    except ArtifactError as error:
        return [f"the loader refuses the manifest: {error}"]

    if manifest.get("format") != MANIFEST_FORMAT:
        problems.append(
            f"{MANIFEST_NAME}: format {manifest.get('format')!r}, expected {MANIFEST_FORMAT}"
        )
    flags = {"nvcc": list(NVCC_FLAGS), "ptxas": list(PTXAS_FLAGS)}
    if manifest.get("flags") != flags:
        problems.append(
            f"{MANIFEST_NAME}: flags {manifest.get('flags')} differ from the tool's {flags}"
        )
    modules = manifest.get("modules", {})
    if sorted(modules) != sorted(MODULES):
        problems.append(f"{MANIFEST_NAME}: modules {sorted(modules)}, expected {sorted(MODULES)}")

    def check_file(
        name: str, recorded: str | None, stale: str = "", path: Path | None = None
    ) -> bytes | None:
        path = ptx_dir / name if path is None else path
        if not path.is_file():
            problems.append(f"{name} is missing")
            return None
        data = path.read_bytes()
        if sha256(data) != recorded:
            problems.append(
                stale or f"{name} has SHA-256 {sha256(data)}, the manifest records {recorded}"
            )
        return data

    for module, body in sorted(modules.items()):
        recorded_sources = body.get("sources", {})
        expected_sources = source_files(ptx_dir, module)
        if sorted(recorded_sources) != sorted(expected_sources):
            problems.append(
                f"{module}: sources {sorted(recorded_sources)} in the manifest, "
                f"{sorted(expected_sources)} on disk"
            )
        for name in expected_sources:
            stale = f"{name} changed since the last build: run `python tools/kernels.py build`"
            check_file(name, recorded_sources.get(name), stale, source_path(ptx_dir, name, module))

        tiers = body.get("tiers", {})
        expected_tiers = [tier.name for tier in tiers_of(module)]
        if sorted(tiers) != sorted(expected_tiers):
            problems.append(f"{module}: tiers {sorted(tiers)}, expected {expected_tiers}")
        parsed: dict[str, dict[str, list[str]]] = {}
        for tier_name, files in sorted(tiers.items()):
            try:
                tier = tier_by_name(tier_name)
            except KeyError:
                continue
            name = files.get("ptx", "")
            if name != ptx_name(module, tier):
                problems.append(
                    f"{module}.{tier_name}: PTX file {name!r}, expected {ptx_name(module, tier)!r}"
                )
            data = check_file(name, files.get("sha256"))
            if files.get("ptx_version") != tier.ptx_version or files.get("target") != tier.target:
                problems.append(
                    f"{module}.{tier_name}: manifest header ({files.get('ptx_version')}, "
                    f"{files.get('target')}), expected ({tier.ptx_version}, {tier.target})"
                )
            if data is not None:
                text = data.decode("utf-8", "replace")
                found = header(text)
                if found != (tier.ptx_version, tier.target):
                    problems.append(
                        f"{name}: header .version {found[0]} .target {found[1]}, pinned "
                        f".version {tier.ptx_version} .target {tier.target}"
                    )
                entries = parse_entries(text)
                parsed[tier_name] = entries
                if entries != files.get("entries"):
                    problems.append(f"{name}: its .entry list differs from the manifest's")
            cubins = files.get("cubins", {})
            if sorted(cubins) != sorted(tier.archs):
                problems.append(
                    f"{module}.{tier_name}: cubins for {sorted(cubins)}, "
                    f"expected {sorted(tier.archs)}"
                )
            for arch, cubin in sorted(cubins.items()):
                if cubin.get("file") != cubin_name(module, tier, arch):
                    problems.append(
                        f"{module}.{tier_name}.{arch}: cubin file {cubin.get('file')!r}"
                    )
                    continue
                check_file(cubin["file"], cubin.get("sha256"))
                problems.extend(f"{cubin['file']}: {p}" for p in spills(cubin.get("resources", {})))
        problems.extend(_entry_differences(module, parsed))

    known = set(_artifact_files(manifest))
    strays = [p.name for p in ptx_dir.glob("*.ptx") if p.name not in known]
    strays += [
        f"{CUBIN_DIR}/{p.name}"
        for p in (ptx_dir / CUBIN_DIR).glob("*")
        if f"{CUBIN_DIR}/{p.name}" not in known
    ]
    problems.extend(f"{name} is not in the manifest (a stale artifact?)" for name in sorted(strays))
    return problems


def _compare_trees(expected: Path, actual: Path, names: Sequence[str]) -> list[str]:
    problems = []
    for name in names:
        a, b = expected / name, actual / name
        if not a.is_file() or not b.is_file():
            problems.append(f"{name}: present in only one of the committed and rebuilt trees")
        elif a.read_bytes() != b.read_bytes():
            problems.append(f"{name}: the rebuild differs from the committed file")
    return problems


def check(
    ptx_dir: Path = PTX_DIR, rebuild: bool = False, say: Callable[[str], None] = progress
) -> list[str]:
    """Everything `verify_artifacts`, `source_problems`, `pyspk_problems` and
    `header_problems` check, plus ptxas assembling every tier for every listed
    architecture; with `rebuild`, a full rebuild compared byte for byte."""
    say(f"check    {ptx_dir}")
    problems = verify_artifacts(ptx_dir)
    for problem in problems:
        say(f"  FAIL   {problem}")
    if not problems:
        say("  ok     hashes, pinned headers, entry lists and resources match the manifest")
    for step, passed in (
        (source_problems, f"sources within {MAX_SOURCE_LINES} lines, headers guarded"),
        (pyspk_problems, "constants shared with pyspk match, every kernel it names exported"),
    ):
        found = step(ptx_dir)
        for problem in found:
            say(f"  FAIL   {problem}")
        if not found:
            say(f"  ok     {passed}")
        problems.extend(found)

    manifest = (
        json.loads((ptx_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
        if (ptx_dir / MANIFEST_NAME).is_file()
        else {}
    )
    installed = toolchain()
    recorded = manifest.get("toolchain", {})
    if installed != recorded:
        note = f"installed toolchain {installed} differs from the manifest's {recorded}"
        if rebuild:
            problems.append(note + "; a rebuild cannot reproduce the artifacts byte for byte")
            say(f"  FAIL   {note}")
        else:
            say(f"  note   {note}")

    alone = header_problems(ptx_dir)
    for problem in alone:
        say(f"  FAIL   {problem}")
    if not alone:
        say("  ok     every header compiles on its own in every tier")
    problems.extend(alone)

    with tempfile.TemporaryDirectory(prefix="pyspk-check-") as scratch:
        scratch_dir = Path(scratch)
        jobs = []
        for module in MODULES:
            for tier in tiers_of(module):
                ptx = ptx_dir / ptx_name(module, tier)
                if ptx.is_file():
                    jobs.extend((module, tier, arch) for arch in tier.archs)
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            futures = {
                job: pool.submit(
                    assemble,
                    ptx_dir / ptx_name(job[0], job[1]),
                    job[2],
                    scratch_dir / f"{job[0]}.{job[1].name}.{job[2]}.cubin",
                )
                for job in jobs
            }
            for (module, tier, arch), future in futures.items():
                try:
                    future.result()
                    say(f"  ok     ptxas assembles {ptx_name(module, tier)} for {arch}")
                except ToolError as error:
                    problems.append(str(error))
                    say(f"  FAIL   ptxas {ptx_name(module, tier)} for {arch}: {error}")

        if rebuild:
            say("rebuild  into a temporary directory")
            rebuilt = scratch_dir / "rebuilt"
            build(ptx_dir, rebuilt, say=lambda line: say(f"  {line}"))
            fresh = json.loads((rebuilt / MANIFEST_NAME).read_text(encoding="utf-8"))
            known = set(_artifact_files(fresh)) | set(_artifact_files(manifest))
            names = [*sorted(known), MANIFEST_NAME]
            differences = _compare_trees(ptx_dir, rebuilt, names)
            for difference in differences:
                say(f"  FAIL   {difference}")
            if not differences:
                say(
                    f"  ok     rebuild matches the committed artifacts byte for byte "
                    f"({len(names)} files)"
                )
            problems.extend(differences)
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="regenerate the PTX tiers, cubins and manifest")
    check_parser = commands.add_parser("check", help="verify that the artifacts are current")
    check_parser.add_argument(
        "--rebuild",
        action="store_true",
        help="rebuild into a temporary directory and compare bytes",
    )
    parser.add_argument("--ptx-dir", type=Path, default=PTX_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(args.ptx_dir, args.ptx_dir)
            progress(f"built    {args.ptx_dir / MANIFEST_NAME}")
            return 0
        problems = check(args.ptx_dir, rebuild=args.rebuild)
    except ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if problems:
        print(f"check failed: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    progress("check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
