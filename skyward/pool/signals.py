"""SIGTERM and SIGHUP close open pools the way Ctrl-C does, then end the process as the signal
would have.

Without this, a job scheduler's cancel (SIGTERM), a closed terminal (SIGHUP) or ``kill PID``
ends the client at once: its machines, security group and key pair stay until a watchdog
or ``skyward down`` removes them. While at least one pool is open (``hold`` at start,
``release`` at close), in the main thread only::

    SIGTERM / SIGHUP ─> handler ─> raise Terminated (a KeyboardInterrupt) where the main
                                   thread is: a provider mid-start, a call being waited for
                       the stack unwinds ─> `with pool:` / close ─> the shielded teardown,
                                   exactly as after Ctrl-C (a second signal is noted, not obeyed)
                       uncaught ─> at exit: the default handler back, the signal sent again:
                                   the process ends as killed by it (shells show 143 / 129)

- A signal that was ignored (``nohup`` ignores SIGHUP) stays ignored: nothing is installed.
- A handler of the user's, installed before the pool, is called in our place: it decides
  (raising, or ``sys.exit``, unwinds through the pool and closes it like any exception).
- When the last pool closes, the handlers that were there come back, unless someone
  replaced ours meanwhile (theirs stays). A pool closed from another thread cannot touch
  signal handlers; ours then stays, and with no pool open acts as the one it replaced.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Any

from skyward._errors import Terminated

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s)

_lock = threading.Lock()  # guards: _holders, _previous
_holders: set[int] = set()  # id() of each open pool that asked
_previous: dict[int, Any] = {}  # signal -> the handler ours replaced
_raised: list[Terminated] = []  # main thread only (the handler's)


def hold(owner: object) -> None:
    """``owner`` (a pool) is open: SIGTERM and SIGHUP raise ``Terminated`` from now on.
    A no-op outside the main thread, where Python cannot install handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        if not _holders:
            _install()
        _holders.add(id(owner))


def release(owner: object) -> None:
    """``owner`` closed; the last one out puts the previous handlers back. Idempotent."""
    with _lock:
        if id(owner) not in _holders:
            return
        _holders.discard(id(owner))
        if _holders or threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(_previous.items()):
            if signal.getsignal(signum) is _handle:
                signal.signal(signum, previous)
            del _previous[signum]


def _install() -> None:
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if current is _handle:
            continue  # left in place by a release from another thread
        # Ignored (nohup), or set outside Python (None): not ours to change.
        if current is signal.SIG_IGN or current is None:
            continue
        signal.signal(signum, _handle)
        _previous[signum] = current


def _handle(signum: int, frame: Any) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)  # the user's own handler decides
        return
    if not _holders:
        _die(signum)  # no pool open: as if we had never been here
    error = Terminated(signum)
    _raised.append(error)
    raise error


def _die(signum: int) -> None:
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _end_as_signalled() -> None:
    """At exit: if a ``Terminated`` of ours ended the program (uncaught, possibly under
    an error raised while unwinding from it), end as killed by its signal."""
    if not _raised:
        return
    seen: BaseException | None = getattr(sys, "last_value", None)
    while seen is not None:
        if isinstance(seen, Terminated) and any(seen is r for r in _raised):
            sys.stdout.flush()
            sys.stderr.flush()
            _die(seen.signal)
        seen = seen.__context__


# Registered when the pool module is first imported, before any pool registers its own
# close at exit: atexit runs the latest first, so the pools close before this ends the
# process.
atexit.register(_end_as_signalled)
