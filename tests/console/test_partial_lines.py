"""Output without a newline shows up while the call runs, as on a terminal: a progress bar
redrawn with carriage returns, and text printed a piece at a time."""

from __future__ import annotations

import time

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
