"""What Skyward left on a Vast.ai account, and its removal (``skyward ls`` / ``down``).

Vast's instances carry one free-text ``label`` and no tags: a pool's instances are labelled
``skyward-<pool>-<6 hex>-node-<rank>`` (``machines.py``), so they are found by that prefix,
their pool read back from it. An instance whose main process ended (the idle watchdog's
last act) is kept by Vast, ``exited``, and bills its disk until it is destroyed here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime

from skyward.client.futures import Deadline
from skyward.providers.base import Leftover
from skyward.providers.cloud.inventory import CloudInventory
from skyward.providers.vastai.api import Api
from skyward.providers.vastai.machines import destroy

_LABEL = re.compile(r"^skyward-(?P<pool>.+)-[0-9a-f]{6}-node-\d+(?:-r\d+)?$")


class VastInventory(CloudInventory[Api]):
    """Leftovers on one account."""

    provider = "vastai"
    kinds = ("instance",)

    @property
    def where(self) -> str:
        return "Vast.ai"

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        found = []
        for instance in self.api.instances():
            named = _LABEL.match(str(instance.get("label") or ""))
            if named is None or (pool is not None and named["pool"] != slug(pool)):
                continue
            started = instance.get("start_date")
            created = datetime.fromtimestamp(float(started), UTC) if started else None
            created_tag = created.strftime("%Y-%m-%dT%H:%M:%SZ") if created else ""
            tags = {"skyward-pool": named["pool"], "skyward-created": created_tag}
            running = instance.get("actual_status") == "running"
            found.append(
                self.leftover(
                    "instance",
                    str(instance["id"]),
                    tags,
                    region=str(instance.get("geolocation") or ""),
                    state=str(instance.get("actual_status") or "created"),
                    hourly=float(instance["dph_total"])
                    if running and "dph_total" in instance
                    else None,
                )
            )
        return found

    def remove(self, by_kind: Mapping[str, list[Leftover]], deadline: Deadline) -> list[str]:
        return destroy(self.api, [x.id for x in by_kind["instance"]], deadline)


def slug(pool: str) -> str:
    """A pool's name as its labels carry it (``unique_name``'s slug)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", pool)[:30].strip("-") or "pool"
