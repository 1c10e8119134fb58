"""Callers that read their own results (``skyward.link.turns``), and workers whose main thread
reads its own calls: what users rely on stays true when the thread that reads is not the one
it was."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

import skyward as sky
from skyward.link import protocol as proto
from skyward.link.turns import PipeReader, Turns


def _square(x: int) -> int:
    time.sleep(0.001 * (x % 3))
    return x * x


def _say(x: int) -> int:
    print(f"line {x}")
    return x


def test_callers_on_many_threads_and_futures_nobody_waits_for_all_get_their_results() -> None:
    settled: list[int] = []
    with sky.ComputePool(nodes=1, concurrency=4, quiet=True) as pool:
        square = sky.compute(_square)
        later = [square(i) > pool for i in range(100, 110)]  # read by someone else
        for future in later:
            future.add_done_callback(lambda f: settled.append(f.result()))
        with ThreadPoolExecutor(8) as threads:
            got = list(threads.map(lambda i: square(i) >> pool, range(200)))
        assert got == [i * i for i in range(200)]
        assert [f.result(timeout=10) for f in later] == [i * i for i in range(100, 110)]
    assert sorted(settled) == [i * i for i in range(100, 110)]


def test_a_calls_output_still_arrives_before_its_result(capfd: pytest.CaptureFixture[str]) -> None:
    with sky.ComputePool(nodes=1, quiet=True) as pool:
        say = sky.compute(_say)
        for i in range(50):
            assert say(i) >> pool == i
            assert f"line {i}" in capfd.readouterr().out


def _sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


def test_a_leading_caller_sees_its_call_time_out() -> None:
    with sky.ComputePool(nodes=1, quiet=True) as pool:
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            sky.compute(timeout=0.5)(_sleep)(30) >> pool
        assert time.monotonic() - began < 10
        assert sky.compute(_sleep)(0) >> pool == "done"


def test_ctrl_c_while_a_caller_waits_leaves_the_pool_working() -> None:
    with sky.ComputePool(nodes=1, quiet=True) as pool:
        main = threading.main_thread().ident or 0
        timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            sky.compute(_sleep)(1.5) >> pool
        # The interrupt landed while the caller waited for data, not inside a frame: the
        # worker finishes its call and serves the next one; nothing was replaced.
        assert sky.compute(_sleep)(0) >> pool == "done"
        assert pool.statistics().workers_replaced == 0


def _ends() -> None:
    os._exit(3)


def test_a_worker_lost_while_its_caller_reads_fails_the_call() -> None:
    with sky.ComputePool(nodes=1, quiet=True) as pool:
        with pytest.raises(sky.WorkerLost, match="exit code 3"):
            sky.compute(_ends)() >> pool
        assert sky.compute(_sleep)(0) >> pool == "done"


def _pipe_turns(read_frame: object = None) -> tuple[Turns, int, list[object], list[str]]:
    r, w = os.pipe()
    pipe = PipeReader(r)
    seen: list[object] = []
    torn: list[str] = []
    turns = Turns(
        ready=pipe.ready,
        read=read_frame or (lambda: proto.read_frame(pipe.readinto)),  # type: ignore[arg-type,return-value]
        dispatch=lambda message, parts: seen.append(message),
        torn=torn.append,
        recheck=0.1,
    )
    return turns, w, seen, torn


def test_a_leader_dispatches_every_frame_in_order_until_its_own() -> None:
    turns, w, seen, _ = _pipe_turns()
    future: Future[str] = Future()
    for i in range(3):
        proto.write_parts(w, proto.frame(proto.Log(f"{i}".encode())))

    def settle() -> None:
        time.sleep(0.2)
        future.set_result("ok")
        proto.write_parts(w, proto.frame(proto.Bye()))

    threading.Thread(target=settle).start()
    assert turns.wait_for(future.done, 5) is not None
    assert future.result() == "ok"
    assert [m.data for m in seen if isinstance(m, proto.Log)] == [b"0", b"1", b"2"]
    os.close(w)


def test_an_interrupt_inside_a_frame_tears_the_link_and_goes_on() -> None:
    def interrupted() -> tuple[object, list[object]]:
        raise KeyboardInterrupt

    turns, w, _, torn = _pipe_turns(interrupted)
    os.write(w, b"x")  # something to read
    with pytest.raises(KeyboardInterrupt):
        turns.wait_for(Future().done, 5)
    assert torn == ["the client was interrupted while reading its frame"]
    assert turns.ended()
    began = time.monotonic()
    turns.wait_for(Future().done, 5)  # the link is over: nobody reads it again
    assert time.monotonic() - began < 1
    os.close(w)


def test_unblock_wakes_a_thread_polling_the_pipe_for_bytes_already_buffered() -> None:
    # A leader can read ahead, in one read, a frame another thread is waiting for; the pipe
    # is then empty and would never wake that thread. unblock does (the race itself is
    # caught by test_interrupts' sweep; here the read-ahead is written into the buffer).
    r, w = os.pipe()
    pipe = PipeReader(r)
    answered: list[bool] = []
    waiter = threading.Thread(target=lambda: answered.append(pipe.ready(None)))
    waiter.start()
    time.sleep(0.2)  # polling the empty pipe by now
    pipe.unblock()  # nothing buffered: nothing to say
    waiter.join(0.3)
    assert waiter.is_alive() and answered == []
    pipe._buffer[:1] = b"x"  # what a leader's read of two frames leaves behind
    pipe._end = 1
    pipe.unblock()
    waiter.join(5)
    assert answered == [True]
    view = bytearray(1)
    assert pipe.readinto(view) == 1 and view == b"x"
    os.close(w)
    os.close(r)


def test_a_waiter_that_came_while_the_reader_held_the_baton_is_woken_to_lead() -> None:
    # Once, in the full suite: a worker's idle main thread (a leader without a recheck, as
    # the worker's is) arrived while the reader thread held the baton, and slept as its
    # follower; the reader, seeing a waiter, let the baton go without reading and without
    # waking it. Both then slept for good: the worker never read its next call.
    r, w = os.pipe()
    pipe = PipeReader(r)
    at_the_check = threading.Event()
    go_on = threading.Event()

    def ready(timeout: float | None) -> bool:
        if timeout == 0 and threading.current_thread().name == "reader":
            at_the_check.set()  # the reader holds the baton here
            go_on.wait(5)
            return False  # what it saw then: nothing yet
        if timeout is None and threading.current_thread().name == "reader":
            return True  # readable, as far as it knew: it takes the baton
        return pipe.ready(timeout)

    def read() -> tuple[object, list[object]]:
        return pipe.read_frame()

    calls: list[object] = []  # the reader thread is told apart by its name
    turns = Turns(ready=ready, read=read, dispatch=lambda m, p: calls.append(m))
    reader = threading.Thread(target=turns.run_reader, name="reader", daemon=True)
    reader.start()
    assert at_the_check.wait(5)
    waiter = threading.Thread(target=turns.wait_for, args=(lambda: calls, None), daemon=True)
    waiter.start()
    deadline = time.monotonic() + 5
    while not turns._sleepers and time.monotonic() < deadline:
        time.sleep(0.01)  # until the waiter sleeps as the reader's follower (nobody else can)
    assert turns._sleepers, "the waiter never followed the reader"
    go_on.set()  # the reader sees the waiter and leaves the frame to it
    proto.write_parts(w, proto.frame(proto.Log(b"the next call")))
    waiter.join(5)
    assert not waiter.is_alive(), "the waiter was never woken to lead"
    assert [m.data for m in calls if isinstance(m, proto.Log)] == [b"the next call"]
    turns.end()
    os.close(w)
    reader.join(5)
    os.close(r)
