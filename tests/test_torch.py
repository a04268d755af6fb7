"""`pyspk.torch` and `pyspk.pyannote` checks that need PyTorch (and pyannote.audio) but
no GPU: modules of the wrong shape or device are refused before anything is planned, and
the once-per-chunk embedding path gives the stock pipeline's embeddings on the CPU.
Skipped where PyTorch or pyannote.audio is not installed (the `torch` and `pyannote`
extras)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from pyspk.candidate import DenseSite, GeometryInvalid, SegConvSite

torch = pytest.importorskip("torch")
ptorch = pytest.importorskip("pyspk.torch")


def test_a_linear_of_another_shape_is_refused() -> None:
    with pytest.raises(GeometryInvalid, match=r"linear0 is Linear\(256, 128\), not Linear"):
        ptorch.PlannedDense(torch.nn.Linear(128, 128), DenseSite.LINEAR0)
    with pytest.raises(GeometryInvalid, match="takes a bias"):
        ptorch.PlannedDense(torch.nn.Linear(5120, 256, bias=False), DenseSite.EMBEDDING)


def test_a_conv_other_than_valid_five_taps_is_refused() -> None:
    with pytest.raises(GeometryInvalid, match="stride 1"):
        ptorch.PlannedConv1d(torch.nn.Conv1d(80, 60, 5, padding=2), SegConvSite.CONV1)
    with pytest.raises(GeometryInvalid, match="stride 1"):
        ptorch.PlannedConv1d(torch.nn.Conv1d(80, 60, 5), SegConvSite.CONV2)
    with pytest.raises(ValueError, match="'add' or 'drop'"):
        ptorch.PlannedConv1d(torch.nn.Conv1d(60, 60, 5), SegConvSite.CONV2, bias="keep")


def test_a_module_off_the_gpu_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="move the module to a CUDA device"):
        ptorch.PlannedDense(torch.nn.Linear(256, 128), DenseSite.LINEAR0)
    with pytest.raises(ValueError, match="CUDA devices, not cpu"):
        ptorch.shared_runtime(torch.device("cpu"))


@pytest.fixture(scope="module")
def pyannote():
    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
    pytest.importorskip("pyannote.audio")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pyspk.pyannote

    return pyspk.pyannote


def test_accelerate_refuses_a_cpu_model_and_other_models(pyannote) -> None:
    with pytest.raises(ValueError, match="move it to a CUDA device"):
        pyannote.accelerate(pyannote.wespeaker_resnet34(seed=0))
    with pytest.raises(TypeError, match="PyanNet or a WeSpeaker ResNet"):
        pyannote.accelerate(torch.nn.Linear(2, 2))


def test_once_per_chunk_embeddings_equal_the_stock_pipelines(pyannote) -> None:
    """On the CPU (stock seg_1 in both): the trunk once per chunk and the three masks
    pooled together give the per-pair path's embeddings, with and without overlap
    exclusion; `undo` restores the stock method."""
    from pyannote.core import SlidingWindowFeature

    pipeline = pyannote.offline_pipeline(
        pyannote.segmentation_3_0(seed=0), pyannote.wespeaker_resnet34(seed=1), batch_size=8
    )
    audio = {"waveform": 0.1 * torch.randn(1, 16000 * 12), "sample_rate": 16000}
    segmentations = pipeline.get_segmentations(audio)
    rng = np.random.default_rng(0)
    masks = (rng.random(segmentations.data.shape) > 0.6).astype(np.float32)
    masks[1, :, 2] = 0.0  # a speaker absent from a chunk
    binary = SlidingWindowFeature(masks, segmentations.sliding_window)
    for exclude_overlap in (False, True):
        stock = pipeline.get_embeddings(audio, binary, exclude_overlap=exclude_overlap)
        chunked = pyannote.embed_once_per_chunk(pipeline, batch_size=2)
        assert pipeline.get_embeddings.__self__ is chunked
        ours = pipeline.get_embeddings(audio, binary, exclude_overlap=exclude_overlap)
        chunked.undo()
        assert "get_embeddings" not in pipeline.__dict__
        assert ours.shape == stock.shape == (masks.shape[0], 3, 256)
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(stock))
        # float32 sums over other batch compositions: rounding only
        scale = np.nanmax(np.abs(stock))
        assert np.nanmax(np.abs(ours - stock)) <= 1e-5 * scale
