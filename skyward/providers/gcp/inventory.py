"""What Skyward left in one GCP project, by label, and its removal (``skyward ls`` / ``down``).

Instances carry the ``skyward-pool`` label (in every zone: one aggregated list finds them);
firewall rules take no labels, and are found by their ``skyward-`` names and the tags in
their description. Instances go first, then the rules. The rest is ``CloudInventory``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyward.client.futures import Deadline
from skyward.providers.base import TAG_POOL, Leftover
from skyward.providers.cloud import catalog
from skyward.providers.cloud.inventory import CloudInventory
from skyward.providers.gcp import api as gce
from skyward.providers.gcp.api import Api


class GCPInventory(CloudInventory[Api]):
    """Leftovers in one project."""

    provider = "gcp"
    kinds = ("instance", "firewall rule")

    @property
    def where(self) -> str:
        return f"project {self.api.project}"

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        api = self.api
        found = []
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

    def remove(self, by_kind: Mapping[str, list[Leftover]], deadline: Deadline) -> list[str]:
        instances = [(x.region, x.id) for x in by_kind["instance"]]
        rules = [x.id for x in by_kind["firewall rule"]]
        return gce.delete(self.api, instances=instances, firewalls=rules, deadline=deadline)


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
