"""Where calls go: one slot per node, the pool's queue, least busy first, map prefetch.

::

    submit(tasks)      queue → pump: the least busy ready slot with room takes the head
    broadcast(call)    one part per slot, sent at once under the lock, so every node sees
                       broadcasts in the same order (SPMD programs need it); a slot whose
                       worker is being replaced holds its part in its backlog
    a call finishes    the slot's books (busy, recent time) → pump again → notify idle

Everything here is guarded by ``lock``, which the pool and recovery share: they change the
slots too (a worker ready, lost, replaced). Nothing here blocks while holding it; a channel's
``submit`` never waits on a slow worker.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, MutableSet, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from skyward._compute import PendingCall
from skyward._errors import WorkerLost
from skyward._futures import LOSS_GRACE, CallFuture, fail, resolve
from skyward._info import InstanceInfo
from skyward._interrupts import held
from skyward.console import Route
from skyward.link import protocol as proto
from skyward.link.channel import Channel
from skyward.link.protocol import Relay, RelayAbort, RelayFailed, RelayPayload
from skyward.pool.streams import ResultStream, Streams, prepare
from skyward.providers.base import Node

# A map may queue calls beyond a node's slots when its recent calls were short, so that its
# worker finds the next call waiting instead of idling for a round trip: as many as keep the
# last of them waiting about PREFETCH_BELOW seconds at most, and never more than
# PREFETCH_MAX. A node whose calls take longer than PREFETCH_BELOW gets none.
PREFETCH_BELOW = 0.01
PREFETCH_MAX = 8


@dataclass(eq=False)
class Task:
    call: PendingCall[Any]
    payload: proto.Parts
    future: Future[Any]
    broadcast: bool = False  # bound to one node: waits for that node, never moves
    route: Route | None = None  # where its output goes (the Jupyter cell that submitted it)
    prefetch: bool = False  # part of a map: may wait on a worker behind another call
    siblings: Sequence[Future[Any]] = ()  # a broadcast's parts, this one's future included
    streams: Streams | None = None  # a streaming call's state (_stream)
    relay: Relay | None = None  # its part in a relayed broadcast, for its first send
    sent_before: bool = False  # handed to a worker once already (its future is running)
    waited: bool = False  # its caller waits for it at once, reading its link (CallFuture)


@dataclass(eq=False)
class Slot:
    """One node and its current worker."""

    rank: int
    node: Node
    info: InstanceInfo | None = None
    channel: Channel | None = None
    ready: bool = False
    busy: int = 0  # calls sent and not finished, broadcasts included
    recent: float = float("inf")  # seconds from send to result, averaged over recent calls
    lost: WorkerLost | None = None  # set when the node cannot get a worker any more
    backlog: list[Task] = field(default_factory=list)  # broadcasts waiting for a new worker
    running: dict[int, tuple[Task, float]] = field(default_factory=dict)  # sent, by id: when


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


def tasks_for(
    calls: Sequence[PendingCall[Any]],
    function: bytes | None,
    route: Route | None,
    prefetch: bool,
    streams: MutableSet[Streams],
    waited: bool = False,
) -> tuple[list[Task], list[Future[Any]]]:
    """Pickled tasks for ``calls``, and the futures their callers get: the task's own, or,
    for a generator function, one already holding its values' ``ResultStream``. Streaming
    calls' states are added to ``streams`` (the pool ends them when it closes)."""
    tasks, futures = [], []
    for call in calls:
        done: Future[Any] = CallFuture()
        sent, state = prepare(call, done)  # a generator, or iterator arguments
        payload = sent.serialize(function)
        waits = waited and state is None
        task = Task(
            sent, payload, done, route=route, prefetch=prefetch, streams=state, waited=waits
        )
        tasks.append(task)
        futures.append(done)
        if state is not None:
            streams.add(state)
            if state.window:
                futures[-1] = CallFuture()
                futures[-1].set_result(ResultStream(state, call.name))
    return tasks, futures


def prefetch_depth(recent: float) -> int:
    """Calls a map may queue past a node's slots, given its recent send-to-result time.

    That time includes the wait behind the calls queued before, so the depth settles where
    depth x time per call is about ``PREFETCH_BELOW``.
    """
    return PREFETCH_MAX if recent <= 0 else min(PREFETCH_MAX, int(PREFETCH_BELOW / recent))


class Scheduler:
    """The slots and the queue of one pool. See the module docstring.

    ``bind_output(rank, route)`` is called before a call is sent (its prints go to the
    caller's cell); ``watch(future, name, timeout, channel)`` for each call with a timeout;
    ``accepting()`` says whether finished calls may start queued ones (the pool is running).
    """

    def __init__(
        self,
        *,
        name: str,
        concurrency: int,
        gang: bool,
        bind_output: Callable[[int, Route | None], None],
        watch: Callable[[Future[Any], str, float, Channel], None],
        accepting: Callable[[], bool],
    ) -> None:
        self.lock = threading.RLock()  # guards: everything below, slot fields, pool state
        self.idle = threading.Condition(self.lock)  # notified whenever a call finishes
        self.slots: list[Slot] = []
        self.queue: deque[Task] = deque()
        self.counts = {"submitted": 0, "succeeded": 0, "failed": 0, "replaced": 0}
        self._name = name
        self._concurrency = concurrency
        self._gang = gang
        self._bind_output = bind_output
        self._watch = watch
        self._accepting = accepting
        self._pumping = False
        self.fanout = Fanout(self.lock)  # relayed broadcasts in flight
        # Gang broadcasts: parts sent or held and not finished, and whole broadcasts waiting
        # for them to finish (call, payload, route, futures).
        self._gang_running = 0
        self._gang_waiting: deque[
            tuple[PendingCall[Any], proto.Parts, Route | None, list[Future[Any]]]
        ] = deque()

    @held  # a Ctrl-C waits until the books agree with what was sent (skyward._interrupts)
    def submit(self, tasks: Sequence[Task]) -> None:
        """Queue ``tasks`` and start what can start. Lock held by the caller."""
        self.counts["submitted"] += len(tasks)
        self.queue.extend(tasks)
        self.pump()

    @held  # as submit
    def broadcast(
        self, call: PendingCall[Any], payload: proto.Parts, route: Route | None
    ) -> list[Future[Any]]:
        """One part of ``call`` per node, sent now where it can be. Lock held by the caller.

        In a gang, a broadcast waits while any part of an earlier one still runs on any
        node: its collectives would otherwise pair with the earlier one's on a rank that is
        behind, and both would return each other's data.
        """
        futures: list[Future[Any]] = [CallFuture() for _ in self.slots]
        self.counts["submitted"] += len(futures)
        if self._gang and (self._gang_running or self._gang_waiting):
            self._gang_waiting.append((call, payload, route, futures))
        else:
            self._dispatch_broadcast(call, payload, route, futures)
        return futures

    def _dispatch_broadcast(
        self,
        call: PendingCall[Any],
        payload: proto.Parts,
        route: Route | None,
        futures: list[Future[Any]],
    ) -> None:
        # In a gang, no part starts until every node has a worker of the same generation.
        wait = self._gang and not all(s.ready or s.lost is not None for s in self.slots)
        if self._gang:  # counted before any part can finish, so the count reaches 0 last
            self._gang_running += len(futures)
        now: list[tuple[Slot, Task]] = []
        for slot, future in zip(self.slots, futures, strict=True):
            task = Task(call, payload, future, broadcast=True, route=route, siblings=futures)
            if slot.lost is not None:
                fail(task.future, slot.lost)
            elif wait or not slot.ready:
                slot.backlog.append(task)  # its worker (or its gang) is being replaced
            else:
                now.append((slot, task))
        if self.fanout.worth_it(payload, [slot.channel for slot, _ in now]):
            self._relay(now, futures)
        else:
            for slot, task in now:
                self.send(slot, task)
        if self._gang:
            for future in futures:
                future.add_done_callback(self._gang_part_done)

    def _relay(self, parts: list[tuple[Slot, Task]], futures: list[Future[Any]]) -> None:
        """Send a broadcast's payload over the client's link once, to the first node, which
        relays it to the others (see "relayed broadcasts" below); they get their calls first, without it."""
        token = self.fanout.token()
        (first, first_task), rest = parts[0], parts[1:]
        receivers: list[tuple[int, str, Channel]] = []
        for slot, task in rest:
            task.relay = Relay(token, inbound=True)
            channel = slot.channel
            if self.send(slot, task) and channel is not None:
                receivers.append((slot.rank, slot.node.address, channel))
        first_task.relay = self.fanout.chain(token, receivers)
        root = first.channel
        if not self.send(first, first_task) or root is None:
            for _, _, channel in receivers:  # held for a new worker: it will not relay
                channel.send(RelayAbort(token, first.rank, f"node {first.rank}'s link broke"))
            return
        channels = [root] + [channel for _, _, channel in receivers]
        self.fanout.started(token, channels, first_task.payload, futures)

    def relay_failed(self, report: RelayFailed) -> None:
        """A node could not reach the next one in a relay (``Fanout.failed``)."""
        with self.lock:
            if not self.fanout.unreachable and not report.connected:
                logging.getLogger("skyward").warning(
                    "skyward: pool %s relays no more broadcasts between its nodes, they "
                    "cannot all reach each other (%s); each node gets them from this machine",
                    self._name,
                    report.reason,
                )
            self.fanout.failed(report)

    def _gang_part_done(self, _: Future[Any]) -> None:
        with self.lock:
            self._gang_running -= 1
            while self._gang_running == 0 and self._gang_waiting:
                self._dispatch_broadcast(*self._gang_waiting.popleft())

    def pump(self) -> None:
        """Send queued calls to the least busy ready nodes with a free slot. Lock held."""
        if self._pumping:
            # Re-entered from a done-callback of a future failed below (a user's callback
            # may submit); the outer loop carries on with the queue.
            return
        self._pumping = True
        try:
            limit = self._concurrency
            while self.queue:
                head = self.queue[0]
                prefetch = head.prefetch and head.call.timeout is None  # a timeout starts at send
                free = [
                    s
                    for s in self.slots
                    if s.ready and s.busy < limit + (prefetch_depth(s.recent) if prefetch else 0)
                ]
                if not free:
                    if self.slots and all(s.lost is not None for s in self.slots):
                        self._fail_queue(self.slots[0].lost)
                    return
                slot = min(free, key=lambda s: s.busy)
                self.send(slot, self.queue.popleft())
        finally:
            self._pumping = False

    def _fail_queue(self, error: BaseException | None) -> None:
        lost = WorkerLost(f"pool {self._name!r} has no node left to run calls on: {error}", node=-1)
        while self.queue:
            fail(self.queue.popleft().future, lost)

    def send(self, slot: Slot, task: Task) -> bool:
        """Hand one task to ``slot``'s worker; whether it took it. Lock held; never blocks
        (see Channel)."""
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
            self._call_done(slot, error is None, time.monotonic() - sent, task)
            if error is not None:
                fail(task.future, error)
            else:
                resolve(task.future, value)

        # Before the worker can print anything for this call.
        self._bind_output(slot.rank, task.route)
        if not channel.submit(
            task.call.name, task.payload, done, task.streams, task.relay, task.waited
        ):
            # The worker broke a moment ago; on_broken is on its way. Take the node out of
            # rotation now and put the call back: it has not run anywhere.
            slot.ready = False
            task.relay = None  # sent again later, it goes direct
            if task.broadcast:
                slot.backlog.append(task)
            else:
                self.queue.appendleft(task)
            return False
        if task.waited and isinstance(task.future, CallFuture):
            task.future.link = channel
        slot.busy += 1
        slot.running[id(task)] = (task, sent)
        if task.call.timeout is not None:
            self._watch(task.future, task.call.name, task.call.timeout, channel)
        return True

    def _call_done(self, slot: Slot, ok: bool, elapsed: float, task: Task) -> None:
        with self.lock:
            slot.busy -= 1
            slot.running.pop(id(task), None)
            slot.recent = (
                elapsed if slot.recent == float("inf") else 0.7 * slot.recent + 0.3 * elapsed
            )
            self.counts["succeeded" if ok else "failed"] += 1
            if self._accepting():
                self.pump()
            self.idle.notify_all()

    def wait_idle(self, stop: Callable[[], bool]) -> bool:
        """Until nothing is queued, held or running (True), or ``stop()`` (False)."""
        with self.idle:
            while self.queue or self._gang_waiting or any(s.busy or s.backlog for s in self.slots):
                if stop():
                    return False
                self.idle.wait(1.0)
            return True

    def take_all(self) -> list[Task]:
        """Empty the queue and every backlog, and take every slot out of rotation: the pool
        is closing. Lock held; returns the tasks that will never run."""
        waiting = [
            Task(call, payload, future, broadcast=True)
            for call, payload, _, futures in self._gang_waiting
            for future in futures
        ]
        self._gang_waiting.clear()
        tasks = waiting + list(self.queue) + [t for s in self.slots for t in s.backlog]
        self.queue.clear()
        for slot in self.slots:
            slot.backlog.clear()
            slot.ready = False
        return tasks

    def statistics(self, state: str, nodes: int, uptime: float) -> PoolStatistics:
        """A snapshot of the books. Lock held by the caller."""
        return PoolStatistics(
            name=self._name,
            state=state,
            nodes=nodes,
            ready_nodes=sum(s.ready for s in self.slots),
            queued=len(self.queue),
            in_flight=tuple(s.busy for s in self.slots),
            submitted=self.counts["submitted"],
            succeeded=self.counts["succeeded"],
            failed=self.counts["failed"],
            workers_replaced=self.counts["replaced"],
            uptime=uptime,
        )

    def channels(self) -> list[Channel]:
        return [s.channel for s in self.slots if s.channel is not None]


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
                    later.send(RelayAbort(token, channel.node, why))

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
        nodes = [c.node for c in channels]
        if report.node not in nodes:
            return  # the broadcast has finished
        rest = channels[nodes.index(report.node) :]
        if rest[0].broken:
            return  # lost: the nodes after it were told (lost()), and the broadcast fails
        for channel in rest:
            if not channel.broken:
                channel.send(RelayPayload(report.token), payload)
