"""The trunk area's fbank on the GPU: `PlannedFbank` (two kernels around cuFFT's real
FFT) against float64 truth and `Fbank` (the library's operations, WeSpeaker's bits), an
item's bits whatever the batch, graph replays, two threads on two streams at once, the
entries' checks, and compute-sanitizer.

Tolerance: both paths take the same FP32 transform (cuFFT's), whose rounding, relative
to a frame's largest bins, the log magnifies in the mel bins of little energy; it
dominates both errors. The planned frames and mel sums round less (FP64 sums, the
power spectrum as re^2 + im^2), so its error is at most the library's, with a tenth
of slack for the transform's own order of rounding on other inputs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

SAMPLES = 160_000  # a 10 s chunk: 998 frames


@pytest.fixture(scope="module")
def model(torch, pyannote):
    return pyannote.wespeaker_resnet34(seed=1).cuda()


def waveforms(torch, items: int, seed: int, samples: int = SAMPLES):
    """Noise with a tone and a near-silent stretch in each chunk: bins of very
    different energy."""
    generator = torch.Generator().manual_seed(seed)
    x = 0.1 * torch.randn(items, 1, samples, generator=generator)
    t = torch.arange(samples) / 16000
    x += 0.3 * torch.sin(2 * torch.pi * 440 * t)
    x[:, :, samples // 3 : samples // 2] *= 1e-3
    return x.cuda()


def planned(torch, fbank, x):
    with torch.inference_mode():
        return fbank(x)


def test_the_fbanks_error_is_at_most_the_librarys(torch, model) -> None:
    from pyspk import reference
    from pyspk.pyannote.fbank import Fbank, PlannedFbank
    from pyspk.testing import relative_errors

    stock, ours = Fbank(model, torch.device("cuda")), PlannedFbank(model, torch.device("cuda"))
    x = waveforms(torch, 4, seed=1)
    truth = reference.kaldi_fbank(
        x[:, 0].cpu().numpy(), stock.window[0].cpu().numpy(), stock.banks.cpu().numpy()
    )
    got, library = (
        relative_errors(planned(torch, f, x).cpu().numpy(), truth) for f in (ours, stock)
    )
    print(f"\nfbank (max, norm-wise) error: plan {got}, library {library}")
    assert got[0] <= 1.1 * library[0] and got[1] <= 1.1 * library[1]
    ours.close()


def test_a_call_it_does_not_serve_takes_the_librarys_path(torch, model) -> None:
    from pyspk.pyannote.fbank import Fbank, PlannedFbank

    stock, ours = Fbank(model, torch.device("cuda")), PlannedFbank(model, torch.device("cuda"))
    x = waveforms(torch, 2, seed=2).expand(2, 2, SAMPLES)  # two channels: the first
    assert torch.equal(planned(torch, ours, x), planned(torch, stock, x))
    ours.close()


def test_an_item_has_its_bits_whatever_the_batch(torch, model) -> None:
    from pyspk.pyannote.fbank import PlannedFbank

    fbank = PlannedFbank(model, torch.device("cuda"))
    x = waveforms(torch, 37, seed=3)
    whole = planned(torch, fbank, x)
    assert whole.shape == (37, 998, 80)
    assert torch.equal(whole, planned(torch, fbank, x))
    assert torch.equal(whole[:5], planned(torch, fbank, x[:5]))
    assert torch.equal(whole[36:], planned(torch, fbank, x[36:]))
    fbank.close()


def test_a_graph_replays_the_eager_bits(torch, model) -> None:
    from pyspk.pyannote.fbank import PlannedFbank
    from pyspk.testing import torch_replay_matches_eager

    fbank = PlannedFbank(model, torch.device("cuda"))
    with torch.inference_mode():
        assert torch_replay_matches_eager(torch, fbank, waveforms(torch, 20, seed=4))
    fbank.close()


def test_two_threads_on_two_streams_get_their_own_bits(torch, model) -> None:
    from pyspk.pyannote.fbank import PlannedFbank
    from tests.concurrency import assert_serial_bits_on_two_streams

    fbank = PlannedFbank(model, torch.device("cuda"))
    xs = [waveforms(torch, 24, seed=5), waveforms(torch, 9, seed=6)]
    assert_serial_bits_on_two_streams(torch, lambda x: planned(torch, fbank, x), xs)
    fbank.close()


def test_launches_of_another_shape_write_nothing(torch, model) -> None:
    """Each entry's checks: another block size or grid, or a wrong length, leave the
    output as it was."""
    from pyspk.candidate.trunk import fbank as kernels
    from pyspk.pyannote.fbank import PlannedFbank

    fbank = PlannedFbank(model, torch.device("cuda"))
    items, samples = 2, 4000  # 23 frames
    frames = kernels.fbank_frames(samples)
    x = torch.rand(items * samples, device="cuda")
    y = torch.full((items * frames * 512,), 7.0, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    plan = fbank._frames
    for grid, threads, y_len in [
        ((3, 2, 1), 128, y.numel()),
        ((4, 2, 1), 256, y.numel()),
        ((3, 2, 1), 256, y.numel() - 1),
    ]:
        values = [x.data_ptr(), x.numel(), plan._window.ptr, 400, y.data_ptr(), y_len]
        plan._kernel.launch(
            grid, threads, 0, kernels.FRAMES_SIGNATURE, [*values, items, samples]
        ).enqueue(stream)
        torch.cuda.synchronize()
        assert torch.all(y == 7.0), (grid, threads, y_len)
    spectrum = torch.rand(items * frames * 257 * 2, device="cuda")
    mel = torch.full((items * frames * 80,), 7.0, device="cuda")
    sums = torch.zeros(kernels.mel_sums_len(items, frames), device="cuda", dtype=torch.float64)
    plan = fbank._mel
    for grid, threads, y_len in [
        ((1, 2, 1), 128, mel.numel()),
        ((2, 2, 1), 256, mel.numel()),
        ((1, 2, 1), 256, mel.numel() + 1),
    ]:
        values = [spectrum.data_ptr(), spectrum.numel(), plan._weights.ptr, len(plan._weights)]
        values += [plan._ranges.ptr, len(plan._ranges), mel.data_ptr(), y_len]
        values += [sums.data_ptr(), sums.numel(), items, frames]
        launch = plan._kernel.launch(grid, threads, 0, kernels.LOG_MEL_SIGNATURE, values)
        launch.enqueue(stream)
        torch.cuda.synchronize()
        assert torch.all(mel == 7.0) and not sums.any(), (grid, threads, y_len)
    fbank.close()


_SANITIZED = """
import torch, warnings
warnings.simplefilter("ignore")
from pyspk.pyannote.offline import wespeaker_resnet34
from pyspk.pyannote.fbank import PlannedFbank
fbank = PlannedFbank(wespeaker_resnet34(seed=1).cuda(), torch.device("cuda"))
with torch.inference_mode():
    y = fbank(torch.randn(3, 1, 16001, device="cuda"))
torch.cuda.synchronize()
print("fbank done", flush=True)
"""


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_finds_nothing_in_the_fbank(torch, pyannote, tool: str) -> None:
    from tests.gpu.test_sanitizer_gpu import sanitized_run

    assert "fbank done" in sanitized_run(tool, _SANITIZED)
