"""Distributed collections: ``sky.dict``, ``sky.set``, ``sky.counter``, ``sky.queue``,
``sky.barrier``, ``sky.lock``, shared by every node of a pool and by the client.

::

    @sky.compute
    def step():
        sky.counter("steps").increment()      # on a worker: a request to the pool
    pool.counter("steps").value               # on the client: the same counter

A collection is found by kind and name; the first use creates it. Its state lives in the
client's pool (``skyward.collections.state``), so there is no server to run and nothing
outlives the pool. On a worker, each operation is one round trip over the worker's own link
(``LinkRequester``); on the client, a direct call (``SharedState.request``). Proxies pickle
by name, so one made on the client works when passed to a worker. Every operation is atomic
and strongly consistent (one server, one order); ``consistency=`` is accepted for skyward 0.5
code and changes nothing. Calls in ``executor="process"`` children cannot reach them yet.
"""

from __future__ import annotations

import builtins
import itertools
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from skyward.link import protocol as proto

# (kind, name, operation, arguments) -> the result, or its exception raised
Requester = Callable[[str, str, str, tuple[Any, ...]], Any]


_endpoint: Requester | None = None  # in a worker: its link to the pool
_running: builtins.list[Requester] = []  # in the client: the running pools' states
_running_lock = threading.Lock()  # guards: _running


def _current() -> Requester:
    if _endpoint is not None:
        return _endpoint
    with _running_lock:
        running = builtins.list(_running)
    if len(running) == 1:
        return running[0]
    if not running:
        raise RuntimeError(
            "distributed collections belong to a running pool: use them inside a "
            "@sky.compute function, or as pool.dict(...), pool.counter(...), ..."
        )
    raise RuntimeError("several pools are running here: say which with pool.dict(...) etc.")


class _Shared:
    kind = ""

    def __init__(self, name: str, requester: Requester | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a collection's name is a non-empty string, not {name!r}")
        self.name = name
        self._requester = requester  # None: whichever pool this process belongs to

    def _call(self, op: str, *args: Any) -> Any:
        return (self._requester or _current())(self.kind, self.name, op, args)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name,))  # on a worker, it reaches the pool through its link

    def __getattr__(self, attribute: str) -> Any:
        """skyward 0.5's ``*_async`` methods (``await cache.get_async(k)``): the operation,
        on a thread, so that an event loop never waits on the pool."""
        if not attribute.endswith("_async"):
            raise AttributeError(f"{type(self).__name__} has no attribute {attribute!r}")
        name = _ASYNC_NAMES.get(attribute, attribute.removesuffix("_async"))
        if name == "value":
            sync: Callable[..., Any] = lambda: self.value  # noqa: E731 - a property
        else:
            sync = getattr(self, name)

        async def operation(*args: Any, **kwargs: Any) -> Any:
            import asyncio

            return await asyncio.to_thread(sync, *args, **kwargs)

        return operation

    def __repr__(self) -> str:
        return f"sky.{self.kind}({self.name!r})"


# *_async names whose sync operation is spelled otherwise
_ASYNC_NAMES = {"set_async": "__setitem__", "contains_async": "__contains__"}


class DictProxy(_Shared):
    """A shared dict: ``d[k]``, ``d[k] = v``, ``del d[k]``, ``k in d``, ``get``, ``update``,
    ``pop``; and, since one server holds it, ``len``, ``keys``, ``values``, ``items``."""

    kind = "dict"

    def __getitem__(self, key: Any) -> Any:
        return self._call("get", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._call("set", key, value)

    def __delitem__(self, key: Any) -> None:
        self._call("delete", key)

    def __contains__(self, key: Any) -> bool:
        return bool(self._call("contains", key))

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self._call("get", key)
        except KeyError:
            return default

    def update(self, items: Mapping[Any, Any]) -> None:
        self._call("update", builtins.dict(items))

    def pop(self, key: Any, default: Any = None) -> Any:
        return self._call("pop", key, default)

    def to_dict(self) -> builtins.dict[Any, Any]:
        """A copy of the whole dict, taken atomically."""
        return builtins.dict(self._call("snapshot"))

    def __len__(self) -> int:
        return len(self.to_dict())

    def keys(self) -> Any:
        return self.to_dict().keys()

    def values(self) -> Any:
        return self.to_dict().values()

    def items(self) -> Any:
        return self.to_dict().items()


class SetProxy(_Shared):
    """A shared set: ``v in s``, ``len(s)``, ``add``, ``discard``."""

    kind = "set"

    def __contains__(self, value: Any) -> bool:
        return bool(self._call("contains", value))

    def __len__(self) -> int:
        return int(self._call("len"))

    def add(self, value: Any) -> None:
        self._call("add", value)

    def discard(self, value: Any) -> None:
        self._call("discard", value)


class CounterProxy(_Shared):
    """A shared integer: ``increment(n)``, ``decrement(n)`` (both return the new value),
    ``reset(value)``, ``value``, ``int(c)``."""

    kind = "counter"

    @property
    def value(self) -> int:
        return int(self._call("add", 0))

    def increment(self, n: int = 1) -> int:
        return int(self._call("add", n))

    def decrement(self, n: int = 1) -> int:
        return int(self._call("add", -n))

    def reset(self, value: int = 0) -> None:
        self._call("reset", value)

    def __int__(self) -> int:
        return self.value


class QueueProxy(_Shared):
    """A shared FIFO queue: ``put``, ``get(timeout=None)`` (``None`` once ``timeout``
    seconds pass with nothing to take; waits forever without one), ``empty()``, ``len``.
    Each item goes to one getter, the one waiting longest."""

    kind = "queue"

    def put(self, value: Any) -> None:
        self._call("put", value)

    def get(self, timeout: float | None = None) -> Any:
        return self._call("get", timeout)

    def empty(self) -> bool:
        return len(self) == 0

    def __len__(self) -> int:
        return int(self._call("len"))


class BarrierProxy(_Shared):
    """Where ``n`` participants wait for each other: ``wait()`` returns once ``n`` have
    called it, then the barrier is ready for the next round. ``reset()`` breaks the
    current round: its waiters get ``threading.BrokenBarrierError``."""

    kind = "barrier"

    def __init__(self, name: str, n: int, requester: Requester | None = None) -> None:
        super().__init__(name, requester)
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"a barrier needs n >= 1 participants, not {n!r}")
        self.n = n

    def wait(self) -> None:
        self._call("wait", self.n)

    def reset(self) -> None:
        self._call("reset")

    @property
    def n_waiting(self) -> int:
        """How many participants wait in the current round (``threading.Barrier``'s name)."""
        return int(self._call("waiting"))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.n))


class LockProxy(_Shared):
    """Mutual exclusion across the pool: ``acquire()``, ``release()``, ``with lock:``.
    Not reentrant; the proxy that acquired it releases it."""

    kind = "lock"

    def __init__(self, name: str, requester: Requester | None = None) -> None:
        super().__init__(name, requester)
        self._token = uuid.uuid4().hex  # this proxy, as the holder

    def acquire(self) -> bool:
        return bool(self._call("acquire", self._token))

    def release(self) -> None:
        self._call("release", self._token)

    def __enter__(self) -> LockProxy:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# ── the public constructors: sky.dict("name"), ... (names as in skyward 0.5) ─────────────


def shared_dict(name: str, *, consistency: str | None = None) -> DictProxy:
    """The pool's shared dict called ``name``; see ``DictProxy``."""
    return DictProxy(name)


def shared_set(name: str, *, consistency: str | None = None) -> SetProxy:
    """The pool's shared set called ``name``; see ``SetProxy``."""
    return SetProxy(name)


def counter(name: str, *, consistency: str | None = None) -> CounterProxy:
    """The pool's shared counter called ``name`` (starts at 0); see ``CounterProxy``."""
    return CounterProxy(name)


def queue(name: str) -> QueueProxy:
    """The pool's shared queue called ``name``; see ``QueueProxy``."""
    return QueueProxy(name)


def barrier(name: str, n: int) -> BarrierProxy:
    """The pool's barrier called ``name``, for ``n`` participants; see ``BarrierProxy``."""
    return BarrierProxy(name, n)


def lock(name: str) -> LockProxy:
    """The pool's lock called ``name``; see ``LockProxy``."""
    return LockProxy(name)


# ── the worker's end of a request (the pool's is ``SharedState.serve``) ──────────────────


class LinkRequester:
    """A worker's requests to its pool, over its link; ``deliver`` takes the replies (on
    the worker's reader thread). Thread-safe."""

    def __init__(
        self,
        send: Callable[[object, proto.Parts | None], None],
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self._send = send
        self._wake = wake  # have a thread read the reply (the worker's main may be busy)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards: _waiting
        self._waiting: builtins.dict[int, Future[tuple[bool, proto.Parts]]] = {}

    def __call__(self, kind: str, name: str, op: str, args: tuple[Any, ...]) -> Any:
        request_id = next(self._ids)
        done: Future[tuple[bool, proto.Parts]] = Future()
        with self._lock:
            self._waiting[request_id] = done
        self._wake()
        self._send(proto.Shared(request_id, kind, name, op), proto.dumps(args))
        ok, parts = done.result()
        if not ok:
            from skyward.worker.calls import decoded

            raise decoded(parts)
        return proto.loads(parts)

    def deliver(self, message: proto.SharedReply, parts: proto.Parts) -> None:
        with self._lock:
            done = self._waiting.pop(message.request_id, None)
        if done is not None:
            done.set_result((message.ok, parts))

    def fail_all(self, why: str) -> None:
        """The link is gone: nobody will answer."""
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        from skyward._errors import PoolClosed

        for done in waiting.values():
            done.set_result((False, proto.encode_error(PoolClosed(why))))


def use_link(requester: Requester) -> None:
    """This process is a worker: collections go through its link."""
    global _endpoint
    _endpoint = requester


def register(requester: Requester) -> None:
    with _running_lock:
        _running.append(requester)


def unregister(requester: Requester) -> None:
    with _running_lock:
        if requester in _running:
            _running.remove(requester)


# skyward 0.5's names, which shadow the builtins here only at the very end: code above uses
# builtins.dict / builtins.set where it means them.
dict = shared_dict
set = shared_set
