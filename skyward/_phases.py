"""What a node is doing while a pool starts, and who is told: the words providers and the pool
share with the console. A leaf module, so providers never import the display."""

from __future__ import annotations

from typing import Literal, Protocol

# A node's phases, in order. Providers that create machines report ``provisioning``, remote
# ones ``connecting`` and ``bootstrapping`` (Local reports none); the pool the rest.
Phase = Literal["provisioning", "connecting", "bootstrapping", "starting", "ready"]


class Reporter(Protocol):
    """Where providers and the pool say what each node is doing. Thread-safe."""

    def phase(self, node: int, phase: Phase, detail: str = "") -> None: ...

    def log(self, node: int, line: str) -> None:
        """A line of a node's bootstrap output (not the worker's: that is ``Log``)."""
        ...

    def status(self, line: str) -> None:
        """A line about the pool as a whole (a resource made, a wait that is taking long)."""
        ...


class SilentReporter:
    """A ``Reporter`` that tells no one (``skyward down``, tests)."""

    def phase(self, node: int, phase: Phase, detail: str = "") -> None:
        pass

    def log(self, node: int, line: str) -> None:
        pass

    def status(self, line: str) -> None:
        pass
