"""Where calls go: one slot per worker (per node, unless nodes run several), the pool's
queue, least busy first, map prefetch, call timeouts, and broadcasts (relayed between nodes
where that spares the client's link).

::

    submit(tasks)      queue → pump: the least busy ready slot with room takes the head
    broadcast(call)    one part per slot, sent at once, so every worker sees broadcasts in the
                       same order (SPMD programs need it); a slot whose worker is being
                       replaced holds its part in its backlog
    a call finishes    the slot's books (busy, recent time) → pump again → the future
                       settles (on the thread that read the result, after the lock is let go)
    a call times out   its slot leaves rotation, the call fails with TimeoutError and its
                       worker is killed: lost, it is replaced like any other (recovery)
    autoscaling        ``grow`` adds slots for new nodes at the end; ``retire`` takes the
                       last slot out, in the same step as it finds it idle, so no call can
                       be sent to a node being released (pool/autoscale.py decides when)

The scheduler is the only owner of its slots, queue, backlogs, counters and call deadlines:
the pool, recovery and the hang watch call its methods, each of which takes the scheduler's
own lock briefly. Under it nothing waits on a worker (a channel's ``submit`` never waits)
and no future settles: settling runs callers' callbacks, which may call back in, so
failures found under the lock are settled once it is let go (``_fail_each``). The pool may call
in while it holds its own lock; nothing here calls the pool.

Intake, only ever forward: starting (workers come up; no calls taken) → open (the pool runs)
→ draining (a close waits for the calls it has; no new ones) → shut (the pool closes: no
sends, no replacements; what is queued or held is handed back).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from skyward._errors import WorkerLost
from skyward.client.futures import LOSS_GRACE, CallFuture, Sleepers, deliver, fail, notify_cancelled
from skyward.client.interrupts import hold_interrupts
from skyward.console import Route
from skyward.link import protocol as proto
from skyward.link.channel import Channel
from skyward.link.protocol import Relay, RelayAbort, RelayFailed, RelayPayload

if TYPE_CHECKING:  # a streaming call's state, handed to its channel as it is sent
    from skyward.pool.streams import Streams

# A map may queue calls beyond a node's slots when its recent calls were short, so that its
# worker finds the next call waiting instead of idling for a round trip: as many as keep the
# last of them waiting about PREFETCH_BELOW seconds at most, and never more than
# PREFETCH_MAX. A node whose calls take longer than PREFETCH_BELOW gets none.
PREFETCH_BELOW = 0.01
PREFETCH_MAX = 8

_NEVER = float("inf")  # a slot's ``recent`` before its first call finished

# The intake (see the module docstring); it only moves forward.
_STARTING, _OPEN, _DRAINING, _SHUT = range(4)


class Pickled(NamedTuple):
    """A call as the scheduler sends it: pickled once, before it reaches the scheduler (the
    pool does that), with what messages and the timeout need of it. (A tuple: made for
    every call, it costs a third of a frozen dataclass.)"""

    name: str
    timeout: float | None
    payload: proto.Parts


@dataclass(eq=False, slots=True)
class Task:
    call: Pickled
    future: Future[Any]
    broadcast: bool = False  # bound to one node: waits for that node, never moves
    route: Route | None = None  # where its output goes (the Jupyter cell that submitted it)
    prefetch: bool = False  # part of a map: may wait on a worker behind another call
    siblings: Sequence[Future[Any]] = ()  # a broadcast's parts, this one's future included
    streams: Streams | None = None  # a streaming call's state (pool.streams)
    relay: Relay | None = None  # its part in a relayed broadcast, for its first send
    sent_before: bool = False  # handed to a worker once already (its future is running)
    waited: bool = False  # its caller waits for it at once, reading its link (CallFuture)
    queued_at: float = 0.0  # when it entered the queue (time.monotonic): autoscaling reads it


@dataclass(eq=False)
class Slot:
    """One worker's place in the scheduler (a worker rank's: a new worker after a loss
    takes the same slot), its current worker process and the books on it."""

    rank: int
    channel: Channel | None = None
    ready: bool = False  # in rotation: takes new calls
    busy: int = 0  # calls sent and not finished, broadcasts included
    recent: float = float("inf")  # seconds a call takes here, averaged over recent calls
    last_done: float = 0.0  # when its last call finished
    lost: WorkerLost | None = None  # set when the node cannot get a worker any more
    backlog: list[Task] = field(default_factory=list)  # broadcasts waiting for a new worker
    idle_since: float = field(default_factory=time.monotonic)  # when it last had no call
    # sent and not finished, by id: the task, when it was sent, and to which worker
    running: dict[int, tuple[Task, float, Channel]] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Running:
    """A call running on a node, as ``Scheduler.running`` shows it (to the hang watch)."""

    rank: int
    channel: Channel
    task: Task
    since: float  # when it was sent (time.monotonic)


class Pressure(NamedTuple):
    """What autoscaling reads (``Scheduler.pressure``): the nodes, the calls queued, and
    how long the oldest of them has waited."""

    nodes: int
    queued: int
    waited: float  # seconds the head of the queue has waited; 0 when nothing is queued


@dataclass(frozen=True)
class PoolStatistics:
    """A snapshot of a pool's work. ``in_flight`` is per worker, by rank (per node, with one
    worker per node); ``ready_nodes`` counts the nodes all of whose workers take calls."""

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
    workers: int = 0
    ready_workers: int = 0


def prefetch_depth(recent: float) -> int:
    """Calls a map may queue past a node's slots, given the time a call recently took there
    (not counting its wait behind the calls queued before it): the last queued waits about
    ``PREFETCH_BELOW`` at most."""
    return PREFETCH_MAX if recent <= 0 else min(PREFETCH_MAX, int(PREFETCH_BELOW / recent))


Failures = list[tuple[Future[Any], BaseException]]


def _fail_each(failures: Failures) -> None:
    for future, error in failures:
        fail(future, error)


class Scheduler:
    """The slots, the queue and the books of one pool. See the module docstring.

    Its slots are the workers ``attach`` first gives it, by rank. ``bind_output(rank,
    route)`` is called before a call is sent (its prints go to the caller's cell);
    ``address(rank)`` says where worker ``rank`` is now (a relay names it to the worker
    before it). Thread-safe.
    """

    def __init__(
        self,
        *,
        name: str,
        nodes: int,
        concurrency: int,
        gang: bool,
        bind_output: Callable[[int, Route | None], None],
        address: Callable[[int], str],
        who: Callable[[int], str] = lambda rank: f"node {rank}",
    ) -> None:
        self._name = name
        self._who = who  # how messages name a worker rank (Layout.who)
        self._concurrency = concurrency
        self._gang = gang
        self._bind_output = bind_output
        self._address = address
        # guards: everything below, and every slot's fields
        self._lock = threading.RLock()
        self._idle = Sleepers()  # threads in wait_idle, woken as calls finish
        self._watchers = 0  # threads in wait_idle
        self._hurried = False  # wait_idle gives up (a stronger close came)
        self._intake = _STARTING
        self._nodes = nodes
        self._slots: list[Slot] = []  # by worker rank, made by attach
        self._queue: deque[Task] = deque()
        self._starting: set[Channel] = set()  # workers spawned, not yet in their slot
        self._failures: Failures = []  # found under the lock, settled once it is let go
        self._pumping = False
        self._submitted = self._succeeded = self._failed = self._replaced = 0
        # Gang broadcasts: parts sent or held and not finished, and whole broadcasts waiting
        # for them to finish (call, route, futures).
        self._gang_running = 0
        self._gang_waiting: deque[tuple[Pickled, Route | None, list[Future[Any]]]] = deque()
        self._fanout = Fanout(self._lock)  # relayed broadcasts in flight
        self._timeouts = CallTimeouts(self._expired)

    # ── intake ──────────────────────────────────────────────────────────────────────────

    def open(self) -> list[Channel]:
        """The pool runs: take calls from now on. Returns the workers that were lost while
        the pool started (nobody replaced them then); nothing if it is closing already."""
        with self._lock:
            if self._intake != _STARTING:
                return []
            self._intake = _OPEN
            return [s.channel for s in self._slots if s.channel and s.channel.lost]

    def drain(self) -> None:
        """Take no new calls; queued and held ones still start (a close that waits)."""
        with self._lock:
            self._intake = max(self._intake, _DRAINING)

    def stop(self) -> None:
        """Take no new calls, start nothing more, replace no worker: the pool closes."""
        with self._lock:
            self._intake = _SHUT
            self._idle.wake_all()
        self._timeouts.stop()

    def refusal(self) -> str:
        """Why a call is refused now: ``"starting"``, ``"draining"`` or ``"closing"``."""
        return {_STARTING: "starting", _DRAINING: "draining"}.get(self._intake, "closing")

    # ── calls ───────────────────────────────────────────────────────────────────────────

    def submit(self, tasks: Sequence[Task]) -> bool:
        """Queue ``tasks`` and start what can start; False (nothing queued) unless open.
        A Ctrl-C waits until the books agree with what was sent (see ``skyward.client.interrupts``).
        """
        with hold_interrupts:
            with self._lock:
                if self._intake != _OPEN:
                    return False
                now = time.monotonic()
                for task in tasks:
                    task.queued_at = now
                self._submitted += len(tasks)
                self._queue.extend(tasks)
                self._pump()
                failures = self._failures
                if failures:
                    self._failures = []
            if failures:
                _fail_each(failures)
            return True

    def broadcast(self, call: Pickled, route: Route | None) -> list[Future[Any]] | None:
        """One part of ``call`` per node, sent now where it can be; None (nothing sent)
        unless open.

        In a gang, a broadcast waits while any part of an earlier one still runs on any
        node: its collectives would otherwise pair with the earlier one's on a rank that is
        behind, and both would return each other's data.
        """
        with hold_interrupts:  # as in submit
            with self._lock:
                if self._intake != _OPEN:
                    return None
                futures: list[Future[Any]] = [CallFuture() for _ in self._slots]
                self._submitted += len(futures)
                if self._gang and (self._gang_running or self._gang_waiting):
                    self._gang_waiting.append((call, route, futures))
                else:
                    self._dispatch_broadcast(call, route, futures)
                failures = self._take_failures()
            if failures:
                _fail_each(failures)
            return futures

    def wait_idle(self) -> bool:
        """Until nothing is queued, held or running (True), or ``hurry`` was called (False).
        A Ctrl-C ends the wait (only the wait: see ``skyward.client.interrupts``)."""
        with hold_interrupts:
            with self._lock:
                self._watchers += 1
            try:
                while True:
                    with self._lock:
                        if not (
                            self._queue
                            or self._gang_waiting
                            or any(s.busy or s.backlog for s in self._slots)
                        ):
                            return True
                        if self._hurried:
                            return False
                        waiter = self._idle.sleeper()
                    self._idle.sleep(waiter, 1.0)
            finally:
                with self._lock:
                    self._watchers -= 1

    def hurry(self) -> None:
        """``wait_idle`` returns False now: a close that cancels took over from one that
        waited."""
        with self._lock:
            self._hurried = True
            self._idle.wake_all()

    def relay_failed(self, report: RelayFailed) -> None:
        """A node could not reach the next one in a relay (``Fanout.failed``)."""
        with self._lock:
            if not self._fanout.unreachable and not report.connected:
                logging.getLogger("skyward").warning(
                    "skyward: pool %s relays no more broadcasts between its nodes, they "
                    "cannot all reach each other (%s); each node gets them from this machine",
                    self._name,
                    report.reason,
                )
            self._fanout.failed(report)

    # ── workers: start, loss, replacement, close ────────────────────────────────────────

    def starting(self, channel: Channel) -> None:
        """A worker was spawned for rank ``channel.rank`` and is coming up: until it is
        attached (or discarded), ``take_all`` hands it over with the rest."""
        with self._lock:
            self._starting.add(channel)

    def discard(self, channels: Iterable[Channel]) -> None:
        """Workers that will not join (their start failed; the caller ended them)."""
        with self._lock:
            self._starting.difference_update(channels)

    def attach(self, channels: Sequence[Channel]) -> None:
        """The pool's first workers, ready, one for each rank: the slots, each with its
        worker."""
        with self._lock:
            if self._intake == _SHUT:
                return  # closed while they started: take_all handed them to the close
            self._slots = [Slot(rank) for rank in range(len(channels))]
            for channel in channels:
                self._starting.discard(channel)
                slot = self._slots[channel.rank]
                slot.channel = channel
                slot.ready = True
                slot.idle_since = time.monotonic()

    def replace(self, channels: Sequence[Channel]) -> bool:
        """New workers, ready, in place of lost ones: their slots take calls again and get
        the broadcast parts they held. False (nothing attached) if the pool is closing.

        In a gang, a held part whose broadcast already ran elsewhere on the old workers
        fails instead of starting alone (see ``_split_error``).
        """
        with self._lock:
            if self._intake not in (_OPEN, _DRAINING):
                return False
            slots = [self._slots[channel.rank] for channel in channels]
            for slot, channel in zip(slots, channels, strict=True):
                self._starting.discard(channel)
                self._replaced += 1
                slot.channel = channel
                slot.ready = True
                slot.recent = float("inf")
                slot.idle_since = time.monotonic()
            # Decide for every part before any is sent: a part sent here is not "already run".
            held = [(s, task, self._gang and _split(task)) for s in slots for task in s.backlog]
            for slot in slots:
                slot.backlog = []
            for slot, task, split in held:
                if split:
                    error = _split_error(slot.rank, self._who(slot.rank), task)
                    self._failures.append((task.future, error))
                else:
                    self._send(slot, task)
            self._pump()
            failures = self._take_failures()
        if failures:
            _fail_each(failures)
        return True

    def grow(self, channels: Sequence[Channel]) -> bool:
        """New nodes, ready, at the end (``channel.rank`` is the next rank each; one worker
        per node, as autoscaling needs): their slots take calls at once. False (nothing
        attached) if the pool is closing."""
        with self._lock:
            if self._intake not in (_OPEN, _DRAINING):
                return False
            for channel in channels:
                assert channel.rank == len(self._slots), "nodes are added at the end"
                self._starting.discard(channel)
                self._slots.append(Slot(channel.rank, channel=channel, ready=True))
                self._nodes += 1
            self._pump()
            failures = self._take_failures()
        if failures:
            _fail_each(failures)
        return True

    def retire(self, *, keep: int, idle_for: float) -> tuple[int, Channel | None] | None:
        """Take the last node out of the pool if there are more than ``keep`` and it has
        been idle (no call, no part held, nothing queued) for ``idle_for`` seconds; its rank
        and worker, for the caller to stop. In one step under the lock: from the moment it
        is found idle no call can be sent to it. None if it is not to go."""
        with self._lock:
            if len(self._slots) <= keep or self._queue or self._intake != _OPEN:
                return None
            slot = self._slots[-1]
            idle = slot.ready and not slot.busy and not slot.backlog and not slot.running
            if not idle or time.monotonic() - slot.idle_since < idle_for:
                return None
            self._slots.pop()
            self._nodes -= 1
            slot.ready = False
            return slot.rank, slot.channel

    def pressure(self) -> Pressure:
        with self._lock:
            self._drop_cancelled()
            waited = time.monotonic() - self._queue[0].queued_at if self._queue else 0.0
            return Pressure(len(self._slots), len(self._queue), waited)

    def broken(self, channel: Channel, *, everyone: bool) -> None:
        """``channel``'s stream ended: its node (``everyone``: every node, a gang about to
        restart) takes no new calls; the nodes after it in a relay get nothing from it."""
        with self._lock:
            if self._holds(channel):
                for slot in self._slots if everyone else [self._slots[channel.rank]]:
                    slot.ready = False
            self._fanout.lost(channel, f"{channel.label}'s worker ended")

    def detach(self, channel: Channel) -> bool:
        """``channel``'s worker is gone: empty its slot. False if it was not the slot's
        worker any more, or if the pool does not run (starting: ``open`` reports it;
        closing: nothing is replaced)."""
        with self._lock:
            slot = self._slot_of(channel)
            if slot is None or self._intake not in (_OPEN, _DRAINING):
                return False
            slot = self._slots[channel.rank]
            slot.channel = None
            slot.ready = False
            return True

    def pause_all(self) -> list[Channel]:
        """Every node out of rotation (a gang restarts); returns the workers they have."""
        with self._lock:
            for slot in self._slots:
                slot.ready = False
            return [s.channel for s in self._slots if s.channel is not None]

    def lose(self, errors: Mapping[int, WorkerLost]) -> None:
        """Nodes that cannot get a worker any more: the parts they held fail, and so does
        the queue if no node is left."""
        with self._lock:
            for rank, error in errors.items():
                slot = self._slots[rank]
                slot.lost = error
                backlog, slot.backlog = slot.backlog, []
                self._failures.extend((task.future, error) for task in backlog)
            self._pump()
            self._idle.wake_all()
            failures = self._take_failures()
        if failures:
            _fail_each(failures)

    def take_all(self) -> tuple[list[Future[Any]], list[Channel]]:
        """The pool is closing (``stop`` came first): empty the queue and every backlog, and
        take every slot out of rotation. Returns the futures of the calls that will never
        run, and every worker, started or starting, for the close to end."""
        with self._lock:
            self._intake = _SHUT
            futures = [f for _, _, parts in self._gang_waiting for f in parts]
            futures += [task.future for task in self._queue]
            futures += [task.future for slot in self._slots for task in slot.backlog]
            self._gang_waiting.clear()
            self._queue.clear()
            for slot in self._slots:
                slot.backlog.clear()
                slot.ready = False
            channels = [s.channel for s in self._slots if s.channel is not None]
            channels += [c for c in self._starting if c not in channels]
            self._starting.clear()
            return futures, channels

    # ── what others may see ─────────────────────────────────────────────────────────────

    def statistics(self, state: str, uptime: float) -> PoolStatistics:
        with self._lock:
            self._drop_cancelled()
            per = max(1, len(self._slots) // self._nodes)
            nodes = [self._slots[n * per : (n + 1) * per] for n in range(len(self._slots) // per)]
            return PoolStatistics(
                name=self._name,
                state=state,
                nodes=self._nodes,
                ready_nodes=sum(all(s.ready for s in slots) for slots in nodes),
                workers=len(self._slots),
                ready_workers=sum(s.ready for s in self._slots),
                queued=len(self._queue),
                in_flight=tuple(s.busy for s in self._slots),
                submitted=self._submitted,
                succeeded=self._succeeded,
                failed=self._failed,
                workers_replaced=self._replaced,
                uptime=uptime,
            )

    def workers(self) -> dict[int, Channel | None]:
        """Each rank's current worker (None while one is being started)."""
        with self._lock:
            return {s.rank: s.channel for s in self._slots}

    def running(self) -> tuple[list[Running], list[int]]:
        """The calls running now, and how many calls each node has in flight, by rank."""
        with self._lock:
            running = [
                Running(slot.rank, channel, task, sent)
                for slot in self._slots
                for task, sent, channel in slot.running.values()
            ]
            return running, [s.busy for s in self._slots]

    @property
    def workers_count(self) -> int:
        """How many worker ranks the pool has (0 before ``attach``)."""
        with self._lock:
            return len(self._slots)

    # ── inside: lock held ───────────────────────────────────────────────────────────────

    def _drop_cancelled(self) -> None:
        """Calls cancelled while queued (a group past its timeout, a map that failed) are
        no demand: out of the queue now rather than when a node would have taken them."""
        if any(task.future.done() for task in self._queue):
            for task in self._queue:
                notify_cancelled(task.future)  # it never runs: wait() may count it now
            self._queue = deque(task for task in self._queue if not task.future.done())

    def _slot_of(self, channel: Channel) -> Slot | None:
        """``channel``'s slot, if it is still that slot's worker (a retired node has none)."""
        rank = channel.rank
        if rank < len(self._slots) and self._slots[rank].channel is channel:
            return self._slots[rank]
        return None

    def _holds(self, channel: Channel) -> bool:
        """Whether ``channel`` is its rank's worker now (never before ``attach``)."""
        return channel.rank < len(self._slots) and self._slots[channel.rank].channel is channel

    def _take_failures(self) -> Failures:
        failures, self._failures = self._failures, []
        return failures

    def _dispatch_broadcast(
        self, call: Pickled, route: Route | None, futures: list[Future[Any]]
    ) -> None:
        # In a gang, no part starts until every node has a worker of the same generation.
        wait = self._gang and not all(s.ready or s.lost is not None for s in self._slots)
        if self._gang:  # counted before any part can finish, so the count reaches 0 last
            self._gang_running += len(futures)
        now: list[tuple[Slot, Task]] = []
        for slot, future in zip(self._slots, futures, strict=True):
            task = Task(call, future, broadcast=True, route=route, siblings=futures)
            if slot.lost is not None:
                self._failures.append((future, slot.lost))
            elif wait or not slot.ready:
                slot.backlog.append(task)  # its worker (or its gang) is being replaced
            else:
                now.append((slot, task))
        if self._fanout.worth_it(call.payload, [slot.channel for slot, _ in now]):
            self._relay(now, futures)
        else:
            for slot, task in now:
                self._send(slot, task)
        if self._gang:
            for future in futures:
                future.add_done_callback(self._gang_part_done)

    def _relay(self, parts: list[tuple[Slot, Task]], futures: list[Future[Any]]) -> None:
        """Send a broadcast's payload over the client's link once, to the first node, which
        relays it to the others (see "relayed broadcasts" below); they get their calls
        first, without it."""
        token = self._fanout.token()
        (first, first_task), rest = parts[0], parts[1:]
        receivers: list[tuple[int, str, Channel]] = []
        for slot, task in rest:
            task.relay = Relay(token, inbound=True)
            channel = slot.channel
            if self._send(slot, task) and channel is not None:
                receivers.append((slot.rank, self._address(slot.rank), channel))
        first_task.relay = self._fanout.chain(token, receivers)
        root = first.channel
        if not self._send(first, first_task) or root is None:
            for _, _, channel in receivers:  # held for a new worker: it will not relay
                broke = f"{self._who(first.rank)}: its link broke"
                channel.send(RelayAbort(token, first.rank, broke))
            return
        channels = [root] + [channel for _, _, channel in receivers]
        self._fanout.started(token, channels, first_task.call.payload, futures)

    def _gang_part_done(self, _: Future[Any]) -> None:
        with self._lock:
            self._gang_running -= 1
            while self._gang_running == 0 and self._gang_waiting:
                self._dispatch_broadcast(*self._gang_waiting.popleft())
            failures = self._take_failures()
        if failures:
            _fail_each(failures)

    def _pump(self) -> None:
        """Send queued calls to the least busy ready nodes with a free slot."""
        if self._pumping or self._intake not in (_OPEN, _DRAINING):
            # Re-entered (a call sent below failed at once and its books pumped): the outer
            # loop carries on with the queue.
            return
        self._pumping = True
        try:
            limit = self._concurrency
            queue, slots = self._queue, self._slots
            while queue:
                head = queue[0]
                prefetch = head.prefetch and head.call.timeout is None  # a timeout starts at send
                slot = None  # the least busy ready slot with room; the first of equals
                for s in slots:
                    if (
                        s.ready
                        and s.busy < limit + (prefetch_depth(s.recent) if prefetch else 0)
                        and (slot is None or s.busy < slot.busy)
                    ):
                        slot = s
                if slot is None:
                    if slots and all(s.lost is not None for s in slots):
                        self._fail_queue(slots[0].lost)
                    return
                self._send(slot, queue.popleft())
                queue = self._queue  # _send may have put it back, _fail_queue replaced it
        finally:
            self._pumping = False

    def _fail_queue(self, error: BaseException | None) -> None:
        lost = WorkerLost(f"pool {self._name!r} has no node left to run calls on: {error}", node=-1)
        while self._queue:
            self._failures.append((self._queue.popleft().future, lost))

    def _send(self, slot: Slot, task: Task) -> bool:
        """Hand one task to ``slot``'s worker; whether it took it. Never blocks (see
        Channel)."""
        if task.sent_before:
            if task.future.done():
                return False  # timed out or closed before this retry
        else:
            try:
                if not task.future.set_running_or_notify_cancel():
                    return False  # cancelled while queued
            except RuntimeError:
                return False  # settled by someone else while queued
            task.sent_before = True
        assert slot.channel is not None
        channel = slot.channel
        sent = time.monotonic()

        def done(error: BaseException | None, value: Any) -> None:
            # The pool's books first, so that statistics() agree with what the caller has
            # seen. (A timeout or close fails the caller's future first; the books follow
            # when the worker is gone.)
            self._call_done(slot, error is None, sent, task)
            if error is not None:
                fail(task.future, error)
            else:
                deliver(task.future, value)  # a channel's reader, or the caller reading it

        if task.route is not None:  # before the worker can print anything for this call
            self._bind_output(slot.rank, task.route)
        call = task.call
        if not channel.submit(call.name, call.payload, done, task.streams, task.relay, task.waited):
            # The worker broke a moment ago; on_broken is on its way. Take the node out of
            # rotation now and put the call back: it has not run anywhere.
            slot.ready = False
            task.relay = None  # sent again later, it goes direct
            if task.broadcast:
                slot.backlog.append(task)
            else:
                self._queue.appendleft(task)
            return False
        if task.waited and isinstance(task.future, CallFuture):
            task.future.link = channel
        slot.busy += 1
        slot.running[id(task)] = (task, sent, channel)
        if call.timeout is not None:
            self._timeouts.watch(task.future, call.name, call.timeout, channel)
        return True

    def _call_done(self, slot: Slot, ok: bool, sent: float, task: Task) -> None:
        # On the thread that read the result: a short hold of this lock, not the pool's.
        with self._lock:
            now = time.monotonic()
            # A call that waited on the worker behind another took from that one's end to its
            # own: its send-to-result time also counts the wait, which would shrink the
            # prefetch (below) as it grows, down to none under CPU load, when the worker most
            # needs its next call waiting.
            busy = slot.busy
            took = now - sent
            if busy > self._concurrency:  # it waited for a thread on the worker
                took = min(took, now - slot.last_done)
            slot.last_done = now
            slot.busy = busy = busy - 1
            if not busy:
                slot.idle_since = now
            slot.running.pop(id(task), None)
            recent = slot.recent
            slot.recent = took if recent == _NEVER else 0.7 * recent + 0.3 * took
            if ok:
                self._succeeded += 1
            else:
                self._failed += 1
            if self._queue:
                self._pump()
            if self._watchers:
                self._idle.wake_all()
            failures = self._failures
            if failures:
                self._failures = []
        if failures:
            _fail_each(failures)

    def _expired(self, future: Future[Any], name: str, timeout: float, channel: Channel) -> None:
        """A call outlived its timeout: fail it, and kill the worker running it (which is
        then lost and replaced)."""
        with self._lock:
            found = self._slot_of(channel)
            if found is not None:
                found.ready = False  # before the future fails: no new call may land here
        error = TimeoutError(
            f"{name} did not finish within its timeout of {timeout:g} s on "
            f"{channel.label}; that worker is being replaced"
        )
        if not fail(future, error):  # it finished just now: the worker is healthy, keep it
            with self._lock:
                if found is not None and self._slot_of(channel) is found and not channel.broken:
                    found.ready = True
                self._pump()
                failures = self._take_failures()
            if failures:
                _fail_each(failures)
            return
        channel.kill(f"{name} exceeded its timeout of {timeout:g} s")


def _split(task: Task) -> bool:
    """Whether part of ``task``'s broadcast already ran, or failed, outside the backlog."""
    return any(f.running() or f.done() for f in task.siblings if f is not task.future)


def _split_error(rank: int, who: str, task: Task) -> WorkerLost:
    # A part started alone in a new distributed runtime would wait forever in its first
    # collective (jax's backend start is one) for peers that ran their parts in the old one.
    return WorkerLost(
        f"{who}: {task.call.name} was not started on the new workers: other workers "
        f"had already run their part of this broadcast on the workers that were lost, and "
        f"a part alone would wait for them forever; broadcast it again",
        node=rank,
    )


class CallTimeouts:
    """Fails calls that outlive their ``timeout=`` (through ``expired``, which kills their
    worker). One thread per pool, started by the first call that has a timeout.

    A call's timeout is the scheduler's: it starts when the scheduler sends the call, and
    what it changes first is the scheduler's books (the slot out of rotation, the call
    failed); the worker killed for it is then lost like any other, and recovery replaces it.
    """

    def __init__(self, expired: Callable[[Future[Any], str, float, Channel], None]) -> None:
        self._expired = expired
        self._cond = threading.Condition()  # guards: _heap, _thread, _stopped
        # (deadline, seq, future, name, timeout, channel): not the task, whose payload may be
        # large, and the future only weakly, since its result may be large too: neither may
        # live as long as the timeout does once the caller has let go of them.
        self._heap: list[tuple[float, int, weakref.ref[Future[Any]], str, float, Channel]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def watch(self, future: Future[Any], name: str, timeout: float, channel: Channel) -> None:
        with self._cond:
            entry = (
                time.monotonic() + timeout,
                next(self._seq),
                weakref.ref(future),
                name,
                timeout,
                channel,
            )
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="skyward-call-timeouts", daemon=True
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
                _, _, ref, name, timeout, channel = heapq.heappop(self._heap)
            future = ref()
            if future is not None and not future.done():
                self._expired(future, name, timeout, channel)


# ----------------------------------------------------------------------------------------------
# The client's side of relayed broadcasts: when a broadcast crosses the client's link once.
#
# ::
#
#     f(big) @ pool      a remote pool, >= 2 ready nodes, a payload of RELAY_MIN_BYTES or more
#                        → every node but the first gets Call(relay inbound), no payload
#                        → the first gets Call(relay chain = the others) with the payload, and
#                          forwards it as it arrives (skyward.worker.relay, on the workers)
#     a node is lost     → the nodes after it in the chain get RelayAbort: their calls fail
#                          with WorkerLost (the broadcast fails, as when a node is lost today)
#                          instead of waiting for a payload that will not come
#     a node cannot      → RelayFailed from the node before it: the client sends that node and
#     be reached           the ones after it the payload itself (RelayPayload), and the pool
#                          stops relaying: its nodes cannot all reach each other
#
# Local pools never relay: their workers get no relay port (every node is one pipe away,
# and the client's link is not a bottleneck). Small payloads go direct: a relay adds a hop's
# latency, and the client's link only matters for large ones.

# Payloads from this size are relayed: below it a broadcast costs little on any link, and
# a relay's extra hop (a TCP connection per node) would be most of it.
RELAY_MIN_BYTES = 1 << 20


class Fanout:
    """Relays in flight, by token. Called with the scheduler's lock (``lock``) held."""

    def __init__(self, lock: AbstractContextManager[Any], min_bytes: int = RELAY_MIN_BYTES) -> None:
        self._lock = lock
        self._min_bytes = min_bytes
        # token -> the channels, in chain order, and the payload (kept for RelayFailed)
        self._active: dict[bytes, tuple[list[Channel], proto.Parts]] = {}
        self.unreachable = ""  # why the nodes cannot all reach each other, once seen

    def worth_it(self, payload: proto.Parts, channels: Sequence[Channel | None]) -> bool:
        """Whether a broadcast of ``payload`` to these nodes' channels is relayed."""
        return (
            not self.unreachable
            and len(channels) >= 2
            and all(c is not None and c.relay_port is not None for c in channels)
            and proto.size(payload) >= self._min_bytes
        )

    @staticmethod
    def token() -> bytes:
        return secrets.token_bytes(16)

    @staticmethod
    def chain(token: bytes, receivers: Sequence[tuple[int, str, Channel]]) -> Relay | None:
        """The first node's relay towards ``receivers`` (rank, address, channel), in order;
        None if no other node took its call (the first then simply gets a direct call)."""
        if not receivers:
            return None
        chain = tuple((rank, address, c.relay_port or 0) for rank, address, c in receivers)
        return Relay(token, chain=chain)

    def started(
        self, token: bytes, channels: list[Channel], payload: proto.Parts, futures: list[Any]
    ) -> None:
        """Remember the relay until every part of the broadcast has finished."""
        self._active[token] = (channels, payload)
        left = [len(futures)]

        def done(_: Future[Any]) -> None:
            with self._lock:
                left[0] -= 1
                if left[0] == 0:
                    self._active.pop(token, None)

        for future in futures:
            future.add_done_callback(done)

    def lost(self, channel: Channel, why: str) -> None:
        """``channel``'s worker is gone: the nodes after it in a relay get nothing from it."""
        for token, (channels, _) in list(self._active.items()):
            if channel in channels:
                for later in channels[channels.index(channel) + 1 :]:
                    later.send(RelayAbort(token, channel.rank, why))

    def failed(self, report: RelayFailed) -> None:
        """A node could not relay to the next one: send the payload directly to that node
        and the ones after it. If it could not reach it at all, relay nothing more in this
        pool (its nodes cannot all reach each other). If the connection broke mid-way, the
        next node most likely died, and its own link says so in a moment (then its loss
        fails the broadcast, and sending it the payload over the client's link would only
        hold up what comes next): wait that moment first."""
        if not report.connected:
            self.unreachable = self.unreachable or report.reason
            self._deliver(report)
            return
        timer = threading.Timer(LOSS_GRACE, self._deliver_locked, (report,))
        timer.daemon = True
        timer.start()

    def _deliver_locked(self, report: RelayFailed) -> None:
        with self._lock:
            self._deliver(report)

    def _deliver(self, report: RelayFailed) -> None:
        channels, payload = self._active.get(report.token, ([], []))
        ranks = [c.rank for c in channels]
        if report.node not in ranks:
            return  # the broadcast has finished
        rest = channels[ranks.index(report.node) :]
        if rest[0].broken:
            return  # lost: the nodes after it were told (lost()), and the broadcast fails
        for channel in rest:
            if not channel.broken:
                channel.send(RelayPayload(report.token), payload)
