"""Plan time of the device rule's pick for every tuple on this GPU, with the weight packed
on the device (the gather kernel, where `gather_map` has the layout) against the same
plan packed on the host (the weight read back, packed in numpy, uploaded), in one
process; and whether the two plans give the same output bits.

    PYTHONPATH=. python3 tools/plan_time.py [--repeats 7] [--out benchmarks]

Each path is warmed up once per tuple (the module load, the runtime's copy of the
gather map), then timed `--repeats` times around `Area.plan` (perf_counter, the runtime
synchronized before each); medians. Writes <device>-plan-time.md and .json to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    args = parser.parse_args()

    import numpy as np

    from pyspk.candidate.segdense import BATCHES, Area, Site, producer
    from pyspk.cuda import CudaMath, CudaRuntime
    from pyspk.testing import operands, run_eager
    from pyspk.testing.benchmark import device_slug

    device_pack, on_host = producer.gather_map, producer.packs_on_host
    rows = []
    with CudaRuntime() as runtime:
        for site in Site:
            for batch in BATCHES:
                for math in CudaMath:
                    ops = operands(site, batch, seed=0)
                    weight = runtime.upload(ops["w"])
                    bias = runtime.upload(ops["bias"]) if "bias" in ops else None

                    def plan(weight=weight, bias=bias, site=site, batch=batch, math=math):
                        return Area.plan(runtime, site, batch, math, weight, bias)

                    row = {"boundary": site.value, "batch": batch, "math": str(math)}
                    bits = {}
                    for path in ("device", "host"):
                        if path == "host":
                            producer.packs_on_host = lambda _: True
                        try:
                            warm = plan()
                            bits[path] = run_eager(runtime, warm, ops["x"]).view(np.uint32)
                            row["entry"] = warm.producer.pin.entry().name
                            warm.close()
                            seconds = []
                            for _ in range(args.repeats):
                                runtime.synchronize()
                                started = time.perf_counter()
                                planned = plan()
                                seconds.append(time.perf_counter() - started)
                                planned.close()
                        finally:
                            producer.packs_on_host = on_host
                        row[f"{path}_ms"] = round(1e3 * statistics.median(seconds), 3)
                    kind = warm.producer.pin.config().kind
                    _, n, k, _ = site.dimensions()
                    row["packed_on_device"] = device_pack(kind, n, k) is not None
                    row["same_bits"] = bool(np.array_equal(bits["device"], bits["host"]))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    weight.free()
                    if bias is not None:
                        bias.free()
        name = runtime.device.name
    report = {"device": name, "repeats": args.repeats, "rows": rows}
    stem = args.out / f"{device_slug(name)}-plan-time"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Plan time: {name}",
        "",
        f"Medians of {args.repeats} `Area.plan` calls per path (`tools/plan_time.py`): the "
        "weight packed on the device by the gather kernel where it has the layout, against "
        "the host pack (read back, packed in numpy, uploaded); both plans' output bits "
        "compared.",
        "",
        "| boundary | batch | math | entry | device pack | plan ms (device) | plan ms (host) "
        "| same bits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['boundary']} | {row['batch']} | {row['math']} | {row['entry']} | "
            f"{'yes' if row['packed_on_device'] else 'no'} | {row['device_ms']:.3f} | "
            f"{row['host_ms']:.3f} | {'yes' if row['same_bits'] else 'NO'} |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"report {stem.with_suffix('.md')}")
    return 0 if all(row["same_bits"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
