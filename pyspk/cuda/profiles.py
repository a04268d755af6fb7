"""Named device attributes of the GPUs pyspk is deployed on, so the device rule can be
evaluated for a GPU that is not present (`pyspk pins --device h200`).

The figures are the vendors' published ones: compute capability, multiprocessor count and
L2 size from the product specifications and architecture whitepapers, and the opt-in
shared memory per block from the CUDA programming guide's per-capability table. A real
device reports its own through `DeviceAttributes.query`; a partitioned one (MIG) reports
fewer multiprocessors than its profile here."""

from __future__ import annotations

import re

from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.tier import ComputeCapability

_KIB = 1024
_MIB = 1024 * 1024

# shared memory one block may opt in to, by architecture (the programming guide's table)
SHARED_OPTIN_BY_CAPABILITY: dict[ComputeCapability, int] = {
    ComputeCapability(7, 5): 64 * _KIB,
    ComputeCapability(8, 0): 163 * _KIB,
    ComputeCapability(8, 6): 99 * _KIB,
    ComputeCapability(8, 9): 99 * _KIB,
    ComputeCapability(9, 0): 227 * _KIB,
    ComputeCapability(10, 0): 227 * _KIB,
    ComputeCapability(12, 0): 99 * _KIB,
}


def _device(name: str, major: int, minor: int, sms: int, l2_mib: int) -> DeviceAttributes:
    capability = ComputeCapability(major, minor)
    return DeviceAttributes(
        capability,
        multiprocessors=sms,
        shared_optin_bytes=SHARED_OPTIN_BY_CAPABILITY[capability],
        l2_bytes=l2_mib * _MIB,
        name=name,
    )


# published figures (SMs enabled on the product, L2 in MiB as the driver reports it);
# the H200's agree with what DeviceAttributes.query read on one: 132 SMs, 232448 B
# opt-in shared memory per block, 60 MiB of L2
_FIGURES = (
    ("t4", _device("NVIDIA T4", 7, 5, 40, 4)),
    ("a10", _device("NVIDIA A10", 8, 6, 72, 6)),
    ("a30", _device("NVIDIA A30", 8, 0, 56, 24)),
    ("a100", _device("NVIDIA A100", 8, 0, 108, 40)),
    ("l4", _device("NVIDIA L4", 8, 9, 58, 48)),
    ("l40s", _device("NVIDIA L40S", 8, 9, 142, 96)),
    ("rtx3090", _device("NVIDIA GeForce RTX 3090", 8, 6, 82, 6)),
    ("rtx4090", _device("NVIDIA GeForce RTX 4090", 8, 9, 128, 72)),
    ("rtx4060ti", _device("NVIDIA GeForce RTX 4060 Ti", 8, 9, 34, 32)),
    ("h100-sxm", _device("NVIDIA H100 SXM", 9, 0, 132, 50)),
    ("h100-pcie", _device("NVIDIA H100 PCIe", 9, 0, 114, 50)),
    ("h200", _device("NVIDIA H200", 9, 0, 132, 60)),
    ("b200", _device("NVIDIA B200", 10, 0, 148, 126)),
    ("rtx5060ti", _device("NVIDIA GeForce RTX 5060 Ti", 12, 0, 36, 32)),
    ("rtx5090", _device("NVIDIA GeForce RTX 5090", 12, 0, 170, 96)),
)

# CLI name -> attributes, ordered by compute capability, then name
PROFILES: dict[str, DeviceAttributes] = dict(
    sorted(_FIGURES, key=lambda item: (item[1].capability, item[0]))
)

# words a user may add or leave out: "NVIDIA GeForce RTX 4060 Ti" is "rtx4060ti"
_NOISE = re.compile(r"nvidia|geforce|tesla|[\s_\-]+")


def _normalize(name: str) -> str:
    return _NOISE.sub("", name.lower())


# normalized CLI name or marketing name -> CLI name
_ALIASES: dict[str, str] = {
    **{_normalize(device.name): key for key, device in PROFILES.items()},
    **{_normalize(key): key for key in PROFILES},
}


# words of an `nvidia-smi` name that are no part of the model: vendor and memory size
_VENDOR_OR_MEMORY = re.compile(r"nvidia|geforce|tesla|\d+gb")
# form factors: the PCIe and SXM parts of one model differ in SMs where both are profiled
_FORM_FACTORS = {"pcie": "pcie", "sxm": "sxm", "hbm": "sxm"}


def _by_model(name: str) -> list[str]:
    """The profiles an `nvidia-smi` style name can mean ("NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-80GB"): its model, narrowed by a form factor word when it has one
    (HBM3 marks the H100's SXM part)."""
    words = [w for w in re.split(r"[\s_\-]+", name.lower()) if w]
    words = [w for w in words if not _VENDOR_OR_MEMORY.fullmatch(w)]
    forms = {form for w in words for prefix, form in _FORM_FACTORS.items() if w.startswith(prefix)}
    model = "".join(w for w in words if not any(w.startswith(p) for p in _FORM_FACTORS))
    if not model:
        return []
    candidates = [key for key in PROFILES if key == model or key.startswith(model + "-")]
    narrowed = [key for key in candidates if any(key.endswith("-" + form) for form in forms)]
    return narrowed or candidates


def profile_key(name: str) -> str:
    """The `PROFILES` key `name` means: a profile name or marketing name, ignoring case,
    spaces, `-`/`_` and vendor words, or the name `nvidia-smi` prints. KeyError listing
    the candidates when the name fits several profiles, or the known names when none."""
    key = _ALIASES.get(_normalize(name))
    if key is not None:
        return key
    candidates = _by_model(name)
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise KeyError(f"device {name!r} is ambiguous: it may be {', '.join(candidates)}")
    known = ", ".join(PROFILES)
    raise KeyError(f"unknown device {name!r}; known devices: {known}")


def profile(name: str) -> DeviceAttributes:
    """The attributes of a named deployment GPU ("h200", "RTX 4060 Ti", "h100_sxm")."""
    return PROFILES[profile_key(name)]
