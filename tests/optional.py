"""Optional packages for the tests: skipped where missing, and also where present but
unloadable (a compiled library that fails to load raises OSError, which
`pytest.importorskip` lets through: a torchaudio built for another PyTorch stopped the
whole suite at collection)."""

from __future__ import annotations

from types import ModuleType

import pytest


def importorskip(name: str, reason: str | None = None) -> ModuleType:
    """`pytest.importorskip(name)`, skipping also when the import raises OSError."""
    try:
        return pytest.importorskip(name, reason=reason)
    except OSError as error:
        pytest.skip(
            f"{name} is installed but will not load ({error}): install builds that match "
            "the installed PyTorch",
            allow_module_level=True,
        )


def required(name: str, demanded_by: str) -> ModuleType:
    """`importorskip(name)`, but a failure where the environment variable `demanded_by`
    is 1 (a device run that carries the package must not pass by skipping)."""
    import importlib
    import os

    if os.environ.get(demanded_by) != "1":
        return importorskip(name)
    try:
        return importlib.import_module(name)
    except (ImportError, OSError) as error:
        pytest.fail(f"{demanded_by}=1 but {name} will not import: {error}", pytrace=False)
