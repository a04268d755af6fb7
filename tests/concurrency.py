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


def on_two_streams(torch, call: Callable, inputs: list, repeats: int = 3) -> list[list]:
    """`call(x)` for each of two `inputs`, `repeats` times each, the two on their own
    threads and their own CUDA streams at once: the results, per input."""
    got: dict[int, list] = {}

    def work(index: int) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            got[index] = [call(inputs[index]) for _ in range(repeats)]
        stream.synchronize()

    run_together(work, [(index,) for index in range(len(inputs))])
    return [got[index] for index in range(len(inputs))]


def assert_serial_bits_on_two_streams(torch, call: Callable, inputs: list) -> None:
    """`call(x)` on each of two `inputs` at once (`on_two_streams`) gives, every time,
    the bits it gives on its own first on the caller's stream."""
    serial = [call(x) for x in inputs]
    for index, results in enumerate(on_two_streams(torch, call, inputs)):
        assert all(torch.equal(y, serial[index]) for y in results), f"input {index}"
