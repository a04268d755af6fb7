"""The diarization engine behind `pyspk.pyannote.accelerate_pipeline`: pyannote.audio's
`SpeakerDiarization.apply` with the same steps and the same output, run fast.

What changes against the stock `apply` (pyannote.audio 4.0), and why it gives the same
result:
- The audio goes to the GPU once; every 10 s chunk is a view of it. The stock path
  cuts each chunk twice on the host (`Inference.slide`, then `Audio.crop` per chunk for
  the embeddings); both cut the same samples for audio at the models' sample rate.
- Segmentation runs `segmentation_batch` chunks per forward (128 by default, where
  the LSTM's time per chunk levels off; see `SEGMENTATION_BATCH`), the pyspk plans
  serving a multiple of 32 as batch-32 enqueues; a file's last chunks run on the
  smallest forward of 32, 64, ... chunks that holds them (`_chunks.segmentation_spans`).
  The powerset-to-speakers conversion stays on the GPU, where the embeddings read it.
- The embedding model runs its ResNet trunk once per chunk (`forward_frames`) and pools
  the chunk's three speaker masks together, 32 chunks a forward: the stock embeddings
  of each (chunk, speaker) pair, a third of the trunk's work.
- The segmentation and the embedding run on two CUDA streams: the embedding of a
  batch overlaps the segmentation of the next. Each fixed-shape forward is captured
  once as a CUDA graph and replayed (the last, partial batch padded with zeros), the
  fbank on `PlannedFbank`'s kernels around the FFT (`Fbank` where they cannot plan).
- The host counts speakers (and what else needs only the segmentation) while the GPU
  embeds; the steps after the models run as whole-array numpy (`pyspk.pyannote._steps`),
  with pyannote's results to the bit. The clustering (agglomerative, or community-1's VBx)
  runs pyannote's own code with pyspk's parts (`pyspk.pyannote._clustering`): the
  centroid linkage on the GPU, the embedding filter, the constrained assignment at once.
- In TF32 math the library's own convolutions, LSTM and matrix products run in TF32
  too, within the engine's calls only (pyannote.audio switches TF32 off globally for
  every pipeline); FP32 math keeps them FP32. The caller's switches are restored.

A configuration the engine does not serve (a pipeline in training, segmentation
without powerset classes, an embedding model that is not a WeSpeaker ResNet, oracle
clustering) runs the stock `apply`; `Engine.unserved` says why.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from pyannote.audio.pipelines.speaker_diarization import DiarizeOutput
from pyannote.audio.pipelines.utils.diarization import set_num_speakers
from pyannote.core import Annotation, SlidingWindow, SlidingWindowFeature

from pyspk.candidate.cluster import DeviceLinkage
from pyspk.cuda import CudaMath
from pyspk.cuda.errors import ClosedError, InvalidArgument
from pyspk.errors import TooLongError, available_host_memory, run_all
from pyspk.pyannote import _chunks, _steps
from pyspk.pyannote._background import Background
from pyspk.pyannote._configuration import unserved_configuration
from pyspk.pyannote._graphs import Forward, fill_ladder, padded
from pyspk.pyannote._host_steps import cluster_and_reconstruct
from pyspk.pyannote._report import RunReport
from pyspk.pyannote._turns import DeviceTurns
from pyspk.pyannote._upload import PieceUpload, float_waveform, to_host
from pyspk.pyannote.fbank import Fbank, planned_fbank
from pyspk.torch import library_math, shared_runtime
from pyspk.torch._math import library_math_released
from pyspk.torch._streams import HOST_COPY_STREAMS, STREAMS

__all__ = [
    "EMBEDDING_BATCH",
    "SEGMENTATION_BATCH",
    "TF32_SEGMENTATION_BATCH",
    "Engine",
    "RunReport",
    "unserved_configuration",
]

SEGMENTATION_BATCH = 128
"""Chunks per segmentation forward in FP32 math: cuDNN's 4-layer BiLSTM's time per chunk
falls steeply from batch 32 to 128 and little beyond (docs/performance.md, "Measurements
behind the Python code")."""

TF32_SEGMENTATION_BATCH = 512
"""Chunks per segmentation forward where the LSTM runs on pyspk's recurrence plan (TF32
math by default, FP32 math with `accelerate_pipeline(..., lstm=True)`): its time per
chunk falls about threefold from 128 to 512, and little beyond (benchmarks/h200-lstm.md)."""


EMBEDDING_BATCH = 32
"""Chunks per embedding forward: 96 (chunk, speaker) rows, pyspk's seg_1 plan."""


@dataclass
class _Queued:
    """What `Engine._enqueue` queued: events (segmentation batches with the chunk each
    reached, embedding batches, the host copies) and the host tensors being filled."""

    start: torch.cuda.Event
    segmented: list[tuple[int, torch.cuda.Event]] = field(default_factory=list)
    embedded: list[torch.cuda.Event] = field(default_factory=list)
    scores: Any = None
    masks: Any = None
    embeddings: Any = None
    masks_copied: Any = None
    embeddings_copied: Any = None
    # the device outputs other streams read, held till their copies are waited for (to_host)
    outputs: tuple[torch.Tensor, ...] = ()
    began: float = 0.0  # when the host had queued the GPU's first work (perf_counter)


_Inferred = tuple[RunReport, SlidingWindowFeature, _steps.SegmentationFacts, np.ndarray | None]
"""`Engine._infer`'s result (see there)."""


def _recorded(stream: torch.cuda.Stream) -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return event


class Engine:
    """Runs `pipeline` (a pyannote `SpeakerDiarization` on its CUDA device, its models
    already on pyspk plans) as the module docstring says; `apply` stands for the
    pipeline's own and takes its arguments. With `embedding_setup` (work the embedding
    forwards need first: the embedding model's plans) that work and the embedding
    forwards are made on a thread of their own once the segmentation's are ready: the
    first file's segmentation runs on the GPU meanwhile, and its embeddings wait for
    them (a failure there is raised as `BackgroundSetupError` by each `apply`)."""

    def __init__(
        self,
        pipeline: Any,
        math: CudaMath | str = CudaMath.FP32,
        *,
        batches: tuple[int, int] = (SEGMENTATION_BATCH, EMBEDDING_BATCH),
        graphs: bool = True,
        overlap: bool = True,
        turns: DeviceTurns | None = None,
        embedding_setup: Callable[[], None] | None = None,
    ) -> None:
        segmentation_batch, embedding_batch = batches
        if segmentation_batch < 1 or embedding_batch < 1:
            raise InvalidArgument(
                f"batches must be positive, not {segmentation_batch} and {embedding_batch}"
            )
        self.pipeline = pipeline
        self.math = CudaMath.parse(math)
        self.segmentation_batch = segmentation_batch
        self.embedding_batch = embedding_batch
        self.overlap = overlap
        self.turns = turns  # shared with the device's other engines, if any
        self.last_run: RunReport | None = None  # the report of the last `apply` to finish
        self.closed = False
        # one apply at a time: the forwards' static inputs and outputs, the two streams
        # and the report are the engine's own
        self._lock = threading.Lock()
        self.unserved = self._unserved(pipeline)
        self._segments: dict[int, Forward] = {}  # by batch, the largest first
        self._embeds: dict[int, Forward] = {}  # the same
        self._fbank: Fbank | None = None
        self._linkage: DeviceLinkage | None = None
        self._embedding_side: Background | None = None
        if self.unserved is not None:
            if embedding_setup is not None:
                embedding_setup()
            return
        inference = pipeline._segmentation
        self.device = inference.device
        self._segmentation_model = inference.model
        self._conversion = inference.conversion
        self._embedding_model = pipeline._embedding.model_
        # the clustering's distances and merges; its buffers grow to the largest file's
        self._linkage = DeviceLinkage(shared_runtime(self.device))
        # each given back at close, or when an engine never closed is collected
        self._streams = seg_stream, emb_stream = tuple(STREAMS.take(self.device, 2))
        self._give_back = [weakref.finalize(self, STREAMS.give_back, [*self._streams])]
        (self._copies,) = HOST_COPY_STREAMS.take(self.device, 1)  # to the host
        self._give_back.append(weakref.finalize(self, HOST_COPY_STREAMS.give_back, [self._copies]))
        window = self._segmentation_model.audio.get_num_samples(inference.duration)
        started = time.perf_counter()
        try:
            with torch.inference_mode(), library_math(self.math), torch.cuda.device(self.device):
                # frames of the segmentation's output per chunk: what the masks have
                self._mask_frames = self._segmentation_model.num_frames(window)
                fill_ladder(
                    self._segments,
                    "segmentation",
                    self._segment_eager,
                    lambda size: [(size, 1, window)],
                    _chunks.segmentation_sizes(segmentation_batch),
                    self.device,
                    graphs,
                    seg_stream,
                )
                if embedding_setup is None:
                    self._prepare_embedding(graphs, window, emb_stream)
                # the forwards' work, which this stream waited for: not the whole
                # device's, which would break another thread's capture
                torch.cuda.current_stream().synchronize()
            if embedding_setup is not None:
                self._start_embedding_side(embedding_setup, graphs, window)
        except BaseException:  # nothing half-made stays: the plans, forwards, streams
            self.close()
            raise
        self.prepare_seconds = time.perf_counter() - started

    def _prepare_embedding(self, graphs: bool, window: int, stream: torch.cuda.Stream) -> None:
        self._fbank = planned_fbank(self._embedding_model, self.device)
        fill_ladder(
            self._embeds,
            "embedding",
            self._embed_eager,
            lambda size: [(size, 1, window), (size, 3, self._mask_frames)],
            _chunks.embedding_sizes(self.embedding_batch),
            self.device,
            graphs,
            stream,
        )

    def _start_embedding_side(
        self, embedding_setup: Callable[[], None], graphs: bool, window: int
    ) -> None:
        """The embedding side on a thread of its own, which holds a `library_math` scope
        from before this returns to its end: an `apply` that waits for it never has to
        let it into one (the caller's own scopes let go meanwhile, as that thread may
        have to wait for them to end)."""
        entered = threading.Event()
        aside = functools.partial(self._embedding_aside, embedding_setup, graphs, window, entered)
        what = f"pyspk engine: the embedding setup on {self.device}"
        self._embedding_side = side = Background("pyspk-embedding-setup", what, aside)
        with library_math_released():
            while not entered.wait(timeout=0.05) and not side.failed():
                pass

    def _embedding_aside(
        self,
        embedding_setup: Callable[[], None],
        graphs: bool,
        window: int,
        entered: threading.Event,
    ) -> None:
        """`embedding_setup` (the model's plans), then the forwards, captured on a private
        stream (the engine's embedding stream is the first file's meanwhile) and
        replayed on the engine's."""
        with library_math(self.math), torch.cuda.device(self.device):
            entered.set()
            embedding_setup()
            (stream,) = STREAMS.take(self.device, 1)
            # the engine's till it closes: its graphs keep library workspaces of this stream
            self._give_back.append(weakref.finalize(self, STREAMS.give_back, [stream]))
            with torch.inference_mode():
                self._prepare_embedding(graphs, window, stream)
                torch.cuda.current_stream().synchronize()

    def settle(self) -> BaseException | None:
        """Waits for an embedding side made in the background (`embedding_setup`) to be
        ready or to have failed; returns its error (None if none), without raising it."""
        return None if self._embedding_side is None else self._embedding_side.settle()

    # -- what it serves ---------------------------------------------------------------

    @staticmethod
    def _unserved(pipeline: Any) -> str | None:
        reason = unserved_configuration(pipeline)
        device = getattr(pipeline._segmentation, "device", torch.device("cpu"))
        if reason is None and device.type != "cuda":
            return "the pipeline is not on a CUDA device"
        return reason

    def _segment_eager(self, waveforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self._segmentation_model(waveforms)
        return scores, self._conversion(scores)

    def _embed_eager(self, waveforms: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor]:
        resnet = self._embedding_model.resnet
        frames = resnet.forward_frames(cast(Fbank, self._fbank)(waveforms))  # set when served
        if frames.shape[0] < self.embedding_batch:  # a file's last chunks
            # the fbank and the trunk (each chunk's own) on these alone, the pool and seg_1
            # on a full batch: seg_1's plan serves its rows only, the library others
            frames, masks = (padded(part, self.embedding_batch) for part in (frames, masks))
        return (resnet.forward_embedding(frames, weights=masks)[1],)

    def describe(self) -> dict[str, str]:
        """How each forward runs ("graph", or "eager" and why)."""
        if self.unserved is not None:
            return {"engine": f"stock apply ({self.unserved})"}
        error = self.settle()
        if error is not None:
            return {"engine": f"the embedding setup failed ({error!r})"}
        assert self._segments and self._embeds  # made when served
        notes = {}
        for ladder in (self._segments, self._embeds):
            forwards = [*ladder.values()]  # the full forward first
            if len({forward.note for forward in forwards}) == 1:  # all alike: one entry
                forwards = forwards[:1]
            notes.update({forward.name: forward.note for forward in forwards})
        return notes

    def close(self) -> None:
        """Drops the captured graphs and their memory (before the plans they hold); a
        later `apply` raises `ClosedError`. Waits for a running `apply` to finish."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.settle()  # what the embedding side made is closed too
            forwards = (*self._segments.values(), *self._embeds.values())
            parts = (*reversed(forwards), self._linkage, self._fbank)
            steps = [part.close for part in parts if part is not None]
            if self.unserved is None:
                steps.extend(self._give_back)
            run_all(steps)  # each runs; the first error is raised after the last

    # -- apply ------------------------------------------------------------------------

    def apply(
        self,
        file: Mapping,
        num_speakers: int | None = None,
        min_speakers: int | None = None,
        max_speakers: int | None = None,
        hook: Callable | None = None,
        **kwargs: Any,
    ) -> DiarizeOutput | Annotation:
        """`SpeakerDiarization.apply(file, ...)` on the engine (see the module). Calls
        from several threads run one at a time, each with its own result."""
        pipeline = self.pipeline
        if self.closed:
            raise ClosedError("pyspk engine: closed (its acceleration was undone)")
        if self.unserved is not None or pipeline.training or not float_waveform(file):
            # integer samples too: the stock apply refuses them as it does
            if self._embedding_side is not None:  # no model changed under it; raises
                self._embedding_side.wait()  # a failure, as the engine's path does
            return type(pipeline).apply(
                pipeline, file, num_speakers, min_speakers, max_speakers, hook, **kwargs
            )
        with self._lock:
            if self.closed:
                raise ClosedError("pyspk engine: closed (its acceleration was undone)")
            if self._embedding_side is not None and self._embedding_side.failed():
                self._embedding_side.wait()  # raises before any of the file's work
            return self._apply(file, num_speakers, min_speakers, max_speakers, hook, **kwargs)

    def _apply(
        self,
        file: Mapping,
        num_speakers: int | None,
        min_speakers: int | None,
        max_speakers: int | None,
        hook: Callable | None,
        **kwargs: Any,
    ) -> DiarizeOutput | Annotation:
        pipeline = self.pipeline
        if len(kwargs) > 0:
            warnings.warn(
                f"Ignoring unexpected keyword arguments: {', '.join(list(kwargs.keys()))}",
                stacklevel=3,
            )
        started = time.perf_counter()
        hook = pipeline.setup_hook(file, hook=hook)
        num_speakers, min_speakers, max_speakers = set_num_speakers(
            num_speakers=num_speakers, min_speakers=min_speakers, max_speakers=max_speakers
        )
        if pipeline._expects_num_speakers and num_speakers is None:
            if isinstance(file, Mapping) and "annotation" in file:
                num_speakers = len(file["annotation"].labels())
            else:
                raise InvalidArgument(
                    f"num_speakers must be provided when using {pipeline.klustering} clustering"
                )
        with torch.inference_mode(), library_math(self.math), torch.cuda.device(self.device):
            inferred = self._infer(file, hook, started)
        report, segmentations, facts, embeddings = inferred
        if embeddings is None:  # no speaker is ever active: the stock early exit
            output = DiarizeOutput(
                speaker_diarization=Annotation(uri=file["uri"]),
                exclusive_speaker_diarization=Annotation(uri=file["uri"]),
                speaker_embeddings=np.zeros((0, pipeline._embedding.dimension)),
            )
            self._finish(report, started)
            return output.speaker_diarization if pipeline.legacy else output
        output = cluster_and_reconstruct(
            pipeline,
            self._linkage,
            file,
            segmentations,
            facts,
            embeddings,
            num_speakers,
            min_speakers,
            max_speakers,
            hook,
            report,
        )
        self._finish(report, started)
        return output

    def _finish(self, report: RunReport, started: float) -> None:
        report.seconds = time.perf_counter() - started
        self.last_run = report

    def _infer(self, file: Mapping, hook: Callable, started: float) -> _Inferred:
        """Both models over every chunk on the GPU, the segmentations' facts
        (`_steps.segmentation_facts`) on the host meanwhile: the report, segmentations,
        facts and embeddings (None when no speaker is ever active)."""
        chunks, upload, report, chunk_window = self._upload(file)
        gpu = self._enqueue(chunks, upload)
        return self._collect(gpu, report, chunk_window, hook, started)

    def _upload(self, file: Mapping) -> tuple[torch.Tensor, PieceUpload, RunReport, SlidingWindow]:
        """The file's chunks as (chunks, 1, window) views of its zero-padded waveform on
        the device, after the checks, the upload that fills it; its report and the
        chunks' sliding window."""
        inference = self.pipeline._segmentation
        model = self._segmentation_model
        waveform, sample_rate = model.audio(file)
        window = model.audio.get_num_samples(inference.duration)
        step = round(inference.step * sample_rate)
        num_samples = waveform.shape[1]
        total = _chunks.chunk_count(num_samples, window, step)
        chunk_window = SlidingWindow(start=0.0, duration=inference.duration, step=inference.step)
        _chunks.check_crops(self.pipeline._audio, chunk_window, total, step, sample_rate)
        report = RunReport(audio_seconds=num_samples / sample_rate, chunks=total)
        length = _chunks.padded_length(total, window, step, num_samples)
        self._check_memory(file, report.audio_seconds, total, length)
        audio = torch.zeros((1, length), device=self.device)
        upload = PieceUpload(audio, waveform[:1], window, step)  # the samples: in _enqueue
        chunks = audio.unfold(1, window, step)[0, :total].unsqueeze(1)
        return chunks, upload, report, chunk_window

    def _enqueue(self, chunks: torch.Tensor, upload: PieceUpload) -> _Queued:
        """Queues both models over `chunks`: each segmentation batch on one stream after
        its samples' upload, the embeddings of the chunks it completed on the other, then
        the copies to the host.
        Returns at once; the events say when each part is done."""
        current = torch.cuda.current_stream()
        streams = self._streams if self.overlap else (current, current)
        for stream in streams:
            stream.wait_stream(current)
        # after the files that the device's other engines queued before this one
        with self.turns.turn(streams) if self.turns else nullcontext():
            return self._queue_models(chunks, upload, streams)

    def _queue_models(
        self, chunks: torch.Tensor, upload: PieceUpload, streams: tuple[torch.cuda.Stream, ...]
    ) -> _Queued:
        """`_enqueue`'s work, on its (segmentation, embedding) streams."""
        assert self._segments  # and the embedding forwards, unless made in the background
        seg_stream, emb_stream = streams
        total = chunks.shape[0]
        queued = _Queued(torch.cuda.Event(enable_timing=True))
        queued.start.record(seg_stream)
        queued.began = time.perf_counter()
        scores = masks = embeddings = None
        exclude = self._exclusion()
        embedded = 0

        def embed_through(stop: int, masks: torch.Tensor) -> None:
            nonlocal embeddings, embedded
            with torch.cuda.stream(emb_stream):
                emb_stream.wait_event(queued.segmented[-1][1])
                for start, last in _chunks.embedding_spans(
                    embedded, stop, total, self.embedding_batch
                ):
                    weights = exclude(masks[start:last]).transpose(1, 2)
                    size = _chunks.smallest_holding([*self._embeds], last - start)
                    (batch,) = self._embeds[size](chunks[start:last], weights)
                    if embeddings is None:
                        embeddings = torch.empty((total, *batch.shape[1:]), device=self.device)
                    embeddings[start:last].copy_(batch[: last - start])
                    queued.embedded.append(_recorded(emb_stream))
                    embedded = last

        side = self._embedding_side
        for first, stop, size in _chunks.segmentation_spans(total, [*self._segments]):
            upload.through(stop, seg_stream)
            with torch.cuda.stream(seg_stream):
                batch_scores, batch_masks = self._segments[size](chunks[first:stop])
                if scores is None or masks is None:
                    scores = torch.empty((total, *batch_scores.shape[1:]), device=self.device)
                    masks = torch.empty((total, *batch_masks.shape[1:]), device=self.device)
                scores[first:stop].copy_(batch_scores[: stop - first])
                masks[first:stop].copy_(batch_masks[: stop - first])
                queued.segmented.append((stop, _recorded(seg_stream)))
            if side is None or side.ready():  # else the segmentation runs ahead meanwhile
                embed_through(stop, masks)
        assert scores is not None and masks is not None
        if embedded < total:
            assert side is not None
            if side.settle() is not None:
                seg_stream.synchronize()  # the file's own work, done with its buffers
            side.wait()  # raises the embedding setup's error
            embed_through(total, masks)
        assert embeddings is not None
        (queued.masks, queued.scores), queued.masks_copied = to_host(
            self._copies, queued.segmented[-1][1], masks, scores
        )
        (queued.embeddings,), queued.embeddings_copied = to_host(
            self._copies, queued.embedded[-1], embeddings
        )
        queued.outputs = (masks, scores, embeddings)
        return queued

    def _collect(
        self,
        gpu: _Queued,
        report: RunReport,
        chunk_window: SlidingWindow,
        hook: Callable,
        started: float,
    ) -> _Inferred:
        """Waits for the segmentation batch by batch (progress), counts speakers on the
        host while the GPU embeds, then waits for the embeddings: `_infer`'s result."""
        total = report.chunks
        progress = functools.partial(hook, "segmentation", None)
        progress(completed=0, total=total)
        for stop, done in gpu.segmented:
            done.synchronize()
            progress(completed=stop, total=total)
        gpu.masks_copied.synchronize()
        seg_done = gpu.segmented[-1][1]
        report.steps["segmentation"] = (gpu.began - started) + gpu.start.elapsed_time(
            seg_done
        ) / 1e3
        report.scores = gpu.scores.numpy()
        segmentations = SlidingWindowFeature(gpu.masks.numpy(), chunk_window)
        hook("segmentation", segmentations)
        counting = time.perf_counter()
        facts = _steps.segmentation_facts(segmentations, self._segmentation_model.receptive_field)
        report.steps["speaker_counting"] = time.perf_counter() - counting
        hook("speaker_counting", facts.count)
        if np.nanmax(facts.count.data) == 0.0:
            # this file's own work, not the device's: another thread's capture survives
            # it, and another engine's work is not waited for
            gpu.embeddings_copied.synchronize()
            return report, segmentations, facts, None
        batches = len(gpu.embedded)
        hook("embeddings", None, total=batches, completed=0)
        for index, event in enumerate(gpu.embedded, 1):
            event.synchronize()
            hook("embeddings", None, total=batches, completed=index)
        gpu.embeddings_copied.synchronize()
        report.steps["embeddings"] = max(0.0, seg_done.elapsed_time(gpu.embedded[-1]) / 1e3)
        report.setup = gpu.began - started
        report.gpu = gpu.start.elapsed_time(gpu.embedded[-1]) / 1e3
        report.embeddings = gpu.embeddings.numpy()
        hook("embeddings", report.embeddings)
        return report, segmentations, facts, report.embeddings

    def _check_memory(self, file: Mapping, seconds: float, total: int, length: int) -> None:
        """Refuses (`TooLongError`, one line) a file whose audio and per-chunk outputs
        (scores, masks, embeddings) the device cannot hold, or whose outputs' host
        copies the host cannot, before any work."""
        conversion = self._conversion
        speakers = conversion.num_classes
        per_chunk = self._mask_frames * (conversion.num_powerset_classes + speakers)
        per_chunk += speakers * self.pipeline._embedding.dimension
        outputs = 4 * total * per_chunk
        device_need = 4 * length + outputs
        free = torch.cuda.mem_get_info(self.device)[0]
        free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        host = available_host_memory()
        for need, where, available in ((device_need, self.device, free), (outputs, "host", host)):
            if available is not None and need > available:
                raise TooLongError(
                    f"pyspk engine: {file.get('uri', 'the file')} ({seconds / 3600:.1f} h) "
                    f"needs {need / 1e9:.1f} GB on {where}, {available / 1e9:.1f} GB free"
                )

    def _exclusion(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The masks `get_embeddings` pools for (chunks, frames, speakers) binary
        segmentations: as they are, or with overlapped frames zeroed where enough
        frames remain (`embedding_exclude_overlap`)."""
        pipeline = self.pipeline
        if not pipeline.embedding_exclude_overlap:
            return lambda masks: masks
        embedding = pipeline._embedding
        samples = pipeline._segmentation.duration * embedding.sample_rate
        least = math.ceil(self._mask_frames * embedding.min_num_samples / samples)

        def exclude(masks: torch.Tensor) -> torch.Tensor:
            clean = masks * (masks.sum(dim=2, keepdim=True) < 2)
            enough = clean.sum(dim=1, keepdim=True) > least
            return torch.where(enough, clean, masks)

        return exclude
