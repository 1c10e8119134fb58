"""The client's open descriptors come back to where they were after failed starts and
replaced workers (issue 41, item 1): every path that drops a channel, a transport or a worker
process closes what it opened, at once, not when the garbage collector finds a cycle.

The count is ``/proc/self/fd`` of the test process. It is taken after one warm-up cycle:
the first pool of a process opens a few things once and keeps them by design (the SSH
provider's host key and known_hosts reads, imports that open files, the log directory's
lock), and the test is about what each later cycle leaves behind. The collector is kept off
while the cycles run, so that a descriptor freed only by collecting a reference cycle counts
as leaked: a notebook's collector may not run for a long time, and descriptors run out
first.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time
from collections.abc import Callable, Iterator

import pytest

import skyward as sky
from support.pools import PoolFactory

CYCLES = 20


def _open_descriptors() -> dict[int, str]:
    """This process's open descriptors, each with what it is (``pipe:[...]``, a path)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return found


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _assert_back_to(before: dict[int, str], what: str) -> None:
    # Threads that close the last descriptors (a channel's reader, a killed worker's
    # reaper) may still be finishing their last step when the pool's call returns.
    deadline = time.monotonic() + 10.0
    while len(after := _open_descriptors()) > len(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = {fd: target for fd, target in after.items() if before.get(fd) != target}
    assert len(after) <= len(before), (
        f"{what} left {len(after) - len(before)} more open descriptors "
        f"({len(before)} -> {len(after)}): {sorted(leaked.items())}"
    )


def _cycles(cycle: Callable[[], None], what: str) -> None:
    cycle()  # warm-up: what the first pool opens once and keeps (see the module docstring)
    with _collector_off():
        before = _open_descriptors()
        for _ in range(CYCLES):
            cycle()
        _assert_back_to(before, what)


@contextlib.contextmanager
def _refuses(_info: sky.InstanceInfo) -> Iterator[None]:
    raise RuntimeError("the license server is down")
    yield


@pytest.mark.timeout(300)
def test_failed_starts_leave_no_descriptor_open(make_pool: PoolFactory) -> None:
    def failed_start() -> None:
        plugin = sky.Plugin(name="refuses", around_app=_refuses)
        with pytest.raises(sky.StartError, match="license server"):
            with make_pool(nodes=2, plugins=[plugin]):
                pass

    _cycles(failed_start, f"{CYCLES} failed starts")


def _replace_a_worker(pool: sky.ComputePool) -> None:
    """Kill node 1's worker and wait until its replacement answers."""
    old = pool.broadcast(os.getpid)
    os.kill(old[1], signal.SIGKILL)  # SSH test hosts share this machine's process IDs
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(sky.WorkerLost):
            if pool.statistics().ready_nodes == 2 and pool.broadcast(os.getpid)[1] != old[1]:
                return
        time.sleep(0.05)
    raise AssertionError("node 1's worker was not replaced within 60 s")


@pytest.mark.timeout(300)
def test_replaced_workers_leave_no_descriptor_open(make_pool: PoolFactory) -> None:
    with make_pool(nodes=2) as pool:
        _cycles(lambda: _replace_a_worker(pool), f"{CYCLES} replaced workers")
        assert pool.statistics().workers_replaced == CYCLES + 1
