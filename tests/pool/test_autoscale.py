"""Autoscaling, ``nodes=(min, max)``: the pool starts ``min`` nodes, grows while calls wait
for a node, shrinks back when nodes sit idle, never below ``min``; on local and SSH pools.

No assertion is on time: short cooldowns make the tests quick, and each waits for what it
can observe (the pool's size, a marker file) with a generous bound.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pydantic
import pytest
from support.pools import PoolFactory, ssh_provider
from support.processes import worker_processes
from support.sshhosts import Hosts

import skyward as sky

# Short enough for a quick test, long enough that a 2-core machine under load does not
# take an ordinary scheduling hiccup for a queue that waits.
FAST = {"autoscale_cooldown": 0.3, "autoscale_idle_timeout": 1.0}


def _wait_for(condition: Callable[[], bool], what: str, bound: float = 90.0) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound:g} s: {what}")
        time.sleep(0.02)


def _node_after(marker: str, seconds: float) -> int:
    """Say the call started (touch ``marker``), sleep, and return the node it ran on."""
    Path(marker).touch()
    time.sleep(seconds)
    return sky.instance_info().node


def _until_released(gate: str) -> int:
    """Run until ``gate`` exists; return the node."""
    while not os.path.exists(gate):
        time.sleep(0.01)
    return sky.instance_info().node


def _pid_and_node() -> tuple[int, int]:
    return os.getpid(), sky.instance_info().node


# ── growing and shrinking ────────────────────────────────────────────────────────────────


@pytest.mark.timeout(240)
def test_a_burst_grows_the_pool_to_max_and_idleness_shrinks_it_to_min(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    with make_pool(nodes=(1, 3), **FAST) as pool:
        assert pool.current_nodes() == 1
        assert pool.statistics().nodes == 1
        # Six calls that hold their node until the gate opens: one runs, five wait.
        futures = [pool.submit(_until_released, str(gate)) for _ in range(6)]
        _wait_for(lambda: pool.current_nodes() == 3, "the pool grew to max")
        _wait_for(lambda: sum(pool.statistics().in_flight) == 3, "every node took a call")
        assert pool.current_nodes() == 3  # never past max, though calls still wait
        gate.touch()
        assert sorted({f.result(timeout=120) for f in futures}) == [0, 1, 2]
        _wait_for(lambda: pool.current_nodes() == 1, "the idle nodes were released")
        assert pool.run(_pid_and_node)[1] == 0  # the pool still serves, on node 0
        time.sleep(3 * FAST["autoscale_idle_timeout"])
        assert pool.current_nodes() == 1  # never below min
    assert not worker_processes()
    log = (pool.log_dir / "events.log").read_text() if pool.log_dir else ""
    assert "scaling up: 1 → 3 nodes" in log
    assert "scaling down: 3 → 2 nodes" in log and "scaling down: 2 → 1 nodes" in log


@pytest.mark.timeout(240)
def test_a_call_never_lands_on_a_node_being_released(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    with make_pool(nodes=(1, 3), **FAST) as pool:
        held = [pool.submit(_until_released, str(gate)) for _ in range(4)]
        _wait_for(lambda: pool.current_nodes() == 3, "the pool grew to max")
        gate.touch()
        for future in held:
            future.result(timeout=120)
        # While nodes 2 and 1 go idle and are released, a steady stream of calls (each to
        # the least busy node, whichever that is when it is sent): each must run to its end
        # (a call sent to a released worker would fail with PoolClosed or WorkerLost).
        errors: list[BaseException] = []
        done = threading.Event()

        def caller() -> None:
            while not done.is_set():
                try:
                    pool.run(_pid_and_node)
                except BaseException as exc:
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=caller)]
        for thread in threads:
            thread.start()
        try:
            _wait_for(lambda: pool.current_nodes() == 1 or bool(errors), "the pool shrank")
        finally:
            done.set()
            for thread in threads:
                thread.join(60)
        assert not errors, errors
        assert pool.current_nodes() == 1
        assert pool.statistics().failed == 0


@pytest.mark.timeout(240)
def test_ctrl_c_during_a_scale_up_leaves_no_worker_and_no_node(
    make_pool: PoolFactory, tmp_path: Path
) -> None:
    joining = tmp_path / "joining"

    @contextlib.contextmanager
    def slow_to_join(info: sky.InstanceInfo) -> Iterator[None]:
        if info.node > 0:  # a node the scale-up adds: it never becomes ready
            joining.touch()
            time.sleep(120)
        yield

    def interrupt_when_joining() -> None:
        deadline = time.monotonic() + 100
        while not joining.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    threading.Thread(target=interrupt_when_joining, daemon=True).start()
    plugins = [sky.Plugin(name="slow-to-join", around_app=slow_to_join)]
    pool = make_pool(nodes=(1, 3), plugins=plugins, **FAST)
    with pytest.raises(KeyboardInterrupt):
        with pool:
            futures = [pool.submit(_node_after, str(tmp_path / f"c{i}"), 60) for i in range(4)]
            for future in futures:
                future.result()
    assert joining.exists()
    assert not pool.is_active and pool.current_nodes() == 0
    assert not worker_processes()  # none of the pool's, the joining ones included
    allocation = pool._machines._allocation  # what the provider made: all of it closed
    assert allocation is not None and allocation.terminated


# ── what is refused, before anything starts ──────────────────────────────────────────────


def test_a_gang_plugin_refuses_a_node_range_with_the_reason() -> None:
    gang = sky.Plugin(name="ring", gang=True)
    with pytest.raises(pydantic.ValidationError, match=r"plugin ring ties every node into one"):
        sky.ComputePool(nodes=(2, 4), plugins=[gang])
    with pytest.raises(pydantic.ValidationError, match=r"plugin jax .*nodes=4 or nodes=2"):
        sky.ComputePool(nodes=(2, 4), plugins=[sky.plugins.jax()])  # a gang too
    assert sky.ComputePool(nodes=(3, 3), plugins=[gang]).spec.autoscaling is False


def test_autoscale_options_without_a_range_are_refused_not_ignored() -> None:
    with pytest.raises(pydantic.ValidationError, match="autoscale_cooldown applies to an"):
        sky.ComputePool(nodes=2, autoscale_cooldown=5)
    with pytest.raises(pydantic.ValidationError, match="autoscale_idle_timeout"):
        sky.ComputePool(autoscale_idle_timeout=5)
    spec = sky.ComputePool(nodes=(1, 2), autoscale_cooldown=5, autoscale_idle_timeout=7).spec
    assert (spec.autoscale_cooldown, spec.autoscale_idle_timeout) == (5, 7)
    assert (spec.initial_nodes, spec.nodes, spec.autoscaling) == (1, 2, True)


def test_several_workers_per_node_refuse_a_node_range() -> None:
    with pytest.raises(pydantic.ValidationError, match="runs one worker per node"):
        sky.ComputePool(nodes=(1, 2), workers_per_node=2)


def test_a_provider_that_cannot_grow_refuses_a_node_range() -> None:
    class Fixed(sky.Local):  # a provider with no `grows`: its allocations have a fixed size
        grows = False  # type: ignore[misc]

    with pytest.raises(pydantic.ValidationError, match="cannot add or release machines"):
        sky.ComputePool(Fixed(), nodes=(1, 2))


def test_ssh_refuses_a_maximum_above_its_hosts(ssh_hosts: Hosts) -> None:
    provider = ssh_provider(ssh_hosts, ssh_hosts.hosts[0].target, ssh_hosts.hosts[1].target)
    with pytest.raises(ValueError, match="asks for up to 3 nodes but SSH has 2 host"):
        sky.ComputePool(provider, nodes=(1, 3))
    request = sky.ComputePool(provider, nodes=(1, 2)).spec.request(sky.Image())
    assert (request.nodes, request.max_nodes) == (1, 2)
