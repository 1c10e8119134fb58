"""The pool's calls: ``run``, ``submit``, ``broadcast``, ``map``, and what the operators use
(``_run_call``, ``_run_calls``, ``_run_group``, ``_broadcast_call``).

A part of ``ComputePool`` (``_pool``), kept apart so that each file stays small: the pool
owns the state these read (``_state``, the scheduler and its lock, the console) and mixes
this class in. Calls are pickled here, outside the lock; only queueing takes it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from skyward._compute import PendingCall, pending_call
from skyward._console import Console
from skyward._errors import PoolClosed
from skyward._futures import gather
from skyward._modules import ship_client_modules
from skyward._scheduler import Scheduler, tasks_for
from skyward._stream import Streams, prepare

R = TypeVar("R")


class PoolCalls:
    """Mixed into ``ComputePool``; these are the pool's fields it reads."""

    _state: str
    _lock: threading.RLock
    _scheduler: Scheduler
    _console: Console
    _streams: weakref.WeakSet[Streams]
    _remote: bool

    @property
    def name(self) -> str:
        raise NotImplementedError  # the pool's

    def run(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """Run ``fn(*args, **kwargs)`` on the least busy node and return its value."""
        result: R = self._run_call(pending_call(fn, args, kwargs), waited=True).result()
        return result

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        """Like ``run`` but returns a ``concurrent.futures.Future`` at once."""
        return self._run_call(pending_call(fn, args, kwargs))

    def broadcast(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> list[R]:
        """Run ``fn(*args, **kwargs)`` on every node; results by node rank."""
        result: list[R] = self._broadcast_call(pending_call(fn, args, kwargs)).result()
        return result

    def map(self, fn: Callable[..., R], iterable: Iterable[Any], /) -> list[R]:
        """``[fn(x) for x in iterable]`` spread over the nodes; results in input order.

        The first failure (in input order) is raised and calls still in the pool's queue
        are cancelled; the few a node with short calls was handed ahead (see
        ``prefetch_depth``) may still run, and their results are dropped.
        """
        calls = [pending_call(fn, (item,), {}) for item in iterable]
        futures = self._run_calls(calls, same_function=True, prefetch=True)
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()

    def _run_call(self, call: PendingCall[R], *, waited: bool = False) -> Future[R]:
        """``waited``: the caller waits for the result at once, reading it itself."""
        return self._run_calls([call], waited=waited)[0]

    def _run_calls(
        self,
        calls: Sequence[PendingCall[Any]],
        *,
        same_function: bool = False,
        prefetch: bool = False,
        waited: bool = False,
    ) -> list[Future[Any]]:
        """Queue calls for the least busy nodes; all are pickled before any is queued.

        ``prefetch`` (a map: the caller waits for the lot, and the first failure fails it)
        lets a node whose recent calls were short hold a few calls more than
        ``concurrency``, so its worker finds the next call waiting instead of idling for a
        round trip.
        """
        self._before_pickling()
        function = calls[0].serialize_function() if same_function and calls else None
        route = self._console.route()
        tasks, futures = tasks_for(calls, function, route, prefetch, self._streams, waited)
        with self._lock:  # once for the lot: reader threads want this lock too
            self._check_running()
            self._scheduler.submit(tasks)
        return futures

    def _run_group(self, calls: Sequence[PendingCall[Any]]) -> Future[tuple[Any, ...]]:
        return gather(self._run_calls(calls), tuple)

    def _broadcast_call(self, call: PendingCall[R]) -> Future[list[R]]:
        if prepare(call, Future())[1] is not None:
            raise TypeError(
                f"{call.name} streams (a generator, or an iterator argument): send it to one "
                f"node with >>; a broadcast of a stream is not supported yet"
            )
        self._before_pickling()
        payload = call.serialize()  # once, for every node
        route = self._console.route()
        with self._lock:
            self._check_running()
            futures = self._scheduler.broadcast(call, payload, route)
        return gather(futures, list)

    def _before_pickling(self) -> None:
        if self._remote:
            ship_client_modules()

    def _check_running(self) -> None:
        if self._state == "running":
            return
        if self._state in ("new", "starting"):
            raise PoolClosed(
                f"pool {self.name!r} is not started: use `with sky.ComputePool(...) as pool:` "
                f"or `pool.start()` before sending calls"
            )
        # draining refuses new calls too, as Executor.shutdown does
        raise PoolClosed(f"pool {self.name!r} is {self._state}: it takes no new calls")
