"""A ``Reporter`` double that keeps what providers and the pool tell it."""

from __future__ import annotations

import threading

from skyward.client.phases import Choice


class Recorder:
    """Phases, bootstrap lines and status lines, in the order they came. Thread-safe."""

    def __init__(self) -> None:
        self.phases: list[tuple[int, str, str]] = []
        self.lines: list[tuple[int, str]] = []
        self.statuses: list[str] = []
        self.choices: list[Choice] = []
        self._lock = threading.Lock()

    def phase(self, node: int, phase: str, detail: str = "") -> None:
        with self._lock:
            self.phases.append((node, phase, detail))

    def log(self, node: int, line: str) -> None:
        with self._lock:
            self.lines.append((node, line))

    def status(self, line: str) -> None:
        with self._lock:
            self.statuses.append(line)

    def chosen(self, choice: Choice) -> None:
        """Kept as a choice, and as the status line a console would print."""
        with self._lock:
            self.choices.append(choice)
            self.statuses.append(choice.line())

    def text(self, node: int) -> str:
        return "\n".join(line for n, line in self.lines if n == node)

    def phases_of(self, node: int) -> list[str]:
        return [phase for n, phase, _ in self.phases if n == node]
