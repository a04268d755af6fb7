"""A graph-capturable WeSpeaker fbank: `Fbank`, `BaseWeSpeakerResNet.compute_fbank`'s bits
with its constants made once on the device, and `PlannedFbank`, the same features from
the trunk area's three fbank launches around the library's FFT (`planned_fbank` picks it
where it plans)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
import torchaudio.compliance.kaldi as kaldi
from pyannote.audio.models.embedding.wespeaker import BaseWeSpeakerResNet

from pyspk.candidate.trunk.fbank import (
    FBANK_PADDED,
    FBANK_WINDOW,
    MEL_BINS,
    fbank_frames,
    fbank_takes,
    mel_sums_len,
    plan_fbank_frames,
    plan_log_mel,
)
from pyspk.errors import GeometryUnimplemented, InvalidArgument, PlanError, run_all
from pyspk.torch import _ordinal, shared_runtime

if TYPE_CHECKING:
    from lightning.fabric.utilities.data import AttributeDict

__all__ = ["Fbank", "PlannedFbank", "planned_fbank"]


class Fbank:
    """`BaseWeSpeakerResNet.compute_fbank` (torchaudio's Kaldi fbank under `vmap`, then
    the mean over time subtracted) as the same tensor operations on the whole batch,
    with the window, the mel banks and the log floor made once on the device. The
    stock function builds those on the host at every call, which a CUDA graph cannot
    hold. `unsupported(model)` says why a model's fbank settings are not these."""

    def __init__(self, model: BaseWeSpeakerResNet, device: torch.device) -> None:
        reason = self.unsupported(model)
        if reason is not None:
            raise InvalidArgument(f"Fbank: {reason}")
        hp = cast("AttributeDict", model.hparams)  # lightning keeps them in an AttributeDict
        rate = hp.sample_rate
        self.window_size = int(rate * hp.frame_length * 0.001)
        self.window_shift = int(rate * hp.frame_shift * 0.001)
        padded = 1 << (self.window_size - 1).bit_length()
        self.padding = padded - self.window_size
        dtype = torch.float32
        # kaldi.fbank's own constants, with its defaults for what pyannote leaves out
        self.window = torch.hamming_window(
            self.window_size, periodic=False, alpha=0.54, beta=0.46, device=device, dtype=dtype
        ).unsqueeze(0)
        banks, _ = kaldi.get_mel_banks(hp.num_mel_bins, padded, rate, 20.0, 0.0, 100.0, -500.0, 1.0)
        self.banks = F.pad(banks.to(device=device, dtype=dtype), (0, 1), value=0).T.contiguous()
        self.epsilon = torch.tensor(torch.finfo(torch.float).eps, device=device, dtype=dtype)

    @staticmethod
    def unsupported(model: BaseWeSpeakerResNet) -> str | None:
        """Why `Fbank` cannot stand for this model's fbank, or None."""
        hp = cast("AttributeDict", model.hparams)  # lightning keeps them in an AttributeDict
        settings = {
            "dither": (hp.dither, 0.0),
            "window_type": (hp.window_type, "hamming"),
            "snip_edges": (hp.snip_edges, True),
            "use_energy": (hp.use_energy, False),
            "round_to_power_of_two": (hp.round_to_power_of_two, True),
            "fbank_centering_span": (hp.fbank_centering_span, None),
        }
        for name, (value, served) in settings.items():
            if value != served:
                return f"the model's fbank has {name}={value!r}; Fbank serves {served!r}"
        return None

    def __call__(self, waveforms: torch.Tensor) -> torch.Tensor:
        """(batch, frames, mel bins) features of (batch, 1, samples) waveforms."""
        waveforms = waveforms * (1 << 15)
        strided = waveforms[:, 0].unfold(-1, self.window_size, self.window_shift)
        strided = strided - torch.mean(strided, dim=-1).unsqueeze(-1)  # DC offset
        previous = F.pad(strided, (1, 0), mode="replicate")  # copies: exact in any form
        strided = strided - 0.97 * previous[..., :-1]  # pre-emphasis
        strided = strided * self.window
        strided = F.pad(strided, (0, self.padding), value=0)
        spectrum = torch.fft.rfft(strided).abs().pow(2.0)
        features = torch.matmul(spectrum, self.banks)
        features = torch.max(features, self.epsilon).log()
        return features - torch.mean(features, dim=1, keepdim=True)

    def close(self) -> None:
        """Nothing to free: the constants are tensors."""


class PlannedFbank(Fbank):
    """`Fbank`'s features (the same operations, at most their FP32 error against float64:
    `pyspk.candidate.trunk.fbank`) in three kernel launches around `torch.fft.rfft`, in
    place of about a dozen tensor passes. A call it does not serve (another shape, dtype
    or device) takes `Fbank`'s path. Raises a `PlanError` where it cannot plan."""

    def __init__(self, model: BaseWeSpeakerResNet, device: torch.device) -> None:
        super().__init__(model, device)
        found = (self.window_size, self.window_shift, self.window_size + self.padding)
        if found != (FBANK_WINDOW, 160, FBANK_PADDED) or self.banks.shape[1] != MEL_BINS:
            raise GeometryUnimplemented(
                "PlannedFbank",
                f"the fbank's (window, shift, transform) {found} and {self.banks.shape[1]} "
                f"mel bins are not ({FBANK_WINDOW}, 160, {FBANK_PADDED}) and {MEL_BINS}",
            )
        self._ordinal = _ordinal(device)
        runtime = shared_runtime(device)
        self._frames = plan_fbank_frames(runtime, self.window[0].cpu().numpy())
        try:
            self._mel = plan_log_mel(runtime, self.banks.cpu().numpy())
        except BaseException:
            self._frames.close()
            raise

    def __call__(self, waveforms: torch.Tensor) -> torch.Tensor:
        if (
            waveforms.dim() != 3
            or waveforms.shape[1] != 1
            or waveforms.dtype is not torch.float32
            or waveforms.get_device() != self._ordinal
            or not fbank_takes(waveforms.shape[0], fbank_frames(waveforms.shape[2]))
        ):
            return super().__call__(waveforms)
        items, _, samples = waveforms.shape
        frames = fbank_frames(samples)
        stream = torch.cuda.current_stream(waveforms.device).cuda_stream
        framed = torch.empty(
            (items, frames, FBANK_PADDED), device=waveforms.device, dtype=torch.float32
        )
        x = waveforms.reshape(items, samples).contiguous()
        self._frames.enqueue(x, framed, items=items, samples=samples, stream=stream)
        spectrum = torch.view_as_real(torch.fft.rfft(framed))
        features = torch.empty(
            (items, frames, MEL_BINS), device=waveforms.device, dtype=torch.float32
        )
        sums = torch.empty(
            mel_sums_len(items, frames), device=waveforms.device, dtype=torch.float64
        )
        self._mel.enqueue(spectrum, features, sums, items=items, frames=frames, stream=stream)
        return features

    def close(self) -> None:
        """Frees the plans (idempotent); both close, the first error raised after."""
        run_all([self._frames.close, self._mel.close])


def planned_fbank(model: BaseWeSpeakerResNet, device: torch.device) -> Fbank:
    """A `PlannedFbank` for `model`, or its `Fbank` where the kernels cannot plan."""
    try:
        return PlannedFbank(model, device)
    except PlanError:
        return Fbank(model, device)
