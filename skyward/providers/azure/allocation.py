"""What one Azure pool made, and how it is unmade: the calls on one VM that the shared
``InstanceAllocation`` makes, replaces and asks why it was lost, and the pool's group.

Everything a pool makes is in its resource group, and the group's name is recorded *before*
the group is created: a failure or a Ctrl-C at any point, even while a create request is in
flight, is cleaned up by deleting the group by name (deleting one that never came to be is
a no-op).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.azure import resources as arm
from skyward.providers.azure.api import REFUSALS, Api, failure_code
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud.capacity import failover
from skyward.providers.cloud.instances import InstanceAllocation
from skyward.providers.ssh.hosts import HostTarget


class AzureAllocation(InstanceAllocation[Api, arm.VmSpec]):
    """A pool's resource group, its network per location (``sites``) and its VMs (node
    ``i`` runs on ``instances[i]``, a (location, name))."""

    alive = frozenset({"", "running", "starting"})
    running_status = "running"
    ended = frozenset()
    noun = "VM"

    def __init__(self, api: Api, request: ProvisionRequest, **options: Any) -> None:
        super().__init__(api, request, **options)
        self.group: str | None = None
        self.sites: dict[str, arm.Site] = {}
        # The VM sizes Azure offers, per location: lower-cased name -> capabilities, read
        # before anything is made; a VM's spec is made from its size's.
        self.skus: dict[str, dict[str, dict[str, str]]] = {}

    def adopt_group(self, name: str) -> None:
        """Called before the group is asked for: from then on, teardown deletes it."""
        self.group = self.record("resource group", name)

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

    # ── the calls on one VM ────────────────────────────────────────────────────────────

    def start(self, place: str, name: str, spec: arm.VmSpec, deadline: Deadline) -> Any:
        """Its public IP, NIC and VM, waited for (``finish`` has nothing left to do)."""
        assert self.group is not None
        group, site = self.group, self.sites[place]
        # A refusal no other place changes (a quota, a permission) stops the pool; the
        # group's deletion cleans up.
        return failover(
            lambda: arm.create_vm(self.api, group, site, spec, name, deadline),
            lambda exc: REFUSALS.refusal(failure_code(exc), spot=spec.spot),
        )

    def running(self, place: str, names: Sequence[str], deadline: Deadline) -> list[Any]:
        return list(names)  # a VM's create ends once it runs

    def status(self, place: str, name: str, *, quick: bool = False) -> tuple[str, Any] | None:
        try:
            view = self.api.compute.virtual_machines.instance_view(str(self.group), name)
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

    def delete_machines(self, machines: Sequence[tuple[str, str]], deadline: Deadline) -> list[str]:
        """Delete VMs and then their NICs and public IPs (a VM that failed to create may
        have left them)."""
        assert self.group is not None
        try:
            arm.delete_vms(self.api, self.group, [name for _, name in machines], deadline)
        except ProvisionError as exc:
            return [str(exc)]
        return []

    def forget(self, place: str, name: str) -> None:
        assert self.group is not None
        try:
            self.api.compute.virtual_machines.begin_delete(self.group, name, force_deletion=True)
        except Exception:
            pass  # gone already; the group's deletion at the end takes whatever is left

    def target(self, described: Any) -> HostTarget:
        assert self.group is not None
        private, public = arm.addresses(self.api, self.group, str(described))
        if self.connect == "public" and not public:
            raise ProvisionError(f"VM {described} has no public address")
        return self.host_target(private, public)


def power_state(view: Any) -> str | None:
    """``"running"``, ``"deallocated"``, ``"stopped"``... from an instance view."""
    for status in getattr(view, "statuses", None) or []:
        code = str(getattr(status, "code", "") or "")
        if code.startswith("PowerState/"):
            return code.split("/", 1)[1]
    return None
