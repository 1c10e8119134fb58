"""Worker output reaches the client live, labelled by node, C-level writes included."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from support.pools import PoolFactory

import skyward as sky


@sky.compute
def chatty(gate: str) -> str:
    print(f"working on node {sky.instance_info().node}")
    while not os.path.exists(gate):
        time.sleep(0.01)
    return "finished"


def _wait_for_output(capsys: pytest.CaptureFixture[str], text: str) -> str:
    seen = ""
    deadline = time.monotonic() + 30
    while text not in seen and time.monotonic() < deadline:
        seen += capsys.readouterr().out
        time.sleep(0.02)
    return seen


@pytest.mark.timeout(60)
def test_print_shows_up_labelled_while_the_call_runs(
    make_pool: PoolFactory, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    with make_pool(nodes=2) as pool:
        future = chatty(str(gate)) > pool
        seen = _wait_for_output(capsys, "working on node")
        assert not future.done(), "the call must still be running"
        gate.touch()
        assert future.result(timeout=30) == "finished"
    assert "[node 0] working on node 0" in seen


def test_c_level_writes_and_stderr_are_forwarded(
    make_pool: PoolFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    def write_everywhere() -> None:
        import ctypes

        os.write(1, b"raw fd one\n")
        libc = ctypes.CDLL(None)
        libc.printf(b"from printf\n")
        os.write(2, b"raw fd two\n")
        print("python stderr", file=sys.stderr)

    with make_pool(nodes=1) as pool:
        pool.run(write_everywhere)
    captured = capsys.readouterr()
    assert "[node 0] raw fd one" in captured.out
    assert "[node 0] from printf" in captured.out
    assert "[node 0] raw fd two" in captured.err
    assert "[node 0] python stderr" in captured.err


def test_output_of_a_call_arrives_before_its_result(
    make_pool: PoolFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    def loud(n: int) -> int:
        for i in range(n):
            print(f"line {i}")
        return n

    with make_pool(nodes=1) as pool:
        pool.run(loud, 500)
        out = capsys.readouterr().out
    assert "[node 0] line 499" in out


def test_progress_is_reported_unless_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    # What the console shows does not depend on the transport: a local pool is enough.
    with sky.ComputePool(nodes=2, name="chatty-pool"):
        pass
    err = capsys.readouterr().err
    assert "skyward: starting 2 node(s) on local (pool chatty-pool)" in err
    assert "skyward: pool chatty-pool ready" in err
    with sky.ComputePool(nodes=1, quiet=True):
        pass
    assert "skyward:" not in capsys.readouterr().err
