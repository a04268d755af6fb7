"""What one long file needs end to end on the accelerated pipeline: time, device and host
memory, embeddings clustered and speakers found.

    PYTHONPATH=. python3 tools/long_file.py [--hours 10] [--shape community-1]
        [--math fp32] [--out benchmarks]

The pipelines are the diarization benchmark's (`tools/diarize_bench.py`: random-weight
models, the PyanNet calibrated on one recording, community-1's PLDA on 16 other voices);
the file is one synthetic conversation of --hours among 4 voices heard by neither
calibration. Only the accelerated pipeline runs (the stock one takes about 25 s per
hour). Device memory is the driver's used memory at its peak over the run (sampled
every 50 ms) minus what was used before; host memory, the process's resident set before
the run and at its peak during it (sampled alike), and the process's peak over its life,
which the making of the synthetic recording sets (9.0 GB for 10 h on a development
machine, the waveform 2.3 GB of it). Writes <device>-long-file.json and .md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--hours", type=float, default=10.0)
    parser.add_argument("--shape", choices=["agglomerative", "community-1"], default="community-1")
    parser.add_argument("--math", default="fp32")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    warnings.simplefilter("ignore")
    import pyspk.pyannote as pa
    from pyspk.testing.benchmark import device_slug
    from pyspk.testing.memory import SAMPLING_PERIOD_S, PeakMemory, resident_bytes
    from pyspk.testing.synthetic import recording
    from tools.diarize_bench import _pipelines

    device = torch.device("cuda")
    bench_args = argparse.Namespace(shapes=[args.shape], fit_seed=11, plda_seed=12)
    with tempfile.TemporaryDirectory() as folder:
        pipeline = _pipelines(bench_args, Path(folder), device)[args.shape]
    seconds = args.hours * 3600
    made = time.perf_counter()
    rec = recording(seconds, seed=args.seed)
    print(f"recording of {args.hours:g} h made in {time.perf_counter() - made:.1f} s", flush=True)
    file = rec.as_file("long")
    warm = recording(60, seed=args.seed + 100).as_file("warm-up")
    with pa.accelerate_pipeline(pipeline, args.math) as acceleration:
        pipeline(warm)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        used_before = total - free
        host_before = resident_bytes()
        with PeakMemory(lambda: total - torch.cuda.mem_get_info()[0]) as peak:
            started = time.perf_counter()
            output = pipeline(file)
            elapsed = time.perf_counter() - started
        run = acceleration.engine.last_run
    assert run is not None
    parts = dict(run.clustering)
    result = {
        "device": torch.cuda.get_device_name(),
        "shape": args.shape,
        "math": args.math,
        "audio_seconds": seconds,
        "chunks": run.chunks,
        "seconds": elapsed,
        "rtfx": seconds / elapsed,
        "steps": dict(run.steps),
        "clustering_steps": {k: v for k, v in parts.items() if k != "embeddings_clustered"},
        "embeddings_clustered": int(parts.get("embeddings_clustered", 0)),
        "speakers": len(output.speaker_diarization.labels()),
        "speakers_in_recording": len({turn.speaker for turn in rec.turns}),
        "device_bytes_during_run": int(peak.device_bytes - used_before),
        "device_bytes_before_run": int(used_before),
        # the run's own: sampled while it ran, from the resident set before it
        "host_bytes_before_run": host_before,
        "host_peak_bytes_during_run": peak.host_bytes,
        # the process's whole life, the synthetic recording's making included
        "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "waveform_bytes": int(rec.waveform.nbytes),
    }
    print(json.dumps(result, indent=1), flush=True)
    slug = device_slug(result["device"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{slug}-long-file.json").write_text(json.dumps(result, indent=1) + "\n")
    gb = 1e9
    lines = [
        f"# One long file on the accelerated pipeline ({result['device']})",
        "",
        f"`tools/long_file.py --hours {args.hours:g} --shape {args.shape} --math {args.math}`: "
        f"one synthetic conversation of {args.hours:g} h among "
        f"{result['speakers_in_recording']} voices.",
        "",
        f"- {elapsed:.1f} s, {result['rtfx']:.0f}x real time; {run.chunks} chunks; "
        f"{result['embeddings_clustered']} embeddings clustered, {result['speakers']} "
        "speakers found.",
        "- steps (s): " + ", ".join(f"{k} {v:.2f}" for k, v in run.steps.items()),
        "- clustering parts (s): "
        + ", ".join(f"{k} {v:.3f}" for k, v in result["clustering_steps"].items()),
        f"- device memory: {result['device_bytes_during_run'] / gb:.2f} GB more at the run's "
        f"peak than before it ({used_before / gb:.2f} GB used before: models, plans, graphs).",
        f"- host: resident set {host_before / gb:.2f} GB before the run (the waveform "
        f"{rec.waveform.nbytes / gb:.2f} GB of it), {peak.host_bytes / gb:.2f} GB at its "
        f"peak during the run (sampled every {SAMPLING_PERIOD_S * 1000:.0f} ms); the "
        f"process's peak, the recording's making included, "
        f"{result['host_peak_rss_bytes'] / gb:.2f} GB.",
        "",
    ]
    (args.out / f"{slug}-long-file.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
