"""What one Azure pool made, and how it is unmade, replaced, and asked why a node was lost.

Everything a pool makes is in its resource group, and the group's name is recorded *before*
the group is created: a failure or a Ctrl-C at any point, even while a create request is in
flight, is cleaned up by deleting the group by name (deleting one that never came to be is
a no-op). The rest of the allocation's life (release once, replace, reach) is the shared
``CloudAllocation``'s.
"""

from __future__ import annotations

from typing import Any

from skyward._errors import ProvisionError
from skyward._futures import Deadline
from skyward._phases import Reporter
from skyward.providers.azure import resources as arm
from skyward.providers.azure.api import Api, failure_code
from skyward.providers.base import ProvisionRequest, Resource
from skyward.providers.cloud.allocation import CloudAllocation
from skyward.providers.ssh.hosts import HostTarget


class AzureAllocation(CloudAllocation[Api, arm.VmSpec]):
    """A pool's resource group and its VMs (node ``i`` runs on ``vms[i]``)."""

    def __init__(self, api: Api, request: ProvisionRequest, **options: Any) -> None:
        super().__init__(api, request, **options)
        self.group: str | None = None
        self.site: arm.Site | None = None
        self.vms: list[str] = []  # by rank
        self._replacements = 0

    # ── recording, as things come to exist ─────────────────────────────────────────────

    def adopt_group(self, name: str) -> None:
        """Called before the group is asked for: from then on, teardown deletes it."""
        with self._guard:
            self.group = name
            self.resources.append(Resource("resource group", name))

    def adopt_vms(self, site: arm.Site, spec: arm.VmSpec, names: list[str]) -> None:
        with self._guard:
            self.site, self.spec, self.vms = site, spec, list(names)

    # ── the contract ───────────────────────────────────────────────────────────────────

    def delete_all(self) -> list[str]:
        """Delete the resource group, which holds everything of the pool, and wait for it."""
        with self._guard:
            group = self.group
        why = (
            None
            if group is None
            else arm.delete_group(self.api, group, timeout=self.release_timeout)
        )
        return [] if why is None else [f"resource group {group} ({why})"]

    def remake(
        self, rank: int, spec: arm.VmSpec, reporter: Reporter, deadline: Deadline
    ) -> HostTarget:
        with self._guard:
            assert self.group is not None and self.site is not None
            group, site, old = self.group, self.site, self.vms[rank]
            self._replacements += 1
            name = f"node-{rank}-r{self._replacements}"
        reporter.phase(rank, "provisioning", f"replacing {old} with {name}")
        self._forget(group, old)
        arm.create_vm(self.api, group, site, spec, name, deadline)
        with self._guard:
            self.vms[rank] = name
            if self._released:  # its group's deletion takes the new VM too
                raise self.closing()
        return self.target(name)

    # ── the calls ``CloudAllocation.loss_reason`` makes ────────────────────────────────

    alive = frozenset({"", "running", "starting"})
    noun = "VM"

    def machine(self, rank: int) -> tuple[str, str] | None:
        if rank >= len(self.vms) or self.group is None or self.spec is None:
            return None
        return self.group, self.vms[rank]

    def status(self, place: str, name: str, *, quick: bool = False) -> tuple[str, Any] | None:
        try:
            view = self.api.compute.virtual_machines.instance_view(place, name)
        except Exception as exc:
            if failure_code(exc) in ("ResourceNotFound", "NotFound"):
                return None
            raise
        return power_state(view) or "", view

    def why_ended(self, place: str, name: str, described: Any) -> str:
        spot = self.spec is not None and self.spec.spot
        if spot:  # an evicted spot VM is deleted (eviction policy Delete)
            return "evicted by Azure" + (
                " (spot, eviction policy Delete)" if described is None else ""
            )
        if described is None:
            return "deleted (its idle watchdog, or the API or portal)"
        return "stopped from inside (the idle watchdog, a shutdown) or through the API"

    def target(self, vm: str) -> HostTarget:
        assert self.group is not None
        private, public = arm.addresses(self.api, self.group, vm)
        if self.connect == "public" and not public:
            raise ProvisionError(f"VM {vm} has no public address")
        return self.host_target(private, public)

    def _forget(self, group: str, vm: str) -> None:
        """Start deleting a lost VM (and what goes with it); do not wait."""
        try:
            self.api.compute.virtual_machines.begin_delete(group, vm, force_deletion=True)
        except Exception:
            pass  # gone already; the group's deletion at the end takes whatever is left


def power_state(view: Any) -> str | None:
    """``"running"``, ``"deallocated"``, ``"stopped"``... from an instance view."""
    for status in getattr(view, "statuses", None) or []:
        code = str(getattr(status, "code", "") or "")
        if code.startswith("PowerState/"):
            return code.split("/", 1)[1]
    return None
