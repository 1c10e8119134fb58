"""``sky.Azure``: the options of a pool on Azure, checked when the pool is built, and the
pool's ``AzureMachines`` (``machines.py``) with its API connected."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from skyward._errors import ProvisionError
from skyward.providers.azure import api as arm
from skyward.providers.azure.api import Api
from skyward.providers.azure.inventory import AzureInventory
from skyward.providers.azure.machines import AzureMachines, list_price
from skyward.providers.base import Inventory, ProvisionRequest
from skyward.providers.cloud.catalog import Cloud
from skyward.providers.cloud.options import MAX_SECONDS, CloudOptions
from skyward.providers.volumes import refuse_keyless


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
        self.refuse_above(request, machines, self.locations, lambda m, r: list_price(m.type, r))

    def machines(self, request: ProvisionRequest) -> AzureMachines:
        return AzureMachines(self, self.api(), request.pool)

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
