"""What a plugin's ``around_app`` may ask of the worker it runs in.

::

    C-level and Python writes to fd 1 ──> stdout forwarder ──> filters ──> Log frames
    Shutdown from the client ──> reader thread ──> stop handlers ──> (interrupt the call)

Both hooks live for a ``with`` block, entered inside ``around_app``: the jax plugin uses them
to drop gloo's connection chatter and to keep JAX's own shutdown logs off the user's
terminal when the pool stops a rank in the middle of a call. ``replaced()`` says, while the
contexts are left, whether the pool is replacing this worker (a gang restart) rather than
closing: the mps plugin then leaves the node's daemon to the workers that come next.
Worker-side only, standard library only; outside a worker nothing ever calls them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# A filter gets what a worker wrote to fd 1 (whole writes of up to 4 KiB arrive in one
# piece: a pipe never splits them) and returns what the client should see.
StdoutFilter = Callable[[bytes], bytes]
# A stop handler learns that the client asked the worker to exit; ``running`` says a call
# is being cut short. It runs on the worker's reader thread, before the call is interrupted.
StopHandler = Callable[[bool], None]

# Registered from around_app (main thread), read from the forwarder and reader threads:
# whole-list replacement keeps every reader on a consistent tuple without a lock.
_stdout_filters: tuple[StdoutFilter, ...] = ()
_stop_handlers: tuple[StopHandler, ...] = ()
# Set once, by the reader thread, when the pool says it replaces this worker (a gang
# restart); read by plugins' around_app exits on the main thread. A bool needs no lock.
_replaced = False


@contextmanager
def stdout_filter(fn: StdoutFilter) -> Iterator[None]:
    """Pass the worker's stdout through ``fn`` for the life of the block."""
    global _stdout_filters
    _stdout_filters = (*_stdout_filters, fn)
    try:
        yield
    finally:
        _stdout_filters = tuple(f for f in _stdout_filters if f is not fn)


@contextmanager
def on_stop(fn: StopHandler) -> Iterator[None]:
    """Call ``fn`` when the client asks this worker to exit, during the block."""
    global _stop_handlers
    _stop_handlers = (*_stop_handlers, fn)
    try:
        yield
    finally:
        _stop_handlers = tuple(f for f in _stop_handlers if f is not fn)


def filter_stdout(data: bytes) -> bytes:
    for fn in _stdout_filters:
        data = fn(data)
    return data


def replacing() -> None:
    """The pool kills this worker next and starts another in its place."""
    global _replaced
    _replaced = True


def replaced() -> bool:
    """Whether this worker stops to be replaced (a gang restart) rather than because the
    pool closes: what it keeps for the node's workers (a daemon) must then stay."""
    return _replaced


def stopping(running: bool) -> None:
    """Tell every stop handler; one that fails says so on stderr and the others still run."""
    for fn in _stop_handlers:
        try:
            fn(running)
        except Exception as exc:  # a plugin's bug must not keep the worker from stopping
            os.write(2, f"skyward: a stop handler failed: {exc!r}\n".encode())
