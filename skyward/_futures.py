"""Small pieces every layer uses to wait: settling futures, one future for many, running a
function over items on threads, and a ``Deadline`` that can also be cancelled.

A leaf module (it imports only ``_errors``), so the pool, the channel and providers share it
without importing each other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol, TypeVar

from skyward._errors import PoolClosed, ProvisionError, WorkerLost

T = TypeVar("T")
U = TypeVar("U")

# How long a group that failed with an ordinary error waits for a WorkerLost from another
# of its calls before reporting that error. When a JAX rank dies mid-collective, its peers'
# collectives often fail first ("Gloo all-reduce failed: connection reset by peer"): the
# consequence would beat the cause, a dead node, to the caller by a few milliseconds.
LOSS_GRACE = 2.0
# How often a wait on threads looks at its deadline's cancel flag.
_POLL = 0.05


# Set on the threads that deliver results (the channels' readers): done-callbacks run there,
# and a callback that waited there for another call would wait for itself.
delivering = threading.local()


class Link(Protocol):
    def wait_for(self, future: Future[Any], timeout: float | None) -> float | None: ...


class CallFuture(Future[T]):
    """The ``concurrent.futures.Future`` a call hands out. Waiting for an unfinished one on
    the thread that delivers results (inside a done-callback) raises at once instead of
    deadlocking. A call whose caller waits for it at once (``>>``, ``run``) has its ``link``
    set when it is sent: waiting, the caller reads its result off that link itself."""

    def __init__(self) -> None:
        super().__init__()
        self.link: Link | None = None

    def result(self, timeout: float | None = None) -> T:
        _refuse_reentrant_wait(self)
        link = self.link
        if link is not None and not self.done():
            timeout = link.wait_for(self, timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        _refuse_reentrant_wait(self)
        return super().exception(timeout)


def _refuse_reentrant_wait(future: Future[Any]) -> None:
    if getattr(delivering, "active", False) and not future.done():
        raise RuntimeError(
            "waiting for a Skyward call inside a Future's done-callback would deadlock: "
            "callbacks run on the thread that delivers results, so the result you wait for "
            "could never arrive. Wait in another thread (for example, hand the work to a "
            "concurrent.futures.ThreadPoolExecutor from the callback)."
        )


def resolve(future: Future[Any], value: Any) -> None:
    try:
        future.set_result(value)
    except InvalidStateError:
        pass  # already failed by a timeout or a close


def fail(future: Future[Any], error: BaseException) -> bool:
    """Fail ``future`` unless it is already done; True if this call failed it."""
    try:
        future.set_exception(error)
    except InvalidStateError:
        return False
    return True


class Cancelled(ProvisionError):
    """Provisioning stopped because the pool was closed (or interrupted) meanwhile."""


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
        """Raise if cancelled (``Cancelled``) or past the end (``TimeoutError``)."""
        if self._cancelled.is_set():
            raise Cancelled(f"{doing}: stopped, {self._reason}")
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


def parallel(
    fn: Callable[[T], U], items: Sequence[T], deadline: Deadline | None = None, doing: str = ""
) -> list[U]:
    """``[fn(x) for x in items]`` on daemon threads; the first failure is raised.

    Daemon threads, so a Ctrl-C in the waiting thread is never held up by them; whatever
    they are blocked on is ended by the caller's cleanup. With a ``deadline``, the wait also
    ends when it passes or is cancelled (the threads are left to the same cleanup).
    """
    futures: list[Future[U]] = [Future() for _ in items]

    def run(item: T, future: Future[U]) -> None:
        try:
            future.set_result(fn(item))
        except BaseException as exc:
            future.set_exception(exc)

    for item, future in zip(items, futures, strict=True):
        threading.Thread(target=run, args=(item, future), daemon=True).start()
    combined = gather(futures, list)
    if deadline is None:
        results: list[U] = combined.result()
        return results
    return deadline.wait(combined, doing)


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
