"""``Azure(...)``: nodes are Azure VMs in a resource group the pool creates and always deletes.

::

    provision   check the credential (a token, before anything exists) → plan: the VM sizes
                and locations to try, from the catalog and Azure's SKU list (sizes it does
                not offer or restricts are left out up front) and the allocation strategy →
                the pool's resource group → per location tried: network, NSG, identity →
                every node's VM at once; no room (SkuNotAvailable, AllocationFailed, a spot
                request refused, a quota) deletes that attempt's VMs and tries the next →
                reach each VM over SSH with the host key we made pinned (``ssh/hosts``)
    terminate   close the nodes → delete the resource group and wait
    inventory   resource groups tagged skyward-pool in the subscription (``skyward ls``/``down``)

The SDKs are imported only when a pool uses Azure; the calls and their error messages live
in ``api``, the resources in ``resources``, the idle watchdog's last step in ``watchdog``.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skyward._errors import HostKeyError, ProvisionError
from skyward._extras import check
from skyward._phases import Reporter
from skyward.providers import catalog
from skyward.providers.azure import resources as arm
from skyward.providers.azure.allocation import AzureAllocation, power_state
from skyward.providers.azure.api import CAPACITY, Api, failure_code
from skyward.providers.azure.inventory import AzureInventory
from skyward.providers.azure.watchdog import RELEASE_PATH, release_script
from skyward.providers.base import Allocation, Inventory, ProvisionRequest
from skyward.providers.cloud import (
    DEFAULT_IP_LOOKUP,
    HostKey,
    WatchedDeadline,
    client_cidr,
    open_or_destroy,
    user_data,
)
from skyward.providers.ssh.connection import PoolKey
from skyward.providers.ssh.hosts import Access, HostNode, open_hosts

# Microsoft's Ubuntu HPC image (NVIDIA driver, CUDA, NCCL, InfiniBand) for GPU sizes;
# Canonical's Ubuntu 24.04 for CPU ones. Both run cloud-init at boot.
GPU_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
CPU_IMAGE = "Canonical:ubuntu-24_04-lts:server:latest"
_MAX_SECONDS = 7 * 24 * 3600.0
_QUOTA_CODES = ("OperationNotAllowed", "QuotaExceeded")
_WATCH_POLL = 2.0  # seconds between looks at the VMs while they are reached
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


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to make the pool: a size, in a location, spot or not."""

    location: str
    size: str
    spot: bool
    sku: dict[str, str]  # the SKU's capabilities, as Azure lists them

    def describe(self) -> str:
        return f"{self.size}{' (spot)' if self.spot else ''} in {self.location}"


class Azure(BaseModel):
    """Run the pool's nodes on Azure VMs made for it, in a resource group of its own.

    - ``subscription_id``: by default ``AZURE_SUBSCRIPTION_ID``.
    - ``location``: a location, or several in order of preference (failover); by default
      ``AZURE_DEFAULTS_LOCATION`` (the Azure CLI's default location).
    - ``vm_size``: wins over the pool's ``accelerator``, which otherwise picks it from the
      catalog (``"A100"`` is a Standard_NC24ads_A100_v4, 1 GPU; ``"A100:8"`` an ND96asr_v4).
    - ``image``: ``publisher:offer:sku:version`` or an image's resource id; by default
      Ubuntu HPC (NVIDIA driver) for GPU sizes, Ubuntu 24.04 for CPU ones.
    - ``spot``, ``max_price``: spot VMs (evicted means deleted), at most ``max_price`` USD an
      hour each (default: up to the on-demand price).
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

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    subscription_id: str | None = Field(default=None, pattern=r"^[0-9a-fA-F-]{36}$")
    location: str | tuple[str, ...] | None = None
    vm_size: str | None = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9_]+$")
    image: str | None = None
    spot: bool = False
    max_price: float | None = Field(default=None, gt=0)
    connect: Literal["public", "private"] = "public"
    ssh_cidr: str = "auto"
    address_space: str = "10.77.0.0/16"
    username: str = Field(default="skyward", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    disk_gb: int = Field(default=100, ge=30, le=4095)
    idle_timeout: float = Field(default=1800.0, gt=0, le=_MAX_SECONDS)
    boot_timeout: float = Field(default=600.0, gt=0, le=_MAX_SECONDS)
    release_timeout: float = Field(default=1200.0, gt=0, le=_MAX_SECONDS)
    self_delete: bool = True
    ip_lookup_url: str = DEFAULT_IP_LOOKUP
    base_url: str | None = Field(default=None, pattern=r"^https://")
    connection_verify: str | None = None
    poll_interval: float = Field(default=5.0, ge=0, le=300)
    credential: Any = Field(default=None, exclude=True, repr=False)
    python: str | None = Field(default=None, min_length=1)
    workdir: str = Field(default="~/.cache/skyward", pattern=r"^(/|~/|~$)")

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

    @field_validator("ssh_cidr", "address_space")
    @classmethod
    def _network(cls, value: str) -> str:
        if value == "auto":
            return value
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

    @model_validator(mode="after")
    def _price_needs_spot(self) -> Azure:
        if self.max_price is not None and not self.spot:
            raise ValueError("max_price is for spot VMs: give spot=True as well")
        return self

    @property
    def kind(self) -> str:
        return "azure"

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

    def strategy(self, request: ProvisionRequest) -> str:
        """The allocation strategy: the pool's ``allocation``, else ``spot``'s."""
        wanted = request.allocation or ("spot" if self.spot else "on-demand")
        if self.spot and wanted in ("on-demand", "cheapest"):
            raise ValueError(f"sky.Azure(spot=True) contradicts allocation={wanted!r}")
        return wanted

    def sizes_for(self, request: ProvisionRequest) -> list[catalog.Machine | str]:
        """The sizes the pool may use, preferred first (``ValueError`` if none): ``vm_size``,
        or the catalog's machines for the accelerator, smallest first."""
        if self.vm_size is not None:
            return [self.vm_size]
        first = catalog.choose("azure", request.accelerator)
        if request.accelerator is None:
            return [m for m in catalog.machines("azure") if m.accelerator is None]
        wanted = catalog.parse(request.accelerator)
        return [
            m
            for m in catalog.machines("azure")
            if m.accelerator == first.accelerator
            and (wanted.count is None or m.count == wanted.count)
            and (wanted.memory_gb is None or m.memory_gb == wanted.memory_gb)
        ]

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is touched."""
        for module in ("azure.identity", "azure.mgmt.compute", "azure.mgmt.network"):
            check(module, feature="sky.Azure")
        check("azure.mgmt.resource", feature="sky.Azure")
        check("paramiko", feature="sky.Azure")
        self.sizes_for(request)
        self.strategy(request)
        _ = self.locations
        _ = self.subscription
        if self.connection_verify is not None and not Path(self.connection_verify).exists():
            raise ValueError(f"connection_verify: no CA bundle at {self.connection_verify}")

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        self.check(request)
        api = self.api()
        deadline = request.deadline
        deadline.check("checking the Azure credential")
        api.sign_in()
        deadline.check("choosing VM sizes")
        candidates, skipped = self._plan(api, request)
        for why in skipped:
            reporter.status(why)
        allocation = AzureAllocation(
            api,
            request,
            connect=self.connect,
            username=self.username,
            release_timeout=self.release_timeout,
        )
        return open_or_destroy(
            allocation, lambda made: self._build(made, candidates, skipped, reporter)
        )

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

    def _plan(self, api: Api, request: ProvisionRequest) -> tuple[list[Candidate], list[str]]:
        """Every (location, size, spot) to try, in order, and why others were left out."""
        strategy = self.strategy(request)
        sizes = self.sizes_for(request)
        if strategy == "cheapest":
            sizes.sort(key=lambda m: (_price(m) is None, _price(m) or 0.0))
        spot_order = {
            "spot": [True],
            "on-demand": [False],
            "cheapest": [False],
            "spot-if-available": [True, False],
        }[strategy]
        candidates: list[Candidate] = []
        skipped: list[str] = []
        for location in self.locations:
            offered = self._skus(api, location)
            fitting: list[tuple[catalog.Machine | str, dict[str, str]]] = []
            reasons: dict[str, str] = {}
            for size in sizes:
                sku = offered.get(_name(size).lower())
                why = _unfit(sku, request)
                if why:
                    reasons[_name(size)] = why
                else:
                    assert sku is not None
                    fitting.append((size, sku))
            if not fitting:
                skipped += [f"{name} in {location}: {why}" for name, why in reasons.items()]
                continue
            # The smallest that fits, and as alternates only sizes of its shape (the next
            # catalog type with as many GPUs: A100 40 GB -> 80 GB); worth saying which of
            # those Azure will not give here.
            shape = _shape(fitting[0][0])
            fitting = [(size, sku) for size, sku in fitting if _shape(size) == shape]
            skipped += [
                f"{_name(size)} in {location}: {reasons[_name(size)]}"
                for size in sizes
                if _shape(size) == shape
                and reasons.get(_name(size), "").startswith(("not offered", "restricted"))
            ]
            for spot in spot_order:
                for size, sku in fitting:
                    if spot and sku.get("LowPriorityCapable", "True") == "False":
                        skipped.append(f"{_name(size)} in {location}: no spot VMs of this size")
                        continue
                    candidates.append(Candidate(location, _name(size), spot, sku))
        if not candidates:
            raise ProvisionError(
                f"no VM size fits the pool in {', '.join(self.locations)}: " + "; ".join(skipped)
            )
        return candidates, skipped

    def _skus(self, api: Api, location: str) -> dict[str, dict[str, str]]:
        """The VM sizes Azure offers this subscription in ``location``: lower-cased name ->
        capabilities, plus ``restricted`` (why) when it may not be used there."""
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
                if str(restriction.type) == "Location":  # zonal restrictions leave regional VMs
                    capabilities["restricted"] = str(restriction.reason_code)
            found[str(sku.name).lower()] = capabilities
        if not found:
            near = difflib.get_close_matches(location, _LOCATIONS, n=3)
            hint = f" Did you mean {' or '.join(near)}?" if near else ""
            raise ProvisionError(
                f"Azure lists no VM sizes in location {location!r} for this subscription.{hint}"
            )
        return found

    # ── the steps ──────────────────────────────────────────────────────────────────────

    def _build(
        self,
        made: AzureAllocation,
        candidates: list[Candidate],
        skipped: list[str],
        reporter: Reporter,
    ) -> None:
        request, api, deadline = made.request, made.api, made.request.deadline
        first = candidates[0]
        for rank in range(request.nodes):
            reporter.phase(rank, "provisioning", first.describe())
        _report_price(reporter, request.nodes, first)
        key = PoolKey()
        made.adopt_pool_key(key)
        host_key = HostKey.generate()
        made.host_key = host_key.public
        made.access = Access(
            key_file=key.path,
            python=self.python,
            workdir=self.workdir,
            boot_timeout=self.boot_timeout,
        )
        group = arm.group_name(request.pool)
        made.adopt_group(group)
        deadline.check(f"creating resource group {group}")
        arm.create_group(api, group, first.location, request.tags)
        reporter.status(f"resource group {group} in {first.location}")
        cidrs = self._ssh_cidrs()
        names = [f"node-{rank}" for rank in range(request.nodes)]
        sites: dict[str, arm.Site] = {}
        tried: list[str] = []
        for candidate in candidates:
            if candidate.location not in sites:
                deadline.check(f"making the network in {candidate.location}")
                sites[candidate.location] = arm.make_site(
                    api,
                    group,
                    candidate.location,
                    address_space=self.address_space,
                    ssh_cidrs=cidrs,
                    identity=self.self_delete,
                    tags=request.tags,
                    deadline=deadline,
                )
                reporter.status(
                    f"network in {candidate.location}: SSH from {', '.join(cidrs)} only"
                )
            site = sites[candidate.location]
            spec = self._spec(candidate, site, key, host_key, request)
            made.adopt_vms(site, spec, names)
            deadline.check(f"creating {request.nodes} VM(s): {candidate.describe()}")
            for rank in range(request.nodes):
                reporter.phase(rank, "provisioning", candidate.describe())
            try:
                arm.create_vms(api, group, site, spec, names, deadline)
                break
            except ProvisionError as exc:
                code = failure_code(exc)
                if code not in CAPACITY and code not in _QUOTA_CODES:
                    raise
                tried.append(f"{candidate.describe()}: {exc}")
                reporter.status(f"no room: {candidate.describe()} ({code}); trying the next")
                arm.delete_vms(api, group, names, deadline)
                if candidate is candidates[-1]:
                    if len(tried) == 1 and not skipped:
                        raise
                    raise ProvisionError(
                        f"no capacity for {request.nodes} VM(s) anywhere the pool may go. "
                        f"Tried: {'; '.join(tried)}"
                        + (f". Left out: {'; '.join(skipped)}" if skipped else "")
                    ) from exc
        made.nodes = list(self._open(made, names, reporter))

    def _spec(
        self,
        candidate: Candidate,
        site: arm.Site,
        key: PoolKey,
        host_key: HostKey,
        request: ProvisionRequest,
    ) -> arm.VmSpec:
        gpu = int(candidate.sku.get("GPUs", "0") or 0) > 0 or request.accelerator is not None
        files = []
        action = None
        if site.identity_client_id is not None:
            ca = Path(self.connection_verify).read_text() if self.connection_verify else None
            script = release_script(
                base_url=self.base_url or "https://management.azure.com",
                client_id=site.identity_client_id,
                ca_pem=ca,
            )
            files.append({"path": RELEASE_PATH, "permissions": "0755", "content": script})
            action = RELEASE_PATH
        return arm.VmSpec(
            size=candidate.size,
            spot=candidate.spot,
            max_price=self.max_price,
            image=arm.ImageRef.parse(self.image or (GPU_IMAGE if gpu else CPU_IMAGE)),
            disk_gb=self.disk_gb,
            disk_type="Premium_LRS"
            if candidate.sku.get("PremiumIO") == "True"
            else "StandardSSD_LRS",
            username=self.username,
            public_key=key.public,
            user_data=user_data(
                host_key=host_key,
                authorized_key=key.public,
                idle_timeout=self.idle_timeout,
                # A machine waits for its first client as long as the client waits for it.
                first_client_timeout=self.boot_timeout,
                idle_action=action,
                files=files,
            ),
            public_ip=self.connect == "public",
            accelerated_networking=candidate.sku.get("AcceleratedNetworkingEnabled") == "True",
            tags=request.tags,
        )

    def _ssh_cidrs(self) -> list[str]:
        if self.ssh_cidr == "auto" and self.connect == "private":
            return [self.address_space]
        return [client_cidr(self.ssh_cidr, lookup_url=self.ip_lookup_url)]

    def _open(
        self, made: AzureAllocation, names: Sequence[str], reporter: Reporter
    ) -> list[HostNode]:
        """Reach every VM over SSH and prepare it: the shared remote-host layer."""
        assert made.access is not None and made.group is not None
        targets = [made.target(name) for name in names]
        # A VM that ends while it is being reached (a spot eviction, its watchdog) fails the
        # start at once, with Azure's reason, rather than after boot_timeout.
        deadline = WatchedDeadline(made.request.deadline)
        stop = threading.Event()
        threading.Thread(
            target=_watch_vms,
            args=(made, list(names), deadline, stop),
            name="skyward-azure-watch",
            daemon=True,
        ).start()
        try:
            request = dataclasses.replace(made.request, deadline=deadline)
            return open_hosts(targets, made.access, request, reporter)
        except (ProvisionError, TimeoutError) as exc:
            if deadline.failure is None and not isinstance(exc, HostKeyError):
                exc.add_note(
                    f"The VMs are running, but SSH did not answer from here: check that this "
                    f"machine's address is inside the SSH range (ssh_cidr={self.ssh_cidr!r}) "
                    f"and that their {self.connect} addresses are reachable from this network."
                )
            raise
        finally:
            stop.set()


def _name(size: catalog.Machine | str) -> str:
    return size.type if isinstance(size, catalog.Machine) else size


def _price(size: catalog.Machine | str) -> float | None:
    return catalog.price("azure", _name(size))


def _shape(size: catalog.Machine | str) -> tuple[int, int] | str:
    """What alternates must share: GPUs per VM (vCPUs for a CPU size); a given size is its
    own shape."""
    if isinstance(size, str):
        return size
    return (size.count, size.vcpus if size.count == 0 else 0)


def _unfit(sku: dict[str, str] | None, request: ProvisionRequest) -> str:
    """Why a size cannot hold the pool's nodes (``""`` if it can)."""
    if sku is None:
        return "not offered there to this subscription"
    if "restricted" in sku:
        return f"restricted there for this subscription ({sku['restricted']})"
    cpus, memory = float(sku.get("vCPUs", 0)), float(sku.get("MemoryGB", 0))
    if request.vcpus is not None and cpus < request.vcpus:
        return f"{cpus:g} vCPUs, fewer than vcpus={request.vcpus:g}"
    if request.memory_gb is not None and memory < request.memory_gb:
        return f"{memory:g} GB of memory, less than memory_gb={request.memory_gb:g}"
    return ""


def _report_price(reporter: Reporter, nodes: int, candidate: Candidate) -> None:
    hourly = catalog.price("azure", candidate.size)
    if candidate.spot or hourly is None:
        reporter.status(f"{nodes}x {candidate.describe()}")
        return
    reporter.status(
        f"{nodes}x {candidate.describe()}: about ${nodes * hourly:.2f}/h for the pool (list price)"
    )


def _watch_vms(
    made: AzureAllocation, names: list[str], deadline: WatchedDeadline, stop: threading.Event
) -> None:
    """Fail ``deadline`` as soon as one of the VMs is gone or stopped (until ``stop``)."""
    assert made.group is not None
    while not stop.wait(_WATCH_POLL):
        for name in names:
            try:
                view = made.api.compute.virtual_machines.instance_view(made.group, name)
            except Exception as exc:
                if failure_code(exc) in ("ResourceNotFound", "NotFound"):
                    deadline.fail(made.loss_reason(names.index(name)) or f"VM {name} is gone")
                    return
                continue  # a hint only; the connections' own bounds still hold
            power = power_state(view)
            if power in ("deallocated", "deallocating", "stopped", "stopping"):
                deadline.fail(f"VM {name} is {power}")
                return
