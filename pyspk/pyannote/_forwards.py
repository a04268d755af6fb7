"""pyannote.audio 4.0's `SincNet.forward` and `PyanNet.forward` with pyspk's planned
modules in them, which `pyspk.pyannote.accelerate` puts on a model as its instance
forwards."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from einops import rearrange
from pyannote.audio.models.segmentation import PyanNet
from torch import nn

from pyspk.torch import PlannedDense

if TYPE_CHECKING:
    from lightning.fabric.utilities.data import AttributeDict

__all__ = ["planned_pyannet_forward", "planned_sincnet_forward"]


def planned_sincnet_forward(sincnet: nn.Module, waveforms: torch.Tensor) -> torch.Tensor:
    """`SincNet.forward` (pyannote.audio 4.0) with a `PlannedSincFront` at conv1d[0],
    which applies the abs and pool1d[0] itself."""
    convs, pools = cast(nn.ModuleList, sincnet.conv1d), cast(nn.ModuleList, sincnet.pool1d)
    norms = cast(nn.ModuleList, sincnet.norm1d)
    normalised = cast(nn.Module, sincnet.wav_norm1d)(waveforms)
    outputs = F.leaky_relu(norms[0](convs[0](normalised)))
    for conv, pool, norm in zip(convs[1:], pools[1:], norms[1:], strict=True):
        outputs = F.leaky_relu(norm(pool(conv(outputs))))
    return outputs


def planned_pyannet_forward(self: PyanNet, waveforms: torch.Tensor) -> torch.Tensor:
    """`PyanNet.forward` (pyannote.audio 4.0) with the activations a plan fuses left to
    the plan: LeakyReLU after each planned linear, LogSoftmax after a planned classifier."""
    outputs = self.sincnet(waveforms)
    hparams = cast("AttributeDict", self.hparams)  # lightning keeps them in an AttributeDict
    if hparams.lstm["monolithic"]:
        outputs, _ = self.lstm(rearrange(outputs, "batch feature frame -> batch frame feature"))
    else:
        outputs = rearrange(outputs, "batch feature frame -> batch frame feature")
        # not monolithic: a ModuleList of one-layer LSTMs
        for i, lstm in enumerate(cast(nn.ModuleList, self.lstm)):
            outputs, _ = lstm(outputs)
            if i + 1 < hparams.lstm["num_layers"]:
                outputs = self.dropout(outputs)
    if hparams.linear["num_layers"] > 0:
        for linear in self.linear:
            outputs = linear(outputs)
            if not isinstance(linear, PlannedDense):
                outputs = F.leaky_relu(outputs)
    if isinstance(self.classifier, PlannedDense):
        return self.classifier(outputs)
    return self.activation(self.classifier(outputs))
