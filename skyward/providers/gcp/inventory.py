"""What Skyward left in one GCP project, by label, and its removal (``skyward ls`` / ``down``).

Instances carry the ``skyward-pool`` label (in every zone: one aggregated list finds them);
firewall rules take no labels, and are found by their ``skyward-`` names and the tags in
their description. A TPU pool's queued resources are listed zone by zone (every zone that
sells TPUs) and known by the tags in their node's metadata; they go first (with ``force``:
their slices go too), then instances, then the rules. The rest is ``CloudInventory``'s.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

from skyward.client.futures import Deadline
from skyward.providers.base import TAG_POOL, Leftover
from skyward.providers.cloud import catalog
from skyward.providers.cloud.inventory import CloudInventory
from skyward.providers.gcp import api as gce
from skyward.providers.gcp import tpu_api, tpu_types
from skyward.providers.gcp.api import Api
from skyward.providers.gcp.tpu_api import TpuApi


class GCPInventory(CloudInventory[Api]):
    """Leftovers in one project."""

    provider = "gcp"
    kinds = ("queued resource", "instance", "firewall rule")

    def __init__(
        self,
        connect: Callable[[], Api],
        *,
        release_timeout: float,
        tpu: Callable[[], TpuApi] | None = None,
    ) -> None:
        super().__init__(connect, release_timeout=release_timeout)
        self._tpu_connect = tpu
        self._tpu: TpuApi | None = None

    @property
    def tpu(self) -> TpuApi | None:
        """The TPU API, when google-cloud-tpu is installed (connected when first asked)."""
        if self._tpu is None and self._tpu_connect is not None:
            if importlib.util.find_spec("google.cloud.tpu_v2") is None:
                return None
            self._tpu = self._tpu_connect()
        return self._tpu

    @property
    def where(self) -> str:
        return f"project {self.api.project}"

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        api = self.api
        found = self._queued(pool)
        for zone, instance in gce.live(api, pool):
            spot = instance.scheduling.provisioning_model == "SPOT"
            running = instance.status not in ("TERMINATED", "SUSPENDED")
            price = None if spot or not running else _price(instance, zone)
            tags, state = gce.tags_of_instance(instance), instance.status.lower()
            found.append(
                self.leftover(
                    "instance", instance.name, tags, region=zone, state=state, hourly=price
                )
            )
        rules = api.call(
            api.firewalls.list,
            "listing firewall rules",
            request={"project": api.project, "filter": 'name eq "skyward-.*"'},
        )
        for rule in rules:
            carried = gce.tags_of_rule(rule)  # None: a rule named skyward-... that is not ours
            if carried is None or (pool is not None and carried.get(TAG_POOL) != pool):
                continue
            found.append(self.leftover("firewall rule", rule.name, carried, region="global"))
        return found

    def _queued(self, pool: str | None) -> list[Leftover]:
        tpu = self.tpu
        if tpu is None:
            return []
        zones = sorted({zone for kind in tpu_types.every() for zone in kind.zones})
        found = []
        for zone, queued in tpu_api.live_queued(tpu, zones):
            tags = tpu_api.tags_of_queued(queued)
            if tags is None or (pool is not None and tags.get(TAG_POOL) != pool):
                continue
            state = queued.state.state.name
            kind = tpu_types.find(queued.tpu.node_spec[0].node.accelerator_type)
            slices = max(1, queued.tpu.node_spec[0].multislice_params.node_count)
            spot = "spot" in queued
            price = kind.hourly(spot) * slices if kind and state == "ACTIVE" else None
            name = queued.name.rsplit("/", 1)[-1]
            found.append(
                self.leftover(
                    "queued resource", name, tags, region=zone, state=state.lower(), hourly=price
                )
            )
        return found

    def remove(self, by_kind: Mapping[str, list[Leftover]], deadline: Deadline) -> list[str]:
        left = []
        queued = [(x.region, x.id) for x in by_kind["queued resource"]]
        if queued and self.tpu is not None:
            left += tpu_api.delete_queued(self.tpu, queued, deadline)
        instances = [(x.region, x.id) for x in by_kind["instance"]]
        rules = [x.id for x in by_kind["firewall rule"]]
        return left + gce.delete(self.api, instances=instances, firewalls=rules, deadline=deadline)


def _price(instance: Any, zone: str) -> float | None:
    """The catalog's price of an instance: its type, and for N1 its attached GPUs."""
    kind = instance.machine_type.rsplit("/", 1)[-1]
    gpus = [
        (a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count)
        for a in instance.guest_accelerators
    ]
    rows = [m for m in catalog.machines("gcp") if m.type == kind]
    found = next((m for m in rows if [(m.attach, m.count)] == gpus or not (m.attach or gpus)), None)
    return None if found is None else catalog.machine_price(found, zone.rsplit("-", 1)[0])
