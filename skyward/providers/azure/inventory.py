"""What Skyward left in one Azure subscription, by tag, and its removal (``skyward ls`` /
``down``).

Every pool lives in its own resource group tagged ``skyward-pool``; that tag alone finds it,
whoever made it and whether or not its client still runs. ``ls`` shows each group and the VMs
in it (with their list price while they hold compute); ``down`` deletes the groups, which
takes everything in them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from skyward.client.futures import Deadline, parallel
from skyward.providers.azure import api as arm
from skyward.providers.azure.api import Api
from skyward.providers.azure.machines import power_state
from skyward.providers.base import TAG_POOL, Leftover
from skyward.providers.cloud import catalog
from skyward.providers.cloud.inventory import CloudInventory

# VM power states that hold (and bill) compute.
_BILLED = {"running", "starting", "stopping", "stopped", None}


class AzureInventory(CloudInventory[Api]):
    """Leftovers in one subscription, reached with an ``Azure`` configuration's credential
    and endpoint (handed over as values: the configuration's module builds this one)."""

    provider = "azure"
    kinds = ("resource group",)  # deleting a group takes its VMs and everything else in it

    def __init__(
        self,
        *,
        subscription: str,
        credential: Any,
        base_url: str | None,
        connection_verify: str | None,
        release_timeout: float,
    ) -> None:
        settings = {"credential": credential, "base_url": base_url, "polling_interval": 5.0}
        settings["connection_verify"] = connection_verify
        connect = functools.partial(Api.connect, subscription=subscription, **settings)
        super().__init__(connect, release_timeout=release_timeout)
        self.subscription = subscription

    @property
    def where(self) -> str:
        return f"subscription {self.subscription}"

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        api = self.api
        wanted = f"tagName eq '{TAG_POOL}'"
        if pool is not None:
            wanted += f" and tagValue eq '{pool.replace(chr(39), chr(39) * 2)}'"
        doing = f"listing resource groups in subscription {self.subscription}"
        groups = api.call(lambda: list(api.resource.resource_groups.list(filter=wanted)), doing)
        found: list[Leftover] = []
        for group in groups:
            tags = dict(group.tags or {})
            state = str(getattr(group.properties, "provisioning_state", "") or "exists")
            found.append(
                self.leftover(
                    "resource group", group.name, tags, state=state, region=group.location
                )
            )
            # The VMs carry the prices (the group itself costs nothing).
            found.extend([] if state == "Deleting" else self._vms(group.name, tags))
        return found

    def remove(self, by_kind: Mapping[str, list[Leftover]], deadline: Deadline) -> list[str]:
        groups = sorted({x.id for x in by_kind["resource group"]})
        timeout = deadline.remaining()
        results = parallel(lambda name: arm.delete_group(self.api, name, timeout=timeout), groups)
        return [
            f"resource group {g} ({why})" for g, why in zip(groups, results, strict=True) if why
        ]

    def _vms(self, group: str, tags: dict[str, str]) -> list[Leftover]:
        api = self.api
        listed = api.call(
            lambda: list(api.compute.virtual_machines.list(group, expand="instanceView")),
            f"listing the VMs of {group}",
        )
        found = []
        for vm in listed:
            power = power_state(getattr(vm, "instance_view", None))
            size = str(vm.hardware_profile.vm_size)
            spot = str(getattr(vm, "priority", "") or "").lower() == "spot"
            price = None if spot else catalog.price("azure", size)
            hourly = price if power in _BILLED else 0.0
            vm_tags = {**tags, **(vm.tags or {})}
            where, state = str(vm.location), power or "?"
            found.append(
                self.leftover("vm", str(vm.name), vm_tags, region=where, state=state, hourly=hourly)
            )
        return found
