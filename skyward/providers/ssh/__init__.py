"""``SSH(hosts=[...])``: nodes are machines you already have, reached over SSH.

The provider is its configuration and "hosts → targets"; reaching them, bootstrapping,
uploading skyward and running workers is ``hosts``, shared with the cloud providers; the
options of the link and the environment are ``shell.AccessOptions``, shared with
``sky.Slurm``. It creates nothing, so ``terminate`` only stops the workers and closes the
connections: the hosts keep only Skyward's cache directory (``workdir``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from skyward.client.extras import check
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.base import (
    Allocation,
    Inventory,
    Node,
    ProvisionRequest,
    refuse_keep_warm,
    refuse_spot,
)
from skyward.providers.shell import AccessOptions
from skyward.providers.ssh.connection import Target
from skyward.providers.ssh.hosts import HostTarget, open_hosts


class SSH(AccessOptions):
    """Run the pool's nodes on existing hosts over SSH.

    - ``hosts``: ``"[user@]host[:port]"``; node ``i`` is ``hosts[i]``, and a pool may use
      fewer nodes than there are hosts.
    - ``key``: a private key file; by default the SSH agent's keys and ``~/.ssh/id_*``.
    - ``known_hosts``: the file host keys are checked against (default
      ``~/.ssh/known_hosts``). An unknown host is refused unless ``accept_new_hosts=True``,
      which adds it to that file; a changed key is always refused.
    - ``python``: the interpreter the environment is made from; by default ``python3.X`` or
      ``python3`` of the client's minor version, found on the host's ``PATH``, else a
      uv-managed CPython of that version (``Image.python_mirror``: where from).
    - ``workdir``: Skyward's directory on each host: environments, the uploaded package,
      the workers' working directory. The only thing a pool leaves behind.
    - ``peer_addresses``: where the hosts reach each other (``head_addr``, ``peers``), when
      that differs from the address this machine uses (a bastion, a public IP).
    - ``connect_timeout``; ``keepalive`` (seconds between keepalives) and ``link_timeout``
      (unacknowledged data for this long ends the link, and the workers on it are lost).
    """

    # An autoscaling pool starts on the first hosts and takes the next ones as it grows.
    grows: ClassVar[bool] = True

    hosts: tuple[str, ...] = Field(min_length=1)
    peer_addresses: tuple[str, ...] | None = None

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        for host in hosts:
            Target.parse(host)
        if len(set(hosts)) != len(hosts):
            raise ValueError("a host is listed more than once")
        return hosts

    @model_validator(mode="after")
    def _peers(self) -> SSH:
        if self.peer_addresses is not None and len(self.peer_addresses) != len(self.hosts):
            raise ValueError(
                f"peer_addresses has {len(self.peer_addresses)} entries for "
                f"{len(self.hosts)} hosts; give one per host, in the same order"
            )
        return self

    @property
    def kind(self) -> str:
        return "ssh"

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is touched. The hosts are what
        they are: ``vcpus`` and ``memory_gb`` are not checked, and ``allocation="spot"`` is
        refused."""
        check("paramiko", feature="sky.SSH")
        refuse_spot(request, "SSH runs on hosts you already have")
        refuse_keep_warm(request, "SSH runs on hosts you already have, which stay when it closes")
        most = request.max_nodes or request.nodes
        if most > len(self.hosts):
            raise ValueError(
                f"the pool asks for {'up to ' if request.max_nodes else ''}{most} nodes but "
                f"SSH has {len(self.hosts)} host(s); list more hosts or ask for fewer nodes"
            )

    def targets(self, ranks: Sequence[int]) -> list[HostTarget]:
        """Hosts ``ranks`` (node ``i`` is ``hosts[i]``), as the shared layer takes them."""
        peers = self.peer_addresses
        return [
            HostTarget(Target.parse(self.hosts[rank]), peer_address=peers[rank] if peers else None)
            for rank in ranks
        ]

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        self.check(request)
        nodes = open_hosts(self.targets(range(request.nodes)), self.access, request, reporter)
        return SSHAllocation(self, request, nodes)

    def inventory(self) -> Inventory | None:
        return None  # it creates nothing


class SSHAllocation(Allocation):
    """The hosts a pool uses: an autoscaling pool reaches the next ones as it grows, and
    lets the last ones go (their workers stopped, the connection closed) as it shrinks."""

    def __init__(self, ssh: SSH, request: ProvisionRequest, nodes: Sequence[Node]) -> None:
        super().__init__(nodes)
        self._ssh = ssh
        self._request = request

    def grow(self, ranks: Sequence[int], reporter: Reporter, deadline: Deadline) -> list[Node]:
        request = dataclasses.replace(self._request, nodes=len(ranks), deadline=deadline)
        targets = self._ssh.targets(ranks)
        nodes = open_hosts(targets, self._ssh.access, request, reporter, ranks=ranks)
        adopted: list[Node] = []
        try:
            for node in nodes:
                self.adopt(node)
                adopted.append(node)
        except BaseException:
            for node in nodes:
                if node not in adopted:
                    node.close()
            raise
        return adopted

    def shrink(self, rank: int) -> None:
        node = self.drop(rank)
        if node is not None:
            node.close()
