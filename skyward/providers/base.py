"""The ``Provider`` contract: create machines, say how to start a worker on each, destroy them.

A provider never schedules work or speaks the worker protocol; the pool does both.

- ``provision(spec)`` returns ``spec.nodes`` nodes, all or nothing: if it fails part-way it
  destroys what it made before raising ``ProvisionError`` (or ``BootstrapError`` when the
  machines exist but cannot run the image). It is called once per pool.
- ``Node.spawn_worker(rank, env)`` starts ``python -m skyward.worker --node RANK`` on the node
  and returns its byte streams. The pool calls it again to replace a worker that died or was
  recycled after a timeout.
- ``terminate(nodes)`` destroys what ``provision`` made. Idempotent; the pool calls it in a
  ``finally`` on every path, after it has stopped the workers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from skyward._channel import Transport
    from skyward._pool import PoolSpec


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

    def spawn_worker(self, rank: int, env: Mapping[str, str]) -> Transport: ...


@runtime_checkable
class Provider(Protocol):
    """Creates and destroys nodes. See the module docstring for the contract."""

    @property
    def kind(self) -> str:
        """A short name for ``InstanceInfo.provider`` and messages: ``"local"``, ``"aws"``."""
        ...

    def provision(self, spec: PoolSpec) -> Sequence[Node]: ...

    def terminate(self, nodes: Sequence[Node]) -> None: ...
