"""The progress bar of a map: items done of how many, their rate, the time left; on a
terminal (rich, on stderr) or in a notebook (a display updated in place), and only for maps
that run longer than ``SHOW_AFTER`` seconds, so that short ones print nothing.

``MapBar`` is driven by the one thread that iterates the map (``pool.mapping``): it needs no
lock. Nothing is drawn off a terminal outside a notebook, or with ``console="plain"`` /
``"off"`` / ``quiet=True``.
"""

from __future__ import annotations

import html
import sys
import time
from typing import Any

SHOW_AFTER = 1.0  # seconds before a bar appears
_NOTEBOOK_INTERVAL = 0.25  # seconds between a notebook display's updates


class MapBar:
    """``advance(n)`` as results come, ``close()`` at the end (idempotent)."""

    def __init__(self, total: int | None, *, name: str, notebook: bool) -> None:
        self._total, self._name, self._notebook = total, name, notebook
        self._done = 0
        self._started = time.monotonic()
        self._shown = False
        self._progress: Any = None  # rich Progress
        self._task: Any = None
        self._handle: Any = None  # IPython display handle
        self._sent = 0.0

    def advance(self, items: int) -> None:
        self._done += items
        now = time.monotonic()
        if not self._shown:
            if now - self._started < SHOW_AFTER:
                return
            self._show()
        if self._progress is not None:
            self._progress.update(self._task, completed=self._done)
        elif self._handle is not None and now - self._sent >= _NOTEBOOK_INTERVAL:
            self._update()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=self._done)
            self._progress.stop()
            self._progress = None
        if self._handle is not None:
            self._update()
            self._handle = None

    def _show(self) -> None:
        self._shown = True
        if self._notebook:
            from IPython.display import display

            self._handle = display(self._bundle(), raw=True, display_id=True)  # type: ignore[no-untyped-call]
            self._sent = time.monotonic()
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(file=sys.stderr),
            transient=False,
        )
        self._task = self._progress.add_task(self._name, total=self._total, completed=self._done)
        self._progress.start()

    def _bundle(self) -> dict[str, str]:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = self._done / elapsed
        of = f"/{self._total}" if self._total is not None else ""
        text = f"{self._name}: {self._done}{of} items, {rate:,.0f}/s, {elapsed:.1f} s"
        bar = (
            f'<progress value="{self._done}" max="{self._total}"></progress> '
            if self._total
            else ""
        )
        return {"text/plain": text, "text/html": f"<div>{bar}{html.escape(text)}</div>"}

    def _update(self) -> None:
        self._handle.update(self._bundle(), raw=True)
        self._sent = time.monotonic()


def map_bar(mode: str, total: int | None, name: str, show: bool | None) -> MapBar | None:
    """A bar for a map under the pool's ``console`` mode, or None where none is drawn.
    ``show``: the map's ``progress=`` (None: where the console would draw a live display)."""
    from skyward.console import _colour
    from skyward.console import jupyter as _jupyter

    if show is False or (show is None and mode in ("off", "plain")):
        return None
    if _jupyter.in_jupyter():
        return MapBar(total, name=name, notebook=True)
    if show or mode == "rich" or _colour(sys.stderr):
        return MapBar(total, name=name, notebook=False)
    return None
