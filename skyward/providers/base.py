"""The ``Provider`` contract: create machines, say how to start a worker on each, destroy them.

A provider never schedules work or speaks the worker protocol; the pool does both.

- ``provision(spec, reporter)`` returns ``spec.nodes`` nodes, all or nothing: if it fails
  part-way it destroys what it made before raising ``ProvisionError`` (or ``BootstrapError``
  when the machines exist but cannot run the image). It is called once per pool. It tells the
  ``reporter`` each node's phase (``provisioning``, ``connecting``, ``bootstrapping``) and
  the lines its bootstrap prints, so the user sees progress while machines come up.
- ``Node.spawn_worker(rank, env)`` starts ``python -m skyward.worker --node RANK`` on the node
  and returns its byte streams. The pool calls it again to replace a worker that died or was
  recycled after a timeout.
- ``check(spec)``, optional: provider-specific limits (``nodes`` more than the hosts there
  are), raised when the pool is built, before anything is created.
- ``terminate(nodes)`` destroys what ``provision`` made. Idempotent; the pool calls it in a
  ``finally`` on every path, after it has stopped the workers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from skyward._channel import Transport
    from skyward._pool import PoolSpec


# A node's phases, in order. Providers that create machines report ``provisioning``, remote
# ones ``connecting`` and ``bootstrapping`` (Local reports none); the pool the rest.
Phase = Literal["provisioning", "connecting", "bootstrapping", "starting", "ready"]


class Reporter(Protocol):
    """Where providers and the pool say what each node is doing. Thread-safe."""

    def phase(self, node: int, phase: Phase, detail: str = "") -> None: ...

    def log(self, node: int, line: str) -> None:
        """A line of a node's bootstrap output (not the worker's: that is ``Log``)."""
        ...


@runtime_checkable
class Node(Protocol):
    """One machine of a pool, as the provider made it."""

    @property
    def address(self) -> str:
        """Where the other nodes of the pool reach this one (``InstanceInfo.peers``)."""
        ...

    @property
    def accelerators(self) -> int:
        """Accelerator devices on this node (0 for CPU-only)."""
        ...

    @property
    def shares_files(self) -> bool:
        """True when the node sees the client's files (local processes): workers then import
        the client's own modules by path. Otherwise they are sent by value."""
        ...

    def spawn_worker(self, rank: int, env: Mapping[str, str]) -> Transport: ...


@runtime_checkable
class Provider(Protocol):
    """Creates and destroys nodes. See the module docstring for the contract."""

    @property
    def kind(self) -> str:
        """A short name for ``InstanceInfo.provider`` and messages: ``"local"``, ``"aws"``."""
        ...

    def provision(self, spec: PoolSpec, reporter: Reporter) -> Sequence[Node]: ...

    def terminate(self, nodes: Sequence[Node]) -> None: ...
