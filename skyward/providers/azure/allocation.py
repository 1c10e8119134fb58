"""What one Azure pool made, and how it is unmade, replaced, and asked why a node was lost.

Everything a pool makes is in its resource group, and the group's name is recorded *before*
the group is created: a failure or a Ctrl-C at any point, even while a create request is in
flight, is cleaned up by deleting the group by name (deleting one that never came to be is
a no-op). ``release`` is safe on a half-made allocation, and more than once.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

from skyward._errors import ProvisionError
from skyward._futures import Deadline
from skyward._phases import Reporter
from skyward.providers.azure import resources as arm
from skyward.providers.azure.api import Api, failure_code
from skyward.providers.base import Allocation, Node, ProvisionRequest, Resource
from skyward.providers.ssh.hosts import Access, HostTarget, open_hosts

if TYPE_CHECKING:
    from skyward.providers.ssh.connection import PoolKey


class AzureAllocation(Allocation):
    """A pool's resource group and its VMs (node ``i`` runs on ``vms[i]``). Thread-safe: a
    replacement may race the pool's teardown."""

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
        self.connect = connect
        self.username = username
        self.release_timeout = release_timeout
        self.access: Access | None = None
        self.host_key: str | None = None
        self.pool_key: PoolKey | None = None
        self.group: str | None = None
        self.site: arm.Site | None = None
        self.spec: arm.VmSpec | None = None
        self.vms: list[str] = []  # by rank
        self._replacements = 0
        self._released = False
        self._guard = threading.RLock()  # guards: every field above that changes

    # ── recording, as things come to exist ─────────────────────────────────────────────

    def adopt_pool_key(self, key: PoolKey) -> None:
        with self._guard:
            self.pool_key = key

    def adopt_group(self, name: str) -> None:
        """Called before the group is asked for: from then on, teardown deletes it."""
        with self._guard:
            self.group = name
            self.resources.append(Resource("resource group", name))

    def adopt_vms(self, site: arm.Site, spec: arm.VmSpec, names: list[str]) -> None:
        with self._guard:
            self.site, self.spec, self.vms = site, spec, list(names)

    # ── the contract ───────────────────────────────────────────────────────────────────

    def release(self) -> None:
        """Delete the resource group, which holds everything of the pool, and wait for it.

        Idempotent. Raises ``ProvisionError`` naming the group and the command that removes
        it, if Azure did not finish deleting it within ``release_timeout``.
        """
        with self._guard:
            if self._released:
                return
            self._released = True
            group, pool_key = self.group, self.pool_key
        try:
            why = (
                None
                if group is None
                else arm.delete_group(self.api, group, timeout=self.release_timeout)
            )
        finally:
            if pool_key is not None:
                pool_key.delete()
        if why is not None:
            raise ProvisionError(
                f"pool {self.request.pool}: could not delete resource group {group} ({why}). "
                f"Remove it with: skyward down --pool {self.request.pool}"
            )

    @property
    def can_replace(self) -> bool:
        return self.spec is not None and self.access is not None

    def replace(self, rank: int, reporter: Reporter, deadline: Deadline) -> Node:
        """A new VM for node ``rank``, made alike (same site, size, key, host key)."""
        with self._guard:
            if self._released or self.spec is None or self.access is None:
                raise ProvisionError(f"pool {self.request.pool} is closing; not replacing")
            assert self.group is not None and self.site is not None
            group, site, spec, access = self.group, self.site, self.spec, self.access
            old = self.vms[rank]
            old_node = self.nodes[rank] if rank < len(self.nodes) else None
            self._replacements += 1
            name = f"node-{rank}-r{self._replacements}"
        if old_node is not None:
            old_node.close()
        reporter.phase(rank, "provisioning", f"replacing {old} with {name}")
        self._forget(group, old)
        arm.create_vm(self.api, group, site, spec, name, deadline)
        with self._guard:
            self.vms[rank] = name
            released = self._released
        if released:  # the pool closed meanwhile: its group's deletion takes the new VM too
            raise ProvisionError(f"pool {self.request.pool} is closing; not replacing")
        request = dataclasses.replace(self.request, nodes=1, deadline=deadline)
        (node,) = open_hosts([self.target(name)], access, request, reporter, ranks=[rank])
        with self._guard:
            if self._released:
                node.close()
                raise ProvisionError(f"pool {self.request.pool} is closing; not replacing")
            self.nodes[rank] = node
        return node

    def loss_reason(self, rank: int) -> str | None:
        """Why node ``rank``'s VM is gone, when Azure says it is (an evicted spot VM is
        deleted); ``None`` while it runs or if Azure cannot be asked."""
        with self._guard:
            if rank >= len(self.vms) or self.group is None or self.spec is None:
                return None
            vm, group, spot = self.vms[rank], self.group, self.spec.spot
        try:
            view = self.api.compute.virtual_machines.instance_view(group, vm)
        except Exception as exc:
            if failure_code(exc) in ("ResourceNotFound", "NotFound"):
                if spot:
                    return f"VM {vm} is gone: evicted by Azure (spot, eviction policy Delete)"
                return f"VM {vm} is gone: deleted (its idle watchdog, or the API or portal)"
            return None  # a message's detail; never a reason to fail the report of a loss
        power = power_state(view)
        if power in (None, "running", "starting"):
            return None
        return f"VM {vm} is {power}" + (" (evicted by Azure)" if spot else "")

    # ── helpers for provision ──────────────────────────────────────────────────────────

    def target(self, vm: str) -> HostTarget:
        from skyward.providers.ssh.connection import Target

        assert self.group is not None
        private, public = arm.addresses(self.api, self.group, vm)
        if self.connect == "public" and not public:
            raise ProvisionError(f"VM {vm} has no public address")
        address = public if self.connect == "public" and public else private
        return HostTarget(
            Target(host=address, port=22, user=self.username),
            peer_address=private,
            host_key=self.host_key,
        )

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
