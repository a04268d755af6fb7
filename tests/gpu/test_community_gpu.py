"""community-1's shape on the GPU: VBx clustering over a PLDA fitted to 8 voices, with
constrained assignment, written as a pipeline folder and loaded through
`Pipeline.from_pretrained`, as a downloaded community-1 is loaded.

- accelerated in FP32 math, a 300 s recording of 4 other voices (300 chunks: past the
  127 that int8 cluster labels once overflowed) gives the stock annotation, both of
  them, centroids within the engine's embedding tolerance, and the engine reports the
  clustering's parts;
- in TF32 math it runs through;
- the clustering with the linkage on the device gives pyannote's labels, scores and
  centroids, on random embeddings and on tied ones;
- `pyspk diarize --pipeline FOLDER` writes the stock RTTM.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.diarization import synthetic_file, tracks
from tests.optional import required

pytestmark = pytest.mark.gpu

SECONDS = 300.0


@pytest.fixture(scope="module")
def folder(torch, pyannote, tmp_path_factory):
    from pyspk.pyannote import offline
    from pyspk.testing.synthetic import recording

    workspace = tmp_path_factory.mktemp("community")
    segmentation = offline.segmentation_3_0(seed=0, fit_to=recording(200, seed=11), device="cuda")
    embedding = offline.wespeaker_resnet34(seed=1).to("cuda")
    voices = recording(400, seed=12, speakers=8)
    plda = offline.fit_community_plda(embedding, voices, workspace / "plda")
    return offline.write_pipeline(workspace / "community-1", segmentation, embedding, plda)


@pytest.fixture(scope="module")
def pipeline(torch, folder):
    from pyannote.audio import Pipeline

    return Pipeline.from_pretrained(folder).to(torch.device("cuda"))


@pytest.fixture(scope="module")
def audio(torch):
    return synthetic_file(torch, SECONDS, seed=5)


def test_accelerated_fp32_annotation_is_stock(pyannote, pipeline, audio):
    from pyannote.audio.pipelines.clustering import VBxClustering

    assert isinstance(pipeline.clustering, VBxClustering)
    stock = pipeline(dict(audio))
    with pyannote.accelerate_pipeline(pipeline, "fp32") as acceleration:
        ours = pipeline(dict(audio))
        run = acceleration.engine.last_run
    assert tracks(ours) == tracks(stock) and tracks(stock)[0]
    # the centroids average embeddings that are within 1e-5 of the largest stock one
    # (tests/gpu/test_engine_gpu.py), not the same bits
    scale = np.abs(stock.speaker_embeddings).max()
    assert np.abs(ours.speaker_embeddings - stock.speaker_embeddings).max() <= 1e-5 * scale
    assert run.chunks > 127
    assert {"filter", "linkage", "plda", "vbx", "assignment"} <= set(run.clustering)
    assert run.clustering["embeddings_clustered"] > 100


def test_accelerated_tf32_runs(pyannote, pipeline, audio):
    with pyannote.accelerate_pipeline(pipeline, "tf32") as acceleration:
        ours = pipeline(dict(audio))
    assert ours.speaker_diarization.labels()
    assert acceleration.engine.last_run.speakers >= 1


@pytest.mark.parametrize("tied", [False, True])
def test_vbx_with_the_device_linkage_is_pyannotes(torch, pipeline, tied):
    """Enough embeddings for the linkage kernel (2000 kept), random or repeated (equal
    distances): the same outputs as pyannote's own clustering."""
    from pyannote.core import SlidingWindow, SlidingWindowFeature

    from pyspk.pyannote import _clustering

    rng = np.random.default_rng(30 + tied)
    chunks = 1000
    centres = rng.standard_normal((4, 256)) * 0.6 + 1.0
    embeddings = centres[rng.integers(0, 4, (chunks, 3))] + 0.3 * rng.standard_normal(
        (chunks, 3, 256)
    )
    if tied:
        embeddings = embeddings[rng.integers(0, 50, chunks)]  # 50 chunks, each many times
    speaking = rng.integers(0, 3, (chunks, 59))
    data = np.repeat(np.eye(3, dtype=np.float32)[speaking], 10, axis=1)[:, :589]
    segmentations = SlidingWindowFeature(data, SlidingWindow(start=0.0, duration=10.0, step=1.0))
    arguments = {
        "embeddings": embeddings.astype(np.float32),
        "segmentations": segmentations,
        "num_clusters": None,
        "min_clusters": 1,
        "max_clusters": np.inf,
    }
    stock = pipeline.clustering(**arguments)
    timings: dict[str, float] = {}
    from pyspk.candidate.cluster import DeviceLinkage
    from pyspk.torch import shared_runtime

    with DeviceLinkage(shared_runtime(0)) as linkage:
        ours = _clustering.cluster(
            pipeline.clustering, device_linkage=linkage, timings=timings, **arguments
        )
    for mine, theirs in zip(ours, stock, strict=True):
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs, equal_nan=True)
    assert timings["embeddings_clustered"] >= _clustering.DEVICE_LINKAGE_MIN_POINTS


def test_diarize_with_a_pipeline_folder_writes_the_stock_rttm(
    torch, pyannote, folder, tmp_path, capsys
):
    soundfile = required("soundfile", "PYSPK_REQUIRE_PYANNOTE")
    from pyspk.cli import main
    from pyspk.testing.synthetic import recording

    soundfile.write(tmp_path / "talk.wav", recording(200, seed=6).waveform, 16000)
    written = {}
    for path in ("stock", "accelerated"):
        arguments = ["diarize", str(tmp_path / "talk.wav"), "--pipeline", str(folder)]
        arguments += ["--rttm", str(tmp_path / path), "--quiet"]
        status = main(arguments + (["--stock"] if path == "stock" else []))
        assert status == 0, capsys.readouterr().err
        written[path] = (tmp_path / path / "talk.rttm").read_text()
    assert written["accelerated"] == written["stock"]
    assert written["stock"].startswith("SPEAKER talk 1 ")
