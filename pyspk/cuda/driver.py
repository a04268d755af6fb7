"""The one door to the CUDA driver: `cuda.bindings.driver`, loaded on first use.

Every driver call goes through `call`, which turns the `(CUresult, *values)` tuple the
binding returns into the values or a `DriverError` naming the call and the result.
Nothing here runs at import time, so importing pyspk needs neither a driver nor
cuda-bindings; a machine without them gets `NoDriverError` at the first call that needs a
GPU.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from pyspk.cuda.errors import DriverError, NoDeviceError, NoDriverError

_INSTALL_BINDINGS = "install it with `pip install cuda-bindings`"
_INSTALL_DRIVER = (
    "run on a machine with an NVIDIA GPU and install the NVIDIA driver there (it provides "
    "libcuda.so.1 on Linux, nvcuda.dll on Windows)"
)
_BINDING_MODULES = frozenset({"cuda", "cuda.bindings", "cuda.bindings.driver"})
_NAME_LENGTH = 256
_SUCCESS = 0
_NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE

_lock = threading.Lock()
_api: Any = None


def api() -> Any:
    """The initialised `cuda.bindings.driver` module (cuInit(0) runs once per process)."""
    module = _api
    if module is not None:
        return module
    return _load()


def _load() -> Any:
    global _api
    with _lock:
        if _api is not None:
            return _api
        try:
            module = importlib.import_module("cuda.bindings.driver")
        except ModuleNotFoundError as error:
            if error.name not in _BINDING_MODULES:
                raise NoDriverError(
                    f"cuda.bindings.driver failed to import ({error}); reinstall it with "
                    "`pip install --force-reinstall cuda-bindings`"
                ) from error
            raise NoDriverError(
                f"the CUDA driver binding is not installed ({error}); {_INSTALL_BINDINGS}"
            ) from error
        except Exception as error:  # some binding versions open libcuda while importing
            raise NoDriverError(
                f"importing cuda.bindings.driver failed ({_detail(error)}); {_INSTALL_DRIVER}"
            ) from error
        try:
            result = module.cuInit(0)
        except Exception as error:  # the binding raises (not returns) when libcuda is absent
            raise NoDriverError(
                f"the NVIDIA driver library (libcuda) could not be loaded, so cuInit failed "
                f"({_detail(error)}); {_INSTALL_DRIVER}"
            ) from error
        status = result[0] if isinstance(result, tuple) else result
        if int(status) != _SUCCESS:
            name, text = _describe(module, status)
            if int(status) == _NO_DEVICE:
                raise NoDeviceError(
                    f"the NVIDIA driver found no CUDA device: cuInit returned {name}: {text}; "
                    "check that a GPU is installed and visible (CUDA_VISIBLE_DEVICES)"
                )
            raise NoDriverError(
                f"the NVIDIA driver did not initialise: cuInit returned {name} "
                f"({int(status)}): {text}; {_INSTALL_DRIVER}, at a version that supports "
                "the installed cuda-bindings"
            )
        _api = module
        return module


def _detail(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().rstrip('.')}"


def _describe(module: Any, status: Any) -> tuple[str, str]:
    """The CUresult's name and description, falling back to what the enum itself knows."""
    code = int(status)
    name = getattr(status, "name", None) or f"CUresult {code}"
    text = "no description from the driver"
    for getter, is_name in (("cuGetErrorName", True), ("cuGetErrorString", False)):
        try:
            found, raw = getattr(module, getter)(status)
        except Exception:  # the description is a courtesy; never mask the real error
            continue
        if int(found) != _SUCCESS or not raw:
            continue
        value = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if is_name:
            name = value
        else:
            text = value
    return name, text


def unwrap(call_name: str, result: Any) -> Any:
    """Turn a binding's `(CUresult, *values)` into None, the one value, or a tuple."""
    if isinstance(result, tuple):
        status, values = result[0], result[1:]
    else:
        status, values = result, ()
    if int(status) != _SUCCESS:
        name, text = _describe(api(), status)
        raise DriverError(call_name, name, text, int(status))
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return values


def call(name: str, *args: Any) -> Any:
    """Run `cuda.bindings.driver.<name>(*args)`; a failing CUresult raises `DriverError`."""
    return unwrap(name, getattr(api(), name)(*args))


def driver_version() -> int:
    """The CUDA version the driver supports, as cuDriverGetVersion gives it (13000)."""
    return int(call("cuDriverGetVersion"))


def device_memory(ordinal: int) -> int:
    """Bytes of memory on device `ordinal`."""
    return int(call("cuDeviceTotalMem", device(ordinal)))


def device_count() -> int:
    """How many CUDA devices the driver sees."""
    return int(call("cuDeviceGetCount"))


def device(ordinal: int) -> Any:
    """The CUdevice of `ordinal`; `NoDeviceError` when there is none or it is out of range."""
    count = device_count()
    if count == 0:
        raise NoDeviceError(
            "the NVIDIA driver reports no CUDA device; check that a GPU is installed and "
            "visible (CUDA_VISIBLE_DEVICES)"
        )
    if not 0 <= ordinal < count:
        raise NoDeviceError(
            f"CUDA device {ordinal} does not exist: {count} device(s) are visible "
            f"(ordinals 0..{count - 1})"
        )
    return call("cuDeviceGet", ordinal)


def device_properties(ordinal: int = 0) -> dict[str, Any]:
    """Capability (major, minor), multiprocessors, opt-in shared memory per block, L2 size
    and name of a device, as `DeviceAttributes.query` takes them."""
    dev = device(ordinal)
    attribute = api().CUdevice_attribute

    def read(name: str) -> int:
        return int(call("cuDeviceGetAttribute", getattr(attribute, name), dev))

    raw = call("cuDeviceGetName", _NAME_LENGTH, dev)
    if isinstance(raw, bytes):
        name = raw.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
    else:
        name = str(raw).split("\0", 1)[0].strip()
    return {
        "capability": (
            read("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
            read("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"),
        ),
        "multiprocessors": read("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
        "shared_optin_bytes": read("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        "l2_bytes": read("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
        "name": name or f"CUDA device {ordinal}",
    }


def pointer_device_ordinal(ptr: int) -> int:
    """The ordinal of the device a device pointer belongs to (`DriverError` if unknown)."""
    module = api()
    attribute = module.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(call("cuPointerGetAttribute", attribute, module.CUdeviceptr(ptr)))
