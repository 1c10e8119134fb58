"""Output without a newline shows up while the call runs, as on a terminal: a progress bar
redrawn with carriage returns, and text printed a piece at a time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import skyward as sky
from skyward.console import LineBuffer


def progress_bar(seconds: float) -> str:
    import time

    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        print(f"\rprogress {step:3d}", end="")  # no newline, no flush: as tqdm-like bars do
        step += 1
        time.sleep(0.05)
    print()
    return "done"


def dots(seconds: float) -> str:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        print(".", end="")
        time.sleep(0.1)
    return "done"


def _seen_while_running(
    capfd: pytest.CaptureFixture[str], fn: object, marker: str
) -> tuple[float, str]:
    with sky.ComputePool(nodes=1, console="off") as pool:
        started = time.monotonic()
        future = pool.submit(fn, 6.0)  # type: ignore[arg-type]
        seen = ""
        while marker not in seen and time.monotonic() - started < 5.0:
            seen += capfd.readouterr().out
            time.sleep(0.05)
        first = time.monotonic() - started
        assert not future.done(), "the output must arrive while the call still runs"
        assert future.result(timeout=30) == "done"
    return first, seen


def test_a_progress_bar_without_newlines_is_shown_while_the_call_runs(
    capfd: pytest.CaptureFixture[str],
) -> None:
    first, seen = _seen_while_running(capfd, progress_bar, "progress")
    assert first < 2.0, f"first shown after {first:.1f} s"
    assert "[node 0] progress" in seen


def test_text_printed_a_piece_at_a_time_is_shown_while_the_call_runs(
    capfd: pytest.CaptureFixture[str],
) -> None:
    first, seen = _seen_while_running(capfd, dots, ".")
    assert first < 3.0, f"first shown after {first:.1f} s"
    assert "[node 0] ." in seen


def test_a_partial_line_is_held_for_a_moment_then_shown_as_it_is() -> None:
    buffer = LineBuffer()
    assert buffer.feed(b"loading", 10.0) == []  # a newline may follow at once
    assert buffer.feed(b"...", 10.5) == []
    assert buffer.feed(b"..", 11.1) == [b"loading....."]  # held HOLD seconds: shown
    assert buffer.feed(b" done\n", 11.2) == [b" done"]  # the rest starts a line of its own


def draw_then_wait(first: str, release: str) -> str:
    """Writes ``first`` with no newline, then nothing until ``release`` exists."""
    import os
    import sys
    import time

    print(first, end="", file=sys.stderr, flush=True)
    end = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < end:
        time.sleep(0.05)
    print("\r100%|##########|", file=sys.stderr)
    return "done"


@pytest.mark.parametrize("first", ["\r  0%|          |", "epoch 1: "])
def test_a_waiting_line_is_shown_on_a_non_terminal_though_nothing_follows_it(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, first: str
) -> None:
    """A bar's first state, or a line waiting for a long step to end, reaches a stderr that
    is not a terminal while the call still runs: the call ends only once it was seen."""
    release = tmp_path / "release"
    with sky.ComputePool(nodes=1, console="off") as pool:
        future = pool.submit(draw_then_wait, first, str(release))
        seen, deadline = "", time.monotonic() + 30
        while f"[node 0] {first.strip(chr(13))}" not in seen and time.monotonic() < deadline:
            seen += capfd.readouterr().err
            time.sleep(0.05)
        running = not future.done()
        release.touch()
        assert future.result(timeout=30) == "done"
        seen += capfd.readouterr().err
    assert running, "the line must be shown before its call ends"
    assert f"[node 0] {first.strip(chr(13))}\n" in seen, seen


def test_a_bars_first_state_is_shown_when_it_comes_and_its_last_once() -> None:
    buffer = LineBuffer()
    assert buffer.feed(b"\r  0%", 10.0) == [b"  0%"]  # not held until the next state
    assert buffer.feed(b"\r 10%", 10.1) == []  # redrawn at most every REDRAW seconds
    assert buffer.due(10.2) == []
    assert buffer.due(10.6) == [b" 10%"]  # though nothing more came
    assert buffer.feed(b"\r100%", 10.7) == []
    assert buffer.feed(b"\n", 10.8) == [b"100%"]  # the final state, when the line ends
    assert buffer.feed(b"\r 50%\r", 11.5) == [b" 50%"]
    assert buffer.due(12.5) == []  # shown already: not again
    assert buffer.feed(b"\n", 12.6) == []
    assert buffer.take() == []


def test_a_partial_line_is_shown_a_bounded_time_after_its_first_byte() -> None:
    buffer = LineBuffer()
    assert buffer.feed(b"epoch 1: ", 10.0) == []
    assert buffer.due(10.5) == []
    assert buffer.due(11.0) == [b"epoch 1: "]  # no more text came: shown anyway
    assert buffer.feed(b"done\n", 15.0) == [b"done"]
    assert buffer.feed(b"a", 20.0) == []
    assert buffer.feed(b"b", 20.6) == []
    assert buffer.feed(b"c", 21.0) == [b"abc"]  # since the first byte, not the last


def test_megabytes_without_a_newline_come_out_whole_in_pieces() -> None:
    buffer = LineBuffer()
    shown = [line for _ in range(2000) for line in buffer.feed(b"x" * 1000, 10.0)]
    shown += buffer.take()
    assert b"".join(shown) == b"x" * 2_000_000
    assert {len(line) for line in shown[:-1]} == {LineBuffer.MAX_LINE}


def write_stderr_then_exit(megabytes: int) -> None:
    import os

    for _ in range(megabytes * 16):
        os.write(2, b"y" * 65536)
    os.write(2, b"FATAL: the last words")
    os._exit(3)


def test_a_worker_that_writes_without_newlines_then_exits_is_lost_with_its_tail(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with sky.ComputePool(nodes=1, console="off") as pool:
        with pytest.raises(sky.WorkerLost) as lost:
            pool.submit(write_stderr_then_exit, 20).result(timeout=60)
    assert lost.value.stderr_tail.endswith("FATAL: the last words")
    assert "FATAL: the last words" in str(lost.value)
    assert capfd.readouterr().err.rstrip().endswith("FATAL: the last words")
