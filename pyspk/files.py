"""Audio and RTTM files for `pyspk diarize` and corpus runs: which files an input names,
decoding through soundfile (libsndfile inside), RTTM names, and RTTM files written whole
or not at all. Imports soundfile only when decoding; nothing of PyTorch."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspk.errors import FileError

__all__ = [
    "AUDIO_EXTENSIONS",
    "Audio",
    "FileError",
    "audio_header",
    "corpus_files",
    "read_audio",
    "refuse_rttm_twins",
    "rttm_twins",
    "rttm_uri",
    "write_rttm",
]

AUDIO_EXTENSIONS = frozenset({".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff"})
"""What a folder's audio files end with (libsndfile reads these)."""


@dataclass
class Audio:
    path: Path
    waveform: Any  # (channels, samples) float32 numpy
    sample_rate: int

    @property
    def seconds(self) -> float:
        return self.waveform.shape[1] / self.sample_rate


def rttm_uri(path: str | Path) -> str:
    """The RTTM uri of an audio file: its name without the extension, each run of
    whitespace (which would split an RTTM line's fields) made one "_", and each byte of
    the name that is not UTF-8 made U+FFFD (an RTTM file is UTF-8 text)."""
    stem = os.fsencode(Path(path).stem).decode("utf-8", errors="replace")
    return "_".join(stem.split()) or "_"


def rttm_twins(paths: Iterable[str | Path]) -> tuple[Path, Path] | None:
    """The first two of `paths` with one RTTM uri (whose RTTM files would be one file),
    or None."""
    seen: dict[str, Path] = {}
    for path in map(Path, paths):
        uri = rttm_uri(path)
        if uri in seen:
            return seen[uri], path
        seen[uri] = path
    return None


def refuse_rttm_twins(paths: Iterable[str | Path]) -> None:
    """FileError naming the first two of `paths` with one RTTM uri, if any."""
    twins = rttm_twins(paths)
    if twins is not None:
        first, second = twins
        raise FileError(
            f"{first} and {second} would both write {rttm_uri(second)}.rttm: rename one, or "
            "run them apart"
        )


def corpus_files(inputs: Iterable[str | Path]) -> list[Path]:
    """The audio files `inputs` name, in order, each once: a file as it is; a folder's
    files ending in `AUDIO_EXTENSIONS`, recursively, sorted; a list file (`@list.txt`),
    one path a line (blank lines and lines starting with # left out), relative paths
    taken from the list's folder. A folder's hidden files and folders (their names
    starting with ".", such as the "._" files macOS writes beside audio) are left out.
    FileError for an input that does not exist, or a list that is not UTF-8 text."""
    found: list[Path] = []
    for item in inputs:
        text = str(item)
        if text.startswith("@"):
            listed = Path(text[1:])
            try:
                lines = listed.read_text(encoding="utf-8").splitlines()
            except OSError as error:
                raise FileError(f"{listed}: cannot read the list ({error.strerror})") from None
            except UnicodeDecodeError:
                raise FileError(f"{listed}: the list is not UTF-8 text") from None
            entries = [line.strip() for line in lines]
            paths = [listed.parent / entry for entry in entries if entry and entry[0] != "#"]
            found += corpus_files(paths)
            continue
        path = Path(text)
        if path.is_dir():
            found += sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and p.suffix.lower() in AUDIO_EXTENSIONS
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
        elif path.is_file():
            found.append(path)
        else:
            raise FileError(f"{path}: no such file or folder")
    return list(dict.fromkeys(found))


def _libsndfile(path: str | Path, call: Callable[[Any], Any]) -> Any:
    """`call(soundfile)` on `path`; FileError for a file libsndfile cannot read
    (ImportError where soundfile is missing)."""
    import soundfile

    try:
        return call(soundfile)
    except (RuntimeError, soundfile.LibsndfileError) as error:
        raise FileError(f"{path}: not audio that libsndfile reads ({error})") from None


def _opened(path: str | Path) -> str | bytes:
    """`path` as soundfile opens it: the name's own bytes on POSIX, so that a name that
    is not UTF-8 opens too (soundfile encodes a str strictly)."""
    return str(path) if os.name == "nt" else os.fsencode(path)


def audio_header(path: str | Path) -> Any:
    """soundfile's header of `path` (its samples left undecoded)."""
    return _libsndfile(path, lambda soundfile: soundfile.info(_opened(path)))


def read_audio(path: str | Path) -> Audio:
    """`path` decoded to (channels, samples) float32."""
    data, rate = _libsndfile(
        path, lambda soundfile: soundfile.read(_opened(path), dtype="float32", always_2d=True)
    )
    if data.shape[0] == 0:
        raise FileError(f"{path}: holds no samples")
    # (channels, samples) in C order; a mono file's is a view of the samples (the copy of
    # a transpose took 2 ms for 5 minutes)
    waveform = data.reshape(1, -1) if data.shape[1] == 1 else data.T.copy()
    return Audio(Path(path), waveform, int(rate))


def write_rttm(annotation: Any, path: Path) -> None:
    """`annotation` as the RTTM file `path`, whole or not at all: written to a temporary
    file of its own beside it (two writers of one RTTM never share one), then renamed
    over it; on any error the temporary file is removed."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.partial")
    created = False
    try:
        # as open() creates files (the umask's permissions), but never an existing one
        handle = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        created = True
        with open(handle, "w", encoding="utf-8") as text:
            annotation.write_rttm(text)
            text.flush()
            os.fsync(text.fileno())  # on disk before a manifest can say it is done
        os.replace(partial, path)
    except BaseException as error:
        if created:
            partial.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise FileError(f"cannot write {path}: {error.strerror or error}") from None
        raise
