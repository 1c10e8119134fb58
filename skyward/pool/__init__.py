"""``ComputePool``: the API users hold, and its life: start, calls, close.

::

    __init__   every sky.Spec (the keyword form is one): PoolSpec (validate) → transforms →
               provider.check (pool/fallback.py) → plugins pickled
    start()    the first spec whose provider.provision(request) → Allocation, bounded by
               provision_timeout (pool/fallback.py, pool/machines.py) → workers through the
               start-up barrier, bounded by start_timeout (pool/startup.py) → running
    calls      >> / submit / map / @ / broadcast → pickled here, once → the scheduler
    failures   lost workers, gang restarts, hangs (pool/recovery.py); call timeouts (the
               scheduler; default_compute_timeout for calls without their own)
    size       nodes=(min, max): nodes added while calls wait, idle ones let go
               (pool/autoscale.py)
    close()    wait for submitted calls (unless closing on an error) → Shutdown to workers
               → bounded wait → kill → allocation.terminate(), on every path (or, with
               keep_warm, for a pool that ran: allocation.keep(seconds), the machines left
               for the next pool like it; terminated when they cannot be kept)

The path of a call, in one line (⇢ crosses the wire)::

    f(x) >> pool → pool.run → _pickle → Scheduler.submit → Channel.submit ⇢ worker ⇢ value

and back: the caller, waiting, reads the Result off the link itself (link.turns), the
scheduler's books are settled, then the call's future. ``@``, ``>`` and groups are
``broadcast``, ``submit`` and ``submit_all`` on the same path; pickling happens in
``_pickle`` only, before the scheduler.

The parts, made in this order, each from those above it (◄── called by, ──► calls)::

    ComputePool    its state: new → starting → running → draining → closing → closed
     ├ Console     progress, status lines, workers' output     ◄── every part
     ├ Machines    the allocation; each node's machine         ◄── Startup, Scheduler (addresses)
     ├ Scheduler   slots, queue, books, call timeouts          ◄── the pool, Recovery, HangWatch
     ├ Startup     the start-up barrier                        ──► pool._open(rank): a worker
     ├ Recovery    lost workers, replacement, gang restart     ──► Scheduler, Startup
     ├ HangWatch   collectives that never complete (gangs)     ──► Scheduler
     └ Autoscaler  nodes=(min, max): grow, shrink              ──► Machines, Startup, Scheduler
    each Channel   on_lost ──► Recovery    on_broken ──► pool._broken (collections, Recovery)
                   on_frame ──► pool._frame, by type: Shared ──► collections.state,
                                Yield/Want ──► streams, RelayFailed ──► Scheduler

Each part owns its state and its lock, and the others call its methods. The pool's lock
guards the pool's state only; the pool may call the scheduler while holding it, and the
scheduler calls nothing of the pool's, so the two never wait on each other. Whatever a
provider made is terminated on every path: a close from another thread while the provider
is still provisioning cancels it, and whatever it returns anyway is terminated by the thread
that started it.
"""

from __future__ import annotations

import atexit
import inspect
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from concurrent.futures import Future
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal, TypeVar, Unpack, overload

from skyward._errors import PluginError, PoolClosed
from skyward.client import current
from skyward.client.app import current as current_app
from skyward.client.compute import CallGroup, CallTarget, PendingCall, pending_call
from skyward.client.futures import CallFuture, Deadline, Sleepers, fail, gather
from skyward.client.interrupts import allow_interrupts, hold_interrupts, raise_at_end
from skyward.client.options import refuse_unknown
from skyward.collections.proxies import (
    BarrierProxy,
    CounterProxy,
    DictProxy,
    LockProxy,
    QueueProxy,
    SetProxy,
    register,
    unregister,
)
from skyward.collections.state import SharedState
from skyward.console import Console, ConsoleMode, handlers
from skyward.console.logs import PoolLog, secrets_of
from skyward.console.mapbar import map_bar
from skyward.console.timings import StartTimings
from skyward.link import protocol as proto
from skyward.link.channel import Channel
from skyward.link.pickling import ship_client_modules
from skyward.link.protocol import RelayFailed
from skyward.pool import mapping, named, signals
from skyward.pool import profile as _profile
from skyward.pool.autoscale import Autoscaler
from skyward.pool.fallback import Attempt, Candidate, Choices, Spec, candidates
from skyward.pool.machines import Machines
from skyward.pool.mapping import check_chunksize
from skyward.pool.metrics import PoolMetrics, as_table
from skyward.pool.recovery import HangWatch, Recovery
from skyward.pool.scheduler import Pickled, PoolStatistics, Scheduler, Task
from skyward.pool.spec import FROM_05, PoolOptions, pickle_plugins, pool_signature
from skyward.pool.stacks import Stacks, collect
from skyward.pool.startup import Startup
from skyward.pool.streams import ResultStream, Streams, is_streaming, outgoing
from skyward.pool.streams import route as route_stream
from skyward.providers.base import Provider

R = TypeVar("R")
# draining: close(wait=True) is waiting for submitted calls; no new calls are taken.
State = Literal["new", "starting", "running", "draining", "closing", "closed"]

# Seconds a close that a Ctrl-C during the start hurried gives the workers to leave what they
# entered before it kills them.
_HURRIED_GRACE = 2.0


class ComputePool(CallTarget):
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
    ``keep_warm`` (seconds; cloud and Slurm pools) leaves the machines running after ``close()`` for
    the next pool of the same spec and size, which adopts them (they bill meanwhile).
    Progress also goes to the ``logging`` logger ``"skyward"``.
    """

    # help(), notebooks and inspect show every option with PoolSpec's default.
    __signature__: ClassVar[inspect.Signature] = pool_signature()

    def __init__(
        self,
        provider: Provider | Spec | None = None,
        *specs: Spec,
        **options: Unpack[PoolOptions],
    ) -> None:
        from skyward.providers.local import Local

        refuse_unknown(options, PoolOptions, "ComputePool", FROM_05)
        # Every spec (the keyword form is one) validated, transformed by the plugins and
        # checked by its provider, before anything is touched (pool/fallback.py). Only what
        # the caller gave: every default is PoolSpec's.
        self._choices = Choices(candidates(provider, specs, options))
        first = self._choices.candidates[0]
        self.spec = spec = first.spec  # the spec the pool started with, once it has
        self._plugin_payload = pickle_plugins(spec.plugins)
        self.image = first.image
        # Remote workers cannot import the client's own modules; local ones can.
        self._remote = any(not isinstance(c.spec.provider, Local) for c in self._choices.candidates)
        self._before_pickling()
        mode: ConsoleMode = "off" if spec.quiet else spec.console
        app = current_app()  # sky.App: defaults for the pools made inside it
        if app is not None and "console" not in options and "quiet" not in options:
            mode = app.console
        self._log_root = None if app is None else app.log_dir
        # The log directory is made when the pool starts: a pool only built (to check its
        # options) leaves no directory, and does not prune other pools' logs.
        self._console = Console(mode=mode, output=spec.output)
        self._console.metrics_expected = bool(self.image.metrics)
        out = self._console  # (``console`` is the option)

        self._lock = threading.Lock()  # guards: _state, _opening, _started_at
        self._changed = threading.Condition(self._lock)  # the pool closed, or a spawn ended
        self._closers = Sleepers()  # close() calls waiting for another thread's close
        self._state: State = "new"
        self._log_handlers: handlers.Installed | None = None  # logging=, while open
        self._client_hooks: ExitStack | None = None  # plugins' around_client, while open
        self._opening = 0  # workers being spawned now; a close waits for them
        self._hurried = False  # a Ctrl-C asked the close to hurry the workers
        self._started_at = 0.0
        self._ran = False  # the pool reached "running" (a close may then keep_warm)
        self._timings: dict[str, float] = {}  # timings(): the start's steps, in seconds
        self._streams: weakref.WeakSet[Streams] = weakref.WeakSet()  # ended by a close
        self._shared = SharedState()  # sky.dict(...) and the rest (collections.state)
        self._metrics = PoolMetrics(on_sample=out.metrics)  # sky.metrics' samples
        # The parts, each made from those before it (see the module docstring).
        self._machines = Machines(spec.provider, pool=spec.name, reporter=out)
        self._scheduler = Scheduler(
            name=spec.name,
            nodes=spec.initial_nodes,
            concurrency=spec.concurrency,
            gang=bool(spec.gang),
            bind_output=out.bind,
            address=self._machines.worker_address,
            who=lambda rank: self._machines.layout.label(rank),
        )
        self._startup = Startup(
            spec,
            image=self.image,
            plugins=self._plugin_payload,
            reporter=out,
            machines=self._machines,
            open_channel=self._open,
        )
        self._recovery = Recovery(
            self._scheduler,
            self._startup,
            layout=lambda: self._machines.layout,
            gang=spec.gang,
            start_timeout=spec.start_timeout,
            shutdown_timeout=spec.shutdown_timeout,
            status=out.status,
        )
        self._hangs = (
            HangWatch(
                self._scheduler,
                layout=lambda: self._machines.layout,
                bound=spec.hang_timeout,
                status=out.status,
            )
            if spec.gang and spec.hang_timeout is not None
            else None
        )
        self._autoscaler = (
            Autoscaler(
                self._scheduler,
                self._machines,
                self._startup,
                low=spec.initial_nodes,
                high=spec.nodes,
                concurrency=spec.concurrency,
                cooldown=spec.autoscale_cooldown,
                idle_timeout=spec.autoscale_idle_timeout,
                start_timeout=spec.start_timeout,
                shutdown_timeout=spec.shutdown_timeout,
                status=out.status,
                tick=spec.reconcile_tick_interval,
            )
            if spec.autoscaling
            else None
        )

    @classmethod
    def Named(cls, name: str, /, **options: Any) -> ComputePool:
        """The pool ``[pools.<name>]`` of ``skyward.toml`` describes (this directory's, then
        the user's configuration directory's), not started; ``options`` override its values.
        A wrong value is a ``ValueError`` naming the file, the table and the field."""
        known = set(cls.__signature__.parameters) - {"provider"}
        found = named.read_pool(name, options, known=known)
        try:
            return cls(found.provider, **found.options)
        except (TypeError, ValueError) as exc:
            raise named.wrong(found.where, exc) from exc

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def log_dir(self) -> Path | None:
        """Where this pool writes its nodes' output and its events (``skyward logs`` reads
        them); None before the pool starts, or when logs could not be written on this
        machine."""
        log = self._console.log_file
        return None if log is None else log.directory

    def __repr__(self) -> str:
        spec = self.spec
        nodes = f"{spec.nodes}"
        if spec.autoscaling:
            nodes = f"{self.current_nodes()} of ({spec.min_nodes}, {spec.nodes})"
        return f"<ComputePool {self.name!r} {spec.provider_kind} nodes={nodes} {self._state}>"

    def current_nodes(self) -> int:
        """How many nodes the pool has now: ``nodes``, or for ``nodes=(min, max)`` between
        the two as it grows and shrinks (0 before it starts and once it is closed)."""
        if self._state not in ("running", "draining"):
            return 0
        return self._scheduler.pressure().nodes

    @property
    def is_active(self) -> bool:
        """Whether the pool takes calls now (started, and not closing)."""
        return self._state == "running"

    @property
    def concurrency(self) -> int:
        """Calls each node runs at once."""
        return self.spec.concurrency

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
        try:
            self._leave_client_hooks(exc_type, exc, tb)  # they see why the block ended
        finally:
            self.close(wait=exc_type is None)

    def start(self) -> ComputePool:
        """Provision the nodes and start a worker on each; returns when all are ready."""
        spec = self.spec
        with self._lock:
            if self._state != "new":
                raise PoolClosed(f"pool {self.name!r} was already started ({self._state})")
            self._state = "starting"
            self._started_at = time.monotonic()
        try:
            # Before anything is logged; removed in _teardown, on every path.
            self._log_handlers = handlers.install(spec.logging)
        except BaseException:
            with self._lock:
                self._state = "closed"  # nothing was started
            raise
        atexit.register(self._close_at_exit)
        # SIGTERM and SIGHUP close the pool as Ctrl-C does, while it is open (pool/signals.py).
        signals.hold(self)
        self._console.log_file = PoolLog.open(
            spec.name,
            meta={"provider": spec.provider_kind, "nodes": spec.nodes},
            secrets=secrets_of(self.image.env),
            root=self._log_root,
        )
        self._metrics.open(self.log_dir if self.image.metrics else None)  # none: no file
        initial = spec.initial_nodes
        growing = f", growing to {spec.nodes} while calls wait" if spec.autoscaling else ""
        self._console.begin(
            f"starting {initial} node(s){growing} on {self._where()} (pool {self.name})",
            initial,
        )
        try:
            self._use(self._choices.provision(self._machines, self._console))
            provisioned = time.monotonic()
            self._timings["provision"] = provisioned - self._started_at
            spec = self.spec
            layout = self._machines.layout
            self._console.workers_per_node = layout.per_node
            deadline = Deadline(spec.start_timeout, f"start_timeout ({spec.start_timeout:g} s)")
            ranks = list(range(layout.workers))
            self._scheduler.attach(self._startup.bring_up(ranks, deadline, whole_pool=True))
            self._timings["workers"] = time.monotonic() - provisioned
        except BaseException as exc:
            self._console.end()
            closed_meanwhile = self._state in ("closing", "closed")
            if isinstance(exc, KeyboardInterrupt):
                # Ctrl-C (or SIGTERM) during the start: a worker still inside a plugin's start
                # that no stop interrupts (jax's initialize) reads no Shutdown until it is
                # in. The workers get a short grace to leave what they entered, then die.
                self._hurried = True
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
            self._ran = True  # a close may keep its machines warm (keep_warm)
            # A worker that died between Ready and now was not replaced (the pool was not
            # running yet); it is replaced now.
            lost = self._scheduler.open()
            register(self._shared.request)  # sky.dict(...) in this process means this pool's
            if self._hangs is not None:
                self._hangs.start()
            if self._autoscaler is not None:
                self._autoscaler.start()
            current.opened(self)  # `f(x) >> sky` in this thread means this pool now
        for channel in lost:
            assert channel.lost is not None
            self._recovery.on_lost(channel, channel.lost)
        most = f" of up to {spec.nodes}" if spec.autoscaling else ""
        per = self._machines.layout.per_node
        self._console.end(
            f"pool {self.name} ready: {initial} node(s){most}"
            f"{f' x {per} workers' if per > 1 else ''}, "
            f"{spec.accelerator or 'no accelerator'}, in "
            f"{time.monotonic() - self._started_at:.1f} s"
        )
        self._enter_client_hooks()
        return self

    def _where(self) -> str:
        kinds = [c.spec.provider_kind for c in self._choices.candidates]
        return " or then ".join(dict.fromkeys(kinds))

    def _use(self, chosen: Candidate) -> None:
        """The pool runs on ``chosen``'s machines: its spec and image from now on."""
        from skyward.providers.local import Local

        self.spec, self.image = chosen.spec, chosen.image
        self._remote = not isinstance(chosen.spec.provider, Local)
        self._startup.use(chosen.spec, chosen.image)

    @property
    def attempts(self) -> tuple[Attempt, ...]:
        """The specs tried when the pool started, in order, each with why it was given up
        (``error``), the one used last (its ``error`` None); empty before ``start``."""
        return self._choices.attempts

    def _enter_client_hooks(self) -> None:
        """The plugins' ``around_client`` contexts, first plugin outermost, once the pool
        runs; a failure closes the pool (``PluginError`` naming the plugin)."""
        plugins = [p for p in self.spec.plugins if p.around_client is not None]
        if not plugins:
            return
        stack = ExitStack()
        try:
            for plugin in plugins:
                assert plugin.around_client is not None
                try:
                    context = plugin.around_client(self, self.spec)
                    if not hasattr(context, "__enter__"):
                        raise PluginError(
                            f"plugin {plugin.name!r}: around_client must return a context "
                            f"manager, not {type(context).__name__}"
                        )
                    stack.enter_context(context)
                except PluginError:
                    raise
                except Exception as exc:
                    raise PluginError(
                        f"plugin {plugin.name!r}: around_client failed: {exc}"
                    ) from exc
            with self._lock:
                running = self._state == "running"
                if running:
                    self._client_hooks = stack  # close() leaves them from now on
            if not running:
                stack.close()
                raise PoolClosed(f"pool {self.name!r} was closed while it started")
        except BaseException as exc:
            try:
                stack.__exit__(type(exc), exc, exc.__traceback__)
            finally:
                self.close(wait=False)
            raise

    def _leave_client_hooks(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> None:
        """Exit the ``around_client`` contexts, last plugin first; once, whoever asks."""
        with self._lock:
            stack, self._client_hooks = self._client_hooks, None
        if stack is not None:
            stack.__exit__(exc_type, exc, tb)

    def _open(self, rank: int) -> Channel:
        """Spawn worker ``rank`` on its node (a new machine in the node's place if it is gone
        and the provider can replace it); the scheduler holds its channel from now on, so
        that a close ends it. Startup's ``open_channel``."""
        with self._lock:
            if self._state in ("closing", "closed"):
                raise PoolClosed(f"pool {self.name!r} is closing")
            # A close waits for spawns under way (see _teardown): a worker started while the
            # pool closes is then one the close sees, and stops with the others.
            self._opening += 1
            replace = self._state == "running"
        try:
            transport = self._machines.spawn(rank, self.image.env, replace=replace)
            layout = self._machines.layout
            channel = Channel(
                transport,
                node=layout.node_of(rank),
                rank=rank,
                label=layout.label(rank),
                output=self._console.output,
                on_lost=self._recovery.on_lost,
                on_broken=self._broken,
                on_result=self._console.flush,
                diagnose=self._machines.loss_reason,
                on_frame=self._frame,
            )
            self._scheduler.starting(channel)
        finally:
            with self._lock:
                self._opening -= 1
                self._changed.notify_all()
        return channel

    def _broken(self, channel: Channel) -> None:
        # Before its calls fail: nothing a caller does next may go to the dead worker.
        self._shared.forget(channel, f"{channel.label}'s worker was lost")
        self._recovery.on_broken(channel)

    def _frame(self, channel: Channel, message: Any, parts: proto.Parts) -> None:
        """A frame for the pool (a channel's ``on_frame``, on the thread reading its link),
        to its owner by type: a shared collection's request to the collections' state, a
        streaming call's value or demand to its stream, a relay's failure to the scheduler."""
        if isinstance(message, proto.Sample):
            self._metrics.record(self._machines.layout.node_of(channel.rank), message)
        elif isinstance(message, proto.Shared):
            self._shared.serve(channel, message, parts)
        elif isinstance(message, RelayFailed):
            self._scheduler.relay_failed(message)
        else:
            route_stream(channel, message, parts)

    def close(self, *, wait: bool = True) -> None:
        """Stop every worker and destroy the nodes. Idempotent; returns once the pool is
        closed, whichever thread does the closing.

        ``wait=True`` first lets submitted calls finish; ``wait=False`` fails the ones not
        yet started with ``PoolClosed`` and interrupts the running ones, also when another
        ``close()`` is already waiting for them (the stronger close takes over). Workers get
        ``shutdown_timeout`` seconds to leave their plugins' contexts, then are killed; the
        allocation's ``terminate`` always runs. The plugins' ``around_client`` contexts are
        exited first, while the workers still run.
        """
        current.closed(self)  # `>> sky` picks another pool from now on
        try:
            self._leave_client_hooks()
        finally:
            # Ctrl-C: it ends a wait (for submitted calls, or for another thread's close),
            # never the teardown, which then stops the workers and terminates the machines
            # whole; one that comes during the teardown is raised once it is done. While the
            # machines are destroyed a second one leaves at once (_shield).
            with hold_interrupts:
                self._close(wait=wait)

    def _close(self, *, wait: bool) -> None:
        with self._lock:
            if self._state == "new":
                self._state = "closed"
                self._scheduler.stop()
                return
            closing_elsewhere = self._state in ("draining", "closing", "closed")
            if closing_elsewhere and not wait:
                self._scheduler.hurry()  # a draining close stops waiting and cancels
        if closing_elsewhere:
            self._wait_closed()
            return
        with self._lock:
            if self._state in ("draining", "closing", "closed"):  # another close came first
                closing_elsewhere = True
            else:
                drain = wait and self._state == "running"
                self._state = "draining" if drain else "closing"
                if drain:
                    self._scheduler.drain()
                else:
                    self._scheduler.stop()
        if closing_elsewhere:
            if not wait:
                self._scheduler.hurry()
            self._wait_closed()
            return
        # A stream waits on its reader, who may be the caller of close: end them all, or a
        # waiting close would never see their workers go idle.
        closed = PoolClosed(f"pool {self.name!r} was closed while this stream was open")
        for streams in list(self._streams):
            streams.abandon(closed)
        cancel = True
        try:
            if drain:
                cancel = not self._scheduler.wait_idle()
        finally:
            self._teardown(cancel=cancel)

    def _wait_closed(self) -> None:
        """Until the close another thread is doing has finished; a Ctrl-C ends the wait."""
        while True:
            with self._lock:
                if self._state == "closed":
                    return
                waiter = self._closers.sleeper()
            self._closers.sleep(waiter)

    def _teardown(self, *, cancel: bool) -> None:
        unregister(self._shared.request)
        self._shared.close()  # waiters in shared collections get PoolClosed
        with self._lock:
            self._state = "closing"
            self._scheduler.stop()
        self._machines.cancel(f"pool {self.name!r} was closed")  # a replacement stops
        if self._autoscaler is not None:
            self._autoscaler.stop()  # an addition under way is cut short by the above
        with self._lock:
            while self._opening:  # bounded by the spawns' own connect and provision bounds
                self._changed.wait(0.5)
        queued, channels = self._scheduler.take_all()
        self._metrics.close()  # samples of workers on their way out are not kept
        hurried = False
        try:
            if self._hangs is not None:
                self._hangs.stop()
            closed = PoolClosed(f"pool {self.name!r} was closed before this call ran")
            for future in queued:
                fail(future, closed)
            for channel in channels:
                channel.shutdown(cancel=cancel)
            hurried = not self._workers_leave(channels)
            reason = "the close was hurried by Ctrl-C" if hurried else "it did not exit within "
            for channel in channels:
                if not channel.wait_closed(0):
                    channel.kill(reason if hurried else reason + "shutdown_timeout")
            for channel in channels:
                channel.wait_closed(5.0)
        finally:
            try:
                if self._autoscaler is not None:
                    # Its last step ends the workers and machines it had made; what it is
                    # still waiting for from a provider is terminated just below.
                    self._autoscaler.join(self.spec.shutdown_timeout + 5.0)
                # keep_warm: the machines of a pool that ran stay for the next pool like it.
                # After a Ctrl-C that hurried the workers, the next one leaves at once.
                self._machines.terminate(
                    keep=self.spec.keep_warm if self._ran else 0.0,
                    leave_after=1 if hurried else 2,
                )
            finally:
                with self._lock:
                    self._state = "closed"
                    self._changed.notify_all()
                self._closers.wake_all()
                self._console.flush()
                self._console.closed()
                handlers.remove(self._log_handlers)
                atexit.unregister(self._close_at_exit)
                signals.release(self)

    def _workers_leave(self, channels: Sequence[Channel]) -> bool:
        """Wait up to ``shutdown_timeout`` (``_HURRIED_GRACE`` after a start a Ctrl-C
        interrupted) for the workers to leave their plugins' contexts and exit; False if a
        Ctrl-C hurried the close, or ends this wait: the workers left are killed now (the
        machines are still destroyed, shielded), and the next Ctrl-C leaves. The Ctrl-C is
        raised again once the close is done."""
        grace = min(self.spec.shutdown_timeout, _HURRIED_GRACE if self._hurried else math.inf)
        deadline = time.monotonic() + grace
        try:
            for channel in channels:
                with allow_interrupts:  # inside the close's hold: a Ctrl-C ends this wait
                    channel.wait_closed(max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            raise_at_end()
            self._hurried = True
            self._console.status(
                f"pool {self.name}: Ctrl-C: killing the workers now; the machines are still "
                f"destroyed (Ctrl-C again to leave without waiting for that)"
            )
            return False
        return not self._hurried

    def _close_at_exit(self) -> None:
        if self._state not in ("closing", "closed"):
            self._console.status(f"closing pool {self.name} at interpreter exit")
        self.close(wait=False)

    # ── calls ───────────────────────────────────────────────────────────────────────────

    @overload
    def run(self, call: PendingCall[R], /) -> R: ...
    @overload
    def run(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R: ...
    def run(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on the least busy node and return its value.
        ``pool.run(f(x))`` (a pending call, alone) is ``f(x) >> pool``."""
        # One hold for the whole call (the books and the wait hold it too, nested): a
        # Ctrl-C lands only where the caller waits. See skyward.client.interrupts.
        with hold_interrupts:
            return self._submit([pending_call(fn, args, kwargs)], waited=True)[0].result()

    @overload
    def submit(self, call: PendingCall[R], /) -> Future[R]: ...
    @overload
    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]: ...
    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Like ``run`` but returns a ``concurrent.futures.Future`` at once."""
        return self._submit([pending_call(fn, args, kwargs)])[0]

    @overload
    def run_async(self, call: PendingCall[R], /) -> Future[R]: ...
    @overload
    def run_async(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]: ...
    def run_async(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        """``submit`` under skyward 0.5's name: what ``f(x) > pool`` does."""
        return self.submit(fn, *args, **kwargs)

    def run_parallel(self, group: CallGroup, /) -> Any:
        """``group >> pool``: the group's calls in parallel, their values as a tuple (or,
        for ``gather(..., stream=True)``, an iterator of them as they finish)."""
        if not isinstance(group, CallGroup):
            raise TypeError(
                f"run_parallel takes a group of calls, such as f(x) & g(y) or "
                f"sky.gather(...), not {type(group).__name__}"
            )
        return group >> self

    def submit_all(self, calls: Iterable[PendingCall[Any]], /) -> list[Future[Any]]:
        """Send several pending calls, each to the least busy node; their futures, in order.

        Every call is pickled before any is queued: one that cannot be pickled sends none.
        ``(f(x) & g(y)) >> pool`` and ``sky.gather(...) >> pool`` come here.
        """
        pending = list(calls)
        for call in pending:
            if not isinstance(call, PendingCall):
                raise TypeError(
                    f"submit_all takes pending calls such as f(x), not a {type(call).__name__}"
                )
        return self._submit(pending)

    @overload
    def broadcast(self, call: PendingCall[R], /) -> list[R]: ...
    @overload
    def broadcast(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> list[R]: ...
    def broadcast(self, fn: Any, /, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every worker (every node, with one worker per node);
        results by rank (node-major: node 0's workers first).
        ``pool.broadcast(f(x))`` (a pending call, alone) is ``f(x) @ pool``."""
        call = pending_call(fn, args, kwargs)
        if is_streaming(call):
            raise TypeError(
                f"{call.name} streams (a generator, or an iterator argument): send it to one "
                f"node with >>; a broadcast of a stream is not supported yet"
            )
        self._before_pickling()
        pickled = _pickle(call, timeout=self.spec.default_compute_timeout)  # once, for every node
        futures = self._scheduler.broadcast(pickled, self._console.route())
        if futures is None:
            raise self._refused()
        result: list[Any] = gather(futures, list).result()
        return result

    def map(
        self,
        fn: Callable[..., R],
        iterable: Iterable[Any],
        /,
        *,
        chunksize: int | None = None,
        ordered: bool = True,
        progress: bool | None = None,
    ) -> list[R]:
        """``[fn(x) for x in iterable]`` spread over the nodes; results in input order
        (``ordered=False``: in the order they finish).

        ``chunksize=N`` sends N items per call (one round trip for N results); ``None``
        measures how long an item takes and sends about 20 ms of items per call (see
        ``skyward.pool.mapping``). A bar shows progress on a terminal or in a notebook for
        maps that run longer than a second (``progress=False``: never; ``True``: even
        where the console would show none). The first failure (in input order) is raised
        and the chunks still queued are cancelled; those already on a worker finish and
        their results are dropped.
        """
        return list(
            self._map(fn, iterable, chunksize=chunksize, ordered=ordered, progress=progress)
        )

    def imap(
        self,
        fn: Callable[..., R],
        iterable: Iterable[Any],
        /,
        *,
        chunksize: int | None = None,
        progress: bool | None = None,
    ) -> Iterator[R]:
        """``map``, lazily: results in input order as they come, the iterable read only as
        far as the chunks in flight need (an endless generator is fine). Stopping the
        iteration cancels what is still queued."""
        return self._map(fn, iterable, chunksize=chunksize, ordered=True, progress=progress)

    def imap_unordered(
        self,
        fn: Callable[..., R],
        iterable: Iterable[Any],
        /,
        *,
        chunksize: int | None = None,
        progress: bool | None = None,
    ) -> Iterator[R]:
        """``imap``, with each result as soon as its chunk finishes, whatever its place."""
        return self._map(fn, iterable, chunksize=chunksize, ordered=False, progress=progress)

    def _map(
        self,
        fn: Callable[..., R],
        iterable: Iterable[Any],
        *,
        chunksize: int | None,
        ordered: bool,
        progress: bool | None,
    ) -> Iterator[R]:
        check_chunksize(chunksize)  # now, not at the first next()
        total = len(iterable) if isinstance(iterable, Sized) else None
        name = getattr(fn, "__name__", None) or type(fn).__name__
        bar = map_bar(self._console.mode, total, f"map {name}", progress)

        def submit(calls: list[PendingCall[Any]], function: bytes | None) -> list[Future[Any]]:
            return self._submit(calls, same_function=True, prefetch=True, function=function)

        slots = self.spec.nodes * self.spec.concurrency
        return mapping.results(
            submit, fn, iterable, slots=slots, chunksize=chunksize, ordered=ordered, bar=bar
        )

    def _submit(
        self,
        calls: Sequence[PendingCall[Any]],
        *,
        same_function: bool = False,
        prefetch: bool = False,
        waited: bool = False,
        function: bytes | None = None,
    ) -> list[Future[Any]]:
        """Queue calls for the least busy nodes, all pickled before any is queued; the
        futures their callers get.

        ``prefetch`` (a map: the caller waits for the lot, and the first failure fails it)
        lets a node whose recent calls were short hold a few calls more than
        ``concurrency``, so its worker finds the next call waiting instead of idling for a
        round trip. ``waited``: the caller waits for the result at once, reading it itself.
        A generator function's caller gets a future that already holds its ``ResultStream``.
        ``function``: the calls' function pickled already (a map's chunks).
        """
        if self._remote:
            self._before_pickling()
        if function is None and same_function and calls:
            function = calls[0].serialize_function()
        route = self._console.route()
        tasks: list[Task] = []
        futures: list[Future[Any]] = []  # what the callers get
        default = self.spec.default_compute_timeout
        for call in calls:
            future: Future[Any] = CallFuture()
            sent, state = outgoing(call, future)  # a generator, or iterator arguments
            tasks.append(
                Task(
                    _pickle(sent, function, timeout=default),
                    future,
                    route=route,
                    prefetch=prefetch,
                    streams=state,
                    waited=waited and state is None,
                )
            )
            if state is not None:
                self._streams.add(state)  # a close ends it
                if state.window:  # a generator's values: the caller gets them at once
                    future = CallFuture()
                    future.set_result(ResultStream(state, call.name))
            futures.append(future)
        if not self._scheduler.submit(tasks):  # every call is pickled by now
            raise self._refused()
        return futures

    def _before_pickling(self) -> None:
        if self._remote:
            ship_client_modules()  # the client's own modules go by value to remote workers

    def _refused(self) -> PoolClosed:
        """Why the scheduler took no call now: the pool is not running."""
        state: str = self._state
        if state in ("new", "starting", "running"):  # the scheduler's word is the newer
            state = self._scheduler.refusal()
        return self._not_running(state)

    def _not_running(self, state: str) -> PoolClosed:
        if state in ("new", "starting"):
            return PoolClosed(
                f"pool {self.name!r} is not started: use `with sky.ComputePool(...) as pool:` "
                f"or `pool.start()` before sending calls"
            )
        # draining refuses new calls too, as Executor.shutdown does
        return PoolClosed(f"pool {self.name!r} is {state}: it takes no new calls")

    # ── introspection ───────────────────────────────────────────────────────────────────

    def metrics(self) -> Any:
        """The nodes' live metrics so far (``sky.Image(metrics=...)``): a row per node and
        sample, columns ``node``, ``time`` and one per metric; a pandas DataFrame when
        pandas is installed, else a list of dicts. Kept after the pool closes."""
        return as_table(self._metrics.rows())

    def plot_metrics(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write a PNG of the nodes' metrics over time, a panel per metric (needs
        matplotlib, ``skyward[plot]``); by default ``metrics.png`` in the pool's log
        directory. Returns its path."""
        from skyward.console.metrics_plot import plot

        if path is None:
            if self.log_dir is None:
                raise ValueError(f"pool {self.name!r} has no log directory: give a path")
            path = self.log_dir / "metrics.png"
        return plot(self._metrics.rows(), Path(path), title=f"pool {self.name}")

    def statistics(self) -> PoolStatistics:
        with self._lock:
            state = self._state
            uptime = time.monotonic() - self._started_at if self._started_at else 0.0
        return self._scheduler.statistics(state, uptime)

    def timings(self) -> StartTimings:
        """Where the start spent its time, in seconds: a mapping of ``provision`` (the
        machines made or adopted, reached and bootstrapped), ``workers`` (spawn to every
        worker ready), the provider's own steps as it measured them (a warm start's
        ``warm.claim``, ``warm.describe``, ``warm.reach``, ``warm.unkeep``), and each node
        stage's slowest node (``boot``, the bootstrap's ``cache``/``uv``/``python``/
        ``packages``/..., ``worker``, ``plugins``); ``.nodes`` has every node's stages and
        ``print(pool.timings())`` a table (``console/timings.py``)."""
        steps = dict(self._timings)
        steps.update(self._machines.timings())
        return self._console.timings().with_steps(steps)

    def stacks(self, timeout: float = 10.0) -> Stacks:
        """Every worker's Python stacks right now, labelled as the pool names its workers
        (``node 1``, ``node 0 worker 1``), without stopping anything: where a slow or stuck
        call is. ``print(pool.stacks())``; ``stacks[rank]`` for one."""
        if self._state != "running":
            raise self._not_running(self._state)
        return collect(self._scheduler.workers(), timeout, self._machines.layout.label)

    def profile(self, directory: str | os.PathLike[str]) -> _profile.Profile:
        """``with pool.profile("traces/"):`` traces every node with ``jax.profiler``."""
        return _profile.profile(self, directory, self._machines.layout.label)

    # ── shared collections: sky.dict(...) and the rest, bound to this pool ──────────────
    # (last in the class: ``dict`` and ``set`` name methods from here on)

    def dict(self, name: str, *, consistency: str | None = None) -> DictProxy:
        return DictProxy(name, self._shared.request)

    def set(self, name: str, *, consistency: str | None = None) -> SetProxy:
        return SetProxy(name, self._shared.request)

    def counter(self, name: str, *, consistency: str | None = None) -> CounterProxy:
        return CounterProxy(name, self._shared.request)

    def queue(self, name: str) -> QueueProxy:
        return QueueProxy(name, self._shared.request)

    def barrier(self, name: str, n: int) -> BarrierProxy:
        return BarrierProxy(name, n, self._shared.request)

    def lock(self, name: str) -> LockProxy:
        return LockProxy(name, self._shared.request)


# The public skyward project's later name for the pool (``sky.Compute(...)``).
Compute = ComputePool


def _pickle(
    call: PendingCall[Any], function: bytes | None = None, *, timeout: float | None = None
) -> Pickled:
    """A call as the scheduler sends it: the one place calls are pickled (``_submit`` and
    ``broadcast`` come here), before the scheduler sees them. ``function``: the function's
    pickle, made once for a map's many calls. ``timeout``: the pool's
    ``default_compute_timeout``, for a call without a timeout of its own."""
    bound = call.timeout if call.timeout is not None else timeout
    return Pickled(call.name, bound, call.serialize(function))
