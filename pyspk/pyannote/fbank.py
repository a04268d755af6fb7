"""A graph-capturable WeSpeaker fbank: `BaseWeSpeakerResNet.compute_fbank`'s bits with
its constants made once on the device."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
import torchaudio.compliance.kaldi as kaldi
from pyannote.audio.models.embedding.wespeaker import BaseWeSpeakerResNet

from pyspk.errors import InvalidArgument

if TYPE_CHECKING:
    from lightning.fabric.utilities.data import AttributeDict

__all__ = ["Fbank"]


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
