"""`pyspk.pyannote.offline`: community-1's shape built offline (VBx over a PLDA fitted to known
voices), written as a pipeline folder and loaded back by pyannote.audio as a downloaded
community-1 is loaded; on the CPU, with the stock pipeline."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from tests.optional import importorskip

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch = pytest.importorskip("torch")
    importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")
    from pyannote.audio import Pipeline
    from pyannote.audio.pipelines.clustering import VBxClustering

from pyspk.pyannote import offline
from pyspk.testing.synthetic import recording


@pytest.fixture(scope="module")
def models():
    segmentation = offline.segmentation_3_0(seed=0, fit_to=recording(60, seed=11))
    return segmentation, offline.wespeaker_resnet34(seed=1)


@pytest.fixture(scope="module")
def plda_folder(models, tmp_path_factory):
    calibration = recording(40, seed=12, speakers=6)
    return offline.fit_community_plda(models[1], calibration, tmp_path_factory.mktemp("plda"))


def test_speaker_embeddings_are_the_voices_speaking_alone(models):
    calibration = recording(40, seed=12, speakers=6)
    embeddings, voices = offline.speaker_embeddings(models[1], calibration, step=5.0)
    assert embeddings.shape == (len(voices), 256) and embeddings.dtype == np.float64
    assert len(voices) >= 7  # at least one voice in each of the seven chunks
    assert set(voices) <= {turn.speaker for turn in calibration.turns}
    assert np.all(np.isfinite(embeddings))


def test_community_1_pipeline_has_its_shape(models, plda_folder):
    pipeline = offline.community_1_pipeline(*models, plda_folder)
    assert isinstance(pipeline.clustering, VBxClustering)
    assert pipeline.clustering.constrained_assignment
    assert pipeline.embedding_exclude_overlap
    assert pipeline.parameters(instantiated=True) == {
        "clustering": {"threshold": 0.6, "Fa": 0.07, "Fb": 0.8},
        "segmentation": {"min_duration_off": 0.0},
    }


def test_written_folder_loads_as_a_pretrained_pipeline(models, plda_folder, tmp_path):
    """`Pipeline.from_pretrained(folder)`: the same models (every weight), PLDA and
    hyper-parameters, and on 15 s of new voices the same annotation and embeddings as
    the pipeline built in memory."""
    built = offline.community_1_pipeline(*models, plda_folder)
    folder = offline.write_pipeline(tmp_path / "community-1", *models, plda_folder)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.*")) == [
        "config.yaml",
        "embedding/pytorch_model.bin",
        "plda/plda.npz",
        "plda/xvec_transform.npz",
        "segmentation/pytorch_model.bin",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = Pipeline.from_pretrained(folder)
    assert type(loaded) is type(built)
    assert loaded.parameters(instantiated=True) == built.parameters(instantiated=True)
    assert loaded.embedding_exclude_overlap and loaded.segmentation_batch_size == 32
    for ours, theirs in (
        (loaded._segmentation.model, built._segmentation.model),
        (loaded._embedding.model_, built._embedding.model_),
    ):
        mine, stock = ours.state_dict(), theirs.state_dict()
        assert mine.keys() == stock.keys()
        assert all(torch.equal(mine[key], stock[key]) for key in mine)
    assert np.array_equal(loaded.clustering.plda.phi, built.clustering.plda.phi)
    file = recording(15, seed=3).as_file("t")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outputs = [pipeline(dict(file)) for pipeline in (loaded, built)]
    tracks = [list(o.speaker_diarization.itertracks(yield_label=True)) for o in outputs]
    assert tracks[0] == tracks[1] and tracks[0]
    assert np.array_equal(outputs[0].speaker_embeddings, outputs[1].speaker_embeddings)
