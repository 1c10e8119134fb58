"""``Turns``: who reads a link next, a thread waiting for what the link will bring or a
standby reader thread. Both ends use it: the client's channel (a caller waiting for its
call's result) and the worker (its main thread waiting for its next call).

A reader thread that reads every frame and hands each one to the thread waiting for it
costs every round trip two wake-ups (the reader's, then the waiter's) and a turn at the
GIL; on a 2-core VM a thread woken on the other core costs 10-30 µs. So a thread that waits
for something the link will bring reads the link itself while it waits (it "leads"),
dispatching every frame that arrives as the reader thread would: other calls' results,
output, requests. Other threads waiting on the same link meanwhile "follow": they sleep
until a frame is dispatched or the leader leaves, and one of them leads next.

The standby reader thread reads whenever nobody leads, except that it stays parked for
``LINGER`` seconds after a leader left, so a loop of calls does not wake it every time:
a waiter that comes back within ``LINGER`` finds it still parked. It reads at once when
it is wanted (``want_reader``: a frame nobody waits for is coming, such as the result of a
call nobody waits for, whose callbacks must run; or a call running on the worker waits for
frames), and stays wanted until a waiter leads again; and when the last leader leaves with
work in flight (``needs_reader``).

::

    waiter:  wait_for(done) ── baton free? ── lead: poll, read, dispatch, until done()
                                └─ taken ───── follow: sleep until a frame or the leader
                                               leaves, then look again
    reader:  parked while someone leads, or for LINGER after; else poll, read, dispatch

A frame is read whole by one thread (``baton``) and dispatched before the next is read, so
frames are handled in the order they came.

Ctrl-C (a waiter on the client's main thread): the waiter runs inside ``hold_interrupts``
(its caller's: ``CallFuture.result``), so its bookkeeping, its reading of a frame and the
frame's dispatch are never split by a ``KeyboardInterrupt``; ``wait_for`` lets one through
only where the waiter blocks holding nothing shared (polling the link, sleeping as a
follower: inside ``interruptible``, which the client's channel sets to ``allow_interrupts``),
so a waiter interrupted anywhere leaves the turns balanced: the reader or a follower takes
over, and every other call's frame is dispatched. Without a hold (a program whose SIGINT
handler is not Python's), an interrupt that lands inside a frame leaves the stream torn:
``torn`` is called (the channel kills the worker, whose calls then fail with
``WorkerLost``) and the interrupt goes on.

``PipeReader`` (below) is the buffered pipe reader both ends read through: it can say
whether a read would wait, which a leader needs and ``io.BufferedReader`` cannot tell.
Standard library only (and the protocol): the worker imports it first. What is the client's
alone, Ctrl-C's hold (``client.interrupts``) and the flag that marks a thread delivering
results (``client.futures.delivering``), the channel hands in (``interruptible``,
``delivering``), so a worker loads neither.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from skyward.link import protocol as proto

# How long the reader thread stays parked after a waiter read for itself.
LINGER = 0.05
# How often a leader whose wait can end without a frame (a client's call timed out or was
# failed by a close, on another thread) looks again.
CHECK = 0.1
# How long a follower with no bound of its own sleeps before it looks again.
FOLLOW = 1.0

Frame = tuple[Any, list[Any]]


def _never() -> bool:
    return False


def _nothing() -> None:
    pass


def _ignore(why: str) -> None:
    pass


class Flag(Protocol):
    """A per-thread flag (a ``threading.local``): ``active`` on a thread while it dispatches
    frames, so that a done-callback run there can tell (``client.futures.delivering``)."""

    active: bool


class _Dispatching(threading.local):
    active = False


# The worker's defaults: no Ctrl-C hold to lift around a wait, and nobody reads the flag.
_NO_HOLD = contextlib.nullcontext()
_UNWATCHED = _Dispatching()


class Turns:
    """Turns at reading one link.

    ``ready(timeout)``: whether a read would not wait (data, or the end of the stream),
    waiting up to ``timeout`` (None: until it would); ``read``: one frame; ``dispatch``:
    handle one frame; ``needs_reader``: whether the reader must read once the last waiter
    leaves (calls nobody waits for are in flight); ``torn(why)``: a waiter left the stream
    unusable (a frame half read, or one it could not decode): end it (the reader thread,
    perhaps polling the pipe, learns it from the pipe's end);
    ``recheck``: how often a leader looks whether its wait ended without a frame (None: it
    cannot); ``unblock``: make a ``ready(None)`` blocked on another thread look again, for
    what a leader read ahead and left buffered (``PipeReader.unblock``); ``read_ahead``:
    whether a read would not wait, found without waiting, by a leader that holds
    interrupts (``PipeReader.read_ahead``); ``interruptible``: what a waiter's blocking waits
    run inside (the client's ``allow_interrupts``); ``delivering``: the flag a leader sets
    while it dispatches a frame. Thread-safe; a waiter on the main thread waits inside
    ``hold_interrupts`` (see the module docstring).
    """

    def __init__(
        self,
        *,
        ready: Callable[[float | None], bool],
        read: Callable[[], Frame],
        dispatch: Callable[[Any, list[Any]], None],
        needs_reader: Callable[[], bool] = _never,
        torn: Callable[[str], None] = _ignore,
        recheck: float | None = None,
        unblock: Callable[[], None] = _nothing,
        read_ahead: Callable[[], bool] = _never,
        interruptible: AbstractContextManager[object] = _NO_HOLD,
        delivering: Flag = _UNWATCHED,
    ) -> None:
        self._ready = ready
        self._read = read
        self._dispatch = dispatch
        self._needs_reader = needs_reader
        self._torn = torn
        self._recheck = recheck
        self._unblock = unblock
        self._read_ahead = read_ahead
        self._interruptible = interruptible
        self._delivering = delivering
        self._baton = threading.Lock()  # guards: reading a frame, and dispatching it
        self._lock = threading.Lock()  # guards: the fields below
        self._sleepers: list[Any] = []  # locks of threads asleep until the next _wake
        self._waiting = 0  # threads in wait_for: the leader and its followers
        self._wanted = False  # the reader must read, until a waiter leads again
        self._quiet_until = 0.0  # the reader stays parked until then (see LINGER)
        self._ended = False  # the stream ended: nothing more is read
        self._ending: BaseException | None = None  # what ended it, if reading did

    # ── the reader thread ────────────────────────────────────────────────────────────────

    def run_reader(self) -> None:
        """The reader thread's loop. Returns once the stream ended, raising what ended it
        if reading did (``EOFError`` at its end, whoever read that)."""
        while True:
            with self._lock:
                if self._ended:
                    break
                left = self._quiet_until - time.monotonic()
                park = self._waiting > 0 or (not self._wanted and left > 0)
                if park:
                    waiter = self._sleeper()
            if park:
                self._sleep(waiter, LINGER if self._waiting else left)
                continue
            self._ready(None)  # without the baton: a waiter may take it meanwhile
            with self._baton:
                if self._ended:
                    break
                # A waiter came (or read it): the frame is its to read.
                if not self._waiting and self._ready(0):
                    try:
                        frame = self._read()
                    except BaseException as exc:
                        self._end(exc)
                        raise
                    self._dispatch(*frame)
            if self._waiting:
                # A follower may wait for that frame, or, come while this thread held the
                # baton, sleep until it is free: without a recheck (a worker's idle main
                # thread) nobody else would ever wake it.
                with self._lock:
                    self._wake()
        if self._ending is not None:
            raise self._ending

    def want_reader(self) -> None:
        """The reader must read now, and until a waiter leads again."""
        with self._lock:
            if not self._wanted:
                self._wanted = True
                self._wake()

    # ── waiters ──────────────────────────────────────────────────────────────────────────

    def wait_for(self, done: Callable[[], object], timeout: float | None) -> float | None:
        """Read the link until ``done()``, the stream ends, or ``timeout`` passes; the time
        left of ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        recheck = self._recheck
        with self._lock:
            self._waiting += 1
            self._wanted = False  # the leader reads for everyone meanwhile
        try:
            while not self._ended:
                step = recheck
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    step = left if step is None else min(left, step)
                if self._baton.acquire(False):
                    try:
                        finished = self._lead(done, step)
                    finally:
                        self._baton.release()
                    if finished:
                        break
                    continue
                with self._lock:  # follow: woken by a frame, or to lead
                    finished = bool(done())
                    asleep = not finished and self._baton.locked() and not self._ended
                    if asleep:
                        waiter = self._sleeper()
                if finished:
                    break
                if asleep:
                    # Without a bound (a worker's idle main thread) a follower still looks
                    # again now and then: a wake-up lost to a race nobody has found yet then
                    # costs it FOLLOW seconds, never the worker.
                    self._sleep(waiter, FOLLOW if step is None else step)
        finally:
            with self._lock:
                self._waiting = waiting = self._waiting - 1
                if waiting:
                    self._wake()  # a follower leads next
                elif self._needs_reader():
                    self._wanted = True  # calls nobody waits for: the reader reads them
                    self._wake()
                else:
                    self._quiet_until = time.monotonic() + LINGER
            if not waiting:
                # The reader may be polling the pipe while frames this waiter read ahead sit
                # in the buffer: the pipe would never wake it for them.
                self._unblock()
        return None if deadline is None else deadline - time.monotonic()

    def _lead(self, done: Callable[[], object], timeout: float | None) -> bool:
        """Read and dispatch what arrives within ``timeout``, until ``done()``; whether it
        is. Baton held."""
        while not done():
            if self._ended:
                return False
            # A leader that waits without a bound (the worker's idle main thread) has nothing
            # to look at meanwhile: the read itself waits for the frame, one system call
            # instead of a poll and then a read. (Ctrl-C: such a leader holds no interrupts.)
            # A leader with a bound first reads what is there already (a reply that came
            # while it wrote its call): a poll saved, where the two ends share a core.
            if timeout is not None and not self._read_ahead():
                with self._interruptible:  # polling holds nothing shared
                    if not self._ready(timeout):
                        return False
            try:
                frame = self._read()
            except (EOFError, OSError, ValueError) as exc:  # the end: the reader reports it
                self._end(exc)
                return False
            except Exception as exc:  # a frame we cannot decode: the link is unusable
                self._end(exc)
                self._torn(f"a frame from it could not be read ({type(exc).__name__}: {exc})")
                return False
            except BaseException:  # interrupted mid-frame: where the next frame starts is lost
                self._end(EOFError("a frame was left half read"))
                self._torn("the client was interrupted while reading its frame")
                raise
            delivering = self._delivering
            was = delivering.active
            delivering.active = True  # callbacks run here too: see CallFuture
            try:
                self._dispatch(*frame)
            finally:
                delivering.active = was
            if self._waiting > 1:
                with self._lock:
                    self._wake()  # maybe a follower's frame
        return True

    # ── the end ──────────────────────────────────────────────────────────────────────────

    def end(self, how: BaseException | None = None) -> None:
        """The stream is over (the worker read a Shutdown, or reading failed: ``how``)."""
        self._end(how)

    def _end(self, how: BaseException | None) -> None:
        with self._lock:
            if not self._ended:
                self._ended, self._ending = True, how
            self._wake()

    def ended(self) -> bool:
        """Whether the stream has ended (nothing more will be read)."""
        return self._ended

    def close(self, release: Callable[[], None], timeout: float) -> None:
        """End the stream and call ``release`` (close the descriptors ``ready`` polls) once
        no waiter can poll them any more: a leader polls only with the baton, and none takes
        it to read once the stream has ended. For the reader thread, after ``run_reader``
        returned. A leader's poll is bounded by ``recheck``; one that keeps the baton past
        ``timeout`` (a done-callback of the last frame that waits on something else) does
        not hold up the caller: a thread of its own releases once the leader is out."""
        self._end(None)
        if not self._baton.acquire(True, timeout):
            threading.Thread(
                target=self._release_later, args=(release,), name="skyward-close", daemon=True
            ).start()
            return
        try:
            release()
        finally:
            self._baton.release()

    def _release_later(self, release: Callable[[], None]) -> None:
        with self._baton:
            release()

    # ── sleeping ─────────────────────────────────────────────────────────────────────────
    # Each sleeper waits on a lock of its own, which _wake releases. Not a Condition: a
    # Ctrl-C that lands inside Condition.wait can leave its lock released under a `with`
    # that still means to release it; a private lock holds nothing anyone else needs.

    def _sleeper(self) -> Any:
        """A new sleeper, woken by the next ``_wake``. ``_lock`` held."""
        waiter = threading.Lock()
        waiter.acquire()
        self._sleepers.append(waiter)
        return waiter

    def _sleep(self, waiter: Any, timeout: float | None) -> None:
        try:
            with self._interruptible:
                waiter.acquire(True, -1 if timeout is None else max(timeout, 0.0))
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._sleepers.remove(waiter)  # not woken: timed out, or interrupted

    def _wake(self) -> None:
        """Wake every sleeper. ``_lock`` held."""
        for waiter in self._sleepers:
            waiter.release()
        self._sleepers.clear()


# ----------------------------------------------------------------------------------------------
# ``PipeReader``: a buffered reader of one pipe that can say whether a read would wait.
#
# ``io.BufferedReader`` cannot: it may hold a whole frame read ahead while ``poll`` on its
# descriptor says nothing is there. Both ends of a local worker link read through one, so
# that a thread waiting for a frame can lead (see ``Turns``).

_BUFFER = 1 << 16
_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR | select.POLLNVAL


class PipeReader:
    """Reads one descriptor through a 64 KiB buffer. ``readinto`` is for one reader at a
    time (its callers take turns: ``Turns``' baton); ``ready`` and ``unblock`` may be called
    by anyone. The descriptor stays the caller's to close; ``nonblocking`` sets it so."""

    def __init__(self, fd: int, *, nonblocking: bool = False) -> None:
        self._fd = fd
        # Non-blocking (the client's end): a waiter looks for its reply with one read
        # (``read_ahead``), not a poll and then a read; every other read waits for the pipe
        # with a poll when it would block, as a blocking read would wait.
        self._nonblocking = nonblocking
        self._wait: Any = None  # the poll a non-blocking read waits in when it would block
        if nonblocking:
            os.set_blocking(fd, False)
        self._buffer = bytearray(_BUFFER)
        self._view = memoryview(self._buffer)
        self._start = 0  # the buffered bytes are _buffer[_start:_end]
        self._end = 0
        self._polls = threading.local()  # poll objects refuse two threads at once: one each
        # A byte here wakes whoever polls: a thread can wait for the pipe while a leader has
        # read ahead everything the pipe held into the buffer.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Closed by ``close``, once nothing can poll them any more (a thread still polling a
        # closed descriptor, its number reused, would read someone else's bytes); if nobody
        # closes this reader, when it is collected.
        self._closer = weakref.finalize(self, _close_both, self._wake_r, self._wake_w)
        # guards: writing to _wake_w, against close (unblock is called without the baton)
        self._wake_lock = threading.Lock()

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        """Close the wake-up pipe (``fd`` stays the caller's). Idempotent. Only once no
        thread can be in ``ready`` or ``unblock`` any more (``Turns.close``): a descriptor
        closed under a poll may be reused by the time the poll reads it."""
        with self._wake_lock:
            self._closer()

    def ready(self, timeout: float | None = 0.0) -> bool:
        """Whether a read would return without waiting (buffered bytes, data in the pipe, or
        its end), waiting up to ``timeout`` seconds (None: until it would, or ``unblock``).
        A Ctrl-C may land anywhere in it: it changes nothing a reader relies on."""
        if self._end > self._start:
            return True
        poll = getattr(self._polls, "poll", None)
        if poll is None:
            poll = select.poll()
            poll.register(self._fd, _READABLE)
            poll.register(self._wake_r, select.POLLIN)
            self._polls.poll = poll  # stored only once registered
        events = poll.poll(None if timeout is None else max(0, int(timeout * 1000)))
        if len(events) == 1 and events[0][0] == self._fd:
            return True  # the usual answer, without the loop below
        readable = False
        for fd, _ in events:
            if fd == self._wake_r:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
            else:
                readable = True
        return readable or self._end > self._start

    def unblock(self) -> None:
        """Make a ``ready`` waiting on another thread return if bytes are buffered."""
        if self._end > self._start:
            with self._wake_lock:
                if not self._closer.alive:
                    return  # closed: nobody polls any more
                with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
                    os.write(self._wake_w, b"\0")

    def read_ahead(self) -> bool:
        """Whether a read would not wait, found by reading what the pipe holds now into the
        buffer (a non-blocking reader; else only the buffer is looked at). For whoever may
        read (the baton's holder), with interrupts held: bytes read are never dropped."""
        if self._end > self._start:
            return True
        if not self._nonblocking:
            return False
        try:
            got = os.readv(self._fd, [self._buffer])
        except BlockingIOError:
            return False
        self._start, self._end = 0, got
        return True  # bytes, or the end of the stream (0), which the next read reports

    def read_frame(self) -> tuple[Any, list[Any]]:
        """One frame, as ``proto.read_frame`` reads it; from the buffer when it holds the
        frame (the usual case: a small frame arrives whole), without a read per field."""
        frame = self.read_packed()  # a call or a result, whole: the usual frame
        if frame is not None:
            return frame
        message, lengths = self.read_message()
        return message, [self.read_exact(n) for n in lengths]

    def read_packed(self) -> tuple[Any, list[Any]] | None:
        """The next frame if it is a call or a result (``proto.parse_frame``) and it is in
        the buffer whole after one read at most (into an empty buffer); else None, nothing
        consumed: ``read_message`` reads it."""
        if self._end == self._start:
            got = self._readv(self._buffer)
            if not got:
                return None  # the end of the stream: the next read reports it
            self._start, self._end = 0, got
        frame = proto.parse_frame(self._buffer, self._start, self._end)
        if frame is None:
            return None
        message, parts, self._start = frame
        return message, parts

    def read_message(self) -> tuple[Any, tuple[int, ...]]:
        """A frame's header and message, as ``proto.read_message`` reads them."""
        if self._end == self._start:  # one read for the lot, mostly the whole frame
            got = self._readv(self._buffer)
            if not got:
                raise EOFError("stream ended after 0 of 4 bytes")
            self._start, self._end = 0, got
        head = proto.parse_message(self._buffer, self._start, self._end)
        if head is None:  # a frame larger than what arrived so far
            return proto.read_message(self.readinto)
        message, lengths, self._start = head
        return message, lengths

    def read_exact(self, n: int) -> bytearray:
        """Exactly ``n`` bytes (``EOFError`` if the stream ends first), in a buffer of their
        own: a part of a frame."""
        start = self._start
        if self._end - start >= n:
            self._start = start + n
            return self._buffer[start : start + n]
        return proto.read_exact(self.readinto, n)

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
            return self._readv(view)
        got = self._readv(self._buffer)
        n = min(got, wanted)
        view[:n] = self._view[:n]
        self._start, self._end = n, got
        return n

    def _readv(self, buffer: memoryview | bytearray) -> int:
        """One read into ``buffer``, waiting for the pipe as a blocking read would."""
        while True:
            try:
                return os.readv(self._fd, [buffer])
            except BlockingIOError:  # non-blocking, and ahead of the writer
                # Not on a round trip's path (a leader reads after read_ahead or ready):
                # a frame that arrives in pieces, the handshake's first read.
                wait = self._wait
                if wait is None:  # one reader at a time (the baton's), so one poll object
                    wait = self._wait = select.poll()
                    wait.register(self._fd, _READABLE)
                wait.poll()


def _close_both(a: int, b: int) -> None:
    for fd in (a, b):
        with contextlib.suppress(OSError):
            os.close(fd)
