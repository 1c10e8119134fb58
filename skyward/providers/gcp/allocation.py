"""What one GCP pool made, and how it is unmade, replaced, and asked why a node was lost.

Names are chosen before anything is asked for, and recorded first (``adopt_*``): an insert
whose answer is lost (a Ctrl-C in flight) is still deleted, by name. ``release`` waits for
inserts still in flight, wakes their operation waits, deletes by name, then sweeps once more
by the pool's label. The rest of the allocation's life (release once, replace, reach) is the
shared ``CloudAllocation``'s.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

from skyward._errors import ProvisionError
from skyward._futures import Deadline
from skyward._phases import Reporter
from skyward.providers.base import ProvisionRequest, Resource
from skyward.providers.cloud.allocation import CloudAllocation, WatchedDeadline
from skyward.providers.cloud.capacity import CapacityError
from skyward.providers.gcp import resources as gce
from skyward.providers.gcp.api import Api
from skyward.providers.ssh.hosts import HostTarget

_INFLIGHT_WAIT = 90.0  # seconds release waits for insert calls still on the wire


class GCPAllocation(CloudAllocation[Api, gce.InstanceSpec]):
    """A pool's firewall rules and instances (node ``i`` runs on ``instances[i]``, a
    (zone, name))."""

    def __init__(
        self, api: Api, request: ProvisionRequest, names: gce.Names, **options: Any
    ) -> None:
        super().__init__(api, request, **options)
        self.scope = (f" in project {api.project}", f"--project {api.project}")
        self.names = names
        self.firewalls: list[str] = []
        self.instances: list[tuple[str, str]] = []  # by rank
        self._made: list[tuple[str, str]] = []  # every instance ever asked for
        self._generation = 0
        self._inflight = 0
        # Launches wait on this; release wakes them.
        self.launching = WatchedDeadline(request.deadline)

    def adopt_firewall(self, name: str) -> None:
        with self._guard:
            self.firewalls.append(name)
            self.resources.append(Resource("firewall rule", name))

    # ── launching ──────────────────────────────────────────────────────────────────────

    def launch(self, zone: str, ranks: Sequence[int], deadline: Deadline) -> list[str]:
        """Insert one instance per rank in ``zone``, in parallel, and wait for all of them:
        their names. After every insert has settled, the first failure is raised; when every
        failure was a ``CapacityError`` (no room there) the instances made are deleted first,
        so that the next place starts clean."""
        with self._guard:
            spec = self.spec
            if self._released or spec is None:
                raise ProvisionError(f"pool {self.request.pool} is closing; not launching")
            self._generation += 1
            names = [self.names.instance(r, self._generation - 1) for r in ranks]
            self._made += [(zone, n) for n in names]
            self._inflight += len(names)
        failures: list[BaseException | None] = [None] * len(names)
        settled = threading.Semaphore(0)

        def insert(index: int) -> None:
            name, doing = names[index], f"creating instance {names[index]} in {zone}"
            request = {
                "project": self.api.project,
                "zone": zone,
                "instance_resource": gce.instance(spec, name, zone),
                # GCE ignores a repeat of this request: a retried insert is one VM.
                "request_id": str(uuid.uuid4()),
            }
            try:
                try:
                    operation = self.api.start(self.api.instances.insert, doing, request=request)
                finally:
                    with self._guard:  # on the wire no more: release may delete it by name
                        self._inflight -= 1
                        self._guard.notify_all()
                self.api.wait(operation, doing, deadline)
            except BaseException as exc:
                failures[index] = exc
            finally:
                settled.release()

        for index in range(len(names)):
            threading.Thread(target=insert, args=(index,), daemon=True).start()
        for _ in names:
            settled.acquire()  # a Ctrl-C here leaves the threads to release(), which waits
        errors = [f for f in failures if f is not None]
        if errors and all(isinstance(e, CapacityError) for e in errors):
            self.discard([(zone, n) for n in names])
        if errors:
            raise errors[0]
        return names

    def discard(self, instances: Sequence[tuple[str, str]]) -> None:
        """Delete instances of an attempt that failed, and wait (a refused zone's)."""
        deadline = Deadline(self.release_timeout, f"release_timeout ({self.release_timeout:g} s)")
        left = gce.delete(self.api, instances=instances, deadline=deadline)
        if left:
            raise ProvisionError(
                f"pool {self.request.pool}: could not delete {', '.join(left)}. Remove them "
                f"with: {self.down_command}"
            )

    # ── the contract ───────────────────────────────────────────────────────────────────

    def delete_all(self) -> list[str]:
        """Delete every instance and wait, then both firewall rules; sweep by label."""
        with self._guard:
            self.launching.fail("the pool is being released")
            self._guard.wait_for(lambda: self._inflight == 0, timeout=_INFLIGHT_WAIT)
            instances = list(self._made)
            firewalls = list(self.firewalls)
        deadline = Deadline(self.release_timeout, f"release_timeout ({self.release_timeout:g} s)")
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

    def remake(
        self, rank: int, spec: gce.InstanceSpec, reporter: Reporter, deadline: Deadline
    ) -> HostTarget:
        with self._guard:
            zone, old = self.instances[rank]
        reporter.phase(rank, "provisioning", f"replacing {old}")
        gce.delete(self.api, instances=[(zone, old)], deadline=Deadline(0.0, "no wait"))
        (new,) = self.launch(zone, [rank], deadline)
        with self._guard:
            self.instances[rank] = (zone, new)
        (described,) = gce.running(self.api, zone, [new], deadline)
        return self.target(described)

    def loss_reason(self, rank: int) -> str | None:
        """Why node ``rank``'s instance is gone, when GCE says so; ``None`` while it runs
        or if GCE cannot be asked."""
        with self._guard:
            if rank >= len(self.instances):
                return None
            zone, name = self.instances[rank]
        try:
            found = self.api.instances.get(
                project=self.api.project, zone=zone, instance=name, retry=None, timeout=20.0
            )
        except Exception as exc:
            if getattr(exc, "code", None) != 404:
                return None  # a message's detail; never a reason to fail the report of a loss
            return f"instance {name} is gone: {gce.ended(self.api, zone, name)}"
        if found.status in ("PROVISIONING", "STAGING", "RUNNING"):
            return None
        return f"instance {name} is {found.status}: {gce.ended(self.api, zone, name)}"

    def target(self, described: Any) -> HostTarget:
        interface = described.network_interfaces[0]
        public = [c.nat_i_p for c in interface.access_configs if c.nat_i_p]
        return self.host_target(str(interface.network_i_p), public[0] if public else None)
