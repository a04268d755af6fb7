#!/usr/bin/env python3
"""How much of the segmentation LSTM's time the trunk hides when both run at once, as
the engine's two streams run them: the FP32 trunk (`PlannedTrunk`, batch 32) beside
segmentation-3.0's LSTM at the engine's FP32 batch of 128, on cuDNN (the stock bits the
engine keeps) and on pyspk's plans in FP32 math (`accelerate_pipeline(lstm=True)`).

Method: each side is a CUDA graph (TRUNK_FORWARDS trunk forwards; LSTM_FORWARDS LSTM
forwards); rounds replay, in turn, each side alone and both at once on two streams that
start from one event, timed by CUDA events; medians over the rounds. "hidden" is the
part of the shorter side's time that running both at once saved:
(trunk + lstm - together) / min(trunk, lstm).

    PYTHONPATH=. python3 tools/lstm_overlap.py [--rounds 7] [--out FILE.json]
    PYTHONPATH=. python3 tools/lstm_overlap.py --once   # one cuDNN forward, for ncu
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

STEPS = 589
LSTM_BATCH = 128
TRUNK_FORWARDS = 4
LSTM_FORWARDS = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")

    import torch

    import pyspk.pyannote as pa
    from pyspk.candidate.trunk import TRUNK_BATCH
    from pyspk.cuda import CudaMath
    from pyspk.testing import torch_graph
    from pyspk.torch import library_math
    from pyspk.torch.lstm import PlannedLSTM
    from pyspk.torch.resnet import PlannedTrunk

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(60, 128, 4, batch_first=True, bidirectional=True).cuda().eval()
    x = torch.randn(LSTM_BATCH, STEPS, 60, device="cuda")
    if args.once:
        with torch.inference_mode(), library_math(CudaMath.FP32):
            lstm(x)
        torch.cuda.synchronize()
        return 0
    trunk = PlannedTrunk(pa.wespeaker_resnet34(seed=1).cuda().resnet, CudaMath.FP32)
    fbank = torch.randn(TRUNK_BATCH, 998, 80, device="cuda") * 2.0
    sides = {"cudnn": lstm, "pyspk": PlannedLSTM(lstm)}
    with torch.inference_mode(), library_math(CudaMath.FP32):
        trunk_graph, _ = torch_graph(torch, lambda: [trunk(fbank) for _ in range(TRUNK_FORWARDS)])
        graphs = {
            name: torch_graph(torch, lambda m=module: [m(x)[0] for _ in range(LSTM_FORWARDS)])[0]
            for name, module in sides.items()
        }
        results = {
            name: together(torch, trunk_graph, graph, args.rounds) for name, graph in graphs.items()
        }
    device = torch.cuda.get_device_name()
    report = {
        "device": device,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "trunk_forwards": TRUNK_FORWARDS,
        "lstm_forwards": LSTM_FORWARDS,
        "lstm_batch": LSTM_BATCH,
        "rounds": args.rounds,
        "lstm": results,
    }
    print(json.dumps(report, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    trunk.close()
    return 0


def together(torch: Any, trunk_graph: Any, lstm_graph: Any, rounds: int) -> dict[str, float]:
    """Median ms of the trunk's graph alone, the LSTM's alone and both at once, and the
    part of the shorter one's time hidden."""
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    current = torch.cuda.current_stream()
    times: dict[str, list[float]] = {"trunk": [], "lstm": [], "together": []}
    for _ in range(rounds + 1):  # the first round warms up
        for arm in times:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for stream, graph, runs in (
                (first, trunk_graph, arm in ("trunk", "together")),
                (second, lstm_graph, arm in ("lstm", "together")),
            ):
                if runs:
                    stream.wait_event(start)
                    with torch.cuda.stream(stream):
                        graph.replay()
                    current.wait_stream(stream)
            end.record()
            end.synchronize()
            times[arm].append(start.elapsed_time(end))
    ms = {arm: statistics.median(values[1:]) for arm, values in times.items()}
    shorter = min(ms["trunk"], ms["lstm"])
    ms["hidden"] = (ms["trunk"] + ms["lstm"] - ms["together"]) / shorter
    return ms


if __name__ == "__main__":
    sys.exit(main())
