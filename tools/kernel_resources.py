#!/usr/bin/env python3
"""Registers a thread and static shared memory of the kernels in a CUDA library's
machine code for one architecture, read without a GPU: which kernels leave room on an
SM for another kernel's blocks (an SM has 65,536 registers).

    python3 tools/kernel_resources.py LIBRARY PATTERN [--arch 90]

LIBRARY is a host library with an `.nv_fatbin` section (e.g. cuDNN's
`libcudnn_adv.so.9`) or a cubin; PATTERN a substring of the kernels' (mangled) names.
Compressed fatbin entries are read with the `zstd` command; the registers are the
cubin's EIATTR_REGCOUNT records (what `cuobjdump -res-usage` prints), the shared
memory its `.nv.shared.<kernel>` sections.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, payload size
# kind, _, header size, size, compressed size, _, minor, major, arch, name offset,
# name size, flags, _, uncompressed size
FATBIN_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
ENTRY_ELF = 2
FLAG_ZSTD = 0x8000
FLAG_LZ4 = 0x2000
EIATTR_REGCOUNT = 0x2F
EIATTR_FORMAT_SIZED = 0x04
SECTION = struct.Struct("<IIQQQQIIQQ")
SYMBOL = struct.Struct("<IBBHQQ")


def cubins(data: bytes, arch: int) -> Iterator[bytes]:
    """The cubins for sm_`arch` in `data`: a cubin itself, or a host ELF's fatbins."""
    if data[18:20] == struct.pack("<H", 190):  # e_machine EM_CUDA
        yield data
        return
    start = data.find(struct.pack("<I", FATBIN_MAGIC))
    while start >= 0:
        _, _, header_size, size = FATBIN_HEADER.unpack_from(data, start)
        at, end = start + header_size, start + header_size + size
        while at < end:
            entry = FATBIN_ENTRY.unpack_from(data, at)
            kind, entry_header, entry_size, packed = entry[0], entry[2], entry[3], entry[4]
            flags, unpacked = entry[11], entry[13]
            if kind == ENTRY_ELF and entry[8] == arch:
                payload = data[at + entry_header : at + entry_header + entry_size]
                yield _unpacked(payload, flags, packed, unpacked)
            at += entry_header + entry_size
        start = data.find(struct.pack("<I", FATBIN_MAGIC), end)


def _unpacked(payload: bytes, flags: int, packed: int, unpacked: int) -> bytes:
    if flags & FLAG_ZSTD:
        done = subprocess.run(
            ["zstd", "-d", "-c"], input=payload[:packed], capture_output=True, check=True
        )
        return done.stdout
    if flags & FLAG_LZ4:
        raise ValueError("LZ4-compressed fatbin entries are not read; use cuobjdump")
    return payload[:unpacked] if unpacked else payload


def kernel_resources(cubin: bytes) -> dict[str, dict[str, int]]:
    """Each kernel's registers a thread and static shared bytes in one cubin."""
    (section_at,) = struct.unpack_from("<Q", cubin, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [SECTION.unpack_from(cubin, section_at + i * entry_size) for i in range(count)]

    def text(table_at: int, offset: int) -> str:
        return cubin[table_at + offset : cubin.index(b"\0", table_at + offset)].decode()

    names = [text(sections[names_index][4], section[0]) for section in sections]
    symbol_table = sections[names.index(".symtab")]
    symbol_names = sections[symbol_table[6]][4]
    symbols = [
        text(symbol_names, SYMBOL.unpack_from(cubin, symbol_table[4] + at)[0])
        for at in range(0, symbol_table[5], SYMBOL.size)
    ]
    found: dict[str, dict[str, int]] = {}
    for name, section in zip(names, sections, strict=True):
        if name.startswith(".nv.shared."):
            found.setdefault(name[len(".nv.shared.") :], {})["static_shared"] = section[5]
        if name != ".nv.info":
            continue
        at, end = section[4], section[4] + section[5]
        while at < end:
            record_format, attribute, size = cubin[at], cubin[at + 1], 0
            if record_format == EIATTR_FORMAT_SIZED:
                (size,) = struct.unpack_from("<H", cubin, at + 2)
                if attribute == EIATTR_REGCOUNT:
                    symbol, registers = struct.unpack_from("<II", cubin, at + 4)
                    found.setdefault(symbols[symbol], {})["registers"] = registers
            at += 4 + size
    # shared sections that are no kernel's (`.nv.shared.reserved.0`) have no registers
    return {name: used for name, used in found.items() if "registers" in used}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", type=Path)
    parser.add_argument("pattern")
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args(argv)
    rows = {}
    for cubin in cubins(args.library.read_bytes(), args.arch):
        for name, used in kernel_resources(cubin).items():
            if args.pattern in name:
                rows[name] = used
    if not rows:
        print(f"no sm_{args.arch} kernel of {args.library} matches {args.pattern!r}")
        return 1
    print("registers  static shared  kernel")
    for name, used in sorted(rows.items()):
        print(f"{used['registers']:9d}  {used.get('static_shared', 0):13d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
