"""Progress while a pool comes up: one row per node, drawn three ways.

::

    provider / pool ── phase(), log() ──> Board (per node: phase, since, last line;
                      chosen() ─────────>        a cloud's choice: what, where, $/h)
                                            ├─ PlainProgress    timestamped lines on stderr
                                            ├─ RichProgress     a live table on the terminal
                                            └─ JupyterProgress  a display updated in place

A display lives from ``begin`` to ``end`` (the pool is ready, or failed to start); events
after that (a worker replaced) are single ``note`` lines. Every method is called with the
console's lock held, so displays need no locks of their own. The one reader outside that
lock is rich's refresh thread, which must not take it (``end`` waits for that thread while
holding it); it only reads rows, which are all made up front and whose fields are replaced
whole.
"""

from __future__ import annotations

import html
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from skyward.client.phases import BOOTSTRAP_STEPS

if TYPE_CHECKING:
    from skyward.client.phases import Choice

_LAST_LINE_WIDTH = 80


@dataclass
class NodeRow:
    phase: str = "waiting"
    detail: str = ""  # what the phase is about: a host, an image hash, a pid
    last_line: str = ""  # the latest line printed in this phase (a bootstrap's output)
    since: float = field(default_factory=time.monotonic)  # when the node's row appeared
    done_at: float | None = None  # when it became ready: its elapsed time stops there

    def elapsed(self, now: float) -> float:
        return (self.done_at if self.done_at is not None else now) - self.since


@dataclass
class Board:
    """What every display draws from."""

    title: str
    nodes: int
    started: float = field(default_factory=time.monotonic)
    rows: dict[int, NodeRow] = field(default_factory=dict)
    choice: Choice | None = None  # what a cloud pool picked, once it has

    def __post_init__(self) -> None:
        self.rows = {rank: NodeRow(since=self.started) for rank in range(self.nodes)}

    def row(self, node: int) -> NodeRow:
        return self.rows.setdefault(node, NodeRow())

    def set_phase(self, node: int, phase: str, detail: str) -> None:
        row = self.row(node)
        if phase == "bootstrapping" and detail in BOOTSTRAP_STEPS:
            # A step of the bootstrap: shown beside the phase ("bootstrapping: uv"), and the
            # detail the phase began with (the image's hash) stays.
            phase, detail = f"bootstrapping: {detail}", row.detail
        # A line from the previous phase would now describe the wrong thing.
        row.phase, row.detail, row.last_line = phase, _shorten(detail), ""
        row.done_at = time.monotonic() if phase == "ready" else None

    def fail_unfinished(self) -> None:
        for row in self.rows.values():
            if row.phase != "ready":
                row.phase, row.done_at = "failed", time.monotonic()

    def set_line(self, node: int, line: str) -> None:
        self.row(node).last_line = _shorten(line)

    def choice_table(self) -> list[tuple[str, ...]]:
        """The cloud's choice as a header row and one row (none before a cloud chose)."""
        c = self.choice
        if c is None:
            return []
        each = "?" if c.hourly is None else f"{c.hourly:.2f}"
        pool = "?" if c.pool_hourly is None else f"{c.pool_hourly:.2f}"
        return [
            ("nodes", "machine", "hardware", "market", "where", "$/h each", "$/h pool"),
            (str(c.nodes), c.machine, c.hardware, c.market, c.where, each, pool),
        ]

    def table(self) -> list[tuple[str, str, str, str]]:
        """(node, phase, elapsed, news) per node, as text: news is the phase's latest line,
        or its detail until a line comes."""
        now = time.monotonic()
        return [
            (
                f"node {rank}",
                row.phase,
                f"{row.elapsed(now):.1f}s",
                row.last_line or row.detail,
            )
            for rank, row in sorted(self.rows.items())
        ]


class Progress(Protocol):
    def begin(self, board: Board) -> None: ...
    def phase(self, node: int, phase: str, detail: str) -> None: ...
    def line(self, node: int, line: str) -> None: ...
    def note(self, text: str) -> None: ...
    def chosen(self, choice: Choice) -> None:
        """A cloud pool picked its machines (the board has it already)."""
        ...

    def end(self, summary: str | None) -> None: ...
    def print_above(self, text: str) -> bool:
        """Show worker output above a live display; False when there is none to keep
        intact, and the caller writes the text itself."""
        ...


def stamp(text: str) -> str:
    return f"{time.strftime('%H:%M:%S')} skyward: {text}\n"


def _write_stderr(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr is closed (interpreter exit): nothing to show it on


class PlainProgress:
    """One timestamped line per event, for logs, CI and pipes."""

    def begin(self, board: Board) -> None:
        _write_stderr(stamp(board.title))

    def phase(self, node: int, phase: str, detail: str) -> None:
        _write_stderr(stamp(f"node {node} {phase}" + (f": {detail}" if detail else "")))

    def line(self, node: int, line: str) -> None:
        _write_stderr(stamp(f"node {node} | {line}"))

    def note(self, text: str) -> None:
        _write_stderr(stamp(text))

    def chosen(self, choice: Choice) -> None:
        _write_stderr(stamp(choice.line()))

    def end(self, summary: str | None) -> None:
        if summary:
            _write_stderr(stamp(summary))

    def print_above(self, text: str) -> bool:
        return False


_SYMBOLS = {"ready": "[green]✔[/]", "failed": "[red]✘[/]"}


class RichProgress:
    """A live table on the terminal's stderr, redrawn a few times a second."""

    def __init__(self) -> None:
        self._board: Board | None = None
        self._live: Any = None
        self._console: Any = None

    def begin(self, board: Board) -> None:
        from rich.console import Console as RichConsole
        from rich.live import Live

        self._board = board
        self._console = RichConsole(file=sys.stderr)
        # redirect_stdout/stderr: prints during start-up (plugins entering) scroll above
        # the table instead of tearing it.
        self._live = Live(
            get_renderable=self._render,
            console=self._console,
            refresh_per_second=8,
            transient=False,
        )
        self._live.start()

    def _render(self) -> Any:
        from rich.spinner import Spinner
        from rich.table import Table
        from rich.text import Text

        table = Table.grid(padding=(0, 2))
        table.add_row(Text(self._board.title if self._board else "", style="bold"))
        chosen = self._board.choice_table() if self._board else []
        if chosen:
            table.add_row(self._choice(chosen))
        grid = Table.grid(padding=(0, 2))
        rows = self._board.table() if self._board else []
        # One screen line per node, however narrow the terminal: only the news gives way,
        # cut here with an ellipsis (rich would squeeze or drop other columns instead).
        widths = [max((len(r[c]) for r in rows), default=0) for c in range(3)]
        room = max(self._console.width - 1 - sum(widths) - 2 * 4, 8)
        for name, phase, elapsed, news in rows:
            symbol: Any = (
                Text.from_markup(_SYMBOLS[phase]) if phase in _SYMBOLS else Spinner("dots")
            )
            style = {"ready": "green", "failed": "red"}.get(phase, "cyan")
            grid.add_row(
                symbol,
                Text(name, style="bold"),
                Text(phase, style=style),
                Text(elapsed, style="magenta"),
                Text(news if len(news) <= room else news[: room - 1] + "…", style="dim"),
            )
        table.add_row(grid)
        return table

    def _choice(self, chosen: list[tuple[str, ...]]) -> Any:
        """The cloud's choice as a small table on one line, however narrow the terminal:
        only the hardware column gives way (cut with an ellipsis, then left out)."""
        from rich.table import Table

        header, row = chosen
        widths = [max(len(h), len(v)) for h, v in zip(header, row, strict=True)]
        hardware = header.index("hardware")
        others = sum(w for i, w in enumerate(widths) if i != hardware) + 2 * len(widths)
        room = self._console.width - 1 - others
        cells = list(row)
        keep = [i for i in range(len(header)) if i != hardware or room >= 8]
        if room < len(cells[hardware]):
            cells[hardware] = cells[hardware][: max(room - 1, 0)] + "…"
        choice = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
        for i in keep:
            right = header[i] in ("nodes", "$/h each", "$/h pool")
            choice.add_column(header[i], justify="right" if right else "left", no_wrap=True)
        choice.add_row(*(cells[i] for i in keep), style="yellow")
        return choice

    def phase(self, node: int, phase: str, detail: str) -> None:
        pass  # the board changed; the live display redraws by itself

    def chosen(self, choice: Choice) -> None:
        pass  # drawn from the board, under the title

    def line(self, node: int, line: str) -> None:
        pass

    def print_above(self, text: str) -> bool:
        if self._live is None:
            return False
        from rich.text import Text

        # Not through rich's stdout proxy, which would wrap the lines at the terminal's
        # width, putting newlines into the worker's output; soft_wrap leaves that to the
        # terminal.
        self._console.print(Text.from_ansi(text.rstrip("\n")), soft_wrap=True, highlight=False)
        return True

    def note(self, text: str) -> None:
        if self._live is not None:
            self._console.print(f"skyward: {text}", style="yellow", highlight=False)
        else:
            _write_stderr(f"skyward: {text}\n")

    def end(self, summary: str | None) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
            if not self._console.is_terminal:
                self._console.line()  # off a terminal, the last frame ends without one
            if summary:
                self._console.print(f"skyward: {summary}", style="bold green", highlight=False)


class JupyterProgress:
    """A display in the cell that started the pool, replaced in place as nodes move on."""

    # Updates are messages to the frontend; a bootstrap printing thousands of lines must not
    # send thousands. Phase changes always go out.
    _MIN_INTERVAL = 0.25

    def __init__(self) -> None:
        self._board: Board | None = None
        self._handle: Any = None
        self._parent: dict[str, Any] | None = None
        self._sent = 0.0
        self._summary = ""

    def begin(self, board: Board) -> None:
        from IPython.display import display

        from skyward.console.jupyter import current_parent

        self._board = board
        self._parent = current_parent()
        self._handle = display(self._bundle(), raw=True, display_id=True)  # type: ignore[no-untyped-call]
        self._sent = time.monotonic()

    def _update(self, *, force: bool) -> None:
        from skyward.console.jupyter import as_parent

        if self._handle is None or (
            not force and time.monotonic() - self._sent < self._MIN_INTERVAL
        ):
            return
        with as_parent(self._parent):  # provider threads belong to no cell
            self._handle.update(self._bundle(), raw=True)
        self._sent = time.monotonic()

    def _bundle(self) -> dict[str, str]:
        rows = self._board.table() if self._board else []
        title = self._board.title if self._board else ""
        chosen = self._board.choice_table() if self._board else []
        choice = self._board.choice if self._board else None
        text = "\n".join(
            [title, *([choice.line()] if choice else []), *("  ".join(r).rstrip() for r in rows)]
        )
        if self._summary:
            text += f"\n{self._summary}"
        cells = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
        )
        picked = (
            "<table><tr>"
            + "".join(f"<th>{html.escape(c)}</th>" for c in chosen[0])
            + "</tr><tr>"
            + "".join(f"<td>{html.escape(c)}</td>" for c in chosen[1])
            + "</tr></table>"
            if chosen
            else ""
        )
        markup = (
            f"<div><b>{html.escape(title)}</b>{picked}<table>{cells}</table>"
            f"{f'<b>{html.escape(self._summary)}</b>' if self._summary else ''}</div>"
        )
        return {"text/plain": text, "text/html": markup}

    def phase(self, node: int, phase: str, detail: str) -> None:
        self._update(force=True)

    def line(self, node: int, line: str) -> None:
        self._update(force=False)

    def chosen(self, choice: Choice) -> None:
        self._update(force=True)

    def note(self, text: str) -> None:
        _write_stderr(f"skyward: {text}\n")

    def print_above(self, text: str) -> bool:
        return False  # the display sits in its own output area, which printing leaves alone

    def end(self, summary: str | None) -> None:
        self._summary = summary or ""
        self._update(force=True)
        self._handle = None


def _shorten(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _LAST_LINE_WIDTH else line[: _LAST_LINE_WIDTH - 1] + "…"
