"""``worker=sky.Worker(concurrency=N, executor="thread" | "process")``, as skyward 0.5's
worker-executors guide describes it, on a local pool."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from time import monotonic

import pydantic
import pytest
from support.pools import PoolFactory
from support.processes import shared_pool

import skyward as sky


@sky.compute
def cpu_burn(task_id: int) -> dict[str, object]:
    """The guide's CPU-bound task: a tight numerical loop (here 0.2 s, not 10 s)."""
    start = monotonic()
    total = 0.0
    i = 0
    while monotonic() - start < 0.2:
        total += (i**0.5) * ((i + 1) ** 0.5)
        i += 1
    return {"task_id": task_id, "iterations": i, "pid": os.getpid()}


@sky.compute
def worker_pid() -> Iterator[int]:
    """Streaming calls run on the worker's own threads, whatever the executor."""
    yield os.getpid()


@sky.compute
def hold_the_gil_until_opened(fifo: str) -> int:
    """Block in C *holding the GIL* (ctypes.PyDLL does not release it) until someone opens
    ``fifo`` for writing: no other thread of this process can run meanwhile."""
    import ctypes

    open(fifo + ".waiting", "w").close()
    fd = ctypes.PyDLL(None).open(fifo.encode(), os.O_RDONLY)
    os.close(fd)
    return os.getpid()


@sky.compute
def open_for_writing(fifo: str) -> int:
    fd = os.open(fifo, os.O_WRONLY)
    os.close(fd)
    return os.getpid()


@pytest.fixture(scope="module")
def processes() -> Iterator[sky.ComputePool]:
    worker = sky.Worker(concurrency=2, executor="process")
    with shared_pool(nodes=1, worker=worker) as pool:
        yield pool


@pytest.mark.timeout(60)
def test_process_executor_calls_do_not_share_one_gil(
    processes: sky.ComputePool, tmp_path: Path
) -> None:
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    holder = hold_the_gil_until_opened(fifo) > processes
    deadline = monotonic() + 30
    while not os.path.exists(fifo + ".waiting") and monotonic() < deadline:
        time.sleep(0.01)
    opener = open_for_writing(fifo) >> processes  # runs while the other holds its GIL
    assert holder.result(timeout=30) != opener


def test_process_executor_calls_run_in_children_of_the_worker(
    processes: sky.ComputePool,
) -> None:
    worker = next(worker_pid() >> processes)
    children = {r["pid"] for r in sky.gather(*(cpu_burn(i) for i in range(4))) >> processes}
    assert worker not in children
    assert all(pid != os.getpid() for pid in children)


def test_the_guides_process_example_streams_every_task(processes: sky.ComputePool) -> None:
    results = sky.gather(*(cpu_burn(i) for i in range(6)), stream=True)
    seen = sorted(r["task_id"] for r in (results >> processes))
    assert seen == list(range(6))


def test_children_know_their_node_print_labelled_and_raise_their_own_errors(
    processes: sky.ComputePool, capsys: pytest.CaptureFixture[str]
) -> None:
    def report() -> int:
        print("from a child")
        return sky.instance_info().node

    def fail() -> None:
        raise LookupError("not in the child's table")

    assert processes.run(report) == 0
    assert "[node 0] from a child" in capsys.readouterr().out
    with pytest.raises(LookupError, match="child's table"):
        processes.run(fail)


def test_a_child_that_dies_fails_its_call_and_the_next_call_runs(
    processes: sky.ComputePool,
) -> None:
    with pytest.raises(RuntimeError, match="died"):
        processes.run(os._exit, 3)
    assert processes.run(lambda: 6 * 7) == 42


@pytest.mark.timeout(60)
def test_plugins_decorate_calls_in_the_children(tmp_path: Path) -> None:
    log = tmp_path / "log"

    def decorate(fn):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
            return fn(*args, **kwargs)

        return wrapper

    plugin = sky.Plugin.create("log").with_decorator(decorate)
    worker = sky.Worker(executor="process")
    with sky.ComputePool(worker=worker, plugins=[plugin], quiet=True) as pool:
        child = pool.run(os.getpid)
    assert log.read_text().split() == [str(child)]


@pytest.mark.timeout(60)
def test_the_thread_executor_is_the_default_and_runs_in_the_worker() -> None:
    assert sky.Worker(concurrency=2).executor == "auto"
    with sky.ComputePool(worker=sky.Worker(concurrency=2), quiet=True) as pool:
        assert pool.spec.concurrency == 2 and pool.spec.executor == "thread"
        assert pool.run(os.getpid) == next(worker_pid() >> pool)


def test_worker_and_concurrency_must_agree() -> None:
    assert sky.ComputePool(worker=sky.Worker(concurrency=3), concurrency=3).spec.concurrency == 3
    with pytest.raises(pydantic.ValidationError, match="contradicts"):
        sky.ComputePool(worker=sky.Worker(concurrency=2), concurrency=4)
    with pytest.raises(pydantic.ValidationError, match="executor"):
        sky.Worker(executor="fiber")  # type: ignore[arg-type]
    assert sky.ComputePool(concurrency=5).spec.concurrency == 5
    assert sky.ComputePool().spec.concurrency == 1


def test_no_child_outlives_its_pool() -> None:
    import psutil

    with sky.ComputePool(worker=sky.Worker(concurrency=2, executor="process"), quiet=True) as pool:
        child = pool.run(os.getpid)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"


@pytest.mark.timeout(120)
def test_the_process_executor_runs_on_every_transport(make_pool: PoolFactory) -> None:
    worker = sky.Worker(concurrency=2, executor="process")
    with make_pool(nodes=1, worker=worker) as pool:
        results = sky.gather(*(cpu_burn(i) for i in range(2))) >> pool
        assert [r["task_id"] for r in results] == [0, 1]
        assert next(worker_pid() >> pool) not in {r["pid"] for r in results}
