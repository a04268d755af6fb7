"""PyTorch's process-wide TF32 switches under scopes of one math (`library_math`),
shared by the threads of that math."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator

import torch

from pyspk.cuda import CudaMath


class _MathScopes:
    """PyTorch's TF32 switches are process-wide. Scopes of one math share them: any
    number of threads may be inside FP32 scopes (or TF32 ones) at once, so two engines'
    GPU passes of one math overlap; a scope of the other math waits until none is open,
    and while it waits no new thread joins the open math, which then yields to it (so it
    is not starved). A thread alone in its scopes may nest the other math: it switches
    them, and no other thread joins until that inner scope ends. The switches as they
    were before the first scope are restored after the last."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._math: CudaMath | None = None
        self._depth: dict[int, int] = {}  # open scopes per thread
        self._switched = 0  # open inner scopes of the other math (one thread's)
        self._waiting = dict.fromkeys(CudaMath, 0)  # threads waiting to open a scope
        self._last: CudaMath | None = None  # the math of the last scopes to close
        self._before: tuple[bool, bool] = (False, False)
        self._undo = threading.local()  # per thread, per scope: (math to return to, math)

    # The switches are read and written under the lock alone, torch's notice that they
    # are its legacy API silenced there: a filter held for a whole scope would be
    # restored out of order by scopes of other threads that overlap it.
    @staticmethod
    def _set(matmul: bool, cudnn: bool) -> tuple[bool, bool]:
        """Sets the switches; returns them as they were."""
        before = _MathScopes._read()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*TF32")
            torch.backends.cuda.matmul.allow_tf32 = matmul
            torch.backends.cudnn.allow_tf32 = cudnn
        return before

    @staticmethod
    def _wanted(math: CudaMath) -> tuple[bool, bool]:
        return math is CudaMath.TF32, math is CudaMath.TF32

    @staticmethod
    def _read() -> tuple[bool, bool]:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*TF32")
            return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    @classmethod
    def _set_math(cls, math: CudaMath) -> tuple[bool, bool]:
        return cls._set(*cls._wanted(math))

    def enter(self, math: CudaMath) -> None:
        me = threading.get_ident()
        with self._changed:
            while True:
                others_wait = any(n for m, n in self._waiting.items() if m is not math)
                # none open: the math that ran last yields to the other's waiters
                if not self._depth and (self._last is not math or not others_wait):
                    self._math, previous = math, None
                    self._before = self._set_math(math)
                    break
                if self._math is math and (
                    me in self._depth or (self._switched == 0 and not others_wait)
                ):
                    previous = None
                    # set again: work outside every scope may have switched them since
                    # (pyannote's `Pipeline.__call__` turns TF32 off before each file)
                    if self._read() != self._wanted(math):
                        self._set_math(math)
                    break
                if set(self._depth) == {me}:  # this thread alone: it nests the other math
                    previous, self._math = self._math, math
                    self._switched += 1
                    self._set_math(math)
                    break
                self._waiting[math] += 1
                try:
                    self._changed.wait()
                finally:
                    self._waiting[math] -= 1
            self._depth[me] = self._depth.get(me, 0) + 1
        stack = getattr(self._undo, "stack", None)
        if stack is None:
            stack = self._undo.stack = []
        stack.append((previous, math))

    def leave(self) -> None:
        me = threading.get_ident()
        previous, _ = self._undo.stack.pop()
        with self._changed:
            self._depth[me] -= 1
            if self._depth[me] == 0:
                del self._depth[me]
            if previous is not None:
                self._math = previous
                self._switched -= 1
                self._set_math(previous)
            if not self._depth:
                self._math, self._last = None, self._math
                self._set(*self._before)
            self._changed.notify_all()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """This thread's open scopes closed for the block and opened again after it, in
        the same order: a thread that waits there for another thread's work in a scope
        (of its math or not) would otherwise hold it off for good."""
        maths = [math for _, math in getattr(self._undo, "stack", ())]
        for _ in maths:
            self.leave()
        try:
            yield
        finally:
            for math in maths:
                self.enter(math)


_MATH_SCOPES = _MathScopes()


def library_math_released() -> contextlib.AbstractContextManager[None]:
    """This thread's `library_math` scopes closed for the block and opened again after
    it (`_MathScopes.released`)."""
    return _MATH_SCOPES.released()


@contextlib.contextmanager
def library_math(math: CudaMath) -> Iterator[None]:
    """PyTorch's TF32 switches for `math` (on for TF32, off for FP32), restored after
    (without torch's notice that these switches are its legacy API). The switches are
    the process's, not the thread's: scopes of one math in several threads run together,
    and a scope of the other math waits until they have all ended (a thread alone in its
    scopes may nest either), so an FP32 scope is FP32 whatever other threads' scopes
    ask. PyTorch work outside any scope still sees the switches as the scopes open at the
    time set them; where such work changed them meanwhile, the next scope to open sets
    them again."""
    _MATH_SCOPES.enter(math)
    try:
        yield
    finally:
        _MATH_SCOPES.leave()
