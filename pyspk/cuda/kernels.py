"""Kernel modules loaded into a context: their functions and prepared launches.

Loading takes the artifact `pyspk.cuda.manifest` chooses for the device, checks its bytes
against the manifest, and resolves every entry the manifest lists, so a missing kernel
is found at load rather than at the first plan.

This module never imports `cuda.bindings`; the driver is reached through
`pyspk.cuda.driver`, and only inside the functions that need a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspk.cuda.errors import (
    ArtifactError,
    CudaError,
    DriverError,
    InvalidArgument,
    KernelMissingError,
)
from pyspk.cuda.manifest import (
    Artifact,
    KernelModule,
    Manifest,
    choose_artifact,
    force_ptx_from_env,
    read_artifact,
)
from pyspk.cuda.tier import ComputeCapability, PtxTier

__all__ = ["BOUND_STREAMS", "Kernel", "Launch", "LoadedKernels", "load_kernels"]

BOUND_STREAMS = 16
"""Caller streams a plan keeps its launches bound to (`Launch.bind`); past this many it
starts afresh, so a caller cycling through streams cannot grow it without end."""

# Kernel parameter kinds of the calling convention (ptx/src/common/common.cuh): every buffer is a
# 64-bit pointer followed by its element count as a 64-bit unsigned integer; scalars are
# 32-bit unsigned
PARAM_KINDS: Mapping[str, type[ctypes._SimpleCData]] = {
    "ptr": ctypes.c_uint64,
    "u64": ctypes.c_uint64,
    "u32": ctypes.c_uint32,
}
_PARAM_LIMITS = {"ptr": 1 << 64, "u64": 1 << 64, "u32": 1 << 32}


def buffer_params(name: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """A buffer parameter of the calling convention, named: its pointer and element
    count."""
    return ((name, "ptr"), (f"{name}_len", "u64"))


# a launch's grid or block (one extent, or up to three), its parameter kinds (each bare,
# or named as a (name, kind) pair) and their values
Dims = int | Sequence[int]
Signature = Sequence[str | tuple[str, str]]
Values = Sequence[Any]


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

    def shared_room(self, optin_bytes: int) -> int:
        """The dynamic shared memory a block of this kernel can have on a device whose
        blocks opt in to `optin_bytes` in all: that less the kernel's static shared
        memory."""
        return optin_bytes - self.attribute("SHARED_SIZE_BYTES")

    def attribute(self, name: str) -> int:
        """A `CU_FUNC_ATTRIBUTE_*` value, e.g. "NUM_REGS" or "MAX_THREADS_PER_BLOCK"."""
        from pyspk.cuda import driver

        attribute = getattr(driver.api().CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
        return int(driver.call("cuFuncGetAttribute", attribute, self.handle))

    def launch(
        self, grid: Dims, block: Dims, shared: int, signature: Signature, values: Values
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
        grid: Dims,
        block: Dims,
        shared: int,
        signature: Signature,
        values: Values,
    ) -> None:
        from pyspk.cuda import driver

        # parameters are (name, kind) pairs, or bare kinds named p0, p1, ...
        named = [
            (item if isinstance(item, tuple) else (f"p{index}", item))
            for index, item in enumerate(signature)
        ]
        kinds = tuple(kind for _, kind in named)
        unknown = [kind for kind in kinds if kind not in PARAM_KINDS]
        if unknown:
            raise InvalidArgument(
                f"unknown kernel parameter kinds {unknown}; use {list(PARAM_KINDS)}"
            )
        if len(values) != len(kinds):
            raise InvalidArgument(
                f"{kernel.name}: {len(values)} values for {len(kinds)} parameters"
            )
        self.kernel = kernel
        self.grid = _dims(grid, "grid")
        self.block = _dims(block, "block")
        self.shared = operator.index(shared)
        if self.shared < 0:
            raise InvalidArgument(f"dynamic shared memory cannot be {self.shared} bytes")
        self.signature = kinds
        self._names = tuple(name for name, _ in named)
        if len(set(self._names)) != len(self._names):
            raise InvalidArgument(f"{kernel.name}: parameter names repeat in {self._names}")
        fields = [(name, PARAM_KINDS[kind]) for name, kind in zip(self._names, kinds, strict=True)]
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

        # the bound call points into this Launch's parameter block: the launcher keeps
        # it alive, or a launcher outliving its Launch would pass freed memory
        launch.prepared = self  # type: ignore[attr-defined]
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
