"""The files of a corpus run: which to run and in what order (`plan_run`), the JSON-lines
manifest of what was done, the run's tallies and progress line, and one file's
diarization with its RTTM written whole (`diarize_file`). Shared by the runs on this
process's GPU (`pyspk.pyannote.corpus`) and on a Dask cluster
(`pyspk.pyannote._corpus_dask`)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspk.errors import BackgroundSetupError
from pyspk.files import (
    Audio,
    FileError,
    audio_header,
    corpus_files,
    read_audio,
    refuse_rttm_twins,
    rttm_uri,
    write_rttm,
)

__all__ = ["MANIFEST_NAME", "CorpusRun", "Manifest", "diarize_file", "plan_run", "to_stderr"]

MANIFEST_NAME = "manifest.jsonl"


class Manifest:
    """A JSON-lines record of finished files, one line each (`path`, `status` "done" or
    "failed", `audio_seconds`, `seconds`, `rtfx`, `speakers`, `rttm`, `error`), appended
    and flushed to disk as each file finishes, so that a run killed at any point keeps
    what it finished."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        # a run killed in the middle of a line left it unended: the next record starts
        # on a line of its own
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb+") as handle:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    handle.write(b"\n")

    def done(self) -> set[str]:
        """The paths whose last record says done and whose RTTM file exists."""
        last: dict[str, dict] = {}
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill: not a finished file
                    continue
                if isinstance(entry, dict) and "path" in entry:
                    last[entry["path"]] = entry
        return {
            path
            for path, entry in last.items()
            if entry.get("status") == "done" and Path(entry.get("rttm", "")).is_file()
        }

    def record(self, entry: dict) -> None:
        line = json.dumps(entry, sort_keys=True) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


@dataclass
class CorpusRun:
    """What a corpus run did: files found, diarized, skipped (done before) and failed;
    seconds of audio diarized and of wall time."""

    files: int = 0
    done: int = 0
    skipped: int = 0
    failed: int = 0
    audio_seconds: float = 0.0
    seconds: float = 0.0
    setup_seconds: float = 0.0
    """Of `seconds`, before any file could start: copying the pipelines and accelerating
    the first one's segmentation side (its embedding side is made while its first
    file's segmentation runs, the other engines while it diarizes)."""

    @property
    def rtfx(self) -> float:
        return self.audio_seconds / self.seconds if self.seconds > 0 else 0.0

    def tally(self, entry: dict, started: float, progress: Callable[[str], None] | None) -> None:
        """Counts a finished file's manifest entry, takes the run's seconds since
        `started` (`time.perf_counter`), and gives `progress` its line."""
        if entry["status"] == "done":
            self.done += 1
            self.audio_seconds += entry["audio_seconds"]
        else:
            self.failed += 1
        self.seconds = time.perf_counter() - started
        if progress is not None:
            progress(self.progress_line(entry))

    def progress_line(self, entry: dict) -> str:
        hours = self.audio_seconds / 3600
        finished = self.done + self.failed
        todo = self.files - self.skipped
        what = (
            f"{entry['speakers']} speakers, {entry['rtfx']:.0f}x"
            if entry["status"] == "done"
            else f"failed: {entry['error']}"
        )
        return (
            f"[{finished}/{todo}] {entry['path']}: {what}; {hours:.2f} h done, "
            f"{self.rtfx:.0f}x real time in aggregate"
        )


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def plan_run(
    inputs: Iterable[str | Path], rttm: Path, manifest: Path | None
) -> tuple[list[Path], Manifest, CorpusRun]:
    """The files to run (longest first, those done before left out), the manifest, and
    the run's counts so far."""
    files = corpus_files(inputs)
    refuse_rttm_twins(files)
    rttm.mkdir(parents=True, exist_ok=True)
    manifest = Path(manifest) if manifest is not None else rttm / MANIFEST_NAME
    manifest.parent.mkdir(parents=True, exist_ok=True)  # before any file: none unrecorded
    record = Manifest(manifest)
    done = record.done()
    todo = [path for path in files if str(path) not in done]
    todo.sort(key=_seconds_or_zero, reverse=True)
    return todo, record, CorpusRun(files=len(files), skipped=len(files) - len(todo))


def _seconds_or_zero(path: Path) -> float:
    """The length that orders the run: the header's duration, not the bytes, which
    understate a compressed file's length; 0 for a file libsndfile cannot read, which
    fails quickly in its turn."""
    try:
        header = audio_header(path)
    except FileError:
        return 0.0
    return header.frames / header.samplerate if header.samplerate > 0 else 0.0


def diarize_file(
    pipeline: Any, path: Path, audio: Audio | None, rttm: Path, **options: Any
) -> dict:
    """One file through `pipeline`, its RTTM written whole: the manifest entry (a
    failure is an entry too, with its error). `audio` is the decoded file, or None to
    decode it here."""
    import torch

    entry: dict[str, Any] = {"path": str(path), "rttm": str(rttm / f"{rttm_uri(path)}.rttm")}
    started = time.perf_counter()
    try:
        audio = read_audio(path) if audio is None else audio
        file = {
            "waveform": torch.from_numpy(audio.waveform),
            "sample_rate": audio.sample_rate,
            "uri": rttm_uri(path),
        }
        output = pipeline(file, **options)
        annotation = getattr(output, "speaker_diarization", output)
        write_rttm(annotation, Path(entry["rttm"]))
    except BackgroundSetupError:  # the engine's, not the file's: the run stops
        raise
    except Exception as error:  # this file's failure: recorded, and the others go on
        entry.update(status="failed", error=f"{type(error).__name__}: {error}")
        return entry
    seconds = time.perf_counter() - started
    entry.update(
        status="done",
        audio_seconds=audio.seconds,
        seconds=seconds,
        rtfx=audio.seconds / seconds,
        speakers=len(annotation.labels()),
    )
    return entry
