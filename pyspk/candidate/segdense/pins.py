"""The device rule's pick for every segdense tuple (six boundaries x batches 1 and 32 x
FP32/TF32 math) on one device and PTX tier: as a table, as JSON, and as a diff against a
recorded JSON table, so a rule change shows up as named tuples. Pure: no driver import."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from pyspk.candidate.framework import Fp16Policy
from pyspk.candidate.segdense import BATCHES, Area, Entry, SegdensePin, Site
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.errors import ArtifactError, InvalidArgument
from pyspk.cuda.manifest import KernelModule, Manifest
from pyspk.cuda.math import CudaMath
from pyspk.cuda.profiles import PROFILES
from pyspk.cuda.tier import PtxTier, loadable_tier

# every (site, batch, math) the rule answers, in Site order, then batch, then math
TUPLES: tuple[tuple[Site, int, CudaMath], ...] = tuple(
    (site, batch, math) for site in Site for batch in BATCHES for math in CudaMath
)

# the fields that make up a pick; a change in any of them is a changed pick
PICK_FIELDS = ("entry", "kernel", "splits", "block", "shared")


@attrs.frozen
class Pick:
    """What the device rule runs for one tuple: entry, kernel, split-K slices (None for
    entries without split-K), block threads and dynamic shared bytes."""

    boundary: str
    batch: int
    math: CudaMath
    entry: str
    kernel: str
    splits: int | None
    block: int
    shared: int
    # whether the shipped module of the tier carries the kernel (None: not known)
    built: bool | None = None

    @classmethod
    def of(cls, site: Site, batch: int, math: CudaMath, pin: SegdensePin) -> Pick:
        """The pick of `pin`, the rule's answer for `site`, `batch` and `math`."""
        return cls(boundary=site.value, batch=batch, math=math, **pin.fields())

    def key(self) -> tuple[str, int, str]:
        return (self.boundary, self.batch, str(self.math))

    def label(self) -> str:
        """ "EMBED_B32_TF32_E64 x66", or the entry name alone without split-K."""
        return _label(self.entry, self.splits)

    def as_dict(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "math": str(self.math)}


def _label(entry: object, splits: object) -> str:
    return f"{entry} x{splits}" if splits is not None else str(entry)


def _where(key: tuple[str, int, str]) -> str:
    boundary, batch, math = key
    return f"{boundary} batch {batch} {math}"


@functools.cache
def shipped_entries(tier: PtxTier) -> frozenset[str] | None:
    """The entries the shipped module of `tier` exports, read once from its manifest
    (no driver); None when the manifest cannot be read."""
    try:
        return frozenset(Manifest.load().module(KernelModule.SEGDENSE).tiers[tier].entries)
    except (ArtifactError, KeyError):
        return None


def pick_table(
    device: DeviceAttributes, tier: PtxTier, fp16: Fp16Policy = Fp16Policy.ALLOW
) -> list[Pick]:
    """The 24 picks of the device rule on `device` with the `tier` module loaded, each
    marked with whether the shipped module carries its kernel.

    The tier is taken as given; `loadable_tier` says which one a device would load."""
    shipped = shipped_entries(tier)
    picks = [
        Pick.of(
            site, batch, math, Area.driver_pin(site.boundary(), batch, math, device, tier, fp16)
        )
        for site, batch, math in TUPLES
    ]
    if shipped is None:
        return picks
    return [attrs.evolve(pick, built=pick.kernel in shipped) for pick in picks]


def device_json(device: DeviceAttributes) -> dict[str, Any]:
    return {
        "name": device.name,
        "capability": str(device.capability),
        "multiprocessors": device.multiprocessors,
        "shared_optin_bytes": device.shared_optin_bytes,
    }


def to_json(device: DeviceAttributes, tier: PtxTier, picks: Sequence[Pick]) -> dict[str, Any]:
    """The record `pyspk pins --write` stores and `--check` reads back."""
    return {
        "device": device_json(device),
        "tier": str(tier),
        "picks": [pick.as_dict() for pick in picks],
    }


# the type of every field of a record, as `to_json` writes it (bool is not an int here)
_DEVICE_TYPES = {"name": str, "capability": str, "multiprocessors": int, "shared_optin_bytes": int}
_PICK_TYPES: dict[str, tuple[type, ...]] = {
    "boundary": (str,),
    "batch": (int,),
    "math": (str,),
    "entry": (str,),
    "kernel": (str,),
    "splits": (int, type(None)),
    "block": (int,),
    "shared": (int,),
}


def _typed(value: object, types: tuple[type, ...], where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, types):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise InvalidArgument(f"{where} is {json.dumps(value)}, not {names}")


def _recorded_picks(recorded: object) -> dict[tuple[str, int, str], dict[str, Any]]:
    """The picks of a recorded table by tuple; ValueError naming what is malformed: a
    missing field or one of another type than `to_json` writes included."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("picks"), list):
        raise InvalidArgument('the record is not an object with a "picks" list')
    picks: dict[tuple[str, int, str], dict[str, Any]] = {}
    for index, item in enumerate(recorded["picks"]):
        if not isinstance(item, dict):
            raise InvalidArgument(f"recorded pick {index} is not an object")
        missing = [
            field for field in ("boundary", "batch", "math", *PICK_FIELDS) if field not in item
        ]
        if missing:
            raise InvalidArgument(f"recorded pick {index} lacks {', '.join(missing)}")
        for field, types in _PICK_TYPES.items():
            _typed(item[field], types, f"recorded pick {index} field {field}")
        # the format's own enumerations; another version's boundaries, batches and
        # entries are differences, not malformed records
        _known(item["math"], [str(math) for math in CudaMath], f"recorded pick {index} math")
        if item["batch"] < 1:
            raise InvalidArgument(f"recorded pick {index} batch is {item['batch']}, not >= 1")
        key = (item["boundary"], item["batch"], item["math"])
        if key in picks:
            raise InvalidArgument(f"recorded pick {index} repeats {_where(key)}")
        picks[key] = item
    device = recorded.get("device")
    if not isinstance(device, dict):
        raise InvalidArgument('the record has no "device" object')
    for field, kind in _DEVICE_TYPES.items():
        _typed(device.get(field), (kind,), f"device.{field}")
    _typed(recorded.get("tier"), (str,), "tier")
    _known(recorded["tier"], [str(tier) for tier in PtxTier], "tier")
    return picks


def _known(value: object, allowed: list, where: str) -> None:
    """InvalidArgument unless `value` is one a record can hold."""
    if value not in allowed:
        shown = ", ".join(str(a) for a in allowed[:12]) + (", ..." if len(allowed) > 12 else "")
        raise InvalidArgument(f"{where} is {json.dumps(value)}, not one of {shown}")


def diff(recorded: object, picks: Iterable[Pick]) -> list[str]:
    """One line per tuple whose pick differs from the recorded JSON table (`to_json`'s
    shape), is missing from it, or is recorded but not picked now; empty when all match.

    ValueError when the record is not of that shape."""
    old = _recorded_picks(recorded)
    lines = []
    current = set()
    for pick in picks:
        key = pick.key()
        current.add(key)
        now = pick.as_dict()
        was = old.get(key)
        if was is None:
            lines.append(f"{_where(key)}: not recorded -> {pick.label()}")
            continue
        if all(was[field] == now[field] for field in PICK_FIELDS):
            continue
        before = _label(was["entry"], was["splits"])
        if before != pick.label():
            lines.append(f"{_where(key)}: {before} -> {pick.label()}")
        else:
            # same entry and slices: name the launch fields that moved
            moved = ", ".join(
                f"{field} {was[field]} -> {now[field]}"
                for field in ("kernel", "block", "shared")
                if was[field] != now[field]
            )
            lines.append(f"{_where(key)}: {before}: {moved}")
    for key, was in old.items():
        if key not in current:
            lines.append(f"{_where(key)}: {_label(was['entry'], was['splits'])} -> not picked")
    return lines


def render_picks(picks: Sequence[Pick]) -> str:
    """The picks as an aligned text table, one row per tuple."""
    header = ("boundary", "batch", "math", "entry", "kernel", "splits", "block", "shared")
    rows = [
        (
            pick.boundary,
            str(pick.batch),
            str(pick.math),
            pick.entry,
            pick.kernel if pick.built is not False else f"{pick.kernel} (not built)",
            "-" if pick.splits is None else str(pick.splits),
            str(pick.block),
            str(pick.shared),
        )
        for pick in picks
    ]
    # numbers right-aligned, names left-aligned
    numeric = (False, True, False, False, False, True, True, True)
    return _render([header, *rows], numeric)


def _render(
    rows: Sequence[Sequence[str]], numeric: Sequence[bool], gaps: Sequence[int] | None = None
) -> str:
    """Aligned columns, numbers right-aligned, `gaps[i]` spaces after column i (2 by
    default). A row may end early: its last cell then spans the remaining columns."""
    columns = len(numeric)
    gaps = [2] * columns if gaps is None else gaps
    widths = [
        max(
            (len(row[column]) for row in rows if column < len(row) - 1 or len(row) == columns),
            default=0,
        )
        for column in range(columns)
    ]
    lines = []
    for row in rows:
        line = ""
        for column, cell in enumerate(row):
            spans = column == len(row) - 1 and len(row) < columns
            if spans:
                line += cell
            elif numeric[column]:
                line += cell.rjust(widths[column])
            else:
                line += cell.ljust(widths[column])
            line += " " * gaps[column]
        lines.append(line.rstrip())
    return "\n".join(lines)


# --- every known profile side by side ------------------------------------------------

# each entry variant's (Entry.variant) legend
_VARIANTS = {
    "simt": "FP32 SIMT kernel",
    "tc": "tensor-core convolution, scaled FP16 products",
    "x3": "3xTF32 tensor cores (FP32-exact)",
    "tf32": "tensor cores in TF32 math (TF32 or scaled FP16 products)",
    "sel": "scaled FP16 tensor cores, 16 reduction rows in 3xTF32",
    "e64": "TF32 split-K on 96 x 64 tiles",
    "k2": "TF32 split-K with an in-block k-split",
    "f16": "split-K with scaled FP16 products",
}


def short_cell(pick: Pick) -> str:
    """A compact cell naming the pick within its tuple: "e64:66", "x3", "simt:34"."""
    label = Entry[pick.entry].variant()
    return label if pick.splits is None else f"{label}:{pick.splits}"


def _short_boundary(boundary: str) -> str:
    return boundary.rsplit(".", 1)[-1]


@attrs.frozen
class ProfileRow:
    """One profile: the tier it loads and its picks, or why it cannot load the tier."""

    name: str
    device: DeviceAttributes
    tier: PtxTier | None
    picks: tuple[Pick, ...]
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        if self.tier is None:
            return {
                "device": device_json(self.device),
                "tier": None,
                "error": self.error,
                "picks": [],
            }
        return to_json(self.device, self.tier, self.picks)


@attrs.frozen
class ProfileTable:
    """The picks of every known profile: rows of profiles, and a rendering that shows
    per profile only the tuples whose pick differs between profiles."""

    rows: tuple[ProfileRow, ...]

    def as_json(self) -> dict[str, Any]:
        return {"profiles": {row.name: row.as_json() for row in self.rows}}

    def cells(self) -> dict[str, dict[tuple[str, int, str], str]]:
        """Profile name -> tuple -> short cell, for the profiles that load their tier."""
        return {
            row.name: {pick.key(): short_cell(pick) for pick in row.picks}
            for row in self.rows
            if row.tier is not None
        }

    def render(self) -> str:
        cells = self.cells()
        keys = [(site.value, batch, str(math)) for site, batch, math in TUPLES]
        varying = [key for key in keys if len({by[key] for by in cells.values()}) > 1]
        common = [key for key in keys if key not in varying]

        head_top = ["", "", "", "", *(_short_boundary(key[0]) for key in varying)]
        head = ["profile", "cc", "SMs", "tier", *(f"b{key[1]} {key[2]}" for key in varying)]
        body = []
        for row in self.rows:
            front = [row.name, str(row.device.capability), str(row.device.multiprocessors)]
            if row.tier is None:
                body.append([*front, "-", f"({row.error})"])
            else:
                body.append([*front, str(row.tier), *(cells[row.name][key] for key in varying)])
        numeric = [False, True, True, False, *([False] * len(varying))]
        # one space between the tuple columns keeps nine of them within ~100 columns
        gaps = [1, 1, 1, 2, *([1] * len(varying))]
        table = _render([head_top, head, *body], numeric, gaps)

        lines = [table]
        if varying:
            entries = self._entries(varying)
            lines.append("")
            lines.append("cells: the entry's variant within its tuple; :N = split-K slices")
            for label, text in _VARIANTS.items():
                named = [
                    entry.name
                    for entry in Entry
                    if entry.name in entries and entry.variant() == label
                ]
                if named:
                    lines.append(f"  {label:<5} {text}: {', '.join(named)}")
        if common:
            lines.append("")
            lines.append("the same pick on every profile:")
            lines.extend(f"  {line}" for line in self._common_lines(common))
        return "\n".join(lines)

    def _loaded(self) -> list[ProfileRow]:
        return [row for row in self.rows if row.tier is not None]

    def _entries(self, keys: Sequence[tuple[str, int, str]]) -> set[str]:
        """The entries any profile picks for `keys`."""
        wanted = set(keys)
        return {pick.entry for row in self._loaded() for pick in row.picks if pick.key() in wanted}

    def _common_lines(self, keys: Sequence[tuple[str, int, str]]) -> list[str]:
        """ "sincnet.conv1 b1 fp32, tf32: CONV1_B1": maths of one boundary and batch that
        share a pick are merged."""
        loaded = self._loaded()
        if not loaded:
            return []
        first = {pick.key(): pick for pick in loaded[0].picks}
        groups: dict[tuple[str, int, str], list[str]] = {}
        for key in keys:
            pick = first[key]
            groups.setdefault((key[0], key[1], pick.label()), []).append(key[2])
        width = max(
            len(f"{boundary} b{batch} {', '.join(maths)}:")
            for (boundary, batch, _), maths in groups.items()
        )
        return [
            f"{boundary} b{batch} {', '.join(maths)}:".ljust(width) + f" {label}"
            for (boundary, batch, label), maths in groups.items()
        ]


def profiles_table(
    tier_override: PtxTier | None = None,
    profiles: Mapping[str, DeviceAttributes] = PROFILES,
    fp16: Fp16Policy = Fp16Policy.ALLOW,
) -> ProfileTable:
    """The picks of every profile on the tier it would load: the highest shipped tier at
    or below its capability, or `tier_override` where the profile can load that one."""
    rows = []
    for name, device in profiles.items():
        try:
            tier = loadable_tier(device.capability, tier_override)
        except ValueError as error:
            rows.append(ProfileRow(name, device, None, (), str(error)))
            continue
        rows.append(ProfileRow(name, device, tier, tuple(pick_table(device, tier, fp16))))
    return ProfileTable(tuple(rows))
