"""One TPU pool's machines: the cloud contract's calls (``cloud/contract.py``) on Cloud TPU.
``sky.GCP`` builds these instead of ``GCPMachines`` when the pool's accelerator is a TPU
type (``tpu_types.py``).

::

    offers      every zone that sells the type (the zone asked for first), priced per host
    prepare     the two firewall rules for the slice's network tag (Compute Engine, as for
                instances), the slices' body with the boot payload as ``startup-script``
                metadata (TPU VM images run it through Google's guest agent; they take no
                cloud-init user data)
    launch      one queued resource for the whole pool: one slice (``nodeId``), or k slices
                (``multisliceParams``); recorded before it is asked for; waited for through
                its states (ACCEPTED, PROVISIONING, WAITING_FOR_RESOURCES ...: shown as
                status lines) until ACTIVE; FAILED for want of capacity deletes it (force)
                and moves to the next zone
    describe    nodes.get: READY, on the way, or ended (PREEMPTED, TERMINATED, gone); a host
                is reached at its ``networkEndpoints[worker]``
    discard     the queued resource, with force (its slices go with it)
    delete      every queued resource recorded, with force, and the rules; then a sweep of
                the zones used for queued resources named after the pool

A machine id is ``<node>/<worker>``: one pool node per TPU host, ranked in the order Google
numbers the workers, slice after slice. The whole pool is one unit (``unit``): a slice is
created, preempted and deleted together, and a lost host stops every host's collectives, so
the start replaces every node at once (``start.CloudPool.replace``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud import capacity
from skyward.providers.cloud.api import poll
from skyward.providers.cloud.boot import Boot
from skyward.providers.cloud.capacity import CapacityError, Offer
from skyward.providers.cloud.contract import Described, Offers, Reach, State, Want
from skyward.providers.cloud.record import Record
from skyward.providers.gcp import api as gce
from skyward.providers.gcp import tpu_api
from skyward.providers.gcp.api import Api, is_not_found
from skyward.providers.gcp.machines import delete_before_poweroff, login_metadata, open_pool_rules
from skyward.providers.gcp.tpu_api import QUEUED_KEY, SliceSpec, TpuApi
from skyward.providers.gcp.tpu_types import TpuType

KIND = "queued resource"  # in the record: "<zone>/<queued resource id>"
_STATES: dict[str, State] = {
    "CREATING": "starting",
    "STARTING": "starting",
    "RESTARTING": "starting",
    "REIMAGING": "starting",
    "REPAIRING": "starting",
    "READY": "running",
}
_WHY = {
    "PREEMPTED": "preempted by Google (spot): the whole slice is lost",
    "TERMINATED": "terminated by Google (maintenance or a failure of the slice)",
    "STOPPED": "stopped (a stopped TPU still holds its capacity)",
    "STOPPING": "being stopped",
    "DELETING": "being deleted",
}
_QUEUE_FAILED = ("FAILED", "SUSPENDING", "SUSPENDED")


class TpuSettings(Protocol):
    """What the TPU machines read of ``sky.GCP`` (``options.py``)."""

    @property
    def network(self) -> str: ...
    @property
    def subnetwork(self) -> str | None: ...
    @property
    def service_account(self) -> str | None: ...
    @property
    def endpoint(self) -> str | None: ...
    @property
    def tpu_endpoint(self) -> str | None: ...
    @property
    def tpu_runtime(self) -> str | None: ...
    @property
    def username(self) -> str: ...
    @property
    def connect(self) -> Literal["public", "private"]: ...
    @property
    def release_timeout(self) -> float: ...

    def tpu_zones(self, kind: TpuType) -> list[str]: ...
    def ssh_cidrs(self, private_ranges: Sequence[str]) -> list[str]: ...


class TPUMachines:
    """A TPU pool's firewall rules and queued resource in one project."""

    noun = "TPU host"

    def __init__(
        self,
        options: TpuSettings,
        tpu: TpuApi,
        compute: Api,
        request: ProvisionRequest,
        kind: TpuType,
    ) -> None:
        self.options = options
        self.tpu = tpu
        self.compute = compute
        self.kind = kind
        self.names = gce.Names.of(request.pool)
        self.prefix = self.names.instances
        self.instance_profile = False
        # Every node is replaced together: one queued resource holds the pool's slices.
        self.unit = request.nodes
        self.chips = kind.chips_per_host  # each node's accelerators: no nvidia-smi lists them
        self.slices = request.nodes // kind.hosts
        self._spec: SliceSpec | None = None  # set by prepare, read by launch
        self._reporter: Reporter | None = None

    @property
    def scope(self) -> tuple[str, str]:
        return f" in project {self.tpu.project}", f"--project {self.tpu.project}"

    def key_label(self, first: Offer) -> tuple[str, str, str]:
        return self.tpu.project, self.names.base, self.options.endpoint or ""

    def offers(self, want: Want) -> Offers:
        zones = self.options.tpu_zones(self.kind)
        machine = self.kind.machine()

        def price(_machine: Any, _zone: str, market: capacity.Market) -> float:
            return self.kind.host_hourly(spot=market == "spot")

        planned = capacity.plan(
            [machine], {machine.type: zones}, strategy=want.strategy, price=price
        )
        return Offers(planned, zones[0].rsplit("-", 1)[0])

    def prepare(self, want: Want, offers: Sequence[Offer], boot: Boot, record: Record) -> None:
        options, request = self.options, want.request
        self._reporter = want.reporter
        open_pool_rules(self.compute, self.names, options, want, record)
        if options.service_account:  # the watchdog deletes the slice before powering off
            boot = delete_before_poweroff(boot, tpu_api.self_delete_script(options.tpu_endpoint))
        self._spec = SliceSpec(
            accelerator_type=self.kind.name,
            runtime=options.tpu_runtime or self.kind.runtime,
            network=options.network,
            subnetwork=options.subnetwork,
            public=options.connect == "public",
            tag=self.names.tag,
            labels=gce.labels(request.tags),
            metadata={
                **login_metadata(options.username, boot, request.tags),
                # TPU VM images run this through the guest agent, as root, at every boot.
                "startup-script": boot.start_script(),
            },
            service_account=options.service_account,
        )

    def launch(
        self, offer: Offer, names: Sequence[str], record: Record, deadline: Deadline
    ) -> list[str]:
        assert self._spec is not None, "prepare comes first"
        hosts, zone = self.kind.hosts, offer.zone
        if len(names) % hosts:
            raise ProvisionError(f"{len(names)} nodes are not whole slices of {hosts} hosts")
        slices = len(names) // hosts
        queued = names[0]  # "<base>-n0", a replacement's "<base>-n0-r1"
        spec = self._spec
        spec = SliceSpec(**{**spec.__dict__, "metadata": {**spec.metadata, QUEUED_KEY: queued}})
        body = tpu_api.queued_resource(
            self.tpu,
            spec,
            zone=zone,
            node_id=queued,
            slices=slices,
            spot=offer.market == "spot",
            valid_for=deadline.remaining(),
        )
        doing = f"creating queued resource {queued} ({slices} x {self.kind.name}) in {zone}"
        record.add(KIND, f"{zone}/{queued}")  # before it is asked for: a lost answer
        request = {
            "parent": self.tpu.parent(zone),
            "queued_resource_id": queued,
            "queued_resource": body,
        }
        try:
            operation = self.tpu.start(
                self.tpu.client.create_queued_resource, doing, request=request
            )
            self.tpu.wait(operation, doing, deadline)
            self._until_active(zone, queued, deadline)
        except CapacityError:
            # The next zone starts clean: this one's queued resource goes first.
            left = self._delete_queued(
                [(zone, queued)], Deadline(self.options.release_timeout, "release_timeout")
            )
            if left:
                raise ProvisionError(f"could not delete {', '.join(left)}") from None
            raise
        nodes = tpu_api.slice_names(queued, slices)
        return [f"{node}/{worker}" for node in nodes for worker in range(hosts)]

    def _until_active(self, zone: str, queued: str, deadline: Deadline) -> None:
        """Wait for the queued resource to be ACTIVE, saying each state it passes through."""
        doing = f"waiting for queued resource {queued} in {zone}"
        seen: list[str] = []
        name = f"{self.tpu.parent(zone)}/queuedResources/{queued}"

        def probe() -> bool | None:
            found = self.tpu.call(self.tpu.client.get_queued_resource, doing, name=name)
            state = found.state.state.name
            if not seen or seen[-1] != state:
                seen.append(state)
                if self._reporter is not None:
                    self._reporter.status(f"queued resource {queued} in {zone}: {state}")
            if state == "ACTIVE":
                return True
            if state in _QUEUE_FAILED:
                error = found.state.failed_data.error
                message = error.message or f"the queue says {state}"
                raise tpu_api.failure(
                    doing,
                    self.tpu.project,
                    status=tpu_api.HTTP_OF_RPC.get(error.code, 409),
                    message=message,
                )
            return None

        poll(probe, doing, deadline, pause=0.5, most=5.0)

    def describe(self, place: str, ids: Sequence[str], *, quick: bool = False) -> list[Described]:
        nodes = {id.split("/", 1)[0] for id in ids}
        found = {node: self._node(place, node, quick) for node in nodes}
        return [self._host(found[id.split("/", 1)[0]], id) for id in ids]

    def _node(self, zone: str, node: str, quick: bool) -> Any:
        tpu, name = self.tpu, f"{self.tpu.parent(zone)}/nodes/{node}"
        try:
            if quick:  # no retries: the watcher asks again in two seconds
                return tpu.client.get_node(name=name, retry=None, timeout=20.0)
            return tpu.call(tpu.client.get_node, "waiting for the TPU hosts", name=name)
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise

    def _host(self, node: Any, id: str) -> Described:
        if node is None:
            return Described("ended", "gone", why="its TPU node was deleted (the whole slice)")
        status = str(node.state.name)
        state = _STATES.get(status, "ended")
        if state == "ended":
            return Described(state, status, why=_WHY.get(status, "no reason given"))
        worker = int(id.split("/", 1)[1])
        endpoints = list(node.network_endpoints)
        if state != "running" or worker >= len(endpoints):
            return Described("starting", status)
        endpoint = endpoints[worker]
        private = str(endpoint.ip_address)
        public = str(endpoint.access_config.external_ip or "")
        host = public if self.options.connect == "public" and public else private
        return Described(state, status, Reach(host=host, peer=private))

    def discard(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[str]:
        queued = {(place, _queued_of(id.split("/", 1)[0], self.slices)) for id in ids}
        return self._delete_queued(sorted(queued), deadline)

    def delete(self, record: Record, deadline: Deadline) -> list[str]:
        """Every queued resource recorded (force: their slices go too) and the rules, all at
        once, waited for; then a sweep of the zones used for queued resources of this pool."""
        queued = [tuple(q.split("/", 1)) for q in record.resources(KIND)]
        pairs = [(zone, name) for zone, name in queued]
        left = self._delete_queued(pairs, deadline)
        rules = record.resources("firewall rule")
        left += gce.delete(self.compute, firewalls=rules, deadline=deadline)
        for zone in dict.fromkeys(zone for zone, _ in pairs):
            try:
                found = self.tpu.call(
                    self.tpu.client.list_queued_resources,
                    "listing queued resources",
                    parent=self.tpu.parent(zone),
                )
            except ProvisionError as exc:
                left.append(f"the sweep of {zone} ({exc})")
                continue
            mine = [
                (zone, q.name.rsplit("/", 1)[-1])
                for q in found
                if q.name.rsplit("/", 1)[-1].startswith(self.names.base)
            ]
            left += self._delete_queued(mine, deadline)
        return left

    def _delete_queued(self, queued: Sequence[tuple[str, str]], deadline: Deadline) -> list[str]:
        return tpu_api.delete_queued(self.tpu, queued, deadline)


def _queued_of(node: str, slices: int) -> str:
    """The queued resource that made ``node``: itself, or a multislice's prefix."""
    return node if slices == 1 else node.rsplit("-", 1)[0]
