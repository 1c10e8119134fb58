"""``sky.Verda``: the options of a pool on Verda (formerly DataCrunch), checked when the pool
is built (credentials included: a token is fetched then, before anything is rented), and the
pool's ``VerdaMachines`` (``machines.py``) with its API connected."""

from __future__ import annotations

import os
from typing import ClassVar

from pydantic import AliasChoices, Field

from skyward._errors import ProvisionError
from skyward.providers.base import Inventory, ProvisionRequest
from skyward.providers.cloud.catalog import Cloud
from skyward.providers.cloud.options import CloudOptions
from skyward.providers.verda.api import Api
from skyward.providers.verda.inventory import VerdaInventory
from skyward.providers.verda.machines import VerdaMachines
from skyward.providers.volumes import refuse_keyless


class Verda(CloudOptions):
    """Run the pool's nodes on Verda instances (GPU VMs, NVIDIA driver installed) made for it.

    - ``client_id`` / ``client_secret``: an API key's OAuth client credentials; by default
      ``VERDA_CLIENT_ID`` / ``VERDA_CLIENT_SECRET``. They stay on this machine.
    - ``location``: the location tried first (``"FIN-01"``; ``region=`` is taken too); the
      others follow, wherever the type is available now.
    - ``instance_type``: wins over the pool's ``accelerator`` (``"H100:8"`` is an
      8H100.80S.176V). ``image``: one of Verda's OS images (default: Ubuntu with CUDA for
      GPU types). ``os_volume_gb``: the OS volume, deleted with the instance.
    - ``spot``: spot instances (``is_spot``). ``endpoint_url``: where the API calls go (a
      proxy, a test server). The other options are ``sky.AWS``'s (``CloudOptions``), but
      Verda has one address per instance and no firewall: ``connect`` is ``"public"`` and
      ``ssh_cidr`` cannot be narrowed.
    """

    cloud: ClassVar[Cloud] = "verda"
    machine_option: ClassVar[str] = "instance_type"
    ssh_rule: ClassVar[str] = "Verda's network"
    needs: ClassVar[tuple[str, ...]] = ()  # plain HTTP: no SDK

    client_id: str | None = Field(default=None, repr=False)
    client_secret: str | None = Field(default=None, repr=False)
    endpoint_url: str | None = Field(default=None, pattern=r"^https?://")
    location: str | None = Field(
        default=None,
        pattern=r"^[A-Z]{3}-\d{2}$",
        validation_alias=AliasChoices("location", "region"),
    )
    instance_type: str | None = Field(default=None, pattern=r"^[A-Za-z0-9.]+$")
    image: str | None = Field(default=None, min_length=1)
    os_volume_gb: int = Field(default=100, ge=50, le=16384)
    username: str = Field(default="root", pattern=r"^[a-z_][a-z0-9_-]*$")

    def check(self, request: ProvisionRequest) -> None:
        """When the pool is built: the options, then the credentials (a token is fetched)."""
        super().check(request)
        refuse_keyless(request.volumes, "Verda")
        if self.connect == "private" or self.ssh_cidr != "auto":
            raise ValueError(
                "Verda instances have one, public, address and the API has no firewall: "
                "leave connect and ssh_cidr out (SSH takes only the pool's key)"
            )
        self.refuse_above(request, self.machines_for(request), ["FIN-01"])
        self.api().token()

    def machines(self, request: ProvisionRequest) -> VerdaMachines:
        return VerdaMachines(self, self.api(), request.pool)

    def inventory(self) -> Inventory | None:
        return VerdaInventory(self.api, release_timeout=self.release_timeout)

    def hint(self) -> str:
        return "check that this machine reaches the instances' public addresses on port 22."

    def api(self) -> Api:
        """The account's API; ``ProvisionError`` when no credentials are given or set."""
        client_id = self.client_id or os.environ.get("VERDA_CLIENT_ID")
        secret = self.client_secret or os.environ.get("VERDA_CLIENT_SECRET")
        if not client_id or not secret:
            raise ProvisionError(
                "no Verda credentials: set VERDA_CLIENT_ID and VERDA_CLIENT_SECRET (an API "
                "key's client id and secret, from console.verda.com), or pass "
                "sky.Verda(client_id=..., client_secret=...)"
            )
        return Api(client_id, secret, self.endpoint_url or os.environ.get("SKYWARD_VERDA_ENDPOINT"))
