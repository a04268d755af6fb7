"""The public surface: every name a package's `__all__` lists resolves, and the plan
internals (the producer, its error context, the launch parameter kinds, raw artifact
reads) stay out of it."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "pyspk",
    "pyspk.cuda",
    "pyspk.candidate",
    "pyspk.candidate.segdense",
    "pyspk.cuda.kernels",
    "pyspk.cuda.manifest",
    "pyspk.cuda.buffers",
]
PRIVATE = {
    "pyspk.candidate.segdense": ["Producer", "CONTEXT"],
    "pyspk.cuda.kernels": ["PARAM_KINDS", "read_artifact"],
    "pyspk.cuda": ["PARAM_KINDS", "read_artifact", "Launch"],
}


@pytest.mark.parametrize("name", PACKAGES)
def test_every_listed_name_resolves(name: str) -> None:
    module = importlib.import_module(name)
    missing = [item for item in module.__all__ if not hasattr(module, item)]
    assert not missing, f"{name}.__all__ lists {missing}, which it does not define"


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_internals_are_not_public(name: str) -> None:
    """Not listed; and a package does not even import them into its namespace (a module
    defines them, so there only `__all__` counts)."""
    module = importlib.import_module(name)
    visible = set(module.__all__)
    if hasattr(module, "__path__"):
        visible |= set(dir(module))
    assert not visible & set(PRIVATE[name])


def test_every_error_class_lives_in_pyspk_errors() -> None:
    """Every exception class the importable modules define (the command line's own,
    which never leave it, aside) is in `pyspk.errors`, and none of use is a PlanError."""
    import inspect
    import pkgutil

    import pyspk
    import pyspk.errors as errors

    defined = set()
    for info in pkgutil.walk_packages(pyspk.__path__, "pyspk."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # torch, pyannote or soundfile missing here
            continue
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == info.name:
                defined.add(value)
    internal = {"pyspk.cli.UsageError", "pyspk.cli._arguments.DiarizeError"}
    missing = {
        f"{c.__module__}.{c.__qualname__}"
        for c in defined
        if getattr(errors, c.__name__, None) is not c
    } - internal
    assert not missing
    for use in (errors.InvalidArgument, errors.InferenceOnlyError, errors.WeightsChangedError):
        assert not issubclass(use, errors.PlanError)
    assert issubclass(errors.InvalidArgument, TypeError)
    assert issubclass(errors.InvalidArgument, ValueError)
