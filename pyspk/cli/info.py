"""What `pyspk info` reports: the versions pyspk runs with, the driver, and for each
visible GPU its attributes, the kernel artifact it would load and the entry the device
rule picks per tuple. Everything that needs the driver is asked for only here, and each
part that cannot be had says why instead."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
from typing import Any

import numpy as np

from pyspk import __version__
from pyspk.candidate.segdense.pins import pick_table
from pyspk.cuda.errors import CudaError
from pyspk.cuda.manifest import FORCE_PTX_JIT_ENV, KernelModule, Manifest, choose_artifact
from pyspk.cuda.tier import PtxTier, loadable_tier

DIARIZE_STACK = ("torch", "torchaudio", "pyannote.audio", "soundfile")
"""The packages `pyspk diarize` needs beside pyspk's own, whose versions `info` shows."""


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _device(ordinal: int, forced: PtxTier | None, force_ptx: bool) -> dict[str, Any]:
    from pyspk.cuda import driver
    from pyspk.cuda.device import DeviceAttributes

    device = DeviceAttributes.query(ordinal)
    report: dict[str, Any] = {
        "ordinal": ordinal,
        "name": device.name,
        "capability": str(device.capability),
        "multiprocessors": device.multiprocessors,
        "shared_optin_bytes": device.shared_optin_bytes,
        "l2_bytes": device.l2_bytes,
        "memory_bytes": driver.device_memory(ordinal),
    }
    try:
        tier = loadable_tier(device.capability, forced)
        manifest = Manifest.load()
        # per module: a module may ship a tier above the common ones (the trunk's sm90);
        # segdense ships the common ones, so its artifact is of `tier`
        modules = {
            str(name): choose_artifact(
                manifest.module(name), device.capability, forced, force_ptx
            ).describe()
            for name in KernelModule
        }
    except (ValueError, CudaError) as error:
        report["kernels"] = f"unavailable: {error}"
        return report
    report["tier"] = str(tier)
    report["artifact"] = modules[str(KernelModule.SEGDENSE)]
    report["modules"] = modules
    report["picks"] = [
        {
            "boundary": pick.boundary,
            "batch": pick.batch,
            "math": str(pick.math),
            "entry": pick.entry,
            "splits": pick.splits,
            "built": pick.built,
        }
        for pick in pick_table(device, tier)
    ]
    return report


def collect(forced: PtxTier | None = None, force_ptx: bool = False) -> dict[str, Any]:
    """The report as data; the parts the driver cannot give are a reason string."""
    report: dict[str, Any] = {
        "pyspk": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cuda-bindings": _package_version("cuda-bindings"),
        # the stack `pyspk diarize` runs on, read from the installed metadata (importing
        # PyTorch would take seconds, and a broken build would stop the report)
        "diarize stack": {name: _package_version(name) for name in DIARIZE_STACK},
        "force_ptx_jit": force_ptx,
    }
    try:
        from pyspk.cuda import driver

        version = driver.driver_version()
        count = driver.device_count()
    except CudaError as error:
        report["driver"] = f"unavailable: {type(error).__name__}: {error}"
        report["devices"] = []
        return report
    report["driver"] = f"CUDA {version // 1000}.{version % 1000 // 10} ({version})"
    devices = []
    for ordinal in range(count):
        try:
            devices.append(_device(ordinal, forced, force_ptx))
        except CudaError as error:
            devices.append({"ordinal": ordinal, "error": f"{type(error).__name__}: {error}"})
    report["devices"] = devices
    return report


def pipeline_service(args: Any) -> dict[str, str]:
    """Whether `accelerate_pipeline` would serve the pipeline `args.pipeline` names (a
    Hugging Face id or a local folder, loaded on the CPU as `pyspk diarize` loads it):
    its class and clustering, and "served" or the reason the engine would run its stock
    `apply`; "error" where it cannot be loaded."""
    from pyspk.cli import diarize

    try:
        _, pa = diarize._import_stack()
        loading = argparse.Namespace(
            pipeline=args.pipeline,
            token=args.token,
            trust_checkpoints=args.trust_checkpoints,
            segmentation=None,
            embedding=None,
        )
        pipeline = diarize._pipeline(loading, pa)
    except diarize.DiarizeError as error:
        return {"name": args.pipeline, "error": str(error)}
    from pyspk.pyannote.engine import unserved_configuration

    reason = unserved_configuration(pipeline)
    return {
        "name": args.pipeline,
        "class": type(pipeline).__name__,
        "clustering": str(getattr(pipeline, "klustering", "-")),
        "served": "yes" if reason is None else f"no: {reason}",
    }


def render(report: dict[str, Any]) -> str:
    """The report as text, one fact a line and a table of picks per device."""
    lines = [
        f"pyspk {report['pyspk']}, Python {report['python']}, numpy {report['numpy']}, "
        f"cuda-bindings {report['cuda-bindings']}",
        "diarize stack: "
        + ", ".join(f"{name} {version}" for name, version in report["diarize stack"].items()),
        f"driver: {report['driver']}",
    ]
    if not report["devices"] and not report["driver"].startswith("unavailable"):
        lines.append("no CUDA device is visible (check CUDA_VISIBLE_DEVICES)")
    for device in report["devices"]:
        if "error" in device:
            lines.append(f"device {device['ordinal']}: {device['error']}")
            continue
        lines.append(
            f"device {device['ordinal']}: {device['name']}, capability "
            f"{device['capability']}, {device['multiprocessors']} SMs, opt-in shared "
            f"{device['shared_optin_bytes']} B, L2 {device['l2_bytes'] // (1 << 20)} MiB, "
            f"memory {device['memory_bytes'] / (1 << 30):.1f} GiB"
        )
        if "kernels" in device:
            lines.append(f"  kernels: {device['kernels']}")
            continue
        jit = f" (forced by {FORCE_PTX_JIT_ENV}=1)" if report["force_ptx_jit"] else ""
        lines.append(f"  loads: tier {device['tier']}, {device['artifact']}{jit}")
        lines.append(f"  modules: {', '.join(device['modules'].values())}")
        for pick in device["picks"]:
            splits = f" x{pick['splits']}" if pick["splits"] is not None else ""
            built = "" if pick["built"] is not False else " (not built)"
            lines.append(
                f"  {pick['boundary']:<14} b{pick['batch']:<3} {pick['math']}  "
                f"{pick['entry']}{splits}{built}"
            )
    service = report.get("pipeline")
    if service is not None:
        if "error" in service:
            lines.append(f"pipeline {service['name']}: {service['error']}")
        else:
            lines.append(
                f"pipeline {service['name']}: {service['class']}, {service['clustering']}; "
                f"accelerate_pipeline serves it: {service['served']}"
            )
    return "\n".join(lines)
