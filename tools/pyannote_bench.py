"""End-to-end benchmark: pyspk inside pyannote.audio's models (random weights, built
offline), stock against accelerated, in one process on one GPU.

    PYTHONPATH=. python3 tools/pyannote_bench.py [--out benchmarks] [--rounds 20]
        [--audio-seconds 300] [--math fp32 tf32]

Each section runs in each math; torch's TF32 switches follow it (`pyspk.testing.library_math`).
- layers: each pyspk boundary inside the models, on the activations a forward really
  feeds it (captured with forward hooks at batch 32 and 1; seg_1 with the three speaker
  masks of each chunk): the stock module and the activation the model applies after it
  against its `pyspk.torch` wrapper. `eager`: CUDA events around 20 back-to-back calls,
  the host's cost included as an eager model pays it; `graph`: a CUDA graph of 20 calls,
  the GPU's time alone; per call, medians over interleaved rounds. The convolutions'
  max-abs is taken against the stock output less its bias (the bias the InstanceNorm after
  them cancels; the accelerated model drops it).
- forward: the segmentation forward at batch 32 and 1, and the embedding forward (the
  trunk once per chunk, three masks) at 32 and 1, stock model against an accelerated twin:
  eager per-call milliseconds, medians over interleaved rounds.
- pipeline: the embedding stage of a diarization run on synthetic audio (the pipeline's
  own segmentation of it, binarized as `apply` does): stock `get_embeddings` (one trunk
  run per (chunk, speaker) pair, 32 pairs a batch) against the once-per-chunk path, on
  the stock and on the accelerated embedding model; synchronized wall seconds, median
  of the runs; max-abs of the embeddings against the stock ones.

Writes <device>-pyannote.md and .json into --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")

ROOT = Path(__file__).resolve().parents[1]
CALLS = 20
CHUNK_SAMPLES = 160_000
FRAMES = 589


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timed rounds")
    parser.add_argument("--pipeline-runs", type=int, default=3)
    parser.add_argument("--audio-seconds", type=int, default=300)
    parser.add_argument("--math", nargs="+", default=["fp32", "tf32"])
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _max_abs(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.nanmax(np.abs(a - b)))


class Timer:
    """Interleaved rounds of CUDA-event timing on the current stream."""

    def __init__(self, torch: Any, rounds: int) -> None:
        self.torch = torch
        self.rounds = rounds

    def per_call(self, arms: Sequence[Callable[[], Any]], calls: int) -> list[float]:
        """Median microseconds per call of each arm, `calls` calls between two events."""
        torch = self.torch
        samples: list[list[float]] = [[] for _ in arms]
        for round_ in range(self.rounds + 2):  # two warm-up rounds
            for index, arm in enumerate(arms):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    arm()
                end.record()
                end.synchronize()
                if round_ >= 2:
                    samples[index].append(start.elapsed_time(end) * 1000 / calls)
        return [statistics.median(s) for s in samples]

    def graphs(self, arms: Sequence[Callable[[], Any]]) -> list[float]:
        """Median microseconds per call of each arm replayed as a CUDA graph of CALLS."""
        from pyspk.testing import torch_graph

        graphs = [
            torch_graph(self.torch, lambda arm=arm: [arm() for _ in range(CALLS)])[0]
            for arm in arms
        ]
        times = self.per_call([graph.replay for graph in graphs], 1)
        return [t / CALLS for t in times]


def _capture_inputs(torch: Any, model: Any, names: Sequence[str], run: Callable[[], Any]) -> dict:
    """The input each named submodule receives during `run()`."""
    captured: dict[str, Any] = {}
    handles = []
    for name in names:
        module = model.get_submodule(name)

        def hook(_module: Any, args: tuple, name: str = name) -> None:
            captured[name] = args[0].detach().clone()

        handles.append(module.register_forward_pre_hook(hook))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return captured


def layers(torch: Any, pa: Any, ptorch: Any, timer: Timer, models: dict, math: Any) -> list:
    from pyspk.candidate import DenseSite, SegConvSite

    functional = torch.nn.functional
    segmentation, embedding = models["segmentation"], models["embedding"]
    rows = []
    generator = torch.Generator(device="cuda").manual_seed(1)
    for batch in (32, 1):
        waveforms = torch.randn((batch, 1, CHUNK_SAMPLES), generator=generator, device="cuda")
        masks = (torch.rand((batch, 3, FRAMES), generator=generator, device="cuda") > 0.5).float()
        seg_names = ["sincnet.conv1d.1", "sincnet.conv1d.2", "linear.0", "linear.1", "classifier"]
        inputs = _capture_inputs(
            torch, segmentation, seg_names, lambda w=waveforms: segmentation(w)
        )
        inputs |= _capture_inputs(
            torch,
            embedding,
            ["resnet.seg_1"],
            lambda w=waveforms, k=masks: pa.embed_chunks(embedding, w, k),
        )
        cases = [
            ("sincnet.conv1", "sincnet.conv1d.1", segmentation, SegConvSite.CONV1, None),
            ("sincnet.conv2", "sincnet.conv1d.2", segmentation, SegConvSite.CONV2, None),
            ("linear0", "linear.0", segmentation, DenseSite.LINEAR0, functional.leaky_relu),
            ("linear1", "linear.1", segmentation, DenseSite.LINEAR1, functional.leaky_relu),
            ("linear2", "classifier", segmentation, DenseSite.CLASSIFIER, segmentation.activation),
            ("resnet.seg_1", "resnet.seg_1", embedding, DenseSite.EMBEDDING, None),
        ]
        for boundary, path, model, site, after in cases:
            module, x = model.get_submodule(path), inputs[path]
            if isinstance(site, SegConvSite):
                planned = ptorch.PlannedConv1d(module, site, math, bias="drop")

                def stock(module: Any = module, x: Any = x) -> Any:
                    return module(x)

                reference = functional.conv1d(x, module.weight)
            else:
                planned = ptorch.PlannedDense(module, site, math)

                def stock(module: Any = module, x: Any = x, after: Any = after) -> Any:
                    y = module(x)
                    return y if after is None else after(y)

                reference = stock()
            ours = planned(x)
            eager = timer.per_call([stock, lambda planned=planned, x=x: planned(x)], CALLS)
            graph = timer.graphs([stock, lambda planned=planned, x=x: planned(x)])
            rows.append(
                {
                    "boundary": boundary,
                    "module": path,
                    "batch": batch,
                    "input_shape": list(x.shape),
                    "entry": planned.entries()[batch],
                    "stock_eager_us": eager[0],
                    "pyspk_eager_us": eager[1],
                    "eager_speedup": eager[0] / eager[1],
                    "stock_graph_us": graph[0],
                    "pyspk_graph_us": graph[1],
                    "graph_speedup": graph[0] / graph[1],
                    "max_abs": _max_abs(ours.cpu(), reference.cpu()),
                }
            )
            planned.close()
            print(f"  layer {boundary:14} b{batch:<3} {_layer_line(rows[-1])}", flush=True)
    return rows


def _layer_line(row: dict) -> str:
    return (
        f"eager {row['stock_eager_us']:8.2f} -> {row['pyspk_eager_us']:7.2f} us "
        f"({row['eager_speedup']:.2f}x)  graph {row['stock_graph_us']:8.2f} -> "
        f"{row['pyspk_graph_us']:7.2f} us ({row['graph_speedup']:.2f}x)  "
        f"max-abs {row['max_abs']:.2e}"
    )


def forwards(torch: Any, pa: Any, timer: Timer, models: dict, builders: dict, math: Any) -> list:
    rows = []
    generator = torch.Generator(device="cuda").manual_seed(2)
    for name, stock_model in models.items():
        # a second model from the same seed, not a deep copy: a copied LSTM's weights
        # are no longer one flat buffer, and cuDNN would re-pack them on every call
        with torch.inference_mode(False):  # parameters that keep their version counters
            accelerated = builders[name]()
        for (key, ours), theirs in zip(
            accelerated.state_dict().items(), stock_model.state_dict().values(), strict=True
        ):
            if not torch.equal(ours, theirs):
                raise RuntimeError(f"the two {name} models differ in {key}")
        acceleration = pa.accelerate(accelerated, math)
        for batch in (32, 1):
            waveforms = torch.randn((batch, 1, CHUNK_SAMPLES), generator=generator, device="cuda")
            masks = torch.rand((batch, 3, FRAMES), generator=generator, device="cuda") > 0.5
            masks = masks.float()
            if name == "segmentation":
                arms = [
                    lambda m=stock_model, w=waveforms: m(w),
                    lambda m=accelerated, w=waveforms: m(w),
                ]
            else:
                arms = [
                    lambda m=stock_model, w=waveforms, k=masks: pa.embed_chunks(m, w, k),
                    lambda m=accelerated, w=waveforms, k=masks: pa.embed_chunks(m, w, k),
                ]
            difference = _max_abs(arms[0]().cpu(), arms[1]().cpu())
            calls = 2 if batch == 32 else 10
            times = timer.per_call(arms, calls)
            rows.append(
                {
                    "model": name,
                    "batch": batch,
                    "stock_ms": times[0] / 1000,
                    "pyspk_ms": times[1] / 1000,
                    "speedup": times[0] / times[1],
                    "max_abs": difference,
                }
            )
            row = rows[-1]
            print(
                f"  forward {name:12} b{batch:<3} {row['stock_ms']:8.3f} -> "
                f"{row['pyspk_ms']:8.3f} ms ({row['speedup']:.3f}x) max-abs {difference:.2e}",
                flush=True,
            )
        acceleration.undo()
    return rows


def pipeline_stage(torch: Any, pa: Any, args: argparse.Namespace, math: Any) -> list:
    """The embedding stage of a diarization run: stock, once per chunk, and once per
    chunk on the accelerated model."""
    import numpy as np

    pipeline = pa.offline_pipeline(
        pa.segmentation_3_0(seed=args.seed), pa.wespeaker_resnet34(seed=args.seed + 1)
    )
    pipeline.to(torch.device("cuda"))
    generator = torch.Generator().manual_seed(args.seed)
    audio = {
        "waveform": 0.1 * torch.randn((1, 16000 * args.audio_seconds), generator=generator),
        "sample_rate": 16000,
    }
    segmentations = pipeline.get_segmentations(audio)
    if not pipeline._segmentation.model.specifications.powerset:
        raise RuntimeError("the offline segmentation model is expected in powerset mode")
    binarized = segmentations  # powerset outputs are binary already (as in `apply`)
    exclude = pipeline.embedding_exclude_overlap

    def run() -> Any:
        torch.cuda.synchronize()
        started = time.perf_counter()
        result = pipeline.get_embeddings(audio, binarized, exclude_overlap=exclude)
        torch.cuda.synchronize()
        return result, time.perf_counter() - started

    def timed(label: str) -> tuple[Any, float]:
        results = [run() for _ in range(args.pipeline_runs + 1)][1:]  # one warm-up
        seconds = statistics.median(t for _, t in results)
        print(f"  pipeline {label:36} {seconds:8.3f} s", flush=True)
        return results[-1][0], seconds

    stock, stock_s = timed("stock (per pair)")
    chunked = pa.embed_once_per_chunk(pipeline)
    once, once_s = timed("once per chunk, stock seg_1")
    acceleration = pa.accelerate(pipeline._embedding.model_, math)
    accelerated, accelerated_s = timed("once per chunk, accelerated")
    acceleration.undo()
    chunked.undo()
    num_chunks, _, speakers = binarized.data.shape
    return [
        {
            "path": label,
            "audio_seconds": args.audio_seconds,
            "chunks": num_chunks,
            "pairs": num_chunks * speakers,
            "seconds": seconds,
            "speedup": stock_s / seconds,
            "max_abs": _max_abs(result, stock),
            "embedding_scale": float(np.nanmax(np.abs(stock))),
        }
        for label, result, seconds in (
            ("stock", stock, stock_s),
            ("once per chunk", once, once_s),
            ("once per chunk, accelerated", accelerated, accelerated_s),
        )
    ]


def render(meta: dict, sections: dict) -> str:
    lines = [
        f"# pyspk inside pyannote.audio: {meta['device']}",
        "",
        f"- {meta['versions']}",
        f"- models: random-weight segmentation-3.0 PyanNet and WeSpeaker ResNet34 (pyannote.audio "
        f"{meta['pyannote']}), built offline; seed {meta['seed']}",
        f"- method: see tools/pyannote_bench.py; {meta['rounds']} interleaved rounds; "
        f"layers: {CALLS} calls per timed region (eager) or per CUDA graph",
        f"- run: {meta['date']}, {meta['seconds']:.0f} s",
    ]
    for math, section in sections.items():
        lines += [
            "",
            f"## {math} math",
            "",
            "### Boundaries inside the models (per call)",
            "",
            "| boundary | batch | input | entry | stock eager us | pyspk eager us | eager "
            "speedup | stock graph us | pyspk graph us | graph speedup | max-abs |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in section["layers"]:
            lines.append(
                f"| {row['boundary']} | {row['batch']} | {tuple(row['input_shape'])} | "
                f"{row['entry']} | {row['stock_eager_us']:.2f} | {row['pyspk_eager_us']:.2f} | "
                f"{row['eager_speedup']:.2f}x | {row['stock_graph_us']:.2f} | "
                f"{row['pyspk_graph_us']:.2f} | {row['graph_speedup']:.2f}x | "
                f"{row['max_abs']:.2e} |"
            )
        lines += [
            "",
            "### Model forwards (per call)",
            "",
            "| model | batch | stock ms | accelerated ms | speedup | max-abs |",
            "|---|---|---|---|---|---|",
        ]
        for row in section["forward"]:
            lines.append(
                f"| {row['model']} | {row['batch']} | {row['stock_ms']:.3f} | "
                f"{row['pyspk_ms']:.3f} | {row['speedup']:.3f}x | {row['max_abs']:.2e} |"
            )
        pipeline = section["pipeline"]
        if pipeline:
            first = pipeline[0]
            lines += [
                "",
                f"### Embedding stage of a diarization run ({first['audio_seconds']} s of "
                f"audio, {first['chunks']} chunks, {first['pairs']} (chunk, speaker) pairs)",
                "",
                "| path | seconds | speedup | max-abs vs stock | stock embedding max |",
                "|---|---|---|---|---|",
            ]
            for row in pipeline:
                lines.append(
                    f"| {row['path']} | {row['seconds']:.3f} | {row['speedup']:.2f}x | "
                    f"{row['max_abs']:.2e} | {row['embedding_scale']:.2e} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pyannote.audio

        import pyspk.pyannote as pa
        import pyspk.torch as ptorch
    from pyspk.cuda import CudaMath
    from pyspk.testing import library_math
    from pyspk.testing.benchmark import device_slug

    warnings.simplefilter("ignore")  # pyannote's and torchcodec's notices
    timer = Timer(torch, args.rounds)
    builders = {
        "segmentation": lambda: pa.segmentation_3_0(seed=args.seed).cuda(),
        "embedding": lambda: pa.wespeaker_resnet34(seed=args.seed + 1).cuda(),
    }
    models = {name: build() for name, build in builders.items()}
    sections = {}
    with torch.inference_mode():
        for name in args.math:
            math = CudaMath.parse(name)
            print(f"{math} math", flush=True)
            with library_math(torch, math):
                sections[str(math)] = {
                    "layers": layers(torch, pa, ptorch, timer, models, math),
                    "forward": forwards(torch, pa, timer, models, builders, math),
                    "pipeline": pipeline_stage(torch, pa, args, math),
                }
    device = torch.cuda.get_device_name()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "versions": (
            f"torch {torch.__version__} (cuDNN {torch.backends.cudnn.version()}); "
            f"Python {platform.python_version()}"
        ),
        "pyannote": pyannote.audio.__version__,
        "seed": args.seed,
        "rounds": args.rounds,
        "seconds": time.perf_counter() - started,
        "argv": list(argv) if argv is not None else None,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{device_slug(device)}-pyannote"
    (args.out / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "sections": sections}, indent=2) + "\n"
    )
    (args.out / f"{stem}.md").write_text(render(meta, sections))
    print(f"report {args.out / stem}.md", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
