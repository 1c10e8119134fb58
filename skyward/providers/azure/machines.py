"""One Azure pool's machines: the cloud contract's calls (``cloud/contract.py``) on Azure
Resource Manager. Azure's locations play the part of zones.

::

    offers      a token (credentials), Azure's SKU list for each location (sizes it does not
                offer or restricts are left out, a vm_size is described), priced
    prepare     the pool's resource group, its name recorded before it is asked for
    launch      per location tried: network, NSG, managed identity (once); then every
                node's VM at once, the boot payload as custom data, the self-delete as the
                watchdog's last act
    describe    the VM's power state, and its addresses once it runs
    delete      the resource group, which holds everything of the pool, and wait

Everything a pool makes is in its resource group: a failure or a Ctrl-C at any point, even
while a create is in flight, is cleaned up by deleting the group by name (deleting one
that never came to be is a no-op).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.azure import api as arm
from skyward.providers.azure.api import PUBLIC_CLOUD, REFUSALS, Api, failure_code
from skyward.providers.azure.watchdog import RELEASE_PATH, release_script
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud import capacity, catalog
from skyward.providers.cloud.boot import Boot
from skyward.providers.cloud.capacity import Offer, failover
from skyward.providers.cloud.catalog import Machine
from skyward.providers.cloud.contract import Described, Offers, Reach, State, Want
from skyward.providers.cloud.options import prices
from skyward.providers.cloud.record import Record
from skyward.providers.cloud.start import launch_each

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
_STATES: dict[str, State] = {"": "starting", "starting": "starting", "running": "running"}


class Settings(Protocol):
    """What the machines read of ``sky.Azure`` (``options.py``)."""

    @property
    def vm_size(self) -> str | None: ...
    @property
    def image(self) -> str | None: ...
    @property
    def max_price(self) -> float | None: ...
    @property
    def address_space(self) -> str: ...
    @property
    def username(self) -> str: ...
    @property
    def disk_gb(self) -> int: ...
    @property
    def release_timeout(self) -> float: ...
    @property
    def self_delete(self) -> bool: ...
    @property
    def base_url(self) -> str | None: ...
    @property
    def connection_verify(self) -> str | None: ...
    @property
    def connect(self) -> Literal["public", "private"]: ...
    @property
    def locations(self) -> list[str]: ...

    def machines_for(self, request: ProvisionRequest) -> list[Machine]: ...
    def described(self, request: ProvisionRequest, **facts: Any) -> list[Machine]: ...
    def ssh_cidrs(self, private_ranges: Sequence[str]) -> list[str]: ...


class AzureMachines:
    """A pool's resource group, its network per location (``sites``) and its VMs."""

    noun = "VM"
    prefix = "node-"
    instance_profile = False

    def __init__(self, options: Settings, api: Api, pool: str) -> None:
        self.options = options
        self.api = api
        self.group = arm.group_name(pool)
        # Read before anything is made: the VM sizes Azure offers, per location (lower-cased
        # name -> capabilities); made once per location tried: its network.
        self._skus: dict[str, dict[str, dict[str, str]]] = {}
        self._sites: dict[str, arm.Site] = {}
        self._boot: Boot | None = None
        self._tags: Mapping[str, str] = {}
        self._cidrs: list[str] = []
        self._spot = False
        self._reporter: Reporter | None = None  # the start's, from prepare on

    @property
    def scope(self) -> tuple[str, str]:
        return "", ""

    def key_label(self, first: Offer) -> tuple[str, str, str]:
        # For skyward ls / down: on Azure the resource group plays the key pair's part.
        return first.zone, self.group, self.options.base_url or ""

    def resume(self, name: str) -> None:
        self.group = name  # everything the pool made is in it

    # ── before anything is made ────────────────────────────────────────────────────────

    def offers(self, want: Want) -> Offers:
        """Every (size, location, market) to try, in the strategy's order. Sizes Azure does
        not offer or restricts somewhere, and spot where a size has none, are left out, and
        said."""
        options, api, deadline = self.options, self.api, want.deadline
        deadline.check("checking the Azure credential")
        api.sign_in()
        deadline.check("listing the VM sizes Azure offers")
        skus = self._skus = {location: self._sizes(location) for location in options.locations}
        machines = self._machines(want.request, skus)

        def refusal(machine: Machine, location: str) -> str | None:
            sku = skus[location].get(machine.type.lower())
            if sku is None:
                return "not offered there"
            if "restricted" in sku:
                return f"restricted for this subscription ({sku['restricted']})"
            return None

        zones, left_out = capacity.offered(machines, options.locations, refusal)
        # No spot price lookup: the cap is its ceiling, else the on-demand price (Azure's
        # own default maximum for a spot VM).
        price = prices(
            lambda m, location: list_price(m.type, location), lambda m, _: options.max_price
        )
        offers = []
        for offer in capacity.plan(machines, zones, strategy=want.strategy, price=price):
            sku = skus[offer.zone][offer.machine.type.lower()]
            if offer.market == "spot" and sku.get("LowPriorityCapable") == "False":
                left_out.append(f"{offer.machine.type} in {offer.zone}: no spot VMs of this size")
                continue
            offers.append(offer)
        for line in left_out:
            want.reporter.status(line)
        if not offers:
            raise ProvisionError(
                f"no VM size of the pool can be had in {', '.join(options.locations)}: "
                + "; ".join(left_out)
            )
        return Offers(offers, "")

    def _sizes(self, location: str) -> dict[str, dict[str, str]]:
        """The VM sizes Azure offers this subscription in ``location``: lower-cased name ->
        capabilities, plus ``restricted`` (why) when it may not be used there."""
        api = self.api
        listed = api.call(
            lambda: list(api.compute.resource_skus.list(filter=f"location eq '{location}'")),
            f"listing the VM sizes of {location}",
        )
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
        options = self.options
        machines = options.machines_for(request)
        if machines or options.vm_size is None:
            return machines
        size = options.vm_size.lower()
        found = next((s[size] for s in skus.values() if size in s), None)
        if found is None:
            raise ProvisionError(
                f"vm_size={options.vm_size!r}: Azure lists no such size in "
                f"{', '.join(options.locations)} for this subscription"
            )
        gpus = int(found.get("GPUs", "0") or 0)
        return options.described(
            request,
            accelerator="GPU" if gpus else None,
            count=gpus,
            memory_gb=0,
            vcpus=int(float(found.get("vCPUs", "0"))),
            ram_gb=float(found.get("MemoryGB", "0")),
        )

    # ── making ─────────────────────────────────────────────────────────────────────────

    def prepare(self, want: Want, offers: Sequence[Offer], boot: Boot, record: Record) -> None:
        first, request = offers[0], want.request
        self._boot, self._tags = boot, request.tags
        self._cidrs = self.options.ssh_cidrs([self.options.address_space])
        record.add("resource group", self.group)  # before the call: a lost answer still counts
        want.deadline.check(f"creating resource group {self.group}")
        arm.create_group(self.api, self.group, first.zone, request.tags)
        want.reporter.status(f"resource group {self.group} in {first.zone}")
        self._reporter = want.reporter

    def launch(
        self, offer: Offer, names: Sequence[str], record: Record, deadline: Deadline
    ) -> list[str]:
        location = offer.zone
        site = self._site(location, deadline)
        sku = self._skus[location][offer.machine.type.lower()]
        spec = self._spec(offer, sku, site)
        self._spot = spec.spot

        def create(name: str) -> None:
            # A refusal no other place changes (a quota, a permission) stops the pool; the
            # group's deletion cleans up.
            failover(
                lambda: arm.create_vm(self.api, self.group, site, spec, name, deadline),
                lambda exc: REFUSALS.refusal(failure_code(exc), spot=spec.spot),
            )

        down = f"skyward down --pool {record.pool}"
        timeout = self.options.release_timeout
        return launch_each(
            location, names, create, self.discard, release_timeout=timeout, down=down
        )

    def _site(self, location: str, deadline: Deadline) -> arm.Site:
        """The pool's network in ``location``, made the first time a launch goes there."""
        if location in self._sites:
            return self._sites[location]
        options, reporter = self.options, self._reporter
        assert reporter is not None, "prepare comes first"
        deadline.check(f"making the network in {location}")
        site = self._sites[location] = arm.make_site(
            self.api,
            self.group,
            location,
            address_space=options.address_space,
            ssh_cidrs=self._cidrs,
            identity=options.self_delete,
            tags=self._tags,
            deadline=deadline,
        )
        reporter.status(f"network in {location}: SSH from {', '.join(self._cidrs)} only")
        return site

    def _spec(self, offer: Offer, sku: Mapping[str, str], site: arm.Site) -> arm.VmSpec:
        options, boot = self.options, self._boot
        assert boot is not None, "prepare comes first"
        gpu = offer.machine.count > 0 or offer.machine.accelerator is not None
        if site.identity_client_id is not None:  # the watchdog deletes its VM, not powers off
            verify = options.connection_verify
            script = release_script(
                base_url=options.base_url or PUBLIC_CLOUD,
                client_id=site.identity_client_id,
                ca_pem=Path(verify).read_text() if verify else None,
            )
            hook = {"path": RELEASE_PATH, "permissions": "0755", "content": script}
            boot = boot.with_last_act(idle_action=RELEASE_PATH, files=[hook])
        return arm.VmSpec(
            size=offer.machine.type,
            spot=offer.market == "spot",
            max_price=options.max_price,
            image=arm.ImageRef.parse(options.image or (GPU_IMAGE if gpu else CPU_IMAGE)),
            disk_gb=options.disk_gb,
            disk_type="Premium_LRS" if sku.get("PremiumIO") == "True" else "StandardSSD_LRS",
            username=options.username,
            public_key=boot.authorized_key,
            user_data=boot.cloud_config(),
            public_ip=options.connect == "public",
            accelerated_networking=sku.get("AcceleratedNetworkingEnabled") == "True",
            tags=self._tags,
        )

    # ── the machines ───────────────────────────────────────────────────────────────────

    def describe(self, place: str, ids: Sequence[str], *, quick: bool = False) -> list[Described]:
        return [self._one(name) for name in ids]

    def _one(self, name: str) -> Described:
        try:
            view = self.api.compute.virtual_machines.instance_view(self.group, name)
        except Exception as exc:
            if failure_code(exc) in ("ResourceNotFound", "NotFound"):
                return Described("ended", "gone", why=self._why(gone=True))
            raise
        status = power_state(view) or ""
        state = _STATES.get(status, "ended")
        if state == "ended":
            return Described(state, status, why=self._why(gone=False))
        if state != "running":
            return Described(state, status)
        private, public = arm.addresses(self.api, self.group, name)
        if self.options.connect == "public" and not public:
            raise ProvisionError(f"VM {name} has no public address")
        host = public if self.options.connect == "public" and public else private
        return Described(state, status, Reach(host=host, peer=private))

    def _why(self, *, gone: bool) -> str:
        if self._spot:  # an evicted spot VM is deleted (eviction policy Delete)
            return "evicted by Azure" + (" (spot, eviction policy Delete)" if gone else "")
        if gone:
            return "deleted (its idle watchdog, or the API or portal)"
        return "stopped from inside (the idle watchdog, a shutdown) or through the API"

    def discard(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[str]:
        """Delete VMs and then their NICs and public IPs (a VM that failed to create may
        have left them); with no time to wait, only ask for the VMs' deletion."""
        if deadline.remaining() <= 0:
            for name in ids:
                try:
                    self.api.compute.virtual_machines.begin_delete(
                        self.group, name, force_deletion=True
                    )
                except Exception:
                    pass  # gone already; the group's deletion at the end takes the rest
            return []
        try:
            arm.delete_vms(self.api, self.group, list(ids), deadline)
        except ProvisionError as exc:
            return [str(exc)]
        return []

    def delete(self, record: Record, deadline: Deadline) -> list[str]:
        """The resource group, which holds everything of the pool, waited for."""
        if not record.resources("resource group"):
            return []
        why = arm.delete_group(self.api, self.group, timeout=max(deadline.remaining(), 1.0))
        return [] if why is None else [f"resource group {self.group} ({why})"]


def power_state(view: Any) -> str | None:
    """``"running"``, ``"deallocated"``, ``"stopped"``... from an instance view."""
    for status in getattr(view, "statuses", None) or []:
        code = str(getattr(status, "code", "") or "")
        if code.startswith("PowerState/"):
            return code.split("/", 1)[1]
    return None


def list_price(size: str, location: str) -> float | None:
    """The on-demand list price of ``size`` in ``location``, else in the catalog's reference
    location (an estimate: Azure's prices differ a little between locations)."""
    return catalog.price("azure", size, location) or catalog.price("azure", size)
