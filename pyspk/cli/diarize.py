"""`pyspk diarize`: speaker diarization of audio files with pyannote.audio on pyspk.

The arguments are checked, and the audio decoded (soundfile, which carries its own
libsndfile), before PyTorch or pyannote.audio is imported, so a bad path, an
unreadable file or a missing checkpoint costs one line and exit status 2 on any
machine. The models come from a pyannote pipeline (`--pipeline`: a Hugging Face id the
user has access to, or a local folder with its config.yaml) or from two local model
checkpoints (`--segmentation`, `--embedding`, with agglomerative clustering).

Checkpoints are pickles, and unpickling can run code; pyannote.audio also imports the
module a checkpoint names (and a pipeline's config.yaml names) before it reads any
weight. Unless `--trust-checkpoints` is given, a local checkpoint is first read with
`torch.load(weights_only=True)`, which admits only tensors, plain containers and
pyannote's own specification types, and must name a model class pyspk serves (pyannote's
`PyanNet` or a WeSpeaker ResNet, by exact module and class); a local `--pipeline`
folder must name pyannote's `SpeakerDiarization`, no preprocessors, and models in its
own subfolders whose checkpoints pass the same check. A Hugging Face `--pipeline` is
loaded by pyannote.audio as it loads it: its files are trusted as its publisher is.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspk.cli._arguments import DiarizeError, positive_int
from pyspk.cli.trust import check_pipeline_folder, load_checkpoint
from pyspk.files import (
    Audio,
    FileError,
    audio_header,
    corpus_files,
    read_audio,
    refuse_rttm_twins,
    rttm_twins,
    rttm_uri,
    write_rttm,
)

__all__ = ["DEMO_SECONDS", "DiarizeError", "add_parser", "rttm_uri", "run"]

DEMO_SECONDS = 600.0
INSTALL_HINT = "pip install 'pyspk-diarize[diarize]'"
"""What `pyspk diarize` needs, in one command: the distribution's name, not the import's."""
MAX_BATCH = 1024
"""The most chunks a segmentation forward takes (each chunk is 10 s of audio)."""


def batch_size(text: str) -> int:
    """An argparse type: a whole number of 1 to MAX_BATCH."""
    value = positive_int(text)
    if value > MAX_BATCH:
        raise argparse.ArgumentTypeError(f"{value} is more than {MAX_BATCH}")
    return value


EPILOG = """\
models: --pipeline ID_OR_FOLDER (a pyannote pipeline: a Hugging Face id, with --token
where it is gated, or a local folder holding its config.yaml), or --segmentation and
--embedding (local model checkpoints, clustered agglomeratively). Checkpoints are
pickles and can run code: unless --trust-checkpoints, local checkpoints must hold only
weights and name pyannote's PyanNet or a WeSpeaker ResNet, and a local --pipeline
folder pyannote's SpeakerDiarization with its models in its own subfolders; a Hugging
Face --pipeline is loaded as pyannote.audio loads it. Use only what you trust.

Each file is decoded when its turn comes and its RTTM written whole (renamed into
place); an RTTM that exists is refused unless --overwrite. A file that fails is
reported and the others go on; the exit status is then 1.

--demo diarizes a synthetic conversation with random-weight models, stock and
accelerated, and prints x real time for both (no audio or checkpoints needed).
"""


# the subcommand's arguments, in the order `--help` lists them: flag, help, options
# fmt: off
_OPTIONS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("audio", "audio files", {"nargs": "*", "metavar": "AUDIO"}),
    ("--rttm", "write DIR/<name>.rttm", {"metavar": "DIR", "type": Path}),
    ("--math", "FP32 (default) or TF32 math, for pyspk and the library",
     {"choices": ("fp32", "tf32"), "default": "fp32"}),
    ("--batch", f"chunks per segmentation forward, 1 to {MAX_BATCH} "
     "(default 512 where the LSTM runs on pyspk's kernel, TF32 math; else 128)",
     {"metavar": "N", "type": batch_size}),
    ("--pipeline", "a pyannote pipeline: Hugging Face id or local folder",
     {"metavar": "ID_OR_FOLDER"}),
    ("--token", "Hugging Face token for a gated --pipeline (default: HF_TOKEN)",
     {"metavar": "TOKEN"}),
    ("--segmentation", "a local segmentation model checkpoint", {"metavar": "CKPT", "type": Path}),
    ("--embedding", "a local WeSpeaker embedding model checkpoint",
     {"metavar": "CKPT", "type": Path}),
    ("--trust-checkpoints", "load local checkpoints that need more than weights_only",
     {"action": "store_true"}),
    ("--stock", "run the stock pipeline instead of pyspk's (for comparison)",
     {"action": "store_true"}),
    ("--num-speakers", "the number of speakers, when known",
     {"metavar": "N", "type": positive_int}),
    ("--demo", "diarize a synthetic recording, stock and accelerated", {"action": "store_true"}),
    ("--seconds", f"length of the --demo recording (default {DEMO_SECONDS:g})",
     {"metavar": "S", "type": float, "default": DEMO_SECONDS}),
    ("--device", "CUDA device", {"metavar": "N", "type": int, "default": 0}),
    ("--quiet", "no progress bar", {"action": "store_true"}),
    ("--overwrite", "replace RTTM files that exist already", {"action": "store_true"}),
    ("--corpus", "corpus mode (with --rttm): AUDIO may be folders and @list files; a "
     "manifest, and a rerun skips what it records as done (and writes again the RTTM "
     "files it does not)", {"action": "store_true"}),
    ("--manifest", "corpus mode's JSON-lines record (default DIR/manifest.jsonl)",
     {"metavar": "FILE", "type": Path}),
    ("--engines", "corpus mode: accelerated pipelines per GPU (default 2)",
     {"metavar": "N", "type": positive_int, "default": 2}),
    ("--gpus", "corpus mode on Dask: a local cluster of one worker per GPU (N or all)",
     {"metavar": "N"}),
    ("--scheduler", "corpus mode on Dask: join the cluster at ADDRESS",
     {"metavar": "ADDRESS"}),
)
# fmt: on


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """The `diarize` subcommand on `commands` (argparse subparsers)."""
    parser = commands.add_parser(
        "diarize",
        help="who speaks when in audio files, with pyannote.audio on pyspk",
        description="Diarize each AUDIO file (WAV, FLAC, OGG and what else libsndfile\n"
        "reads) with a pyannote.audio pipeline on pyspk's accelerated engine and write\n"
        "one RTTM file per input (to --rttm DIR, else to standard output).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for flag, text, options in _OPTIONS:
        parser.add_argument(flag, help=text, **options)
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """The command; DiarizeError (one line, exit 2) for what the user can fix."""
    try:
        if args.demo:
            if args.audio or args.pipeline or args.segmentation or args.embedding:
                raise DiarizeError("--demo takes no audio files and no models")
            if not args.seconds > 10:
                raise DiarizeError(f"--seconds must be more than 10, not {args.seconds:g}")
            return _demo(args)
        if args.corpus or args.gpus or args.scheduler or args.manifest:
            return _corpus(args)
        _check_arguments(args)
        for path in args.audio:
            _check_audio(path)
        return _diarize(args)
    except DiarizeError as error:
        print(f"pyspk diarize: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2


def _check_arguments(args: argparse.Namespace) -> None:
    if not args.audio:
        raise DiarizeError("no AUDIO file given (or --demo)")
    for path in args.audio:
        candidate = Path(path)
        if not candidate.exists():
            raise DiarizeError(f"{path}: no such file")
        if not candidate.is_file():
            raise DiarizeError(f"{path}: not a file (folders and @lists: --corpus)")
    _check_models(args)
    if args.rttm is not None:
        _check_rttm_folder(args.rttm)
        if rttm_twins(args.audio) is not None:
            raise DiarizeError("two AUDIO files share a name; their RTTM files would collide")
        for uri in map(rttm_uri, args.audio):
            if (args.rttm / f"{uri}.rttm").exists() and not args.overwrite:
                raise DiarizeError(
                    f"{args.rttm / f'{uri}.rttm'} exists: pass --overwrite to replace it"
                )


def _check_rttm_folder(folder: Path) -> None:
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise DiarizeError(f"--rttm {folder}: {existing} is not a folder")


def _check_models(args: argparse.Namespace) -> None:
    if args.pipeline and (args.segmentation or args.embedding):
        raise DiarizeError("give either --pipeline or --segmentation with --embedding")
    if not args.pipeline:
        if not (args.segmentation and args.embedding):
            raise DiarizeError(
                "no models: give --pipeline ID_OR_FOLDER, or --segmentation CKPT and "
                "--embedding CKPT (see pyspk diarize --help)"
            )
        checkpoints = {"--segmentation": args.segmentation, "--embedding": args.embedding}
        for option, path in checkpoints.items():
            if not path.is_file():
                raise DiarizeError(f"{option} {path}: no such checkpoint file")


def _check_audio(path: str) -> None:
    """DiarizeError unless libsndfile reads the header of `path` (its samples are
    decoded one file at a time, as each is diarized)."""
    _files(lambda: audio_header(path))


def _decode(path: str) -> Audio:
    return _files(lambda: read_audio(path))


def _files(call: Callable[[], Any]) -> Any:
    """`call()`, with a file's FileError, or a missing soundfile, as DiarizeError."""
    try:
        return call()
    except FileError as error:
        raise DiarizeError(str(error)) from None
    except ImportError as error:
        raise DiarizeError(f"soundfile is missing ({error}): {INSTALL_HINT}") from None


def _import_stack() -> tuple[Any, Any]:
    """torch and pyspk.pyannote, or DiarizeError saying what to install."""
    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
    import warnings

    try:
        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyannote's notice on its optional decoder
            import pyspk.pyannote as pa
    except ImportError as error:
        raise DiarizeError(
            f"{error}: pyspk diarize needs PyTorch, pyannote.audio and soundfile ({INSTALL_HINT})"
        ) from None
    except OSError as error:  # a compiled library that will not load
        raise DiarizeError(
            f"PyTorch or one of pyannote.audio's libraries will not load ({error}): install "
            "a torchaudio built for the installed PyTorch (the same version)"
        ) from None
    return torch, pa


def _cuda(torch: Any, ordinal: int) -> Any:
    if not torch.cuda.is_available():
        raise DiarizeError("PyTorch sees no CUDA device; pyspk diarize runs on an NVIDIA GPU")
    if not 0 <= ordinal < torch.cuda.device_count():
        raise DiarizeError(
            f"--device {ordinal}: PyTorch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device("cuda", ordinal)


# -- checkpoints ----------------------------------------------------------------------


def _pipeline(args: argparse.Namespace, pa: Any) -> Any:
    if args.pipeline:
        from pyannote.audio import Pipeline

        local = Path(args.pipeline)
        if local.exists() and not args.trust_checkpoints:
            # pyannote reads a folder's config.yaml, or a config file given itself
            if local.is_file() and local.name != "config.yaml":
                raise DiarizeError(
                    f"--pipeline {local}: a local pipeline is a folder holding config.yaml "
                    "(or that config.yaml); --trust-checkpoints loads others"
                )
            check_pipeline_folder(local if local.is_dir() else local.parent)

        token = args.token or os.environ.get("HF_TOKEN")
        try:
            pipeline = Pipeline.from_pretrained(args.pipeline, token=token)
        except Exception as error:
            raise DiarizeError(f"--pipeline {args.pipeline}: cannot load it ({error})") from None
        if pipeline is None:
            raise DiarizeError(
                f"--pipeline {args.pipeline}: not found, or gated (accept its conditions on "
                "Hugging Face and give --token)"
            )
        return pipeline
    segmentation = load_checkpoint(args.segmentation, args.trust_checkpoints)
    embedding = load_checkpoint(args.embedding, args.trust_checkpoints)
    return pa.offline_pipeline(segmentation.eval(), embedding.eval())


# -- progress -------------------------------------------------------------------------


class Progress:
    """Each step's progress bar on stderr, drawn by rich (pyannote.audio's own progress
    library) where stderr is a terminal, silent elsewhere; a pyannote pipeline hook."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self._bars: Any = None
        self._tasks: dict[str, Any] = {}
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bars = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bars.start()

    def __call__(self, step: str, artefact: Any, file: Any = None, **counts: int | None) -> None:
        """pyannote's hook call: a step's name and artefact, and for steps that count,
        `total` and `completed`."""
        total, completed = counts.get("total"), counts.get("completed")
        if self._bars is None or total is None or completed is None:
            return
        if step not in self._tasks:
            self._tasks[step] = self._bars.add_task(f"{self.label}: {step}", total=total)
        self._bars.update(self._tasks[step], completed=completed, total=total)

    def close(self) -> None:
        if self._bars is not None:
            self._bars.stop()


# -- running --------------------------------------------------------------------------


def _diarize(args: argparse.Namespace) -> int:
    """Each file in turn: decoded, diarized, its RTTM written; a file that fails is
    reported on one line and the next one goes on. 1 when any failed, else 0."""
    torch, pa = _import_stack()
    pipeline = _pipeline(args, pa)  # on the host: its files are checked before any device
    pipeline.to(_cuda(torch, args.device))
    acceleration = None
    if not args.stock:
        acceleration = pa.accelerate_pipeline(pipeline, args.math, segmentation_batch=args.batch)
    failed = 0
    try:
        if args.rttm is not None:
            args.rttm.mkdir(parents=True, exist_ok=True)
        for path in args.audio:
            try:
                _diarize_one(args, torch, pipeline, path)
            except DiarizeError as error:
                failed += 1
                print(f"pyspk diarize: error: {' '.join(str(error).split())}", file=sys.stderr)
    finally:
        if acceleration is not None:
            acceleration.undo()
    if failed:
        print(f"pyspk diarize: {failed} of {len(args.audio)} files failed", file=sys.stderr)
    return 1 if failed else 0


def _diarize_one(args: argparse.Namespace, torch: Any, pipeline: Any, path: str) -> None:
    item = _decode(path)  # one file's samples at a time
    uri = rttm_uri(path)
    if uri != item.path.stem:
        print(f"{path}: RTTM uri {uri} (whitespace replaced)", file=sys.stderr)
    file = {"waveform": torch.from_numpy(item.waveform), "sample_rate": item.sample_rate}
    file["uri"] = uri
    progress = Progress(uri, not args.quiet)
    started = time.perf_counter()
    try:
        output = pipeline(file, hook=progress, num_speakers=args.num_speakers)
    except Exception as error:  # this file's failure; the next file goes on
        raise DiarizeError(f"{path}: {type(error).__name__}: {error}") from None
    finally:
        progress.close()
    seconds = time.perf_counter() - started
    annotation = getattr(output, "speaker_diarization", output)
    _write_rttm(annotation, args.rttm, uri)
    print(
        f"{item.path}: {len(annotation.labels())} speakers, {item.seconds:.1f} s of "
        f"audio in {seconds:.2f} s ({item.seconds / seconds:.0f}x real time)",
        file=sys.stderr,
    )


def _write_rttm(annotation: Any, folder: Path | None, uri: str) -> None:
    """To standard output, or to folder/uri.rttm whole or not at all."""
    if folder is None:
        annotation.write_rttm(sys.stdout)
        return
    _files(lambda: write_rttm(annotation, folder / f"{uri}.rttm"))


def _corpus(args: argparse.Namespace) -> int:
    """Corpus mode: the files the inputs name through `diarize_corpus` on this GPU, or
    `diarize_corpus_on_dask` on a local cluster of one worker per GPU (`--gpus`) or the
    cluster at `--scheduler`. 1 when any file failed, else 0."""
    if args.rttm is None:
        raise DiarizeError("corpus mode writes RTTM files: give --rttm DIR")
    if not args.audio:
        raise DiarizeError("no AUDIO file, folder or @list given")
    if args.gpus and args.scheduler:
        raise DiarizeError("give either --gpus or --scheduler")
    _check_models(args)
    _check_rttm_folder(args.rttm)
    files = _files(lambda: corpus_files(args.audio))
    if not files:
        raise DiarizeError("the inputs name no audio file")
    _files(lambda: refuse_rttm_twins(files))  # before any model loads
    options = {} if args.num_speakers is None else {"num_speakers": args.num_speakers}
    if args.gpus or args.scheduler:
        run = _corpus_on_dask(args, files, options)
    else:
        torch, pa = _import_stack()
        pipeline = _pipeline(args, pa)
        pipeline.to(_cuda(torch, args.device))
        run = pa.diarize_corpus(
            pipeline,
            files,
            args.rttm,
            manifest=args.manifest,
            math=args.math,
            engines=args.engines,
            accelerate=not args.stock,
            segmentation_batch=args.batch,
            **({"progress": None} if args.quiet else {}),
            **options,
        )
    print(
        f"pyspk diarize: {run.done} files diarized, {run.skipped} done before, {run.failed} "
        f"failed; {run.audio_seconds / 3600:.2f} h of audio in {run.seconds:.1f} s "
        f"({run.rtfx:.0f}x real time)",
        file=sys.stderr,
    )
    return 1 if run.failed else 0


def _corpus_on_dask(args: argparse.Namespace, files: list[Path], options: dict) -> Any:
    try:
        from distributed import Client
    except ImportError as error:
        raise DiarizeError(
            f"Dask is missing ({error}): pip install 'pyspk-diarize[diarize,corpus]'"
        ) from None
    torch, pa = _import_stack()
    from pyspk.pyannote.corpus import local_gpu_cluster

    # the workers may run elsewhere: the models by absolute path
    for name in ("segmentation", "embedding"):
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    if args.pipeline and Path(args.pipeline).exists():
        args.pipeline = str(Path(args.pipeline).resolve())
    if args.scheduler:
        try:
            client = Client(args.scheduler)
        except OSError as error:  # no scheduler there (after Dask's connect timeout)
            raise DiarizeError(f"--scheduler {args.scheduler}: {error}") from None
    else:
        visible = torch.cuda.device_count()
        count = visible if args.gpus == "all" else _gpu_count(args.gpus)
        if not 1 <= count <= visible:
            raise DiarizeError(f"--gpus {args.gpus}: this machine has {visible} CUDA devices")
        client = local_gpu_cluster(count, threads=args.engines)
    try:
        return pa.diarize_corpus_on_dask(
            functools.partial(_worker_pipeline, args),
            files,
            args.rttm,
            client,
            manifest=args.manifest,
            math=args.math,
            accelerate=not args.stock,
            engines=args.engines,
            **({"progress": None} if args.quiet else {}),
            **options,
        )
    finally:
        if args.scheduler:
            client.close()
        else:
            client.shutdown()  # the local cluster with it


def _gpu_count(text: str) -> int:
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as error:
        raise DiarizeError(f"--gpus {text}: {error} (or all)") from None


def _worker_pipeline(args: argparse.Namespace) -> Any:
    """The pipeline on a Dask worker's device (the first it sees)."""
    torch, pa = _import_stack()
    return _pipeline(args, pa).to(torch.device("cuda"))


def _demo(args: argparse.Namespace) -> int:
    torch, pa = _import_stack()
    device = _cuda(torch, args.device)
    from pyspk.testing.synthetic import recording

    print(
        f"building random-weight models and a {args.seconds:g} s synthetic recording",
        file=sys.stderr,
    )
    segmentation = pa.segmentation_3_0(seed=0, fit_to=recording(400, seed=11), device=device)
    pipeline = pa.offline_pipeline(segmentation, pa.wespeaker_resnet34(seed=1)).to(device)
    file = recording(args.seconds, seed=0).as_file("demo")
    warm_file = recording(30, seed=1).as_file("warm-up")
    results: dict[str, tuple[float, Any]] = {}

    def timed(label: str) -> None:
        progress = Progress(label, not args.quiet)
        torch.cuda.synchronize()
        started = time.perf_counter()
        try:
            output = pipeline(file, hook=progress)
        finally:
            progress.close()
        seconds = time.perf_counter() - started
        results[label] = (seconds, output)
        print(f"{label:<12} {seconds:7.2f} s  {args.seconds / seconds:6.0f}x real time")

    pipeline(warm_file)
    timed("stock")
    with pa.accelerate_pipeline(pipeline, args.math, segmentation_batch=args.batch):
        pipeline(warm_file)
        timed("accelerated")
    stock, accelerated = results["stock"][1], results["accelerated"][1]
    same = list(stock.speaker_diarization.itertracks(yield_label=True)) == list(
        accelerated.speaker_diarization.itertracks(yield_label=True)
    )
    print(
        f"speedup {results['stock'][0] / results['accelerated'][0]:.2f}x; "
        f"{len(accelerated.speaker_diarization.labels())} speakers; annotation "
        f"{'identical to' if same else 'differs from'} stock ({args.math} math)"
    )
    return 0
