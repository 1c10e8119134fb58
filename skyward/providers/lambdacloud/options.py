"""``sky.Lambda``: the options of a pool on Lambda Cloud, checked when the pool is built, and
the pool's ``LambdaMachines`` (``machines.py``) with its API key found."""

from __future__ import annotations

import os
from typing import ClassVar

from pydantic import Field, model_validator

from skyward.providers.base import Inventory, ProvisionRequest, refuse_spot
from skyward.providers.cloud import catalog
from skyward.providers.cloud.catalog import Cloud, Machine
from skyward.providers.cloud.options import CloudOptions
from skyward.providers.lambdacloud.api import ENDPOINT, Api, find_key
from skyward.providers.lambdacloud.inventory import LambdaInventory
from skyward.providers.lambdacloud.machines import LambdaMachines
from skyward.providers.volumes import refuse_keyless


class Lambda(CloudOptions):
    """Run the pool's nodes on Lambda Cloud GPU instances made for it, in one region.

    - ``api_key``: by default ``LAMBDA_API_KEY``, or the ``api_key = ...`` line of
      ``~/.lambda_cloud/lambda_keys``. A missing key is an error when the pool is built; a
      refused one, at Lambda's first answer, before anything is rented.
    - ``region``: the only region to use (``"us-east-1"``); by default the first region
      where Lambda has capacity for the machine now.
    - ``instance_type``: wins over the pool's ``accelerator``, which otherwise picks it from
      the catalog (``"H100"`` is a gpu_1x_h100_pcie; ``"H100:8"`` a gpu_8x_h100_sxm5).
    - ``file_system``: the name of a Lambda file system to attach (it lives in one region:
      give ``region`` too).
    - ``username``: the image's login user (Lambda Stack: ``ubuntu``). The other options are
      ``CloudOptions``' (``ssh_cidr``, ``connect``, the watchdog's and the waits' bounds).
    - ``endpoint_url``: where the API calls go (a proxy, a test server).

    Lambda rents on-demand instances only: ``allocation="spot"`` is refused, and
    ``"spot-if-available"`` gets on-demand ones.
    """

    cloud: ClassVar[Cloud] = "lambdacloud"
    machine_option: ClassVar[str] = "instance_type"
    ssh_rule: ClassVar[str] = "the pool's firewall ruleset"
    needs: ClassVar[tuple[str, ...]] = ()

    api_key: str | None = Field(default=None, min_length=1, repr=False)
    endpoint_url: str | None = Field(default=None, pattern=r"^https?://")
    region: str | None = Field(default=None, pattern=r"^[a-z]+-[a-z]+-\d+$")
    file_system: str | None = Field(default=None, min_length=1, max_length=64)
    instance_type: str | None = Field(default=None, pattern=r"^[a-z0-9_]+$")
    username: str = Field(default="ubuntu", pattern=r"^[a-z_][a-z0-9_-]*$")

    @model_validator(mode="after")
    def _file_system_region(self) -> Lambda:
        if self.file_system is not None and self.region is None:
            raise ValueError("a file system lives in one region: give region= with file_system=")
        return self

    @property
    def endpoint(self) -> str:
        return self.endpoint_url or os.environ.get("SKYWARD_LAMBDA_ENDPOINT") or ENDPOINT

    def machines_for(self, request: ProvisionRequest, region: str | None = None) -> list[Machine]:
        if request.accelerator is None and self.instance_type is None:
            raise ValueError(
                "Lambda Cloud rents GPU machines only: give the pool an accelerator (such as "
                "'H100' or 'A100:8') or sky.Lambda(instance_type=...)"
            )
        # A type the catalog lacks: Lambda's instance-types says whether it is offered.
        found = super().machines_for(request, region)
        return found or [Machine(self.cloud, str(self.instance_type), None, 0, 0, 0)]

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is touched."""
        super().check(request)
        if self.spot:
            raise ValueError("sky.Lambda(spot=True): Lambda Cloud has no spot instances")
        refuse_spot(request, "Lambda Cloud rents on-demand instances only")
        refuse_keyless(request.volumes, "Lambda Cloud")
        reference = catalog.REFERENCE_REGION[self.cloud]
        self.refuse_above(request, self.machines_for(request), [reference])
        find_key(self.api_key)

    def machines(self, request: ProvisionRequest) -> LambdaMachines:
        return LambdaMachines(self, self._api(), request.pool)

    def inventory(self) -> Inventory | None:
        return LambdaInventory(self._api, release_timeout=self.release_timeout)

    def _api(self) -> Api:
        return Api(find_key(self.api_key), self.endpoint)
