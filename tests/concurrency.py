"""Running one function on several threads at once, for the tests of concurrent use."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable


def run_together(target: Callable[..., object], arguments: Iterable[tuple]) -> None:
    """Calls `target(*args)` for each tuple of `arguments`, each on its own thread, all
    started before any is joined; returns once every one has ended."""
    threads = [threading.Thread(target=target, args=args) for args in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
