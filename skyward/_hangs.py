"""The hang watch of a gang pool: calls whose ranks wait in a collective that can never
complete fail with ``CollectiveHang``, and the gang restarts.

JAX has no timeout on collectives. A rank that runs one more ``psum`` than the others, or a
``>>`` call that enters a cross-process collective on one node, waits forever. The pool sees
every rank, so it can tell::

    every second      a broadcast some of whose ranks finished more than hang_timeout ago
                      while others still run it; or a single call running longer than
                      hang_timeout while every other rank is idle
    then, to be sure  ask the suspects for their stacks twice, a second apart: a rank is
                      blocked if it is inside jax and used almost no CPU meanwhile (a long
                      computation, in Python or in XLA, burns CPU and is left alone)
    if blocked        fail those calls with CollectiveHang (who finished, where each
                      blocked rank waits) and kill the blocked workers: the gang restarts

On GPUs a long kernel also waits with little host CPU; ``hang_timeout`` bounds how long a
rank may trail the others, and ``hang_timeout=None`` turns the watch off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout

from skyward import _protocol as proto
from skyward._channel import Channel
from skyward._errors import ChannelError, CollectiveHang
from skyward._futures import fail
from skyward._scheduler import Scheduler, Slot, Task
from skyward._stacks import describe, in_framework_call

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
        blocked = {
            slot.rank: describe(after, to_framework=True)
            for slot, before, after in zip(suspects, first, second, strict=True)
            if in_framework_call(after) and after.cpu_seconds - before.cpu_seconds < _IDLE_CPU
        }
        if len(blocked) != len(suspects) or any(t.future.done() for t in tasks):
            return  # computing, or it finished meanwhile
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
        for channel in channels:
            assert channel is not None
            channel.kill(f"it was blocked in a collective the other ranks had left ({name})")


def _sample(channels: Sequence[Channel]) -> list[proto.StacksReport] | None:
    requests = [c.request_stacks() for c in channels]
    try:
        return [r.result(timeout=10.0) for r in requests]
    except (FutureTimeout, ChannelError):
        return None
