"""`ptx_kinds`: a named launch signature as the manifest records its entry, each
parameter's PTX type (pointers travel as u64)."""

from __future__ import annotations

from collections.abc import Sequence


def ptx_kinds(signature: Sequence[tuple[str, str]]) -> list[str]:
    return ["u64" if kind == "ptr" else kind for _, kind in signature]
