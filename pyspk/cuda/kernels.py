"""Kernel modules: the shipped artifacts and their manifest, loading, functions and
prepared launches.

A module (`KernelModule.SEGDENSE`) ships as PTX in tiers (`segdense.sm75.ptx`,
`segdense.sm80.ptx`) plus exact-architecture cubins assembled from each tier, all listed
with their SHA-256 in `manifest.json` (written by `tools/kernels.py build`). Loading picks
the highest tier the device runs (or a lower one that is asked for), the cubin built for
exactly the device's architecture when there is one and otherwise the PTX for the driver
to JIT, refuses bytes whose hash differs from the manifest, and resolves every entry the
manifest lists, so a missing kernel is found at load rather than at the first plan.

This module never imports `cuda.bindings`; the driver is reached through
`pyspk.cuda.driver`, and only inside the functions that need a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
import hashlib
import json
import operator
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from pyspk.cuda.errors import (
    ArtifactError,
    CudaError,
    DriverError,
    InvalidArgument,
    KernelMissingError,
)
from pyspk.cuda.tier import MANIFEST_FORMAT, MANIFEST_NAME, ComputeCapability, PtxTier

__all__ = [
    "FORCE_PTX_JIT_ENV",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "Artifact",
    "CubinFile",
    "Kernel",
    "KernelModule",
    "Launch",
    "LoadedKernels",
    "Manifest",
    "ModuleManifest",
    "TierFiles",
    "artifact_dir",
    "choose_artifact",
    "load_kernels",
]

FORCE_PTX_JIT_ENV = "PYSPK_FORCE_PTX_JIT"

# Kernel parameter kinds of the calling convention: device pointers and element counts
# are 64-bit, scalars 32-bit (DESIGN.md section 4)
PARAM_KINDS: Mapping[str, type[ctypes._SimpleCData]] = {
    "ptr": ctypes.c_uint64,
    "u64": ctypes.c_uint64,
    "u32": ctypes.c_uint32,
}
_PARAM_LIMITS = {"ptr": 1 << 64, "u64": 1 << 64, "u32": 1 << 32}


class KernelModule(enum.Enum):
    """A kernel module shipped with pyspk; `str(module)` is its artifact name."""

    SEGDENSE = "segdense"

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

    The tier is the highest one the manifest has at or below the device, or
    `tier_override` when given (`ArtifactError` if that tier is above the device or not
    shipped). The cubin built for exactly `capability.sm` is used when the tier has one
    and `force_ptx` is false; otherwise the tier's PTX, which the driver JITs.
    """
    highest = PtxTier.highest_for(capability, manifest.tiers)
    if tier_override is not None:
        if tier_override.capability > capability:
            raise ArtifactError(
                f"the {tier_override} {manifest.name} tier was asked for, but the device "
                f"(compute capability {capability}) runs tiers up to "
                f"{PtxTier.highest_for(capability) or 'none'}"
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
    cubin = None if force_ptx else files.cubins.get(capability.sm)
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


class Kernel:
    """One resolved entry of a loaded module."""

    def __init__(self, name: str, handle: Any, module: LoadedKernels) -> None:
        self.name = name
        self.handle = handle  # the CUfunction
        self._module = module
        self._max_dynamic_shared: int | None = None

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Allow `nbytes` of dynamic shared memory per block (set once; repeats are free)."""
        nbytes = operator.index(nbytes)
        if nbytes == self._max_dynamic_shared:
            return
        if nbytes < 0:
            raise InvalidArgument(f"{self.name}: dynamic shared memory cannot be {nbytes} bytes")
        from pyspk.cuda import driver

        attribute = driver.api().CUfunction_attribute
        driver.call(
            "cuFuncSetAttribute",
            self.handle,
            attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            nbytes,
        )
        self._max_dynamic_shared = nbytes

    def attribute(self, name: str) -> int:
        """A `CU_FUNC_ATTRIBUTE_*` value, e.g. "NUM_REGS" or "MAX_THREADS_PER_BLOCK"."""
        from pyspk.cuda import driver

        attribute = getattr(driver.api().CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
        return int(driver.call("cuFuncGetAttribute", attribute, self.handle))

    def launch(
        self,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        shared: int,
        signature: Sequence[str | tuple[str, str]],
        values: Sequence[Any],
    ) -> Launch:
        """A prepared `Launch` of this kernel (see `Launch`)."""
        return Launch(self, grid, block, shared, signature, values)

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, {self._module.artifact})"


class LoadedKernels:
    """A module loaded into the current context, with every manifest entry resolved."""

    def __init__(
        self,
        module: KernelModule,
        artifact: Artifact,
        handle: Any,
        functions: Mapping[str, Any],
    ) -> None:
        self.module = module
        self.tier: PtxTier = artifact.tier
        self.artifact: str = artifact.describe()
        self._handle = handle
        self._kernels = {name: Kernel(name, fn, self) for name, fn in functions.items()}

    @property
    def entries(self) -> tuple[str, ...]:
        return tuple(sorted(self._kernels))

    @property
    def unloaded(self) -> bool:
        return self._handle is None

    def function(self, name: str) -> Kernel:
        """The entry `name`; `KernelMissingError` when the module has no such entry."""
        if self._handle is None:
            raise CudaError(f"the {self.module} module ({self.artifact}) was unloaded")
        kernel = self._kernels.get(name)
        if kernel is None:
            raise KernelMissingError(
                f"the {self.module} module ({self.artifact}) has no entry {name!r}"
            )
        return kernel

    def unload(self) -> None:
        """Unload the module from its context (idempotent)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            from pyspk.cuda import driver

            driver.call("cuModuleUnload", handle)

    def __repr__(self) -> str:
        return f"LoadedKernels({self.module}, {self.artifact}, {len(self._kernels)} entries)"


def load_kernels(
    module: KernelModule,
    capability: ComputeCapability,
    tier: PtxTier | None = None,
    *,
    directory: Path | None = None,
) -> LoadedKernels:
    """Load `module` into the current context for a device of `capability`.

    `tier` (else `PYSPK_PTX_TIER`) lowers the tier; `PYSPK_FORCE_PTX_JIT=1` loads the PTX
    even where a cubin ships. Every entry the manifest lists is resolved here
    (`KernelMissingError` names one that is missing).
    """
    from pyspk.cuda import driver

    manifest = Manifest.load(directory)
    module_manifest = manifest.module(module)
    override = tier if tier is not None else PtxTier.from_env()
    artifact = choose_artifact(module_manifest, capability, override, force_ptx_from_env())
    data = read_artifact(manifest.directory, artifact)
    if not artifact.is_cubin and not data.endswith(b"\0"):
        data += b"\0"  # the driver reads PTX as a C string
    try:
        handle = driver.call("cuModuleLoadData", data)
    except DriverError as error:
        raise ArtifactError(
            f"the driver refused {artifact.describe()} for compute capability {capability}: {error}"
        ) from error
    functions: dict[str, Any] = {}
    try:
        for name in sorted(module_manifest.tier_files(artifact.tier).entries):
            try:
                functions[name] = driver.call("cuModuleGetFunction", handle, name.encode())
            except DriverError as error:
                raise KernelMissingError(
                    f"{artifact.describe()} does not export the entry {name!r} its manifest "
                    f"lists ({error.result_name})"
                ) from error
    except BaseException:
        with contextlib.suppress(Exception):  # the error being raised is the one to see
            driver.call("cuModuleUnload", handle)
        raise
    return LoadedKernels(module, artifact, handle, functions)


# -- prepared launches -----------------------------------------------------------------


def _dims(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    try:
        dims: tuple[int, ...] = (operator.index(value), 1, 1)  # type: ignore[arg-type]
    except TypeError:
        dims = tuple(operator.index(d) for d in value)  # type: ignore[union-attr]
    if len(dims) != 3 or min(dims) < 1:
        raise InvalidArgument(
            f"{what} must be a positive int or three positive ints, got {value!r}"
        )
    return dims  # type: ignore[return-value]


def _param_value(kind: str, value: Any) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        # driver handles (CUdeviceptr) convert with int() but not operator.index
        if kind != "ptr" or isinstance(value, float) or not hasattr(value, "__int__"):
            raise InvalidArgument(
                f"a {kind} kernel parameter must be an int, got {value!r}"
            ) from None
        number = int(value)
    if not 0 <= number < _PARAM_LIMITS[kind]:
        raise InvalidArgument(f"{number} does not fit a {kind} kernel parameter")
    return number


class Launch:
    """One kernel launch prepared at plan time, re-enqueued without allocating.

    The parameters live in a ctypes structure (one field per parameter, C alignment)
    and `kernelParams` is a `void*[]` of the fields' addresses, both built once; the
    binding receives that array's address as an int, which it passes through as the
    `void**`. `set` rewrites one field in place (buffers change between enqueues);
    `enqueue` calls the cached `cuLaunchKernel` with everything but the stream bound.
    """

    def __init__(
        self,
        kernel: Kernel,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        shared: int,
        signature: Sequence[str | tuple[str, str]],
        values: Sequence[Any],
    ) -> None:
        from pyspk.cuda import driver

        # parameters are (name, kind) pairs, or bare kinds named p0, p1, ...
        named = [
            (item if isinstance(item, tuple) else (f"p{index}", item))
            for index, item in enumerate(signature)
        ]
        signature = tuple(kind for _, kind in named)
        unknown = [kind for kind in signature if kind not in PARAM_KINDS]
        if unknown:
            raise InvalidArgument(
                f"unknown kernel parameter kinds {unknown}; use {list(PARAM_KINDS)}"
            )
        if len(values) != len(signature):
            raise InvalidArgument(
                f"{kernel.name}: {len(values)} values for {len(signature)} parameters"
            )
        self.kernel = kernel
        self.grid = _dims(grid, "grid")
        self.block = _dims(block, "block")
        self.shared = operator.index(shared)
        if self.shared < 0:
            raise InvalidArgument(f"dynamic shared memory cannot be {self.shared} bytes")
        self.signature = signature
        self._names = tuple(name for name, _ in named)
        if len(set(self._names)) != len(self._names):
            raise InvalidArgument(f"{kernel.name}: parameter names repeat in {self._names}")
        fields = [
            (name, PARAM_KINDS[kind]) for name, kind in zip(self._names, signature, strict=True)
        ]
        block_type = type("KernelParams", (ctypes.Structure,), {"_fields_": fields})
        self._params = block_type()
        for index, value in enumerate(values):
            self.set(index, value)
        base = ctypes.addressof(self._params)
        offsets = [getattr(block_type, name).offset for name in self._names]
        self._pointers = (ctypes.c_void_p * max(1, len(offsets)))(
            *(base + offset for offset in offsets)
        )
        self.params_address = ctypes.addressof(self._pointers) if offsets else 0

        api = driver.api()
        self._stream_type = api.CUstream
        self._success = api.CUresult.CUDA_SUCCESS
        self._partial = functools.partial(
            api.cuLaunchKernel, kernel.handle, *self.grid, *self.block, self.shared
        )
        self._stream_key: Any = None
        self._bound: Any = None

    def _index(self, parameter: int | str) -> int:
        if isinstance(parameter, str):
            try:
                return self._names.index(parameter)
            except ValueError:
                raise KeyError(
                    f"{self.kernel.name} has no parameter {parameter!r} ({self._names})"
                ) from None
        return operator.index(parameter)

    def set(self, parameter: int | str, value: Any) -> None:
        """Rewrite a parameter, by index or name, in place (the pointer array stays
        valid)."""
        index = self._index(parameter)
        setattr(self._params, self._names[index], _param_value(self.signature[index], value))

    def value(self, parameter: int | str) -> int:
        return getattr(self._params, self._names[self._index(parameter)])

    def setter(self, parameter: int | str) -> Callable[[int], None]:
        """A one-argument writer of a parameter, by index or name, without `set`'s
        checks, for a hot path whose values are already checked (addresses from
        `device_address`)."""
        return functools.partial(setattr, self._params, self._names[self._index(parameter)])

    def bind(self, stream: Any) -> Callable[[], None]:
        """A zero-argument launcher on `stream`, bound once so a hot path pays only the
        driver call and the result check."""
        self._bind(stream)
        bound, success, name = self._bound, self._success, self.kernel.name

        def launch() -> None:
            status = bound()[0]
            if status is not success and int(status) != 0:
                from pyspk.cuda import driver

                driver.unwrap(f"cuLaunchKernel({name})", (status,))

        return launch

    def enqueue(self, stream: Any) -> None:
        """Launch on `stream`, a `CUstream` (as `CudaRuntime.stream`) or an int handle."""
        if stream is not self._stream_key:
            self._bind(stream)
        status = self._bound()[0]
        if status is not self._success and int(status) != 0:
            from pyspk.cuda import driver

            driver.unwrap(f"cuLaunchKernel({self.kernel.name})", (status,))

    def _bind(self, stream: Any) -> None:
        handle = (
            stream
            if isinstance(stream, self._stream_type)
            else self._stream_type(operator.index(stream))
        )
        self._bound = functools.partial(self._partial, handle, self.params_address, 0)
        self._stream_key = stream

    def __repr__(self) -> str:
        values = ", ".join(f"{name}={self.value(i):#x}" for i, name in enumerate(self._names))
        return f"Launch({self.kernel.name}, grid={self.grid}, block={self.block}, {values})"
