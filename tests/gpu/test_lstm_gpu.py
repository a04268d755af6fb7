"""The lstm area on the GPU: `PlannedLSTM` on segmentation-3.0's LSTM (input 60, hidden
128, 4 layers, both directions, 589 steps) against float64 truth and cuDNN, bit-identical
repeats, one sequence's bits whatever the batch around it, graph replays, two threads on
two streams at once, and compute-sanitizer.

Tolerance: the plan's norm-wise error against float64 at or below cuDNN's own in TF32
math on the same input: both take the TF32 projections' error, and the plan's
recurrence (operands of 22 bits) adds little to it (measured 1.2360e-4 against
1.2371e-4). Its largest error is within 1.25 times cuDNN TF32's (measured 1.08: 1.86e-4
against 1.72e-4), another rounding at the one element where each is worst."""

from __future__ import annotations

import pytest

from tests.optional import importorskip

pytestmark = pytest.mark.gpu

STEPS = 589


@pytest.fixture(scope="module")
def lstm(torch):
    """segmentation-3.0's LSTM with PyTorch's default initialization, seeded."""
    torch.manual_seed(0)
    return torch.nn.LSTM(60, 128, 4, batch_first=True, bidirectional=True).cuda().eval()


def inputs(torch, items: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(items, STEPS, 60, generator=generator).cuda()


def cudnn(torch, lstm, x, tf32: bool):
    from pyspk.cuda import CudaMath
    from pyspk.torch import library_math

    with torch.inference_mode(), library_math(CudaMath.TF32 if tf32 else CudaMath.FP32):
        return lstm(x)[0]


def planned(torch, module, x):
    from pyspk.cuda import CudaMath
    from pyspk.torch import library_math

    with torch.inference_mode(), library_math(CudaMath.TF32):
        return module(x)[0]


def test_the_plans_error_is_cudnns_in_tf32_math(torch, lstm) -> None:
    from pyspk.testing import lstm_truth, relative_errors
    from pyspk.torch.lstm import PlannedLSTM

    x = inputs(torch, 4, seed=1)
    expected = lstm_truth(lstm, x)
    module = PlannedLSTM(lstm)
    ours = relative_errors(planned(torch, module, x).cpu().numpy(), expected)
    tf32 = relative_errors(cudnn(torch, lstm, x, tf32=True).cpu().numpy(), expected)
    fp32 = relative_errors(cudnn(torch, lstm, x, tf32=False).cpu().numpy(), expected)
    print(f"\nLSTM (max, norm-wise) error: plan {ours}, cuDNN TF32 {tf32}, FP32 {fp32}")
    assert fp32[1] < ours[1] <= tf32[1]
    assert ours[0] <= 1.25 * tf32[0]
    module.close()


def test_a_sequence_has_its_bits_whatever_the_batch(torch, lstm) -> None:
    """Blocks of 16 sequences never mix their rows: the first 5 of 37 sequences, alone or
    in the batch, and a second run, all give the same bits."""
    from pyspk.torch.lstm import PlannedLSTM

    module = PlannedLSTM(lstm)
    x = inputs(torch, 37, seed=2)
    whole = planned(torch, module, x)
    assert torch.equal(whole, planned(torch, module, x))
    assert torch.equal(whole[:5], planned(torch, module, x[:5].contiguous()))
    assert torch.equal(whole[20:21], planned(torch, module, x[20:21].contiguous()))
    module.close()


def test_a_graph_replays_the_eager_bits(torch, lstm) -> None:
    from pyspk.cuda import CudaMath
    from pyspk.testing import torch_graph
    from pyspk.torch import library_math
    from pyspk.torch.lstm import PlannedLSTM

    module = PlannedLSTM(lstm)
    x = inputs(torch, 20, seed=3)
    eager = planned(torch, module, x)
    with torch.inference_mode(), library_math(CudaMath.TF32):
        graph, (captured, _) = torch_graph(torch, lambda: module(x))
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)
    module.close()


def test_two_threads_on_two_streams_get_their_own_bits(torch, lstm) -> None:
    from pyspk.torch.lstm import PlannedLSTM
    from tests.concurrency import assert_serial_bits_on_two_streams

    module = PlannedLSTM(lstm)
    xs = [inputs(torch, 24, seed=4), inputs(torch, 9, seed=5)]
    assert_serial_bits_on_two_streams(torch, lambda x: planned(torch, module, x), xs)
    module.close()


def test_the_plans_fp32_form_is_below_cudnn_fp32s_error(torch, lstm) -> None:
    """In FP32 math (the explicit option) the projections run in FP32 and the
    recurrence's operands keep 22 bits: below cuDNN FP32's error against float64."""
    from pyspk.cuda import CudaMath
    from pyspk.testing import lstm_truth, relative_errors
    from pyspk.torch import library_math
    from pyspk.torch.lstm import PlannedLSTM

    x = inputs(torch, 4, seed=3)
    expected = lstm_truth(lstm, x)
    module = PlannedLSTM(lstm)
    with torch.inference_mode(), library_math(CudaMath.FP32):
        ours = relative_errors(module(x)[0].cpu().numpy(), expected)
    fp32 = relative_errors(cudnn(torch, lstm, x, tf32=False).cpu().numpy(), expected)
    print(f"\nLSTM (max, norm-wise) error in FP32 math: plan {ours}, cuDNN FP32 {fp32}")
    assert ours[0] <= fp32[0] and ours[1] <= fp32[1]
    module.close()


def test_the_engine_runs_the_plan_in_tf32_math_or_when_asked(torch) -> None:
    importorskip("pyannote.audio", reason="pyspk.pyannote needs pyannote.audio")
    from pyspk import pyannote
    from pyspk.pyannote.offline import segmentation_3_0
    from pyspk.torch.lstm import PlannedLSTM

    model = segmentation_3_0(seed=0).cuda().eval()
    with pyannote.accelerate(model, "tf32") as acceleration:
        assert isinstance(model.lstm, PlannedLSTM) and "lstm" in acceleration.modules
    assert isinstance(model.lstm, torch.nn.LSTM)
    with pyannote.accelerate(model, "fp32"):
        assert isinstance(model.lstm, torch.nn.LSTM)
    with pyannote.accelerate(model, "fp32", lstm=True) as acceleration:
        assert isinstance(model.lstm, PlannedLSTM) and "lstm" in acceleration.modules
    with pyannote.accelerate(model, "tf32", lstm=False):
        assert isinstance(model.lstm, torch.nn.LSTM)
    assert isinstance(model.lstm, torch.nn.LSTM)


_SANITIZED = """
import torch
from pyspk.cuda import CudaMath
from pyspk.torch import library_math
from pyspk.torch.lstm import PlannedLSTM
torch.manual_seed(0)
lstm = torch.nn.LSTM(60, 128, 2, batch_first=True, bidirectional=True).cuda()
with torch.inference_mode(), library_math(CudaMath.TF32):
    y = PlannedLSTM(lstm)(torch.randn(19, 40, 60, device="cuda"))[0]
torch.cuda.synchronize()
print("lstm done", flush=True)
"""


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_finds_nothing_in_the_lstm(torch, tool: str) -> None:
    """A partial block (19 sequences: 16 and 3), both directions, two layers."""
    from tests.gpu.test_sanitizer_gpu import sanitized_run

    assert "lstm done" in sanitized_run(tool, _SANITIZED)
