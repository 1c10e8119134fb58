"""``sky.VastAI(...)``: the options of a Vast.ai pool, checked when the pool is built."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AliasChoices, Field, field_validator

from skyward.providers.base import Inventory, ProvisionRequest, refuse_gang
from skyward.providers.cloud.catalog import Cloud, Machine
from skyward.providers.cloud.options import CloudOptions
from skyward.providers.vastai import api as vast
from skyward.providers.vastai.inventory import VastInventory
from skyward.providers.vastai.machines import REGIONS, VastMachines, ubuntu, wanted_gpus
from skyward.providers.volumes import refuse_keyless


class VastAI(CloudOptions):
    """Run the pool's nodes on Vast.ai instances (containers rented on marketplace hosts),
    rented for it and always destroyed.

    - ``api_key``: by default ``VAST_API_KEY``, else the key ``vastai set api-key`` saved
      (``~/.config/vastai/vast_api_key``, ``~/.vast_api_key``). It stays on this machine.
    - The pool's ``accelerator`` picks the GPU (``"RTX_4090"``, ``"A100-80GB:2"``); the
      cheapest offers that match are rented, one instance per node. Offers are filtered by
      ``min_reliability``, ``verified`` hosts, ``geolocation`` (country codes such as
      ``"US"`` or ``["DE", "NL"]``, or a region: ``"NA"``, ``"EU"``, ``"AS"``...),
      ``min_cuda`` (the host driver's CUDA), and the pool's ``vcpus=``/``memory_gb=``.
    - ``spot`` / ``allocation="spot"``: interruptible instances, bidding ``bid_multiplier``
      times the offer's minimum bid.
    - ``image``: a Docker image (default: ``VastAI.ubuntu()``, NVIDIA's CUDA runtime on
      Ubuntu 24.04); ``disk_gb`` its disk. ``endpoint_url``: a private or test endpoint.
    """

    cloud: ClassVar[Cloud] = "vastai"
    machine_option: ClassVar[str] = "image"  # (read by machines_for, which has no catalog here)
    ssh_rule: ClassVar[str] = "the host's port mapping"
    needs: ClassVar[tuple[str, ...]] = ()  # plain HTTP: paramiko alone

    api_key: str | None = Field(default=None, repr=False)
    endpoint_url: str | None = None
    geolocation: str | tuple[str, ...] | None = None
    min_reliability: float = Field(default=0.95, ge=0, le=1)
    verified: bool = Field(default=True, validation_alias=AliasChoices("verified", "verified_only"))
    min_cuda: float | None = Field(default=12.0, ge=0)
    bid_multiplier: float = Field(default=1.2, ge=1)
    image: str | None = Field(
        default=None, min_length=1, validation_alias=AliasChoices("image", "docker_image")
    )
    disk_gb: int = Field(default=100, ge=8, le=8192)
    username: str = Field(default="root", pattern=r"^[a-z_][a-z0-9_-]*$")

    @field_validator("geolocation", mode="before")
    @classmethod
    def _places(cls, value: object) -> object:
        codes = [value] if isinstance(value, str) else value
        if codes is None or not isinstance(codes, list | tuple):
            return value
        bad = [c for c in codes if not (isinstance(c, str) and len(c) == 2 and c.isalpha())]
        if bad or not codes:
            raise ValueError(
                f"geolocation is a two-letter country code ('US') or region "
                f"({', '.join(REGIONS)}), or a list of them; not {value!r}"
            )
        return tuple(c.upper() for c in codes)

    @classmethod
    def ubuntu(
        cls, version: str = "24.04", cuda: str = "12.9.1", cuda_dist: str = "runtime"
    ) -> str:
        """NVIDIA's CUDA image of that Ubuntu, CUDA and flavour (``"runtime"``/``"devel"``),
        for ``image=``: ``nvcr.io/nvidia/cuda:12.9.1-runtime-ubuntu24.04`` by default."""
        return ubuntu(version, cuda, cuda_dist)

    def machines_for(self, request: ProvisionRequest, region: str | None = None) -> list[Machine]:
        return []  # no catalog: Vast's offers are live (``machines.py``)

    def hint(self) -> str:
        return (
            "check that this network reaches the instances' public addresses on their mapped "
            "SSH ports; the start script's errors are in the instance's log on cloud.vast.ai"
        )

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is rented."""
        super().check(request)
        refuse_gang(
            request,
            "Vast.ai's instances are containers on separate hosts with no "
            "network between them (each is reached only through its mapped ports)",
        )
        refuse_keyless(request.volumes, "Vast.ai")
        wanted_gpus(request.accelerator)
        vast.api_key(self.api_key)

    def connected(self) -> vast.Api:
        return vast.Api(vast.api_key(self.api_key), self.endpoint_url or vast.ENDPOINT)

    def machines(self, request: ProvisionRequest) -> VastMachines:
        return VastMachines(self, self.connected(), request.pool)

    def inventory(self) -> Inventory | None:
        return VastInventory(self.connected, release_timeout=self.release_timeout)
