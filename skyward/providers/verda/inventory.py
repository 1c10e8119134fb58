"""What Skyward left in one Verda account, and its removal (``skyward ls`` / ``down``).

Verda's resources take no tags: instances are ours when their description carries the
pool's tags (``api.DESCRIPTION``), startup scripts when their last line does, SSH keys by
their ``skyward-`` name (their pool is their script's, when it is still there). Leftovers
are named as Verda shows them (an instance by its hostname); they are deleted by id,
instances first (with their OS volumes), then scripts and keys.
"""

from __future__ import annotations

from collections.abc import Mapping

from skyward.client.futures import Deadline
from skyward.providers.base import Leftover
from skyward.providers.cloud.inventory import CloudInventory
from skyward.providers.verda import api as rest
from skyward.providers.verda.api import Api

_PATHS = {"startup script": "/scripts", "ssh key": "/sshkeys"}


class VerdaInventory(CloudInventory[Api]):
    """Leftovers in one account."""

    provider = "verda"
    kinds = ("instance", "startup script", "ssh key")

    @property
    def where(self) -> str:
        return "your Verda account"

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        api, found = self.api, []
        for instance in rest.instances(api).values():
            tags = rest.tags_of(str(instance.get("description") or ""))
            if tags is not None and instance["status"] not in ("discontinued", "deleting"):
                found.append(
                    self.leftover(
                        "instance",
                        str(instance["hostname"]),
                        tags,
                        region=str(instance.get("location", "")),
                        state=str(instance["status"]),
                        hourly=float(instance.get("price_per_hour") or 0) or None,
                    )
                )
        scripts = {}
        for script in rest.named(api, "/scripts", "skyward-"):
            last = str(script.get("script", "")).rstrip("\n").rsplit("\n", 1)[-1]
            carried = rest.tags_of(last, rest.TAGS_LINE)
            if carried is not None:
                name = str(script["name"])
                scripts[name] = carried
                found.append(self.leftover("startup script", name, carried, region="global"))
        for key in rest.named(api, "/sshkeys", "skyward-"):
            tags = scripts.get(str(key["name"]), {})
            found.append(self.leftover("ssh key", str(key["name"]), tags, region="global"))
        return [x for x in found if pool is None or x.pool == pool]

    def remove(self, by_kind: Mapping[str, list[Leftover]], deadline: Deadline) -> list[str]:
        api = self.api
        names = {x.id for x in by_kind["instance"]}
        listed = rest.instances(api)
        ids = [i for i, x in listed.items() if x.get("hostname") in names]
        left = rest.delete_instances(api, ids, listed, deadline)
        for kind, path in _PATHS.items():
            wanted = {x.id for x in by_kind[kind]}
            made = [str(x["id"]) for x in rest.named(api, path, "skyward-") if x["name"] in wanted]
            left += rest.delete_named(api, path, kind, made)
        return left
