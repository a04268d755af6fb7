"""`pyspk.pyannote.plda`: a PLDA fitted to labelled embeddings, written as pyannote's two npz
files and read back through pyannote's own `PLDA`."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pyspk.cuda.errors import InvalidArgument
from pyspk.pyannote.plda import PLDA_FILE, TRANSFORM_FILE, fit_plda, write_plda
from tests.optional import importorskip


def _speakers(seed: int, voices: int, count: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((voices, 256)) * 0.6 + 1.0
    labels = rng.integers(0, voices, count)
    return centres[labels] + 0.3 * rng.standard_normal((count, 256)), labels


def _covariances(rows: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    within = np.zeros((rows.shape[1],) * 2)
    centres = []
    for label in np.unique(labels):
        own = rows[labels == label]
        within += (own - own.mean(0)).T @ (own - own.mean(0))
        centres += [own.mean(0)] * len(own)
    centres_array = np.array(centres) - rows.mean(0)
    return within / len(rows), centres_array.T @ centres_array / len(rows)


def test_written_files_have_pyannotes_arrays(tmp_path):
    transform, plda = fit_plda(*_speakers(1, 12), lda_dimension=100)
    folder = write_plda(tmp_path / "plda", transform, plda)
    with np.load(folder / TRANSFORM_FILE) as saved:
        assert {k: saved[k].shape for k in saved} == {
            "mean1": (256,),
            "mean2": (100,),
            "lda": (256, 100),
        }
    with np.load(folder / PLDA_FILE) as saved:
        assert {k: saved[k].shape for k in saved} == {"mu": (100,), "tr": (100, 100), "psi": (100,)}
        assert np.all(saved["psi"] > 0) and np.all(np.diff(saved["psi"]) <= 0)


def test_pyannotes_plda_space_whitens_the_speakers(tmp_path):
    """In the PLDA space pyannote computes from the files, the training embeddings'
    within-speaker covariance is the identity and their between-speaker covariance
    the diagonal of `phi` (VBx's model). The tolerance covers the ridge (1e-3 of the
    mean variance) that keeps the within-speaker scatter invertible."""
    importorskip("pyannote.audio", reason="pyannote.audio is missing (pyannote extra)")
    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
    from pyannote.audio.core.plda import PLDA

    embeddings, labels = _speakers(2, 16)
    folder = write_plda(tmp_path, *fit_plda(embeddings, labels))
    plda = PLDA.from_pretrained(str(folder))
    within, between = _covariances(plda(embeddings), labels)
    assert np.abs(within - np.eye(128)).max() < 1e-2
    phi = plda.phi
    assert phi.shape == (128,) and np.all(np.diff(phi) <= 1e-9)
    # 16 speakers: 15 between-speaker directions, the others at the floor
    assert np.abs(np.diag(between)[:15] / phi[:15] - 1).max() < 1e-2
    assert np.abs(between - np.diag(np.diag(between))).max() < 1e-2 * phi[0]
    assert phi[15] < 1e-2 * phi[14]


@pytest.mark.parametrize(
    ("embeddings", "labels", "dimension", "message"),
    [
        (np.ones((4, 8)), np.zeros(4), 4, "at least two speakers"),
        (np.ones((4, 8)), np.arange(3), 4, "n speaker labels"),
        (np.full((4, 8), np.nan), np.arange(4) % 2, 4, "NaN"),
        (np.ones((4, 8)), np.arange(4) % 2, 9, "lda_dimension must be 1 to 8"),
    ],
)
def test_refusals_name_the_fault(embeddings, labels, dimension, message):
    with pytest.raises(InvalidArgument, match=message):
        fit_plda(embeddings, labels, lda_dimension=dimension)
