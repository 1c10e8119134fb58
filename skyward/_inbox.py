"""``Inbox``: a buffered reader of one pipe that can say whether a read would wait.

``io.BufferedReader`` cannot: it may hold a whole frame read ahead while ``poll`` on its
descriptor says nothing is there. Both ends of a worker link need the answer, so that the
thread waiting for a result (or for the next call) reads the frame itself while another
thread stands by, instead of one thread reading and handing every frame over: on a 2-core
VM a thread woken on the other core costs 10-30 µs, the largest part of a no-op's round trip.

Standard library only: the worker imports it before anything else.
"""

from __future__ import annotations

import os
import select
import threading

_BUFFER = 1 << 16
# poll objects refuse to be polled from two threads at once: each thread has its own.
_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR | select.POLLNVAL


class Inbox:
    """Reads one descriptor through a 64 KiB buffer. ``readinto`` is for one reader at a
    time (its callers take turns under their own lock); ``ready`` may be asked by anyone."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray(_BUFFER)
        self._view = memoryview(self._buffer)
        self._start = 0  # the buffered bytes are _buffer[_start:_end]
        self._end = 0
        self._polls = threading.local()

    def fileno(self) -> int:
        return self._fd

    def ready(self, timeout: float | None = 0.0) -> bool:
        """Whether a read would return without waiting (buffered bytes, data in the pipe, or
        its end), waiting up to ``timeout`` seconds (None: until it would)."""
        if self._end > self._start:
            return True
        poll = getattr(self._polls, "poll", None)
        if poll is None:
            poll = self._polls.poll = select.poll()
            poll.register(self._fd, _READABLE)
        return bool(poll.poll(None if timeout is None else max(0, int(timeout * 1000))))

    def readinto(self, view: memoryview | bytearray) -> int:
        """Up to ``len(view)`` bytes into ``view``; 0 at the end of the stream."""
        wanted = len(view)
        have = self._end - self._start
        if have:
            n = min(have, wanted)
            view[:n] = self._view[self._start : self._start + n]
            self._start += n
            return n
        if wanted >= _BUFFER:  # a large part: straight into its own buffer
            return os.readv(self._fd, [view])
        got = os.readv(self._fd, [self._buffer])
        n = min(got, wanted)
        view[:n] = self._view[:n]
        self._start, self._end = n, got
        return n
