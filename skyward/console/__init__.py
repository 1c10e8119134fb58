"""What the user sees: the pool's progress, and workers' output labelled by node.

::

    provider, pool ── phase() / log() / status() ──> Console ──> logging "skyward"
                                                        └──────> a Progress display (rich,
                                                                 plain, Jupyter, or none)
    reader threads ── output(node, stream, bytes) ──> Console ──> "[node 3] text" on the
                                                                 client's stdout / stderr,
                                                                 above a live rich table,
                                                                 or in the cell of the call

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
from skyward.console.progress import Board, JupyterProgress, PlainProgress, Progress, RichProgress

if TYPE_CHECKING:
    from skyward.client.phases import Choice, Phase

ConsoleMode = Literal["auto", "rich", "plain", "off"]
OutputMode = Literal["all", "head", "none"]
Route = dict[str, Any]  # a Jupyter cell's message header

logger = logging.getLogger("skyward")

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
        self._board: Board | None = None
        self._progress: Progress | None = None

    # ── progress ─────────────────────────────────────────────────────────────────────────

    def begin(self, title: str, nodes: int) -> None:
        """A pool starts: show ``title`` and one row per node until ``end``."""
        logger.info(title)
        if self.log_file is not None:
            self.log_file.event(title)
        progress = _make_progress(self.mode)
        with self._lock:
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
            if summary is None and self._board is not None:
                self._board.fail_unfinished()
            if self._progress is not None:
                self._progress.end(summary)
            self._board = None

    def phase(self, node: int, phase: Phase, detail: str = "") -> None:
        logger.info("node %d %s%s", node, phase, f": {detail}" if detail else "")
        if self.log_file is not None:
            self.log_file.event(f"node {node} {phase}{f': {detail}' if detail else ''}")
        with self._lock:
            if self._board is not None:
                self._board.set_phase(node, phase, detail)
            if self._progress is not None:
                self._progress.phase(node, phase, detail)

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

    def closed(self) -> None:
        """The pool is closed: its log says so, and its files are closed."""
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
    """One stream's text not yet shown, cut into lines in linear time with bounded memory.

    A line longer than ``MAX_LINE`` bytes is shown in pieces. A line rewritten with ``\r``
    (tqdm, keras) keeps only its latest state, shown at most every ``REDRAW`` seconds while
    it changes, and in full when its newline comes or its call returns. Text that has waited
    ``HOLD`` seconds for its newline (dots printed one by one, a prompt) is shown as it is,
    as a terminal would show it, and what follows starts a new line.
    """

    MAX_LINE = 1 << 16
    REDRAW = 0.5
    HOLD = 1.0

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._shown = 0.0  # when the latest state of a \r-rewritten line was shown
        self._since: float | None = None  # when the text now waiting for its newline began

    def feed(self, data: bytes, now: float) -> list[bytes]:
        lines: list[bytes] = []
        if b"\n" in data:
            head, _, data = data.rpartition(b"\n")
            self._chunks.append(head)
            whole = b"".join(self._chunks).split(b"\n")
            self._chunks, self._size, self._since = [], 0, None
            lines = [_latest(line) for line in whole]
        if b"\r" in data:
            # Earlier states of a rewritten line are dropped: only the latest matters.
            done, _, data = data.rpartition(b"\r")
            state = _latest(b"".join(self._chunks) + done)
            self._chunks, self._size, self._since = [], 0, None
            if state and now - self._shown >= self.REDRAW:
                lines.append(state)
                self._shown = now
        if data:
            if self._since is None:
                self._since = now
            self._chunks.append(data)
            self._size += len(data)
            if now - self._since >= self.HOLD:
                lines.append(_latest(b"".join(self._chunks)))
                self._chunks, self._size, self._since = [], 0, None
                return lines
            if self._size > self.MAX_LINE:
                whole_line = b"".join(self._chunks)
                cut = len(whole_line) - len(whole_line) % self.MAX_LINE
                lines += [whole_line[i : i + self.MAX_LINE] for i in range(0, cut, self.MAX_LINE)]
                rest = whole_line[cut:]
                self._chunks, self._size = ([rest], len(rest)) if rest else ([], 0)
        return lines

    @property
    def has_text(self) -> bool:
        return bool(self._chunks)

    def take(self) -> list[bytes]:
        """What is left, as a line of its own (empty if nothing is)."""
        rest = _latest(b"".join(self._chunks))
        self._chunks, self._size, self._since = [], 0, None
        return [rest] if rest else []


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
