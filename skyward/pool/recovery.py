"""What the pool does when a worker fails: lost workers, calls past their timeout, and the
restart of every worker at once when a plugin ties the nodes into one runtime.

::

    stream ends      on_broken: the node takes no new calls (in a gang: no node does)
    worker lost      on_lost:   its calls already failed (WorkerLost, by the channel); start a
                                new worker on the node, or, in a gang, stop every worker and
                                start them all again through the start-up barrier
    call too long    CallTimeouts → recycle: fail the call (TimeoutError), kill its worker,
                                which is then lost and replaced as above
    no new worker    every call held for that node fails; the node is out of the pool

It changes slots under the scheduler's lock and talks to the pool through functions only.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from skyward._errors import ChannelError, CollectiveHang, WorkerLost
from skyward._futures import Deadline, fail
from skyward.link import protocol as proto
from skyward.link.channel import Channel
from skyward.pool.scheduler import Scheduler, Slot, Task
from skyward.pool.stacks import describe, framework_wait


class Recovery:
    """Replaces lost workers of one pool.

    ``bring_up(slots, deadline, whole_pool, launched)`` starts workers through the barrier;
    ``active()`` says whether the pool still runs (running or draining); ``forget(channel)``
    drops a channel the pool was keeping for its teardown; ``status(line)`` tells the user.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        gang: Sequence[str],
        start_timeout: float,
        shutdown_timeout: float,
        bring_up: Callable[[list[Slot], Deadline, bool, list[Channel]], list[Channel]],
        active: Callable[[], bool],
        forget: Callable[[Channel], None],
        status: Callable[[str], None],
    ) -> None:
        self._scheduler = scheduler
        self._gang = list(gang)
        self._start_timeout = start_timeout
        self._shutdown_timeout = shutdown_timeout
        self._bring_up = bring_up
        self._active = active
        self._forget = forget
        self._status = status
        self._restarting = False  # a gang restart of every worker is under way; under lock
        self.timeouts = CallTimeouts(self.recycle)

    def recycle(self, future: Future[Any], name: str, timeout: float, channel: Channel) -> None:
        """A call outlived its timeout: fail it, and replace the worker running it."""
        scheduler = self._scheduler
        with scheduler.lock:
            for slot in scheduler.slots:
                if slot.channel is channel:
                    slot.ready = False  # before the future fails: no new call may land here
            error = TimeoutError(
                f"{name} did not finish within its timeout of {timeout:g} s on node "
                f"{channel.node}; that node's worker is being replaced"
            )
            timed_out = fail(future, error)
            if not timed_out:  # it finished just now: the worker is healthy, keep it
                for slot in scheduler.slots:
                    if slot.channel is channel and not channel.broken:
                        slot.ready = True
                scheduler.pump()
                return
        channel.kill(f"{name} exceeded its timeout of {timeout:g} s")

    def on_broken(self, slot: Slot, channel: Channel) -> None:
        """The worker's stream ended: choose other nodes from now on (loss report follows).

        In a gang every worker is about to be restarted: none takes new calls from now on,
        even though the survivors' own calls may still be failing their way back.
        """
        scheduler = self._scheduler
        with scheduler.lock:
            if slot.channel is channel:
                for other in scheduler.slots if self._gang else [slot]:
                    other.ready = False
            scheduler.fanout.lost(channel, f"node {slot.rank}'s worker ended")

    def on_lost(self, slot: Slot, channel: Channel, error: WorkerLost) -> None:
        """A worker ended on its own, or was killed after a timeout: replace it.

        With a gang plugin (jax: one distributed runtime spans every node, and a new process
        cannot join a running one) the other workers are stopped too and all of them are
        started again together, through the same barrier as ``start()``.
        """
        scheduler = self._scheduler
        with scheduler.lock:
            if slot.channel is not channel or not self._active():
                return
            slot.channel = None
            slot.ready = False
            if self._restarting:
                return  # part of a restart of every worker, already under way
            if self._gang:
                self._restarting = True
                victims = scheduler.channels()
                for other in scheduler.slots:
                    other.ready = False
                replace: list[Slot] = list(scheduler.slots)
            else:
                victims = []
                replace = [slot]
        if victims:
            reason = (
                f"node {slot.rank} was lost, and plugin {', '.join(self._gang)} ties every "
                f"node into one runtime, so all workers are restarted together"
            )
            self._status(reason)
            for victim in victims:
                # Told first, so that plugins hear of it (the jax plugin then keeps the
                # aborting runtime's log lines off the terminal); killed at once all the same.
                victim.interrupt()
                victim.kill(reason)
        else:
            self._status(f"node {slot.rank}: worker lost; starting a new one")
        threading.Thread(
            target=self._replace,
            args=(replace, victims),
            name=f"skyward-replace-{slot.rank}",
            daemon=True,
        ).start()

    def _replace(self, slots: list[Slot], victims: list[Channel]) -> None:
        scheduler = self._scheduler
        launched: list[Channel] = []
        try:
            for victim in victims:  # a new runtime must not meet the old one
                victim.wait_closed(self._shutdown_timeout)
            deadline = Deadline(self._start_timeout, f"start_timeout ({self._start_timeout:g} s)")
            whole = len(slots) == len(scheduler.slots)
            channels = self._bring_up(slots, deadline, whole, launched)
        except BaseException as exc:
            self._give_up(slots, launched, exc)
            return
        with scheduler.lock:
            self._restarting = False
            for channel in channels:
                self._forget(channel)
            if not self._active():
                for channel in channels:
                    channel.kill("the pool is closing")
                return
            for slot, channel in zip(slots, channels, strict=True):
                scheduler.counts["replaced"] += 1
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
                    fail(task.future, _split_error(slot.rank, task))
                else:
                    scheduler.send(slot, task)
            scheduler.pump()
        pids = ", ".join(f"node {s.rank} pid {c.pid}" for s, c in zip(slots, channels, strict=True))
        self._status(f"new worker(s) ready: {pids}")

    def _give_up(self, slots: list[Slot], launched: list[Channel], exc: BaseException) -> None:
        scheduler = self._scheduler
        with scheduler.lock:
            for channel in launched:
                channel.kill("it could not be started")
                self._forget(channel)
            self._restarting = False
            for slot in slots:
                slot.lost = WorkerLost(
                    f"node {slot.rank}: its worker died and no new one could be started: {exc}",
                    node=slot.rank,
                )
                backlog, slot.backlog = slot.backlog, []
                for task in backlog:
                    fail(task.future, slot.lost)
            scheduler.pump()
            scheduler.idle.notify_all()


class CallTimeouts:
    """Fails calls that outlive their ``timeout=`` (through ``expired``, which kills their
    worker). One thread per pool, started by the first call that has a timeout."""

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


def _split(task: Task) -> bool:
    """Whether part of ``task``'s broadcast already ran, or failed, outside the backlog."""
    return any(f.running() or f.done() for f in task.siblings if f is not task.future)


def _split_error(rank: int, task: Task) -> WorkerLost:
    # A part started alone in a new distributed runtime would wait forever in its first
    # collective (jax's backend start is one) for peers that ran their parts in the old one.
    return WorkerLost(
        f"node {rank}: {task.call.name} was not started on the new workers: other nodes "
        f"had already run their part of this broadcast on the workers that were lost, and "
        f"a part alone would wait for them forever; broadcast it again",
        node=rank,
    )


# ----------------------------------------------------------------------------------------------
# The hang watch of a gang pool: calls whose ranks wait in a collective that can never
# complete fail with ``CollectiveHang``, and the gang restarts.
#
# JAX has no timeout on collectives. A rank that runs one more ``psum`` than the others, or a
# ``>>`` call that enters a cross-process collective on one node, waits forever. The pool sees
# every rank, so it can tell::
#
#     every second      a broadcast some of whose ranks finished more than hang_timeout ago
#                       while others still run it; or a single call running longer than
#                       hang_timeout while every other rank is idle
#     then, to be sure  ask the suspects for their stacks twice, a second apart: a rank is
#                       blocked if its stack ends in jax running a program or waiting for its
#                       result, and it used almost no CPU meanwhile (a long computation, in
#                       Python or in XLA, burns CPU and is left alone); a rank whose stack
#                       shows a host callback (jax calling back into the user's Python), a
#                       compile or a transfer is no hang: a one-line note, and no verdict
#     if blocked        fail those calls with CollectiveHang (who finished, where each
#                       blocked rank waits) and kill the blocked workers: the gang restarts
#
# On GPUs a long kernel also waits with little host CPU; ``hang_timeout`` bounds how long a
# rank may trail the others, and ``hang_timeout=None`` turns the watch off.

_SAMPLE = 1.0  # seconds between the two stack samples
_IDLE_CPU = 0.25  # at most this share of the sample in CPU time: waiting, not computing


class HangWatch:
    """One thread per gang pool; ``status(line)`` tells the user what was found."""

    def __init__(self, scheduler: Scheduler, *, bound: float, status: Callable[[str], None]):
        self._scheduler = scheduler
        self._bound = bound
        self._status = status
        self._stop = threading.Event()
        self._first_done: dict[int, float] = {}  # a broadcast (id of its parts) -> when seen
        self._noted: set[str] = set()  # calls already said to trail outside a collective
        self._thread = threading.Thread(target=self._run, name="skyward-hang-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self._bound / 4)):
            for suspects, finished, tasks in self._suspects():
                if self._stop.is_set():
                    return
                self._confirm(suspects, finished, tasks)

    def _suspects(self) -> list[tuple[list[Slot], tuple[int, ...], list[Task]]]:
        now = time.monotonic()
        found = []
        with self._scheduler.lock:
            slots = list(self._scheduler.slots)
            running = [(slot, task, sent) for slot in slots for task, sent in slot.running.values()]
        broadcasts: dict[int, list[tuple[Slot, Task]]] = {}
        for slot, task, sent in running:
            if task.broadcast:
                broadcasts.setdefault(id(task.siblings), []).append((slot, task))
            elif now - sent > self._bound and all(s.busy == 0 for s in slots if s is not slot):
                found.append(([slot], tuple(s.rank for s in slots if s is not slot), [task]))
        for key, parts in broadcasts.items():
            siblings = parts[0][1].siblings
            finished = tuple(i for i, f in enumerate(siblings) if f.done())
            if not finished:
                continue
            first = self._first_done.setdefault(key, now)
            if now - first > self._bound:
                found.append(([s for s, _ in parts], finished, [t for _, t in parts]))
        live = set(broadcasts)
        self._first_done = {k: v for k, v in self._first_done.items() if k in live}
        return found

    def _confirm(
        self, suspects: Sequence[Slot], finished: tuple[int, ...], tasks: list[Task]
    ) -> None:
        channels = [s.channel for s in suspects]
        if any(c is None for c in channels):
            return  # being replaced already
        first = _sample(channels)  # type: ignore[arg-type]
        self._stop.wait(_SAMPLE)
        second = _sample(channels)  # type: ignore[arg-type]
        if first is None or second is None:
            return
        blocked = {}
        elsewhere = {}  # rank -> what its stack says it waits in, when not a collective
        for slot, before, after in zip(suspects, first, second, strict=True):
            wait = framework_wait(after)
            if after.cpu_seconds - before.cpu_seconds >= _IDLE_CPU or wait is None:
                continue  # computing, or not inside jax at all: nothing to say
            if wait[0] == "collective":
                blocked[slot.rank] = describe(after, to_framework=True)
            else:
                elsewhere[slot.rank] = wait
        if any(t.future.done() for t in tasks):
            return  # it finished meanwhile
        if elsewhere:
            self._note_not_a_hang(tasks[0].call.name, elsewhere)
            return
        if len(blocked) != len(suspects):
            return
        name = tasks[0].call.name
        ranks = ", ".join(map(str, sorted(blocked)))
        where = "\n".join(
            f"--- node {rank} is blocked in ---\n{text}" for rank, text in blocked.items()
        )
        error = CollectiveHang(
            f"{name}: node(s) {ranks} waited more than hang_timeout ({self._bound:g} s) in a "
            f"jax collective that node(s) {', '.join(map(str, finished)) or 'none'} had "
            f"already left (they finished this call, or never ran it), so it could never "
            f"complete. Every rank must run the same collectives in the same order. The pool "
            f"is restarting every rank.\n{where}",
            finished=finished,
            blocked=blocked,
        )
        self._status(f"{name}: node(s) {ranks} blocked in a collective; restarting the gang")
        with self._scheduler.lock:
            # Out of rotation before the caller hears: what it sends next waits for the
            # restarted gang instead of meeting the blocked runtime.
            for slot in self._scheduler.slots:
                slot.ready = False
            for task in tasks:
                fail(task.future, error)
        with self._scheduler.lock:
            gang = self._scheduler.channels()
        for other in gang:
            # Every rank hears first that it is being stopped (the jax plugin then sends what
            # JAX logs as its runtime falls apart to a file): killing a blocked rank ends the
            # others' runtime too, before their own turn in the gang restart comes.
            other.interrupt()
        for channel in channels:
            assert channel is not None
            channel.kill(f"it was blocked in a collective the other ranks had left ({name})")

    def _note_not_a_hang(self, name: str, waits: Mapping[int, tuple[str, str]]) -> None:
        """A rank past ``hang_timeout`` whose stack shows it in a host callback, a compile or
        a transfer: said once per call, and left alone."""
        if name in self._noted:
            return
        self._noted.add(name)
        seen = "; ".join(
            f"node {rank}: in a {kind} ({where})" for rank, (kind, where) in waits.items()
        )
        self._status(
            f"{name}: trails the other ranks by more than hang_timeout ({self._bound:g} s), "
            f"but not in a collective ({seen}); left running"
        )


def _sample(channels: Sequence[Channel]) -> list[proto.StacksReport] | None:
    requests = [c.request_stacks() for c in channels]
    try:
        return [r.result(timeout=10.0) for r in requests]
    except (FutureTimeout, ChannelError):
        return None
