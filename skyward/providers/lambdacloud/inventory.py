"""What Skyward left on one Lambda Cloud account, by name, and its removal (``skyward ls`` /
``down``).

Everything a pool makes is named ``skyward-<pool>-<6 hex>`` (its instances ``...-n0``, ...):
instances, firewall rulesets and SSH keys are found by that prefix. Instances carry the
pool's tags too; a ruleset or key takes no tags, and is given the pool of the instances of
the same name, or else the pool its name spells. Instances go first, then the rulesets (in
use until their instances are gone), then the keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from skyward.client.futures import Deadline
from skyward.providers.base import TAG_POOL, Leftover
from skyward.providers.cloud.inventory import CloudInventory
from skyward.providers.lambdacloud import machines
from skyward.providers.lambdacloud.api import Api

_NAME = re.compile(r"^(skyward-(.+)-[0-9a-f]{6})(-n.*)?$")


class LambdaInventory(CloudInventory[Api]):
    """Leftovers on the account the API key opens."""

    provider = "lambdacloud"
    kinds = ("instance", "firewall ruleset", "ssh key")

    @property
    def where(self) -> str:
        return "Lambda Cloud"

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        api, found = self.api, []
        pools: dict[str, dict[str, str]] = {}  # a name's base -> its instances' tags
        for instance in machines.instances(api, "listing instances"):
            named = _NAME.match(str(instance.get("name") or ""))
            if named is None or instance["status"] == "terminated":
                continue
            tags = {t["key"]: t["value"] for t in instance.get("tags") or []}
            tags = pools.setdefault(named[1], tags or {TAG_POOL: named[2]})
            price = instance["instance_type"]["price_cents_per_hour"] / 100
            region = instance["region"]["name"]
            found.append(
                self.leftover(
                    "instance",
                    instance["id"],
                    tags,
                    region=region,
                    state=instance["status"],
                    hourly=price,
                )
            )
        for kind, listed in (
            ("firewall ruleset", api.get("firewall-rulesets", "listing firewall rulesets")),
            ("ssh key", api.get("ssh-keys", "listing SSH keys")),
        ):
            for item in listed or []:
                named = _NAME.match(str(item["name"]))
                if named is not None:
                    tags = pools.get(named[1], {TAG_POOL: named[2]})
                    region = _region(item)
                    found.append(self.leftover(kind, item["id"], tags, region=region))
        return [x for x in found if pool is None or x.pool == pool]

    def remove(self, by_kind: Mapping[str, list[Leftover]], deadline: Deadline) -> list[str]:
        api = self.api
        ids = [x.id for x in by_kind["instance"]]
        left = machines.terminate(api, ids, deadline, wait=True)
        for ruleset in by_kind["firewall ruleset"]:
            left += machines.delete_ruleset(api, ruleset.id, deadline)
        keys = [x.id for x in by_kind["ssh key"]]
        return left + [f"ssh key {k} ({e})" for k in keys if (e := machines.delete_key(api, k))]


def _region(item: Mapping[str, Any]) -> str:
    region = item.get("region")
    return str(region["name"]) if isinstance(region, dict) else "global"
