"""``ComputePool(workers_per_node=N | "gpus")``: several worker processes on each node, each
its own rank with its own ``instance_info()``, on local and SSH pools."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from support.pools import PoolFactory

import skyward as sky
from skyward._info import InstanceInfo
from skyward.pool.machines import Layout, lay_out
from skyward.worker.__main__ import _own_devices


@sky.compute
def whoami() -> tuple[int, int, int, int, int, str, int]:
    info = sky.instance_info()
    return (
        info.node,
        info.worker,
        info.global_worker_index,
        info.total_workers,
        info.workers_per_node,
        info.hostname,
        os.getpid(),
    )


@pytest.mark.timeout(300)
def test_two_nodes_of_two_workers_each_have_their_own_instance_info(
    make_pool: PoolFactory,
) -> None:
    with make_pool(nodes=2, workers_per_node=2) as pool:
        seen = whoami() @ pool
        stats = pool.statistics()
    ranks = [(node, worker, rank, total, per) for node, worker, rank, total, per, _, _ in seen]
    assert ranks == [(0, 0, 0, 4, 2), (0, 1, 1, 4, 2), (1, 0, 2, 4, 2), (1, 1, 3, 4, 2)]
    pids = {(host, pid) for *_, host, pid in seen}
    assert len(pids) == 4  # four processes: the broadcast ran on every worker
    hosts = [host for *_, host, _ in seen]
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3]  # a node's workers share its host
    assert (stats.nodes, stats.workers, stats.ready_nodes, stats.ready_workers) == (2, 4, 2, 4)
    assert len(stats.in_flight) == 4


@sky.compute
def held(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_calls_sent_together_go_to_every_worker_least_busy_first() -> None:
    with sky.ComputePool(nodes=1, workers_per_node=3, console="off") as pool:
        pids = (held(0.3) & held(0.3) & held(0.3)) >> pool
        assert len(set(pids)) == 3


@sky.compute
def head_says() -> bool:
    return sky.is_head()


def test_the_head_is_node_0s_first_worker_only() -> None:
    with sky.ComputePool(nodes=2, workers_per_node=2, console="off") as pool:
        assert (head_says() @ pool) == [True, False, False, False]


@sky.compute
def share(items: list[int]) -> list[int]:
    return list(sky.shard(items))


def test_shard_gives_each_worker_its_share() -> None:
    with sky.ComputePool(nodes=2, workers_per_node=2, console="off") as pool:
        shares = share(list(range(8))) @ pool
    assert shares == [[0, 4], [1, 5], [2, 6], [3, 7]]


@sky.compute
def pid() -> int:
    return os.getpid()


def test_a_lost_worker_is_replaced_and_its_node_mates_keep_running() -> None:
    with sky.ComputePool(nodes=2, workers_per_node=2, console="off") as pool:
        before = pid() @ pool
        os.kill(before[3], signal.SIGKILL)  # node 1's second worker
        deadline = time.monotonic() + 60
        while pool.statistics().workers_replaced == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        after = pid() @ pool
    assert after[:3] == before[:3]
    assert after[3] != before[3]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"workers_per_node": 0}, "workers_per_node must be 1 to 256"),
        ({"workers_per_node": 257}, "workers_per_node must be 1 to 256"),
        ({"workers_per_node": True}, "workers_per_node must be 1 to 256"),
        ({"workers_per_node": "all"}, "workers_per_node must be 1 to 256"),
        ({"workers_per_node": "gpus"}, "needs|no accelerator"),
    ],
)
def test_bad_workers_per_node_is_refused_before_anything_starts(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        sky.ComputePool(console="off", **options)


def test_each_worker_owns_an_equal_block_of_its_nodes_gpus_or_shares_one() -> None:
    blocks = Layout(nodes=2, per_node=4)
    assert [blocks.devices(rank, 8) for rank in range(4, 8)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    shared = Layout(nodes=1, per_node=4)
    assert [shared.devices(rank, 2) for rank in range(4)] == [(0,), (0,), (1,), (1,)]
    assert Layout(nodes=1, per_node=2).devices(1, 0) == ()  # CPU nodes own no GPU
    assert blocks.label(5) == "node 1 worker 1" and Layout(3).label(2) == "node 2"


class _Machine:
    def __init__(self, gpus: int) -> None:
        self.accelerators = gpus


def test_gpus_that_cannot_be_dealt_out_evenly_are_an_error_naming_the_node() -> None:
    assert lay_out("gpus", [_Machine(8), _Machine(8)]) == Layout(2, 8)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="node 1: 4"):
        lay_out("gpus", [_Machine(8), _Machine(4)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="cannot share node 0's 8 GPUs"):
        lay_out(3, [_Machine(8)])  # type: ignore[list-item]
    assert lay_out(2, [_Machine(0)]) == Layout(1, 2)  # CPU nodes: any number


def _info(**fields: Any) -> InstanceInfo:
    return InstanceInfo(
        node=0,
        total_nodes=1,
        head_addr="10.0.0.1",
        head_port=1,
        peers=("10.0.0.1",),
        hostname="h",
        accelerators=4,
        **fields,
    )


def test_a_worker_sees_only_its_gpus_narrowing_a_list_it_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _own_devices(_info(worker=1, workers_per_node=2, devices=(2, 3)))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # a scheduler's (Slurm's) choice
    _own_devices(_info(worker=1, workers_per_node=2, devices=(2, 3)))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6,7"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2,3,4")
    _own_devices(_info(devices=(0, 1, 2, 3)))  # one worker per node: it sees them all
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,2,3,4"


@sky.compute
def jax_ranks() -> tuple[int, int, int]:
    import jax

    return jax.process_index(), jax.process_count(), jax.device_count()


@pytest.mark.timeout(180)
def test_jax_runs_one_process_per_worker() -> None:
    plugins = [sky.plugins.jax(cpu_devices=1)]
    with sky.ComputePool(nodes=2, workers_per_node=2, plugins=plugins, console="off") as pool:
        assert (jax_ranks() @ pool) == [(0, 4, 4), (1, 4, 4), (2, 4, 4), (3, 4, 4)]


@sky.compute
def digest(data: bytes) -> tuple[int, str]:
    import hashlib

    return sky.instance_info().global_worker_index, hashlib.sha256(data).hexdigest()


@pytest.mark.timeout(300)
def test_a_large_broadcast_reaches_every_worker(make_pool: PoolFactory) -> None:
    """2 MiB: on SSH pools it is relayed, worker to worker, including between two workers of
    one host."""
    import hashlib

    data = os.urandom(2 << 20)
    expected = hashlib.sha256(data).hexdigest()
    with make_pool(nodes=2, workers_per_node=2) as pool:
        assert (digest(data) @ pool) == [(rank, expected) for rank in range(4)]


def test_messages_name_a_worker_by_its_node_and_index_there_as_its_prints_do() -> None:
    one, two = Layout(3, 1), Layout(3, 2)
    assert one.label(2) == "node 2" and one.label_all([0, 2]) == "node(s) 0, 2"
    assert two.label(3) == "node 1 worker 1"
    assert two.label_all([1, 4]) == "node 0 worker 1, node 2 worker 0"
    assert two.label_all([]) == "none"
