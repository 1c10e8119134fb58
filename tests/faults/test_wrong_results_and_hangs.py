"""Promises the pool keeps under attack: no call returns another call's data, nothing hangs
that a user cannot end, and a hostile object fails its own call only (issue 14, 1-6)."""

from __future__ import annotations

import contextlib
import os
import resource
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest
from support.markers import wait_for_markers
from support.pools import broadcast_in_background, start_in_thread

import skyward as sky
from skyward.providers.local import PipeTransport


def _stamp(rank_that_lags: int, lag: float, lagging: str = "") -> tuple[float, float]:
    """When this part ran; ``rank_that_lags`` first makes ``lagging`` (if given), then
    lags."""
    start = time.time()
    if sky.instance_info().node == rank_that_lags:
        if lagging:
            Path(lagging).touch()
        time.sleep(lag)
    return start, time.time()


@pytest.mark.timeout(60)
def test_a_gang_broadcast_never_starts_while_an_earlier_one_still_runs_on_a_rank(
    tmp_path: Path,
) -> None:
    # Rank 1 is still inside the first broadcast when the second is sent. Started on the
    # other ranks at once, the second's collectives would pair with the first's.
    tied = sky.Plugin(name="tied", gang=True)
    lags = tmp_path / "rank-1-lags"
    with sky.ComputePool(nodes=2, plugins=[tied], quiet=True) as pool:
        first = pool.submit(lambda: None)  # warm
        first.result()
        lagging = broadcast_in_background(pool, _stamp, 1, 2.0, str(lags))
        wait_for_markers(lags)  # the second is sent while rank 1 sleeps
        second = pool.broadcast(_stamp, 1, 0.0)
        (_, ends) = zip(*lagging.result(), strict=True)
        starts, _ = zip(*second, strict=True)
    assert min(starts) >= max(ends), "a part of the second ran while the first still ran"


def test_a_non_gang_broadcast_is_not_held_back(tmp_path: Path) -> None:
    lags = tmp_path / "rank-1-lags"
    with sky.ComputePool(nodes=2, quiet=True) as pool:
        lagging = broadcast_in_background(pool, _stamp, 1, 2.0, str(lags))
        wait_for_markers(lags)
        starts, _ = zip(*pool.broadcast(_stamp, 1, 0.0), strict=True)
        (_, ends) = zip(*lagging.result(), strict=True)
    assert min(starts) < max(ends)


@contextlib.contextmanager
def _high_fd() -> Iterator[int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), max(hard, 2048)))
    try:
        yield 1500
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_full_pipe_past_fd_1023_is_not_taken_for_writable() -> None:
    # select() refuses fds past 1023; the answer must still be "no room" for a full pipe,
    # or a caller writes inline under the pool's lock and blocks it: write_now writes
    # nothing and says so, at once.
    with _high_fd() as high:
        process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert process.stdin is not None
            os.dup2(process.stdin.fileno(), high)
            os.close(process.stdin.fileno())
            process.stdin = open(high, "wb", buffering=0)  # noqa: SIM115
            transport = PipeTransport(process)
            assert transport.write_now(b"x" * 64)
            os.set_blocking(high, False)
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(high, b"x" * select.PIPE_BUF)
            assert not transport.write_now(b"x" * 64)
        finally:
            process.kill()
            process.wait()


class _ExitsWhenUnpickled:
    def __reduce__(self) -> tuple[object, ...]:
        return (sys.exit, (3,))


class _HostileError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


class _ExitsWhenUnpickledError(Exception):
    def __reduce__(self) -> tuple[object, ...]:
        return (sys.exit, (4,))


def _raise(kind: type[BaseException]) -> None:
    raise kind()  # made on the worker


@pytest.mark.timeout(60)
def test_hostile_results_and_errors_fail_their_call_only() -> None:
    with sky.ComputePool(quiet=True) as pool:
        with pytest.raises(sky.RemoteError, match="cannot unpickle the result"):
            pool.run(_ExitsWhenUnpickled)
        with pytest.raises(_HostileError):  # it pickles: it comes back as itself
            pool.run(_raise, _HostileError)
        with pytest.raises(sky.SkywardError, match="_ExitsWhenUnpickledError"):
            pool.run(_raise, _ExitsWhenUnpickledError)
        assert pool.run(os.getpid) == pool.run(os.getpid), "the same worker lives on"
        assert pool.statistics().workers_replaced == 0


class _BadArgument:
    def __reduce__(self) -> tuple[object, ...]:
        return (int, ("not a number",))


def test_an_argument_that_cannot_be_rebuilt_on_the_worker_says_so() -> None:
    with sky.ComputePool(quiet=True) as pool:
        with pytest.raises(sky.SerializationError, match="could not be rebuilt on the worker"):
            pool.run(str, _BadArgument())


@pytest.mark.timeout(60)
def test_a_stronger_close_takes_over_a_draining_one_and_both_return_closed(
    tmp_path: Path,
) -> None:
    pool = sky.ComputePool(quiet=True).start()
    running = pool.submit(time.sleep, 600)
    closers = [threading.Thread(target=pool.close) for _ in range(2)]
    for closer in closers:
        closer.start()
    deadline = time.monotonic() + 30
    while pool.statistics().state != "draining" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.statistics().state == "draining"
    assert all(c.is_alive() for c in closers), "close(wait=True) waits for the call"
    pool.close(wait=False)
    assert pool.statistics().state == "closed"
    for closer in closers:
        closer.join(30)
        assert not closer.is_alive()
    assert isinstance(running.exception(timeout=5), sky.PoolClosed | sky.WorkerLost)


def test_waiting_inside_a_done_callback_raises_instead_of_deadlocking() -> None:
    seen: list[BaseException] = []
    with sky.ComputePool(quiet=True) as pool:

        def callback(_: object) -> None:
            try:
                pool.submit(os.getpid).result()
            except RuntimeError as error:
                seen.append(error)

        pool.submit(os.getpid).add_done_callback(callback)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.run(os.getpid) > 0, "the pool still delivers results"
    assert seen and "done-callback would deadlock" in str(seen[0])


@pytest.mark.parametrize("value", [float("inf"), 1e10, float("nan")])
def test_durations_past_a_week_are_refused_with_the_field_named(value: float) -> None:
    with pytest.raises(pydantic.ValidationError, match="timeout"):
        sky.compute(timeout=value)(print)
    for field in ("start_timeout", "shutdown_timeout", "provision_timeout"):
        with pytest.raises(pydantic.ValidationError, match=field):
            sky.ComputePool(**{field: value})  # type: ignore[arg-type]


def test_a_close_during_a_plugins_start_is_pool_closed(tmp_path: Path) -> None:
    inside = tmp_path / "inside-around-app"

    @contextlib.contextmanager
    def slow_start(info: sky.InstanceInfo) -> Iterator[None]:
        inside.touch()
        time.sleep(60)
        yield

    pool = sky.ComputePool(plugins=[sky.Plugin(name="slow", around_app=slow_start)], quiet=True)
    starter, errors = start_in_thread(pool)
    wait_for_markers(inside)
    pool.close(wait=False)
    starter.join(30)
    assert len(errors) == 1 and isinstance(errors[0], sky.PoolClosed), errors


def test_the_local_pool_refuses_an_accelerator_it_does_not_have() -> None:
    with pytest.raises(ValueError, match="the local pool has no A100"):
        sky.ComputePool(accelerator="A100")
