"""What one AWS pool made, and how it is unmade, replaced, and asked why a node was lost.

Resources are recorded the moment they exist (``provision`` calls ``adopt_*`` right after
each create call returns; the key pair's name, which we choose, even before), so a failure
or a Ctrl-C at any point releases what was made. A create call cut off in flight (Ctrl-C,
SIGTERM, a lost connection) may have made something whose id never came back: ``release``
sweeps for those twice, by key pair and by the allocation's own tag
(``skyward-allocation``), and names a sweep that failed. ``release`` is safe to call on a
half-made allocation, and more than once.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING

from skyward._errors import ProvisionError
from skyward._futures import Deadline
from skyward._phases import Reporter
from skyward.providers.aws import resources as ec2
from skyward.providers.aws.api import Api
from skyward.providers.base import Allocation, Node, ProvisionRequest, Resource
from skyward.providers.cloud import TAG_ALLOCATION
from skyward.providers.ssh.hosts import Access, HostTarget, open_hosts

if TYPE_CHECKING:
    from skyward.providers.ssh.connection import PoolKey


class AWSAllocation(Allocation):
    """A pool's key pair, security group and instances (node ``i`` runs on
    ``instances[i]``). Thread-safe: a replacement may race the pool's teardown."""

    def __init__(
        self,
        api: Api,
        request: ProvisionRequest,
        *,
        connect: str,
        username: str,
        release_timeout: float,
    ) -> None:
        super().__init__([])
        self.api = api
        self.request = request
        # Unique per provision: the key pair's and group's name, and the value of the
        # skyward-allocation tag on everything made (the sweep's handle).
        self.name = ec2.resource_name(request.pool)
        self.connect = connect
        self.username = username
        self.release_timeout = release_timeout
        self.access: Access | None = None
        self.host_key: str | None = None
        self.spec: ec2.LaunchSpec | None = None
        self.pool_key: PoolKey | None = None
        self.key_name: str | None = None
        self.group: str | None = None
        self.placement_groups: list[str] = []
        self.placing = False  # a placement group may have been asked for: sweep for them
        self.instances: list[str] = []  # by rank
        self._retired: list[str] = []  # replaced instances, terminated but not yet waited for
        self._released = False
        self._guard = threading.RLock()  # guards: every field above that changes

    # ── recording, as things come to exist ─────────────────────────────────────────────

    def adopt_pool_key(self, key: PoolKey) -> None:
        with self._guard:
            self.pool_key = key

    def adopt_key_pair(self, name: str) -> None:
        with self._guard:
            self.key_name = name
            self.resources.append(Resource("key pair", name))

    def adopt_group(self, group: str) -> None:
        with self._guard:
            self.group = group
            self.resources.append(Resource("security group", group))

    def adopt_placement_group(self, name: str) -> None:
        with self._guard:
            self.placement_groups.append(name)
            self.resources.append(Resource("placement group", name))

    def adopt_instances(self, ids: list[str]) -> None:
        with self._guard:
            self.instances += ids

    # ── the contract ───────────────────────────────────────────────────────────────────

    def release(self) -> None:
        """Terminate every instance and wait, then delete the group and the key pair.

        Idempotent. Raises ``ProvisionError`` naming what is left and the command that
        removes it, after trying everything.
        """
        with self._guard:
            if self._released:
                return
            self._released = True
            instances = [*self.instances, *self._retired]
            groups = [self.group] if self.group else []
            keys = [self.key_name] if self.key_name else []
            placed = list(self.placement_groups)
            pool_key = self.pool_key
        swept = ec2.sweep(
            self.api,
            key_name=keys[0] if keys else None,
            tag=(TAG_ALLOCATION, self.name),
            placement_groups=self.placing,
        )
        instances += [i for i in swept.instances if i not in instances]
        groups += [g for g in swept.groups if g not in groups]
        keys += [k for k in swept.key_pairs if k not in keys]
        placed += [g for g in swept.placement_groups if g not in placed]
        try:
            left = ec2.delete(
                self.api,
                instances=instances,
                groups=groups,
                key_pairs=keys,
                placement_groups=placed,
                timeout=self.release_timeout,
            )
        finally:
            if pool_key is not None:
                pool_key.delete()
        left += swept.failed
        if left:
            raise ProvisionError(
                f"pool {self.request.pool}: could not delete {', '.join(left)} in "
                f"{self.api.region}. Remove what is left with: {self.down_command}"
            )

    @property
    def down_command(self) -> str:
        return f"skyward down --pool {self.request.pool} --region {self.api.region}"

    @property
    def can_replace(self) -> bool:
        return self.spec is not None and self.access is not None

    def replace(self, rank: int, reporter: Reporter, deadline: Deadline) -> Node:
        """A new instance for node ``rank``, launched alike (same group, key, host key)."""
        with self._guard:
            if self._released or self.spec is None or self.access is None:
                raise ProvisionError(f"pool {self.request.pool} is closing; not replacing")
            old = self.instances[rank]
            old_node = self.nodes[rank] if rank < len(self.nodes) else None
            spec, access = self.spec, self.access
        if old_node is not None:
            old_node.close()
        reporter.phase(rank, "provisioning", f"replacing {old}")
        ec2.delete(self.api, instances=[old], timeout=0)  # do not wait for it
        new = ec2.launch(self.api, spec, 1)
        with self._guard:
            self._retired.append(old)
            self.instances[rank] = new[0]
            released = self._released
        if released:  # the pool closed meanwhile: release() may have missed the new one
            ec2.delete(self.api, instances=new, timeout=0)
            raise ProvisionError(f"pool {self.request.pool} is closing; not replacing")
        request = dataclasses.replace(self.request, nodes=1, deadline=deadline)
        (described,) = ec2.wait_running(self.api, new, deadline, public=self.connect == "public")
        (node,) = open_hosts([self.target(described)], access, request, reporter, ranks=[rank])
        with self._guard:
            if self._released:
                node.close()
                raise ProvisionError(f"pool {self.request.pool} is closing; not replacing")
            self.nodes[rank] = node
        return node

    def loss_reason(self, rank: int) -> str | None:
        """Why node ``rank``'s instance is gone, when EC2 says it is ("reclaimed by AWS
        (spot interruption)"); ``None`` while it still runs or if EC2 cannot be asked."""
        with self._guard:
            if rank >= len(self.instances):
                return None
            instance = self.instances[rank]
        try:
            answer = self.api.ec2.describe_instances(InstanceIds=[instance])
        except Exception:
            return None  # a message's detail; never a reason to fail the report of a loss
        for reservation in answer["Reservations"]:
            for described in reservation["Instances"]:
                if described["State"]["Name"] in ("pending", "running"):
                    return None
                return (
                    f"instance {instance} is {described['State']['Name']}: "
                    f"{ec2.describe_reason(described)}"
                )
        return None

    # ── helpers for provision ──────────────────────────────────────────────────────────

    def target(self, described: dict[str, object]) -> HostTarget:
        from skyward.providers.ssh.connection import Target

        private = str(described["PrivateIpAddress"])
        address = str(described["PublicIpAddress"]) if self.connect == "public" else private
        return HostTarget(
            Target(host=address, port=22, user=self.username),
            peer_address=private,
            host_key=self.host_key,
        )
