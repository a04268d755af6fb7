"""`pyspk.reference.bilstm` against PyTorch's own LSTM in float64 on the CPU, at
segmentation-3.0's shape (input 60, hidden 128, 4 layers, both directions)."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk import reference
from pyspk.errors import InvalidArgument


def test_bilstm_is_pytorchs_lstm_in_float64():
    """Both compute in float64, the same operations in other orders (the sigmoid through
    tanh here): outputs below 0.2 agree within a few float64 roundings (2^-53 of 1 is
    1.1e-16; 7e-17 measured over three seeds), so within 1e-15."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(3)
    lstm = torch.nn.LSTM(60, 128, num_layers=4, bidirectional=True, batch_first=True)
    lstm = lstm.double()
    x = torch.randn(2, 40, 60, dtype=torch.float64)
    with torch.no_grad():
        expected = lstm(x)[0].numpy()

    def direction(layer: int, suffix: str) -> reference.LstmDirection:
        names = (
            f"{kind}_l{layer}{suffix}" for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        )
        weights = [getattr(lstm, name).detach().numpy() for name in names]
        return (weights[0], weights[1], weights[2], weights[3])

    layers = [(direction(layer, ""), direction(layer, "_reverse")) for layer in range(4)]
    got = reference.bilstm(x.numpy(), layers)
    assert got.shape == (2, 40, 256)
    assert np.max(np.abs(got - expected)) <= 1e-15
    with pytest.raises(InvalidArgument, match="batch, steps, features"):
        reference.bilstm(np.zeros((40, 60)), layers)


def test_stats_pool_is_pyannotes_statspool_in_float64():
    """The same formula in float64, the sums in other orders: within 1e-14 of values
    about 1; a speaker without weight pools to 0 and 0."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("pyannote.audio")
    from pyannote.audio.models.blocks.pooling import StatsPool

    generator = torch.Generator().manual_seed(5)
    x = torch.rand(2, 6, 125, generator=generator, dtype=torch.float64)
    w = (torch.rand(2, 3, 125, generator=generator) > 0.5).double()
    w[1, 2] = 0.0
    with torch.no_grad():
        expected = StatsPool()(x, weights=w).numpy()
    got = reference.stats_pool(x.numpy(), w.numpy())
    assert got.shape == (2, 3, 12)
    assert np.max(np.abs(got - expected)) <= 1e-14
    assert not got[1, 2].any()
    with pytest.raises(InvalidArgument, match="frames"):
        reference.stats_pool(np.zeros((2, 6, 125)), np.zeros((2, 3, 124)))


def test_kaldi_fbank_is_the_fbanks_operations_in_float64():
    """`Fbank`'s tensor operations (WeSpeaker's fbank) run in float64 on its own FP32
    constants: the same function, the sums in other orders, within 1e-11 of log-mel
    values of about 10."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("pyannote.audio")
    from pyspk.pyannote.fbank import Fbank
    from pyspk.pyannote.offline import wespeaker_resnet34

    fbank = Fbank(wespeaker_resnet34(seed=1), torch.device("cpu"))
    window, banks = fbank.window[0].numpy(), fbank.banks.numpy()
    fbank.window, fbank.banks = fbank.window.double(), fbank.banks.double()
    fbank.epsilon = fbank.epsilon.double()
    x = 0.1 * torch.randn(
        2, 1, 32000, generator=torch.Generator().manual_seed(6), dtype=torch.float64
    )
    expected = fbank(x).numpy()
    got = reference.kaldi_fbank(x[:, 0].numpy(), window, banks)
    assert got.shape == (2, 198, 80)
    assert np.max(np.abs(got - expected)) <= 1e-11
