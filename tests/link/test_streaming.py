"""Streaming, as skyward 0.5's streaming guide describes it: a generator function's values
come back one at a time as the worker yields them; an ``Iterator`` argument goes to the
worker element by element; both at once. Plus what the guide promises around them:
back-pressure, exceptions where you iterate, cancellation when you stop or close the pool."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.pools import PoolFactory
from support.processes import shared_pool

import skyward as sky
from skyward.link.protocol import STREAM_WINDOW


@sky.compute
def fibonacci(n: int):  # type: ignore[no-untyped-def]  # as the guide writes it
    """Output streaming: yields Fibonacci numbers one at a time."""
    a, b = 0, 1
    for _ in range(n):
        yield a
        a, b = b, a + b


@sky.compute
def running_mean(data: Iterator[float]) -> list[float]:
    """Input streaming: consumes an iterator of floats incrementally."""
    total = 0.0
    means = []
    for i, x in enumerate(data, 1):
        total += x
        means.append(total / i)
    return means


@sky.compute
def moving_average(data: Iterator[float], window: int = 3):  # type: ignore[no-untyped-def]
    """Bidirectional: streams data in, yields moving averages out."""
    from collections import deque

    buf: deque[float] = deque(maxlen=window)
    for x in data:
        buf.append(x)
        yield sum(buf) / len(buf)


def wait_until(condition: object, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)
    assert condition(), f"still waiting for {what}"  # type: ignore[operator]


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.ComputePool]:
    with shared_pool(nodes=2, concurrency=2) as pool:
        yield pool


# ── the guide's three patterns, locally and over SSH ─────────────────────────────────────


@pytest.mark.timeout(120)
def test_the_guides_three_patterns(make_pool: PoolFactory) -> None:
    with make_pool(nodes=1) as pool:
        assert list(fibonacci(10) >> pool) == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]
        means = running_mean(iter([1.0, 2.0, 3.0, 4.0, 5.0])) >> pool
        assert means == [1.0, 1.5, 2.0, 2.5, 3.0]
        averages = moving_average(iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), window=3) >> pool
        assert list(averages) == [1.0, 1.5, 2.0, 3.0, 4.0, 5.0]


# ── output streaming ─────────────────────────────────────────────────────────────────────


def test_rshift_returns_an_iterator_and_values_arrive_before_the_generator_ends(
    pool: sky.ComputePool, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"

    @sky.compute
    def first_then_wait(path: str) -> Iterator[str]:
        yield "first"
        while not os.path.exists(path):
            time.sleep(0.01)
        yield "second"

    values = first_then_wait(str(gate)) >> pool
    assert next(values) == "first"  # the generator is still waiting for the gate
    gate.touch()
    assert list(values) == ["second"]


def test_an_exception_is_raised_where_the_values_stop(pool: sky.ComputePool) -> None:
    @sky.compute
    def two_then_fail() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("bad batch")

    seen = []
    with pytest.raises(ValueError, match="bad batch"):
        for value in two_then_fail() >> pool:
            seen.append(value)
    assert seen == [1, 2]


class _Exits:
    def __reduce__(self) -> tuple[object, tuple[int]]:
        return (sys.exit, (7,))


def test_a_streamed_value_whose_unpickling_exits_is_an_error_where_you_iterate(
    pool: sky.ComputePool,
) -> None:
    # A remote value must never end the client's program (README): not even one whose
    # unpickling calls sys.exit.
    @sky.compute
    def one_then_exit() -> Iterator[object]:
        yield 1
        yield _Exits()

    seen = []
    with pytest.raises(sky.RemoteError, match="SystemExit"):
        for value in one_then_exit() >> pool:
            seen.append(value)
    assert seen == [1]
    assert pool.run(os.getpid) > 0  # the pool still serves


def test_a_slow_consumer_holds_the_worker_back(pool: sky.ComputePool, tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("0")

    @sky.compute
    def endless(path: str, bound: int) -> Iterator[int]:
        produced = 0
        while True:
            behind = produced - int(Path(path).read_text())
            if behind > bound:
                raise AssertionError(f"{behind} values ahead of the consumer")
            produced += 1
            yield produced

    # The consumer notes what it took after taking it, so the producer may see it a few
    # values late; without back-pressure it would be thousands ahead at once.
    values = endless(str(taken), 2 * STREAM_WINDOW + 2) >> pool
    for count, value in enumerate(values, 1):
        assert value == count
        (tmp_path / "next").write_text(str(count))
        os.replace(tmp_path / "next", taken)  # whole: the producer never reads it half-written
        if count == 200:
            break


def test_leaving_the_loop_closes_the_generator_and_frees_the_worker(
    pool: sky.ComputePool, tmp_path: Path
) -> None:
    closed = tmp_path / "closed"

    @sky.compute
    def endless(path: str) -> Iterator[int]:
        try:
            n = 0
            while True:
                n += 1
                yield n
        finally:
            open(path, "w").close()

    for value in endless(str(closed)) >> pool:
        if value == 3:
            break
    wait_until(closed.exists, "the generator's finally block")
    wait_until(lambda: sum(pool.statistics().in_flight) == 0, "the worker to be free")


def test_close_on_the_stream_cancels_it(pool: sky.ComputePool, tmp_path: Path) -> None:
    closed = tmp_path / "closed"

    @sky.compute
    def endless(path: str) -> Iterator[int]:
        try:
            while True:
                yield 1
        finally:
            open(path, "w").close()

    with endless(str(closed)) >> pool as values:
        assert next(values) == 1
    wait_until(closed.exists, "the generator's finally block")
    with pytest.raises(sky.PoolClosed, match="was closed"):
        next(values)


@pytest.mark.timeout(60)
def test_closing_the_pool_ends_open_streams(tmp_path: Path) -> None:
    closed = tmp_path / "closed"

    @sky.compute
    def endless(path: str) -> Iterator[int]:
        try:
            while True:
                yield 1
        finally:
            open(path, "w").close()

    with sky.ComputePool(quiet=True) as pool:
        values = endless(str(closed)) >> pool
        assert next(values) == 1
    # the with block did not wait for a stream nobody was reading
    assert closed.exists()
    with pytest.raises(sky.PoolClosed):
        next(values)


def test_prints_before_a_yield_arrive_before_its_value(
    pool: sky.ComputePool, capsys: pytest.CaptureFixture[str]
) -> None:
    @sky.compute
    def chatty() -> Iterator[int]:
        for i in range(3):
            print(f"making {i}")
            yield i

    seen = ""
    for value in chatty() >> pool:
        seen += capsys.readouterr().out  # the worker may have printed further ahead already
        assert f"making {value}" in seen


def test_a_future_of_a_streaming_call_holds_its_stream(pool: sky.ComputePool) -> None:
    future = fibonacci(5) > pool
    assert list(future.result(timeout=30)) == [0, 1, 1, 2, 3]


def test_a_broadcast_of_a_generator_is_refused_for_now(pool: sky.ComputePool) -> None:
    with pytest.raises(TypeError, match="send it to one node with >>"):
        fibonacci(3) @ pool


# ── input streaming ──────────────────────────────────────────────────────────────────────


def test_an_iterator_annotated_parameter_streams_any_iterable(pool: sky.ComputePool) -> None:
    @sky.compute
    def kind(data: Iterator[int]) -> tuple[str, int]:
        return type(data).__name__, sum(data)

    name, total = kind([1, 2, 3]) >> pool  # a list, given to an Iterator parameter
    assert total == 6 and name != "list"


def test_an_iterator_argument_streams_without_annotation(pool: sky.ComputePool) -> None:
    def total(values):  # type: ignore[no-untyped-def]
        return sum(values)

    assert pool.run(total, (x * x for x in range(100))) == sum(x * x for x in range(100))

    def total_kw(*, data):  # type: ignore[no-untyped-def]
        return sum(data)

    assert pool.run(total_kw, data=iter(range(10))) == 45


def test_elements_are_pulled_only_as_the_function_takes_them(pool: sky.ComputePool) -> None:
    pulled = []

    def source() -> Iterator[int]:
        for i in range(10_000):
            pulled.append(i)
            yield i

    @sky.compute
    def first_three(data: Iterator[int]) -> list[int]:
        return [next(data) for _ in range(3)]

    assert first_three(source()) >> pool == [0, 1, 2]
    assert len(pulled) <= 3 + STREAM_WINDOW


def test_an_error_in_the_clients_iterator_is_raised_in_the_function(
    pool: sky.ComputePool,
) -> None:
    def source() -> Iterator[int]:
        yield 1
        raise KeyError("row 2 is missing")

    @sky.compute
    def consume(data: Iterator[int]) -> str:
        try:
            return str(list(data))
        except KeyError as error:
            return f"caught {error}"

    assert consume(source()) >> pool == "caught 'row 2 is missing'"


def test_bidirectional_streams_run_in_lockstep(pool: sky.ComputePool) -> None:
    pulled = []

    def source() -> Iterator[float]:
        for i in range(1, 1000):
            pulled.append(i)
            yield float(i)

    averages = moving_average(source(), window=2) >> pool
    assert [next(averages) for _ in range(3)] == [1.0, 1.5, 2.5]
    averages.close()
    # each side runs at most a window ahead: the worker's values, the client's elements
    assert len(pulled) <= 3 + 2 * STREAM_WINDOW + 2
