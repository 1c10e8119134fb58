"""What the user sees: workers' output labelled by node, and the pool's progress.

Worker output is split into lines and written as ``[node 3] text``, stdout to the client's
``sys.stdout`` and stderr to its ``sys.stderr``. The streams are looked up at every write, so
Jupyter's and pytest's replacements of ``sys.stdout`` receive it. Progress lines go to
stderr prefixed ``skyward:``; ``quiet=True`` silences progress but never worker output.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyward.providers.base import Phase


class Console:
    """Thread-safe: reader threads of every node write here at once."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.quiet = quiet
        self._lock = threading.Lock()  # guards: _partial and interleaving of whole lines
        self._partial: dict[tuple[int, str], bytes] = {}

    def output(self, node: int, stream: str, data: bytes) -> None:
        key = (node, stream)
        with self._lock:
            lines = (self._partial.pop(key, b"") + data).split(b"\n")
            rest = lines.pop()
            if rest:
                self._partial[key] = rest
            self._write(node, stream, lines)

    def flush(self) -> None:
        """Write out every line still missing its newline (the worker has ended)."""
        with self._lock:
            partial, self._partial = self._partial, {}
            for (node, stream), rest in sorted(partial.items()):
                self._write(node, stream, [rest])

    def _write(self, node: int, stream: str, lines: list[bytes]) -> None:
        if not lines:
            return
        target = sys.stdout if stream == "stdout" else sys.stderr
        text = "".join(
            f"[node {node}] {line.decode('utf-8', 'backslashreplace')}\n" for line in lines
        )
        try:
            target.write(text)
            target.flush()
        except (OSError, ValueError):
            pass  # the client's stream is closed (interpreter exit); nothing to show it on

    def phase(self, node: int, phase: Phase, detail: str = "") -> None:
        self.status(f"node {node} {phase}" + (f": {detail}" if detail else ""))

    def log(self, node: int, line: str) -> None:
        self.status(f"node {node} | {line}")

    def status(self, text: str) -> None:
        if self.quiet:
            return
        with self._lock:
            try:
                sys.stderr.write(f"skyward: {text}\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
