"""What a node is doing while a pool starts, and who is told: the words providers and the pool
share with the console. A leaf module, so providers never import the display."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

# A node's phases, in order. Providers that create machines report ``provisioning``, remote
# ones ``connecting`` and ``bootstrapping`` (Local reports none); the pool the rest.
Phase = Literal["provisioning", "connecting", "bootstrapping", "starting", "ready"]

# The steps of ``bootstrapping`` a remote node, in order: reported as that phase again with the
# step as its detail (``phase(node, "bootstrapping", "uv")``), shown in the progress display
# and timed by ``ComputePool.timings()``. ``cache``: an environment looked for in the image's
# cache and unpacked; ``publish``: the one just built, uploaded to it; ``skyward``: this
# skyward package, the includes, the GPUs counted, the volumes mounted; ``wait``: this node is
# prepared, and waits for the pool's other nodes.
BOOTSTRAP_STEPS = ("cache", "uv", "python", "packages", "setup", "publish", "skyward", "wait")


@dataclass(frozen=True)
class Choice:
    """What a cloud pool picked, before anything is created: what, where, how many, at what
    estimated price. The progress display shows it under the pool's title."""

    nodes: int
    machine: str  # the machine type: "p4d.24xlarge"
    hardware: str  # "8x A100 40 GB, 96 vCPUs, 1152 GB" or "4 vCPUs, 16 GB"
    where: str  # "us-east-1 (us-east-1a)"
    market: str  # "on-demand" or "spot"
    hourly: float | None  # one machine, USD per hour; None: unknown
    fallbacks: int = 0  # other places (zone, type, market) to try if this one has no capacity

    @property
    def pool_hourly(self) -> float | None:
        return None if self.hourly is None else self.hourly * self.nodes

    def estimate(self) -> str:
        """``"about $4.60/h for the pool (2 x $2.30)"``, or that no price is known."""
        if self.hourly is None:
            return f"no price known for {self.machine} ({self.market}) here"
        each = f"{self.nodes} x ${self.hourly:.4g}"
        return f"about ${self.hourly * self.nodes:.2f}/h for the pool ({each})"

    def line(self) -> str:
        others = self.fallbacks
        fallback = f"; then {others} other place(s) if it has no capacity" if others else ""
        return (
            f"{self.nodes} x {self.machine} ({self.hardware}) {self.market} in {self.where}: "
            f"{self.estimate()}{fallback}"
        )


class Reporter(Protocol):
    """Where providers and the pool say what each node is doing. Thread-safe."""

    def phase(self, node: int, phase: Phase, detail: str = "") -> None: ...

    def log(self, node: int, line: str) -> None:
        """A line of a node's bootstrap output (not the worker's: that is ``Log``)."""
        ...

    def status(self, line: str) -> None:
        """A line about the pool as a whole (a resource made, a wait that is taking long)."""
        ...

    def chosen(self, choice: Choice) -> None:
        """A cloud pool picked its machines (said once, before anything is created)."""
        ...


class SilentReporter:
    """A ``Reporter`` that tells no one (``skyward down``, tests)."""

    def phase(self, node: int, phase: Phase, detail: str = "") -> None:
        pass

    def log(self, node: int, line: str) -> None:
        pass

    def status(self, line: str) -> None:
        pass

    def chosen(self, choice: Choice) -> None:
        pass
