"""The shipped kernel artifacts: the modules, their manifest and the artifact a device
loads.

A module (`KernelModule.SEGDENSE`) ships as PTX in tiers (`segdense.sm75.ptx`,
`segdense.sm80.ptx`) plus exact-architecture cubins assembled from each tier, all listed
with their SHA-256 in `manifest.json` (written by `tools/kernels.py build`). A device
loads the highest tier it runs (or a lower one that is asked for), the cubin built for
exactly its architecture when there is one and otherwise the PTX for the driver to JIT;
bytes whose hash differs from the manifest are refused. Pure: no driver import."""

from __future__ import annotations

import enum
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from pyspk.cuda.errors import ArtifactError
from pyspk.cuda.tier import MANIFEST_FORMAT, MANIFEST_NAME, ComputeCapability, PtxTier

__all__ = [
    "FORCE_PTX_JIT_ENV",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "Artifact",
    "CubinFile",
    "KernelModule",
    "Manifest",
    "ModuleManifest",
    "TierFiles",
    "artifact_dir",
    "choose_artifact",
    "force_ptx_from_env",
    "read_artifact",
]

FORCE_PTX_JIT_ENV = "PYSPK_FORCE_PTX_JIT"


class KernelModule(enum.Enum):
    """A kernel module shipped with pyspk; `str(module)` is its artifact name."""

    SEGDENSE = "segdense"
    TRUNK = "trunk"
    CLUSTER = "cluster"
    LSTM = "lstm"
    SINCNET = "sincnet"

    def __str__(self) -> str:
        return self.value


def artifact_dir() -> Path:
    """Where the artifacts live: `pyspk/_ptx` in an installed wheel, else the source
    tree's `ptx/`."""
    package = Path(__file__).resolve().parent.parent
    packaged = package / "_ptx"
    if packaged.is_dir():
        return packaged
    return package.parent / "ptx"


# -- manifest -------------------------------------------------------------------------


@attrs.frozen
class CubinFile:
    """One exact-architecture cubin assembled from a tier's PTX."""

    arch: str
    file: str
    sha256: str


@attrs.frozen
class TierFiles:
    """One PTX tier of a module: its file, pinned header, entries and cubins."""

    tier: PtxTier
    ptx: str
    sha256: str
    ptx_version: str
    target: str
    # entry name -> PTX parameter types in order ("u64", "u32")
    entries: Mapping[str, tuple[str, ...]]
    cubins: Mapping[str, CubinFile]


@attrs.frozen
class ModuleManifest:
    """What the manifest says of one module."""

    name: str
    sources: Mapping[str, str]
    tiers: Mapping[PtxTier, TierFiles]

    def tier_files(self, tier: PtxTier) -> TierFiles:
        found = self.tiers.get(tier)
        if found is None:
            have = ", ".join(str(t) for t in sorted(self.tiers)) or "none"
            raise ArtifactError(f"the {self.name} module ships no {tier} tier (it has {have})")
        return found


@attrs.frozen
class Manifest:
    """The parsed `manifest.json` of an artifact directory."""

    directory: Path
    toolchain: Mapping[str, str]
    flags: Mapping[str, tuple[str, ...]]
    modules: Mapping[str, ModuleManifest]

    @classmethod
    def load(cls, directory: Path | None = None) -> Manifest:
        """Read and parse `directory/manifest.json` (default: `artifact_dir()`)."""
        directory = artifact_dir() if directory is None else Path(directory)
        path = directory / MANIFEST_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ArtifactError(
                f"cannot read the kernel manifest {path}: {error.strerror or error}; "
                "run `python tools/kernels.py build` in a source checkout"
            ) from error
        try:
            data = json.loads(text)
        except ValueError as error:
            raise ArtifactError(f"{path} is not valid JSON: {error}") from error
        return cls.parse(data, directory)

    @classmethod
    def parse(cls, data: object, directory: Path) -> Manifest:
        """Validate the decoded JSON; `ArtifactError` names the first bad field."""
        root = _mapping(data, MANIFEST_NAME)
        version = root.get("format")
        if version != MANIFEST_FORMAT:
            raise ArtifactError(
                f"{MANIFEST_NAME}: format {version!r} is not the supported {MANIFEST_FORMAT}"
            )
        toolchain = {
            key: _string(value, f"toolchain.{key}")
            for key, value in _mapping(root.get("toolchain"), "toolchain").items()
        }
        flags = {
            key: tuple(_string(item, f"flags.{key}[]") for item in _list(value, f"flags.{key}"))
            for key, value in _mapping(root.get("flags"), "flags").items()
        }
        modules = {
            name: _parse_module(name, value)
            for name, value in _mapping(root.get("modules"), "modules").items()
        }
        return cls(Path(directory), toolchain, flags, modules)

    def module(self, module: KernelModule | str) -> ModuleManifest:
        name = str(module)
        found = self.modules.get(name)
        if found is None:
            raise ArtifactError(f"{self.directory / MANIFEST_NAME} lists no module {name!r}")
        return found


def _where(path: str) -> str:
    return f"{MANIFEST_NAME}: {path}"


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ArtifactError(f"{_where(path)} is missing or not an object")
    return value


def _list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise ArtifactError(f"{_where(path)} is missing or not a list")
    return value


def _string(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ArtifactError(f"{_where(path)} is missing or not a non-empty string")
    return value


def _digest(value: object, path: str) -> str:
    text = _string(value, path)
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise ArtifactError(f"{_where(path)} is not a lowercase hex SHA-256")
    return text


def _relative(value: object, path: str) -> str:
    # artifact paths stay inside the artifact directory
    text = _string(value, path)
    parts = Path(text).parts
    if Path(text).is_absolute() or ".." in parts or "\\" in text:
        raise ArtifactError(f"{_where(path)} {text!r} is not a plain relative path")
    return text


def _parse_module(name: str, value: object) -> ModuleManifest:
    where = f"modules.{name}"
    body = _mapping(value, where)
    sources = {
        _relative(file, f"{where}.sources"): _digest(digest, f"{where}.sources.{file}")
        for file, digest in _mapping(body.get("sources"), f"{where}.sources").items()
    }
    tiers: dict[PtxTier, TierFiles] = {}
    for tier_name, tier_value in _mapping(body.get("tiers"), f"{where}.tiers").items():
        try:
            tier = PtxTier.parse(tier_name)
        except ValueError as error:
            raise ArtifactError(f"{_where(where)}.tiers: {error}") from error
        tiers[tier] = _parse_tier(tier, tier_value, f"{where}.tiers.{tier_name}")
    if not tiers:
        raise ArtifactError(f"{_where(where)} has no tiers")
    return ModuleManifest(name, sources, tiers)


def _parse_tier(tier: PtxTier, value: object, where: str) -> TierFiles:
    body = _mapping(value, where)
    entries: dict[str, tuple[str, ...]] = {}
    for entry, params in _mapping(body.get("entries"), f"{where}.entries").items():
        kinds = tuple(
            _string(kind, f"{where}.entries.{entry}[]")
            for kind in _list(params, f"{where}.entries.{entry}")
        )
        entries[entry] = kinds
    if not entries:
        raise ArtifactError(f"{_where(where)}.entries is empty")
    cubins: dict[str, CubinFile] = {}
    for arch, cubin in _mapping(body.get("cubins"), f"{where}.cubins").items():
        cubin_body = _mapping(cubin, f"{where}.cubins.{arch}")
        cubins[arch] = CubinFile(
            arch,
            _relative(cubin_body.get("file"), f"{where}.cubins.{arch}.file"),
            _digest(cubin_body.get("sha256"), f"{where}.cubins.{arch}.sha256"),
        )
    return TierFiles(
        tier=tier,
        ptx=_relative(body.get("ptx"), f"{where}.ptx"),
        sha256=_digest(body.get("sha256"), f"{where}.sha256"),
        ptx_version=_string(body.get("ptx_version"), f"{where}.ptx_version"),
        target=_string(body.get("target"), f"{where}.target"),
        entries=entries,
        cubins=cubins,
    )


# -- choosing and reading an artifact -------------------------------------------------


@attrs.frozen
class Artifact:
    """The file one load uses: a cubin for `arch`, or the tier's PTX when `arch` is None."""

    module: str
    tier: PtxTier
    file: str
    sha256: str
    arch: str | None = None

    @property
    def is_cubin(self) -> bool:
        return self.arch is not None

    def describe(self) -> str:
        """What was loaded, e.g. `segdense.sm80 cubin sm_90`, `segdense.sm80.ptx (JIT)`."""
        if self.arch is not None:
            return f"{self.module}.{self.tier} cubin {self.arch}"
        return f"{Path(self.file).name} (JIT)"


def choose_artifact(
    manifest: ModuleManifest,
    capability: ComputeCapability,
    tier_override: PtxTier | None = None,
    force_ptx: bool = False,
) -> Artifact:
    """The artifact a device of `capability` loads.

    The tier is the highest one the manifest has that the device runs, or
    `tier_override` when given (`ArtifactError` if the device does not run that tier or
    it is not shipped). The cubin built for exactly `capability.sm` (its "a" form in an
    arch-specific tier) is used when the tier has one and `force_ptx` is false; otherwise
    the tier's PTX, which the driver JITs.
    """
    highest = PtxTier.highest_for(capability, manifest.tiers)
    if tier_override is not None:
        if not tier_override.runs_on(capability):
            raise ArtifactError(
                f"the {tier_override} {manifest.name} tier was asked for, but the device "
                f"(compute capability {capability}) runs tiers up to "
                f"{PtxTier.highest_for(capability) or 'none'}"
                + (
                    f"; {tier_override} runs only on compute capability {tier_override.capability}"
                    if tier_override.arch_specific
                    else ""
                )
            )
        tier = tier_override
    elif highest is not None:
        tier = highest
    else:
        have = ", ".join(str(t) for t in sorted(manifest.tiers))
        raise ArtifactError(
            f"no {manifest.name} tier runs on compute capability {capability} "
            f"(the module ships {have})"
        )
    files = manifest.tier_files(tier)
    # an arch-specific tier's cubins are named for it ("sm_90a")
    arch = f"{capability.sm}a" if tier.arch_specific else capability.sm
    cubin = None if force_ptx else files.cubins.get(arch)
    if cubin is not None:
        return Artifact(manifest.name, tier, cubin.file, cubin.sha256, cubin.arch)
    return Artifact(manifest.name, tier, files.ptx, files.sha256)


def read_artifact(directory: Path, artifact: Artifact) -> bytes:
    """The artifact's bytes, after checking them against the manifest's SHA-256."""
    path = Path(directory) / artifact.file
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ArtifactError(
            f"kernel artifact {artifact.file} cannot be read ({error.strerror or error}) "
            f"from {directory}"
        ) from error
    digest = hashlib.sha256(data).hexdigest()
    if digest != artifact.sha256:
        raise ArtifactError(
            f"kernel artifact {artifact.file} has SHA-256 {digest}, but the manifest records "
            f"{artifact.sha256}: the file was altered or is stale; rebuild with "
            "`python tools/kernels.py build` or reinstall pyspk"
        )
    return data


def force_ptx_from_env() -> bool:
    """Whether PYSPK_FORCE_PTX_JIT=1 asks for the PTX even where a cubin ships."""
    return os.environ.get(FORCE_PTX_JIT_ENV, "").strip() == "1"


# -- loaded modules and kernels --------------------------------------------------------
