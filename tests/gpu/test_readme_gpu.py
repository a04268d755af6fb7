"""The documentation's Python examples run as written: the driver-level and PyTorch ones
of docs/kernels.md, and (with pyannote.audio installed) the README's offline pyannote
one. The README's quickstart downloads a pretrained pipeline, which the tests cannot: it
is compiled, and its names are checked to exist."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from pyspk import CudaMath, Fp16Policy, PtxTier
from pyspk.candidate.segdense import Area, Entry, Products, Site
from pyspk.testing import error_bound, tensor_bound, truth

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
KERNELS = ROOT / "docs" / "kernels.md"


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


QUICKSTART, OFFLINE = _blocks(README)
DRIVER, TORCH = _blocks(KERNELS)
BLOCKS = [DRIVER, TORCH, OFFLINE]


def _run(block: str) -> dict:
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    return namespace


def test_the_examples_are_where_the_tests_read_them() -> None:
    assert "pyspk.plan(" in DRIVER and "pyspk.torch" in TORCH and "offline_pipeline" in OFFLINE
    assert 'Pipeline.from_pretrained("pyannote/speaker-diarization-community-1"' in QUICKSTART


def test_the_quickstart_compiles_and_names_what_exists(pyannote) -> None:
    compile(QUICKSTART, str(README), "exec")
    from pyannote.audio import Pipeline
    from pyannote.audio.pipelines.utils.hook import ProgressHook

    assert callable(Pipeline.from_pretrained) and callable(ProgressHook)
    assert callable(pyannote.accelerate_pipeline)


def _bound(entry: Entry, ops: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The float64 output of `ops` at the entry's site and batch, and the error the
    entry may show against it (`error_bound` for FP32 products, else `tensor_bound`)."""
    exact, scale = truth(entry.site(), entry.batch(), ops)
    if entry.products() is Products.FP32 and entry.tier() is PtxTier.SM75:
        return exact, error_bound(entry, exact, scale)
    return exact, tensor_bound(entry, exact, scale, ops)


def test_driver_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """It plans the rule's pick for seg_1 at batch 1 (EMBED_B1 on every device) through
    the front door, and prints the first outputs, which agree with float64."""
    np.random.seed(7)
    _run(BLOCKS[0])
    entry_name, *values = capsys.readouterr().out.replace("[", " ").replace("]", " ").split()
    assert entry_name == Entry.EMBED_B1.name
    np.random.seed(7)  # the example's draws, again
    ops = {
        "w": np.random.rand(256, 5120).astype(np.float32),
        "bias": np.zeros(256, np.float32),
        "x": np.random.rand(3, 5120).astype(np.float32),
    }
    exact, allowed = _bound(Entry.EMBED_B1, ops)
    printed = np.array([float(v) for v in values])
    assert printed.size == 4
    # printed with numpy's default precision (8 significant digits): allow that rounding
    assert np.all(np.abs(printed - exact[:4]) <= allowed[:4] + 1e-7 * np.abs(exact[:4]))


def test_torch_example_runs(torch, capsys: pytest.CaptureFixture[str]) -> None:
    """Batch 32 runs the rule's TF32 pick within its bound against float64; batch 2 is
    the module's own library path, bit for bit, under the caller's PyTorch settings."""
    import pyspk.torch as ptorch

    namespace = _run(BLOCKS[1])
    out = capsys.readouterr().out
    runtime = ptorch.shared_runtime()
    tier = runtime.load_kernels(Area.AREA).tier
    picks = {
        batch: Area.driver_pin(
            Site.LINEAR0.boundary(), batch, CudaMath.TF32, runtime.device, tier, Fp16Policy.ALLOW
        ).entry()
        for batch in (1, 32)
    }
    assert out.strip() == (
        f"{{1: '{picks[1].name}', 32: '{picks[32].name}'}} (32, 589, 128) (2, 589, 128)"
    )
    linear, x, y, z = (namespace[name] for name in ("linear", "x", "y", "z"))
    with torch.inference_mode():  # the library path runs with the caller's switches
        library = torch.nn.functional.leaky_relu(linear(x[:2]))
    assert torch.equal(z, library)
    ops = {
        "x": x.reshape(-1, 256).cpu().numpy(),
        "w": linear.weight.detach().T.contiguous().cpu().numpy(),
        "bias": linear.bias.detach().cpu().numpy(),
    }
    exact, allowed = _bound(picks[32], ops)
    error = np.abs(y.reshape(-1).double().cpu().numpy() - exact)
    assert np.all(error <= allowed)


def test_pyannote_example_runs(pyannote, capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        namespace = _run(BLOCKS[2])
    assert "Acceleration(PyanNet" in capsys.readouterr().out
    # the diarization ran through to its annotation, and undo restored the pipeline
    assert type(namespace["output"].speaker_diarization).__name__ == "Annotation"
    assert "get_embeddings" not in namespace["pipeline"].__dict__
