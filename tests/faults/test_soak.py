"""Long runs for ``pytest --soak``: many pools and many calls leak no descriptor, thread or
process, and every call returns its own value."""

from __future__ import annotations

import os
import threading

import psutil
import pytest

import skyward as sky


def _echo(value: int) -> int:
    return value


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_many_pools_and_many_calls_leak_nothing() -> None:
    me = psutil.Process()
    with sky.ComputePool(nodes=2, quiet=True) as pool:
        pool.map(_echo, range(100))  # warm: lazily made threads and imports
    fds, threads = me.num_fds(), threading.active_count()
    for cycle in range(50):
        with sky.ComputePool(nodes=2, quiet=True) as pool:
            values = list(range(cycle * 2000, (cycle + 1) * 2000))
            assert pool.map(_echo, values) == values
            assert sorted(pool.broadcast(os.getpid)) == sorted(set(pool.broadcast(os.getpid)))
    assert me.num_fds() <= fds
    assert threading.active_count() <= threads
    assert not me.children(recursive=True)
