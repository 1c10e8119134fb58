"""``Azure(...)``: nodes are Azure VMs in a resource group the pool creates and always deletes.

A start is every cloud's (``CloudOptions.provision``, ``cloud/options.py``); Azure's
locations play the part of zones, and its steps are::

    check       subscription and location given, max_price only for spot, the CA bundle
    offers      a token (credentials), Azure's SKU list for each location (sizes it does
                not offer or restricts are left out, a vm_size is described)
    prepare     the pool's resource group; per location tried: network, NSG, managed
                identity; a launch creates every node's VM at once
    terminate   delete the resource group and wait
    inventory   resource groups tagged skyward-pool in the subscription

The SDKs are imported only when a pool uses Azure; the calls and their error messages live
in ``api``, the resources in ``resources``, the idle watchdog's last step in ``watchdog``.
"""

from __future__ import annotations

import difflib
import ipaddress
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from skyward._errors import ProvisionError
from skyward.client.phases import Reporter
from skyward.providers.azure import resources as arm
from skyward.providers.azure.allocation import AzureAllocation
from skyward.providers.azure.api import PUBLIC_CLOUD, Api, not_served
from skyward.providers.azure.inventory import AzureInventory
from skyward.providers.azure.watchdog import RELEASE_PATH, release_script
from skyward.providers.base import Inventory, ProvisionRequest
from skyward.providers.cloud import capacity, catalog
from skyward.providers.cloud.boot import HostKey
from skyward.providers.cloud.capacity import Offer
from skyward.providers.cloud.catalog import Cloud, Machine
from skyward.providers.cloud.options import MAX_SECONDS, CloudOptions, Launch, prices
from skyward.providers.ssh.connection import PoolKey
from skyward.providers.volumes import refuse_keyless

_log = logging.getLogger("skyward")

# Microsoft's Ubuntu HPC image (NVIDIA driver, CUDA, NCCL, InfiniBand) for GPU sizes;
# Canonical's Ubuntu 24.04 for CPU ones. Both run cloud-init at boot.
GPU_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
CPU_IMAGE = "Canonical:ubuntu-24_04-lts:server:latest"
# Public regions, for "did you mean" when Azure lists no sizes in a location.
# fmt: off
_LOCATIONS = (
    "eastus", "eastus2", "westus", "westus2", "westus3", "centralus", "northcentralus",
    "southcentralus", "westcentralus", "canadacentral", "canadaeast", "brazilsouth",
    "northeurope", "westeurope", "uksouth", "ukwest", "francecentral", "germanywestcentral",
    "norwayeast", "swedencentral", "switzerlandnorth", "polandcentral", "italynorth",
    "spaincentral", "uaenorth", "qatarcentral", "israelcentral", "southafricanorth",
    "centralindia", "southindia", "westindia", "japaneast", "japanwest", "koreacentral",
    "koreasouth", "eastasia", "southeastasia", "australiaeast", "australiasoutheast",
    "australiacentral",
)
# fmt: on


class Azure(CloudOptions):
    """Run the pool's nodes on Azure VMs made for it, in a resource group of its own.

    - ``subscription_id``: by default ``AZURE_SUBSCRIPTION_ID``.
    - ``location``: a location, or several in order of preference (failover); by default
      ``AZURE_DEFAULTS_LOCATION`` (the Azure CLI's default location).
    - ``vm_size``: wins over the pool's ``accelerator``, which otherwise picks it from the
      catalog (``"A100"`` is a Standard_NC24ads_A100_v4, 1 GPU; ``"A100:8"`` an ND96asr_v4).
    - ``image``: ``publisher:offer:sku:version`` or an image's resource id; by default
      Ubuntu HPC (NVIDIA driver) for GPU sizes, Ubuntu 24.04 for CPU ones.
    - ``spot``, ``max_price``: spot VMs (evicted means deleted); a spot VM costs at most
      ``max_price`` USD an hour (default: up to the on-demand price).
    - ``connect``: reach the nodes at their ``"public"`` or ``"private"`` address.
    - ``ssh_cidr``: who may reach the SSH port; ``"auto"``: this machine's public address
      (asked of ``ip_lookup_url``), or with ``connect="private"`` the pool's address space.
    - ``address_space``: the pool's virtual network; its first /24 is the nodes' subnet.
    - ``username``, ``disk_gb``: the login user Azure creates, the OS disk.
    - ``idle_timeout``: a node with no SSH client for this long deletes itself (the
      watchdog, through the pool's managed identity: ``self_delete``). ``self_delete=False``
      makes no identity and gives it no role; the watchdog then only powers the VM off,
      which Azure *keeps billing* until ``skyward down``.
    - ``boot_timeout``: how long SSH is retried while a VM boots. ``release_timeout``: how
      long teardown waits for the resource group to go.
    - ``credential``: an ``azure.core.credentials.TokenCredential``; by default
      ``DefaultAzureCredential`` (environment, managed identity, ``az login``...).
    - ``base_url``, ``connection_verify``, ``poll_interval``: the ARM endpoint (a sovereign
      cloud, Azure Stack Hub), a CA bundle to trust for it (also given to the VMs, for the
      watchdog), and seconds between polls of a long-running operation.
    """

    cloud: ClassVar[Cloud] = "azure"
    machine_option: ClassVar[str] = "vm_size"
    ssh_rule: ClassVar[str] = "the network security group"
    needs: ClassVar[tuple[str, ...]] = (
        "azure.identity",
        "azure.mgmt.compute",
        "azure.mgmt.network",
        "azure.mgmt.resource",
    )

    subscription_id: str | None = Field(default=None, pattern=r"^[0-9a-fA-F-]{36}$")
    location: str | tuple[str, ...] | None = None
    vm_size: str | None = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9_]+$")
    image: str | None = None
    max_price: float | None = Field(default=None, gt=0)
    address_space: str = "10.77.0.0/16"
    username: str = Field(default="skyward", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    disk_gb: int = Field(default=100, ge=30, le=4095)
    release_timeout: float = Field(default=1200.0, gt=0, le=MAX_SECONDS)
    self_delete: bool = True
    base_url: str | None = Field(default=None, pattern=r"^https://")
    connection_verify: str | None = None
    poll_interval: float = Field(default=5.0, ge=0, le=300)
    credential: Any = Field(default=None, exclude=True, repr=False)

    @field_validator("location")
    @classmethod
    def _locations(cls, value: str | tuple[str, ...] | None) -> str | tuple[str, ...] | None:
        names = [value] if isinstance(value, str) else list(value or [])
        for name in names:
            if not name or not name.replace(" ", "").isalnum():
                raise ValueError(f"location {name!r}: give a name such as 'eastus'")
        if isinstance(value, tuple) and not value:
            raise ValueError("give at least one location")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None:
            arm.ImageRef.parse(value)
        return value

    @field_validator("address_space")
    @classmethod
    def _network(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_network(value, strict=False))
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a network such as '203.0.113.7/32'") from exc

    @field_validator("username")
    @classmethod
    def _user(cls, value: str) -> str:
        if value in ("root", "admin", "administrator", "user", "test", "guest", "owner"):
            raise ValueError(f"Azure refuses {value!r} as an admin user name")
        return value

    @field_validator("credential")
    @classmethod
    def _credential(cls, value: Any) -> Any:
        if value is not None and not callable(getattr(value, "get_token", None)):
            raise ValueError("credential must be a TokenCredential (it has no get_token)")
        return value

    @property
    def locations(self) -> list[str]:
        """The locations to try, in order (``ValueError`` if none is given or set)."""
        value = self.location or os.environ.get("AZURE_DEFAULTS_LOCATION")
        if not value:
            raise ValueError(
                "no Azure location: pass sky.Azure(location='eastus') (or several, in order "
                "of preference), or set AZURE_DEFAULTS_LOCATION"
            )
        names = [value] if isinstance(value, str) else list(value)
        return [n.replace(" ", "").lower() for n in names]

    @property
    def subscription(self) -> str:
        found = self.subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")
        if not found:
            raise ProvisionError(
                "no Azure subscription: pass sky.Azure(subscription_id='...') or set "
                "AZURE_SUBSCRIPTION_ID (`az account show --query id -o tsv` prints yours)"
            )
        return found

    @property
    def catalog_region(self) -> str:
        return self.locations[0]

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is touched."""
        super().check(request)
        refuse_keyless(request.volumes, "Azure")
        _ = self.subscription
        machines = self.machines_for(request)
        if self.max_price is not None and self.strategy(request) in ("on-demand", "cheapest"):
            raise ValueError(
                "max_price is for spot VMs; this pool asks for none (give spot=True or "
                "allocation='spot' / 'spot-if-available')"
            )
        if self.connection_verify is not None and not Path(self.connection_verify).exists():
            raise ValueError(f"connection_verify: no CA bundle at {self.connection_verify}")
        self.refuse_above(request, machines, self.locations, lambda m, r: _list_price(m.type, r))

    def allocation(self, request: ProvisionRequest) -> AzureAllocation:
        return AzureAllocation(self.api(), request, **self.allocation_options)

    def api(self) -> Api:
        return Api.connect(
            subscription=self.subscription,
            credential=self.credential,
            base_url=self.base_url,
            connection_verify=self.connection_verify,
            polling_interval=self.poll_interval,
        )

    def inventory(self) -> Inventory | None:
        return AzureInventory(
            subscription=self.subscription,
            credential=self.credential,
            base_url=self.base_url,
            connection_verify=self.connection_verify,
            release_timeout=self.release_timeout,
        )

    # ── before anything is made ────────────────────────────────────────────────────────

    def offers(self, made: AzureAllocation, reporter: Reporter) -> tuple[list[Offer], None]:
        """Every (size, location, market) to try, in the strategy's order (``capacity.plan``;
        Azure's locations play the part of zones). Sizes Azure does not offer or restricts
        somewhere, and spot where a size has none, are left out, and said."""
        request, api, deadline = made.request, made.api, made.request.deadline
        deadline.check("checking the Azure credential")
        api.sign_in()
        deadline.check("listing the VM sizes Azure offers")
        skus = made.skus = {location: self._skus(api, location) for location in self.locations}
        machines = self._machines(request, skus)

        def refusal(machine: Machine, location: str) -> str | None:
            sku = skus[location].get(machine.type.lower())
            if sku is None:
                return "not offered there"
            if "restricted" in sku:
                return f"restricted for this subscription ({sku['restricted']})"
            return None

        zones, left_out = capacity.offered(machines, self.locations, refusal)

        # No spot price lookup: the cap is its ceiling, else the on-demand price (Azure's
        # own default maximum for a spot VM).
        price = prices(
            lambda m, location: _list_price(m.type, location), lambda m, _: self.max_price
        )
        offers = []
        for offer in capacity.plan(machines, zones, strategy=self.strategy(request), price=price):
            sku = skus[offer.zone][offer.machine.type.lower()]
            if offer.market == "spot" and sku.get("LowPriorityCapable") == "False":
                left_out.append(f"{offer.machine.type} in {offer.zone}: no spot VMs of this size")
                continue
            offers.append(offer)
        for line in left_out:
            reporter.status(line)
        if not offers:
            raise ProvisionError(
                f"no VM size of the pool can be had in {', '.join(self.locations)}: "
                + "; ".join(left_out)
            )
        return offers, None

    def _skus(self, api: Api, location: str) -> dict[str, dict[str, str]]:
        """The VM sizes Azure offers this subscription in ``location``: lower-cased name ->
        capabilities, plus ``restricted`` (why) when it may not be used there."""
        try:
            listed = api.call(
                lambda: list(api.compute.resource_skus.list(filter=f"location eq '{location}'")),
                f"listing the VM sizes of {location}",
            )
        except ProvisionError as exc:
            if not not_served(exc):
                raise
            # An endpoint without the SKU list (an Azure Stack, a stand-in of ARM): the
            # catalog's sizes are assumed, and a size the location lacks fails its create
            # with SkuNotAvailable, which moves the pool on as a restriction would have.
            _log.warning("%s; assuming the catalog's VM sizes in %s", exc, location)
            return {
                m.type.lower(): {
                    "vCPUs": str(m.vcpus),
                    "MemoryGB": str(m.ram_gb),
                    "GPUs": str(m.count),
                }
                for m in catalog.machines("azure")
            }
        found: dict[str, dict[str, str]] = {}
        for sku in listed:
            if str(sku.resource_type).lower() != "virtualmachines":
                continue
            capabilities = {str(c.name): str(c.value) for c in sku.capabilities or []}
            for restriction in sku.restrictions or []:
                # Zonal restrictions leave regional VMs alone. (The SDK gives enums here.)
                if str(getattr(restriction.type, "value", restriction.type)) == "Location":
                    reason = getattr(restriction.reason_code, "value", restriction.reason_code)
                    capabilities["restricted"] = str(reason)
            found[str(sku.name).lower()] = capabilities
        if not found:
            near = difflib.get_close_matches(location, _LOCATIONS, n=3)
            hint = f" Did you mean {' or '.join(near)}?" if near else ""
            raise ProvisionError(
                f"Azure lists no VM sizes in location {location!r} for this subscription.{hint}"
            )
        return found

    def _machines(
        self, request: ProvisionRequest, skus: Mapping[str, Mapping[str, Mapping[str, str]]]
    ) -> list[Machine]:
        """The machines to try; a ``vm_size`` the catalog lacks is described from Azure's SKU
        list (a typo is an error before anything exists)."""
        machines = self.machines_for(request)
        if machines or self.vm_size is None:
            return machines
        found = next(
            (s[self.vm_size.lower()] for s in skus.values() if self.vm_size.lower() in s), None
        )
        if found is None:
            raise ProvisionError(
                f"vm_size={self.vm_size!r}: Azure lists no such size in "
                f"{', '.join(self.locations)} for this subscription"
            )
        gpus = int(found.get("GPUs", "0") or 0)
        return self.described(
            request,
            accelerator="GPU" if gpus else None,
            count=gpus,
            memory_gb=0,
            vcpus=int(float(found.get("vCPUs", "0"))),
            ram_gb=float(found.get("MemoryGB", "0")),
        )

    # ── the steps ──────────────────────────────────────────────────────────────────────

    def prepare(self, made: AzureAllocation, offers: Sequence[Offer], reporter: Reporter) -> Launch:
        request, api, deadline = made.request, made.api, made.request.deadline
        first = offers[0]
        group = arm.group_name(request.pool)
        # For skyward ls / down: on Azure the resource group plays the key pair's part.
        key, host_key = self.pool_keys(
            made, region=first.zone, name=group, endpoint=self.base_url or ""
        )
        made.adopt_group(group)  # before the call: an answer lost in flight still counts
        deadline.check(f"creating resource group {group}")
        arm.create_group(api, group, first.zone, request.tags)
        reporter.status(f"resource group {group} in {first.zone}")
        cidrs = self.ssh_cidrs([self.address_space])

        def launch(offer: Offer) -> list[str]:
            location = offer.zone
            if location not in made.sites:
                deadline.check(f"making the network in {location}")
                made.sites[location] = arm.make_site(
                    api,
                    group,
                    location,
                    address_space=self.address_space,
                    ssh_cidrs=cidrs,
                    identity=self.self_delete,
                    tags=request.tags,
                    deadline=deadline,
                )
                reporter.status(f"network in {location}: SSH from {', '.join(cidrs)} only")
                if self.self_delete and made.sites[location].identity_client_id is None:
                    reporter.status(
                        f"warning: {self.base_url or 'Azure'} made no managed identity for the "
                        f"pool (see the log), so the idle watchdog can only power VMs off, "
                        f"which Azure keeps billing: `skyward down` deletes what a vanished "
                        f"client leaves"
                    )
            sku = made.skus[location][offer.machine.type.lower()]
            made.spec = self._spec(offer, sku, made.sites[location], key, host_key, request)
            for rank in range(request.nodes):
                reporter.phase(rank, "provisioning", offer.where)
            return made.launch(location, range(request.nodes), deadline)

        return launch

    def _spec(
        self,
        offer: Offer,
        sku: Mapping[str, str],
        site: arm.Site,
        key: PoolKey,
        host_key: HostKey,
        request: ProvisionRequest,
    ) -> arm.VmSpec:
        gpu = offer.machine.count > 0 or request.accelerator is not None
        files = []
        action = None
        if site.identity_client_id is not None:
            ca = Path(self.connection_verify).read_text() if self.connection_verify else None
            script = release_script(
                base_url=self.base_url or PUBLIC_CLOUD,
                client_id=site.identity_client_id,
                ca_pem=ca,
            )
            files.append({"path": RELEASE_PATH, "permissions": "0755", "content": script})
            action = RELEASE_PATH
        return arm.VmSpec(
            size=offer.machine.type,
            spot=offer.market == "spot",
            max_price=self.max_price,
            image=arm.ImageRef.parse(self.image or (GPU_IMAGE if gpu else CPU_IMAGE)),
            disk_gb=self.disk_gb,
            disk_type="Premium_LRS" if sku.get("PremiumIO") == "True" else "StandardSSD_LRS",
            username=self.username,
            public_key=key.public,
            user_data=self.boot(host_key, key, idle_action=action, files=files),
            public_ip=self.connect == "public",
            accelerated_networking=sku.get("AcceleratedNetworkingEnabled") == "True",
            tags=request.tags,
        )


def _list_price(size: str, location: str) -> float | None:
    """The on-demand list price of ``size`` in ``location``, else in the catalog's reference
    location (an estimate: Azure's prices differ a little between locations)."""
    return catalog.price("azure", size, location) or catalog.price("azure", size)
