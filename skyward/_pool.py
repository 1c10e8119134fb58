"""``ComputePool``: opens nodes, keeps one worker on each, schedules calls, always closes.

::

    __init__   validate (pydantic) → check plugins pickle → plugins' transforms over the image
    start()    provider.provision → per node, in parallel: spawn worker, wait Hello
               → check Python versions → InstanceInfo per node → Start to all → wait Ready
    calls      >> / submit / map: pool queue → least busy ready node with a free slot
               @ / broadcast:     sent at once to every node, under one lock, so every node
                                  sees broadcasts in the same order (SPMD programs need it)
    failures   a worker that dies fails its calls (WorkerLost) and is replaced; a call past
               its timeout fails (TimeoutError) and its worker is killed, then replaced
    close()    wait for submitted calls (unless closing on an error) → Shutdown to workers
               → bounded wait → kill → provider.terminate, in a finally

All mutable scheduling state is in ``ComputePool`` and guarded by ``_lock``.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import os
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skyward import _profile
from skyward import _protocol as proto
from skyward._channel import Channel, _fail, _resolve
from skyward._compute import Compute, PendingCall
from skyward._console import Console, ConsoleMode, OutputMode, Route
from skyward._errors import PluginError, PoolClosed, ProvisionError, VersionMismatch, WorkerLost
from skyward._image import Image
from skyward._info import InstanceInfo
from skyward._modules import ship_client_modules
from skyward._plugin import Plugin, apply_transforms
from skyward.providers.base import Node, Provider

R = TypeVar("R")
# A map may queue calls beyond a node's slots when its recent calls were short, so that its
# worker finds the next call waiting instead of idling for a round trip: as many as keep the
# last of them waiting about _PREFETCH_BELOW seconds at most, and never more than
# _PREFETCH_MAX. A node whose calls take longer than _PREFETCH_BELOW gets none.
_PREFETCH_BELOW = 0.01
_PREFETCH_MAX = 8
# draining: close(wait=True) is waiting for submitted calls; no new calls are taken.
State = Literal["new", "starting", "running", "draining", "closing", "closed"]
_ACTIVE = ("running", "draining")


class PoolSpec(BaseModel):
    """A pool's validated configuration; plugins' ``transform`` hooks receive it."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    provider: Any
    nodes: int = Field(default=1, ge=1, le=4096)
    accelerator: str | None = Field(default=None, min_length=1)
    image: Image = Field(default_factory=Image)
    plugins: tuple[Plugin, ...] = ()
    concurrency: int = Field(default=1, ge=1, le=1024)
    name: str = Field(default_factory=lambda: f"pool-{secrets.token_hex(3)}", min_length=1)
    start_timeout: float = Field(default=120.0, gt=0)
    shutdown_timeout: float = Field(default=10.0, gt=0)
    console: ConsoleMode = "auto"
    output: OutputMode = "all"
    quiet: bool = False  # the older spelling of console="off"; kept working

    @model_validator(mode="after")
    def _quiet_means_console_off(self) -> PoolSpec:
        if self.quiet and self.console not in ("auto", "off"):
            raise ValueError(f"quiet=True means console='off'; it contradicts {self.console=}")
        return self

    @field_validator("provider")
    @classmethod
    def _provider(cls, provider: Any) -> Any:
        if not isinstance(provider, Provider):
            raise ValueError(
                f"expected a provider such as sky.Local(), not {type(provider).__name__}"
            )
        return provider

    @field_validator("plugins")
    @classmethod
    def _unique(cls, plugins: tuple[Plugin, ...]) -> tuple[Plugin, ...]:
        names = [p.name for p in plugins]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"plugin {name!r} is listed more than once")
        return plugins

    @property
    def provider_kind(self) -> str:
        return str(self.provider.kind)


@dataclass(frozen=True)
class PoolStatistics:
    """A snapshot of a pool's work. ``in_flight`` is per node, by rank."""

    name: str
    state: str
    nodes: int
    ready_nodes: int
    queued: int
    in_flight: tuple[int, ...]
    submitted: int
    succeeded: int
    failed: int
    workers_replaced: int
    uptime: float


@dataclass(eq=False)
class _Task:
    call: PendingCall[Any]
    payload: proto.Parts
    future: Future[Any]
    broadcast: bool = False  # bound to one node: waits for that node, never moves
    route: Route | None = None  # where its output goes (the Jupyter cell that submitted it)
    prefetch: bool = False  # part of a map: may wait on a worker behind another call
    siblings: Sequence[Future[Any]] = ()  # a broadcast's parts, this one's future included


@dataclass(eq=False)
class _Slot:
    """One node and its current worker."""

    rank: int
    node: Node
    info: InstanceInfo | None = None
    channel: Channel | None = None
    ready: bool = False
    busy: int = 0  # calls sent and not finished, broadcasts included
    recent: float = float("inf")  # seconds from send to result, averaged over recent calls
    lost: WorkerLost | None = None  # set when the node cannot get a worker any more
    backlog: list[_Task] = field(default_factory=list)  # broadcasts waiting for a new worker


class ComputePool:
    """A pool of nodes running Skyward workers. Use it as a context manager::

        with sky.ComputePool(nodes=4) as pool:
            results = f(x) @ pool

    or, in a notebook, ``pool = sky.ComputePool(nodes=4).start()`` … ``pool.close()`` (a
    pool left open is closed when the interpreter exits). Every argument is validated here,
    before anything starts. Thread-safe: many threads may submit at once.

    ``console`` picks the progress display while nodes come up: ``"auto"`` (Jupyter display
    in a kernel, live table on a terminal, timestamped lines otherwise), ``"rich"``,
    ``"plain"`` or ``"off"`` (``quiet=True`` is the older spelling of ``"off"``). ``output``
    picks whose prints are shown: ``"all"``, ``"head"`` (node 0) or ``"none"``. Progress
    also goes to the ``logging`` logger ``"skyward"``.
    """

    def __init__(
        self,
        provider: Provider | None = None,
        *,
        nodes: int = 1,
        accelerator: str | None = None,
        image: Image | None = None,
        plugins: Sequence[Plugin] = (),
        concurrency: int = 1,
        name: str | None = None,
        start_timeout: float = 120.0,
        shutdown_timeout: float = 10.0,
        console: ConsoleMode = "auto",
        output: OutputMode = "all",
        quiet: bool = False,
    ) -> None:
        from skyward.providers.local import Local

        options: dict[str, Any] = {
            "provider": Local() if provider is None else provider,
            "nodes": nodes,
            "accelerator": accelerator,
            "image": Image() if image is None else image,
            "plugins": tuple(plugins),
            "concurrency": concurrency,
            "start_timeout": start_timeout,
            "shutdown_timeout": shutdown_timeout,
            "console": console,
            "output": output,
            "quiet": quiet,
        }
        if name is not None:
            options["name"] = name
        self.spec = PoolSpec(**options)
        check = getattr(self.spec.provider, "check", None)
        if check is not None:
            check(self.spec)  # provider-specific limits, before anything is touched
        # Remote workers cannot import the client's own modules; local ones can.
        self._remote = not isinstance(self.spec.provider, Local)
        self._before_pickling()
        self._plugin_payload = _pickle_plugins(self.spec.plugins)
        self.image = apply_transforms(self.spec.image, self.spec)
        mode: ConsoleMode = "off" if self.spec.quiet else self.spec.console
        self._console = Console(mode=mode, output=self.spec.output)

        self._lock = threading.RLock()  # guards: everything below, and slot fields
        self._idle = threading.Condition(self._lock)  # notified whenever a call finishes
        self._state: State = "new"
        self._slots: list[_Slot] = []
        self._nodes: Sequence[Node] = ()
        self._queue: deque[_Task] = deque()
        self._pumping = False
        self._pending_channels: set[Channel] = set()  # spawned, not yet ready
        self._restarting = False  # a gang restart of every worker is under way
        # Plugins that tie every node into one runtime (jax): a worker lost is every worker
        # lost, and a broadcast runs on one generation of workers or not at all.
        self._gang = [p.name for p in self.spec.plugins if p.gang] if self.spec.nodes > 1 else []
        self._counts = {"submitted": 0, "succeeded": 0, "failed": 0, "replaced": 0}
        self._started_at = 0.0
        self._watchdog = _Watchdog(self)

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return (
            f"<ComputePool {self.name!r} {self.spec.provider_kind} "
            f"nodes={self.spec.nodes} {self._state}>"
        )

    # ── lifecycle ────────────────────────────────────────────────────────────────────────

    def __enter__(self) -> ComputePool:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Leaving normally waits for submitted calls, like an executor; leaving on an error
        # or Ctrl-C does not: the user is already on their way out.
        self.close(wait=exc_type is None)

    def start(self) -> ComputePool:
        """Provision the nodes and start a worker on each; returns when all are ready."""
        with self._lock:
            if self._state != "new":
                raise PoolClosed(f"pool {self.name!r} was already started ({self._state})")
            self._state = "starting"
        atexit.register(self._close_at_exit)
        spec = self.spec
        self._started_at = time.monotonic()
        self._console.begin(
            f"starting {spec.nodes} node(s) on {spec.provider_kind} (pool {self.name})", spec.nodes
        )
        try:
            self._start(spec)
        except BaseException:
            self._console.end()
            self.close(wait=False)
            raise
        with self._lock:
            if self._state != "starting":  # closed by another thread meanwhile
                self._console.end()  # stops a live display, which has a thread of its own
                raise PoolClosed(f"pool {self.name!r} was closed while it started")
            self._state = "running"
            # A worker that died between Ready and now was not replaced (the pool was not
            # running yet); replace it now.
            lost = [(s, s.channel) for s in self._slots if s.channel and s.channel.lost]
        for slot, channel in lost:
            assert channel is not None and channel.lost is not None
            self._on_lost(slot, channel, channel.lost)
        self._console.end(
            f"pool {self.name} ready: {spec.nodes} node(s), "
            f"{spec.accelerator or 'no accelerator'}, in "
            f"{time.monotonic() - self._started_at:.1f} s"
        )
        return self

    def _start(self, spec: PoolSpec) -> None:
        deadline = time.monotonic() + spec.start_timeout
        self._nodes = spec.provider.provision(
            spec.model_copy(update={"image": self.image}), self._console
        )
        if len(self._nodes) != spec.nodes:
            raise ProvisionError(
                f"provider {spec.provider_kind} returned {len(self._nodes)} nodes, not {spec.nodes}"
            )
        with self._lock:
            self._slots = [_Slot(rank, node) for rank, node in enumerate(self._nodes)]
        channels = self._bring_up(self._slots, deadline)
        with self._lock:
            for slot, channel in zip(self._slots, channels, strict=True):
                self._pending_channels.discard(channel)
                slot.channel = channel
                slot.ready = True

    def _bring_up(
        self, slots: Sequence[_Slot], deadline: float, launched: list[Channel] | None = None
    ) -> list[Channel]:
        """Start a worker on each of ``slots`` and wait until all are Ready.

        With every slot of the pool (start, or a restart of them all), each node's
        InstanceInfo is built afresh from the Hellos; for some slots only, the workers get
        the info their nodes already have, so that they rejoin the same pool.
        """
        spec = self.spec

        def hello(slot: _Slot) -> tuple[Channel, proto.Hello]:
            self._console.phase(slot.rank, "starting")
            return self._launch(slot, deadline, launched)

        hellos = _parallel(hello, slots)
        for slot, (_, message) in zip(slots, hellos, strict=True):
            _check_version(slot.rank, message)
        if len(slots) == len(self._slots):
            head_port = hellos[0][1].head_port or 0
            addresses = tuple(slot.node.address for slot in slots)
            for slot, (_, message) in zip(slots, hellos, strict=True):
                slot.info = InstanceInfo(
                    node=slot.rank,
                    total_nodes=spec.nodes,
                    head_addr=addresses[0],
                    head_port=head_port,
                    peers=addresses,
                    accelerators=slot.node.accelerators,
                    accelerator=spec.accelerator,
                    pool=self.name,
                    provider=spec.provider_kind,
                    hostname=message.hostname,
                )
        # The barrier: every node has said Hello before any node gets Start, so plugins
        # such as jax.distributed.initialize begin together however unevenly nodes booted.
        hooked = [p.name for p in spec.plugins if p.around_app is not None]
        if hooked:
            self._console.status(f"entering plugins on every node: {', '.join(hooked)}")
            for slot in slots:  # the progress row says what the node is waiting for now
                self._console.phase(slot.rank, "starting", f"entering {', '.join(hooked)}")
        for slot, (channel, _) in zip(slots, hellos, strict=True):
            channel.send_start(self._start_message(slot), self._plugin_payload)

        def ready(pair: tuple[_Slot, Channel]) -> None:
            slot, channel = pair
            channel.wait_ready(max(0.0, deadline - time.monotonic()))
            self._console.phase(slot.rank, "ready", f"pid {channel.pid}")

        channels = [channel for channel, _ in hellos]
        _parallel(ready, list(zip(slots, channels, strict=True)))
        return channels

    def _launch(
        self, slot: _Slot, deadline: float, launched: list[Channel] | None = None
    ) -> tuple[Channel, proto.Hello]:
        """Spawn a worker for ``slot`` (recorded in ``launched``) and wait for its Hello."""
        with self._lock:
            if self._state in ("closing", "closed"):
                raise PoolClosed(f"pool {self.name!r} is closing")
            transport = slot.node.spawn_worker(slot.rank, self.image.env)
            channel = Channel(
                transport,
                node=slot.rank,
                output=self._console.output,
                on_lost=lambda ch, err, s=slot: self._on_lost(s, ch, err),  # type: ignore[misc]
                on_broken=lambda ch, s=slot: self._on_broken(s, ch),  # type: ignore[misc]
            )
            self._pending_channels.add(channel)
            if launched is not None:
                launched.append(channel)
        return channel, channel.wait_hello(max(0.0, deadline - time.monotonic()))

    def _start_message(self, slot: _Slot) -> proto.Start:
        assert slot.info is not None
        return proto.Start(
            info=slot.info,
            sys_path=_client_sys_path() if slot.node.shares_files else [],
            concurrency=self.spec.concurrency,
        )

    def close(self, *, wait: bool = True) -> None:
        """Stop every worker and destroy the nodes. Idempotent.

        ``wait=True`` first lets submitted calls finish; ``wait=False`` fails the ones not
        yet started with ``PoolClosed``. Workers get ``shutdown_timeout`` seconds to leave
        their plugins' contexts, then are killed; the provider's ``terminate`` always runs.
        """
        with self._lock:
            if self._state in ("draining", "closing", "closed"):
                return
            was_running = self._state == "running"
            if self._state == "new":
                self._state = "closed"
                return
            if wait and was_running:
                self._state = "draining"
        cancel = True
        try:
            if wait and was_running:
                self._wait_idle()
                cancel = False
        finally:
            self._teardown(cancel=cancel)

    def _wait_idle(self) -> None:
        with self._idle:
            while self._queue or any(s.busy or s.backlog for s in self._slots):
                self._idle.wait(1.0)

    def _teardown(self, *, cancel: bool) -> None:
        with self._lock:
            self._state = "closing"
            queued = list(self._queue) + [t for s in self._slots for t in s.backlog]
            self._queue.clear()
            for slot in self._slots:
                slot.backlog.clear()
                slot.ready = False
            channels = [s.channel for s in self._slots if s.channel is not None]
            channels += self._pending_channels
            self._pending_channels.clear()
        try:
            self._watchdog.stop()
            closed = PoolClosed(f"pool {self.name!r} was closed before this call ran")
            for task in queued:
                _fail(task.future, closed)
            for channel in channels:
                channel.shutdown(cancel=cancel)
            deadline = time.monotonic() + self.spec.shutdown_timeout
            for channel in channels:
                channel.wait_closed(max(0.0, deadline - time.monotonic()))
            for channel in channels:
                if not channel.wait_closed(0):
                    channel.kill("it did not exit within shutdown_timeout")
            for channel in channels:
                channel.wait_closed(5.0)
        finally:
            try:
                if self._nodes:
                    self.spec.provider.terminate(self._nodes)
            finally:
                with self._lock:
                    self._state = "closed"
                    self._idle.notify_all()
                self._console.flush()
                atexit.unregister(self._close_at_exit)

    def _close_at_exit(self) -> None:
        if self._state not in ("closing", "closed"):
            self._console.status(f"closing pool {self.name} at interpreter exit")
        self.close(wait=False)

    # ── calls ────────────────────────────────────────────────────────────────────────────

    def run(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        """Run ``fn(*args, **kwargs)`` on the least busy node and return its value."""
        result: R = self._run_call(_pending(fn, args, kwargs)).result()
        return result

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        """Like ``run`` but returns a ``concurrent.futures.Future`` at once."""
        return self._run_call(_pending(fn, args, kwargs))

    def broadcast(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> list[R]:
        """Run ``fn(*args, **kwargs)`` on every node; results by node rank."""
        result: list[R] = self._broadcast_call(_pending(fn, args, kwargs)).result()
        return result

    def map(self, fn: Callable[..., R], iterable: Iterable[Any], /) -> list[R]:
        """``[fn(x) for x in iterable]`` spread over the nodes; results in input order.

        The first failure (in input order) is raised and calls still in the pool's queue
        are cancelled; the few a node with short calls was handed ahead (see
        ``_prefetch_depth``) may still run, and their results are dropped.
        """
        calls = [_pending(fn, (item,), {}) for item in iterable]
        futures = self._run_calls(calls, same_function=True, prefetch=True)
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()

    def statistics(self) -> PoolStatistics:
        with self._lock:
            return PoolStatistics(
                name=self.name,
                state=self._state,
                nodes=self.spec.nodes,
                ready_nodes=sum(s.ready for s in self._slots),
                queued=len(self._queue),
                in_flight=tuple(s.busy for s in self._slots),
                submitted=self._counts["submitted"],
                succeeded=self._counts["succeeded"],
                failed=self._counts["failed"],
                workers_replaced=self._counts["replaced"],
                uptime=time.monotonic() - self._started_at if self._started_at else 0.0,
            )

    def _run_call(self, call: PendingCall[R]) -> Future[R]:
        return self._run_calls([call])[0]

    def _run_calls(
        self,
        calls: Sequence[PendingCall[Any]],
        *,
        same_function: bool = False,
        prefetch: bool = False,
    ) -> list[Future[Any]]:
        """Queue calls for the least busy nodes; all are pickled before any is queued.

        ``prefetch`` (a map: the caller waits for the lot, and the first failure fails it)
        lets a node whose recent calls were short hold a few calls more than
        ``concurrency`` (see ``_prefetch_depth``), so its worker finds the next call waiting
        instead of idling for a round trip.
        """
        self._before_pickling()
        function = calls[0].serialize_function() if same_function and calls else None
        route = self._console.route()
        tasks = [
            _Task(call, call.serialize(function), Future(), route=route, prefetch=prefetch)
            for call in calls
        ]
        with self._lock:  # once for the lot: reader threads want this lock too
            self._check_running()
            self._counts["submitted"] += len(tasks)
            self._queue.extend(tasks)
            self._pump()
        return [task.future for task in tasks]

    def _run_group(self, calls: Sequence[PendingCall[Any]]) -> Future[tuple[Any, ...]]:
        return _gather(self._run_calls(calls), tuple)

    def _broadcast_call(self, call: PendingCall[R]) -> Future[list[R]]:
        self._before_pickling()
        payload = call.serialize()  # once, for every node
        route = self._console.route()
        futures: list[Future[R]] = [Future() for _ in self._slots]
        with self._lock:
            self._check_running()
            # In a gang, no part starts until every node has a worker of the same generation.
            wait = bool(self._gang) and not all(s.ready or s.lost is not None for s in self._slots)
            for slot, future in zip(self._slots, futures, strict=True):
                task = _Task(call, payload, future, broadcast=True, route=route, siblings=futures)
                self._counts["submitted"] += 1
                if slot.lost is not None:
                    _fail(task.future, slot.lost)
                elif wait or not slot.ready:
                    slot.backlog.append(task)  # its worker (or its gang) is being replaced
                else:
                    self._send(slot, task)
        return _gather(futures, list)

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

    def _pump(self) -> None:
        """Send queued calls to the least busy ready nodes with a free slot. Lock held."""
        if self._pumping:
            # Re-entered from a done-callback of a future failed below (a user's callback
            # may submit); the outer loop carries on with the queue.
            return
        self._pumping = True
        try:
            limit = self.spec.concurrency
            while self._queue:
                head = self._queue[0]
                prefetch = head.prefetch and head.call.timeout is None  # a timeout starts at send
                free = [
                    s
                    for s in self._slots
                    if s.ready and s.busy < limit + (_prefetch_depth(s.recent) if prefetch else 0)
                ]
                if not free:
                    if all(s.lost is not None for s in self._slots):
                        self._fail_queue(self._slots[0].lost)
                    return
                slot = min(free, key=lambda s: s.busy)
                self._send(slot, self._queue.popleft())
        finally:
            self._pumping = False

    def _fail_queue(self, error: BaseException | None) -> None:
        lost = WorkerLost(f"pool {self.name!r} has no node left to run calls on: {error}", node=-1)
        while self._queue:
            _fail(self._queue.popleft().future, lost)

    def _send(self, slot: _Slot, task: _Task) -> None:
        """Hand one task to ``slot``'s worker. Lock held; never blocks (see Channel)."""
        if task.future.done():
            return  # cancelled while queued, or timed out before a retry
        if not task.future.running() and not task.future.set_running_or_notify_cancel():
            return
        assert slot.channel is not None
        channel = slot.channel
        # The channel settles an inner future; the pool's books are updated before the
        # caller's future completes, so statistics() agree with what the caller has seen.
        # (A timeout or close fails the caller's future first; the books follow when the
        # worker is gone.)
        inner: Future[Any] = Future()
        sent = time.monotonic()

        def settle(done: Future[Any]) -> None:
            self._call_done(slot, done, time.monotonic() - sent)
            error = done.exception()
            if error is not None:
                _fail(task.future, error)
            else:
                _resolve(task.future, done.result())

        # Before the worker can print anything for this call.
        self._console.bind(slot.rank, task.route)
        if not channel.submit(task.call.name, task.payload, inner):
            # The worker broke a moment ago; on_broken is on its way. Take the node out of
            # rotation now and put the call back: it has not run anywhere.
            slot.ready = False
            if task.broadcast:
                slot.backlog.append(task)
            else:
                self._queue.appendleft(task)
            return
        slot.busy += 1
        inner.add_done_callback(settle)
        if task.call.timeout is not None:
            self._watchdog.watch(task.future, task.call.name, task.call.timeout, channel)

    def _call_done(self, slot: _Slot, future: Future[Any], elapsed: float) -> None:
        with self._lock:
            slot.busy -= 1
            slot.recent = (
                elapsed if slot.recent == float("inf") else 0.7 * slot.recent + 0.3 * elapsed
            )
            ok = not future.cancelled() and future.exception() is None
            self._counts["succeeded" if ok else "failed"] += 1
            if self._state in _ACTIVE:
                self._pump()
            self._idle.notify_all()

    # ── failures ─────────────────────────────────────────────────────────────────────────

    def _recycle(self, future: Future[Any], name: str, timeout: float, channel: Channel) -> None:
        """A call outlived its timeout: fail it, and replace the worker running it."""
        with self._lock:
            for slot in self._slots:
                if slot.channel is channel:
                    slot.ready = False  # before the future fails: no new call may land here
            error = TimeoutError(
                f"{name} did not finish within its timeout of {timeout:g} s on node "
                f"{channel.node}; that node's worker is being replaced"
            )
            timed_out = _fail(future, error)
            if not timed_out:  # it finished just now: the worker is healthy, keep it
                for slot in self._slots:
                    if slot.channel is channel and not channel.broken:
                        slot.ready = True
                self._pump()
                return
        channel.kill(f"{name} exceeded its timeout of {timeout:g} s")

    def _on_broken(self, slot: _Slot, channel: Channel) -> None:
        """The worker's stream ended: choose other nodes from now on (loss report follows).

        In a gang every worker is about to be restarted: none takes new calls from now on,
        even though the survivors' own calls may still be failing their way back.
        """
        with self._lock:
            if slot.channel is channel:
                for other in self._slots if self._gang else [slot]:
                    other.ready = False

    def _on_lost(self, slot: _Slot, channel: Channel, error: WorkerLost) -> None:
        """A worker ended on its own, or was killed after a timeout: replace it.

        With a gang plugin (jax: one distributed runtime spans every node, and a new process
        cannot join a running one) the other workers are stopped too and all of them are
        started again together, through the same barrier as ``start()``.
        """
        with self._lock:
            if slot.channel is not channel or self._state not in _ACTIVE:
                return
            slot.channel = None
            slot.ready = False
            if self._restarting:
                return  # part of a restart of every worker, already under way
            gang = self._gang
            if gang:
                self._restarting = True
                victims = [s.channel for s in self._slots if s.channel is not None]
                for other in self._slots:
                    other.ready = False
                replace: list[_Slot] = list(self._slots)
            else:
                victims = []
                replace = [slot]
        if victims:
            reason = (
                f"node {slot.rank} was lost, and plugin {', '.join(gang)} ties every node into "
                f"one runtime, so all workers are restarted together"
            )
            self._console.status(reason)
            for victim in victims:
                victim.kill(reason)
        else:
            self._console.status(f"node {slot.rank}: worker lost; starting a new one")
        threading.Thread(
            target=self._replace,
            args=(replace, victims),
            name=f"skyward-replace-{slot.rank}",
            daemon=True,
        ).start()

    def _replace(self, slots: list[_Slot], victims: list[Channel]) -> None:
        launched: list[Channel] = []
        try:
            for victim in victims:  # a new runtime must not meet the old one
                victim.wait_closed(self.spec.shutdown_timeout)
            deadline = time.monotonic() + self.spec.start_timeout
            channels = self._bring_up(slots, deadline, launched)
        except BaseException as exc:
            with self._lock:
                for channel in launched:
                    channel.kill("it could not be started")
                    self._pending_channels.discard(channel)
                self._restarting = False
                for slot in slots:
                    slot.lost = WorkerLost(
                        f"node {slot.rank}: its worker died and no new one could be started: {exc}",
                        node=slot.rank,
                    )
                    backlog, slot.backlog = slot.backlog, []
                    for task in backlog:
                        _fail(task.future, slot.lost)
                self._pump()
                self._idle.notify_all()
            return
        with self._lock:
            self._restarting = False
            for channel in channels:
                self._pending_channels.discard(channel)
            if self._state not in _ACTIVE:
                for channel in channels:
                    channel.kill("the pool is closing")
                return
            for slot, channel in zip(slots, channels, strict=True):
                self._counts["replaced"] += 1
                slot.channel = channel
                slot.ready = True
                slot.recent = float("inf")
            # Decide for every part before any is sent: a part sent here is not "already run".
            held = [
                (slot, task, bool(self._gang) and _split(task))
                for slot in slots
                for task in slot.backlog
            ]
            for slot in slots:
                slot.backlog = []
            for slot, task, split in held:
                if split:
                    _fail(task.future, _split_error(slot.rank, task))
                else:
                    self._send(slot, task)
            self._pump()
        pids = ", ".join(f"node {s.rank} pid {c.pid}" for s, c in zip(slots, channels, strict=True))
        self._console.status(f"new worker(s) ready: {pids}")

    def profile(self, directory: str | os.PathLike[str]) -> _profile.Profile:
        """``with pool.profile("traces/"):`` traces every node with ``jax.profiler``."""
        return _profile.profile(self, directory)


class _Watchdog:
    """Fails calls that outlive their timeout and kills their worker (which is replaced).

    One thread per pool, started by the first call that has a timeout.
    """

    def __init__(self, pool: ComputePool) -> None:
        self._pool = pool
        self._cond = threading.Condition()  # guards: _heap, _thread, _stopped
        # (deadline, seq, future, name, timeout, channel): not the task, whose payload may be
        # large and must not live as long as the timeout does.
        self._heap: list[tuple[float, int, Future[Any], str, float, Channel]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(self, future: Future[Any], name: str, timeout: float, channel: Channel) -> None:
        with self._cond:
            entry = (time.monotonic() + timeout, next(self._seq), future, name, timeout, channel)
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="skyward-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    delay = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(delay)
                if self._stopped:
                    return
                _, _, future, name, timeout, channel = heapq.heappop(self._heap)
            if not future.done():
                self._pool._recycle(future, name, timeout, channel)


def _split(task: _Task) -> bool:
    """Whether part of ``task``'s broadcast already ran, or failed, outside the backlog."""
    return any(f.running() or f.done() for f in task.siblings if f is not task.future)


def _split_error(rank: int, task: _Task) -> WorkerLost:
    # A part started alone in a new distributed runtime would wait forever in its first
    # collective (jax's backend start is one) for peers that ran their parts in the old one.
    return WorkerLost(
        f"node {rank}: {task.call.name} was not started on the new workers: other nodes "
        f"had already run their part of this broadcast on the workers that were lost, and "
        f"a part alone would wait for them forever; broadcast it again",
        node=rank,
    )


def _pending(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if isinstance(fn, Compute):
        return PendingCall(fn.fn, args, kwargs, timeout=fn.timeout)
    if not callable(fn):
        raise TypeError(f"expected a function, not {type(fn).__name__}")
    return PendingCall(fn, args, kwargs)


def _prefetch_depth(recent: float) -> int:
    """Calls a map may queue past a node's slots, given its recent send-to-result time.

    That time includes the wait behind the calls queued before, so the depth settles where
    depth x time per call is about ``_PREFETCH_BELOW``.
    """
    return _PREFETCH_MAX if recent <= 0 else min(_PREFETCH_MAX, int(_PREFETCH_BELOW / recent))


def _pickle_plugins(plugins: Sequence[Plugin]) -> proto.Parts:
    for plugin in plugins:
        try:
            proto.dumps(plugin)
        except Exception as exc:
            raise PluginError(
                f"plugin {plugin.name!r} cannot be pickled, so it cannot reach the workers: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return proto.dumps(list(plugins))


def _check_version(rank: int, hello: proto.Hello) -> None:
    ours = proto.python_version()
    if hello.python[:2] != ours[:2]:
        theirs = ".".join(map(str, hello.python))
        raise VersionMismatch(
            f"node {rank} runs Python {theirs} but this client runs "
            f"{'.'.join(map(str, ours))}; cloudpickle needs the same minor version on both "
            f"ends. Run the client on Python {hello.python[0]}.{hello.python[1]}, or give "
            f"the workers Python {ours[0]}.{ours[1]}."
        )


def _client_sys_path() -> list[str]:
    # Workers append these, so modules importable here (the script's directory, a test
    # suite's rootdir) are importable there too; cloudpickle pickles their functions by name.
    return [os.path.abspath(p or os.curdir) for p in sys.path]


T = TypeVar("T")
U = TypeVar("U")


def _parallel(fn: Callable[[T], U], items: Sequence[T]) -> list[U]:
    """``[fn(x) for x in items]`` on daemon threads; the first failure is raised.

    Daemon threads, so a Ctrl-C in the waiting thread is never held up by them; whatever
    they are blocked on is ended by the pool's teardown.
    """
    futures: list[Future[U]] = [Future() for _ in items]

    def run(item: T, future: Future[U]) -> None:
        try:
            future.set_result(fn(item))
        except BaseException as exc:
            future.set_exception(exc)

    for item, future in zip(items, futures, strict=True):
        threading.Thread(target=run, args=(item, future), daemon=True).start()
    results: list[U] = _gather(futures, list).result()
    return results


# How long a group that failed with an ordinary error waits for a WorkerLost from another
# of its calls before reporting that error. When a JAX rank dies mid-collective, its peers'
# collectives often fail first ("Gloo all-reduce failed: connection reset by peer"): the
# consequence would beat the cause, a dead node, to the caller by a few milliseconds.
_LOSS_GRACE = 2.0


def _gather(futures: Sequence[Future[Any]], build: Callable[[list[Any]], Any]) -> Future[Any]:
    """One future for many: their results by position, or the first failure as it happens.

    A ``WorkerLost`` fails the group at once; another error does after ``_LOSS_GRACE``
    seconds, or as soon as every call has finished, unless a ``WorkerLost`` comes first.
    """
    out: Future[Any] = Future()
    out.set_running_or_notify_cancel()
    remaining = [len(futures)]
    errors: list[BaseException] = []
    lock = threading.Lock()  # guards: remaining, errors

    def done(future: Future[Any]) -> None:
        if future.cancelled():
            _fail(out, PoolClosed("a call of this group was cancelled"))
            return
        error = future.exception()
        if isinstance(error, WorkerLost):
            _fail(out, error)
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
            timer = threading.Timer(_LOSS_GRACE, _fail, (out, first_error))
            timer.daemon = True
            timer.start()
        if last:
            if first_error is not None:
                _fail(out, first_error)
            else:
                out.set_result(build([f.result() for f in futures]))

    if not futures:
        out.set_result(build([]))
    for future in futures:
        future.add_done_callback(done)
    return out
