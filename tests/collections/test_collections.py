"""Distributed collections, from skyward 0.5's distributed-collections guide and example,
on a local pool: ``sky.dict``, ``sky.counter``, ``sky.set``, ``sky.queue``, ``sky.barrier``,
``sky.lock``, served by the pool itself; and what happens to them when a worker is lost."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from support.pools import PoolFactory
from support.processes import shared_pool

import skyward as sky


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.ComputePool]:
    with shared_pool(nodes=4, concurrency=2) as pool:
        yield pool


def fresh(prefix: str) -> str:
    """A name no other test uses: collections live as long as the pool."""
    return f"{prefix}-{time.monotonic_ns()}"


# ── the guide's examples ─────────────────────────────────────────────────────────────────


@sky.compute
def process_with_cache(items: list[str], cache_name: str, progress_name: str) -> dict[str, int]:
    cache = sky.dict(cache_name)
    progress = sky.counter(progress_name)
    hits = misses = 0
    for item in sky.shard(items):
        if item in cache:
            hits += 1
        else:
            cache[item] = f"computed:{item}"
            misses += 1
        progress.increment()
    return {"hits": hits, "misses": misses}


def test_a_shared_cache_and_a_progress_counter(pool: sky.ComputePool) -> None:
    cache, progress = fresh("cache"), fresh("progress")
    items = [f"item_{i}" for i in range(100)]
    first = process_with_cache(items, cache, progress) @ pool
    assert sum(r["misses"] for r in first) == 100
    again = process_with_cache(items, cache, progress) @ pool
    assert sum(r["hits"] for r in again) == 100  # every node found the others' entries
    assert pool.counter(progress).value == 200
    assert pool.dict(cache)["item_7"] == "computed:item_7"
    assert len(pool.dict(cache)) == 100


def test_counter_updates_from_every_node_are_never_lost(pool: sky.ComputePool) -> None:
    name = fresh("steps")

    def bump() -> int:
        steps = sky.counter(name)
        for _ in range(100):
            steps.increment()
        return int(steps)

    pool.broadcast(bump)
    counter = pool.counter(name)
    assert counter.value == 400 and int(counter) == 400
    assert counter.decrement(10) == 390
    counter.reset(5)
    assert counter.value == 5


@sky.compute
def deduplicate(batch_id: int, name: str) -> str:
    seen = sky.set(name)
    key = f"batch:{batch_id}"
    if key in seen:
        return "skipped"
    seen.add(key)
    return "processed"


def test_a_set_deduplicates_across_nodes(pool: sky.ComputePool) -> None:
    name = fresh("seen")
    assert deduplicate(1, name) >> pool == "processed"
    assert deduplicate(1, name) >> pool == "skipped"
    assert len(pool.set(name)) == 1
    pool.set(name).discard("batch:1")
    assert "batch:1" not in pool.set(name)


@sky.compute
def producer(tasks: list[int], name: str) -> None:
    if sky.instance_info().is_head:
        queue = sky.queue(name)
        for task in tasks:
            queue.put(task)


@sky.compute
def worker(name: str) -> list[int]:
    queue = sky.queue(name)
    results = []
    while True:
        task = queue.get(timeout=0.5)
        if task is None:
            break
        results.append(task * 2)
    return results


def test_a_work_queue_hands_each_task_to_exactly_one_worker(pool: sky.ComputePool) -> None:
    name = fresh("work")
    producer(list(range(20)), name) @ pool
    assert len(pool.queue(name)) == 20 and not pool.queue(name).empty()
    done = worker(name) @ pool
    assert sorted(x for results in done for x in results) == [2 * t for t in range(20)]
    assert pool.queue(name).empty()


def test_a_queue_is_first_in_first_out_and_get_waits_for_a_put(pool: sky.ComputePool) -> None:
    name = fresh("fifo")
    getter = pool.submit(lambda: [sky.queue(name).get() for _ in range(3)])
    for item in ("a", "b", "c"):
        pool.queue(name).put(item)
    assert getter.result(timeout=30) == ["a", "b", "c"]
    assert pool.queue(name).get(timeout=0) is None


@sky.compute
def synchronized_epoch(epoch: int, name: str) -> int:
    info = sky.instance_info()
    arrived = sky.counter(f"{name}-{epoch}")
    sync = sky.barrier(name, n=info.total_nodes)
    arrived.increment()
    sync.wait()  # blocks until all n workers arrive
    return arrived.value  # everyone arrived before anyone went on


def test_a_barrier_lets_nobody_through_until_all_arrive_round_after_round(
    pool: sky.ComputePool,
) -> None:
    name = fresh("epoch")
    for epoch in range(3):
        assert synchronized_epoch(epoch, name) @ pool == [4, 4, 4, 4]


def test_a_lock_excludes_every_other_holder(pool: sky.ComputePool) -> None:
    name = fresh("checkpoint")

    def update(rounds: int) -> None:
        lock, state = sky.lock(name), sky.dict(name)
        for _ in range(rounds):
            with lock:
                state["inside"] = state.get("inside", 0) + 1
                assert state["inside"] == 1, "two holders at once"
                state["total"] = state.get("total", 0) + 1  # read-modify-write, safely
                state["inside"] -= 1

    # two broadcasts at once, from two client threads: two holders per node compete
    threads = [threading.Thread(target=pool.broadcast, args=(update, 10)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert pool.dict(name)["total"] == 80


# ── from the client, by name, and errors ─────────────────────────────────────────────────


def test_proxies_travel_by_name_and_the_client_uses_the_running_pool(
    pool: sky.ComputePool,
) -> None:
    name = fresh("passed")
    counter = pool.counter(name)
    pool.broadcast(lambda c: c.increment(), counter)  # made on the client, used on workers
    assert sky.counter(name).value == 4  # the one pool running here


def test_a_missing_key_is_a_key_error_on_the_worker(pool: sky.ComputePool) -> None:
    name = fresh("d")

    def read() -> object:
        d = sky.dict(name)
        d.update({"a": 1})
        assert d.pop("a") == 1 and d.pop("a", "gone") == "gone"
        return d["nope"]

    with pytest.raises(KeyError, match="nope"):
        pool.run(read)


class _Exits:
    """A value whose unpickling calls ``sys.exit``: user data may do anything."""

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return (sys.exit, (7,))


def test_a_value_whose_unpickling_exits_is_that_calls_error_and_no_reader_dies(
    pool: sky.ComputePool,
) -> None:
    # Once: SystemExit: 7 reached the >> caller; a > future never settled, and later
    # broadcasts hung with 3 of 4 reader threads alive.
    name = fresh("exits")

    def store() -> None:
        sky.dict(name)["k"] = _Exits()

    with pytest.raises(RuntimeError, match=r"SystemExit\(7\)"):
        pool.run(store)
    futures = [pool.submit(store) for _ in range(8)]  # every node's reader, and then some
    for future in futures:
        with pytest.raises(RuntimeError, match="shared collection"):
            future.result(timeout=30)
    assert pool.broadcast(os.getpid) is not None  # every reader thread still reads
    assert len(set(pool.broadcast(os.getpid))) == 4
    assert "k" not in pool.dict(name)  # nothing half stored


def test_outside_a_pool_the_collections_say_where_they_live() -> None:
    # a fresh interpreter: this module's pool is running here
    code = "import skyward as sky\nsky.counter('x').increment()"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "belong to a running pool" in run.stderr


def test_the_async_interface_of_skyward_0_5(pool: sky.ComputePool) -> None:
    name = fresh("async")

    def use_async() -> tuple[object, ...]:
        import asyncio

        async def main() -> tuple[object, ...]:
            cache, steps, seen = sky.dict(name), sky.counter(name), sky.set(name)
            queue, lock = sky.queue(name), sky.lock(name)
            await cache.set_async("k", 1)
            await steps.increment_async()
            await seen.add_async("x")
            await queue.put_async("item")
            await lock.acquire_async()
            await lock.release_async()
            return (
                await cache.get_async("k"),
                await steps.value_async(),
                await seen.contains_async("x"),
                await queue.get_async(timeout=1),
            )

        return asyncio.run(main())

    assert pool.run(use_async) == (1, 1, True, "item")
    with pytest.raises(AttributeError):
        pool.counter(name).no_such_thing  # noqa: B018


# ── worker loss ──────────────────────────────────────────────────────────────────────────


def wait_until(condition: object, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)
    assert condition(), f"still waiting for {what}"  # type: ignore[operator]


@pytest.mark.timeout(90)
def test_a_lost_worker_releases_its_locks_and_breaks_barriers_others_wait_at() -> None:
    with sky.ComputePool(nodes=2, quiet=True) as pool:

        def hold_then_die(name: str) -> None:
            sky.lock(name).acquire()
            sky.dict(name)["held"] = True
            sky.queue(name).get()  # waits until the test kills it
            os._exit(1)

        dying = pool.submit(hold_then_die, "l")
        wait_until(lambda: pool.dict("l").get("held"), "the lock to be taken")
        waiter = pool.submit(lambda: sky.barrier("b", 2).wait())  # the other node, alone
        # The barrier must hold the waiter before the holder dies: a barrier made after the
        # loss has lost no one, and rightly waits for the replaced node.
        wait_until(lambda: pool.barrier("b", 2).n_waiting == 1, "the other node to wait")
        taker = threading.Thread(target=lambda: pool.lock("l").acquire())
        taker.start()
        pool.queue("l").put("die")
        with pytest.raises(sky.WorkerLost):
            dying.result(timeout=30)
        taker.join(30)
        assert not taker.is_alive(), "the lock was not released when its holder was lost"
        with pytest.raises(threading.BrokenBarrierError, match="lost a participant"):
            waiter.result(timeout=30)


@pytest.mark.timeout(90)
def test_a_lost_worker_takes_no_queue_item_with_it() -> None:
    with sky.ComputePool(nodes=1, concurrency=2, quiet=True) as pool:

        def get_forever() -> object:
            sky.dict("q")["waiting"] = True
            return sky.queue("q").get()

        waiting = pool.submit(get_forever)
        wait_until(lambda: pool.dict("q").get("waiting"), "the get to wait")
        with pytest.raises(sky.WorkerLost):  # its worker dies, of another call
            pool.run(os._exit, 1)
        with pytest.raises(sky.WorkerLost):
            waiting.result(timeout=30)
        pool.queue("q").put("item")
        assert pool.queue("q").get(timeout=5) == "item"


@pytest.mark.timeout(60)
def test_process_executor_calls_are_told_collections_are_not_there_yet() -> None:
    worker = sky.Worker(executor="process")
    with sky.ComputePool(worker=worker, quiet=True) as pool:
        with pytest.raises(RuntimeError, match="not available in executor='process'"):
            pool.run(lambda: sky.counter("c").increment())


@pytest.mark.timeout(120)
def test_collections_work_over_every_transport(make_pool: PoolFactory) -> None:
    def bump_and_wait() -> int:
        sky.counter("hits").increment()
        sky.barrier("all", 2).wait()
        return sky.counter("hits").value

    with make_pool(nodes=2) as pool:
        assert pool.broadcast(bump_and_wait) == [2, 2]
