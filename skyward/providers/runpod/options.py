"""``sky.RunPod``: the options of a pool of RunPod pods, checked when the pool is built (the
API key included, before anything is rented), and the pool's ``RunPodMachines``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AliasChoices, Field, field_validator

from skyward.providers.base import Inventory, ProvisionRequest, refuse_gang
from skyward.providers.cloud.catalog import Cloud
from skyward.providers.cloud.options import CloudOptions
from skyward.providers.runpod import api as runpod
from skyward.providers.runpod.api import Api
from skyward.providers.runpod.inventory import RunPodInventory
from skyward.providers.runpod.machines import RunPodMachines, gpus
from skyward.providers.volumes import refuse_keyless


class RunPod(CloudOptions):
    """Run the pool's nodes on RunPod GPU pods rented for it, and always terminated.

    - ``api_key``: by default ``RUNPOD_API_KEY``, or ``~/.runpod/config.toml`` (``runpod
      config``). It stays on this machine; the pods never see it.
    - ``endpoint_url``: where the API calls go (``/graphql`` and ``/v1`` under it): a proxy,
      a test server. Default: RunPod's own.
    - ``cloud_type``: ``"secure"`` (RunPod's data centers), ``"community"`` (hosts of
      vetted third parties, cheaper) or ``"all"``. ``data_center``: one data center
      (``"EU-RO-1"``); default: any. ``data_center_ids=("EU-RO-1",)`` and
      ``container_image=`` are the public skyward project's spellings of these two.
    - ``image``: the container image; by default RunPod's PyTorch image (Ubuntu 22.04, CUDA
      12.4 userland, openssh-server; ROCm for MI300X). Any image with ``sh`` and ``base64``
      works; one without sshd gets it from apt at boot.
    - ``container_disk_gb``: the container's disk (billed while the pod runs);
      ``volume_gb``: a volume at ``/workspace``, billed while the pod exists, stopped or not
      (default 0: a pod stopped by its watchdog then costs nothing); ``network_volume``: a
      network volume's id, mounted at ``/workspace`` (set ``data_center`` to its own).
    - ``spot``: interruptible pods, bid at RunPod's current minimum. The other options are
      ``sky.AWS``'s (``CloudOptions``); ``username`` is ``root``, the container's user.
    """

    cloud: ClassVar[Cloud] = "runpod"
    machine_option: ClassVar[str] = "image"
    ssh_rule: ClassVar[str] = "RunPod's port mapping"
    needs: ClassVar[tuple[str, ...]] = ()  # plain HTTP: no SDK (api.py says why)

    api_key: str | None = Field(default=None, repr=False)
    endpoint_url: str | None = Field(default=None, pattern=r"^https?://")
    cloud_type: Literal["secure", "community", "all"] = "secure"
    data_center: str | None = Field(
        default=None,
        pattern=r"^[A-Z]{2}-[A-Z]{2,4}-\d+$",
        validation_alias=AliasChoices("data_center", "data_center_ids"),
    )
    image: str | None = Field(
        default=None, min_length=1, validation_alias=AliasChoices("image", "container_image")
    )
    container_disk_gb: int = Field(default=50, ge=5, le=4000)
    volume_gb: int = Field(default=0, ge=0, le=4000)
    network_volume: str | None = Field(default=None, pattern=r"^[a-z0-9]+$")
    username: str = Field(default="root", pattern=r"^[a-z_][a-z0-9_-]*$")

    @field_validator("data_center", mode="before")
    @classmethod
    def _one_data_center(cls, value: object) -> object:
        """The public project's ``data_center_ids=("EU-RO-1",)`` or ``"global"``: one place."""
        if value == "global":
            return None
        if isinstance(value, tuple | list):
            if len(value) != 1:
                raise ValueError("give one data center (data_center='EU-RO-1'), or none: any")
            return value[0]
        return value

    def check(self, request: ProvisionRequest) -> None:
        """When the pool is built: paramiko, the accelerator, no gang across pods, and the
        key (asked of RunPod: a refused key fails here, before anything is rented)."""
        super().check(request)
        refuse_keyless(request.volumes, "RunPod")
        refuse_gang(request, "RunPod's pods run on separate hosts with no network between them")
        gpus(request.accelerator)
        self.strategy(request)
        runpod.whoami(self._api())

    def hint(self) -> str:
        return (
            "RunPod maps the pod's port 22 to the public port shown; check that the image "
            "runs the start command (the pod's logs in RunPod's console show it)."
        )

    def machines(self, request: ProvisionRequest) -> RunPodMachines:
        return RunPodMachines(self, self._api(), request)

    def inventory(self) -> Inventory | None:
        return RunPodInventory(self._api, release_timeout=self.release_timeout)

    def _api(self) -> Api:
        return Api(runpod.api_key(self.api_key), self.endpoint_url)
