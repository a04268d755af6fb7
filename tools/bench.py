"""Benchmark of record: the segdense entry the device rule picks against the library path
(cuDNN / cuBLAS and the epilogue through PyTorch), side by side in one process on one
stream, for each of the 24 tuples (site x batch 1, 32 x FP32, TF32 math).

Method: each arm is a CUDA graph of 20 enqueues captured after
eager warm-up; warm-up rounds, then interleaved timed rounds (library, pyspk) with CUDA
events around each replay, a spin kernel ahead of each round so the host never starves
the GPU; medians per arm, per-enqueue microseconds, speedup = library / pyspk. Both arms'
eager outputs are compared with float64 (`pyspk.reference`) on the same seeded inputs
(`pyspk.testing.operands`). Host cost: median over chunks of eager enqueues timed
with perf_counter_ns, synchronized outside the timed region (`pyspk.testing.per_launch_us`).

    PYTHONPATH=. python3 tools/bench.py [--rounds 50] [--tuples seg_1:32:fp32 ...]
        [--force EMBED_B32 ...] [--tier sm75] [--compiled] [--out benchmarks]
    PYTHONPATH=. python3 tools/bench.py --dry-run h200    # the plan only; no GPU, no torch

Writes <device>-bench.md, .json and .png into --out, rewritten after every row (marked
incomplete until the last). `--compiled` adds a third arm, the library function through
`torch.compile(mode="max-autotune-no-cudagraphs")` compiled per tuple (minutes of
autotuning in all; `--compile-only` runs, one per part of the tuples and side by side,
fill TorchInductor's caches first), and names the files <device>-bench-compiled.*. The
pure parts (tuple filter, summary, rendering) are `pyspk.testing.benchmark`, importable without
torch or a GPU and covered by tests/test_bench.py; this file keeps the runner.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspk import testing
from pyspk.candidate.segdense.pins import device_json
from pyspk.candidate.segdense.selection import Entry, SegdensePin, Site
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import KernelMissingError
from pyspk.cuda.profiles import profile, profile_key
from pyspk.cuda.tier import PtxTier, loadable_tier
from pyspk.testing.benchmark import (
    ERROR,
    NOT_BUILT,
    Case,
    forced_cases,
    forced_pin,
    format_number,
    format_speedup,
    new_row,
    output_stem,
    parse_entry,
    parse_patterns,
    pick,
    select_cases,
    simt_keys,
    summarize,
    summary_lines,
    write_outputs,
)

ROOT = Path(__file__).resolve().parents[1]

GRAPH_ENQUEUES = 20
ROUNDS = 50
WARMUP_ROUNDS = 5
EAGER_WARMUP = 3
REPLAY_WARMUP = 2
HOST_SAMPLES = 20
# about 0.5 ms at H200 clocks: far longer than the host needs to queue one round
SPIN_CYCLES = 1_000_000
COMPILE_MODE = "max-autotune-no-cudagraphs"

# -- measuring (torch and a GPU from here on) ------------------------------------------


class Bench:
    """One stream shared by PyTorch and a `CudaRuntime` adopting it, the loaded module,
    and the operands and float64 truth of each (site, batch), made once."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from pyspk.cuda.manifest import KernelModule
        from pyspk.cuda.runtime import CudaRuntime

        if not torch.cuda.is_available():
            raise SystemExit("bench: PyTorch sees no CUDA device")
        self.torch = torch
        self.args = args
        self.ordinal = args.device
        torch.manual_seed(args.seed)
        torch.cuda.set_device(self.ordinal)
        torch.backends.cudnn.benchmark = args.cudnn_benchmark
        self.stream = torch.cuda.Stream(device=self.ordinal)
        self.runtime = CudaRuntime(self.ordinal, ptx_tier=args.tier, stream=self.stream)
        self.kernels = self.runtime.load_kernels(KernelModule.SEGDENSE)
        self.sleep = getattr(torch.cuda, "_sleep", None)
        self._operands: dict[tuple[Site, int], Any] = {}
        self._truth: dict[tuple[Site, int], Any] = {}

    @property
    def device(self) -> DeviceAttributes:
        return self.runtime.device

    def operands(self, site: Site, batch: int) -> dict[str, Any]:
        if (site, batch) not in self._operands:
            self._operands.clear()  # rows of one (site, batch) run together
            self._truth.clear()
            self._operands[site, batch] = testing.operands(site, batch, self.args.seed)
        return self._operands[site, batch]

    def truth(self, site: Site, batch: int) -> Any:
        """Float64 output, flat."""
        if (site, batch) not in self._truth:
            self._truth[site, batch] = testing.truth(site, batch, self.operands(site, batch))[0]
        return self._truth[site, batch]

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()
        self.runtime.synchronize()

    # -- one row --------------------------------------------------------------------

    def measure(self, case: Case, row: dict[str, Any], pin: SegdensePin) -> None:
        started = time.perf_counter()
        library = compiled = pyspk = None
        try:
            library = self._library(case, row)
            if self.args.compiled:
                compiled = self._library(case, row, compiled=True)
            try:
                pyspk = self._pyspk(case, row, pin)
            except KernelMissingError as error:
                row["status"], row["note"] = NOT_BUILT, str(error)
            arms = {"library": library, "compiled": compiled, "pyspk": pyspk}
            timed = {name: arm for name, arm in arms.items() if arm is not None}
            rounds = self._rounds([arm.replay for arm in timed.values()])
            samples = dict(zip(timed, rounds, strict=True))
            for name, milliseconds in samples.items():
                row[f"{name}_round_ms"] = milliseconds
                row[f"{name}_us"] = statistics.median(milliseconds) * 1000 / GRAPH_ENQUEUES
            if pyspk is not None:
                row["speedup"] = row["library_us"] / row["pyspk_us"]
                pairs = zip(samples["library"], samples["pyspk"], strict=True)
                row["round_ratio_median"] = statistics.median(a / b for a, b in pairs)
                row["replay_bit_identical"] = pyspk.replay_matches_eager()
        except Exception as error:
            row["status"] = ERROR
            row["note"] = f"{type(error).__name__}: {error}"
            traceback.print_exc()
        finally:
            for arm in (pyspk, compiled, library):
                if arm is not None:
                    with contextlib.suppress(Exception):
                        arm.close()
            with contextlib.suppress(Exception):
                self.synchronize()
            gc.collect()
            self.torch.cuda.empty_cache()
            row["seconds"] = time.perf_counter() - started

    def _library(self, case: Case, row: dict[str, Any], compiled: bool = False) -> _LibraryArm:
        started = time.perf_counter()
        arm = _LibraryArm(self, case, compiled)
        name = "compiled" if compiled else "library"
        if compiled:
            row["compile_seconds"] = time.perf_counter() - started
        try:
            row[f"{name}_max_abs"], row[f"{name}_rel_l2"] = arm.errors
        except BaseException:
            with contextlib.suppress(Exception):
                arm.close()
            raise
        return arm

    def _pyspk(self, case: Case, row: dict[str, Any], pin: SegdensePin) -> _PyspkArm:
        arm = _PyspkArm(self, case, pin)
        try:
            row["pyspk_max_abs"], row["pyspk_rel_l2"] = arm.errors
            row["host_us"] = arm.host_us()
        except BaseException:
            with contextlib.suppress(Exception):
                arm.close()
            raise
        return arm

    def _rounds(self, replays: Sequence[Callable[[], None]]) -> list[list[float]]:
        """Milliseconds of each replay in each timed round, per arm."""
        torch, stream = self.torch, self.stream

        def run(rounds: int) -> list[list[tuple[Any, Any]]]:
            events: list[list[tuple[Any, Any]]] = [[] for _ in replays]
            for _ in range(rounds):
                if self.sleep is not None and self.args.spin_cycles > 0:
                    # the host queues the whole round while the GPU spins
                    self.sleep(self.args.spin_cycles)
                for arm, replay in enumerate(replays):
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record(stream)
                    replay()
                    end.record(stream)
                    events[arm].append((start, end))
            stream.synchronize()
            return events

        self.synchronize()
        run(self.args.warmup_rounds)
        timed = run(self.args.rounds)
        return [[start.elapsed_time(end) for start, end in arm] for arm in timed]


class _LibraryArm:
    """The PyTorch path on the shared stream, eager or through `torch.compile`: eager
    errors, then a graph of 20 calls."""

    def __init__(self, bench: Bench, case: Case, compiled: bool = False) -> None:
        self.graph: Any = None
        self.outputs: list[Any] = []
        self.tensors: dict[str, Any] = {}
        try:
            self._setup(bench, case, compiled)
        except BaseException:
            with contextlib.suppress(Exception):  # keep the setup's error
                self.close()
            raise

    def _setup(self, bench: Bench, case: Case, compiled: bool) -> None:
        torch = bench.torch
        ops = bench.operands(case.site, case.batch)
        device = torch.device("cuda", bench.ordinal)
        # kept alive for the graph's lifetime
        self.tensors = {name: torch.from_numpy(value).to(device) for name, value in ops.items()}
        x, w, bias = self.tensors["x"], self.tensors["w"], self.tensors.get("bias")
        function = testing.library_function(torch, case.site)
        if compiled:
            # a fresh compile per tuple: no cached graph or recompile limit carries over
            torch._dynamo.reset()
            function = torch.compile(function, mode=COMPILE_MODE, dynamic=False)

        def call() -> Any:
            return function(x, w, bias)

        # the warm-up calls compile (and autotune) under this math's settings
        with testing.library_math(torch, case.math):
            for _ in range(EAGER_WARMUP):
                call()
            eager = call()
            torch.cuda.synchronize()
            self.errors = testing.errors(
                eager.detach().cpu().numpy(), bench.truth(case.site, case.batch)
            )
            del eager
            self.graph = torch.cuda.CUDAGraph()
            gc.collect()
            gc.disable()  # no collector-run frees while torch captures
            try:
                with torch.cuda.graph(self.graph, stream=bench.stream):
                    self.outputs = [call() for _ in range(GRAPH_ENQUEUES)]
            finally:
                gc.enable()
        for _ in range(REPLAY_WARMUP):
            self.graph.replay()
        torch.cuda.synchronize()

    def replay(self) -> None:
        self.graph.replay()

    def close(self) -> None:
        if self.graph is not None:
            self.graph.reset()
            self.graph = None
        self.outputs = []
        self.tensors = {}


class _PyspkArm:
    """The picked plan on the runtime adopting the shared stream: eager errors, host cost,
    then a graph of 20 enqueues into preallocated outputs."""

    def __init__(self, bench: Bench, case: Case, pin: SegdensePin) -> None:
        self._runtime = bench.runtime
        self._samples = bench.args.host_samples
        self.graph: Any = None
        self.oxide: Any = None
        self._buffers: list[Any] = []
        try:
            self._setup(bench, case, pin)
        except BaseException:
            with contextlib.suppress(Exception):  # keep the setup's error
                self.close()
            raise

    def _setup(self, bench: Bench, case: Case, pin: SegdensePin) -> None:
        import numpy as np

        runtime = self._runtime
        ops = bench.operands(case.site, case.batch)
        self.oxide = testing.plan_pin(runtime, pin, ops)
        producer = self.oxide.producer
        self.x = self._keep(runtime.upload(ops["x"]))
        if len(self.x) != producer.input_len:
            raise RuntimeError(
                f"input has {len(self.x)} floats, the plan takes {producer.input_len}"
            )
        self.outputs = [
            self._keep(runtime.alloc_zeros(producer.output_len)) for _ in range(GRAPH_ENQUEUES)
        ]
        for _ in range(EAGER_WARMUP):
            self.oxide.enqueue(self.x, self.outputs[0])
        runtime.synchronize()
        # a kernel that writes nothing shows as NaN
        poisoned = self._keep(runtime.upload(np.full(producer.output_len, np.nan, np.float32)))
        self.oxide.enqueue(self.x, poisoned)
        self.eager = runtime.download(poisoned)
        self.errors = testing.errors(self.eager, bench.truth(case.site, case.batch))

        def enqueue_all() -> None:
            for output in self.outputs:
                self.oxide.enqueue(self.x, output)

        gc.collect()
        self.graph = runtime.capture(enqueue_all)
        for _ in range(REPLAY_WARMUP):
            self.graph.replay()
        runtime.synchronize()

    def _keep(self, buffer: Any) -> Any:
        self._buffers.append(buffer)
        return buffer

    def host_us(self) -> float:
        """Median microseconds to queue one eager enqueue."""
        oxide, x, y = self.oxide, self.x, self.outputs[0]
        return testing.per_launch_us(self._runtime, lambda: oxide.enqueue(x, y), self._samples)

    def replay(self) -> None:
        self.graph.replay()

    def replay_matches_eager(self) -> bool:
        """Whether the last replayed output has the eager output's bits."""
        import numpy as np

        replayed = self._runtime.download(self.outputs[-1])
        return bool(np.array_equal(replayed.view(np.uint32), self.eager.view(np.uint32)))

    def close(self) -> None:
        if self.graph is not None:
            self.graph.close()
            self.graph = None
        self._runtime.synchronize()
        buffers, self._buffers = self._buffers, []
        for buffer in buffers:
            buffer.free()
        if self.oxide is not None:
            self.oxide.close()
            self.oxide = None


def _versions(torch: Any) -> dict[str, str]:
    from importlib import metadata

    import numpy as np

    from pyspk.cuda import driver

    raw = int(driver.call("cuDriverGetVersion"))
    try:
        bindings = metadata.version("cuda-bindings")
    except metadata.PackageNotFoundError:
        bindings = "unknown"
    return {
        "driver": f"{raw // 1000}.{raw % 1000 // 10} ({raw})",
        "torch": torch.__version__,
        "torch_cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()),
        "cuda_bindings": bindings,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def _device_meta(device: DeviceAttributes) -> dict[str, Any]:
    return {**device_json(device), "l2_bytes": device.l2_bytes}


def planned_rows(
    cases: Sequence[Case], forced: Sequence[Entry], tier: PtxTier, device: DeviceAttributes
) -> tuple[list[tuple[Case, dict[str, Any], SegdensePin]], list[str]]:
    """(case, row, pin) in run order, each case's forced entries after its pick, and a
    line for each forced pin refused."""
    simt = set(simt_keys(tier, device))
    refused = []
    extra: dict[Case, list[tuple[Entry, SegdensePin]]] = {}
    for case, entry in forced_cases(forced, cases):
        pin = forced_pin(entry, case.math, tier, device)
        if isinstance(pin, str):
            refused.append(f"{entry.name} {case.key()}: {pin}")
        else:
            extra.setdefault(case, []).append((entry, pin))
    plan = []
    for case in cases:
        pin = pick(case, tier, device)
        plan.append((case, new_row(case, pin, forced=False, simt=case.key() in simt), pin))
        for _, forced_one in extra.get(case, []):
            plan.append((case, new_row(case, forced_one, forced=True, simt=False), forced_one))
    return plan, refused


def compile_only(args: argparse.Namespace, cases: Sequence[Case]) -> int:
    """Compile (and autotune) the compiled arm of each case and exit: processes running
    this on parts of the tuples fill TorchInductor's on-disk caches, so that a later
    `--compiled` run compiles from them instead of autotuning each tuple in turn."""
    bench = Bench(args)
    torch = bench.torch
    with torch.cuda.device(bench.ordinal), torch.cuda.stream(bench.stream):
        for case in cases:
            started = time.perf_counter()
            _LibraryArm(bench, case, compiled=True).close()
            print(f"compiled {case.key()} in {time.perf_counter() - started:.1f} s", flush=True)
    bench.runtime.close()
    return 0


def run(args: argparse.Namespace, cases: Sequence[Case], forced: Sequence[Entry]) -> int:
    started = time.perf_counter()
    bench = Bench(args)
    torch = bench.torch
    with torch.cuda.device(bench.ordinal), torch.cuda.stream(bench.stream):
        device, tier = bench.device, bench.kernels.tier
        plan, refused = planned_rows(cases, forced, tier, device)
        print(
            f"{device.name}: capability {device.capability}, {device.multiprocessors} SMs; "
            f"segdense {bench.kernels.artifact}; {len(plan)} rows, {args.rounds} rounds",
            flush=True,
        )
        for line in refused:
            print(f"forced pin refused: {line}", flush=True)
        if bench.sleep is None:
            print("torch.cuda._sleep is missing: rounds run without the spin kernel")
        simt = simt_keys(tier, device)
        stem = output_stem(device.name, args.tier, args.compiled)
        rows: list[dict[str, Any]] = []
        for index, (case, row, pin) in enumerate(plan, 1):
            bench.measure(case, row, pin)
            rows.append(row)
            print(f"[{index:2}/{len(plan)}] {progress_line(row)}", flush=True)
            # report and data rewritten after every row, so a run stopped early leaves
            # its rows so far; the chart is drawn once, after the last
            complete = index == len(plan)
            meta = _meta(args, bench, cases, forced, refused, started, complete)
            summary = summarize(rows, simt)
            outputs = write_outputs(args.out, stem, meta, rows, summary, chart=complete)
        for line in summary_lines(summary):
            print(line)
        for line in outputs:
            print(line)
    bench.runtime.close()
    return 1 if summary["errors"] else 0


def _meta(
    args: argparse.Namespace,
    bench: Bench,
    cases: Sequence[Case],
    forced: Sequence[Entry],
    refused: Sequence[str],
    started: float,
    complete: bool,
) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": _device_meta(bench.device),
        "versions": _versions(bench.torch),
        "tier": str(bench.kernels.tier),
        "artifact": bench.kernels.artifact,
        "compiled": args.compiled,
        "compile_mode": COMPILE_MODE if args.compiled else None,
        "graph_enqueues": GRAPH_ENQUEUES,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "spin_cycles": args.spin_cycles if bench.sleep is not None else 0,
        "host_chunk": testing.CHUNK,
        "host_samples": args.host_samples,
        "seed": args.seed,
        "cudnn_benchmark": args.cudnn_benchmark,
        "tuples": [case.key() for case in cases],
        "forced": [entry.name for entry in forced],
        "forced_refused": refused,
        "argv": sys.argv[1:],
        "seconds": time.perf_counter() - started,
        "complete": complete,
    }


def progress_line(row: Mapping[str, Any]) -> str:
    name = row["entry"] + (" (forced)" if row["forced"] else "")
    head = f"{row['key']:<16} {name:<24}"
    seconds = f"({format_number(row['seconds'], '.1f')} s)"
    if row["status"] == ERROR:
        return f"{head} error: {row['note']} {seconds}"
    library = f"library {format_number(row['library_us'], '9.2f')} us"
    if row["status"] == NOT_BUILT:
        return f"{head} {library}  pyspk not built {seconds}"
    return (
        f"{head} {library}  pyspk {format_number(row['pyspk_us'], '9.2f')} us  "
        f"{format_speedup(row['speedup'])}  "
        f"host {format_number(row['host_us'], '.2f')} us {seconds}"
    )


def dry_run(name: str, tier: PtxTier | None, cases: Sequence[Case], forced: Sequence[Entry]) -> int:
    """Print the rows a run would time on a named profile; no GPU, no torch."""
    device = profile(name)
    try:
        loaded = loadable_tier(device.capability, tier)
    except ValueError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    plan, refused = planned_rows(cases, forced, loaded, device)
    print(f"{device.name} (profile {profile_key(name)}), tier {loaded}: {len(plan)} rows")
    for case, row, _ in plan:
        splits = "" if row["splits"] is None else f" x{row['splits']}"
        marks = (" simt" if row["simt"] else "") + (" forced" if row["forced"] else "")
        print(f"  {case.key():<16} {row['entry']}{splits} `{row['kernel']}`{marks}")
    for line in refused:
        print(f"forced pin refused: {line}")
    simt = simt_keys(loaded, device)
    print(f"SIMT set, {len(simt)} tuples: {', '.join(simt)}")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="timed rounds per row")
    parser.add_argument("--warmup-rounds", type=int, default=WARMUP_ROUNDS)
    parser.add_argument(
        "--tuples",
        action="append",
        default=[],
        metavar="SITE[:BATCH[:MATH]]",
        help="only these tuples (repeatable, comma-separated), e.g. seg_1:32:fp32, conv1",
    )
    parser.add_argument(
        "--force",
        action="append",
        default=[],
        metavar="ENTRY",
        help="also time this entry (repeatable) in its site/batch, each math its pin allows",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    parser.add_argument("--tier", type=PtxTier.parse, default=None, help="force a PTX tier")
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host-samples", type=int, default=HOST_SAMPLES)
    parser.add_argument("--spin-cycles", type=int, default=SPIN_CYCLES)
    parser.add_argument(
        "--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms"
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help=f'add the library function through torch.compile(mode="{COMPILE_MODE}")',
    )
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="only compile the compiled arm of the tuples (fills the compile caches), then exit",
    )
    parser.add_argument(
        "--dry-run", metavar="PROFILE", help="print the rows for a device profile and exit"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup_rounds < 0 or args.host_samples < 1:
        parser.error("--rounds and --host-samples must be >= 1, --warmup-rounds >= 0")
    try:
        args.cases = select_cases(parse_patterns(args.tuples))
        args.entries = list(dict.fromkeys(parse_entry(name) for name in args.force))
        if args.dry_run is not None:
            profile_key(args.dry_run)
    except (ValueError, KeyError) as error:
        parser.error(str(error).strip("'\""))
    if not args.cases:
        parser.error("--tuples selects no tuple")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run is not None:
        return dry_run(args.dry_run, args.tier, args.cases, args.entries)
    if args.compile_only:
        return compile_only(args, args.cases)
    return run(args, args.cases, args.entries)


if __name__ == "__main__":
    raise SystemExit(main())
