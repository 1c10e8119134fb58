"""Signal dispositions: how the suite was launched must not decide what its signal tests see.

A non-interactive shell starts ``cmd &`` with SIGINT and SIGQUIT ignored, and ``nohup`` adds
SIGHUP. An ignored disposition survives ``fork`` and ``exec``, so every process the suite
starts inherits it, and Python installs no ``KeyboardInterrupt`` handler for a SIGINT that
starts ignored: a test that interrupts the main thread, or signals a client it started, then
sees nothing happen. (``grep SigIgn /proc/PID/status``: bit 0 is SIGHUP, bit 1 SIGINT.)

- This process: ``restore_sigint`` (the conftest, at import) gives SIGINT Python's own
  handler, as a run from a terminal has. SIGHUP stays as launched: under ``nohup`` the run is
  meant to outlive its terminal, and a test that needs it handled sets that for its own
  duration (``handled_by_default``).
- A child a test signals: ``Popen(..., preexec_fn=as_from_a_terminal)`` starts it with the
  default disposition of every signal a launcher may have ignored, as a program started
  from a terminal, whatever the suite's own.

The product's rule is the other way round, and tests check it: a signal the user's program
ignores stays ignored (``skyward.pool.signals``, ``skyward._interrupts``).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

# What shells, nohup and CI wrappers start a job with ignored, and SIGTERM, which tests send.
LAUNCHER_IGNORED = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM)


def restore_sigint() -> None:
    """Give this process Python's ``KeyboardInterrupt`` handler if it started with SIGINT
    ignored (``cmd &``, ``nohup``). Main thread only, as ``signal.signal`` is."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def as_from_a_terminal() -> None:
    """A ``preexec_fn``: the child starts with ``LAUNCHER_IGNORED`` at their defaults (a
    Python child then installs its own SIGINT handler, as when run from a terminal)."""
    for signum in LAUNCHER_IGNORED:
        signal.signal(signum, signal.SIG_DFL)


@contextmanager
def handled_by_default(*signums: int) -> Iterator[None]:
    """``signums`` at their default disposition in this process while the block runs (a
    test of what a program does with a signal it has not ignored), then back as they were."""
    previous = {signum: signal.signal(signum, signal.SIG_DFL) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
