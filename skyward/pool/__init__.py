"""``ComputePool``: the API users hold, and its life: start, calls, close.

::

    __init__   PoolSpec (validate) → provider.check → plugins pickled → transforms (pool/spec.py)
    start()    provider.provision(request) → Allocation, bounded by provision_timeout
               → workers through the start-up barrier, bounded by start_timeout (pool/startup.py)
    calls      >> / submit / map / @ / broadcast → pickled here, once → the scheduler
    failures   lost workers, call timeouts, gang restarts (pool/recovery.py)
    close()    wait for submitted calls (unless closing on an error) → Shutdown to workers
               → bounded wait → kill → allocation.terminate(), on every path

The pool's state shares the scheduler's lock. Whatever a provider made is terminated on
every path: a close from another thread while the provider is still provisioning cancels
it, and whatever it returns anyway is terminated by the thread that started it.
"""

from __future__ import annotations

import atexit
import inspect
import os
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal, TypeVar, Unpack

from skyward._compute import PendingCall, pending_call
from skyward._errors import PoolClosed
from skyward._futures import Deadline, fail, gather
from skyward._options import refuse_unknown
from skyward.collections.proxies import PoolCollections, register, unregister
from skyward.collections.state import SharedState
from skyward.console import Console, ConsoleMode
from skyward.console.logs import PoolLog, secrets_of
from skyward.link import protocol as proto
from skyward.link.channel import Channel
from skyward.link.pickling import ship_client_modules
from skyward.link.protocol import RelayFailed
from skyward.pool import profile as _profile
from skyward.pool import signals
from skyward.pool.machines import Machines
from skyward.pool.recovery import HangWatch, Recovery
from skyward.pool.scheduler import PoolStatistics, Scheduler, Slot, tasks_for
from skyward.pool.spec import (
    PoolOptions,
    PoolSpec,
    apply_transforms,
    pickle_plugins,
    pool_signature,
)
from skyward.pool.stacks import Stacks, collect
from skyward.pool.startup import Startup
from skyward.pool.streams import Streams, prepare, route
from skyward.providers.base import Allocation, Provider

R = TypeVar("R")
# draining: close(wait=True) is waiting for submitted calls; no new calls are taken.
State = Literal["new", "starting", "running", "draining", "closing", "closed"]
_ACTIVE = ("running", "draining")


class ComputePool(PoolCollections):
    """A pool of nodes running Skyward workers. Use it as a context manager::

        with sky.ComputePool(nodes=4) as pool:
            results = f(x) @ pool

    or, in a notebook, ``pool = sky.ComputePool(nodes=4).start()`` … ``pool.close()`` (a
    pool left open is closed when the interpreter exits). Every argument is validated here,
    before anything starts. Thread-safe: many threads may submit at once.

    ``provision_timeout`` bounds making the machines (create, boot, connect, bootstrap);
    ``start_timeout`` bounds the workers once the machines exist (spawn → Ready, plugins
    included). ``console`` picks the progress display while nodes come up: ``"auto"``
    (Jupyter display in a kernel, live table on a terminal, timestamped lines otherwise),
    ``"rich"``, ``"plain"`` or ``"off"`` (``quiet=True`` is the older spelling of
    ``"off"``). ``allocation`` picks the market of cloud machines (``"on-demand"``,
    ``"spot"``, ``"spot-if-available"``, ``"cheapest"``); ``max_hourly_cost`` (USD) refuses,
    before anything is created, a pool whose estimated price per hour is above it.
    ``output`` picks whose prints are shown: ``"all"``, ``"head"`` (node 0) or ``"none"``.
    Progress also goes to the ``logging`` logger ``"skyward"``.
    """

    # help(), notebooks and inspect show every option with PoolSpec's default.
    __signature__: ClassVar[inspect.Signature] = pool_signature()

    def __init__(self, provider: Provider | None = None, **options: Unpack[PoolOptions]) -> None:
        from skyward.providers.local import Local

        refuse_unknown(options, PoolOptions, "ComputePool")
        # Only what the caller gave: every default is PoolSpec's.
        given = {"provider": Local() if provider is None else provider, **options}
        self.spec = spec = PoolSpec.model_validate(given)
        self._plugin_payload = pickle_plugins(spec.plugins)
        self.image = apply_transforms(spec.image, spec)
        # Provider-specific limits and missing SDKs, before anything is touched.
        spec.provider.check(spec.request(self.image))
        # Remote workers cannot import the client's own modules; local ones can.
        self._remote = not isinstance(spec.provider, Local)
        self._before_pickling()
        mode: ConsoleMode = "off" if spec.quiet else spec.console
        log = PoolLog.open(
            spec.name,
            meta={"provider": spec.provider_kind, "nodes": spec.nodes},
            secrets=secrets_of(self.image.env),
        )
        self._console = Console(mode=mode, output=spec.output, log=log)

        self._state: State = "new"  # guarded by the scheduler's lock
        self._pending_channels: set[Channel] = set()  # spawned, not yet ready
        self._hurry = False  # a close(wait=False) came while another close was draining
        self._opening = 0  # workers being spawned now; a close waits for them
        self._streams: weakref.WeakSet[Streams] = weakref.WeakSet()  # ended by a close
        self._shared = SharedState()  # sky.dict(...) and the rest (_collections)
        self._started_at = 0.0
        self._scheduler = Scheduler(
            name=spec.name,
            concurrency=spec.concurrency,
            gang=bool(spec.gang),
            bind_output=self._console.bind,
            watch=lambda *args: self._recovery.timeouts.watch(*args),
            accepting=lambda: self._state in _ACTIVE,
        )
        self._lock = self._scheduler.lock
        self._machines = Machines(
            spec.provider,
            pool=spec.name,
            reporter=self._console,
            lock=self._lock,
            closing=lambda: self._state in ("closing", "closed"),
        )
        self._startup = Startup(
            spec,
            image=self.image,
            plugins=self._plugin_payload,
            reporter=self._console,
            open_channel=self._open,
        )
        self._recovery = Recovery(
            self._scheduler,
            gang=spec.gang,
            start_timeout=spec.start_timeout,
            shutdown_timeout=spec.shutdown_timeout,
            bring_up=lambda slots, deadline, whole, launched: self._startup.bring_up(
                slots, deadline, whole_pool=whole, launched=launched
            ),
            active=lambda: self._state in _ACTIVE,
            forget=self._pending_channels.discard,
            status=self._console.status,
        )
        self._hangs = (
            HangWatch(self._scheduler, bound=spec.hang_timeout, status=self._console.status)
            if spec.gang and spec.hang_timeout is not None
            else None
        )

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def log_dir(self) -> Path | None:
        """Where this pool writes its nodes' output and its events (``skyward logs`` reads
        them); None when logs could not be written on this machine."""
        log = self._console.log_file
        return None if log is None else log.directory

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
        spec = self.spec
        with self._lock:
            if self._state != "new":
                raise PoolClosed(f"pool {self.name!r} was already started ({self._state})")
            self._state = "starting"
        atexit.register(self._close_at_exit)
        # SIGTERM and SIGHUP close the pool as Ctrl-C does, while it is open (pool/signals.py).
        signals.hold(self)
        self._started_at = time.monotonic()
        self._console.begin(
            f"starting {spec.nodes} node(s) on {spec.provider_kind} (pool {self.name})", spec.nodes
        )
        if spec.min_nodes is not None and spec.min_nodes < spec.nodes:
            self._console.status(
                f"nodes=({spec.min_nodes}, {spec.nodes}): pools do not autoscale; "
                f"this one runs {spec.nodes} nodes throughout"
            )
        try:
            allocation = self._machines.provision(spec.request(self.image), spec.nodes)
            self._start_workers(allocation)
        except BaseException as exc:
            self._console.end()
            closed_meanwhile = self._state in ("closing", "closed")
            self.close(wait=False)
            if closed_meanwhile and isinstance(exc, Exception) and not isinstance(exc, PoolClosed):
                # What the close broke (a plugin's start interrupted, a channel killed) is not
                # the user's error: the pool was closed.
                raise PoolClosed(f"pool {self.name!r} was closed while it started") from exc
            raise
        with self._lock:
            if self._state != "starting":  # closed by another thread meanwhile
                self._console.end()  # stops a live display, which has a thread of its own
                raise PoolClosed(f"pool {self.name!r} was closed while it started")
            self._state = "running"
            register(self._request)  # sky.dict(...) in this process means this pool's
            if self._hangs is not None:
                self._hangs.start()
            # A worker that died between Ready and now was not replaced (the pool was not
            # running yet); replace it now.
            lost = [(s, s.channel) for s in self._scheduler.slots if s.channel and s.channel.lost]
        for slot, channel in lost:
            assert channel is not None and channel.lost is not None
            self._recovery.on_lost(slot, channel, channel.lost)
        self._console.end(
            f"pool {self.name} ready: {spec.nodes} node(s), "
            f"{spec.accelerator or 'no accelerator'}, in "
            f"{time.monotonic() - self._started_at:.1f} s"
        )
        return self

    def _start_workers(self, allocation: Allocation) -> None:
        slots = [Slot(rank, node) for rank, node in enumerate(allocation.nodes)]
        with self._lock:
            self._scheduler.slots = slots
        timeout = self.spec.start_timeout
        deadline = Deadline(timeout, f"start_timeout ({timeout:g} s)")
        channels = self._startup.bring_up(slots, deadline, whole_pool=True)
        with self._lock:
            for slot, channel in zip(slots, channels, strict=True):
                self._pending_channels.discard(channel)
                slot.channel = channel
                slot.ready = True

    def _open(self, slot: Slot) -> Channel:
        """Spawn a worker on ``slot``'s node (a new machine in its place if the node is gone
        and the provider can replace it); the channel is ended by a close from now on."""
        with self._lock:
            if self._state in ("closing", "closed"):
                raise PoolClosed(f"pool {self.name!r} is closing")
            # A close waits for spawns under way (see _teardown): a worker started while the
            # pool closes is then one the close sees, and stops with the others.
            self._opening += 1
        try:
            channel = self._spawn(slot)
            with self._lock:
                self._pending_channels.add(channel)
        finally:
            with self._lock:
                self._opening -= 1
                self._scheduler.idle.notify_all()
        return channel

    def _spawn(self, slot: Slot) -> Channel:
        transport = self._machines.spawn(slot, self.image.env, replace=self._state == "running")
        return Channel(
            transport,
            node=slot.rank,
            output=self._console.output,
            on_lost=lambda ch, err: self._recovery.on_lost(slot, ch, err),
            on_broken=lambda ch: self._broken(slot, ch),
            on_result=self._console.flush,
            diagnose=self._machines.loss_reason,
            on_frame=self._frame,
        )

    def close(self, *, wait: bool = True) -> None:
        """Stop every worker and destroy the nodes. Idempotent; returns once the pool is
        closed, whichever thread does the closing.

        ``wait=True`` first lets submitted calls finish; ``wait=False`` fails the ones not
        yet started with ``PoolClosed`` and interrupts the running ones, also when another
        ``close()`` is already waiting for them (the stronger close takes over). Workers get
        ``shutdown_timeout`` seconds to leave their plugins' contexts, then are killed; the
        allocation's ``terminate`` always runs.
        """
        with self._lock:
            if self._state == "new":
                self._state = "closed"
                return
            if self._state in ("draining", "closing", "closed"):
                if not wait:
                    self._hurry = True  # a draining close stops waiting and cancels
                    self._scheduler.idle.notify_all()
                while self._state != "closed":
                    self._scheduler.idle.wait()
                return
            drain = wait and self._state == "running"
            self._state = "draining" if drain else "closing"
        # A stream waits on its reader, who may be the caller of close: end them all, or a
        # waiting close would never see their workers go idle.
        closed = PoolClosed(f"pool {self.name!r} was closed while this stream was open")
        for streams in list(self._streams):
            streams.abandon(closed)
        cancel = True
        try:
            if drain:
                cancel = not self._scheduler.wait_idle(lambda: self._hurry)
        finally:
            self._teardown(cancel=cancel)

    def _frame(self, channel: Channel, message: Any, parts: proto.Parts) -> None:
        """A frame the pool answers: a relay's failure (the scheduler's), or a streaming
        call's or a shared collection's (``_stream.route``)."""
        if isinstance(message, RelayFailed):
            self._scheduler.relay_failed(message)
        else:
            route(self._shared, channel, message, parts)

    def _broken(self, slot: Slot, channel: Channel) -> None:
        # Before its calls fail: nothing a caller does next may go to the dead worker.
        self._shared.forget(channel, f"node {slot.rank}'s worker was lost")
        self._recovery.on_broken(slot, channel)

    def _teardown(self, *, cancel: bool) -> None:
        unregister(self._request)
        self._shared.close()  # waiters in shared collections get PoolClosed
        with self._lock:
            self._state = "closing"
        self._machines.cancel(f"pool {self.name!r} was closed")  # a replacement stops
        with self._lock:
            while self._opening:  # bounded by the spawns' own connect and provision bounds
                self._scheduler.idle.wait(0.5)
            queued = self._scheduler.take_all()
            channels = self._scheduler.channels() + list(self._pending_channels)
            self._pending_channels.clear()
        try:
            self._recovery.timeouts.stop()
            if self._hangs is not None:
                self._hangs.stop()
            closed = PoolClosed(f"pool {self.name!r} was closed before this call ran")
            for task in queued:
                fail(task.future, closed)
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
                self._machines.terminate()
            finally:
                with self._lock:
                    self._state = "closed"
                    self._scheduler.idle.notify_all()
                self._console.flush()
                self._console.closed()
                atexit.unregister(self._close_at_exit)
                signals.release(self)

    def _close_at_exit(self) -> None:
        if self._state not in ("closing", "closed"):
            self._console.status(f"closing pool {self.name} at interpreter exit")
        self.close(wait=False)

    # ── calls ───────────────────────────────────────────────────────────────────────────

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

    # ── introspection ───────────────────────────────────────────────────────────────────

    def statistics(self) -> PoolStatistics:
        with self._lock:
            uptime = time.monotonic() - self._started_at if self._started_at else 0.0
            return self._scheduler.statistics(self._state, self.spec.nodes, uptime)

    def stacks(self, timeout: float = 10.0) -> Stacks:
        """Every node's Python stacks right now, labelled by node, without stopping anything:
        where a slow or stuck call is. ``print(pool.stacks())``."""
        with self._lock:
            self._check_running()
            channels = {s.rank: s.channel for s in self._scheduler.slots}
        return collect(channels, timeout)

    def profile(self, directory: str | os.PathLike[str]) -> _profile.Profile:
        """``with pool.profile("traces/"):`` traces every node with ``jax.profiler``."""
        return _profile.profile(self, directory)
