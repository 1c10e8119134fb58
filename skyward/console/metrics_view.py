"""The live metrics line: one compact line per node at the bottom of a terminal while the
pool runs, redrawn as samples come (rich), with the workers' output scrolling above it::

    node 0  cpu  23%  mem 41%  gpu 87%  gpu mem 12.3 GB  net ↓1.2 ↑0.3 MB/s
    node 1  cpu  19%  mem 40%  gpu 85%  gpu mem 12.1 GB  net ↓1.1 ↑0.3 MB/s

It appears with the first sample once the start-up table is gone, on a terminal (a pipe or
a file gets no redrawn lines; ``pool.metrics()`` and ``metrics.jsonl`` have them all), and
leaves its last state on the screen when the pool closes. In Jupyter the same lines are an
HTML table in the cell that started the pool, updated in place (``JupyterMetrics``).
"""

from __future__ import annotations

import html
import sys
import time
from typing import Any


def line(values: dict[str, float]) -> str:
    """A node's latest values, compact: what each metric is, in a few characters."""
    parts = []
    if "cpu" in values:
        parts.append(f"cpu {values['cpu']:3.0f}%")
    if "mem" in values:
        parts.append(f"mem {values['mem']:3.0f}%")
    elif "mem_used_mb" in values:
        parts.append(f"mem {values['mem_used_mb'] / 1024:.1f} GB")
    gpus = sorted(k for k in values if k.startswith("gpu_util_"))
    if gpus:
        parts.append("gpu " + " ".join(f"{values[k]:.0f}%" for k in gpus))
    memory = [v for k, v in values.items() if k.startswith("gpu_mem_mb_")]
    total = [v for k, v in values.items() if k.startswith("gpu_mem_total_mb_")]
    if memory:
        of = f"/{sum(total) / 1024:.0f}" if total else ""
        parts.append(f"gpu mem {sum(memory) / 1024:.1f}{of} GB")
    temps = [v for k, v in values.items() if k.startswith("gpu_temp_")]
    if temps:
        parts.append(f"{max(temps):.0f}°C")
    if "net_rx_mbps" in values or "net_tx_mbps" in values:
        parts.append(
            f"net ↓{values.get('net_rx_mbps', 0.0):.1f} ↑{values.get('net_tx_mbps', 0.0):.1f} MB/s"
        )
    known = {"cpu", "mem", "mem_used_mb", "net_rx_mbps", "net_tx_mbps"}
    for name, value in sorted(values.items()):
        if name not in known and not name.startswith(("gpu_", "mem_")):
            parts.append(f"{name} {value:g}")
    return "  ".join(parts)


class RichMetrics:
    """The lines on a terminal's stderr. Not thread-safe: the console's lock guards it."""

    def __init__(self) -> None:
        from rich.console import Console as RichConsole
        from rich.live import Live

        self._latest: dict[int, dict[str, float]] = {}
        self._console = RichConsole(file=sys.stderr)
        self._live = Live(
            get_renderable=self._render,
            console=self._console,
            refresh_per_second=4,
            transient=False,
        )
        self._live.start()

    def update(self, node: int, values: dict[str, float]) -> None:
        # A value read less often (GPU every 3 s) stays shown between its samples.
        self._latest[node] = {**self._latest.get(node, {}), **values}

    def _render(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid(padding=(0, 2))
        for node, values in sorted(self._latest.items()):
            grid.add_row(Text(f"node {node}", style="bold"), Text(line(values), style="cyan"))
        return grid

    def print_above(self, text: str) -> bool:
        from rich.text import Text

        self._console.print(Text.from_ansi(text.rstrip("\n")), soft_wrap=True, highlight=False)
        return True

    def stop(self) -> None:
        self._live.stop()


class JupyterMetrics:
    """The lines as a display in the notebook, updated in place by its display id.

    The display is made by the thread that started the pool, while its cell runs (a display
    sent from a cell that has finished is dropped by the frontend), as a placeholder until the
    first sample; each sample then updates it, at most every ``_MIN_INTERVAL`` seconds (each
    update is a message to the frontend), and once more when the pool closes. An update goes
    out under whichever cell runs then, and the frontend applies it by id to the display in
    the cell that started the pool. Not thread-safe: the console's lock guards it."""

    _MIN_INTERVAL = 0.5

    def __init__(self) -> None:
        from IPython import display as ipython

        self._latest: dict[int, dict[str, float]] = {}
        self._sent = 0.0
        display: Any = ipython.display
        self._handle: Any = display(
            {"text/plain": "live metrics: waiting for the first sample"}, raw=True, display_id=True
        )

    def update(self, node: int, values: dict[str, float]) -> None:
        self._latest[node] = {**self._latest.get(node, {}), **values}
        if time.monotonic() - self._sent >= self._MIN_INTERVAL:
            self._show()

    def _show(self) -> None:
        rows = sorted(self._latest.items())
        text = "\n".join(f"node {node}  {line(values)}" for node, values in rows)
        cells = "".join(
            f"<tr><td><b>node {node}</b></td><td>{html.escape(line(values))}</td></tr>"
            for node, values in rows
        )
        self._handle.update({"text/plain": text, "text/html": f"<table>{cells}</table>"}, raw=True)
        self._sent = time.monotonic()

    def print_above(self, text: str) -> bool:
        return False  # the display has its own output area; prints go to their cells

    def stop(self) -> None:
        if self._latest:
            self._show()
