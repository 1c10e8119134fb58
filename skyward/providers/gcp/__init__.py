"""``GCP(...)``: nodes are Compute Engine instances that the pool creates and always destroys.

A start is every cloud's (``CloudOptions.provision``, ``cloud/options.py``); GCP's steps::

    offers      the zones of the region that offer each machine type (and its attached
                GPUs), priced from the catalog
    prepare     the image (a family, resolved once), two firewall rules for the pool's
                network tag (SSH from the client; everything within the pool), the
                instances' body; a launch inserts an instance per node, in parallel
    started     wait RUNNING
    terminate   delete the instances and the rules, all at once, and wait; sweep by label
    inventory   instances labelled skyward-pool and skyward- rules, in the project

google-cloud-compute is imported only when a pool uses GCP; its calls and error messages
live in ``api``, the resources in ``resources``, the allocation in ``allocation``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from functools import partial
from typing import Any, ClassVar

from pydantic import Field

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.base import Inventory, ProvisionRequest
from skyward.providers.cloud import capacity, catalog
from skyward.providers.cloud.boot import BEFORE_POWEROFF_PATH
from skyward.providers.cloud.capacity import Offer
from skyward.providers.cloud.catalog import Cloud, Machine
from skyward.providers.cloud.options import CloudOptions, Launch, prices
from skyward.providers.gcp import resources as gce
from skyward.providers.gcp.allocation import GCPAllocation
from skyward.providers.gcp.api import Api, credentials_and_project, not_served
from skyward.providers.gcp.inventory import GCPInventory
from skyward.providers.volumes import refuse_keyless

# Public image families: NVIDIA's driver and CUDA 12 on the Deep Learning VM for GPU
# machines, Canonical's Ubuntu 24.04 for CPU ones. Both run cloud-init and the guest agent.
GPU_IMAGE = (
    "projects/deeplearning-platform-release/global/images/family/"
    "common-cu128-ubuntu-2204-nvidia-570"
)
CPU_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
_PRIVATE_RANGES = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
_NAME = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"


class GCP(CloudOptions):
    """Run the pool's nodes on Compute Engine instances made for it, in one zone.

    - ``project``: by default the application-default credentials' (``GOOGLE_CLOUD_PROJECT``,
      gcloud's). ``credentials``: google-auth credentials; by default the ADC.
    - ``zone``: the zone tried first; ``region``: where to look for zones (default: the
      zone's). The instances go to the first zone of the region that offers the machine and
      has capacity. Without either, ``CLOUDSDK_COMPUTE_ZONE`` / ``CLOUDSDK_COMPUTE_REGION``.
    - ``machine_type``: wins over the pool's ``accelerator``, which otherwise picks it from
      the catalog (``"H100"`` is an a3-highgpu-8g). ``image``: an image or a family
      (``projects/P/global/images/family/F``); by default the Deep Learning VM for GPUs.
    - ``spot``: Spot VMs, deleted when reclaimed. ``network``/``subnetwork``: where they go.
    - ``username``: the login user (Google's guest agent makes it from ``ssh-keys``).
      ``disk_gb``: the boot disk. The other options are ``sky.AWS``'s (``CloudOptions``).
    - ``service_account``: the instances' service account, with the compute scope, so that
      the watchdog can delete its own instance (``None``: no account; a powered-off machine
      is then kept, and its disk billed, until ``skyward down``).
    - ``endpoint``: where the Compute API calls go (a proxy, a test server).
    """

    cloud: ClassVar[Cloud] = "gcp"
    machine_option: ClassVar[str] = "machine_type"
    ssh_rule: ClassVar[str] = "the firewall rule"
    needs: ClassVar[tuple[str, ...]] = ("google.cloud.compute_v1",)

    project: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9:.-]{4,62}$")
    zone: str | None = Field(default=None, pattern=r"^[a-z]+-[a-z]+\d+-[a-z]$")
    region: str | None = Field(default=None, pattern=r"^[a-z]+-[a-z]+\d+$")
    machine_type: str | None = Field(default=None, pattern=r"^[a-z0-9]+-[a-z0-9-]+$")
    image: str | None = Field(default=None, pattern=r"^projects/[^/]+/global/images/.+")
    network: str = Field(default="default", pattern=_NAME)
    subnetwork: str | None = Field(default=None, pattern=_NAME)
    disk_gb: int = Field(default=100, ge=10, le=65536)
    service_account: str | None = "default"
    endpoint: str | None = None
    credentials: Any = None

    @property
    def catalog_region(self) -> str:
        return self.where()[1]

    def machines_for(self, request: ProvisionRequest, region: str | None = None) -> list[Machine]:
        # A type the catalog lacks: GCE says whether a zone offers it, before anything exists.
        found = super().machines_for(request, region)
        return found or [Machine("gcp", str(self.machine_type), None, 0, 0, 0)]

    def where(self) -> tuple[str | None, str]:
        """(the zone tried first, the region), from the settings or gcloud's variables."""
        zone = self.zone or os.environ.get("CLOUDSDK_COMPUTE_ZONE") or None
        region = self.region or os.environ.get("CLOUDSDK_COMPUTE_REGION") or None
        region = region or (zone.rsplit("-", 1)[0] if zone else None)
        if region is None:
            raise ProvisionError(
                "no GCP zone or region: pass sky.GCP(zone='us-central1-a') or "
                "region='us-central1', or set CLOUDSDK_COMPUTE_ZONE"
            )
        if zone is not None and not zone.startswith(region + "-"):
            raise ValueError(f"zone {zone} is not in region {region}")
        return zone, region

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is touched."""
        super().check(request)
        refuse_keyless(request.volumes, "GCP")
        self.refuse_above(request, self.machines_for(request), [self.where()[1]])
        credentials_and_project(self.project, self.credentials)

    def allocation(self, request: ProvisionRequest) -> GCPAllocation:
        names = gce.Names.of(request.pool)
        return GCPAllocation(self._api(), request, names, **self.allocation_options)

    def inventory(self) -> Inventory | None:
        try:
            _, region = self.where()
        except (ProvisionError, ValueError):
            region = None  # the aggregated list needs none
        return GCPInventory(self._api, release_timeout=self.release_timeout, region=region)

    def _api(self) -> Api:
        credentials, project = credentials_and_project(self.project, self.credentials)
        return Api.connect(project=project, credentials=credentials, endpoint=self.endpoint)

    # ── the steps ──────────────────────────────────────────────────────────────────────

    def launch_deadline(self, made: GCPAllocation) -> Deadline:
        return made.launching  # a release wakes the launch

    def offers(self, made: GCPAllocation, reporter: Reporter) -> tuple[list[Offer], str]:
        request, (first_zone, region) = made.request, self.where()
        made.launching.check("finding the zones")
        machines = self.machines_for(request)
        zones = self._zones(made.api, machines, first_zone, region)
        # No spot prices without the billing API: on-demand is their ceiling.
        price = prices(lambda machine, zone: catalog.machine_price(machine, region))
        return capacity.plan(machines, zones, strategy=self.strategy(request), price=price), region

    def prepare(self, made: GCPAllocation, offers: Sequence[Offer], reporter: Reporter) -> Launch:
        request, api, deadline = made.request, made.api, made.launching
        first = offers[0]
        deadline.check("finding the image")
        gpu = first.machine.accelerator is not None
        image = self._image(api, self.image or (GPU_IMAGE if gpu else CPU_IMAGE))
        cidrs = self.ssh_cidrs(_PRIVATE_RANGES)
        # The "key pair" of a GCP pool is its names' base (its rules are <base>-ssh, -pool).
        key, host_key = self.pool_keys(
            made, region=api.project, name=made.names.base, endpoint=self.endpoint or ""
        )
        deadline.check("creating the firewall rules")
        gce.open_firewalls(
            api,
            made.names,
            network=self.network,
            ssh_cidrs=cidrs,
            tags=request.tags,
            deadline=deadline,
            adopt=partial(made.record, "firewall rule"),
        )
        reporter.status(f"firewall rules {made.names.base}-*: SSH from {', '.join(cidrs)}")
        hook = {"path": BEFORE_POWEROFF_PATH, "permissions": "0755"}
        hook["content"] = gce.self_delete_script(self.endpoint)
        boot = self.boot(host_key, key, files=[hook] if self.service_account else [])
        template = gce.InstanceSpec(
            machine_type=first.machine.type,
            attach=None,
            gpu=gpu,
            image=image,
            disk_gb=self.disk_gb,
            network=self.network,
            subnetwork=self.subnetwork,
            tag=made.names.tag,
            labels=gce.labels(request.tags),
            metadata={
                "ssh-keys": f"{self.username}:{key.public} {self.username}",
                # Only the pool's key logs in: not the project's keys, not OS Login's users.
                "block-project-ssh-keys": "TRUE",
                "enable-oslogin": "FALSE",
                "user-data": boot,
                gce.TAGS_KEY: json.dumps(dict(request.tags)),  # labels lose case and '@'
            },
            public=self.connect == "public",
            spot=False,
            service_account=self.service_account,
        )

        def launch(offer: Offer) -> list[str]:
            machine = offer.machine
            made.spec = dataclasses.replace(
                template,
                machine_type=machine.type,
                attach=(machine.attach, machine.count) if machine.attach else None,
                spot=offer.market == "spot",
            )
            return made.launch(offer.zone, range(request.nodes), deadline)

        return launch

    def _zones(
        self, api: Api, machines: Sequence[Machine], first: str | None, region: str
    ) -> dict[str, list[str]]:
        """Per machine type, the zones of ``region`` that offer it (``first`` first); a type
        no zone there offers is an error before anything exists."""
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
            listed = list(api.listed(api.machine_types.list, doing, request))
            found[zone] = {t.name for t in listed}
            if attached:
                try:
                    found[zone] |= {
                        a.name for a in api.call(api.accelerator_types.list, doing, request=where)
                    }
                except ProvisionError as exc:
                    if not not_served(exc):
                        raise
                    # No list of them here: the insert says whether the zone has the GPU
                    # (a refusal there moves the pool on, as exhaustion does).
                    found[zone] |= attached

        def refusal(machine: Machine, zone: str) -> str | None:
            kinds = [machine.type] + ([machine.attach] if machine.attach else [])
            return None if all(k in found[zone] for k in kinds) else "not offered there"

        nowhere = (
            f"no zone of {region} offers {', '.join(m.describe() for m in machines)} "
            f"(zones: {', '.join(every)}); choose another region, machine_type or accelerator"
        )
        return capacity.offered(machines, ordered, refusal, nowhere=nowhere)[0]

    def _image(self, api: Api, image: str) -> str:
        """The image's selfLink (a family's newest image, once for every node)."""
        parts = image.split("/")
        doing = f"finding image {image}"
        if len(parts) == 6 and parts[4] == "family":
            found = api.call(api.images.get_from_family, doing, project=parts[1], family=parts[5])
        else:
            found = api.call(api.images.get, doing, project=parts[1], image=parts[-1])
        return str(found.self_link)
