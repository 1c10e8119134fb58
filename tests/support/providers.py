"""Providers made for the tests, each a few lines on top of the real contract.

- ``TestHosts`` "creates" machines by handing out this run's SSH test hosts, and reaches
  them through the shared SSH-host layer exactly as a cloud does: each machine's host key is
  given in advance (no known_hosts), the pool's own key logs in, and a booting machine is
  waited for. It needs nothing else, which is the point of ``providers.ssh.hosts``.
- ``Preemptible`` is local nodes whose machines a test can take away, and replaces them.
- ``Slow`` wraps another provider and takes its time (or fails) at chosen moments, to test
  what the pool does around ``provision``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.base import Allocation, Inventory, Node, Provider, ProvisionRequest
from skyward.providers.local import LocalNode
from skyward.providers.ssh.connection import Target
from skyward.providers.ssh.hosts import Access, HostTarget, open_hosts
from support.sshhosts import Hosts


@dataclass(eq=False)
class TestHosts:
    """Machines "made" from the SSH test hosts; ``made`` keeps each request's tags."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    hosts: Hosts
    index_url: str | None = None
    boot_timeout: float = 5.0
    made: list[dict[str, str]] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "test-hosts"

    def check(self, request: ProvisionRequest) -> None:
        if request.nodes > len(self.hosts.hosts):
            raise ValueError(f"only {len(self.hosts.hosts)} test hosts")

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        self.made.append(dict(request.tags))
        targets = [
            HostTarget(
                Target(host.address, 22, "skytest"),
                host_key=f"ssh-ed25519 {host.public_host_key()}",
            )
            for host in self.hosts.hosts[: request.nodes]
        ]
        for rank in range(request.nodes):
            reporter.phase(rank, "provisioning", "handing out a test host")
        access = Access(key_file=self.hosts.client_key, boot_timeout=self.boot_timeout)
        return Allocation(open_hosts(targets, access, request, reporter))

    def inventory(self) -> Inventory | None:
        return None


@dataclass(eq=False)
class Slow:
    """``inner``'s provision after ``delay`` seconds of work that ignores cancellation (an
    SDK call that cannot be interrupted), or of polling that honours it. ``returned`` keeps
    what provision gave the pool, to check it was terminated."""

    inner: Provider
    delay: float = 1.0
    honour_cancel: bool = False
    fail: Callable[[], BaseException] | None = None
    started: threading.Event = field(default_factory=threading.Event)
    returned: list[Allocation] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "slow"

    def check(self, request: ProvisionRequest) -> None:
        self.inner.check(request)

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        self.started.set()
        end = time.monotonic() + self.delay
        while time.monotonic() < end:
            if self.honour_cancel:
                request.deadline.check("slow provider")
            time.sleep(0.02)
        if self.fail is not None:
            raise self.fail()
        allocation = self.inner.provision(request, reporter)
        self.returned.append(allocation)
        return allocation

    def inventory(self) -> Inventory | None:
        return None


class _LosableNode:
    """A local node whose machine can be "lost": from then on it starts nothing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lost = False
        self.address = inner.address
        self.accelerators = inner.accelerators
        self.shares_files = inner.shares_files

    def spawn_worker(self, rank: int, env: Any) -> Any:
        if self.lost:
            raise ProvisionError(f"node {rank}: the machine is gone")
        return self.inner.spawn_worker(rank, env)

    def close(self) -> None:
        self.inner.close()


class _Replaceable(Allocation):
    def __init__(self, nodes: list[_LosableNode], replaced: list[int]) -> None:
        super().__init__(nodes)
        self._replaced = replaced

    @property
    def can_replace(self) -> bool:
        return True

    def replace(self, rank: int, reporter: Reporter, deadline: Deadline) -> Node:
        self.nodes[rank].close()
        self.nodes[rank] = _LosableNode(LocalNode(sys.executable))
        self._replaced.append(rank)
        return self.nodes[rank]


@dataclass(eq=False)
class Preemptible:
    """Local nodes whose machines the test can take away (``lose``), as a cloud reclaims a
    spot VM; the allocation replaces a lost machine with a new one."""

    replaced: list[int] = field(default_factory=list)
    allocations: list[_Replaceable] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "preemptible"

    def check(self, request: ProvisionRequest) -> None:
        pass

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        nodes = [_LosableNode(LocalNode(sys.executable)) for _ in range(request.nodes)]
        self.allocations.append(_Replaceable(nodes, self.replaced))
        return self.allocations[-1]

    def lose(self, rank: int) -> None:
        node = self.allocations[-1].nodes[rank]
        assert isinstance(node, _LosableNode)
        node.lost = True

    def inventory(self) -> Inventory | None:
        return None
