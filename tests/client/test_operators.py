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


def test_a_pending_call_given_alone_to_a_pool_method_is_the_operator(
    pool: sky.ComputePool,
) -> None:
    # What the operators call: `f(x) >> pool` is `pool.run(f(x))`, and so on.
    assert pool.run(square(3)) == 9
    assert pool.submit(square(4)).result(timeout=30) == 16
    assert [n for n, _ in pool.broadcast(where())] == [0, 1, 2, 3]
    assert [f.result(timeout=30) for f in pool.submit_all([square(5), square(6)])] == [25, 36]
    with pytest.raises(TypeError, match=r"pass it alone"):
        pool.run(square(3), 4)  # type: ignore[call-overload]


def test_submit_all_pickles_every_call_before_it_queues_any(pool: sky.ComputePool) -> None:
    before = pool.statistics().submitted
    with pytest.raises(sky.SerializationError, match="argument 'x'"):
        pool.submit_all([square(2), square(threading.Lock())])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pending calls such as f"):
        pool.submit_all([square])  # type: ignore[list-item]
    assert pool.statistics().submitted == before, "nothing was sent"


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
    from skyward.pool.scheduler import PREFETCH_MAX as _PREFETCH_MAX
    from skyward.pool.scheduler import prefetch_depth as _prefetch_depth

    assert _prefetch_depth(float("inf")) == 0  # a new worker: nothing known yet
    assert _prefetch_depth(0.05) == 0  # long calls: a queued one could wait long
    assert _prefetch_depth(0.004) == 2  # the last queued waits about 10 ms at most
    assert _prefetch_depth(0.00001) == _PREFETCH_MAX


# ── the right side of an operator ────────────────────────────────────────────────────────


@pytest.mark.parametrize("right", [os, None, 3, "pool"], ids=["module", "None", "int", "str"])
@pytest.mark.parametrize("operator", [">>", "@", ">"])
def test_an_operator_with_no_pool_on_the_right_says_what_the_right_side_must_be(
    right: object, operator: str
) -> None:
    call = square(2)
    send = {
        ">>": lambda: call >> right,  # type: ignore[operator]
        "@": lambda: call @ right,  # type: ignore[operator]
        ">": lambda: call > right,  # type: ignore[operator]
    }[operator]
    with pytest.raises(TypeError, match=rf"right side of `{operator}` must be a sky.ComputePool"):
        send()


def test_a_group_with_no_pool_on_the_right_says_what_the_right_side_must_be() -> None:
    with pytest.raises(TypeError, match=r"must be a sky\.ComputePool.*got None"):
        (square(1) & square(2)) >> None  # type: ignore[operator]
    # On a thread of its own: this module's shared pool is open on the main thread, and the
    # module on the right means this thread's innermost open pool (tests/client/test_calls_api.py).
    raised: list[BaseException] = []

    def send_to_module() -> None:
        try:
            _ = (square(1) & square(2)) > sky  # type: ignore[operator]
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=send_to_module)
    thread.start()
    thread.join(30)
    assert len(raised) == 1 and isinstance(raised[0], sky.PoolClosed)
    assert "`f(x) > sky` runs on the innermost pool" in str(raised[0])


# ── sky.gather: the parallel-execution guide of skyward 0.5 ──────────────────────────────


@sky.compute
def process_chunk(data: list[int]) -> int:
    return sum(data)


@sky.compute
def multiply(x: int, y: int) -> int:
    return x * y


@sky.compute
def factorial(n: int) -> int:
    result = 1
    for i in range(1, n + 1):
        result *= i
    return result


@sky.compute
def wait_for(path: str, value: int) -> int:
    """Returns ``value`` once ``path`` exists: the test decides the order calls finish in."""
    import time

    while not os.path.exists(path):
        time.sleep(0.01)
    return value


def test_gather_runs_a_dynamic_number_of_calls_and_returns_a_tuple(pool: sky.ComputePool) -> None:
    chunks = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert sky.gather(*[process_chunk(c) for c in chunks]) >> pool == (6, 15, 24)
    assert sky.gather() >> pool == ()


def test_gather_and_ampersand_make_the_same_group(pool: sky.ComputePool) -> None:
    a, b = (multiply(2, 3) & multiply(4, 5)) >> pool
    assert (a, b) == (6, 20)
    s, p, f = (process_chunk([1, 2, 3]) & multiply(10, 20) & factorial(5)) >> pool
    assert (s, p, f) == (6, 200, 120)
    group = sky.gather(multiply(1, 2), factorial(3))
    assert isinstance(group, sky.CallGroup) and len(group) == 2
    assert (group & multiply(3, 3)) >> pool == (2, 6, 9)


def test_gather_stream_yields_every_value(pool: sky.ComputePool) -> None:
    tasks = [process_chunk([i] * 1000) for i in range(5)]
    stream = sky.gather(*tasks, stream=True) >> pool
    assert not isinstance(stream, tuple)
    assert list(stream) == [0, 1000, 2000, 3000, 4000]


def test_gather_stream_unordered_yields_in_completion_order(
    pool: sky.ComputePool, tmp_path: object
) -> None:
    gates = [os.path.join(str(tmp_path), f"gate{i}") for i in range(3)]
    stream = sky.gather(*(wait_for(g, i) for i, g in enumerate(gates)), stream=True, ordered=False)
    values = iter(stream >> pool)
    seen = []
    for i in (2, 0, 1):  # open the gates in this order; each value comes as its gate opens
        open(gates[i], "w").close()
        seen.append(next(values))
    assert seen == [2, 0, 1]


def test_gather_stream_ordered_keeps_submission_order(
    pool: sky.ComputePool, tmp_path: object
) -> None:
    gates = [os.path.join(str(tmp_path), f"gate{i}") for i in range(3)]
    values = sky.gather(*(wait_for(g, i) for i, g in enumerate(gates)), stream=True) >> pool
    for gate in reversed(gates):  # finish last-first; values still come first-first
        open(gate, "w").close()
    assert list(values) == [0, 1, 2]


def test_a_failed_call_raises_where_its_value_would_be_yielded(pool: sky.ComputePool) -> None:
    values = sky.gather(factorial(3), multiply("x", 1.5), factorial(4), stream=True) >> pool
    assert next(values) == 6
    with pytest.raises(TypeError, match="can't multiply"):
        next(values)


def test_gather_refuses_what_is_not_a_pending_call_and_names_the_jax_helper() -> None:
    with pytest.raises(TypeError, match=r"sky\.plugins\.jax_gather"):
        sky.gather([1, 2, 3])  # type: ignore[arg-type]


def test_a_streaming_gather_is_iterated_not_submitted(pool: sky.ComputePool) -> None:
    with pytest.raises(TypeError, match="iterate"):
        _ = sky.gather(factorial(2), stream=True) > pool


@pytest.mark.timeout(60)
def test_with_timeout_gives_one_call_its_own_timeout() -> None:
    import time

    call = square(3).with_timeout(0.5)
    assert call.timeout == 0.5 and square(3).timeout is None
    with sky.ComputePool(quiet=True) as pool:
        with pytest.raises(TimeoutError):
            sky.compute(time.sleep)(30).with_timeout(0.5) >> pool
        assert call >> pool == 9
    with pytest.raises(ValueError, match="positive"):
        square(1).with_timeout(0)
