"""Small pieces every layer uses to wait: settling futures, one future for many, running a
function over items on threads, and a ``Deadline`` that can also be cancelled.

A leaf of the client's side (it imports only ``_errors`` and ``client.interrupts``), so the
pool, the channel and providers share it without importing each other.

Settling and waiting are safe against Ctrl-C (``client.interrupts``): what they change is changed
whole, and the only place a ``KeyboardInterrupt`` can land is the wait itself.
"""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol, TypeVar

from skyward._errors import PoolClosed, ProvisionCancelled, WorkerLost
from skyward.client.interrupts import allow_interrupts, hold_interrupts

T = TypeVar("T")
U = TypeVar("U")

# How long a group that failed with an ordinary error waits for a WorkerLost from another
# of its calls before reporting that error. When a JAX rank dies mid-collective, its peers'
# collectives often fail first ("Gloo all-reduce failed: connection reset by peer"): the
# consequence would beat the cause, a dead node, to the caller by a few milliseconds.
LOSS_GRACE = 2.0
# How often a wait on threads looks at its deadline's cancel flag.
_POLL = 0.05
# A future's states once it is settled (``concurrent.futures._base``'s names).
_SETTLED = frozenset(("CANCELLED", "CANCELLED_AND_NOTIFIED", "FINISHED"))
_sleepers_lock = threading.Lock()  # guards: every CallFuture's _sleepers, and making its _made
_RLock = _thread.RLock  # what threading.RLock() makes, without the factory's frame


class _Delivering(threading.local):
    active = False  # a class default: read on every wait, it must be cheap to find


# Set on the threads that deliver results (the channels' readers): done-callbacks run there,
# and a callback that waited there for another call would wait for itself.
delivering = _Delivering()


class ReadableLink(Protocol):
    """A link a caller may read while it waits for its call there (``Channel``)."""

    def wait_for(self, future: Future[Any], timeout: float | None) -> float | None: ...


class CallFuture(Future[T]):
    """The ``concurrent.futures.Future`` a call hands out.

    Waiting for an unfinished one on the thread that delivers results (inside a
    done-callback) raises at once instead of deadlocking. A call whose caller waits for it
    at once (``>>``, ``run``) has its ``link`` set when it is sent: waiting, the caller reads
    its result off that link itself.

    Safe against Ctrl-C on the main thread: every method a user may call that takes the
    future's lock does so inside ``hold_interrupts`` (``threading.Condition.__enter__`` is
    Python code, and an interrupt landing in it would leave the lock held and the next
    thread to settle this future stuck; ``set_running_or_notify_cancel`` is the pool's, which
    calls it holding interrupts already), and a waiter sleeps on a lock of its own, outside
    the future's, so an interrupt ends the wait and leaves nothing held. ``done``,
    ``running`` and ``cancelled`` read the state without the lock (one attribute read,
    atomic under the GIL).
    """

    # Class defaults, set on an instance only when used: a map makes thousands of these.
    link: ReadableLink | None = None
    _sleepers: list[Any] | None = None  # locks of waiters, released when settled
    _made: threading.Condition | None = None  # Future's condition, once asked for

    def __init__(self) -> None:
        # Future.__init__'s fields, set here (one frame less on every call's path), but for
        # its condition, made only if the standard library's code asks for it (below): the
        # calls' own paths take the lock under it directly, a C-level ``with``.
        self._lock: Any = _RLock()
        self._state = "PENDING"
        self._result = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Callable[[Future[T]], object]] = []

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        """``Future``'s condition, over this future's own lock: made when ``Future``'s code
        first asks (``cancel``, ``concurrent.futures.wait`` and ``as_completed``, ``repr``),
        which most calls' futures never do. Nobody waits on it (``result`` and ``exception``
        sleep on locks of their own), so one made twice by a race would still guard the
        same state with the same lock; the lock below makes that not happen anyway."""
        made = self._made
        if made is None:
            with _sleepers_lock:
                made = self._made
                if made is None:
                    made = self._made = threading.Condition(self._lock)
        return made

    # ── waiting ──────────────────────────────────────────────────────────────────────────

    def result(self, timeout: float | None = None) -> T:
        if self._state == "FINISHED" and self._exception is None:
            return self._result  # type: ignore[return-value]  # settled: no lock needed
        if delivering.active:
            _refuse_reentrant_wait(self)
        with hold_interrupts:
            self._wait(timeout)
            if self._state == "FINISHED" and self._exception is None:
                return self._result  # type: ignore[return-value]  # settled: no lock needed
            return super().result(0)  # failed, cancelled or not settled in time: raises

    def exception(self, timeout: float | None = None) -> BaseException | None:
        _refuse_reentrant_wait(self)
        with hold_interrupts:
            self._wait(timeout)
            if self._state == "FINISHED":
                return self._exception
            return super().exception(0)

    def _wait(self, timeout: float | None) -> None:
        """Until settled or ``timeout`` passes; interrupts held by the caller."""
        if self._state in _SETTLED:
            return
        link = self.link
        if link is not None:
            timeout = link.wait_for(self, timeout)
            if self._state in _SETTLED:
                return
        if timeout is not None and timeout <= 0:
            return
        waiter = threading.Lock()
        waiter.acquire()
        with _sleepers_lock:
            if self._sleepers is None:
                self._sleepers = []
            self._sleepers.append(waiter)
        try:
            # Settled meanwhile: _wake saw the waiter (it looks after the state changed).
            if self._state not in _SETTLED:
                with allow_interrupts:  # holds nothing anyone else needs
                    waiter.acquire(True, -1 if timeout is None else timeout)
        finally:
            with _sleepers_lock:
                if self._sleepers is not None and waiter in self._sleepers:
                    self._sleepers.remove(waiter)

    def _wake(self) -> None:
        # Called after the state changed (see _wait); a cancel() that failed changed nothing.
        if self._state in _SETTLED:
            with _sleepers_lock:
                sleepers, self._sleepers = self._sleepers, None
            for waiter in sleepers or ():
                waiter.release()

    # ── the state, without the lock ──────────────────────────────────────────────────────

    def done(self) -> bool:
        return self._state in _SETTLED

    def running(self) -> bool:
        return self._state == "RUNNING"

    def cancelled(self) -> bool:
        return self._state in ("CANCELLED", "CANCELLED_AND_NOTIFIED")

    # ── changing the state: whole, or not at all ─────────────────────────────────────────

    def set_result(self, result: T) -> None:
        with hold_interrupts:
            try:
                self._settle(result, None)
            finally:
                if self._sleepers:
                    self._wake()

    def set_exception(self, exception: BaseException | None) -> None:
        with hold_interrupts:
            try:
                self._settle(None, exception)
            finally:
                if self._sleepers:
                    self._wake()

    def set_running_or_notify_cancel(self) -> bool:
        # The usual answer under the condition's own lock (a C-level ``with``; the
        # condition's ``__enter__`` is Python code); anything else takes ``Future``'s steps.
        with self._lock:
            if self._state == "PENDING":
                self._state = "RUNNING"
                return True
        return super().set_running_or_notify_cancel()

    def _settle(self, result: Any, exception: BaseException | None) -> None:
        """``Future.set_result`` / ``set_exception``, the same steps under the same lock,
        except that the condition is notified only when a thread waits on it: nobody does
        but ``Future``'s own waits, which ``result`` and ``exception`` do not use (they sleep
        on a lock of their own, ``_sleepers``), and notifying nobody costs a deque and an
        islice on every call. The lock is the condition's, taken directly, and the
        condition is often not made at all."""
        with self._lock:
            if self._state in _SETTLED:
                raise InvalidStateError(f"{self._state}: {self!r}")
            if exception is None:
                self._result = result
            else:
                self._exception = exception
            self._state = "FINISHED"
            for waiter in self._waiters:
                if exception is None:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            condition = self._made
            if condition is not None and condition._waiters:  # type: ignore[attr-defined]
                condition.notify_all()
        if self._done_callbacks:  # mostly none: a call waited for with ``>>``
            self._invoke_callbacks()  # type: ignore[attr-defined]

    def cancel(self) -> bool:
        with hold_interrupts:
            try:
                return super().cancel()
            finally:
                if self._sleepers:
                    self._wake()

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        with hold_interrupts:
            super().add_done_callback(fn)


class Sleepers:
    """Threads asleep until ``wake_all``, each on a lock of its own, so that a Ctrl-C ends a
    sleep at once and leaves nothing held (a ``threading.Condition`` interrupted inside its
    ``wait`` can leave its lock released under a ``with`` that still means to release it).

    The owner registers a sleeper (``sleeper``) while it holds its own lock and has just
    seen that it must wait, lets go of that lock, then ``sleep``s; a thread that changes the
    state under the owner's lock then calls ``wake_all``, so no wake-up is lost. Called
    inside ``hold_interrupts``, the sleep is where a Ctrl-C lands. Thread-safe.
    """

    __slots__ = ("_lock", "_waiting")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: _waiting
        self._waiting: list[Any] = []

    def sleeper(self) -> Any:
        """A new sleeper, woken by the next ``wake_all``."""
        waiter = threading.Lock()
        waiter.acquire()
        with self._lock:
            self._waiting.append(waiter)
        return waiter

    def sleep(self, waiter: Any, timeout: float | None = None) -> None:
        """Until woken or ``timeout`` passes; a Ctrl-C may end it (see the class)."""
        try:
            with allow_interrupts:  # holds nothing anyone else needs
                waiter.acquire(True, -1 if timeout is None else max(timeout, 0.0))
        finally:
            with self._lock:
                if waiter in self._waiting:  # not woken: timed out, or interrupted
                    self._waiting.remove(waiter)

    def wake_all(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            waiter.release()


def _refuse_reentrant_wait(future: Future[Any]) -> None:
    if delivering.active and not future.done():
        raise RuntimeError(
            "waiting for a Skyward call inside a Future's done-callback would deadlock: "
            "callbacks run on the thread that delivers results, so the result you wait for "
            "could never arrive. Wait in another thread (for example, hand the work to a "
            "concurrent.futures.ThreadPoolExecutor from the callback)."
        )


def resolve(future: Future[Any], value: Any) -> None:
    """Settle ``future`` with ``value`` unless it is already done; a Ctrl-C waits for it
    (a ``CallFuture`` holds it back itself)."""
    try:
        if type(future) is CallFuture:
            future.set_result(value)
        else:
            with hold_interrupts:
                future.set_result(value)
    except InvalidStateError:
        pass  # already failed by a timeout or a close


def deliver(future: Future[Any], value: Any) -> None:
    """``resolve``, by the thread that delivers results (a channel's reader thread, or a
    caller reading its own result inside ``CallFuture.result``'s hold): a Ctrl-C cannot
    land here (off the main thread), or is held already, so a ``CallFuture`` is settled
    without holding again."""
    if type(future) is not CallFuture:
        resolve(future, value)
        return
    try:
        future._settle(value, None)
    except InvalidStateError:
        return  # already failed by a timeout or a close, which woke its waiters
    finally:  # a done-callback may raise past Future's own ``except Exception``
        if future._sleepers:
            future._wake()


def fail(future: Future[Any], error: BaseException) -> bool:
    """Fail ``future`` unless it is already done; True if this call failed it. A Ctrl-C
    waits for it (a ``CallFuture`` holds it back itself). A future cancelled while its
    call was queued is told so instead (``notify_cancelled``): failed, the call never runs.
    """
    try:
        if type(future) is CallFuture:
            future.set_exception(error)
        else:
            with hold_interrupts:
                future.set_exception(error)
    except InvalidStateError:
        notify_cancelled(future)
        return False
    return True


def notify_cancelled(future: Future[Any]) -> None:
    """``future`` was cancelled while its call was queued, and the call leaves the queue
    without running: ``Future.set_running_or_notify_cancel``'s other half, which marks it
    cancelled for ``concurrent.futures.wait`` and ``as_completed``. They count a future
    only once notified (as an executor's worker does when it reaches a cancelled item);
    until then they would wait for it for good."""
    if future._state != "CANCELLED":  # mostly: nothing to do
        return
    with hold_interrupts:
        try:
            future.set_running_or_notify_cancel()
        except RuntimeError:  # notified by another thread meanwhile
            pass


class Deadline:
    """When a bounded piece of work must end, and a flag that ends it sooner.

    ``what`` names the bound for messages (``"provision_timeout (900 s)"``). Providers call
    ``check`` between steps and ``sleep`` instead of ``time.sleep`` while they poll, so a
    pool closed from another thread stops them within a poll. Thread-safe.
    """

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds
        self.what = what
        self._end = time.monotonic() + seconds
        self._cancelled = threading.Event()
        self._reason = ""

    def remaining(self) -> float:
        return max(0.0, self._end - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self._end

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self, reason: str) -> None:
        self._reason = reason
        self._cancelled.set()

    def check(self, doing: str) -> None:
        """Raise if cancelled (``ProvisionCancelled``) or past the end (``TimeoutError``)."""
        if self._cancelled.is_set():
            raise ProvisionCancelled(f"{doing}: stopped, {self._reason}")
        if self.expired:
            raise TimeoutError(f"{doing}: not done within {self.what}")

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` or until cancelled or past the end, whichever is first."""
        self._cancelled.wait(max(0.0, min(seconds, self.remaining())))

    def wait(self, future: Future[T], doing: str) -> T:
        """``future.result()``, bounded by this deadline and woken by ``cancel``."""
        while True:
            self.check(doing)
            try:
                return future.result(timeout=min(_POLL, max(self.remaining(), 0.001)))
            except FutureTimeout:
                continue


def _started(fn: Callable[[T], U], items: Sequence[T]) -> list[Future[U]]:
    """``fn(x)`` for every item, each on a daemon thread of its own; their futures."""
    futures: list[Future[U]] = [Future() for _ in items]

    def run(item: T, future: Future[U]) -> None:
        try:
            future.set_result(fn(item))
        except BaseException as exc:
            future.set_exception(exc)

    for item, future in zip(items, futures, strict=True):
        threading.Thread(target=run, args=(item, future), daemon=True).start()
    return futures


def parallel(
    fn: Callable[[T], U], items: Sequence[T], deadline: Deadline | None = None, doing: str = ""
) -> list[U]:
    """``[fn(x) for x in items]`` on daemon threads; the first failure is raised.

    Daemon threads, so a Ctrl-C in the waiting thread is never held up by them; whatever
    they are blocked on is ended by the caller's cleanup. With a ``deadline``, the wait also
    ends when it passes or is cancelled (the threads are left to the same cleanup).
    """
    futures = _started(fn, items)
    combined = gather(futures, list)
    if deadline is None:
        results: list[U] = combined.result()
        return results
    return deadline.wait(combined, doing)


def settle(
    fn: Callable[[T], U], items: Sequence[T], deadline: Deadline | None = None, doing: str = ""
) -> list[Future[U]]:
    """``fn(x)`` for every item on daemon threads, waited for until every one has ended:
    their futures, all done. Unlike ``parallel`` a failure ends no wait, so a caller can
    undo everything that was made (a create still running would refuse its deletion). With
    a ``deadline``, the wait also ends when it passes or is cancelled."""
    futures = _started(fn, items)
    for future in futures:
        ended = _ended(future)
        if deadline is None:
            ended.result()
        else:
            deadline.wait(ended, doing)
    return futures


def _ended(future: Future[Any]) -> Future[None]:
    """A future that ends when ``future`` does, whatever its outcome."""
    ended: Future[None] = Future()
    future.add_done_callback(lambda _: ended.set_result(None))
    return ended


def gather(futures: Sequence[Future[Any]], build: Callable[[list[Any]], Any]) -> Future[Any]:
    """One future for many: their results by position, or the first failure as it happens.

    A ``WorkerLost`` fails the group at once; another error does after ``LOSS_GRACE``
    seconds, or as soon as every call has finished, unless a ``WorkerLost`` comes first.
    """
    out: Future[Any] = CallFuture()
    out.set_running_or_notify_cancel()
    remaining = [len(futures)]
    errors: list[BaseException] = []
    lock = threading.Lock()  # guards: remaining, errors

    def done(future: Future[Any]) -> None:
        if future.cancelled():
            fail(out, PoolClosed("a call of this group was cancelled"))
            return
        error = future.exception()
        if isinstance(error, WorkerLost):
            fail(out, error)
            return
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
            if error is not None:
                errors.append(error)
            first_error = errors[0] if errors else None
            start_grace = error is not None and len(errors) == 1 and not last
        if start_grace:
            assert first_error is not None
            timer = threading.Timer(LOSS_GRACE, fail, (out, first_error))
            timer.daemon = True
            timer.start()
        if last:
            if first_error is not None:
                fail(out, first_error)
            else:
                out.set_result(build([f.result() for f in futures]))

    if not futures:
        out.set_result(build([]))
    for future in futures:
        future.add_done_callback(done)
    return out
