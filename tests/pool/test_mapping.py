"""``pool.map`` with chunks, ``pool.imap`` and ``pool.imap_unordered``: the same results as a
list comprehension in every mode, lazily read inputs, failures in input order, cancellation
when the caller stops, and the automatic chunk size's rules (``skyward.pool.mapping``)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

import skyward as sky
from skyward.pool.mapping import BALANCE, MAX_CHUNK, ChunkSize


def square(x: int) -> int:
    return x * x


def pid_of(_: object) -> int:
    return os.getpid()


def fail_on_37(x: int) -> int:
    if x == 37:
        raise ValueError(f"item {x} is bad")
    return x


@pytest.fixture
def pool() -> Iterator[sky.ComputePool]:
    with sky.ComputePool(nodes=2, quiet=True) as opened:
        yield opened


@pytest.mark.parametrize("chunksize", [None, 1, 7, 1000])
def test_map_returns_results_in_input_order_whatever_the_chunk_size(
    pool: sky.ComputePool, chunksize: int | None
) -> None:
    assert pool.map(square, range(500), chunksize=chunksize) == [x * x for x in range(500)]


def test_map_unordered_returns_every_result_once(pool: sky.ComputePool) -> None:
    got = pool.map(square, range(300), chunksize=4, ordered=False)
    assert sorted(got) == [x * x for x in range(300)]


def test_chunks_spread_over_every_node(pool: sky.ComputePool) -> None:
    assert len(set(pool.map(pid_of, range(400), chunksize=5))) == 2


def test_imap_reads_an_endless_iterable_only_as_far_as_it_needs(pool: sky.ComputePool) -> None:
    read: list[int] = []

    def counted() -> Iterator[int]:
        for i in itertools.count():
            read.append(i)
            yield i

    results = pool.imap(square, counted(), chunksize=2)
    assert list(itertools.islice(results, 5)) == [0, 1, 4, 9, 16]
    results.close()  # type: ignore[attr-defined]
    # A bounded window beyond what was consumed: 2 nodes x 10 chunks of 2 items (and the
    # chunk being read), not a whole endless input.
    assert len(read) <= 5 + 2 * 10 * 2 + 2


def test_imap_unordered_yields_every_result_of_a_generator(pool: sky.ComputePool) -> None:
    got = list(pool.imap_unordered(square, (x for x in range(200))))
    assert sorted(got) == [x * x for x in range(200)]


@pytest.mark.parametrize("chunksize", [None, 1, 10])
def test_the_first_failure_in_input_order_is_raised_as_itself(
    pool: sky.ComputePool, chunksize: int | None
) -> None:
    with pytest.raises(ValueError, match="item 37 is bad"):
        pool.map(fail_on_37, range(100), chunksize=chunksize)
    assert pool.map(square, [3]) == [9]  # the pool goes on


def test_imap_yields_the_results_before_a_failure(pool: sky.ComputePool) -> None:
    got: list[int] = []
    with pytest.raises(ValueError, match="item 37 is bad"):
        for value in pool.imap(fail_on_37, range(100), chunksize=1):
            got.append(value)
    assert got == list(range(37))


def test_an_empty_map_is_an_empty_list(pool: sky.ComputePool) -> None:
    assert pool.map(square, []) == []
    assert list(pool.imap_unordered(square, iter(()))) == []


@pytest.mark.parametrize(
    ("chunksize", "error"), [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)]
)
def test_a_bad_chunksize_is_refused_before_anything_is_sent(
    pool: sky.ComputePool, chunksize: object, error: type[Exception]
) -> None:
    before = pool.statistics().submitted
    with pytest.raises(error, match="chunksize"):
        pool.imap(square, range(10), chunksize=chunksize)  # type: ignore[arg-type]
    assert pool.statistics().submitted == before


def test_the_automatic_size_probes_with_single_items_then_aims_at_the_target() -> None:
    size = ChunkSize(None, slots=2, total=None)
    size.started(0.0)
    assert [size.next(), size.next()] == [1, 1]  # one probe per slot
    size.finished(2, 0.001)  # two items in 1 ms on 2 slots: 1 ms of a slot each
    assert size.next() == 20  # about 20 ms of items
    size.finished(40, 0.005)  # 0.2 ms each, once the round trips are shared
    assert 20 < size.next() <= MAX_CHUNK
    for step in range(20):
        size.finished(10_000, 0.006 + step * 0.001)  # a microsecond of a slot each
    assert size.next() == MAX_CHUNK


def test_waiting_behind_other_chunks_does_not_count_as_an_items_cost() -> None:
    # Many one-item chunks in flight: each waited long after it was sent, but results
    # arrive every 0.1 ms, and that is what an item costs the pool.
    size = ChunkSize(None, slots=2, total=None)
    size.started(0.0)
    size.next(), size.next()
    for step in range(1, 50):
        size.finished(1, step * 0.0001)
    assert size.next() >= 50


def test_the_automatic_size_keeps_every_slot_busy_to_the_end_of_a_known_length() -> None:
    size = ChunkSize(None, slots=4, total=1000)
    size.started(0.0)
    size.next(), size.next(), size.next(), size.next()
    size.finished(4, 1e-6)
    assert size.next() == -(-1000 // (4 * BALANCE))  # 63: at least BALANCE chunks per slot


def test_a_fixed_size_is_kept() -> None:
    size = ChunkSize(50, slots=2, total=10)
    size.started(0.0)
    size.finished(50, 10.0)
    assert size.next() == 50
