"""What the pool does when a worker fails: lost workers, the restart of every worker at once
when a plugin ties the nodes into one runtime, and (below) the hang watch of such pools.

::

    stream ends      on_broken: the node takes no new calls (in a gang: no node does)
    worker lost      on_lost:   its calls already failed (WorkerLost, by the channel); start a
                                new worker in its place, or, in a gang, stop every worker and
                                start them all again through the start-up barrier (a node's
                                machine lost takes all its workers: each is started again,
                                on one new machine, see Machines.spawn)
    no new worker    every call held for that node fails; the node is out of the pool

A call past its ``timeout=`` is the scheduler's (it fails the call and kills the worker,
which is then lost as above). Recovery owns one thing, whether a gang restart is under way;
it changes slots only through the scheduler's methods and starts workers through
``Startup``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout

from skyward._errors import ChannelError, CollectiveHang, WorkerLost
from skyward.client.futures import Deadline, fail
from skyward.link import protocol as proto
from skyward.link.channel import Channel
from skyward.pool.machines import Layout
from skyward.pool.scheduler import Running, Scheduler
from skyward.pool.stacks import describe, framework_wait
from skyward.pool.startup import Startup


class Recovery:
    """Replaces lost workers of one pool; ``status(line)`` tells the user. A channel's
    ``on_lost`` and ``on_broken`` are these methods (the channel's ``rank`` is its worker's
    rank; ``layout()`` says which node each rank is on)."""

    def __init__(
        self,
        scheduler: Scheduler,
        startup: Startup,
        *,
        layout: Callable[[], Layout],
        gang: Sequence[str],
        start_timeout: float,
        shutdown_timeout: float,
        status: Callable[[str], None],
    ) -> None:
        self._scheduler = scheduler
        self._startup = startup
        self._layout = layout
        self._gang = list(gang)
        self._start_timeout = start_timeout
        self._shutdown_timeout = shutdown_timeout
        self._status = status
        # guards: _restarting, and is held across the scheduler calls that must agree with it
        # (taken before the scheduler's lock, never after)
        self._lock = threading.Lock()
        self._restarting = False  # a gang restart of every worker is under way

    def on_broken(self, channel: Channel) -> None:
        """The worker's stream ended: choose other nodes from now on (loss report follows).

        In a gang every worker is about to be restarted: none takes new calls from now on,
        even though the survivors' own calls may still be failing their way back.
        """
        self._scheduler.broken(channel, everyone=bool(self._gang))

    def on_lost(self, channel: Channel, error: WorkerLost) -> None:
        """A worker ended on its own, or was killed after a timeout: replace it.

        With a gang plugin (jax: one distributed runtime spans every node, and a new process
        cannot join a running one) the other workers are stopped too and all of them are
        started again together, through the same barrier as ``start()``.
        """
        rank = channel.rank
        with self._lock:
            if not self._scheduler.detach(channel):
                return  # replaced already, or the pool is not running
            if self._restarting:
                return  # part of a restart of every worker, already under way
            if self._gang:
                self._restarting = True
                victims = self._scheduler.pause_all()
                ranks = list(range(self._scheduler.workers_count))
            else:
                victims = []
                ranks = [rank]
        if victims:
            reason = (
                f"{channel.label} was lost, and plugin {', '.join(self._gang)} ties every "
                f"worker into one runtime, so all workers are restarted together"
            )
            self._status(reason)
            for victim in victims:
                # Told first, so that plugins hear of it (the jax plugin then keeps the
                # aborting runtime's log lines off the terminal); killed at once all the same.
                victim.interrupt()
                victim.kill(reason)
        else:
            self._status(f"{channel.label}: worker lost; starting a new one")
        threading.Thread(
            target=self._replace,
            args=(ranks, victims),
            name=f"skyward-replace-{rank}",
            daemon=True,
        ).start()

    def _replace(self, ranks: list[int], victims: list[Channel]) -> None:
        launched: list[Channel] = []
        try:
            for victim in victims:  # a new runtime must not meet the old one
                victim.wait_closed(self._shutdown_timeout)
            deadline = Deadline(self._start_timeout, f"start_timeout ({self._start_timeout:g} s)")
            whole = len(ranks) == self._scheduler.workers_count
            channels = self._startup.bring_up(ranks, deadline, whole_pool=whole, launched=launched)
        except BaseException as exc:
            self._give_up(ranks, launched, exc)
            return
        with self._lock:  # one step with the flag: a new worker lost at once is replaced
            attached = self._scheduler.replace(channels)
            self._restarting = False
        if not attached:  # the pool is closing
            for channel in channels:
                channel.kill("the pool is closing")
            return
        pids = ", ".join(f"{c.label} pid {c.pid}" for c in channels)
        self._status(f"new worker(s) ready: {pids}")

    def _give_up(self, ranks: list[int], launched: list[Channel], exc: BaseException) -> None:
        for channel in launched:
            channel.kill("it could not be started")
        self._scheduler.discard(launched)
        with self._lock:
            self._restarting = False
        layout = self._layout()
        self._scheduler.lose(
            {
                rank: WorkerLost(
                    f"{layout.label(rank)}: its worker died and no new one could be started: {exc}",
                    node=layout.node_of(rank),
                )
                for rank in ranks
            }
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

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        layout: Callable[[], Layout],
        bound: float,
        status: Callable[[str], None],
    ):
        self._scheduler = scheduler
        self._layout = layout  # how messages name ranks
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
            for suspects, finished in self._suspects():
                if self._stop.is_set():
                    return
                self._confirm(suspects, finished)

    def _suspects(self) -> list[tuple[list[Running], tuple[int, ...]]]:
        """Calls that may be blocked: each group with the ranks that have left it."""
        now = time.monotonic()
        found = []
        running, busy = self._scheduler.running()
        ranks = range(len(busy))
        broadcasts: dict[int, list[Running]] = {}
        for call in running:
            if call.task.broadcast:
                broadcasts.setdefault(id(call.task.siblings), []).append(call)
            elif now - call.since > self._bound and not any(
                busy[r] for r in ranks if r != call.rank
            ):
                found.append(([call], tuple(r for r in ranks if r != call.rank)))
        for key, parts in broadcasts.items():
            siblings = parts[0].task.siblings
            finished = tuple(i for i, f in enumerate(siblings) if f.done())
            if not finished:
                continue
            first = self._first_done.setdefault(key, now)
            if now - first > self._bound:
                found.append((parts, finished))
        live = set(broadcasts)
        self._first_done = {k: v for k, v in self._first_done.items() if k in live}
        return found

    def _confirm(self, suspects: Sequence[Running], finished: tuple[int, ...]) -> None:
        channels = [call.channel for call in suspects]
        first = _sample(channels)
        self._stop.wait(_SAMPLE)
        second = _sample(channels)
        if first is None or second is None:
            return  # a worker is gone already (being replaced)
        blocked = {}
        elsewhere = {}  # rank -> what its stack says it waits in, when not a collective
        for call, before, after in zip(suspects, first, second, strict=True):
            wait = framework_wait(after)
            if after.cpu_seconds - before.cpu_seconds >= _IDLE_CPU or wait is None:
                continue  # computing, or not inside jax at all: nothing to say
            if wait[0] == "collective":
                blocked[call.rank] = describe(after, to_framework=True)
            else:
                elsewhere[call.rank] = wait
        name = suspects[0].task.call.name
        if any(call.task.future.done() for call in suspects):
            return  # it finished meanwhile
        if elsewhere:
            self._note_not_a_hang(name, elsewhere)
            return
        if len(blocked) != len(suspects):
            return
        layout = self._layout()
        ranks = layout.label_all(sorted(blocked))
        where = "\n".join(
            f"--- {layout.label(rank)} is blocked in ---\n{text}" for rank, text in blocked.items()
        )
        error = CollectiveHang(
            f"{name}: {ranks} waited more than hang_timeout ({self._bound:g} s) in a "
            f"jax collective that {layout.label_all(finished)} had "
            f"already left (they finished this call, or never ran it), so it could never "
            f"complete. Every rank must run the same collectives in the same order. The pool "
            f"is restarting every rank.\n{where}",
            finished=finished,
            blocked=blocked,
        )
        self._status(f"{name}: {ranks} blocked in a collective; restarting the gang")
        # Out of rotation before the caller hears: what it sends next waits for the
        # restarted gang instead of meeting the blocked runtime.
        gang = self._scheduler.pause_all()
        for call in suspects:
            fail(call.task.future, error)
        for other in gang:
            # Every rank hears first that it is being stopped (the jax plugin then sends what
            # JAX logs as its runtime falls apart to a file): killing a blocked rank ends the
            # others' runtime too, before their own turn in the gang restart comes.
            other.interrupt()
        for channel in channels:
            channel.kill(f"it was blocked in a collective the other ranks had left ({name})")

    def _note_not_a_hang(self, name: str, waits: Mapping[int, tuple[str, str]]) -> None:
        """A rank past ``hang_timeout`` whose stack shows it in a host callback, a compile or
        a transfer: said once per call, and left alone."""
        if name in self._noted:
            return
        self._noted.add(name)
        layout = self._layout()
        seen = "; ".join(
            f"{layout.label(rank)}: in a {kind} ({where})" for rank, (kind, where) in waits.items()
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
