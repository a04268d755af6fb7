"""A PLDA fitted to labelled speaker embeddings, in the two files pyannote.audio's `PLDA`
reads (`xvec_transform.npz` and `plda.npz`), for VBx clustering without a download.

pyannote's PLDA (after VBx's recipe) maps an embedding x to the PLDA space in two steps:
- `xvec_transform.npz` (`mean1`, `lda`, `mean2`): centre, length-normalise and scale,
  project on the LDA directions, centre again, length-normalise and scale;
- `plda.npz` (`mu`, `tr`, `psi`): centre, then the transform that makes the
  within-speaker covariance the identity and the between-speaker covariance diagonal
  (`psi`, its variances, which VBx reads as `Phi`).

`fit_plda` estimates both from embeddings with known speakers, in float64: the LDA
directions are the leading generalised eigenvectors of the between- and within-speaker
scatter of the normalised embeddings, and the PLDA the simultaneous diagonalisation of
the two covariances in the LDA space. Needs numpy only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pyspk.cuda.errors import InvalidArgument

__all__ = ["PLDA_FILE", "TRANSFORM_FILE", "fit_plda", "write_plda"]

TRANSFORM_FILE = "xvec_transform.npz"
PLDA_FILE = "plda.npz"


def _length_normalised(rows: np.ndarray) -> np.ndarray:
    """Each row scaled to length sqrt(dimension), as pyannote's transform scales them."""
    return np.sqrt(rows.shape[1]) * rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _scatter(rows: np.ndarray, speakers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Within- and between-speaker covariances of `rows` (each speaker weighted by its
    number of rows)."""
    mean = rows.mean(axis=0)
    within = np.zeros((rows.shape[1], rows.shape[1]))
    between = np.zeros_like(within)
    for speaker in np.unique(speakers):
        own = rows[speakers == speaker]
        centre = own.mean(axis=0)
        within += (own - centre).T @ (own - centre)
        between += len(own) * np.outer(centre - mean, centre - mean)
    return within / len(rows), between / len(rows)


def _diagonalising(
    within: np.ndarray, between: np.ndarray, ridge: float
) -> tuple[np.ndarray, np.ndarray]:
    """(variances, transform) with transform @ within @ transform.T the identity and
    transform @ between @ transform.T diagonal, largest variance first; `ridge` (relative
    to the mean within-speaker variance) keeps `within` invertible. The generalised
    eigenproblem through the Cholesky factor of `within`: numpy alone."""
    scale = np.trace(within) / len(within)
    lower = np.linalg.cholesky(within + ridge * scale * np.eye(len(within)))
    whiten = np.linalg.inv(lower)  # whiten @ within @ whiten.T is the identity
    variances, rotation = np.linalg.eigh(whiten @ between @ whiten.T)
    order = np.argsort(variances)[::-1]
    return variances[order], rotation[:, order].T @ whiten


def fit_plda(
    embeddings: np.ndarray,
    speakers: np.ndarray,
    lda_dimension: int = 128,
    ridge: float = 1e-3,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The arrays of `xvec_transform.npz` and `plda.npz` for (n, dimension) `embeddings`
    of the `speakers` (n labels, at least two speakers): `lda_dimension` LDA directions
    (at most the embeddings' dimension), between-speaker variances floored at `ridge`
    times the largest so that every one is positive."""
    embeddings = np.asarray(embeddings, dtype=np.float64)
    speakers = np.asarray(speakers)
    if embeddings.ndim != 2 or len(embeddings) != len(speakers):
        raise InvalidArgument(
            f"fit_plda takes (n, dimension) embeddings and n speaker labels, not "
            f"{embeddings.shape} and {speakers.shape}"
        )
    if not np.all(np.isfinite(embeddings)):
        raise InvalidArgument("fit_plda: the embeddings hold NaN or infinite values")
    if len(np.unique(speakers)) < 2:
        raise InvalidArgument("fit_plda needs embeddings of at least two speakers")
    if not 1 <= lda_dimension <= embeddings.shape[1]:
        raise InvalidArgument(
            f"lda_dimension must be 1 to {embeddings.shape[1]}, not {lda_dimension}"
        )
    mean1 = embeddings.mean(axis=0)
    normalised = _length_normalised(embeddings - mean1)
    _, lda = _diagonalising(*_scatter(normalised, speakers), ridge)
    lda = lda[:lda_dimension].T  # (dimension, lda_dimension): pyannote applies lda.T
    projected = normalised @ lda
    mean2 = projected.mean(axis=0)
    in_lda = _length_normalised(projected - mean2)
    mu = in_lda.mean(axis=0)
    within, between = _scatter(in_lda, speakers)
    psi, tr = _diagonalising(within, between, ridge)
    psi = np.maximum(psi, ridge * psi[0])
    return {"mean1": mean1, "mean2": mean2, "lda": lda}, {"mu": mu, "tr": tr, "psi": psi}


def write_plda(
    directory: str | Path, transform: dict[str, np.ndarray], plda: dict[str, np.ndarray]
) -> Path:
    """Writes `fit_plda`'s arrays as `directory`/xvec_transform.npz and plda.npz (the
    folder pyannote's `PLDA.from_pretrained` reads); returns the folder."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    for name, arrays in ((TRANSFORM_FILE, transform), (PLDA_FILE, plda)):
        named: dict[str, Any] = dict(arrays)  # each array under its name
        np.savez(folder / name, **named)
    return folder
