"""The check after every test that it left no worker running, and what it does with a leak.

::

    a test ends → its own fixtures close their pools → no_leaked_workers:
      skyward.worker processes of ours still alive after a grace period (a close on another
      thread finishing)?  none → the test passes
      some → every pool of this process still open, bar those a module fixture shares
             (support/processes.shared_pool), is closed here: killing its workers alone
             would have its recovery start new ones, found after every later test
           → what still runs is killed, and our children among it reaped
           → this test fails, naming each pool, the test during which it started, and the
             workers found

One leak fails one test: the one whose teardown saw it (the test that started the pool,
unless its workers came up only later, in which case that test is named in the message).
A pool left open stays reachable (its close at interpreter exit holds it), so the garbage
collector's list finds it; that walk is made only when workers leaked.

A plugin module: the conftest imports the fixture; a pytest run over other files loads it
with ``-p support.leaks`` (the fixture's own test does).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator

import psutil
import pytest

import skyward as sky
from support.processes import describe, is_shared, our_namespaces, worker_processes

GRACE = 5.0  # seconds a pool closed on another thread gets to end its workers

# When each test of this process began (monotonic), in order: who started a leaked pool.
_began: list[tuple[float, str]] = []


@pytest.fixture(autouse=True)
def no_leaked_workers(request: pytest.FixtureRequest) -> Iterator[None]:
    _began.append((time.monotonic(), request.node.nodeid))
    yield
    deadline = time.monotonic() + GRACE
    while (leaked := worker_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not leaked:
        return
    found = [describe(p) for p in leaked]  # as they were, before anything below ends them
    pools = [_end(pool) for pool in open_pools()]
    _kill_and_reap(worker_processes())
    lines = [f"{request.node.name} left skyward workers alive:"]
    lines += [f"  pool {line}" for line in pools] or ["  (no open pool of this process)"]
    lines += [f"  worker {line}" for line in found]
    lines.append(f"  (this process's namespaces: {our_namespaces.live()})")
    pytest.fail("\n".join(lines), pytrace=False)


def open_pools() -> list[sky.ComputePool]:
    """The pools of this process that started and have not closed, bar shared ones."""
    return [
        o
        for o in gc.get_objects()
        if isinstance(o, sky.ComputePool)
        and o.statistics().state not in ("new", "closed")
        and not is_shared(o)
    ]


def _end(pool: sky.ComputePool) -> str:
    """Close ``pool`` as Ctrl-C would (its calls cancelled, its machines terminated); say
    which it was and who started it."""
    stats = pool.statistics()
    started = time.monotonic() - stats.uptime
    who = next((nodeid for began, nodeid in reversed(_began) if began <= started), "?")
    outcome = "closed"
    try:
        pool.close(wait=False)
    except Exception as error:  # the leak is the failure to report; this goes with it
        outcome = f"close raised {error!r}"
    return f"{stats.name!r} ({stats.state}, started during {who}): {outcome}"


def _kill_and_reap(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    for process in processes:
        try:
            if process.ppid() == os.getpid():
                process.wait(5)  # a child of ours: reaped here, not left a zombie
        except (psutil.NoSuchProcess, psutil.TimeoutExpired):
            continue
