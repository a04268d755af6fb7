"""Setup work run on a thread of its own while the caller goes on: the engine's embedding
side (the embedding model's plans and its forwards' graphs), made while the first file's
segmentation already runs on the GPU. Needs no torch."""

from __future__ import annotations

import threading
from collections.abc import Callable

from pyspk.errors import BackgroundSetupError

__all__ = ["Background"]


class Background:
    """`work()` started at once on a thread named `name` (not a daemon: the interpreter
    waits for it at exit rather than stop it inside a driver call)."""

    def __init__(self, name: str, what: str, work: Callable[[], None]) -> None:
        self.what = what  # for the error: "the embedding setup on cuda:0"
        self._done = threading.Event()
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(work,), name=name).start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as error:  # kept for `wait`, raised in the caller's thread
            self._error = error
        finally:
            self._done.set()

    def ready(self) -> bool:
        """Whether the work has ended without an error (does not wait)."""
        return self._done.is_set() and self._error is None

    def failed(self) -> bool:
        """Whether the work has ended with an error (does not wait)."""
        return self._done.is_set() and self._error is not None

    def settle(self) -> BaseException | None:
        """Waits for the work to end; its error, if any, is returned, not raised."""
        self._done.wait()
        return self._error

    def wait(self) -> None:
        """Waits for the work to end; raises `BackgroundSetupError` if it failed."""
        error = self.settle()
        if error is not None:
            raise BackgroundSetupError(f"{self.what} failed: {error!r}") from error
