"""A clean-up that an impatient Ctrl-C (or a SIGTERM) does not cut in half.

::

    caller (main thread)                      skyward-cleanup thread
    ───────────────────────────────────       ──────────────────────────
    shielded(fn) ── start ──────────────────> fn()   (terminate instances, delete groups)
      waits on an Event, 0.2 s at a time       │
      KeyboardInterrupt: noted, wait goes on   │
      (after ``leave_after`` of them: leave)   │
      <───────────────────────────── done.set()┘
    raises fn's error, if any

The wait is an ``Event``, never ``Thread.join``: on Python 3.11 a join interrupted by Ctrl-C
can mark the thread as stopped while it still runs (``_wait_for_tstate_lock`` releases the
thread's lock when the interrupted acquire did not get it), so a loop on ``is_alive()`` would
stop waiting for a clean-up that is still deleting things. The pool's close
(``pool/machines.py``) and the cloud layer's "create, then open, or destroy"
(``providers/cloud/start.py``) both wait this way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from skyward.client.interrupts import allow_interrupts, raise_at_end


def shielded(
    fn: Callable[[], None],
    *,
    name: str = "skyward-cleanup",
    on_interrupt: Callable[[int], None] | None = None,
    leave_after: int | None = None,
) -> None:
    """Run ``fn`` on a thread of its own and wait for it through interrupts; raise what it
    raised.

    Each ``KeyboardInterrupt`` (a subclass too: ``skyward.Terminated``) that lands while
    waiting calls ``on_interrupt(count)`` and the wait goes on. With ``leave_after=N`` the
    Nth one is re-raised (as it came), leaving ``fn`` running; with ``None`` the wait
    always goes on.
    """
    errors: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, name=name)
    interrupts = 0
    started = False
    while True:
        try:
            if not started:  # inside the try: start() waits, and a Ctrl-C may land there
                started = True
                thread.start()
            # Let a Ctrl-C through here even inside a caller's hold (the pool's close holds
            # them): this wait is where it is counted, and the second one leaves.
            with allow_interrupts:
                if done.wait(0.2):
                    break
        except KeyboardInterrupt:
            interrupts += 1
            if leave_after is not None and interrupts >= leave_after:
                raise
            raise_at_end()  # inside a hold (a pool's close): raised once it is done
            if on_interrupt is not None:
                on_interrupt(interrupts)
    if errors:
        raise errors[0]


def finish(fn: Callable[[], None], *, name: str = "skyward-cleanup") -> BaseException | None:
    """``shielded(fn)`` that never leaves early; ``fn``'s error is returned, not raised."""
    try:
        shielded(fn, name=name)
    except BaseException as exc:  # fn's own: with no leave_after, nothing else escapes
        return exc
    return None
