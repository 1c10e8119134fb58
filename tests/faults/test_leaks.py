"""Nothing is kept that the user let go of, and nothing outlives its client (issue 14, 7-10)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref
from pathlib import Path

import psutil
import pytest

import skyward as sky
from skyward.console import LineBuffer


class _Big:
    """A result the test can watch: weakly referenceable, unlike bytes."""

    def __init__(self) -> None:
        self.data = bytearray(1 << 20)


def _big() -> _Big:
    return _Big()


def test_a_result_with_a_timeout_is_not_kept_until_its_deadline() -> None:
    with sky.ComputePool(quiet=True) as pool:
        future = sky.compute(timeout=600)(_big)() > pool
        result = future.result()
        watched = weakref.ref(result)
        del future, result
        gc.collect()
        assert watched() is None, "the call's timeout bookkeeping kept the result alive"


def _kept() -> list[weakref.ref[object]]:
    # On the worker, in a place that is the same for every call: module globals are not, if
    # another test made cloudpickle send this module by value.
    import builtins

    kept: list[weakref.ref[object]] = builtins.__dict__.setdefault("_skyward_test_kept", [])
    return kept


def _make_and_return_array() -> object:
    import numpy as np

    array = np.ones(1 << 20)
    _kept().append(weakref.ref(array))
    return array


def _last_result_alive() -> bool:
    gc.collect()
    return _kept()[-1]() is not None


def test_the_worker_lets_go_of_its_last_result_before_the_next_call_runs() -> None:
    with sky.ComputePool(quiet=True) as pool:
        pool.run(_make_and_return_array)
        assert pool.run(_last_result_alive) is False


@pytest.mark.timeout(90)
def test_processes_a_call_started_die_with_a_sigkilled_client(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    client = textwrap.dedent(
        f"""
        import subprocess, time, skyward as sky
        def spawn():
            child = subprocess.Popen(["sleep", "600"])
            open({str(pids)!r}, "a").write(f"{{child.pid}}\\n")
            time.sleep(600)
        with sky.ComputePool(quiet=True) as pool:
            pool.run(spawn)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", client], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pids.read_text().split()[0])
        assert psutil.pid_exists(child)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    # The worker notices its client is gone and leaves within about ten seconds, taking
    # what its calls started with it.
    deadline = time.monotonic() + 40
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the call's child outlived the killed client"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_output_without_newlines_is_cut_in_linear_time_with_bounded_memory() -> None:
    buffer = LineBuffer()
    chunk = b"x" * (1 << 16)
    shown = 0
    for _ in range(800):  # 50 MiB, no newline
        shown += sum(len(line) for line in buffer.feed(chunk, 0.0))
        assert buffer._size <= LineBuffer.MAX_LINE
    shown += sum(len(line) for line in buffer.take())
    assert shown == 800 * len(chunk)


def test_a_carriage_return_line_keeps_only_its_latest_state() -> None:
    buffer = LineBuffer()
    shown = buffer.feed(b"  1%\r  2%\r  3%\r", now=10.0)
    assert shown == [b"  3%"]  # shown at once: the first state after a while
    assert buffer.feed(b"  4%\r  5%\r", now=10.1) == []  # redrawn at most every REDRAW s
    assert buffer.feed(b" 99%\r100%\n", now=10.2) == [b"100%"]
    assert buffer.take() == []
