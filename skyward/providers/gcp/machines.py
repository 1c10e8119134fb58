"""One GCP pool's machines: the cloud contract's calls (``cloud/contract.py``) on Compute
Engine.

::

    offers      the zones of the region that offer each machine type (and its attached
                GPUs), priced from the catalog
    prepare     the image (a family, resolved once), two firewall rules for the pool's
                network tag (SSH from the client; everything within the pool), the
                instances' body with the boot payload as cloud-init user data
    launch      an insert per node, in parallel, under names recorded first
    describe    instances.get: RUNNING, on the way, or ended (and why, from the operations)
    delete      the instances and the rules, all at once, and wait; a sweep by label

Names are chosen before anything is asked for: an insert whose answer is lost (a Ctrl-C in
flight) is still deleted, by name.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Literal, Protocol

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud import capacity, catalog
from skyward.providers.cloud.boot import BEFORE_POWEROFF_PATH, Boot
from skyward.providers.cloud.capacity import Offer
from skyward.providers.cloud.catalog import Machine
from skyward.providers.cloud.contract import Described, Offers, Reach, State, Want
from skyward.providers.cloud.options import prices
from skyward.providers.cloud.record import Record
from skyward.providers.cloud.start import launch_each
from skyward.providers.gcp import api as gce
from skyward.providers.gcp.api import Api, is_not_found

# Public image families: NVIDIA's driver and CUDA 12 on the Deep Learning VM for GPU
# machines, Canonical's Ubuntu 24.04 for CPU ones. Both run cloud-init and the guest agent.
GPU_IMAGE = (
    "projects/deeplearning-platform-release/global/images/family/"
    "common-cu128-ubuntu-2204-nvidia-570"
)
CPU_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
_PRIVATE_RANGES = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
_STATES: dict[str, State] = {
    "PROVISIONING": "starting",
    "STAGING": "starting",
    "RUNNING": "running",
    "STOPPING": "ended",
    "SUSPENDING": "ended",
    "SUSPENDED": "ended",
    "TERMINATED": "ended",
}


class Settings(Protocol):
    """What the machines read of ``sky.GCP`` (``options.py``)."""

    @property
    def image(self) -> str | None: ...
    @property
    def network(self) -> str: ...
    @property
    def subnetwork(self) -> str | None: ...
    @property
    def disk_gb(self) -> int: ...
    @property
    def service_account(self) -> str | None: ...
    @property
    def endpoint(self) -> str | None: ...
    @property
    def username(self) -> str: ...
    @property
    def connect(self) -> Literal["public", "private"]: ...
    @property
    def release_timeout(self) -> float: ...

    def where(self) -> tuple[str | None, str]: ...
    def machines_for(self, request: ProvisionRequest) -> list[Machine]: ...
    def ssh_cidrs(self, private_ranges: Sequence[str]) -> list[str]: ...


class GCPMachines:
    """A pool's firewall rules and instances in one project."""

    noun = "instance"

    def __init__(self, options: Settings, api: Api, pool: str) -> None:
        self.options = options
        self.api = api
        self.names = gce.Names.of(pool)
        self.prefix = self.names.instances
        self.instance_profile = False
        self._template: gce.InstanceSpec | None = None  # set by prepare, read by launch

    @property
    def scope(self) -> tuple[str, str]:
        return f" in project {self.api.project}", f"--project {self.api.project}"

    def key_label(self, first: Offer) -> tuple[str, str, str]:
        # The "key pair" of a GCP pool is its names' base (its rules are <base>-ssh, -pool).
        return self.api.project, self.names.base, self.options.endpoint or ""

    def resume(self, name: str) -> None:
        self.names = gce.Names(name)  # its rules, instances and the sweep's prefix
        self.prefix = self.names.instances

    def offers(self, want: Want) -> Offers:
        first_zone, region = self.options.where()
        want.deadline.check("finding the zones")
        machines = self.options.machines_for(want.request)
        zones = self._zones(machines, first_zone, region)
        # No spot prices without the billing API: on-demand is their ceiling.
        price = prices(lambda machine, zone: catalog.machine_price(machine, region))
        return Offers(capacity.plan(machines, zones, strategy=want.strategy, price=price), region)

    def prepare(self, want: Want, offers: Sequence[Offer], boot: Boot, record: Record) -> None:
        options, api, deadline, request = self.options, self.api, want.deadline, want.request
        first = offers[0]
        deadline.check("finding the image")
        gpu = first.machine.accelerator is not None
        image = self._image(options.image or (GPU_IMAGE if gpu else CPU_IMAGE))
        open_pool_rules(api, self.names, options, want, record)
        if options.service_account:  # the watchdog deletes its instance before powering off
            boot = delete_before_poweroff(boot, gce.self_delete_script(options.endpoint))
        self._template = gce.InstanceSpec(
            machine_type=first.machine.type,
            attach=None,
            gpu=gpu,
            image=image,
            disk_gb=options.disk_gb,
            network=options.network,
            subnetwork=options.subnetwork,
            tag=self.names.tag,
            labels=gce.labels(request.tags),
            metadata={
                **login_metadata(options.username, boot, request.tags),
                "user-data": boot.cloud_config(),
            },
            public=options.connect == "public",
            spot=False,
            service_account=options.service_account,
        )

    def launch(
        self, offer: Offer, names: Sequence[str], record: Record, deadline: Deadline
    ) -> list[str]:
        assert self._template is not None, "prepare comes first"
        machine, zone = offer.machine, offer.zone
        spec = dataclasses.replace(
            self._template,
            machine_type=machine.type,
            attach=(machine.attach, machine.count) if machine.attach else None,
            spot=offer.market == "spot",
        )

        def create(name: str) -> None:
            request = {
                "project": self.api.project,
                "zone": zone,
                "instance_resource": gce.instance(spec, name, zone),
                # GCE ignores a repeat of this request: a retried insert is one VM.
                "request_id": str(uuid.uuid4()),
            }
            doing = f"creating instance {name} in {zone}"
            started = self.api.start(self.api.instances.insert, doing, request=request)
            self.api.wait(started, doing, deadline)

        down = f"skyward down --pool {record.pool} {self.scope[1]}"
        timeout = self.options.release_timeout
        return launch_each(zone, names, create, self.discard, release_timeout=timeout, down=down)

    def describe(self, place: str, ids: Sequence[str], *, quick: bool = False) -> list[Described]:
        return [self._one(place, name, quick) for name in ids]

    def _one(self, zone: str, name: str, quick: bool) -> Described:
        api, where = self.api, {"project": self.api.project, "zone": zone, "instance": name}
        try:
            if quick:  # no retries: the watcher asks again in two seconds
                found = api.instances.get(**where, retry=None, timeout=20.0)
            else:
                found = api.call(api.instances.get, "waiting for instances to run", **where)
        except Exception as exc:
            if is_not_found(exc):
                return Described("ended", "gone", why=gce.ended(api, zone, name))
            raise
        status = str(found.status)
        state = _STATES.get(status, "starting")
        if state == "ended":
            return Described(state, status, why=gce.ended(api, zone, name))
        interface = found.network_interfaces[0]
        private = str(interface.network_i_p)
        public = [str(c.nat_i_p) for c in interface.access_configs if c.nat_i_p]
        host = public[0] if self.options.connect == "public" and public else private
        return Described(state, status, Reach(host=host, peer=private) if private else None)

    def discard(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[str]:
        return gce.delete(self.api, instances=[(place, name) for name in ids], deadline=deadline)

    def delete(self, record: Record, deadline: Deadline) -> list[str]:
        """Every instance asked for and the rules, all at once, waited for; then a sweep by
        label for anything the names missed."""
        instances, firewalls = record.asked(), record.resources("firewall rule")
        left = gce.delete(self.api, instances=instances, firewalls=firewalls, deadline=deadline)
        if instances:
            try:
                labelled = gce.live(self.api, record.pool)
            except ProvisionError as exc:
                left.append(f"the sweep by label ({exc})")
                labelled = []
            mine = [(z, i.name) for z, i in labelled if i.name.startswith(self.names.base)]
            left += gce.delete(self.api, instances=mine, deadline=deadline)
        return left

    # ── what the offers and the image are found with ───────────────────────────────────

    def _zones(
        self, machines: Sequence[Machine], first: str | None, region: str
    ) -> dict[str, list[str]]:
        """Per machine type, the zones of ``region`` that offer it (``first`` first); a type
        no zone there offers is an error before anything exists."""
        api = self.api
        every = gce.zones_of(api, region)
        if first is not None and first not in every:
            raise ProvisionError(f"zone {first} is not in {region} (its zones: {', '.join(every)})")
        ordered = ([first] if first else []) + [z for z in every if z != first]
        wanted = " OR ".join(f'(name = "{t}")' for t in dict.fromkeys(m.type for m in machines))
        attached = {m.attach for m in machines if m.attach}
        found: dict[str, set[str]] = {}
        for zone in ordered:  # one list per zone, not one get per type and zone
            doing = f"reading the machine types of {zone}"
            where = {"project": api.project, "zone": zone}
            request = {**where, "filter": wanted}
            found[zone] = {t.name for t in api.call(api.machine_types.list, doing, request=request)}
            if attached:
                listed = api.call(api.accelerator_types.list, doing, request=where)
                found[zone] |= {a.name for a in listed}

        def refusal(machine: Machine, zone: str) -> str | None:
            kinds = [machine.type] + ([machine.attach] if machine.attach else [])
            return None if all(k in found[zone] for k in kinds) else "not offered there"

        nowhere = (
            f"no zone of {region} offers {', '.join(m.describe() for m in machines)} "
            f"(zones: {', '.join(every)}); choose another region, machine_type or accelerator"
        )
        return capacity.offered(machines, ordered, refusal, nowhere=nowhere)[0]

    def _image(self, image: str) -> str:
        """The image's selfLink (a family's newest image, once for every node)."""
        api, parts = self.api, image.split("/")
        doing = f"finding image {image}"
        if len(parts) == 6 and parts[4] == "family":
            found: Any = api.call(
                api.images.get_from_family, doing, project=parts[1], family=parts[5]
            )
        else:
            found = api.call(api.images.get, doing, project=parts[1], image=parts[-1])
        return str(found.self_link)


# ── what a GCE VM and a TPU slice's hosts are made with alike ─────────────────────────


class RuleSettings(Protocol):
    """What the firewall rules read of ``sky.GCP``."""

    @property
    def network(self) -> str: ...
    def ssh_cidrs(self, private_ranges: Sequence[str]) -> list[str]: ...


def open_pool_rules(
    api: Api, names: gce.Names, options: RuleSettings, want: Want, record: Record
) -> None:
    """The pool's firewall rules (SSH from ``options``' ranges, and all between its
    machines), each recorded before it is asked for."""
    cidrs = options.ssh_cidrs(_PRIVATE_RANGES)
    want.deadline.check("creating the firewall rules")
    gce.open_firewalls(
        api,
        names,
        network=options.network,
        ssh_cidrs=cidrs,
        tags=want.request.tags,
        deadline=want.deadline,
        adopt=partial(record.add, "firewall rule"),
    )
    want.reporter.status(f"firewall rules {names.base}-*: SSH from {', '.join(cidrs)}")


def delete_before_poweroff(boot: Boot, script: str) -> Boot:
    """``boot`` whose watchdog runs ``script`` (deleting the machine with its own service
    account) before it powers off: a stopped GCE VM or TPU still bills its disk."""
    return boot.with_last_act(
        files=[{"path": BEFORE_POWEROFF_PATH, "permissions": "0755", "content": script}]
    )


def login_metadata(user: str, boot: Boot, tags: Mapping[str, str]) -> dict[str, str]:
    """The metadata that lets the pool's key, and only it, log in as ``user``, and the
    pool's tags as given (labels lose case and '@')."""
    return {
        "ssh-keys": f"{user}:{boot.authorized_key} {user}",
        "block-project-ssh-keys": "TRUE",  # not the project's keys
        "enable-oslogin": "FALSE",  # not OS Login's users
        gce.TAGS_KEY: json.dumps(dict(tags)),
    }
