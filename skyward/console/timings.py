"""Where a pool's start spent its time, per node and phase: ``ComputePool.timings()``.

::

    provider / pool ── phase(node, phase, detail) ──> Console ──> PhaseClock.record
                                                                  (node, stage, when)
    pool.timings() ─────────────────────────────────> PhaseClock.timings() -> StartTimings

A node's events become stages: ``boot`` (provisioning and connecting: the machine coming
up and SSH answering), the bootstrap's steps (``client.phases.BOOTSTRAP_STEPS``: ``cache``,
``uv``, ``python``, ``packages``, ``setup``, ``publish``, ``skyward``, and ``wait``: prepared,
waiting for the pool's other nodes; ``bootstrap`` for the script's own start), ``worker``
(the worker process started, Hello), ``plugins`` (the plugins' ``around_app`` entered)
until ``ready``. A stage lasts from its event to the node's
next one; the clock counts from the pool's start.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from skyward.client.phases import BOOTSTRAP_STEPS

# Stages in the order a start goes through them.
STAGES = ("boot", "bootstrap", *BOOTSTRAP_STEPS, "worker", "plugins")


def stage_of(phase: str, detail: str) -> str | None:
    """The stage an event begins (None: ``ready``, which ends the node's last stage)."""
    if phase in ("provisioning", "connecting", "waiting"):
        return "boot"
    if phase == "bootstrapping":
        return detail if detail in BOOTSTRAP_STEPS else "bootstrap"
    if phase == "starting":
        return "plugins" if detail.startswith("entering") else "worker"
    return None


@dataclass(frozen=True)
class NodeTimings:
    """One node's seconds per stage, in the order of ``STAGES`` (stages it skipped left out)."""

    node: int
    stages: tuple[tuple[str, float], ...]

    def __getitem__(self, stage: str) -> float:
        """Seconds in ``stage`` (0.0 if the node did not go through it)."""
        return sum(seconds for name, seconds in self.stages if name == stage)

    @property
    def bootstrap(self) -> float:
        """Seconds from connected to prepared: every bootstrap step but the ``wait`` for
        the pool's other nodes."""
        steps = ("bootstrap", *(s for s in BOOTSTRAP_STEPS if s != "wait"))
        return sum(seconds for name, seconds in self.stages if name in steps)


@dataclass(frozen=True)
class StartTimings(Mapping[str, float]):
    """A pool's start: a mapping of the pool's own steps (``provision``, ``workers``, a
    provider's ``warm.*``) and of every stage in ``STAGES`` to the slowest node's seconds
    in it (0.0: no node went through it); ``timings.nodes[0]["packages"]`` for one node,
    ``print(timings)`` for a table."""

    nodes: tuple[NodeTimings, ...]
    total: float  # seconds from the pool's start to ready (0.0 while it starts)
    steps: tuple[tuple[str, float], ...] = ()  # the pool's and the provider's own

    def with_steps(self, steps: Mapping[str, float]) -> StartTimings:
        return replace(self, steps=tuple(steps.items()))

    def __getitem__(self, name: str) -> float:
        for step, seconds in self.steps:
            if step == name:
                return seconds
        if name in STAGES:
            return max((node[name] for node in self.nodes), default=0.0)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        named = [step for step, _ in self.steps]
        return iter([*named, *(s for s in STAGES if s not in named)])

    def __len__(self) -> int:
        return len(list(iter(self)))

    @property
    def bootstrap(self) -> float:
        """The slowest node's bootstrap, in seconds."""
        return max((node.bootstrap for node in self.nodes), default=0.0)

    def __str__(self) -> str:
        used = [s for s in STAGES if any(node[s] for node in self.nodes)]
        rows = [["node", *used]]
        rows += [[str(n.node), *(f"{n[s]:.2f}" for s in used)] for n in self.nodes]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
        ]
        steps = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.steps)
        return "\n".join(
            [*lines, f"ready after {self.total:.2f} s" + (f"; {steps}" if steps else "")]
        )


class PhaseClock:
    """The events of one start. Not thread-safe: the console calls it under its lock."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.ended: float | None = None
        self._events: dict[int, list[tuple[float, str | None]]] = {}

    def record(self, node: int, phase: str, detail: str) -> None:
        events = self._events.setdefault(node, [])
        if events and events[-1][1] is None:
            return  # ready already: a later event (a worker replaced) is not the start's
        events.append((time.monotonic(), stage_of(phase, detail)))

    def end(self) -> None:
        self.ended = time.monotonic()

    def timings(self) -> StartTimings:
        now = time.monotonic()
        nodes = []
        for node, events in sorted(self._events.items()):
            seconds: dict[str, float] = {}
            marks = [(self.started, "boot"), *events]
            for (at, stage), (until, _) in zip(marks, [*marks[1:], (now, None)], strict=True):
                if stage is not None:
                    seconds[stage] = seconds.get(stage, 0.0) + max(0.0, until - at)
            ordered = tuple((s, seconds[s]) for s in STAGES if s in seconds)
            nodes.append(NodeTimings(node, ordered))
        total = 0.0 if self.ended is None else self.ended - self.started
        return StartTimings(tuple(nodes), total)
