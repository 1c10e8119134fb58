"""What one AWS pool made, and how it is unmade, replaced, and asked why a node was lost.

Resources are recorded the moment they exist (``provision`` calls ``record`` right after
each create call returns; the key pair's name, which we choose, even before), so a failure
or a Ctrl-C at any point releases what was made. A create call cut off in flight (Ctrl-C,
SIGTERM, a lost connection) may have made something whose id never came back: ``release``
sweeps for those twice, by key pair and by the allocation's own tag
(``skyward-allocation``), and names a sweep that failed. The rest of the allocation's life
(release once, replace, reach) is the shared ``CloudAllocation``'s.
"""

from __future__ import annotations

from typing import Any

from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.aws import resources as ec2
from skyward.providers.aws.api import Api
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud.allocation import TAG_ALLOCATION, CloudAllocation
from skyward.providers.ssh.hosts import HostTarget


class AWSAllocation(CloudAllocation[Api, ec2.LaunchSpec]):
    """A pool's key pair, security group, placement groups and instances (node ``i`` runs
    on ``instances[i]``)."""

    def __init__(self, api: Api, request: ProvisionRequest, **options: Any) -> None:
        super().__init__(api, request, **options)
        self.scope = (f" in {api.region}", f"--region {api.region}")
        # Unique per provision: the key pair's and group's name, and the value of the
        # skyward-allocation tag on everything made (the sweep's handle).
        self.name = ec2.resource_name(request.pool)
        self.placing = False  # a placement group may have been asked for: sweep for them
        self.instances: list[str] = []  # by rank
        # The VPC and the subnet of each zone it may use, found before anything is made.
        self.vpc = ""
        self.subnets: dict[str, str] = {}
        self._retired: list[str] = []  # replaced instances, terminated but not yet waited for

    # ── recording, as things come to exist ─────────────────────────────────────────────

    def chose(self, offer: Any, launched: Any) -> None:
        """``launched``: the launch spec that took the pool, which a replacement reuses."""
        super().chose(offer, launched)
        self.spec = launched

    def adopt_instances(self, ids: list[str]) -> None:
        with self._guard:
            self.instances += ids

    # ── the contract ───────────────────────────────────────────────────────────────────

    def delete_all(self) -> list[str]:
        """Terminate every instance and wait, then delete the groups and the key pair,
        after sweeping for what a create cut off in flight made."""
        with self._guard:
            instances = [*self.instances, *self._retired]
        groups, keys = self.recorded("security group"), self.recorded("key pair")
        placed = self.recorded("placement group")
        swept = ec2.sweep(
            self.api,
            key_name=keys[0] if keys else None,
            tag=(TAG_ALLOCATION, self.name),
            placement_groups=self.placing,
        )
        left = ec2.delete(
            self.api,
            instances=[*instances, *(i for i in swept.instances if i not in instances)],
            groups=[*groups, *(g for g in swept.groups if g not in groups)],
            key_pairs=[*keys, *(k for k in swept.key_pairs if k not in keys)],
            placement_groups=[*placed, *(g for g in swept.placement_groups if g not in placed)],
            timeout=self.release_timeout,
        )
        return left + swept.failed

    def remake(
        self, rank: int, spec: ec2.LaunchSpec, reporter: Reporter, deadline: Deadline
    ) -> HostTarget:
        with self._guard:
            old = self.instances[rank]
        reporter.phase(rank, "provisioning", f"replacing {old}")
        ec2.delete(self.api, instances=[old], timeout=0)  # do not wait for it
        new = ec2.launch(self.api, spec, 1)
        with self._guard:
            self._retired.append(old)
            self.instances[rank] = new[0]
            released = self._released
        if released:  # the pool closed meanwhile: release() may have missed the new one
            ec2.delete(self.api, instances=new, timeout=0)
            raise self.closing()
        (described,) = ec2.wait_running(self.api, new, deadline, public=self.connect == "public")
        return self.target(described)

    # ── the calls ``CloudAllocation.loss_reason`` makes ────────────────────────────────

    alive = frozenset({"pending", "running"})

    def machine(self, rank: int) -> tuple[str, str] | None:
        return (self.api.region, self.instances[rank]) if rank < len(self.instances) else None

    def status(self, place: str, name: str, *, quick: bool = False) -> tuple[str, Any]:
        answer = self.api.ec2.describe_instances(InstanceIds=[name])
        found = [i for r in answer["Reservations"] for i in r["Instances"]]
        if not found:
            raise LookupError(name)  # not seen yet: no reason to report
        return found[0]["State"]["Name"], found[0]

    def why_ended(self, place: str, name: str, described: Any) -> str:
        return ec2.describe_reason(described)

    def target(self, described: dict[str, object]) -> HostTarget:
        public = described.get("PublicIpAddress")
        return self.host_target(str(described["PrivateIpAddress"]), str(public or "") or None)
