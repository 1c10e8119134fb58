"""Output control per function, as skyward 0.5's distributed-training guide describes it:
``@sky.stdout(only=...)``, ``@sky.stderr(only=...)``, ``@sky.silent`` and ``sky.is_head()``,
together with the pool's ``output=``."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.processes import shared_pool

import skyward as sky


@sky.compute
@sky.stdout(only="head")
def train(epochs: int) -> int:
    for epoch in range(epochs):
        print(f"epoch {epoch} on node {sky.instance_info().node}")
    return epochs


@sky.compute
@sky.stdout(only=lambda info: info.node < 2)
def first_two() -> None:
    print(f"debug from node {sky.instance_info().node}")


@sky.compute
@sky.silent
def quiet() -> str:
    print("nobody sees this")
    print("nor this", file=sys.stderr)
    return "done"


@sky.compute
@sky.stderr(only="head")
def warn() -> None:
    node = sky.instance_info().node
    print(f"warning from node {node}", file=sys.stderr)
    print(f"stderr done on node {node}", file=sys.stderr)  # shows where the one above would


@sky.compute
def heads() -> bool:
    return sky.is_head()


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.ComputePool]:
    with shared_pool(nodes=4, concurrency=2) as pool:
        yield pool


def test_stdout_only_head_silences_every_other_node(
    pool: sky.ComputePool, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train(2) @ pool == [2, 2, 2, 2]
    out = capsys.readouterr().out
    assert "[node 0] epoch 1 on node 0" in out
    assert "on node 1" not in out and "on node 2" not in out and "on node 3" not in out


def test_stdout_takes_a_predicate_of_the_instance_info(
    pool: sky.ComputePool, capsys: pytest.CaptureFixture[str]
) -> None:
    first_two() @ pool
    out = capsys.readouterr().out
    assert "debug from node 0" in out and "debug from node 1" in out
    assert "debug from node 2" not in out and "debug from node 3" not in out


def test_silent_mutes_stdout_and_stderr_everywhere(
    pool: sky.ComputePool, capsys: pytest.CaptureFixture[str]
) -> None:
    assert quiet() @ pool == ["done"] * 4
    captured = capsys.readouterr()
    assert "nobody sees this" not in captured.out


def test_stderr_only_head_silences_stderr_of_other_nodes(
    pool: sky.ComputePool, capsys: pytest.CaptureFixture[str]
) -> None:
    warn() @ pool
    # stderr travels apart from results: wait for node 0's last line, which follows its first
    seen = ""
    deadline = time.monotonic() + 30
    while "stderr done on node 0" not in seen and time.monotonic() < deadline:
        seen += capsys.readouterr().err
        time.sleep(0.02)
    assert "[node 0] warning from node 0" in seen
    assert "warning from node 1" not in seen and "stderr done on node 1" not in seen


def test_muting_one_call_does_not_mute_another_running_beside_it(
    pool: sky.ComputePool, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    @sky.silent
    def muted_until(path: str) -> None:
        import os

        while not os.path.exists(path):
            time.sleep(0.01)

    def loud(path: str) -> None:
        print("still audible")
        open(path, "w").close()

    gate = str(tmp_path / "gate")
    # Every node runs both calls at once (concurrency=2): the muted one waits for the gate
    # that the loud one opens after printing.
    muted = threading.Thread(target=pool.broadcast, args=(muted_until, gate))
    muted.start()
    pool.broadcast(loud, gate)
    muted.join(30)
    assert capsys.readouterr().out.count("still audible") == 4


def test_is_head_is_true_on_node_0_only(pool: sky.ComputePool) -> None:
    assert heads() @ pool == [True, False, False, False]
    assert sky.is_head()  # the client is node 0 of a one-node pool
    assert sky.is_head(sky.instance_info())  # skyward 0.5's spelling


def test_the_pools_output_option_and_the_decorator_both_apply(
    capsys: pytest.CaptureFixture[str],
) -> None:
    @sky.stdout(only=lambda info: info.node == 1)
    def only_node_1() -> None:
        print(f"from node {sky.instance_info().node}")

    with sky.ComputePool(nodes=2, output="head", quiet=True) as pool:
        pool.broadcast(only_node_1)
    # node 1 may print, but output="head" shows node 0 only: nothing is shown
    assert "from node" not in capsys.readouterr().out


def test_decorators_work_above_compute_and_locally(capsys: pytest.CaptureFixture[str]) -> None:
    @sky.stdout(only=lambda info: False)
    @sky.compute(timeout=30)
    def hushed() -> int:
        print("hushed")
        return 1

    assert isinstance(hushed, sky.ComputeFunction) and hushed.timeout == 30
    assert hushed.local() == 1
    assert "hushed" not in capsys.readouterr().out


def test_muting_is_per_thread_locally_too(capsys: pytest.CaptureFixture[str]) -> None:
    started = threading.Event()
    release = threading.Event()

    @sky.silent
    def hold() -> None:
        started.set()
        release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    started.wait(30)
    print("the main thread still prints")
    release.set()
    thread.join(30)
    assert "the main thread still prints" in capsys.readouterr().out


def test_a_bad_only_is_refused() -> None:
    with pytest.raises(ValueError, match="only must be 'head'"):
        sky.stdout(only="tail")  # type: ignore[arg-type]
