#!/usr/bin/env python3
"""`PlannedTrunk`'s concurrency: the trunk's time per chunk on 1 to 4 plans and streams,
a call's chunks in pieces of each size, in both maths, in one process on one GPU.

Method as `tools/trunk_bench.py`'s: every arm a CUDA graph of calls covering 128 chunks
(4 calls of 32, or 2 of 64 where an arm takes pieces of 32 on two or more plans), after
an eager warm-up; interleaved rounds, CUDA events, the median per chunk. Each arm's
output is compared bit for bit with the one-plan arm's (a chunk's output does not depend
on which plan or piece ran it).

    PYTHONPATH=. python3 tools/trunk_streams.py [--rounds 9] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings
from pathlib import Path

# (plans and streams, chunks a piece, chunks a call)
ARMS = ((1, 32, 32), (2, 16, 32), (3, 11, 32), (4, 8, 32), (2, 32, 64), (3, 22, 64))
CHUNKS = 128


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None, help="write the table here")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
    warnings.simplefilter("ignore")
    import torch

    import pyspk.pyannote as pa
    from pyspk.cuda import CudaMath
    from pyspk.testing import graph_replay_ms, torch_graph
    from pyspk.torch import library_math
    from pyspk.torch.resnet import PlannedTrunk

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from trunk_bench import randomize_norms

    torch.manual_seed(0)
    resnet = pa.wespeaker_resnet34(seed=1).cuda().resnet
    randomize_norms(torch, resnet, seed=2)
    fbank = torch.randn(CHUNKS, 998, 80, device="cuda") * 2.0
    graphs, outputs, arms, plans = {}, {}, {}, []
    with torch.inference_mode():
        for math in CudaMath:
            for streams, piece, call in ARMS:
                name = f"{math} plans {streams} piece {piece} call {call}"
                arms[name] = (math, streams, piece, call)
                trunk = PlannedTrunk(resnet, math, streams=streams, piece=piece)
                plans.append(trunk)
                calls = [fbank[start : start + call] for start in range(0, CHUNKS, call)]
                with library_math(math):
                    eager = torch.cat([trunk(part) for part in calls])
                    graph, _ = torch_graph(torch, lambda t=trunk, c=calls: [t(p) for p in c])
                torch.cuda.synchronize()
                graphs[name], outputs[name] = graph, eager
        for _ in range(2):
            for graph in graphs.values():
                graph.replay()
        times = graph_replay_ms(torch, graphs, args.rounds)
    lines = [
        f"# PlannedTrunk's plans and pieces on {torch.cuda.get_device_name()}, "
        f"{args.rounds} interleaved rounds, graphs of {CHUNKS} chunks; us per chunk (median)",
        "",
        "| math | plans | piece | call | us per chunk | min | max | bits as one plan |",
        "|---|---|---|---|---|---|---|---|",
    ]
    one_plan = {math: name for name, (math, *shape) in arms.items() if shape == [1, 32, 32]}
    for name, measured in times.items():
        math, streams, piece, call = arms[name]
        per_chunk = [ms * 1e3 / CHUNKS for ms in measured]
        same = torch.equal(outputs[name], outputs[one_plan[math]])
        lines.append(
            f"| {math} | {streams} | {piece} | {call} | {statistics.median(per_chunk):.1f} "
            f"| {min(per_chunk):.1f} | {max(per_chunk):.1f} | {same} |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    for trunk in plans:
        trunk.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
