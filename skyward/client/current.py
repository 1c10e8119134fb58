"""The innermost open pool of each thread: where ``f(x) >> sky`` goes.

skyward 0.5 sent a call written against the module itself (``f(x) >> sky``, ``@ sky``,
``> sky``) to "the active pool". Here that is the pool this thread opened last and has not
closed: a ``with`` block's pool inside another's is the inner one, and a pool opened by
another thread is never picked, so two threads with a pool each never send to each other's.
The pool says when it opens (running) and when it closes; the operators ask ``innermost``.
"""

from __future__ import annotations

import threading

from skyward._errors import PoolClosed

# Pools are only stored and compared here (the operators' module checks what it gets back),
# so this leaf needs neither it nor the pool's.
_lock = threading.Lock()  # guards: _open
_open: list[tuple[int, object]] = []  # (the thread that opened it, the pool), oldest first


def opened(pool: object) -> None:
    """``pool`` runs now, opened by this thread."""
    with _lock:
        _open.append((threading.get_ident(), pool))


def closed(pool: object) -> None:
    """``pool`` is closing (from any thread): it is nobody's open pool any more."""
    with _lock:
        _open[:] = [(thread, p) for thread, p in _open if p is not pool]


def innermost(operator: str) -> object:
    """This thread's innermost open pool; ``PoolClosed`` saying what to write if none."""
    me = threading.get_ident()
    with _lock:
        for thread, pool in reversed(_open):
            if thread == me:
                return pool
    raise PoolClosed(
        f"`f(x) {operator} sky` runs on the innermost pool this thread has open, and none "
        f"is: open one first (`with sky.ComputePool(...):`), or send the call to a pool by "
        f"name (`f(x) {operator} pool`)"
    )
