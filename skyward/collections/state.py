"""The state behind ``sky.dict``, ``sky.set``, ``sky.counter``, ``sky.queue``,
``sky.barrier`` and ``sky.lock``: it lives in the client, in the pool, and nowhere else.

::

    worker: sky.counter("steps").increment()
        ── Shared(id, "counter", "steps", "increment") + args ──>  channel reader thread
                                                                    SharedState.handle
        <── SharedReply(id, ok) + value ──────────────────────────  reply(...), now or later

The pool hands a worker's request to ``serve`` (from the thread reading that worker's link);
the pool's own process calls ``request``. Every request is handled at once, under one lock,
so each operation is atomic and every node sees one order. Requests that wait (a lock held
by another node, an empty queue, a barrier not yet full) leave a waiter, and are answered by
whichever request or timer lets them go. Owners are the workers' channels (and ``"client"``
for the pool's own process): when a worker is lost, ``forget`` releases its locks, drops
what it waited for, and breaks the barriers others wait at (they could wait forever). When
the pool closes, every waiter gets ``PoolClosed``.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from skyward._errors import PoolClosed
from skyward.link import protocol as proto

Reply = Callable[[bool, Any], None]  # (ok, value or exception)


class ReplyChannel(Protocol):
    """A worker's channel (``skyward.link.channel.Channel``), as ``serve`` answers it."""

    def send(self, message: object, payload: proto.Parts | None = None) -> None: ...


@dataclass(eq=False)
class _Barrier:
    parties: int
    waiting: list[tuple[object, Reply]] = field(default_factory=list)


@dataclass(eq=False)
class _Lock:
    holder: tuple[object, str] | None = None  # (owner, the proxy's token)
    waiting: collections.deque[tuple[object, str, Reply]] = field(default_factory=collections.deque)


class SharedState:
    """Thread-safe: every channel's reader thread and the pool's timers call it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards: everything below
        self._dicts: dict[str, dict[Any, Any]] = collections.defaultdict(dict)
        self._sets: dict[str, set[Any]] = collections.defaultdict(set)
        self._counters: dict[str, int] = collections.defaultdict(int)
        self._queues: dict[str, collections.deque[Any]] = collections.defaultdict(collections.deque)
        # a queue's waiting getters, oldest first: (owner, reply, its timer)
        self._getters: dict[str, collections.deque[list[Any]]] = collections.defaultdict(
            collections.deque
        )
        self._barriers: dict[str, _Barrier] = {}
        self._locks: dict[str, _Lock] = collections.defaultdict(_Lock)
        self._closed = False

    def serve(self, channel: ReplyChannel, message: proto.Shared, parts: proto.Parts) -> None:
        """A worker's request, read off ``channel``: answered over it, now or later."""

        def reply(ok: bool, value: Any) -> None:
            try:
                payload = proto.dumps(value) if ok else proto.encode_error(value)
            except BaseException as exc:  # a user's __reduce__, even one calling sys.exit
                ok, payload = False, proto.encode_error(exc)
            channel.send(proto.SharedReply(message.request_id, ok), payload)

        try:
            args = tuple(proto.loads(parts))
        except BaseException as exc:
            # User data, unpickled on a channel's reader thread: even a SystemExit from its
            # __reduce__ is that request's error, never the end of the reader.
            reply(False, _unloadable(exc))
            return
        self.handle(channel, message.kind, message.name, message.op, args, reply)

    def request(self, kind: str, name: str, op: str, args: tuple[Any, ...]) -> Any:
        """A request from the pool's own process (``pool.dict(...)``): its result, or its
        exception raised; waits while the operation does (a lock held elsewhere)."""
        done: Future[tuple[bool, Any]] = Future()
        self.handle("client", kind, name, op, args, lambda ok, value: done.set_result((ok, value)))
        ok, value = done.result()
        if not ok:
            raise value
        return value

    def handle(
        self, owner: object, kind: str, name: str, op: str, args: tuple[Any, ...], reply: Reply
    ) -> None:
        """Do one operation; ``reply`` is called exactly once, now or when it can be."""
        method = getattr(self, f"_{kind}_{op}", None)
        if method is None:
            reply(False, ValueError(f"sky.{kind} has no operation {op!r}"))
            return
        with self._lock:
            if self._closed:
                outcome: tuple[bool, Any] | None = (False, PoolClosed("the pool is closed"))
            else:
                try:
                    outcome = method(owner, name, reply, *args)
                except BaseException as exc:  # a KeyError, a wrong argument, a key's
                    outcome = (False, _unloadable(exc))  # __hash__ calling sys.exit
        if outcome is not None:  # None: a waiter will be answered later
            reply(*outcome)

    # ── dict, set, counter ───────────────────────────────────────────────────────────────

    def _dict_get(self, owner: object, name: str, reply: Reply, key: Any) -> tuple[bool, Any]:
        data = self._dicts[name]
        return (True, data[key]) if key in data else (False, KeyError(key))

    def _dict_set(self, owner: object, name: str, reply: Reply, key: Any, value: Any) -> Any:
        self._dicts[name][key] = value
        return True, None

    def _dict_delete(self, owner: object, name: str, reply: Reply, key: Any) -> Any:
        del self._dicts[name][key]
        return True, None

    def _dict_contains(self, owner: object, name: str, reply: Reply, key: Any) -> Any:
        return True, key in self._dicts[name]

    def _dict_update(self, owner: object, name: str, reply: Reply, items: Any) -> Any:
        self._dicts[name].update(items)
        return True, None

    def _dict_pop(self, owner: object, name: str, reply: Reply, key: Any, default: Any) -> Any:
        return True, self._dicts[name].pop(key, default)

    def _dict_snapshot(self, owner: object, name: str, reply: Reply) -> Any:
        return True, dict(self._dicts[name])

    def _set_add(self, owner: object, name: str, reply: Reply, value: Any) -> Any:
        self._sets[name].add(value)
        return True, None

    def _set_discard(self, owner: object, name: str, reply: Reply, value: Any) -> Any:
        self._sets[name].discard(value)
        return True, None

    def _set_contains(self, owner: object, name: str, reply: Reply, value: Any) -> Any:
        return True, value in self._sets[name]

    def _set_len(self, owner: object, name: str, reply: Reply) -> Any:
        return True, len(self._sets[name])

    def _counter_add(self, owner: object, name: str, reply: Reply, amount: int) -> Any:
        self._counters[name] += amount
        return True, self._counters[name]

    def _counter_reset(self, owner: object, name: str, reply: Reply, value: int) -> Any:
        self._counters[name] = value
        return True, value

    # ── queue ────────────────────────────────────────────────────────────────────────────

    def _queue_put(self, owner: object, name: str, reply: Reply, value: Any) -> Any:
        getters = self._getters[name]
        if getters:  # the oldest waiting getter takes it directly
            _, waiter, timer = getters.popleft()
            if timer is not None:
                timer.cancel()
            waiter(True, value)
        else:
            self._queues[name].append(value)
        return True, None

    def _queue_get(
        self, owner: object, name: str, reply: Reply, timeout: float | None
    ) -> tuple[bool, Any] | None:
        if self._queues[name]:
            return True, self._queues[name].popleft()
        if timeout is not None and timeout <= 0:
            return True, None
        entry: list[Any] = [owner, reply, None]
        if timeout is not None:
            entry[2] = timer = threading.Timer(timeout, self._give_up, (name, entry))
            timer.daemon = True
            timer.start()
        self._getters[name].append(entry)
        return None

    def _give_up(self, name: str, entry: list[Any]) -> None:
        with self._lock:
            try:
                self._getters[name].remove(entry)
            except ValueError:
                return  # a put took it first
        entry[1](True, None)  # skyward 0.5: None when the timeout passes

    def _queue_len(self, owner: object, name: str, reply: Reply) -> Any:
        return True, len(self._queues[name])

    # ── barrier, lock ────────────────────────────────────────────────────────────────────

    def _barrier_wait(self, owner: object, name: str, reply: Reply, parties: int) -> Any:
        barrier = self._barriers.setdefault(name, _Barrier(parties))
        if barrier.parties != parties:
            return False, ValueError(
                f"barrier {name!r} has {barrier.parties} parties, not {parties}"
            )
        barrier.waiting.append((owner, reply))
        if len(barrier.waiting) < parties:
            return None
        released, barrier.waiting = barrier.waiting, []  # and the next round begins
        for _, waiter in released[:-1]:
            waiter(True, None)
        return True, None

    def _barrier_waiting(self, owner: object, name: str, reply: Reply) -> Any:
        barrier = self._barriers.get(name)
        return True, 0 if barrier is None else len(barrier.waiting)

    def _barrier_reset(self, owner: object, name: str, reply: Reply) -> Any:
        barrier = self._barriers.get(name)
        if barrier is not None:
            self._break(barrier, f"barrier {name!r} was reset while they waited")
        return True, None

    def _lock_acquire(self, owner: object, name: str, reply: Reply, token: str) -> Any:
        lock = self._locks[name]
        if lock.holder is None:
            lock.holder = (owner, token)
            return True, True
        if lock.holder == (owner, token):
            return False, RuntimeError(f"lock {name!r} is already held by this proxy")
        lock.waiting.append((owner, token, reply))
        return None

    def _lock_release(self, owner: object, name: str, reply: Reply, token: str) -> Any:
        lock = self._locks[name]
        if lock.holder != (owner, token):
            return False, RuntimeError(f"release of lock {name!r}, which this proxy does not hold")
        self._hand_over(lock)
        return True, None

    def _hand_over(self, lock: _Lock) -> None:
        lock.holder = None
        if lock.waiting:
            owner, token, waiter = lock.waiting.popleft()
            lock.holder = (owner, token)
            waiter(True, True)

    def _break(self, barrier: _Barrier, why: str) -> None:
        waiting, barrier.waiting = barrier.waiting, []
        for _, waiter in waiting:
            waiter(False, threading.BrokenBarrierError(why))

    # ── lost workers, the pool closing ───────────────────────────────────────────────────

    def forget(self, owner: object, why: str) -> None:
        """A worker is lost: release its locks, drop its waiters, break barriers with
        waiters (whoever they wait for may have been it)."""
        with self._lock:
            for lock in self._locks.values():
                lock.waiting = collections.deque(w for w in lock.waiting if w[0] != owner)
                if lock.holder is not None and lock.holder[0] == owner:
                    self._hand_over(lock)
            for getters in self._getters.values():
                for entry in [e for e in getters if e[0] == owner]:
                    getters.remove(entry)
                    if entry[2] is not None:
                        entry[2].cancel()
            for name, barrier in self._barriers.items():
                barrier.waiting = [w for w in barrier.waiting if w[0] != owner]
                if barrier.waiting:
                    self._break(barrier, f"barrier {name!r} lost a participant: {why}")

    def close(self) -> None:
        """The pool is closing: every waiter gets ``PoolClosed``; later requests too."""
        with self._lock:
            self._closed = True
            waiters = [w[2] for lock in self._locks.values() for w in lock.waiting]
            waiters += [w for b in self._barriers.values() for _, w in b.waiting]
            for getters in self._getters.values():
                for entry in getters:
                    if entry[2] is not None:
                        entry[2].cancel()
                    waiters.append(entry[1])
        for waiter in waiters:
            waiter(False, PoolClosed("the pool was closed while this waited"))


def _unloadable(exc: BaseException) -> Exception:
    """``exc`` as the error of one request. A ``SystemExit`` or ``KeyboardInterrupt`` raised
    by user data (a ``__reduce__`` or ``__hash__``) is not let out as itself: re-raised in the
    caller it would end a worker's call as if it exited, or the client's program."""
    if isinstance(exc, Exception):
        return exc
    error = RuntimeError(
        f"a value in a shared collection raised {type(exc).__name__}({exc}) while being "
        "unpickled or compared; collections hold plain data"
    )
    error.__cause__ = exc
    return error
