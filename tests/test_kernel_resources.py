"""`tools/kernel_resources.py` on pyspk's own sm_90a trunk cubin: the registers ptxas
reports, read from the cubin alone and from a fatbin holding it, as is and
zstd-compressed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.repo import REPO, load_tool

resources = load_tool("kernel_resources")
kernels = load_tool("kernels")
CUBIN = (REPO / "ptx" / "cubin" / "trunk.sm90.sm_90a.cubin").read_bytes()


def fatbin(payload: bytes, flags: int, unpacked: int, arch: int = 90) -> bytes:
    """A host file's bytes around one fatbin of one ELF entry."""
    header_size = resources.FATBIN_ENTRY.size
    entry = resources.FATBIN_ENTRY.pack(
        resources.ENTRY_ELF, 0, header_size, len(payload), len(payload), 0, 0, 0, arch,
        0, 0, flags, 0, unpacked,
    )  # fmt: skip
    body = entry + payload
    head = resources.FATBIN_HEADER.pack(resources.FATBIN_MAGIC, 1, 16, len(body))
    return b"\x7fELF host bytes" + head + body + b"trailing"


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
def test_registers_are_the_ones_ptxas_reports() -> None:
    log = subprocess.run(
        ["ptxas", "-arch=sm_90a", "-v", str(REPO / "ptx" / "trunk.sm90.ptx"), "-o", "/dev/null"],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    expected = {
        name: used["registers"] for name, used in kernels.parse_resources(log).items() if used
    }
    found = resources.kernel_resources(CUBIN)
    assert {name: used["registers"] for name, used in found.items()} == expected
    # the section holds the 1 KB a block reserves on sm_80 and later beside the kernel's own
    tiles = "spk_trunk_layer1_tiles_f16x3"
    shared = kernels.parse_resources(log)[tiles]["shared_bytes"]
    assert found[tiles]["static_shared"] == shared + 1024


def test_a_fatbins_entry_is_the_cubin_it_holds() -> None:
    assert list(resources.cubins(CUBIN, 90)) == [CUBIN]
    assert list(resources.cubins(fatbin(CUBIN, 0, len(CUBIN)), 90)) == [CUBIN]
    assert list(resources.cubins(fatbin(CUBIN, 0, len(CUBIN), arch=80), 90)) == []


@pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd command")
def test_a_zstd_entry_is_unpacked() -> None:
    packed = subprocess.run(["zstd", "-c"], input=CUBIN, capture_output=True, check=True).stdout
    found = list(resources.cubins(fatbin(packed, resources.FLAG_ZSTD, len(CUBIN)), 90))
    assert found == [CUBIN]


def test_lz4_entries_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="LZ4"):
        list(resources.cubins(fatbin(CUBIN, resources.FLAG_LZ4, len(CUBIN)), 90))
