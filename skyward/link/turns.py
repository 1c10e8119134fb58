"""``Turns``: who reads a worker link next, the caller waiting for a result or the channel's
reader thread.

A reader thread that reads every frame and hands each result to the thread waiting for it
costs every round trip two wake-ups (the reader's, then the caller's) and a turn at the GIL;
on a 2-core VM a thread woken on the other core costs 10-30 µs. So a caller that waits for
its own call reads the link itself while it waits (it "leads"), dispatching every frame
that arrives as the reader thread would: other calls' results, output, requests. Other
callers waiting on the same link meanwhile "follow": they sleep until a frame settles their
call or the leader leaves, and one of them leads next. The reader thread reads whenever
nobody leads, except that it stays parked for ``LINGER`` seconds after a leader left with
nothing in flight, so a loop of calls does not wake it every time; a call nobody waits for
wakes it at once (its result must reach its future, and its callbacks run).

A frame is read whole by one thread (``baton``) and dispatched before the next is read, so
frames are handled in the order they came. A Ctrl-C that lands while a leader reads a frame
leaves the stream torn: ``torn`` is called (the channel kills the worker, whose calls then
fail with ``WorkerLost``) and the interrupt goes on. Waiting, the usual place for a Ctrl-C,
reads nothing and is safe.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from skyward._futures import delivering

# How long the reader thread stays parked after a caller read for itself, nothing in flight.
LINGER = 0.05
# How often a leader looks whether its call was settled by someone else (a timeout, a close).
_CHECK = 0.1

Frame = tuple[Any, list[Any]]


class Turns:
    """Turns at reading one link. ``ready(timeout)``: whether a read would not wait (data,
    or the end of the stream); ``read``: one frame; ``dispatch``: handle one frame;
    ``in_flight``: whether any call on the link is unsettled; ``torn``: a frame was left half
    read."""

    def __init__(
        self,
        *,
        ready: Callable[[float | None], bool],
        read: Callable[[], Frame],
        dispatch: Callable[[Any, list[Any]], None],
        in_flight: Callable[[], bool],
        torn: Callable[[], None],
    ) -> None:
        self._ready = ready
        self._read = read
        self._dispatch = dispatch
        self._in_flight = in_flight
        self._torn = torn
        self._baton = threading.Lock()  # guards: reading a frame, and dispatching it
        self._turn = threading.Condition()  # guards: the fields below
        self._waiting = 0  # callers in wait_for: the leader and its followers
        self._wanted = False  # a call nobody waits for was sent: the reader must read
        self._quiet_until = 0.0  # the reader stays parked until then (see LINGER)
        self._ended: BaseException | None = None  # how the stream ended, once it did

    # ── the reader thread ────────────────────────────────────────────────────────────────

    def run_reader(self) -> None:
        """The reader thread's loop. Returns when the stream ended, raising what ended it
        (``EOFError`` at its end, whoever read that)."""
        while True:
            with self._turn:
                while self._ended is None and (
                    self._waiting or (not self._wanted and time.monotonic() < self._quiet_until)
                ):
                    self._turn.wait(LINGER)
                self._wanted = False
            if self._ended is None:
                self._ready(None)  # without the baton: a caller may take it meanwhile
            with self._baton:
                if self._ended is not None:
                    raise self._ended
                if self._waiting or not self._ready(0):
                    continue  # a caller read it
                try:
                    frame = self._read()
                except BaseException as exc:
                    self._end(exc)
                    raise
                self._dispatch(*frame)
            if self._waiting:
                with self._turn:
                    self._turn.notify_all()  # maybe a follower's result

    def sent(self, waited: bool) -> None:
        """A call was sent; ``waited``: its caller is about to wait for it."""
        if not waited:
            with self._turn:
                self._wanted = True
                self._turn.notify_all()

    # ── callers ──────────────────────────────────────────────────────────────────────────

    def wait_for(self, future: Future[Any], timeout: float | None) -> float | None:
        """Read the link until ``future`` is settled, the stream ends, or ``timeout``
        passes; the time left of ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._turn:
            self._waiting += 1
        try:
            while not future.done() and self._ended is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                if not self._baton.acquire(blocking=False):
                    with self._turn:  # follow: woken when a frame settles a call, or we lead
                        if not future.done() and self._baton.locked() and self._ended is None:
                            self._turn.wait(_CHECK if left is None else min(left, _CHECK))
                    continue
                try:
                    self._lead(future, _CHECK if left is None else min(left, _CHECK))
                finally:
                    self._baton.release()
        finally:
            with self._turn:
                self._waiting -= 1
                if self._waiting:
                    self._turn.notify_all()  # a follower leads next
                elif self._in_flight():
                    self._wanted = True  # calls nobody waits for: the reader reads them
                    self._turn.notify_all()
                else:
                    self._quiet_until = time.monotonic() + LINGER
        return None if deadline is None else deadline - time.monotonic()

    def _lead(self, future: Future[Any], timeout: float) -> None:
        """Read and dispatch what arrives within ``timeout``, until ``future`` is settled.
        Baton held."""
        while not future.done() and self._ended is None and self._ready(timeout):
            try:
                frame = self._read()
            except (EOFError, OSError, ValueError) as exc:
                self._end(exc)
                return
            except Exception as exc:  # a frame we cannot decode: the reader reports it
                self._end(exc)
                return
            except BaseException:  # Ctrl-C mid-frame: where the next frame starts is lost
                self._end(EOFError("a frame was left half read"))
                self._torn()
                raise
            was = getattr(delivering, "active", False)
            delivering.active = True  # callbacks run here too: see CallFuture
            try:
                self._dispatch(*frame)
            finally:
                delivering.active = was
            if self._waiting > 1:
                with self._turn:
                    self._turn.notify_all()  # maybe a follower's result

    def _end(self, how: BaseException) -> None:
        with self._turn:
            if self._ended is None:
                self._ended = how
            self._turn.notify_all()

    def ended(self) -> bool:
        """Whether the stream has ended (its frames are all read)."""
        return self._ended is not None


# ----------------------------------------------------------------------------------------------
# ``Inbox``: a buffered reader of one pipe that can say whether a read would wait.
#
# ``io.BufferedReader`` cannot: it may hold a whole frame read ahead while ``poll`` on its
# descriptor says nothing is there. Both ends of a worker link need the answer, so that the
# thread waiting for a result (or for the next call) reads the frame itself while another
# thread stands by, instead of one thread reading and handing every frame over: on a 2-core
# VM a thread woken on the other core costs 10-30 µs, the largest part of a no-op's round trip.
#
# Standard library only: the worker imports it before anything else.

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
