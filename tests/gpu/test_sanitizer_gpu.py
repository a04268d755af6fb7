"""compute-sanitizer over every real entry of both PTX tiers: one plan (its weight pack
included) and one enqueue (with its split-K reduction) each, under memcheck (no
out-of-bounds or misaligned access) and racecheck (no shared-memory hazard). The sm75
tier carries its 13 SIMT entries for real and stubs for the rest; the sm80 tier all 25
entries (with the packs and reductions they launch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pyspk.candidate.segdense import Entry
from pyspk.cuda import PtxTier

pytestmark = pytest.mark.gpu

_SANITIZED_RUN = textwrap.dedent(
    """
    import sys
    from pyspk.candidate.segdense import Entry, Products
    from pyspk.cuda import CudaMath
    from pyspk.cuda.manifest import KernelModule
    from pyspk.cuda.runtime import CudaRuntime
    from pyspk.testing import operands, plan, run_eager

    with CudaRuntime(0) as runtime:
        kernels = runtime.load_kernels(KernelModule.SEGDENSE)
        assert str(kernels.tier) == sys.argv[1], (kernels.tier, sys.argv[1])
        for name in sys.argv[2:]:
            entry = Entry[name]
            fp32 = entry.products() is Products.FP32
            math = CudaMath.FP32 if fp32 else CudaMath.TF32
            ops = operands(entry.site(), entry.batch(), seed=38)
            oxide = plan(runtime, entry, math, ops)  # packs run here
            run_eager(runtime, oxide, ops["x"])
            oxide.close()
            print(name, "done", flush=True)
    print("sanitized run done")
    """
)


def _compute_sanitizer() -> str:
    found = shutil.which("compute-sanitizer")
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        candidate = Path(home or "") / "bin" / "compute-sanitizer"
        if found is None and home and candidate.is_file():
            found = str(candidate)
    if found is None:
        pytest.skip("compute-sanitizer is not installed (CUDA toolkit)")
    return found


def sanitized_run(tool: str, script: str, *args: str) -> str:
    """`script` (given `args`) in a fresh Python under compute-sanitizer's `tool`: its
    output, once the run exited 0 with the tool's clean summary (asserted). PyTorch
    initializes CUDA before cuda-bindings loads, and the bindings' loader then probes for
    entry points with cuGetProcAddress, which fails: API errors that are no kernel's, so
    memcheck leaves API errors out; memory errors are still reported."""
    command = [_compute_sanitizer(), "--tool", tool, "--error-exitcode", "9"]
    command += ["--report-api-errors", "no"] if tool == "memcheck" else []
    run = subprocess.run(
        [*command, sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = run.stdout + run.stderr
    summary = "ERROR SUMMARY: 0 errors" if tool == "memcheck" else "RACECHECK SUMMARY: 0 hazards"
    assert run.returncode == 0 and summary in output, output[-4000:]
    return output


@pytest.mark.parametrize("tier", [PtxTier.SM75, PtxTier.SM80], ids=str)
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_finds_nothing(tool: str, tier: PtxTier) -> None:
    real = [entry.name for entry in Entry if entry.tier() <= tier]
    command = [_compute_sanitizer(), "--tool", tool, "--error-exitcode", "9"]
    if tool == "racecheck":
        command += ["--racecheck-report", "all"]
    result = subprocess.run(
        [*command, sys.executable, "-c", _SANITIZED_RUN, str(tier), *real],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "PYSPK_PTX_TIER": str(tier)},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert output.count(" done\n") == len(real) + 1, output[-4000:]
    summary = "ERROR SUMMARY: 0 errors" if tool == "memcheck" else "RACECHECK SUMMARY: 0 hazards"
    assert summary in output, output[-4000:]
