"""Threaded soak: one thread closes and re-plans a `pyspk.torch` wrapper over and over
while three others call it, each on its own CUDA stream, and every output is checked.

    PYTHONPATH=. python3 tools/thread_soak.py [--cycles 10000] [--hold-ms 0] [--json FILE]

The wrapper is linear1 (Linear(128, 128) and LeakyReLU) at batch 1. A call finds the
wrapper planned (the plan's bits), closed (the library path's bits) or is refused with
`ClosedError` by a plan closed under it; any other output, or any other error, is a
failure. Run it under compute-sanitizer to check that no launch touches freed memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10_000, help="close/replan cycles")
    parser.add_argument(
        "--hold-ms",
        type=float,
        default=0.0,
        help="keep each re-plan open this long before closing it, so calls find it planned",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    import pyspk.torch as ptorch
    from pyspk.candidate import DenseSite
    from pyspk.errors import ClosedError

    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 128).cuda()
    planned = ptorch.PlannedDense(linear, DenseSite.LINEAR1)
    x = torch.randn(589, 128, device="cuda")
    with torch.inference_mode():
        planned_bits = planned(x).clone()
        library_bits = planned.library(x).clone()
    done = threading.Event()
    counts = {"planned": 0, "library": 0, "refused": 0, "wrong": 0, "errors": 0}
    lock = threading.Lock()
    failures: list[str] = []

    def caller() -> None:
        stream = torch.cuda.Stream()
        with torch.inference_mode(), torch.cuda.stream(stream):
            while not done.is_set():
                try:
                    y = planned(x)
                    stream.synchronize()
                    kind = (
                        "planned"
                        if torch.equal(y, planned_bits)
                        else "library"
                        if torch.equal(y, library_bits)
                        else "wrong"
                    )
                except ClosedError:
                    kind = "refused"
                except Exception as error:  # anything else fails the soak
                    kind = "errors"
                    failures.append(f"{type(error).__name__}: {error}")
                with lock:
                    counts[kind] += 1

    threads = [threading.Thread(target=caller) for _ in range(3)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for cycle in range(1, args.cycles + 1):
        planned.close()
        planned.replan()
        time.sleep(args.hold_ms / 1000)
        if cycle % 1000 == 0:  # progress, for runs under a sanitizer
            with lock:
                calls = sum(counts.values())
            elapsed = time.perf_counter() - started
            print(f"cycle {cycle}: {calls} calls, {elapsed:.1f} s", file=sys.stderr, flush=True)
    done.set()
    for thread in threads:
        thread.join()
    torch.cuda.synchronize()
    report = {
        "cycles": args.cycles,
        "hold_ms": args.hold_ms,
        "calls": counts,
        "seconds": round(time.perf_counter() - started, 2),
        "failures": failures[:5],
        "device": torch.cuda.get_device_name(),
    }
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if counts["wrong"] == counts["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
