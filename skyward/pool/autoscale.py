"""Autoscaling: a pool made with ``nodes=(min, max)`` starts ``min`` nodes, adds nodes while
calls wait for one, and lets idle nodes go, never below ``min``.

::

    every tick     Scheduler.pressure(): the nodes, the calls queued, how long the oldest
                   of them has waited
    scale up       the oldest call has waited autoscale_cooldown, and the last addition was
                   at least that long ago: as many nodes as the queued calls need
                   (ceil(queued / concurrency)), up to max, at the end (ranks n, n+1, ...):
                   Machines.grow → Startup.bring_up → Scheduler.grow. All or nothing: if
                   one of them cannot come up, every one of them is released, the pool
                   says why, and stays as it was
    scale down     Scheduler.retire: the last node, idle for autoscale_idle_timeout, leaves
                   the rotation in the same step as it is found idle (no call can land on
                   it afterwards); then its worker is stopped, gracefully first, and its
                   machine is released
    close          stop(): an addition under way is cut short (the close cancels its
                   deadline and ends the workers it started, like any other); the close
                   then waits for this thread before it terminates the machines

One thread per autoscaling pool, and only it changes the pool's size, one step at a time,
so ranks stay ``0 .. n-1``: the last node goes first, and a new one takes the next rank.
Every change is a status line: on the progress display, in the pool's log (``skyward
logs``) and on the ``skyward`` logger. Gang pools never autoscale (``PoolSpec`` refuses
them): a distributed runtime cannot take in a new process.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

from skyward._errors import PoolClosed, ProvisionCancelled
from skyward.client.futures import Deadline
from skyward.link.channel import Channel
from skyward.pool.machines import Machines
from skyward.pool.scheduler import Pressure, Scheduler
from skyward.pool.startup import Startup

_log = logging.getLogger("skyward")

# Bounds on how often the pool's pressure is read: a quarter of the shorter of the two
# durations, so a change is seen well within either, but no busier than 50 times a second
# and no lazier than once a second.
_TICK_MIN, _TICK_MAX = 0.02, 1.0


class Autoscaler:
    """Grows and shrinks one pool between ``low`` and ``high`` nodes. ``status(line)``
    tells the user. ``start`` once the pool runs; ``stop`` when it closes (idempotent)."""

    def __init__(
        self,
        scheduler: Scheduler,
        machines: Machines,
        startup: Startup,
        *,
        low: int,
        high: int,
        concurrency: int,
        cooldown: float,
        idle_timeout: float,
        start_timeout: float,
        shutdown_timeout: float,
        status: Callable[[str], None],
        tick: float | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._machines = machines
        self._startup = startup
        self._low, self._high = low, high
        self._concurrency = concurrency
        self._cooldown = cooldown
        self._idle_timeout = idle_timeout
        self._start_timeout = start_timeout
        self._shutdown_timeout = shutdown_timeout
        self._status = status
        self._tick = (
            tick
            if tick is not None
            else min(max(min(cooldown, idle_timeout) / 4, _TICK_MIN), _TICK_MAX)
        )
        self._stopped = threading.Event()
        self._last_growth = -math.inf  # time.monotonic() of the last addition's end
        self._thread = threading.Thread(target=self._run, name="skyward-autoscale", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Add and release nothing more; a step under way finishes, cut short by the close."""
        self._stopped.set()

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end (after ``stop``); True if it did in time."""
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopped.wait(self._tick):
            try:
                self.step()
            except Exception:
                # Never silently: the pool keeps its size and says why on the logger.
                _log.warning("skyward: an autoscaling step failed", exc_info=True)

    def step(self) -> None:
        """One look at the pool: add nodes, or release idle ones, or nothing."""
        pressure = self._scheduler.pressure()
        if (
            pressure.queued
            and pressure.waited >= self._cooldown
            and pressure.nodes < self._high
            and time.monotonic() - self._last_growth >= self._cooldown
        ):
            try:
                self._grow(pressure)
            finally:
                self._last_growth = time.monotonic()
            return
        while not self._stopped.is_set():
            retired = self._scheduler.retire(keep=self._low, idle_for=self._idle_timeout)
            if retired is None:
                return
            self._release(retired)

    def _grow(self, pressure: Pressure) -> None:
        size = pressure.nodes
        count = min(self._high - size, math.ceil(pressure.queued / self._concurrency))
        ranks = list(range(size, size + count))
        self._status(
            f"scaling up: {size} → {size + count} nodes ({pressure.queued} call(s) queued, "
            f"the oldest for {pressure.waited:.1f} s; autoscale_cooldown is "
            f"{self._cooldown:g} s)"
        )
        launched: list[Channel] = []
        try:
            self._machines.grow(ranks)
            deadline = Deadline(self._start_timeout, f"start_timeout ({self._start_timeout:g} s)")
            channels = self._startup.bring_up(ranks, deadline, whole_pool=False, launched=launched)
        except BaseException as exc:
            self._undo(ranks, launched)
            if self._stopped.is_set() or isinstance(exc, PoolClosed | ProvisionCancelled):
                return  # the pool is closing: nothing to report
            if not isinstance(exc, Exception):
                raise
            self._status(f"scaling up failed; the pool stays at {size} node(s): {exc}")
            return
        if not self._scheduler.grow(channels):  # the pool closed as they became ready
            self._undo(ranks, channels)
            return
        self._status(f"scaled up to {size + count} nodes")

    def _undo(self, ranks: Sequence[int], channels: Sequence[Channel]) -> None:
        """Nodes that were not added after all: their workers and machines go."""
        for channel in channels:
            channel.kill("its node was not added to the pool")
        self._scheduler.discard(channels)
        for channel in channels:
            channel.wait_closed(self._shutdown_timeout)
        for rank in reversed(ranks):
            self._startup.forget(rank)
            self._machines.shrink(rank)

    def _release(self, retired: tuple[int, Channel | None]) -> None:
        rank, channel = retired
        self._status(
            f"scaling down: {rank + 1} → {rank} nodes (node {rank} idle for more than "
            f"autoscale_idle_timeout, {self._idle_timeout:g} s)"
        )
        if channel is not None:
            channel.shutdown(cancel=False)
            if not channel.wait_closed(self._shutdown_timeout):
                channel.kill("it did not exit within shutdown_timeout once its node was released")
                channel.wait_closed(5.0)
        self._startup.forget(rank)
        self._machines.shrink(rank)
