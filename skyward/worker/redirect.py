"""``sky.redirect_output(callback)`` and ``sky.CallbackWriter``: a function's prints handed
to a callback instead of the node's output (skyward 0.5's names).

::

    @sky.compute
    def train():
        lines = []
        with sky.redirect_output(lines.append) as (out, err):
            print("epoch 1")                 # lines == ["epoch 1", "\\n"]
        return out.getvalue()                # "epoch 1\\n"

It runs wherever it is called, a worker or the client, and replaces ``sys.stdout`` and
``sys.stderr`` for the whole process while the block runs, as ``contextlib.redirect_stdout``
does: with ``concurrency > 1``, the other calls' prints go to the callback too (``@sky.stdout``
/ ``@sky.silent`` mute per thread instead). Only Python-level writes are redirected; a C
extension writing to file descriptor 1 itself still reaches the node's output.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator


class CallbackWriter(io.TextIOBase):
    """A text stream that hands each string written to ``callback``, and keeps it:
    ``getvalue()`` is everything written so far."""

    def __init__(self, callback: Callable[[str], object]) -> None:
        super().__init__()
        self._callback = callback
        self._kept = io.StringIO()

    def write(self, s: str) -> int:
        self._callback(s)
        return self._kept.write(s)

    def getvalue(self) -> str:
        return self._kept.getvalue()

    def writable(self) -> bool:
        return True


@contextlib.contextmanager
def redirect_output(
    callback: Callable[[str], object],
) -> Iterator[tuple[CallbackWriter, CallbackWriter]]:
    """Send what ``print`` and ``sys.stderr`` writes receive to ``callback`` while the block
    runs; yields the ``(stdout, stderr)`` writers."""
    out, err = CallbackWriter(callback), CallbackWriter(callback)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err
