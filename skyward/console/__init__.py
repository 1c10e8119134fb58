"""What the user sees: the pool's progress, and workers' output labelled by node.

::

    provider, pool ── phase() / log() / status() ──> Console ──> logging "skyward"
                                                        └──────> a Progress display (rich,
                                                                 plain, Jupyter, or none)
    reader threads ── output(node, stream, bytes) ──> Console ──> "[node 3] text" on the
                                                                 client's stdout / stderr,
                                                                 above a live rich table,
                                                                 or in the cell of the call
    ticker thread, while a line waits for its newline ──> the line, once it is due (a bar's
                                                          state, "epoch 1: "), on a
                                                          terminal, a pipe or a file alike

``console=`` picks the progress display: ``"auto"`` (Jupyter in a kernel, ``"rich"`` on a
terminal, ``"plain"`` otherwise), ``"rich"``, ``"plain"`` or ``"off"``. ``output=`` picks
whose output is shown: ``"all"`` nodes, the ``"head"`` node (rank 0) only, or ``"none"``.
The two are independent: ``console="off"`` never hides a ``print()``.

Worker output streams are looked up at every write, so Jupyter's and pytest's replacements
of ``sys.stdout`` receive it. While a rich table is live on a terminal, lines bound for that
terminal are printed through it (whole, above the table); a stream redirected elsewhere
still receives its own. In Jupyter, each call's output goes to the cell that submitted
it: the pool records the cell with ``route()`` at submit time and ``bind``s it to the node
the call runs on; that node's output goes there until its next call starts.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Literal

from skyward.console import jupyter as _jupyter
from skyward.console.logs import PoolLog
from skyward.console.metrics_view import JupyterMetrics, RichMetrics
from skyward.console.progress import Board, JupyterProgress, PlainProgress, Progress, RichProgress
from skyward.console.timings import PhaseClock, StartTimings

if TYPE_CHECKING:
    from skyward.client.phases import Choice, Phase

ConsoleMode = Literal["auto", "rich", "plain", "off"]
OutputMode = Literal["all", "head", "none"]
Route = dict[str, Any]  # a Jupyter cell's message header

logger = logging.getLogger("skyward")

# How often waiting lines are looked at: a line shows at most this long after it is due.
_TICK = 0.2

# Node labels in a terminal: one colour per node, cycling.
_COLOURS = (36, 33, 35, 32, 34, 31)


class Console:
    """Thread-safe: provider threads and reader threads of every node call it at once."""

    def __init__(
        self,
        *,
        mode: ConsoleMode = "auto",
        output: OutputMode = "all",
        log: PoolLog | None = None,
    ) -> None:
        self.mode = mode
        self.output_mode = output
        # Output is labelled by worker rank: ``[node 2]``, or ``[node 2 worker 1]`` once the
        # pool knows it runs several workers per node (set before any worker starts).
        self.workers_per_node = 1
        self.log_file = log  # every node's output and every event, whatever is shown
        self._lock = threading.Lock()  # guards: everything below, and whole-line writes
        self._partial: dict[tuple[int, str], LineBuffer] = {}
        # Nodes whose buffers may hold a line without its newline; read without the lock by
        # flush(node) after every result (the thread that dispatched the node's output before
        # its result is the one asking, or handed the link over through a lock).
        self._unfinished: set[int] = set()
        self._routes: dict[int, Route] = {}
        # Shows a waiting line when its time comes though nothing more arrives (a bar's
        # first state, "epoch 1: " before a long step); runs only while a line waits.
        self._ticker: threading.Thread | None = None
        self._board: Board | None = None
        self._progress: Progress | None = None
        self._clock = PhaseClock()  # the latest start's phases, for timings()
        # The live metrics lines (console/metrics_view.py), on a terminal, once started;
        # False: not shown here (not a terminal, or the pool closed).
        self._metrics: RichMetrics | JupyterMetrics | bool | None = None
        # Whether the pool's nodes send live metrics (its image's metrics=): a notebook makes
        # their display while the starting cell runs (console/metrics_view.py).
        self.metrics_expected = False

    # ── progress ─────────────────────────────────────────────────────────────────────────

    def begin(self, title: str, nodes: int) -> None:
        """A pool starts: show ``title`` and one row per node until ``end``."""
        logger.info(title)
        if self.log_file is not None:
            self.log_file.event(title)
        progress = _make_progress(self.mode)
        with self._lock:
            self._clock = PhaseClock()
            self._board = Board(title, nodes)
            self._progress = progress
            if progress is not None:
                progress.begin(self._board)

    def end(self, summary: str | None = None) -> None:
        """The pool is ready (``summary`` says so) or failed to start (None)."""
        if summary:
            logger.info(summary)
        if self.log_file is not None:
            if summary:
                self.log_file.event(summary)
            self.log_file.state("running" if summary else "failed")
        with self._lock:
            if self._board is not None:
                self._clock.end()
            if summary is None and self._board is not None:
                self._board.fail_unfinished()
            if self._progress is not None:
                self._progress.end(summary)
            self._board = None
            if (
                summary
                and self.metrics_expected
                and self._metrics is None
                and self.mode == "auto"
                and _jupyter.in_jupyter()
            ):
                self._metrics = JupyterMetrics()  # in the starting cell, while it runs

    def phase(self, node: int, phase: Phase, detail: str = "") -> None:
        logger.info("node %d %s%s", node, phase, f": {detail}" if detail else "")
        if self.log_file is not None:
            self.log_file.event(f"node {node} {phase}{f': {detail}' if detail else ''}")
        with self._lock:
            if self._board is not None:
                self._clock.record(node, phase, detail)
                self._board.set_phase(node, phase, detail)
            if self._progress is not None:
                self._progress.phase(node, phase, detail)

    def timings(self) -> StartTimings:
        """The latest start's seconds per node and stage (``console/timings.py``)."""
        with self._lock:
            return self._clock.timings()

    def log(self, node: int, line: str) -> None:
        logger.debug("node %d | %s", node, line)
        if self.log_file is not None:
            self.log_file.event(f"node {node} | {line}")
        with self._lock:
            if self._board is not None:
                self._board.set_line(node, line)
            if self._progress is not None:
                self._progress.line(node, line)

    def chosen(self, choice: Choice) -> None:
        """A cloud pool picked its machines: shown under the title until the display ends."""
        text = choice.line()
        logger.info(text)
        if self.log_file is not None:
            self.log_file.event(text)
        with self._lock:
            if self._board is not None:
                self._board.choice = choice
            if self._progress is not None:
                self._progress.chosen(choice)

    def status(self, text: str) -> None:
        """A one-off event: a worker replaced, plugins entering, the pool closing."""
        logger.info(text)
        if self.log_file is not None:
            self.log_file.event(text)
        with self._lock:
            if self._progress is not None:
                self._progress.note(text)

    # ── worker output ────────────────────────────────────────────────────────────────────

    def route(self) -> Route | None:
        """Where a call submitted now should print: the running Jupyter cell, if any."""
        if "ipykernel" not in sys.modules:  # asked for every call: the answer, at once
            return None
        return _jupyter.current_parent()

    def bind(self, node: int, route: Route | None) -> None:
        """A call that ``route()`` was taken for starts on ``node``."""
        if route is None:
            return
        with self._lock:
            self._routes[node] = route

    def output(self, node: int, stream: str, data: bytes) -> None:
        if self.log_file is None and not self._shows(node):
            return
        key = (node, stream)
        with self._lock:
            buffer = self._partial.get(key)
            if buffer is None:
                buffer = self._partial[key] = LineBuffer()
            self._write(node, stream, buffer.feed(data, time.monotonic()))
            if buffer.has_text:
                self._unfinished.add(node)
                if self._ticker is None:
                    self._ticker = threading.Thread(
                        target=self._tick, name="skyward-output-tick", daemon=True
                    )
                    self._ticker.start()

    def _tick(self) -> None:
        """Show what waiting lines are due, a few times a second, until none waits."""
        while True:
            time.sleep(_TICK)
            with self._lock:
                now, waiting = time.monotonic(), False
                for (node, stream), buffer in sorted(self._partial.items()):
                    if buffer.has_text:
                        self._write(node, stream, buffer.due(now))
                        waiting = waiting or buffer.has_text
                if not waiting:
                    self._ticker = None
                    return

    def metrics(self, node: int, values: dict[str, float]) -> None:
        """A node's live metrics sample: its line on a terminal, once the start-up table is
        gone (reader threads call this)."""
        with self._lock:
            if self._metrics is None:
                if self._board is not None:
                    return  # still starting: the table has the terminal
                self._metrics = self._metrics_view()
            if not isinstance(self._metrics, bool):
                self._metrics.update(node, values)

    def _metrics_view(self) -> RichMetrics | JupyterMetrics | bool:
        """Lock held. Where the live metrics are shown: a terminal, a notebook, or nowhere."""
        if self.mode == "off":
            return False
        if _jupyter.in_jupyter():
            return False  # made at the end of the start, or not at all (see end)
        return RichMetrics() if self.mode in ("auto", "rich") and _colour(sys.stderr) else False

    def closed(self) -> None:
        """The pool is closed: its log says so, and its files are closed."""
        with self._lock:
            if not isinstance(self._metrics, bool | None):
                self._metrics.stop()
            self._metrics = False
        if self.log_file is not None:
            self.log_file.state("closed")
            self.log_file.close()

    def _shows(self, node: int) -> bool:
        return self.output_mode == "all" or (self.output_mode == "head" and node == 0)

    def flush(self, node: int | None = None) -> None:
        """Write out every line still missing its newline: of ``node`` (a call of its has
        returned), or of every node (the workers have ended)."""
        if node is not None and node not in self._unfinished:
            return  # after every result: mostly nothing to write, and no lock to take
        with self._lock:
            if node is not None:
                self._unfinished.discard(node)
                for stream in ("stdout", "stderr"):
                    buffer = self._partial.get((node, stream))
                    if buffer is not None and buffer.has_text:
                        self._write(node, stream, buffer.take())
                return
            self._unfinished.clear()
            for (rank, stream), buffer in sorted(self._partial.items()):
                self._write(rank, stream, buffer.take())

    def _write(self, node: int, stream: str, lines: list[bytes]) -> None:
        """Lock held."""
        if not lines:
            return
        if self.log_file is not None:
            self.log_file.output(node, stream, lines)
            if not self._shows(node):
                return
        target = sys.stdout if stream == "stdout" else sys.stderr
        # While rich's live table is up it stands in for sys.stdout and sys.stderr, sending
        # both to the terminal; a stream redirected to a file must still get its lines.
        target = getattr(target, "rich_proxied_file", target)
        label = self._label(node, target)
        text = "".join(f"{label} {line.decode('utf-8', 'backslashreplace')}\n" for line in lines)
        if self._progress is not None and _isatty(target) and self._progress.print_above(text):
            return  # a live table is on this terminal: the lines scroll above it
        if isinstance(self._metrics, RichMetrics) and _isatty(target):
            self._metrics.print_above(text)
            return  # the same, above the live metrics lines
        try:
            with _jupyter.as_parent(self._routes.get(node)):
                target.write(text)
                target.flush()
        except (OSError, ValueError):
            pass  # the client's stream is closed (interpreter exit); nothing to show it on

    def _label(self, node: int, target: Any) -> str:
        per = self.workers_per_node
        label = f"[node {node}]" if per == 1 else f"[node {node // per} worker {node % per}]"
        if self.mode in ("off", "plain") or not (_colour(target) or _jupyter.in_jupyter()):
            return label
        return f"\x1b[{_COLOURS[node // per % len(_COLOURS)]}m{label}\x1b[0m"


class LineBuffer:
    """One stream's line not yet shown, cut into lines in linear time with bounded memory.

    A line is shown at the latest a bounded time after its first byte, whether more text
    follows or not (``due``, asked by the console's ticker while a line waits), on a
    terminal or not:

    - A line rewritten with ``\r`` (tqdm, keras) keeps only its latest state. Each new state
      is shown at once, then at most every ``REDRAW`` seconds while it changes; its final
      state when its newline comes or its call returns, unless that state was just shown.
    - Text that has waited ``HOLD`` seconds since its first byte for its newline (dots
      printed one by one, a prompt) is shown as it is, as a terminal would show it, and
      what follows starts a new line.
    - A line longer than ``MAX_LINE`` bytes is shown in pieces.

    Every byte is looked at a bounded number of times (what waits is at most ``MAX_LINE``
    bytes, joined once per ``MAX_LINE`` bytes received), so output without newlines costs
    what the same output with newlines does. Not thread-safe: the console's lock guards it.
    """

    MAX_LINE = 1 << 16
    REDRAW = 0.5
    HOLD = 1.0

    def __init__(self) -> None:
        self._chunks: list[bytes] = []  # the line's text since its last \r
        self._size = 0  # bytes in _chunks
        self._state = b""  # the line's latest whole state before its last \r
        self._rewritten = False  # a \r came: later states replace what is shown
        self._since: float | None = None  # when the line's first byte came (None: no line)
        self._shown = b""  # the state of this rewritten line shown last
        self._shown_at = 0.0  # and when

    def feed(self, data: bytes, now: float) -> list[bytes]:
        """The lines ``data`` completes, and what of the line it leaves is due now."""
        lines: list[bytes] = []
        if b"\n" in data:
            head, _, data = data.rpartition(b"\n")
            first, *whole = head.split(b"\n")
            lines += self._finish(first)
            lines += [_latest(line) for line in whole]
        if data:
            lines += self._add(data, now)
        return lines + self.due(now)

    def due(self, now: float) -> list[bytes]:
        """What of the waiting line is to be shown by ``now``, though nothing new came."""
        if self._since is None:
            return []
        if not self._rewritten:
            if now - self._since < self.HOLD:
                return []
            return self.take()  # shown as it is; what follows starts a line of its own
        if now - self._shown_at < self.REDRAW:
            return []  # before joining: a bar redrawn in many small writes stays linear
        state = self._current()
        self._shown_at = now  # looked at: the next look is REDRAW away, changed or not
        if not state or state == self._shown:
            return []
        self._shown = state
        return [state]

    @property
    def has_text(self) -> bool:
        """A line has begun and not ended (its latest state may have been shown)."""
        return self._since is not None

    def take(self) -> list[bytes]:
        """What is left, as a line of its own (empty if nothing is, or if it is the state of
        a rewritten line already shown)."""
        return [] if self._since is None else self._finish(b"")

    def _finish(self, tail: bytes) -> list[bytes]:
        """The line ends with ``tail``: its final state, unless just shown."""
        line = _latest(b"".join(self._chunks) + tail) if self._chunks or tail else b""
        rewritten = self._rewritten or b"\r" in tail
        if not line and rewritten:
            line = self._state
        shown = rewritten and line == self._shown
        self._chunks, self._size, self._state, self._rewritten = [], 0, b"", False
        self._since, self._shown, self._shown_at = None, b"", 0.0
        if shown or (rewritten and not line):
            return []
        return [line]

    def _add(self, data: bytes, now: float) -> list[bytes]:
        """Text without a newline: the line goes on (or begins)."""
        if self._since is None:
            self._since = now
        if b"\r" in data:
            # Earlier states of a rewritten line are dropped: only the latest matters.
            done, _, data = data.rpartition(b"\r")
            state = _latest(b"".join(self._chunks) + done)
            if state:
                self._state = state
            self._chunks, self._size, self._rewritten = [], 0, True
        if data:
            self._chunks.append(data)
            self._size += len(data)
        if self._size <= self.MAX_LINE:
            return []
        line = b"".join(self._chunks)
        cut = len(line) - len(line) % self.MAX_LINE
        rest = line[cut:]
        self._chunks, self._size = ([rest], len(rest)) if rest else ([], 0)
        return [line[i : i + self.MAX_LINE] for i in range(0, cut, self.MAX_LINE)]

    def _current(self) -> bytes:
        """The state a terminal would show of the line now."""
        if self._chunks:
            return b"".join(self._chunks)
        return self._state


def _latest(line: bytes) -> bytes:
    """The state a terminal would show of a line rewritten with ``\r``."""
    line = line.rstrip(b"\r")
    return line.rpartition(b"\r")[2]


def _make_progress(mode: ConsoleMode) -> Progress | None:
    if mode == "off":
        return None
    if mode == "plain":
        return PlainProgress()
    if mode == "rich":
        return RichProgress()
    if _jupyter.in_jupyter():
        return JupyterProgress()
    return RichProgress() if _colour(sys.stderr) else PlainProgress()


def _colour(stream: Any) -> bool:
    """A terminal that wants colour (https://no-color.org and TERM=dumb say it does not)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return _isatty(stream)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
