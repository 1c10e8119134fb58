"""What one GCP pool made, and how it is unmade: the calls on one instance that the shared
``InstanceAllocation`` makes, waits for, replaces and asks why it was lost, and the pool's
firewall rules.

Names are chosen before anything is asked for, and recorded first (``record``): an insert
whose answer is lost (a Ctrl-C in flight) is still deleted, by name. ``delete_all`` waits
for inserts still in flight, deletes by name, then sweeps once more by the pool's label.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud.instances import InstanceAllocation
from skyward.providers.gcp import resources as gce
from skyward.providers.gcp.api import Api, is_not_found
from skyward.providers.ssh.hosts import HostTarget


class GCPAllocation(InstanceAllocation[Api, gce.InstanceSpec]):
    """A pool's firewall rules and instances (node ``i`` runs on ``instances[i]``, a
    (zone, name))."""

    alive = frozenset({"PROVISIONING", "STAGING", "RUNNING"})
    running_status = "RUNNING"
    ended = frozenset({"STOPPING", "SUSPENDING", "SUSPENDED", "TERMINATED"})

    def __init__(
        self, api: Api, request: ProvisionRequest, names: gce.Names, **options: Any
    ) -> None:
        super().__init__(api, request, **options)
        self.scope = (f" in project {api.project}", f"--project {api.project}")
        self.names = names
        self.prefix = names.instances

    def delete_all(self) -> list[str]:
        """Delete every instance and wait, then both firewall rules; sweep by label."""
        instances, firewalls = self.drain(), self.recorded("firewall rule")
        deadline = self.release_deadline()
        left = gce.delete(self.api, instances=instances, firewalls=firewalls, deadline=deadline)
        if instances:  # a second sweep, by label: anything the names missed
            try:
                zones = sorted({zone for zone, _ in instances})
                labelled = gce.live(self.api, self.request.pool, lambda: zones)
            except ProvisionError as exc:
                left.append(f"the sweep by label ({exc})")
                labelled = []
            mine = [(z, i.name) for z, i in labelled if i.name.startswith(self.names.base)]
            left += gce.delete(self.api, instances=mine, deadline=deadline)
        return left

    # ── the calls on one instance ──────────────────────────────────────────────────────

    def start(self, place: str, name: str, spec: gce.InstanceSpec, deadline: Deadline) -> Any:
        request = {
            "project": self.api.project,
            "zone": place,
            "instance_resource": gce.instance(spec, name, place),
            # GCE ignores a repeat of this request: a retried insert is one VM.
            "request_id": str(uuid.uuid4()),
        }
        doing = f"creating instance {name} in {place}"
        return self.api.start(self.api.instances.insert, doing, request=request)

    def finish(self, started: Any, doing: str, deadline: Deadline) -> None:
        self.api.wait(started, doing, deadline)

    def status(self, place: str, name: str, *, quick: bool = False) -> tuple[str, Any] | None:
        api, where = self.api, {"project": self.api.project, "zone": place, "instance": name}
        try:
            if quick:  # no retries: the watcher asks again in two seconds
                found = api.instances.get(**where, retry=None, timeout=20.0)
            else:
                found = api.call(api.instances.get, "waiting for instances to run", **where)
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise
        return str(found.status), found

    def why_ended(self, place: str, name: str, described: Any) -> str:
        return gce.ended(self.api, place, name)

    def delete_machines(self, machines: Sequence[tuple[str, str]], deadline: Deadline) -> list[str]:
        return gce.delete(self.api, instances=machines, deadline=deadline)

    def target(self, described: Any) -> HostTarget:
        interface = described.network_interfaces[0]
        public = [c.nat_i_p for c in interface.access_configs if c.nat_i_p]
        return self.host_target(str(interface.network_i_p), public[0] if public else None)
