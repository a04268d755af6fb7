"""pyannote.audio on pyspk plans: the segmentation-3.0 `PyanNet` and `WeSpeakerResNet34`
models, and a once-per-chunk embedding path for the `SpeakerDiarization` pipeline.

`accelerate(model, math)` replaces, inside a model already on its CUDA device, each
module at a pyspk boundary with a `pyspk.torch` wrapper that shares its parameters:
PyanNet's SincNet first stage (`sincnet.conv1d[0]` with the abs and `pool1d[0]` after
it, on a `pyspk.torch.sincnet.PlannedSincFront`; the SincNet's `forward` then skips
those two), `sincnet.conv1d[1]` and `[2]` (their bias dropped: the max-pool and the
InstanceNorm without running statistics that follow cancel it), `linear[0]` and
`linear[1]` with the LeakyReLU that `PyanNet.forward` applies after them, and
`classifier` with its LogSoftmax activation; WeSpeaker's `resnet.seg_1`, its
`resnet.pool` where weights are given (`pyspk.torch.resnet.PlannedStatsPool`), and its
ResNet34 trunk: `resnet.forward_frames` (and `resnet.forward`, which runs the same
layers) on a `pyspk.torch.resnet.PlannedTrunk` (recorded as "resnet.trunk"; below the
sm80 tier it is skipped). In TF32 math, PyanNet's `lstm` (monolithic) runs on a
`pyspk.torch.lstm.PlannedLSTM`; in FP32 math it stays cuDNN's unless asked for
(`accelerate(..., lstm=True)`). A PyanNet's `forward` is replaced by one that leaves
out the activations the plans fuse. Shapes no plan serves take each module's library
path. `Acceleration.undo()` puts every original module and method back.

The stock pipeline embeds each (chunk, speaker) pair on its own, so the ResNet trunk runs
three times on every chunk and seg_1 sees 32 rows at a time. `embed_once_per_chunk`
makes a pipeline run the trunk once per chunk (`forward_frames`) and pool the chunk's
speaker masks together (`forward_embedding` with `(B, speakers, frames)` weights): the
same embeddings, a third of the trunk's work, and 96 rows for seg_1 (3 for a lone
chunk), which are the rows of pyspk's embedding plans; a last batch of 2 to 31 chunks
takes seg_1's library path.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import torch
from pyannote.audio.models.embedding.wespeaker import BaseWeSpeakerResNet
from pyannote.audio.models.segmentation import PyanNet
from pyannote.core import SlidingWindowFeature
from torch import nn

from pyspk.candidate import DenseSite, SegConvSite
from pyspk.cuda import CudaMath
from pyspk.cuda.errors import InvalidArgument
from pyspk.errors import PlanError, run_all
from pyspk.pyannote._chunks import segmentation_sizes
from pyspk.pyannote._forwards import planned_pyannet_forward, planned_sincnet_forward
from pyspk.pyannote._turns import DeviceTurns
from pyspk.pyannote.corpus import diarize_corpus, diarize_corpus_on_dask
from pyspk.pyannote.engine import (
    EMBEDDING_BATCH,
    SEGMENTATION_BATCH,
    TF32_SEGMENTATION_BATCH,
    Engine,
)
from pyspk.pyannote.offline import (  # the offline models, also under this module's name
    COMMUNITY_1_PARAMETERS,
    community_1_pipeline,
    embed_chunks,
    fit_community_plda,
    offline_pipeline,
    segmentation_3_0,
    speaker_embeddings,
    wespeaker_resnet34,
    write_pipeline,
)
from pyspk.torch import (
    PlannedConv1d,
    PlannedDense,
    PlannedModule,
    library_math,
    planned_modules,
)
from pyspk.torch.lstm import PlannedLSTM
from pyspk.torch.resnet import PlannedStatsPool, PlannedTrunk
from pyspk.torch.sincnet import PlannedSincFront

if TYPE_CHECKING:
    from lightning.fabric.utilities.data import AttributeDict
    from pyannote.audio.models.embedding.wespeaker.resnet import ResNet

__all__ = [
    "CHUNK_BATCH",
    "COMMUNITY_1_PARAMETERS",
    "PIPELINE_TRUNK_STREAMS",
    "SEGMENTATION_BATCH",
    "TF32_SEGMENTATION_BATCH",
    "Acceleration",
    "ChunkEmbeddings",
    "DeviceTurns",
    "PipelineAcceleration",
    "accelerate",
    "accelerate_pipeline",
    "community_1_pipeline",
    "diarize_corpus",
    "diarize_corpus_on_dask",
    "embed_chunks",
    "embed_once_per_chunk",
    "fit_community_plda",
    "offline_pipeline",
    "segmentation_3_0",
    "speaker_embeddings",
    "wespeaker_resnet34",
    "write_pipeline",
]

CHUNK_BATCH = EMBEDDING_BATCH
"""Chunks per trunk call on the once-per-chunk path (the engine's embedding batch):
seg_1 then sees 96 rows."""
PIPELINE_TRUNK_STREAMS = {CudaMath.FP32: 3, CudaMath.TF32: 2}
"""A pipeline's trunk plans and streams by math (`accelerate`'s `trunk_streams`): beside
cuDNN's FP32 segmentation three fill the GPU better than two, beside pyspk's TF32 one
two do (docs/performance.md, "The trunk's plans beside the segmentation")."""


class Acceleration:
    """The modules `accelerate` replaced in one model, and how to put them back."""

    def __init__(self, model: nn.Module, math: CudaMath) -> None:
        self.model = model
        self.math = math
        self.modules: dict[str, PlannedModule | PlannedTrunk] = {}
        self.skipped: dict[str, str] = {}  # module path -> why it keeps the library path
        self._restore: list[Callable[[], None]] = []
        self.undone = False

    def replace(
        self,
        path: str,
        parent: nn.Module,
        key: str | int,
        build: Callable[[], PlannedModule],
    ) -> None:
        """Swap `parent[key]` (or `parent.key`) for `build()`; a planning refusal leaves
        the module as it is and records why."""
        # an int key indexes a ModuleList (sincnet.conv1d, linear)
        original = (
            cast(nn.ModuleList, parent)[key] if isinstance(key, int) else getattr(parent, key)
        )
        try:
            planned = build()
        except (PlanError, ValueError) as error:
            self.skipped[path] = str(error)
            return
        _set_child(parent, key, planned)
        self.modules[path] = planned
        self._restore.append(lambda: _set_child(parent, key, original))

    def on_undo(self, step: Callable[[], None]) -> None:
        """Run `step` at `undo()`, before the steps registered earlier."""
        self._restore.append(step)

    def undo(self) -> None:
        """Puts every original module (and forward) back and frees the plans
        (idempotent). Every step runs; the first error is raised after the last."""
        if self.undone:
            return
        self.undone = True
        closes = [planned.close for planned in self.modules.values()]
        run_all([*reversed(self._restore), *closes])

    def __enter__(self) -> Acceleration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()

    def __repr__(self) -> str:
        planned = ", ".join(f"{path}: {m.entries()}" for path, m in self.modules.items())
        return f"Acceleration({type(self.model).__name__}, math={self.math}, {{{planned}}})"


def _restore_attribute(owner: Any, name: str, before: Any) -> None:
    """Put back the instance attribute `name` as it was (`before`: None when absent)."""
    if before is None:
        owner.__dict__.pop(name, None)
    else:
        setattr(owner, name, before)


def _set_child(parent: nn.Module, key: str | int, module: nn.Module) -> None:
    if isinstance(key, int):
        cast(nn.ModuleList, parent)[key] = module  # as in `Acceleration.replace`
    else:
        setattr(parent, key, module)


def accelerate(
    model: nn.Module,
    math: CudaMath | str = CudaMath.FP32,
    *,
    lstm: bool | None = None,
    trunk_streams: int = 2,
) -> Acceleration:
    """Puts `model` (a `PyanNet` or a WeSpeaker ResNet, on a CUDA device) on pyspk plans
    for FP32 or TF32 math (`CudaMath` or "fp32"/"tf32"); see the module's docstring.
    `lstm` says whether a PyanNet's LSTM runs on `PlannedLSTM`: by default (None) in TF32
    math only; True also in FP32 math, where its projections run in FP32 and its
    recurrence on 22-bit operands (below cuDNN FP32's error against float64, but not
    cuDNN's bits: the annotation may differ from stock's); False never. `trunk_streams`:
    a WeSpeaker trunk's plans and streams (`PlannedTrunk`'s `streams`)."""
    math = CudaMath.parse(math)
    if not isinstance(model, (PyanNet, BaseWeSpeakerResNet)):
        raise InvalidArgument(
            f"accelerate takes a PyanNet or a WeSpeaker ResNet, not {type(model).__name__}"
        )
    device = next(model.parameters()).device
    if device.type != "cuda":
        raise InvalidArgument(
            f"accelerate: the model is on {device}; move it to a CUDA device first"
        )
    planned = [name for name, _ in planned_modules(model)]
    if planned:
        raise InvalidArgument(
            f"accelerate: {type(model).__name__} is accelerated already ({', '.join(planned)});"
            " undo() that first"
        )
    acceleration = Acceleration(model, math)
    try:
        if isinstance(model, PyanNet):
            _accelerate_pyannet(
                model, acceleration, math is CudaMath.TF32 if lstm is None else lstm
            )
        else:
            resnet = cast("ResNet", model.resnet)  # set by each WeSpeaker subclass
            acceleration.replace(
                "resnet.seg_1",
                resnet,
                "seg_1",
                lambda: PlannedDense(resnet.seg_1, DenseSite.EMBEDDING, math, "resnet.seg_1"),
            )
            acceleration.replace(
                "resnet.pool", resnet, "pool", lambda: PlannedStatsPool(resnet.pool, device)
            )
            _accelerate_trunk(resnet, acceleration, trunk_streams)
    except BaseException:
        acceleration.undo()  # nothing half-replaced: the stock model again
        raise
    return acceleration


def _accelerate_trunk(resnet: ResNet, acceleration: Acceleration, streams: int) -> None:
    """`resnet.forward_frames` on a trunk plan, and `resnet.forward` through it (the
    stock forward runs the same layers inline); a refusal (below the sm80 tier, another
    ResNet) leaves both and records why."""
    try:
        planned = PlannedTrunk(resnet, acceleration.math, streams=streams)
    except (PlanError, ValueError) as error:
        acceleration.skipped["resnet.trunk"] = str(error)
        return

    def forward(fbank: torch.Tensor, weights: torch.Tensor | None = None) -> Any:
        return resnet.forward_embedding(planned(fbank), weights=weights)

    before = {name: resnet.__dict__.get(name) for name in ("forward_frames", "forward")}
    # instance attributes over the class's methods, removed again by `undo()`
    resnet.forward_frames = planned  # type: ignore[method-assign]
    resnet.forward = forward  # type: ignore[method-assign]
    acceleration.modules["resnet.trunk"] = planned
    for name, value in before.items():
        acceleration.on_undo(functools.partial(_restore_attribute, resnet, name, value))


def _accelerate_pyannet(model: PyanNet, acceleration: Acceleration, lstm: bool = False) -> None:
    math = acceleration.math
    convs, norms = model.sincnet.conv1d, model.sincnet.norm1d
    _accelerate_sinc_front(model.sincnet, acceleration, math)
    for index, site in ((1, SegConvSite.CONV1), (2, SegConvSite.CONV2)):
        conv = cast(nn.Conv1d, convs[index])  # SincNet's conv1d[1] and [2] are Conv1d
        # InstanceNorm subtracts each channel's own mean only without running statistics
        bias: Literal["add", "drop"] = "add" if norms[index].track_running_stats else "drop"
        path = f"sincnet.conv1d.{index}"
        acceleration.replace(
            path,
            convs,
            index,
            functools.partial(PlannedConv1d, conv, site, math, bias, path),
        )
    if lstm and cast("AttributeDict", model.hparams).lstm["monolithic"]:
        # by default TF32 math only: in FP32 math cuDNN's LSTM keeps the stock bits
        module = cast(nn.LSTM, model.lstm)
        acceleration.replace("lstm", model, "lstm", lambda: PlannedLSTM(module))
    linears = model.linear
    for index, dense_site in ((0, DenseSite.LINEAR0), (1, DenseSite.LINEAR1)):
        if index < len(linears):
            linear, path = cast(nn.Linear, linears[index]), f"linear.{index}"
            acceleration.replace(
                path,
                linears,
                index,
                functools.partial(PlannedDense, linear, dense_site, math, path),
            )
    activation = model.activation
    if isinstance(activation, nn.LogSoftmax) and activation.dim in (-1, 2):
        classifier = model.classifier
        acceleration.replace(
            "classifier",
            model,
            "classifier",
            lambda: PlannedDense(classifier, DenseSite.CLASSIFIER, math, "classifier"),
        )
    else:
        acceleration.skipped["classifier"] = f"its activation is {activation}, not LogSoftmax"
    before = model.__dict__.get("forward")  # an instance forward of the caller's, if any
    # an instance attribute over PyanNet.forward, removed again by `undo()`
    model.forward = planned_pyannet_forward.__get__(model)  # type: ignore[method-assign]
    acceleration.on_undo(lambda: _restore_attribute(model, "forward", before))


def _accelerate_sinc_front(sincnet: nn.Module, acceleration: Acceleration, math: CudaMath) -> None:
    """SincNet's first stage (conv1d[0], its abs and pool1d[0]) on a `PlannedSincFront`
    in `math`, and the SincNet's `forward` on one that calls it in their place."""
    convs, pools = cast(nn.ModuleList, sincnet.conv1d), cast(nn.ModuleList, sincnet.pool1d)
    encoder, pool = convs[0], pools[0]
    acceleration.replace(
        "sincnet.conv1d.0", convs, 0, lambda: PlannedSincFront(encoder, pool, math)
    )
    if "sincnet.conv1d.0" not in acceleration.modules:
        return
    before = sincnet.__dict__.get("forward")
    # an instance attribute over SincNet.forward, removed again by `undo()`
    sincnet.forward = functools.partial(planned_sincnet_forward, sincnet)  # type: ignore[method-assign]
    acceleration.on_undo(lambda: _restore_attribute(sincnet, "forward", before))


def _library_bits_sinc_front(
    model: nn.Module, math: CudaMath, batches: list[int], samples: int
) -> Acceleration:
    """SincNet's first stage alone on a `PlannedSincFront`, kept only where it gives the
    library stage's bits at each of `batches` chunks of `samples` on a probe of noise,
    and serving those batches only (others take the library stage): the segmentation
    keeps its stock bits. On the H200 the plan's outputs equal cuDNN FP32's at 32, 128
    and 512 chunks (`benchmarks/h200-sincnet.md`); another device or library may sum in
    another order, and there the stage stays the library's, `skipped` saying why."""
    acceleration = Acceleration(model, math)
    if not isinstance(model, PyanNet):
        acceleration.skipped["sincnet.conv1d.0"] = f"{type(model).__name__} is not a PyanNet"
        return acceleration
    _accelerate_sinc_front(model.sincnet, acceleration, CudaMath.FP32)  # the library's bits
    front = acceleration.modules.get("sincnet.conv1d.0")
    if not isinstance(front, PlannedSincFront):
        return acceleration
    device = next(model.parameters()).device
    try:
        generator = torch.Generator(device=device).manual_seed(0)
        with torch.inference_mode(), library_math(math), torch.cuda.device(device):
            for batch in sorted(set(batches)):
                probe = torch.randn(batch, 1, samples, generator=generator, device=device)
                if not torch.equal(front(probe), front.library(probe)):
                    acceleration.undo()
                    refused = Acceleration(model, math)
                    refused.skipped["sincnet.conv1d.0"] = (
                        f"the plan's bits differ from the library's at {batch} chunks on "
                        "this device; the stock segmentation's bits come first in this math"
                    )
                    return refused
    except BaseException:  # the model as it was, whatever failed
        acceleration.undo()
        raise
    front.served_batches = frozenset(batches)
    return acceleration


class ChunkEmbeddings:
    """A pipeline's `get_embeddings` on the once-per-chunk path; `undo()` restores the
    stock method."""

    def __init__(self, pipeline: Any, batch_size: int = CHUNK_BATCH) -> None:
        if batch_size < 1:
            raise InvalidArgument(f"batch_size must be positive, not {batch_size}")
        embedding = getattr(pipeline, "_embedding", None)
        model = getattr(embedding, "model_", None)
        if not isinstance(model, BaseWeSpeakerResNet):
            raise InvalidArgument(
                "embed_once_per_chunk needs a pipeline whose embedding model is a pyannote "
                f"WeSpeaker ResNet, not {type(model).__name__}"
            )
        self.pipeline = pipeline
        self.batch_size = batch_size
        self._before = pipeline.__dict__.get("get_embeddings")  # an earlier hook, if any
        self._stock = pipeline.get_embeddings
        pipeline.get_embeddings = self.get_embeddings

    def undo(self) -> None:
        """Puts back the method the pipeline had before (idempotent)."""
        if self.pipeline.__dict__.get("get_embeddings") == self.get_embeddings:
            _restore_attribute(self.pipeline, "get_embeddings", self._before)

    def get_embeddings(
        self,
        file: Any,
        binary_segmentations: SlidingWindowFeature,
        exclude_overlap: bool = False,
        hook: Callable[..., Any] | None = None,
    ) -> np.ndarray:
        """`(chunks, speakers, dimension)` embeddings, as the stock method returns them,
        with the same choice of mask per (chunk, speaker)."""
        pipeline = self.pipeline
        if pipeline.training:  # the stock method's embedding cache serves training
            return self._stock(file, binary_segmentations, exclude_overlap, hook)
        embedding = pipeline._embedding
        num_chunks, num_frames, _ = binary_segmentations.data.shape
        masks = np.nan_to_num(binary_segmentations.data, nan=0.0).astype(np.float32)
        if exclude_overlap:
            # the stock rule: overlapping frames zeroed, unless too few frames remain
            duration = binary_segmentations.sliding_window.duration
            num_samples = duration * embedding.sample_rate
            min_num_frames = math.ceil(num_frames * embedding.min_num_samples / num_samples)
            clean = masks * (np.sum(binary_segmentations.data, axis=2, keepdims=True) < 2)
            enough = np.sum(clean, axis=1, keepdims=True) > min_num_frames
            masks = np.where(enough, clean, masks).astype(np.float32)
        # (chunks, frames, speakers) -> (chunks, speakers, frames)
        masks = np.ascontiguousarray(masks.transpose(0, 2, 1))
        window = binary_segmentations.sliding_window
        batches = []
        total = math.ceil(num_chunks / self.batch_size)
        if hook is not None:
            hook("embeddings", None, total=total, completed=0)
        for index, start in enumerate(range(0, num_chunks, self.batch_size), 1):
            stop = min(start + self.batch_size, num_chunks)
            waveforms = torch.vstack(
                [
                    pipeline._audio.crop(file, window[chunk], mode="pad")[0][None]
                    for chunk in range(start, stop)
                ]
            )
            with torch.inference_mode():
                embedded = embed_chunks(
                    embedding.model_,
                    waveforms.to(embedding.device),
                    torch.from_numpy(masks[start:stop]).to(embedding.device),
                )
            batch = embedded.cpu().numpy()
            batches.append(batch)
            if hook is not None:
                hook("embeddings", batch.reshape(-1, batch.shape[-1]), total=total, completed=index)
        return np.concatenate(batches)


def embed_once_per_chunk(pipeline: Any, batch_size: int = CHUNK_BATCH) -> ChunkEmbeddings:
    """Makes `pipeline` (a pyannote `SpeakerDiarization`) compute its embeddings on the
    once-per-chunk path, `batch_size` chunks per trunk call; `.undo()` restores it."""
    return ChunkEmbeddings(pipeline, batch_size)


class PipelineAcceleration:
    """A `SpeakerDiarization` pipeline on pyspk: both models on plans, `get_embeddings`
    on the once-per-chunk path, and `apply` on the `pyspk.pyannote.engine.Engine` (`engine`);
    `undo()` (or leaving a `with` block) restores all of them."""

    def __init__(
        self,
        pipeline: Any,
        math: CudaMath | str,
        batch_size: int,
        segmentation_batch: int | None,
        graphs: bool,
        overlap: bool,
        segmentation_plans: bool | None,
        lstm: bool | None = None,
        turns: DeviceTurns | None = None,
        embedding_in_background: bool = False,
    ) -> None:
        self.pipeline = pipeline
        self.math = CudaMath.parse(math)
        if segmentation_plans is None:
            segmentation_plans = self.math is CudaMath.TF32 or bool(lstm)
        self.segmentation: Acceleration | None = None
        self._steps: list[Callable[[], None]] = []
        try:
            if segmentation_plans:
                self.segmentation = accelerate(pipeline._segmentation.model, self.math, lstm=lstm)
                self._steps.append(self.segmentation.undo)
            if segmentation_batch is None:  # larger where pyspk's LSTM serves it
                planned_lstm = self.segmentation is not None and "lstm" in self.segmentation.modules
                segmentation_batch = TF32_SEGMENTATION_BATCH if planned_lstm else SEGMENTATION_BATCH
            if not segmentation_plans:  # the library's segmentation, its first stage planned
                inference = pipeline._segmentation
                self.segmentation = _library_bits_sinc_front(
                    inference.model,
                    self.math,
                    segmentation_sizes(segmentation_batch),
                    inference.model.audio.get_num_samples(inference.duration),
                )
                self._steps.append(self.segmentation.undo)
            # the embedding's steps: undone after the engine closes, whichever thread
            # made them (`embedding_in_background`: the engine's)
            self.embedding: Acceleration | None = None
            self.embeddings: ChunkEmbeddings | None = None
            self._embedding_steps: list[Callable[[], None]] = []
            self._steps.append(lambda: run_all(list(reversed(self._embedding_steps))))
            setup = functools.partial(self._accelerate_embedding, pipeline, batch_size)
            if not embedding_in_background:
                setup()
            self.engine = Engine(
                pipeline,
                self.math,
                batches=(segmentation_batch, batch_size),
                graphs=graphs,
                overlap=overlap,
                turns=turns,
                embedding_setup=setup if embedding_in_background else None,
            )
            self._steps.append(self.engine.close)
            before = pipeline.__dict__.get("apply")  # an instance apply of the caller's
            pipeline.apply = self.engine.apply
            self._steps.append(lambda: _restore_attribute(pipeline, "apply", before))
        except BaseException:
            self.undo()
            raise

    def _accelerate_embedding(self, pipeline: Any, batch_size: int) -> None:
        self.embedding = accelerate(
            pipeline._embedding.model_,
            self.math,
            trunk_streams=PIPELINE_TRUNK_STREAMS[self.math],
        )
        self._embedding_steps.append(self.embedding.undo)
        self.embeddings = embed_once_per_chunk(pipeline, batch_size)
        self._embedding_steps.append(self.embeddings.undo)

    def settle(self) -> BaseException | None:
        """Waits for the embedding side's setup where it runs in the background (see
        `accelerate_pipeline`); returns its error (None if none) without raising it."""
        return self.engine.settle()

    def undo(self) -> None:
        """Restores the pipeline (idempotent): its apply, the graphs freed before the
        plans they hold, the embeddings, the models. Every step runs; the first error is
        raised after the last."""
        steps, self._steps = self._steps, []
        run_all(list(reversed(steps)))

    def __enter__(self) -> PipelineAcceleration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def accelerate_pipeline(
    pipeline: Any,
    math: CudaMath | str = CudaMath.FP32,
    batch_size: int = CHUNK_BATCH,
    segmentation_batch: int | None = None,
    graphs: bool = True,
    overlap: bool = True,
    segmentation_plans: bool | None = None,
    lstm: bool | None = None,
    turns: DeviceTurns | None = None,
    embedding_in_background: bool = False,
) -> PipelineAcceleration:
    """Puts `pipeline` (a pyannote `SpeakerDiarization` already on its CUDA device) on
    pyspk: its `apply` on the diarization engine (`pyspk.pyannote.engine`: `segmentation_batch`
    chunks per segmentation forward, by default 512 where the LSTM runs on pyspk's plan
    (TF32 math) and 128 on cuDNN's; forwards replayed from CUDA graphs unless
    `graphs=False`, segmentation and embedding on two streams unless `overlap=False`),
    the embedding model on plans, `embed_once_per_chunk` on `get_embeddings`
    (`batch_size` chunks per trunk call), and the segmentation model on plans where
    `segmentation_plans` (by default in TF32 math only).

    In FP32 math the segmentation stays on the library by default (all but SincNet's
    first stage, planned where a probe at acceleration gives the library's bits, as on
    the H200): its plans save little
    of a diarization run's time (docs/performance.md), but give other FP32 roundings
    than cuDNN's, and a frame whose two likeliest classes lie within such a rounding of
    each other can then change class, and with it the annotation. On the library the
    engine gives the stock segmentation's bits, and the stock annotation. `lstm=True`
    asks for the segmentation on plans with its LSTM on pyspk's kernel in FP32 math too
    (`accelerate`'s `lstm`): more exact than cuDNN FP32 against float64 and faster, but
    not the stock annotation (its DER against stock: `benchmarks/h200-diarization-lstm.md`).

    `turns` (a `DeviceTurns`, one per GPU) queues this pipeline's files on the device in
    turn with the other pipelines given the same: for engines on threads of one process,
    as corpus mode's (`diarize_corpus(..., turns=True)`).

    `embedding_in_background=True` returns once the segmentation side is ready and
    makes the embedding side (the embedding model's plans and the engine's embedding
    forwards) on a thread of their own, while the first file's segmentation already
    runs: its embeddings wait for it (that file's `gpu` seconds include the wait), and
    `embedding` and `embeddings` are None until it ends. A failure there is raised by
    every `apply` as `BackgroundSetupError`; `settle()` waits for the thread and returns
    its error. `diarize_corpus` does so for each engine (Dask workers make theirs in
    front)."""
    return PipelineAcceleration(
        pipeline,
        math,
        batch_size,
        segmentation_batch,
        graphs,
        overlap,
        segmentation_plans,
        lstm,
        turns,
        embedding_in_background,
    )
