"""Where an engine's setup goes: corpus mode's first engine (a copy of the pipeline,
`accelerate_pipeline` with device turns) timed in rounds on a warm process, one round
under cProfile (the last, by default, so that its after-effects fall on no timed round),
and the first file after it.

    PYTHONPATH=. python3 tools/setup_profile.py [--shape agglomerative] [--math fp32]
        [--rounds 4] [--profile-round N] [--top 25]

The agglomerative shape by default (community-1's differs in its clustering only, which
setup does not touch). Before the rounds, the stock pipeline diarizes 30 s and one
acceleration is made and undone, so that CUDA, cuDNN and the kernels' modules are loaded
as they are when corpus mode's clock starts after the process's first pipeline. Prints
each round's seconds (the copy, the acceleration, the first 60 s file), then the
profiled round's top functions by cumulative and by own time. Each round also says the
garbage collector's pauses in the copy and in the acceleration (any thread), and how
many were full collections.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import os
import pstats
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape", choices=["agglomerative", "community-1"], default="agglomerative"
    )
    parser.add_argument("--math", default="fp32")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--profile-round", type=int, default=-1, help="the round under cProfile (-1: the last)"
    )
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()

    import torch

    from pyspk.pyannote import accelerate_pipeline
    from pyspk.pyannote._turns import DeviceTurns
    from pyspk.testing.memory import CollectorPauses
    from pyspk.testing.synthetic import recording
    from tools.diarize_bench import _pipelines

    device = torch.device("cuda")
    folder = Path(tempfile.mkdtemp(prefix="pyspk-setup-"))
    bench_args = argparse.Namespace(shapes=[args.shape], fit_seed=11, plda_seed=12)
    pipeline = _pipelines(bench_args, folder, device)[args.shape]
    warm, first = recording(30, seed=3).as_file("warm"), recording(60, seed=4).as_file("first")
    pipeline(warm)
    accelerate_pipeline(copy.deepcopy(pipeline), args.math, turns=DeviceTurns()).undo()
    torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}, {args.shape}, {args.math}", flush=True)
    profiled = args.profile_round % args.rounds
    for index in range(args.rounds):
        profile = cProfile.Profile() if index == profiled else None
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        with CollectorPauses() as copy_pauses:
            own = copy.deepcopy(pipeline)
        copied = time.perf_counter()
        with CollectorPauses() as setup_pauses:
            acceleration = accelerate_pipeline(own, args.math, turns=DeviceTurns())
        ready = time.perf_counter()
        if profile is not None:
            profile.disable()
        own(first)
        torch.cuda.synchronize()
        done = time.perf_counter()
        acceleration.undo()
        print(
            f"round {index}: copy {copied - started:.3f} s, accelerate_pipeline "
            f"{ready - copied:.3f} s, first 60 s file {done - ready:.3f} s; collector "
            f"{copy_pauses.seconds:.3f} s ({copy_pauses.full} full) in the copy, "
            f"{setup_pauses.seconds:.3f} s ({setup_pauses.full} full) in the acceleration"
            + (" (profiled)" if profile is not None else ""),
            flush=True,
        )
        if profile is not None:
            for order in ("cumulative", "tottime"):
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats(order).print_stats(args.top)
                print(f"## round {index} by {order}", text.getvalue(), sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
