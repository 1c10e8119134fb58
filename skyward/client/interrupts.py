"""Ctrl-C held back while the client keeps its books, and let through where it waits.

Python runs a SIGINT handler on the main thread between any two bytecodes, so the
``KeyboardInterrupt`` it raises can land between two steps that must go together (a call
registered on its link and counted on its node; a frame read and its result handed over),
or inside the standard library's ``Future`` while it holds its lock
(``threading.Condition.__enter__`` is Python code: an interrupt there leaves the lock held
for good, and the next thread to settle that future waits forever). Catching the interrupt
at a few places cannot close every such gap; holding it back can::

    with hold_interrupts:         # main thread: a SIGINT is recorded, not raised
        ...the books...
        with allow_interrupts:    # a blocking wait that holds nothing shared:
            poll(fd, timeout)     # a SIGINT (held or new) is raised here, at once
        ...the books...
    # leaving the outermost hold: a SIGINT recorded meanwhile reaches the program's own
    # handler now (Python's default raises KeyboardInterrupt), as if it had arrived now

So a Ctrl-C still ends a wait at once, and the books are never left half written. Holds
nest (the inner ones cost a counter); a wait that is not inside ``allow_interrupts`` (a
frame being read, a done-callback running) delays a Ctrl-C until it ends.

Off the main thread both are no-ops: Python delivers signals to the main thread only. With
no Python handler for SIGINT (``SIG_IGN``; ``SIG_DFL``, which ends the process) there is
nothing to hold back. Standard library only: the worker's link shares ``turns``.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

# The C functions behind signal.getsignal and signal.signal, which wrap them in enum
# conversions that cost microseconds (a ValueError raised and caught per call).
_c_signal = importlib.import_module("_signal")
_getsignal: Callable[[int], Any] = _c_signal.getsignal
_setsignal: Callable[[int, Any], Any] = _c_signal.signal
_SIGINT = int(signal.SIGINT)
_get_ident = threading.get_ident
_main = threading.main_thread().ident


class _State:
    """The main thread's hold; touched by the main thread (and its signal handler) only."""

    __slots__ = ("deferred", "depth", "open", "pending", "previous")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.depth = 0  # holds entered and not left
        self.previous: Any = None  # the program's handler, while ours stands in for it
        self.pending = False  # a SIGINT arrived while held
        self.deferred = False  # one was let through, answered, and is raised at the end
        self.open = False  # inside allow_interrupts: a SIGINT goes through at once


_state = _State()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if _state.open:
        _state.open = False  # the wait it ends is over: hold again from here on
        _state.previous(signum, frame)
    else:
        _state.pending = True


class _Hold:
    __slots__ = ()

    def __enter__(self) -> None:
        if _get_ident() != _main:
            return
        if _state.depth:
            _state.depth += 1
            return
        _state.pending = False
        _state.deferred = False
        _state.open = False
        previous = _getsignal(_SIGINT)
        if callable(previous) and previous is not _on_sigint:
            # Raises a SIGINT that was already waiting, before anything is held: fine.
            _setsignal(_SIGINT, _on_sigint)
            _state.previous = previous
        _state.depth = 1

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if _get_ident() != _main:
            return
        _state.depth -= 1
        if _state.depth:
            return
        previous, _state.previous = _state.previous, None
        if previous is None:
            return
        # Until it is replaced, our handler records: nothing raises in these lines.
        if _getsignal(_SIGINT) is _on_sigint:
            _setsignal(_SIGINT, previous)
            handler = previous
        else:  # a done-callback installed its own meanwhile: it stays
            handler = _getsignal(_SIGINT)
        if _state.pending or _state.deferred:
            _state.pending = _state.deferred = False
            # Already leaving on a KeyboardInterrupt: that one answers the Ctrl-C.
            if (kind is None or not issubclass(kind, KeyboardInterrupt)) and callable(handler):
                handler(_SIGINT, sys._getframe(1))


class _Allow:
    __slots__ = ()

    def __enter__(self) -> None:
        if _get_ident() != _main or _state.previous is None:
            return
        _state.open = True  # first: a SIGINT from here on goes through
        if _state.pending:
            _state.pending = False
            _state.open = False
            _state.previous(_SIGINT, sys._getframe(1))

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if _get_ident() == _main:
            _state.open = False


# Module-level instances: entering one costs no allocation, and they hold no state of their own.
hold_interrupts = _Hold()
allow_interrupts = _Allow()


def raise_at_end() -> None:
    """A ``KeyboardInterrupt`` let through by ``allow_interrupts`` was caught and answered
    where it landed (a clean-up noted it and went on): raise one again when the outermost
    hold ends, so the program still learns of the Ctrl-C. Nothing outside a hold or off
    the main thread: there the catcher's answer is the whole answer."""
    if _get_ident() == _main and _state.depth and _state.previous is not None:
        _state.deferred = True


def holding() -> bool:
    """Whether this thread is inside ``hold_interrupts`` (always False off the main thread)."""
    return _get_ident() == _main and _state.depth > 0


def _after_fork() -> None:
    # The forking thread is the child's main thread, and no hold survives into it.
    global _main
    _main = threading.main_thread().ident
    if _getsignal(_SIGINT) is _on_sigint and _state.previous is not None:
        _setsignal(_SIGINT, _state.previous)
    _state.reset()


os.register_at_fork(after_in_child=_after_fork)
