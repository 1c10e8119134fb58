"""Remote exceptions, unpicklable things, dead workers and timeouts."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, wait
from pathlib import Path

import pytest
from support.markers import per_node, wait_for_markers
from support.pools import PoolFactory, broadcast_in_background

import skyward as sky


class NeedsTwoArgs(Exception):
    """Pickles, but cannot be unpickled: Exception's pickling passes only ``args``."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}+{b}")


@sky.compute
def fail_with_value_error() -> None:
    raise ValueError("bad value on the worker")


@sky.compute
def fail_unpicklably() -> None:
    raise NeedsTwoArgs(1, 2)


@sky.compute
def pid() -> int:
    return os.getpid()


@sky.compute
def wait_for(path: str, seconds: float = 60, started: str = "") -> str:
    """Wait for ``path``; first make ``{started}-{node}``, if given, to say it runs."""
    if started:
        Path(f"{started}-{sky.instance_info().node}").touch()
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "done"


@pytest.fixture
def pool(make_pool: PoolFactory) -> Iterator[sky.ComputePool]:
    with make_pool(nodes=2) as pool:
        yield pool


def test_remote_value_error_is_caught_as_value_error(pool: sky.ComputePool) -> None:
    with pytest.raises(ValueError, match="bad value on the worker") as caught:
        fail_with_value_error() >> pool
    cause = caught.value.__cause__
    assert isinstance(cause, sky.RemoteTraceback)
    assert "fail_with_value_error" in cause.traceback
    assert 'raise ValueError("bad value on the worker")' in cause.traceback


def test_exception_that_cannot_be_unpickled_becomes_remote_error(pool: sky.ComputePool) -> None:
    with pytest.raises(sky.RemoteError) as caught:
        fail_unpicklably() >> pool
    assert caught.value.type_name.endswith("NeedsTwoArgs")
    assert "1+2" in str(caught.value)
    assert "fail_unpicklably" in caught.value.traceback


def test_unpicklable_argument_is_named_before_anything_is_sent(pool: sky.ComputePool) -> None:
    lock = threading.Lock()
    before = pool.statistics().submitted
    with pytest.raises(sky.SerializationError, match=r"argument 'path' \(position 0\) of wait_for"):
        wait_for(lock) >> pool  # type: ignore[arg-type]
    with pytest.raises(sky.SerializationError, match=r"argument 'seconds' of wait_for"):
        wait_for("x", seconds=lock) >> pool  # type: ignore[arg-type]
    assert pool.statistics().submitted == before


def test_unpicklable_function_is_named(pool: sky.ComputePool) -> None:
    lock = threading.Lock()

    def uses_lock() -> bool:
        return lock.locked()

    with pytest.raises(sky.SerializationError, match=r"the function .*uses_lock"):
        pool.run(uses_lock)


def test_unpicklable_return_value_is_a_serialization_error(pool: sky.ComputePool) -> None:
    with pytest.raises(sky.SerializationError, match=r"return value of .* cannot be pickled"):
        pool.run(threading.Lock)


@pytest.mark.timeout(60)
def test_sigkill_during_a_call_raises_worker_lost_promptly(
    pool: sky.ComputePool, tmp_path: Path
) -> None:
    victim = pool.broadcast(pid)[1]
    gate = tmp_path / "gate"
    started = tmp_path / "started"
    futures = [wait_for(str(gate), started=str(started)) > pool for _ in range(2)]  # one a node
    wait_for_markers(*per_node(started, 2))  # both are running
    os.kill(victim, signal.SIGKILL)
    done, _ = wait(futures, timeout=5, return_when=FIRST_EXCEPTION)
    gate.touch()
    failed = [f for f in done if f.exception() is not None]
    assert len(failed) == 1, "the call on the killed node must fail within 5 s"
    lost = failed[0].exception()
    assert isinstance(lost, sky.WorkerLost)
    assert lost.node == 1
    assert lost.exit_status == -signal.SIGKILL
    assert "node 1" in str(lost) and "SIGKILL" in str(lost) and "wait_for" in str(lost)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("how", "status"),
    [
        ("import os; os._exit(7)", 7),
        ("import ctypes; ctypes.string_at(0)", -signal.SIGSEGV),
        ("import os; os.abort()", -signal.SIGABRT),
    ],
    ids=["os._exit", "segfault", "abort"],
)
def test_worker_death_reports_status_and_stderr_tail(
    pool: sky.ComputePool, how: str, status: int
) -> None:
    def die() -> None:
        sys.stderr.write("last words before dying\n")
        sys.stderr.flush()
        exec(how)

    with pytest.raises(sky.WorkerLost) as caught:
        pool.run(die)
    lost = caught.value
    assert lost.exit_status == status
    assert "last words before dying" in lost.stderr_tail
    assert "last words before dying" in str(lost)


@pytest.mark.timeout(60)
def test_a_lost_worker_is_replaced_and_the_pool_keeps_working(
    pool: sky.ComputePool,
) -> None:
    old = pool.broadcast(pid)
    with pytest.raises(sky.WorkerLost):
        pool.run(os._exit, 1)
    deadline = time.monotonic() + 30
    while pool.statistics().ready_nodes < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    new = pool.broadcast(pid)
    assert len(set(new) - set(old)) == 1
    assert pool.statistics().workers_replaced == 1
    assert [n for n in pool.broadcast(lambda: sky.instance_info().node)] == [0, 1]


@pytest.mark.timeout(60)
def test_timeout_raises_timeout_error_and_recycles_the_worker(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    slow = sky.compute(timeout=0.5)(wait_for)
    with make_pool(nodes=1) as pool:
        first = pool.run(pid)
        with pytest.raises(TimeoutError, match=r"timeout of 0\.5 s"):
            slow(str(tmp_path / "never")) >> pool
        second = pool.run(pid)  # waits for the replacement
        assert second != first
        assert pool.run(pid) == second


def test_version_mismatch_is_reported_before_user_code_is_sent(tmp_path: Path) -> None:
    other, minor = _other_python()
    marker = tmp_path / "entered"

    def record(_info: sky.InstanceInfo) -> object:
        marker.touch()
        return open(os.devnull)

    plugin = sky.Plugin(name="record", around_app=record)
    with pytest.raises(sky.VersionMismatch, match=rf"node 0 runs Python {re.escape(minor)}"):
        with sky.ComputePool(sky.Local(python=other), plugins=[plugin]):
            pass
    assert not marker.exists()


def _other_python() -> tuple[str, str]:
    """An interpreter of another minor version than this client's, and that version: the
    suite runs on 3.11, 3.12 and 3.13 clients, each finding one of the others."""
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for minor in ("3.12", "3.11", "3.13"):
        if minor == ours:
            continue
        for root in sorted(Path("/root/.pyenv/versions").glob(f"{minor}.*")):
            candidate = root / "bin" / f"python{minor}"
            if candidate.exists():
                return str(candidate), minor
        found = shutil.which(f"python{minor}")
        if found:
            return found, minor
    pytest.fail(f"this test needs a Python other than {ours} (3.11, 3.12 or 3.13) to play a worker")


def test_remote_system_exit_does_not_exit_the_client(pool: sky.ComputePool) -> None:
    with pytest.raises(sky.RemoteError, match="SystemExit") as caught:
        pool.run(sys.exit, 3)
    assert caught.value.type_name == "SystemExit"
    assert pool.run(pid) > 0  # the worker survived too: SystemExit was caught there


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nodes", [1, 2])
def test_calls_queued_behind_a_dying_worker_still_run(make_pool: PoolFactory, nodes: int) -> None:
    with make_pool(nodes=nodes) as pool:
        dying = pool.submit(os._exit, 1)
        queued = [pool.submit(abs, -i) for i in range(5)]
        with pytest.raises(sky.WorkerLost):
            dying.result(timeout=30)
        assert [f.result(timeout=30) for f in queued] == [0, 1, 2, 3, 4]


@pytest.mark.timeout(60)
def test_a_gang_plugin_restarts_every_worker_when_one_is_lost(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "never"
    with make_pool(nodes=3, plugins=[sky.Plugin(name="tied", gang=True)]) as pool:
        before = pool.broadcast(pid)
        started = tmp_path / "started"
        futures = [wait_for(str(gate), started=str(started)) > pool for _ in range(3)]
        wait_for_markers(*per_node(started, 3))  # one per node, each running
        os.kill(before[1], signal.SIGKILL)
        errors = [f.exception(timeout=30) for f in futures]
        assert all(isinstance(e, sky.WorkerLost) for e in errors)
        assert sum("ties every worker into one runtime" in str(e) for e in errors) == 2
        after = pool.broadcast(pid)
        assert not set(after) & set(before)
        assert pool.statistics().workers_replaced == 3


@sky.compute
def drop_link_on_node_1() -> None:
    """On node 1, close the worker's end of the link, then stop: the client sees the stream
    end seconds before it can report the worker lost (it waits that long for an exit status).
    """
    if sky.instance_info().node != 1:
        return
    import gc

    from skyward.worker.link import WorkerLink

    link = next(o for o in gc.get_objects() if isinstance(o, WorkerLink))
    os.close(link._out_fd)
    os.kill(os.getpid(), signal.SIGSTOP)


@pytest.mark.timeout(60)
def test_a_gang_broadcast_runs_on_one_generation_of_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Between a gang worker's stream ending and its loss being reported, the survivors are
    # alive and idle; a broadcast sent then must not run on them (they are about to be
    # restarted) while its part for the lost node waits for the new runtime. (Local only:
    # the pool's books are the same over SSH, and the fd trick needs the local launch.)
    # The window is how long the client waits for a stopped worker's exit status; widened
    # from 2 s so that a loaded machine still sends the broadcast inside it.
    monkeypatch.setattr("skyward.link.channel._EXIT_STATUS_TIMEOUT", 6.0)
    plugins = [sky.Plugin(name="tied", gang=True)]
    with sky.ComputePool(nodes=3, plugins=plugins, console="off") as pool:
        before = pool.broadcast(pid)
        dropped = broadcast_in_background(pool, drop_link_on_node_1)
        # Node 1's stream ended: in a gang no worker takes calls from then on. Its loss is
        # reported later, and with it the broadcast fails (WorkerLost settles node 1's part).
        deadline = time.monotonic() + 20
        while pool.statistics().ready_workers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.statistics().ready_workers == 0, "node 1's stream ended"
        assert not dropped.done(), "the loss is reported later"
        after = pool.broadcast(pid)
        assert not set(after) & set(before), "every part ran on the new workers"
        assert pool.statistics().workers_replaced == 3
        assert isinstance(dropped.exception(timeout=10), sky.WorkerLost)
