"""Where every node is (``pool.stacks()``), and the hang watch of a gang pool: ranks blocked
in a collective that the others left fail their call with ``CollectiveHang`` and the gang
restarts; a long computation is never taken for a hang."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from support.markers import per_node, wait_for_markers
from support.pools import broadcast_in_background

import skyward as sky


def long_job(gate: str, started: str) -> str:
    def waiting_for_the_gate() -> None:
        Path(f"{started}-{sky.instance_info().node}").touch()
        while not Path(gate).exists():
            time.sleep(0.02)

    waiting_for_the_gate()
    return "done"


@pytest.mark.timeout(60)
def test_stacks_show_every_node_inside_the_users_function(tmp_path: Path) -> None:
    gate, started = tmp_path / "gate", tmp_path / "started"
    with sky.ComputePool(nodes=4, quiet=True) as pool:
        running = broadcast_in_background(pool, long_job, str(gate), str(started))
        wait_for_markers(*per_node(started, 4))  # every node is in waiting_for_the_gate
        stacks = pool.stacks()
        gate.touch()
        assert running.result(timeout=30) == ["done"] * 4
        idle = pool.stacks()
    assert list(stacks) == [0, 1, 2, 3]
    for node in range(4):
        assert "in long_job" in stacks[node] and "in waiting_for_the_gate" in stacks[node]
        # the worker's own frames are left out
        assert "skyward/worker/__main__.py" not in stacks[node]
    assert "── node 3 ──" in str(stacks)
    assert all(text == "idle (no call running)" for text in idle.values()), dict(idle)


def _rank_1_lags(seconds: float) -> int:
    if sky.instance_info().node == 1:
        time.sleep(seconds)  # plain Python, not a collective
    return sky.instance_info().node


@pytest.mark.timeout(60)
def test_a_rank_that_computes_long_after_the_others_is_left_alone() -> None:
    tied = sky.Plugin(name="tied", gang=True)
    with sky.ComputePool(nodes=2, plugins=[tied], hang_timeout=1.0, quiet=True) as pool:
        assert pool.broadcast(_rank_1_lags, 4.0) == [0, 1]
        assert pool.statistics().workers_replaced == 0


# ── a real hang, in jax ──────────────────────────────────────────────────────────────────


def one_more_allgather_on_rank_1() -> int:
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    multihost_utils.process_allgather(jnp.ones(1))
    if sky.instance_info().node == 1:
        multihost_utils.process_allgather(jnp.ones(1))  # nobody else comes
    return sky.instance_info().node


def allgather() -> list[float]:
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    return [float(x) for x in multihost_utils.process_allgather(jnp.ones(1)).ravel()]


@pytest.mark.timeout(240)
def test_ranks_blocked_in_a_collective_the_others_left_fail_the_call_and_the_gang_restarts(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with sky.ComputePool(
        nodes=2, plugins=[sky.plugins.jax()], hang_timeout=4.0, quiet=True
    ) as pool:
        # A broadcast in which rank 1 runs one more collective than rank 0.
        started = time.monotonic()
        with pytest.raises(sky.CollectiveHang) as hang:
            pool.broadcast(one_more_allgather_on_rank_1)
        took = time.monotonic() - started
        assert pool.broadcast(allgather) == [[1.0, 1.0], [1.0, 1.0]]
        # A call on one node that enters a collective nobody else will.
        with pytest.raises(sky.CollectiveHang) as alone:
            pool.run(allgather)
        assert pool.broadcast(allgather) == [[1.0, 1.0], [1.0, 1.0]]
    out, err = capfd.readouterr()
    # The restart stops the rank that had finished too; what JAX logs then (its shutdown
    # barrier fails) goes to that node's file, not to the terminal.
    assert "Terminating process because the JAX distributed service" not in out + err
    assert "Check failure stack trace" not in out + err
    assert hang.value.finished == (0,)
    assert list(hang.value.blocked) == [1]
    where = hang.value.blocked[1]
    assert "in one_more_allgather_on_rank_1" in where and "process_allgather" in where
    assert "node(s) 1 waited more than hang_timeout (4 s)" in str(hang.value)
    assert took < 60, "far below jax's own five-minute waits"
    assert len(alone.value.blocked) == 1


# ── long waits that are not collectives: left alone ─────────────────────────────────────


def ranks_1_and_2_sleep_in_a_debug_callback() -> int:
    import time

    import jax
    import jax.numpy as jnp

    node = sky.instance_info().node

    @jax.jit
    def step(x: jax.Array) -> jax.Array:
        jax.debug.callback(lambda: time.sleep(10.0 if node else 0.1))
        return x + 1

    step(jnp.ones(2)).block_until_ready()  # no collective at all
    return node


def io_callback_for_ten_seconds() -> float:
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import io_callback

    def load(x: np.ndarray) -> np.ndarray:
        time.sleep(10.0)  # a slow data loader
        return np.asarray(x) * 2

    @jax.jit
    def step(x: jax.Array) -> jax.Array:
        return io_callback(load, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    return float(step(jnp.ones(2)).sum())


@pytest.mark.timeout(240)
def test_ranks_waiting_in_a_host_callback_are_not_taken_for_a_hang() -> None:
    statuses: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            statuses.append(record.getMessage())

    handler = Keep()
    logger = logging.getLogger("skyward")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        with sky.ComputePool(
            nodes=3, plugins=[sky.plugins.jax()], hang_timeout=4.0, quiet=True
        ) as pool:
            assert pool.broadcast(ranks_1_and_2_sleep_in_a_debug_callback) == [0, 1, 2]
            assert pool.run(io_callback_for_ten_seconds) == 4.0
            assert pool.statistics().workers_replaced == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    said = [s for s in statuses if "not in a collective" in s]
    assert said and "in a callback" in said[0], statuses


@pytest.mark.timeout(120)
def test_stacks_name_workers_as_their_prints_do_when_nodes_run_several() -> None:
    with sky.ComputePool(nodes=2, workers_per_node=2, quiet=True) as pool:
        stacks = pool.stacks()
    assert list(stacks) == [0, 1, 2, 3]  # by rank, as before
    text = str(stacks)
    headings = [line for line in text.splitlines() if line.startswith("──")]
    assert headings == [
        "── node 0 worker 0 ──",
        "── node 0 worker 1 ──",
        "── node 1 worker 0 ──",
        "── node 1 worker 1 ──",
    ]
