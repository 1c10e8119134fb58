"""``sky.GCP``: the options of a pool on Compute Engine, checked when the pool is built, and
the pool's ``GCPMachines`` (``machines.py``) with its API connected."""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, ClassVar

from pydantic import Field, ValidationInfo, field_validator

from skyward._errors import ProvisionError
from skyward.providers.base import Inventory, ProvisionRequest
from skyward.providers.cloud import catalog
from skyward.providers.cloud.catalog import Cloud, Machine
from skyward.providers.cloud.options import CloudOptions
from skyward.providers.gcp.api import Api, credentials_and_project
from skyward.providers.gcp.inventory import GCPInventory
from skyward.providers.gcp.machines import GCPMachines
from skyward.providers.volumes import refuse_keyless

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
    zone: str | None = None
    region: str | None = None
    machine_type: str | None = Field(default=None, pattern=r"^[a-z0-9]+-[a-z0-9-]+$")
    image: str | None = Field(default=None, pattern=r"^projects/[^/]+/global/images/.+")
    network: str = Field(default="default", pattern=_NAME)
    subnetwork: str | None = Field(default=None, pattern=_NAME)
    disk_gb: int = Field(default=100, ge=10, le=65536)
    service_account: str | None = "default"
    endpoint: str | None = None
    credentials: Any = None

    @field_validator("zone", "region")
    @classmethod
    def _a_place(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        return place(value, zone=info.field_name == "zone")

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

    def machines(self, request: ProvisionRequest) -> GCPMachines:
        return GCPMachines(self, self._api(), request.pool)

    def inventory(self) -> Inventory | None:
        return GCPInventory(self._api, release_timeout=self.release_timeout)

    def _api(self) -> Api:
        credentials, project = credentials_and_project(self.project, self.credentials)
        return Api.connect(project=project, credentials=credentials, endpoint=self.endpoint)


_REGION = re.compile(r"^[a-z]+-[a-z]+\d+$")  # us-central1; a zone adds -a, -b, -c or -f


def place(value: str, *, zone: bool) -> str:
    """``value`` when it is shaped like a Compute Engine zone (``us-central1-a``) or region
    (``us-central1``); else a ``ValueError`` naming the nearest the catalog knows. A region
    newer than the catalog, rightly shaped, is taken: Compute Engine says if it exists."""
    region, _, letter = value.rpartition("-") if zone else (value, "", "")
    if _REGION.match(region) and (not zone or re.fullmatch(r"[a-z]", letter)):
        return value
    known = catalog.regions("gcp")
    near = difflib.get_close_matches(region or value, known, n=3, cutoff=0.85)
    if zone:
        near = [f"{n}-{letter if re.fullmatch(r'[a-z]', letter) else 'a'}" for n in near]
    kind, example = ("zone", "us-central1-a") if zone else ("region", "us-central1")
    hint = f"did you mean {' or '.join(repr(n) for n in near)}? " if near else ""
    raise ValueError(
        f"unknown GCP {kind} {value!r}: {hint}A {kind} is written like {example!r} "
        f"(`gcloud compute {kind}s list` lists them)"
    )
