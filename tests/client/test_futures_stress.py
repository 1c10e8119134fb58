"""A call's future keeps ``concurrent.futures.Future``'s whole contract, under load.

``CallFuture`` sets ``Future``'s fields itself and makes its condition only when the
standard library asks for it; these tests hold it to what a plain ``Future`` does
(``wait``, ``as_completed``, callbacks, ``cancel``, ``repr``, ``exception``), alone and on
real local pools, with many threads at once. They also check that the function cache (by
``id``) never hands a new function an old one's pickle, and that a call's output, C-level
writes included, arrives before its result when a worker runs several calls at once.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import pickle
import random
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    CancelledError,
    Future,
    InvalidStateError,
    ThreadPoolExecutor,
    as_completed,
    wait,
)
from typing import Any

import pytest

import skyward as sky
from skyward.client.futures import CallFuture, deliver
from skyward.link.pickling import dumps_function

FUTURES = [Future, CallFuture]


# ── one future at a time, against a plain Future ────────────────────────────────────────


@pytest.mark.parametrize("kind", FUTURES)
def test_a_future_reports_every_state_in_repr(kind: type[Future[Any]]) -> None:
    pending, running, done, failed, cancelled = (kind() for _ in range(5))
    assert "state=pending" in repr(pending)
    assert running.set_running_or_notify_cancel()
    assert "state=running" in repr(running)
    done.set_result(42)
    assert "state=finished returned int" in repr(done)
    failed.set_exception(ValueError("no"))
    assert "state=finished raised ValueError" in repr(failed)
    assert cancelled.cancel()
    assert "state=cancelled" in repr(cancelled)


@pytest.mark.parametrize("kind", FUTURES)
def test_callbacks_run_once_each_before_and_after_settling_even_past_a_raising_one(
    kind: type[Future[Any]], caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []

    def boom(_: Future[Any]) -> None:
        seen.append("boom")
        raise RuntimeError("callback failed")

    future = kind()
    future.add_done_callback(lambda f: seen.append(f"before {f.result()}"))
    future.add_done_callback(boom)
    future.add_done_callback(lambda f: seen.append("after boom"))
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        future.set_result(7)
        future.add_done_callback(lambda f: seen.append(f"late {f.result()}"))
        future.add_done_callback(boom)
    assert seen == ["before 7", "boom", "after boom", "late 7", "boom"]
    failures = [r for r in caplog.records if r.exc_info and "callback failed" in str(r.exc_info[1])]
    assert len(failures) == 2  # logged, as Future does, not raised


@pytest.mark.parametrize("kind", FUTURES)
def test_exception_and_result_with_a_timeout_then_settled(kind: type[Future[Any]]) -> None:
    future = kind()
    with pytest.raises(TimeoutError):
        future.exception(timeout=0.01)
    with pytest.raises(TimeoutError):
        future.result(timeout=0)
    error = KeyError("k")
    threading.Timer(0.05, future.set_exception, (error,)).start()
    assert future.exception(timeout=30) is error
    with pytest.raises(KeyError):
        future.result(timeout=0)
    with pytest.raises(InvalidStateError):
        future.set_result(1)


@pytest.mark.parametrize("kind", FUTURES)
def test_a_cancelled_future_is_done_for_wait_once_notified(kind: type[Future[Any]]) -> None:
    future = kind()
    assert future.cancel() and future.cancel()
    with pytest.raises(CancelledError):
        future.result(timeout=0)
    with pytest.raises(CancelledError):
        future.exception(timeout=0)
    with pytest.raises(InvalidStateError):
        future.set_result(1)
    assert not future.set_running_or_notify_cancel()
    done, not_done = wait([future], timeout=5)
    assert done == {future} and not not_done
    running = kind()
    assert running.set_running_or_notify_cancel()
    assert not running.cancel()
    with pytest.raises(RuntimeError):
        running.set_running_or_notify_cancel()


def test_deliver_ignores_a_cancelled_future_and_wakes_waiters_of_a_live_one() -> None:
    cancelled: CallFuture[int] = CallFuture()
    cancelled.cancel()
    deliver(cancelled, 1)  # a result arriving after a cancel: dropped, no error
    assert cancelled.cancelled()
    live: CallFuture[int] = CallFuture()
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(live.result()))
    waiter.start()
    deliver(live, 5)
    waiter.join(30)
    assert got == [5]


@pytest.mark.parametrize("settle", ["set_result", "deliver"])
def test_waiters_wake_even_when_a_done_callback_raises_a_base_exception(settle: str) -> None:
    future: CallFuture[int] = CallFuture()
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(future.result()), daemon=True)
    waiter.start()
    while not future._sleepers:  # the waiter is asleep on the future (no timing involved)
        threading.Event().wait(0.001)

    def leave(_: Future[Any]) -> None:
        raise SystemExit("a callback that exits")  # not an Exception: Future lets it through

    future.add_done_callback(leave)
    with pytest.raises(SystemExit):
        future.set_result(3) if settle == "set_result" else deliver(future, 3)
    waiter.join(10)  # woken at once, or never: only a failure waits this long
    assert got == [3], "a waiter slept on past the result"


def _settle_later(futures: list[Future[Any]], seed: int) -> threading.Thread:
    order = list(futures)
    random.Random(seed).shuffle(order)

    def run() -> None:
        for i, future in enumerate(order):
            if i % 7 == 3:
                if not future.cancel():
                    future.set_result(i)
                else:
                    future.set_running_or_notify_cancel()
            elif i % 5 == 1:
                future.set_exception(ValueError(str(i)))
            elif isinstance(future, CallFuture) and i % 2:
                deliver(future, i)
            else:
                future.set_result(i)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("seed", range(20))
def test_wait_and_as_completed_over_many_mixed_futures_see_every_one(seed: int) -> None:
    futures: list[Future[Any]] = [CallFuture() if i % 2 else Future() for i in range(200)]
    consumer_seen: list[set[Future[Any]]] = []

    def consume() -> None:
        consumer_seen.append(set(as_completed(futures, timeout=60)))

    consumer = threading.Thread(target=consume)
    consumer.start()
    first_done, _ = (
        wait(futures, timeout=0, return_when=FIRST_COMPLETED) if seed % 2 else (set(), None)
    )
    assert not first_done
    settler = _settle_later(futures, seed)
    done, not_done = wait(futures, return_when=FIRST_COMPLETED, timeout=60)
    assert done and all(f.done() for f in done)
    done, not_done = wait(futures, return_when=ALL_COMPLETED, timeout=60)
    settler.join(60)
    consumer.join(60)
    assert done == set(futures) and not not_done
    assert consumer_seen == [set(futures)]
    for future in futures:  # a CallFuture's state and a Future's agree on every outcome
        assert future.done()
        if future.cancelled():
            with pytest.raises(CancelledError):
                future.result()
        elif future.exception() is not None:
            with pytest.raises(ValueError):
                future.result()
        else:
            assert isinstance(future.result(), int)


def test_many_threads_cancel_settle_and_wait_on_the_same_futures() -> None:
    futures: list[CallFuture[int]] = [CallFuture() for _ in range(300)]
    for future in futures[::3]:
        future.set_running_or_notify_cancel()
    callbacks: list[Future[Any]] = []
    lock = threading.Lock()

    def record(f: Future[Any]) -> None:
        with lock:
            callbacks.append(f)

    for future in futures:
        future.add_done_callback(record)
    barrier = threading.Barrier(4)

    def cancel_all() -> list[bool]:
        barrier.wait()
        return [f.cancel() for f in futures]

    def settle_all() -> None:
        barrier.wait()
        for i, future in enumerate(futures):
            deliver(future, i)

    def read_all() -> list[str]:
        barrier.wait()
        out = []
        for future in futures:
            try:
                out.append(str(future.result(timeout=60)))
            except CancelledError:
                out.append("cancelled")
            repr(future)
        return out

    with ThreadPoolExecutor(4) as threads:
        cancels = threads.submit(cancel_all)
        settles = threads.submit(settle_all)
        reads = [threads.submit(read_all) for _ in range(2)]
        settles.result(60)
        cancelled = cancels.result(60)
        seen = [r.result(60) for r in reads]
    for i, future in enumerate(futures):
        assert cancelled[i] == future.cancelled()
        expected = "cancelled" if future.cancelled() else str(i)
        assert seen[0][i] == seen[1][i] == expected
        assert i % 3 or not future.cancelled()  # a running call cannot be cancelled
    assert sorted(map(id, callbacks)) == sorted(map(id, futures))  # each exactly once


# ── on real local pools ──────────────────────────────────────────────────────────────────


def _square(x: int) -> int:
    return x * x


def _slow_square(x: int) -> int:
    import time

    time.sleep(0.002 * (x % 5))
    return x * x


@pytest.mark.timeout(120)
def test_pool_futures_keep_the_future_contract_under_load() -> None:
    with sky.ComputePool(concurrency=4, quiet=True) as pool:
        futures = [pool.submit(_slow_square, i) for i in range(120)]
        plain: list[Future[int]] = [Future() for _ in range(10)]
        with_plain: list[Future[int]] = [*futures, *plain]
        done, not_done = wait(with_plain, timeout=0.001, return_when=ALL_COMPLETED)
        assert not_done  # the plain ones are not settled
        assert not done - set(futures)
        done, _ = wait(futures, return_when=FIRST_COMPLETED, timeout=60)
        assert done
        late: list[int] = []
        for future in futures:
            repr(future)
            future.add_done_callback(lambda f: late.append(f.result()))
        for i, future in enumerate(plain):
            threading.Timer(0.01 * i, future.set_result, (-i,)).start()
        got = {f.result() for f in as_completed(with_plain, timeout=60)}
        assert got == {i * i for i in range(120)} | {-i for i in range(10)}
        done, not_done = wait(with_plain, timeout=60)
        assert not not_done
        assert sorted(late) == sorted(i * i for i in range(120))
        for future in futures:
            assert future.exception(timeout=0) is None and "finished" in repr(future)
            now: list[Future[int]] = []
            future.add_done_callback(now.append)
            assert now == [future]  # added after: run at once, on this thread
        # an error's future
        failing = pool.submit(_square, "x")
        assert isinstance(failing.exception(timeout=60), TypeError)


def _nap_and_return(x: int) -> int:
    import time

    time.sleep(0.01)
    return x


@pytest.mark.timeout(120)
def test_calls_from_many_threads_while_others_cancel_get_their_own_results() -> None:
    with sky.ComputePool(concurrency=2, quiet=True) as pool:
        errors: list[BaseException] = []
        submitted: list[tuple[int, Future[int]]] = []
        lock = threading.Lock()
        stop = threading.Event()

        def caller(base: int) -> None:
            try:
                for i in range(base, base + 40):
                    assert (sky.compute(_square)(i) >> pool) == i * i
                    future = pool.submit(_nap_and_return, i)
                    with lock:
                        submitted.append((i, future))
            except BaseException as exc:
                errors.append(exc)

        def canceller() -> None:
            rng = random.Random(1)
            while not stop.is_set():
                with lock:
                    chosen = rng.sample(submitted, min(5, len(submitted)))
                for _, future in chosen:
                    future.cancel()
                stop.wait(0.001)

        cancellers = [threading.Thread(target=canceller) for _ in range(2)]
        callers = [threading.Thread(target=caller, args=(k * 1000,)) for k in range(4)]
        for thread in [*cancellers, *callers]:
            thread.start()
        for thread in callers:
            thread.join(90)
        stop.set()
        for thread in cancellers:
            thread.join(30)
        assert not errors
        assert len(submitted) == 160
        cancelled = 0
        for i, future in submitted:
            try:
                assert future.result(timeout=60) == i
            except CancelledError:
                cancelled += 1
                assert future.cancelled()
        _, not_done = wait([f for _, f in submitted], timeout=60)
        assert not not_done
        assert (sky.compute(_square)(9) >> pool) == 81  # the pool still serves
        assert pool.map(_square, range(50)) == [i * i for i in range(50)]


# ── the function cache, by id ────────────────────────────────────────────────────────────


def _script(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(source, namespace)
    return namespace


def test_the_function_cache_does_not_keep_a_function_alive() -> None:
    ns = _script("def make(big):\n    return lambda: len(big)\n")
    fn = ns["make"]("x" * 10_000)  # a closure over something sizeable, cached (immutable)
    assert dumps_function(fn) is dumps_function(fn)
    gone = weakref.ref(fn)
    del fn
    gc.collect()
    assert gone() is None, "the cache keeps every function it pickled (and its closure) alive"


def test_a_recursive_closure_is_not_kept_alive_by_the_cache() -> None:
    ns = _script(
        "def make(k):\n"
        "    def rec(n):\n        return k if n == 0 else rec(n - 1)\n"
        "    return rec\n"
    )
    gone = []
    for i in range(20):
        fn = ns["make"](i)
        assert pickle.loads(dumps_function(fn))(3) == i
        gone.append(weakref.ref(fn))
        del fn
    gc.collect()
    assert not [ref for ref in gone if ref() is not None]


def test_a_new_function_at_a_dead_functions_id_never_gets_its_pickle() -> None:
    ns = _script("def make(i):\n    return lambda: i\n")
    reused = 0
    seen_ids: set[int] = set()
    for i in range(3000):
        fn = ns["make"](i) if i % 2 else eval(f"lambda: {i}", ns)
        if id(fn) in seen_ids:
            reused += 1
        seen_ids.add(id(fn))
        assert pickle.loads(dumps_function(fn))() == i
        del fn
        if i % 97 == 0:
            gc.collect()
    assert reused  # the point of the test: ids were reused


def test_partials_methods_and_redefined_functions_are_pickled_afresh() -> None:
    ns = _script(
        "class K:\n    def __init__(self, v): self.v = v\n    def get(self): return self.v\n"
    )
    for i in range(200):
        method = ns["K"](i).get
        assert pickle.loads(dumps_function(method))() == i
        part = functools.partial(lambda a, b: a + b, i)
        assert pickle.loads(dumps_function(part))(1) == i + 1
        exec(f"def f():\n    return {i}\n", ns)  # a notebook cell run again, changed
        assert pickle.loads(dumps_function(ns["f"]))() == i
    f = ns["f"]
    f.__code__ = (lambda: "new code").__code__
    assert pickle.loads(dumps_function(f))() == "new code"
    g = eval("lambda x=1: x", ns)
    assert pickle.loads(dumps_function(g))() == 1
    g.__defaults__ = (2,)
    assert pickle.loads(dumps_function(g))() == 2


@pytest.mark.timeout(120)
def test_every_call_runs_its_own_function_while_functions_come_and_go() -> None:
    ns = _script("def make(i):\n    return lambda: i\n")
    with sky.ComputePool(quiet=True) as pool:
        for i in range(300):
            fn: Callable[[], int] = ns["make"](i) if i % 2 else eval(f"lambda: {i}", ns)
            assert (sky.compute(fn)() >> pool) == i
            del fn
            if i % 50 == 0:
                gc.collect()
        futures = [pool.submit(eval(f"lambda: {i}", ns)) for i in range(200)]
        assert [f.result(timeout=60) for f in futures] == list(range(200))

        def caller(base: int) -> list[tuple[int, int]]:  # threads make and drop functions
            got = []
            for i in range(base, base + 100):
                fn = ns["make"](i) if i % 3 else eval(f"lambda: {i}", ns)
                got.append((i, sky.compute(fn)() >> pool))
                del fn
                if i % 25 == 0:
                    gc.collect()
            return got

        with ThreadPoolExecutor(4) as threads:
            results = [r for got in threads.map(caller, range(0, 4000, 1000)) for r in got]
        assert all(i == value for i, value in results) and len(results) == 400


# ── output before the result, several calls at once ──────────────────────────────────────


def _loud(i: int) -> int:
    import ctypes
    import sys

    for line in range(3):
        os.write(1, f"c-{i}-{line}\n".encode())
        print(f"py-{i}-{line}")
    ctypes.CDLL(None).printf(f"printf-{i}\n".encode())
    sys.stdout.flush()
    return i


@pytest.mark.timeout(120)
def test_each_calls_output_arrives_before_its_result_with_several_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sky.ComputePool(worker=sky.Worker(concurrency=4), quiet=True) as pool:
        seen = ""
        missing: list[str] = []
        lock = threading.Lock()

        def check(i: int) -> None:
            nonlocal seen
            assert (sky.compute(_loud)(i) >> pool) == i
            with lock:
                seen += capsys.readouterr().out
                wanted = [f"c-{i}-{n}" for n in range(3)] + [f"py-{i}-{n}" for n in range(3)]
                missing.extend(w for w in [*wanted, f"printf-{i}"] if w not in seen)

        with ThreadPoolExecutor(6) as threads:
            list(threads.map(check, range(120)))
        for future in as_completed([pool.submit(_loud, i) for i in range(200, 240)]):
            i = future.result()
            seen += capsys.readouterr().out
            missing.extend(w for w in [f"c-{i}-2", f"py-{i}-2", f"printf-{i}"] if w not in seen)
        assert not missing


def _wait_for_file(path: str) -> str:
    import time

    while not os.path.exists(path):
        time.sleep(0.005)
    return path


@pytest.mark.timeout(120)
def test_a_callback_that_waits_for_a_pending_call_is_refused_not_deadlocked(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    gate = str(tmp_path / "gate")
    with sky.ComputePool(concurrency=2, quiet=True) as pool:
        blocked = pool.submit(_wait_for_file, gate)
        with pytest.raises(TimeoutError):
            blocked.exception(timeout=0.05)
        assert blocked.running() and "state=running" in repr(blocked)
        refused: list[BaseException] = []

        def wait_inside(_: Future[Any]) -> None:
            try:
                blocked.result()
            except RuntimeError as exc:
                refused.append(exc)

        for i in range(20):  # delivered by the reader, or by this thread reading for >>
            pool.submit(_square, i).add_done_callback(wait_inside)
            assert (sky.compute(_square)(i) >> pool) == i * i
        done, _ = wait([blocked], timeout=0)
        assert not done
        open(gate, "w").close()
        assert blocked.result(timeout=60) == gate
        assert blocked.exception(timeout=0) is None
        wait([blocked], timeout=60)
        assert len(refused) == 20 and all("deadlock" in str(e) for e in refused)


@pytest.mark.timeout(120)
def test_a_callback_raising_system_exit_on_the_reader_thread_leaves_the_pool_working(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Future lets a callback's SystemExit through to whoever settles it; here that is the
    channel's reader thread, which must log it and read on, not end and strand every later
    call of the worker."""
    gate = str(tmp_path / "gate")
    on: list[str] = []

    def leave(_: Future[Any]) -> None:
        on.append(threading.current_thread().name)
        raise SystemExit("a callback that exits")

    with sky.ComputePool(quiet=True) as pool:
        pending = pool.submit(_wait_for_file, gate)
        pending.add_done_callback(leave)  # before the result: the reader runs it
        open(gate, "w").close()
        done, _ = wait([pending], timeout=60)  # the standard library's wait reads nothing
        assert done == {pending} and pending.result() == gate
        assert on and on[0] != threading.main_thread().name
        later = [pool.submit(_square, i) for i in range(3)]
        done, _ = wait(later, timeout=30)  # only the reader thread can settle these
        assert done == set(later) and [f.result() for f in later] == [0, 1, 4]
    assert "a done-callback raised past Future" in caplog.text


@pytest.mark.timeout(120)
def test_asyncio_awaits_pool_futures_alongside_plain_ones() -> None:
    import asyncio

    async def gather(pool: sky.ComputePool) -> list[int]:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(2) as threads:
            plain = [loop.run_in_executor(threads, _square, -i) for i in range(10)]
            ours = [asyncio.wrap_future(pool.submit(_square, i)) for i in range(60)]
            return list(await asyncio.gather(*ours, *plain))

    with sky.ComputePool(concurrency=3, quiet=True) as pool:
        got = asyncio.run(gather(pool))
    assert got == [i * i for i in range(60)] + [i * i for i in range(10)]


def _queued_and_cancelled(pool: sky.ComputePool, gate: str) -> tuple[Future[str], Future[int]]:
    blocker = pool.submit(_wait_for_file, gate)  # the only slot is busy with this one
    queued = pool.submit(_square, 3)
    assert queued.cancel(), "the second call must still be queued"
    return blocker, queued


@pytest.mark.timeout(120)
def test_a_call_cancelled_while_queued_is_done_for_wait_after_statistics(tmp_path: Any) -> None:
    gate = str(tmp_path / "gate")
    with sky.ComputePool(concurrency=1, quiet=True) as pool:
        blocker, queued = _queued_and_cancelled(pool, gate)
        pool.statistics()  # drops cancelled calls from the queue
        open(gate, "w").close()
        assert blocker.result(timeout=60) == gate
        assert pool.run(_square, 4) == 16  # the queue has moved past the cancelled call
        done, not_done = wait([queued], timeout=0)
        assert done == {queued} and not not_done, "wait() would block for good"
        assert [f for f in as_completed([queued], timeout=60)] == [queued]


@pytest.mark.timeout(120)
def test_a_call_cancelled_while_queued_is_done_for_wait_after_a_close(tmp_path: Any) -> None:
    gate = str(tmp_path / "gate")
    pool = sky.ComputePool(concurrency=1, quiet=True).start()
    try:
        blocker, queued = _queued_and_cancelled(pool, gate)
    finally:
        pool.close(wait=False)  # fails what has not started; the cancelled one stays so
    assert blocker.done()
    assert queued.cancelled()
    done, not_done = wait([queued, blocker], timeout=0)
    assert done == {queued, blocker} and not not_done, "wait() would block for good"
