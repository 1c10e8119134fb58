"""The public operators and pool methods on a real 4-node pool, local and over SSH."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from support.pools import PoolFactory
from support.processes import shared_pool

import skyward as sky


@sky.compute
def hello(name: str) -> str:
    return f"hello {name} from node {sky.instance_info().node}"


@sky.compute
def where() -> tuple[int, int]:
    return sky.instance_info().node, os.getpid()


@sky.compute
def square(x: int) -> int:
    return x * x


@sky.compute
def info() -> sky.InstanceInfo:
    return sky.instance_info()


@pytest.fixture(scope="module")
def pool(make_module_pool: PoolFactory) -> Iterator[sky.ComputePool]:
    with shared_pool(make_module_pool, nodes=4, image=sky.Image(pip=("numpy",))) as pool:
        yield pool


def test_rshift_runs_on_one_node_and_returns_the_value(pool: sky.ComputePool) -> None:
    assert (hello("you") >> pool).startswith("hello you from node ")


def test_matmul_returns_one_result_per_node_in_rank_order(pool: sky.ComputePool) -> None:
    results = where() @ pool
    assert [node for node, _ in results] == [0, 1, 2, 3]
    assert len({pid for _, pid in results}) == 4
    assert os.getpid() not in {pid for _, pid in results}


def test_gt_returns_a_concurrent_future(pool: sky.ComputePool) -> None:
    future = square(7) > pool
    assert isinstance(future, Future)
    assert future.result(timeout=30) == 49


def test_group_runs_in_parallel_and_returns_a_tuple(pool: sky.ComputePool) -> None:
    assert (square(1) & square(2) & square(3)) >> pool == (1, 4, 9)
    future = (square(4) & hello("g")) > pool
    assert future.result(timeout=30)[0] == 16


def test_map_over_1000_items_keeps_input_order(pool: sky.ComputePool) -> None:
    assert pool.map(square, range(1000)) == [x * x for x in range(1000)]


def test_map_spreads_work_over_every_node(pool: sky.ComputePool) -> None:
    nodes = pool.map(lambda _: sky.instance_info().node, range(200))
    assert set(nodes) == {0, 1, 2, 3}


def test_local_runs_in_this_process() -> None:
    assert where.local() == (0, os.getpid())
    assert square.local(5) == 25


def test_calling_a_compute_function_runs_nothing() -> None:
    ran = []

    @sky.compute
    def touch() -> None:
        ran.append(1)

    call = touch()
    assert isinstance(call, sky.PendingCall)
    assert ran == []


def test_pool_methods_match_the_operators(pool: sky.ComputePool) -> None:
    assert pool.run(square, 3) == 9
    assert pool.submit(square, 4).result(timeout=30) == 16
    assert [n for n, _ in pool.broadcast(where)] == [0, 1, 2, 3]
    # plain functions work too, not only @sky.compute ones
    assert pool.run(pow, 2, 10) == 1024


def test_instance_info_is_consistent_across_a_broadcast(pool: sky.ComputePool) -> None:
    infos = info() @ pool
    assert [i.node for i in infos] == [0, 1, 2, 3]
    assert {i.total_nodes for i in infos} == {4}
    assert len({(i.head_addr, i.head_port, i.peers) for i in infos}) == 1
    head = infos[0]
    provider = pool.spec.provider
    if isinstance(provider, sky.SSH):  # each host by the address the others reach it at
        assert head.peers == tuple(h.split("@")[1] for h in provider.hosts[:4])
        assert len({i.hostname for i in infos}) == 4
    else:
        assert head.peers == ("127.0.0.1",) * 4
    assert head.head_addr == head.peers[0]
    assert 0 < head.head_port < 65536
    assert [i.is_head for i in infos] == [True, False, False, False]
    assert {i.pool for i in infos} == {pool.name}
    assert {i.provider for i in infos} == {provider.kind}


def test_instance_info_outside_a_worker_describes_a_one_node_pool() -> None:
    here = sky.instance_info()
    assert (here.node, here.total_nodes, here.pool, here.is_head) == (0, 1, None, True)


def test_many_threads_can_dispatch_to_one_pool(pool: sky.ComputePool) -> None:
    results: dict[int, list[int]] = {}

    def client(t: int) -> None:
        results[t] = [square(t * 100 + i) >> pool for i in range(25)]

    threads = [threading.Thread(target=client, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {t: [(t * 100 + i) ** 2 for i in range(25)] for t in range(8)}


def test_statistics_count_calls(pool: sky.ComputePool) -> None:
    before = pool.statistics()
    pool.map(square, range(10))
    after = pool.statistics()
    assert after.submitted - before.submitted == 10
    assert after.succeeded - before.succeeded == 10
    assert after.ready_nodes == 4 and after.state == "running"
    assert after.in_flight == (0, 0, 0, 0)


def test_large_numpy_arguments_and_results_round_trip(pool: sky.ComputePool) -> None:
    import numpy as np

    data = np.arange(4_000_000, dtype=np.float64)
    doubled = pool.run(lambda a: a * 2, data)
    assert doubled.shape == data.shape and float(doubled[-1]) == 2 * float(data[-1])
    assert [float(s) for s in pool.broadcast(lambda a: a.sum(), data)] == [float(data.sum())] * 4


def test_map_queues_ahead_only_on_nodes_whose_recent_calls_were_short() -> None:
    from skyward._scheduler import PREFETCH_MAX as _PREFETCH_MAX
    from skyward._scheduler import prefetch_depth as _prefetch_depth

    assert _prefetch_depth(float("inf")) == 0  # a new worker: nothing known yet
    assert _prefetch_depth(0.05) == 0  # long calls: a queued one could wait long
    assert _prefetch_depth(0.004) == 2  # the last queued waits about 10 ms at most
    assert _prefetch_depth(0.00001) == _PREFETCH_MAX
