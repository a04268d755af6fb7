"""The `pyspk` command.

`pyspk pins` prints the kernel the segdense device rule picks for each of the 24 tuples
(boundary x batch x math) on the local GPU, on a named deployment GPU (`--device h200`) or
on given attributes (`--capability 8.9 --sms 34`); with no GPU answering and none named,
it prints the picks of every known profile side by side. `--write`/`--check` record the
picks as JSON and compare a later rule with the record. `pyspk info` prints versions and
what each GPU would load; `pyspk diarize` diarizes audio files (`pyspk.cli.diarize`)."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from pyspk import __version__
from pyspk.candidate.framework import Fp16Policy
from pyspk.candidate.segdense import BATCHES
from pyspk.candidate.segdense.pins import (
    TUPLES,
    Pick,
    diff,
    pick_table,
    profiles_table,
    render_picks,
    to_json,
)
from pyspk.cli._arguments import positive_int
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import CudaError
from pyspk.cuda.manifest import force_ptx_from_env
from pyspk.cuda.profiles import PROFILES, SHARED_OPTIN_BY_CAPABILITY, profile, profile_key
from pyspk.cuda.tier import SHIPPED_TIERS, ComputeCapability, PtxTier, loadable_tier

PROG = "pyspk"

# bounds of a described device: every CUDA device gives a block 48 KiB of shared memory,
# none gives more than 227 KiB (compute capability 9.0 and 10.0), and the largest GPUs
# have fewer than 200 multiprocessors
MIN_SHARED_OPTIN = 48 * 1024
MAX_SHARED_OPTIN = 227 * 1024
MAX_SMS = 1024


class UsageError(Exception):
    """A bad argument or input file: one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    # argparse prints the usage and exits; one line and a status from main() instead
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def local_device() -> DeviceAttributes:
    """Device 0 through the driver; a `CudaError` when none answers (tests replace this)."""
    return DeviceAttributes.query(0)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _capability(text: str) -> ComputeCapability:
    try:
        return ComputeCapability.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _tier(text: str) -> PtxTier:
    try:
        return PtxTier.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="pyspk: fixed-shape CUDA kernels for the dense "
        "layers of a speaker-diarization engine.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    pins = commands.add_parser(
        "pins",
        help="the kernel the device rule picks for every segdense tuple",
        description="Print the entry, kernel, split-K slices, block and dynamic shared "
        "memory the segdense device rule picks for each boundary, batch "
        f"({', '.join(map(str, BATCHES))}) and math "
        "(fp32, tf32). The device is the local GPU, a --device profile, or --capability "
        "with --sms; with no GPU answering and none named, every known profile is shown.",
        epilog=f"known devices: {', '.join(PROFILES)}",
    )
    source = pins.add_mutually_exclusive_group()
    source.add_argument("--device", metavar="NAME", help="a known deployment GPU")
    source.add_argument(
        "--capability",
        metavar="MAJOR.MINOR",
        type=_capability,
        help="a device of this compute capability (needs --sms)",
    )
    pins.add_argument(
        "--sms", metavar="N", type=positive_int, help="multiprocessors of the --capability device"
    )
    pins.add_argument(
        "--shared-optin",
        metavar="BYTES",
        type=positive_int,
        help="opt-in shared memory per block of the --capability device (default and "
        "most: what its architecture allows, e.g. 65536 on 7.5, 232448 on 9.0)",
    )
    shipped = ", ".join(str(tier) for tier in SHIPPED_TIERS)
    pins.add_argument(
        "--tier",
        metavar="TIER",
        type=_tier,
        help=f"the PTX tier loaded ({shipped}; default PYSPK_PTX_TIER, else "
        "the highest shipped tier the device loads)",
    )
    pins.add_argument(
        "--fp16",
        choices=("allow", "forbid"),
        default="allow",
        help="whether TF32 math may multiply in scaled FP16 (default allow); forbid "
        "shows the kernels that replace the FP16 ones",
    )
    pins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    record = pins.add_mutually_exclusive_group()
    record.add_argument("--write", metavar="FILE", help="record the picks as JSON in FILE")
    record.add_argument(
        "--check",
        metavar="FILE",
        help="compare the picks with FILE; exit 1 naming each changed one",
    )
    pins.set_defaults(run=_run_pins)

    _add_info_parser(commands)

    from pyspk.cli import diarize  # its heavy imports wait until it runs

    diarize.add_parser(commands)
    return parser


def _add_info_parser(commands: Any) -> None:
    """`pyspk info` and its options on `commands` (argparse subparsers)."""
    info = commands.add_parser(
        "info",
        help="versions, the driver, and what each visible GPU would load and run",
        description="Print the versions of pyspk, Python, numpy and cuda-bindings, the "
        "driver's CUDA version and, for each visible GPU, its attributes, the kernel "
        "artifact it would load (cubin or PTX JIT) and the entry the device rule picks "
        "per tuple. Without a driver or GPU it prints what it can and says why.",
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.add_argument(
        "--pipeline",
        metavar="ID_OR_FOLDER",
        help="also say whether accelerate_pipeline would serve this pyannote pipeline "
        "(loaded on the CPU, checked as pyspk diarize checks it)",
    )
    info.add_argument("--token", metavar="TOKEN", help="Hugging Face token (default: HF_TOKEN)")
    info.add_argument(
        "--trust-checkpoints",
        action="store_true",
        help="load a local pipeline folder whose checkpoints need more than weights_only",
    )
    info.set_defaults(run=_run_info, tier=None)


def _run_info(args: argparse.Namespace) -> int:
    from pyspk.cli import info

    forced, _ = _forced_tier(args)
    report = info.collect(forced, force_ptx_from_env())
    if args.pipeline:
        report["pipeline"] = info.pipeline_service(args)
    if args.json:
        _print_json(report)
    else:
        print(info.render(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default `sys.argv[1:]`); returns the exit status:
    0 done, 1 `--check` found changed picks, 2 a bad argument or input."""
    parser = build_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError(f"a command is required: pins, info or diarize (see {PROG} --help)")
        status = args.run(args)
        sys.stdout.flush()  # a write error shows here, not at the interpreter's exit
        return status
    except UsageError as error:
        print(f"{PROG}: error: {_one_line(str(error))}", file=sys.stderr)
        return 2
    except SystemExit as done:
        # --help and --version
        return done.code if isinstance(done.code, int) else 0
    except BrokenPipeError:
        # the reader (`| head`) left: the status is the command's own (0, or 1 where
        # --check found changes), whenever the pipe closed; silence the flush at exit
        _silence_stdout()
        return getattr(args, "status", 0)
    except OSError as error:  # stdout unwritable: a full disk (`> /dev/full`)
        _silence_stdout()
        print(f"{PROG}: error: cannot write the output: {error.strerror or error}", file=sys.stderr)
        return 2


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# --- pins ----------------------------------------------------------------------------


def _named_device(args: argparse.Namespace) -> tuple[DeviceAttributes, str] | None:
    """The device the arguments name and how it was named, or None when they name none."""
    if args.capability is None:
        if args.sms is not None or args.shared_optin is not None:
            raise UsageError("--sms and --shared-optin describe a --capability device")
        if args.device is None:
            return None
        try:
            key = profile_key(args.device)
        except KeyError as error:
            raise UsageError(error.args[0]) from None
        return profile(key), f"profile {key}"
    if args.sms is None:
        raise UsageError("--capability needs --sms, the device's multiprocessor count")
    try:
        loadable_tier(args.capability)
    except ValueError as error:
        raise UsageError(f"custom device: {error}") from None
    if args.sms > MAX_SMS:
        raise UsageError(f"--sms {args.sms}: no GPU has more than {MAX_SMS} multiprocessors")
    limit = SHARED_OPTIN_BY_CAPABILITY.get(args.capability)
    if limit is None:
        # the PTX JITs for any later architecture; its opt-in limit must then be given
        if args.shared_optin is None:
            known = ", ".join(str(capability) for capability in SHARED_OPTIN_BY_CAPABILITY)
            raise UsageError(
                f"compute capability {args.capability} has no opt-in shared memory figure "
                f"here (known: {known}); give --shared-optin BYTES"
            )
        limit = MAX_SHARED_OPTIN
    shared = limit if args.shared_optin is None else args.shared_optin
    if shared > limit:
        raise UsageError(
            f"--shared-optin {shared} is more than compute capability {args.capability} "
            f"allows a block ({limit} bytes)"
        )
    if shared < MIN_SHARED_OPTIN:
        raise UsageError(
            f"--shared-optin {shared} is less than the {MIN_SHARED_OPTIN} bytes every CUDA "
            "device gives a block"
        )
    device = DeviceAttributes(
        args.capability, multiprocessors=args.sms, shared_optin_bytes=shared, name="custom device"
    )
    return device, "given attributes"


def _forced_tier(args: argparse.Namespace) -> tuple[PtxTier | None, str]:
    """The tier the user forces (--tier, else PYSPK_PTX_TIER) and where it came from."""
    if args.tier is not None:
        return args.tier, "--tier"
    try:
        forced = PtxTier.from_env()
    except ValueError as error:
        raise UsageError(f"PYSPK_PTX_TIER: {error}") from None
    return forced, "PYSPK_PTX_TIER"


def _run_pins(args: argparse.Namespace) -> int:
    forced, forced_by = _forced_tier(args)
    named = _named_device(args)
    if named is None:
        absent: str | None
        try:
            local = local_device()
        except CudaError as error:
            absent = f"{type(error).__name__}: {error}"
        else:
            absent = None
        # outside the handler, so nothing later chains onto the driver's error
        if absent is not None:
            return _all_profiles(args, forced, absent)
        named = (local, "local device 0")
    device, source = named

    try:
        tier = loadable_tier(device.capability, forced)
    except ValueError as error:
        raise UsageError(f"{device.name}: {error}") from None
    why = forced_by if forced is not None else "highest shipped it loads"
    picks = pick_table(device, tier, Fp16Policy(args.fp16))
    record = to_json(device, tier, picks)

    if args.check is not None:
        return _check(args, record, picks)
    if args.write is not None:
        _write(args.write, record)
    if args.json:
        _print_json(record)
    else:
        print(
            f"{device.name} ({source}): capability {device.capability}, "
            f"{device.multiprocessors} SMs, opt-in shared {device.shared_optin_bytes} B, "
            f"PTX tier {tier} ({why})"
        )
        print(render_picks(picks))
    if args.write is not None:
        print(f"wrote {len(picks)} picks to {args.write}", file=sys.stderr)
    return 0


def _all_profiles(args: argparse.Namespace, forced: PtxTier | None, reason: str) -> int:
    note = f"no local GPU answered ({_one_line(reason)})"
    if args.write is not None or args.check is not None:
        option = "--write" if args.write is not None else "--check"
        raise UsageError(f"{note}; {option} needs --device NAME or --capability and --sms")
    if forced is not None and forced not in SHIPPED_TIERS:
        shipped = ", ".join(str(tier) for tier in SHIPPED_TIERS)
        raise UsageError(f"PTX tier {forced} is not shipped (shipped: {shipped})")
    table = profiles_table(forced, fp16=Fp16Policy(args.fp16))
    print(f"{PROG}: {note}; showing every known profile", file=sys.stderr)
    if args.json:
        _print_json(table.as_json())
    else:
        print(table.render())
    return 0


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _write(path: str, record: dict[str, Any]) -> None:
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(json.dumps(record, indent=2) + "\n")
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror or error}") from None


# a record `--write` writes is a few KiB; anything far larger is not one
RECORD_LIMIT = 1 << 20


def _read_record(path: str) -> object:
    """The JSON of a record file, or UsageError: not a regular file (a FIFO or a device
    would block or never end), over RECORD_LIMIT bytes, not UTF-8 JSON, nested or
    numbered beyond what a record holds."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise UsageError(f"{path} is not a regular file")
        with open(path, "rb") as file:
            data = file.read(RECORD_LIMIT + 1)
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from None
    if len(data) > RECORD_LIMIT:
        raise UsageError(f"{path} is over {RECORD_LIMIT} bytes; a record is a few KiB")
    try:
        return json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{path} is not JSON: {error}") from None
    except (RecursionError, ValueError) as error:  # deep nesting, a huge integer
        raise UsageError(f"{path} is not a record: {type(error).__name__}") from None


def _check(args: argparse.Namespace, record: dict[str, Any], picks: Sequence[Pick]) -> int:
    path = args.check
    recorded = _read_record(path)
    try:
        changes = diff(recorded, picks)
    except ValueError as error:
        raise UsageError(f"{path}: {error}") from None
    assert isinstance(recorded, dict)  # `diff` refuses any other record
    args.status = 1 if changes else 0  # kept when the reader closes the pipe early

    if args.json:
        _print_json({"check": path, "matches": not changes, "changes": changes})
        return 1 if changes else 0
    if not changes:
        print(f"{len(TUPLES)} picks match {path}")
        return 0
    was = recorded.get("device")
    was = was if isinstance(was, dict) else {}
    print(
        f"{len(changes)} of {len(TUPLES)} picks differ from {path} (recorded for "
        f"{was.get('name', '?')}, {was.get('capability', '?')}, "
        f"{was.get('multiprocessors', '?')} SMs, tier {recorded.get('tier', '?')}; now "
        f"{record['device']['name']}, tier {record['tier']}):"
    )
    for line in changes:
        print(f"  {line}")
    return 1
