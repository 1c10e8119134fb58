"""What Skyward left in one GCP project, by label, and its removal (``skyward ls`` / ``down``).

Instances carry the ``skyward-pool`` label (in every zone: one aggregated list finds them);
firewall rules take no labels, and are found by their ``skyward-`` names and the tags in
their description. Instances go first, then the rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skyward._errors import ProvisionError
from skyward._futures import Deadline
from skyward._phases import Reporter
from skyward.providers.base import TAG_POOL, Leftover, tagged_leftover
from skyward.providers.cloud import catalog
from skyward.providers.gcp import resources as gce
from skyward.providers.gcp.api import Api, credentials_and_project


class GCPInventory:
    """Leftovers in one project, reached with a ``GCP`` configuration's credentials and
    endpoint (handed over as values: the configuration's module builds this one)."""

    def __init__(
        self,
        *,
        project: str | None,
        credentials: Any,
        endpoint: str | None,
        release_timeout: float,
        region: str | None = None,
    ) -> None:
        self._project, self._credentials, self._endpoint = project, credentials, endpoint
        self._region = region  # where to look where the endpoint has no aggregated list
        self._release_timeout = release_timeout
        self._api: Api | None = None

    @property
    def api(self) -> Api:
        if self._api is None:
            credentials, project = credentials_and_project(self._project, self._credentials)
            self._api = Api.connect(
                project=project, credentials=credentials, endpoint=self._endpoint
            )
        return self._api

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        api = self.api
        found = []
        region = self._region
        zones = None if region is None else lambda: gce.zones_of(api, region)
        for zone, instance in gce.live(api, pool, zones):
            values = gce.tags_of_instance(instance)
            spot = instance.scheduling.provisioning_model == "SPOT"
            running = instance.status not in ("TERMINATED", "SUSPENDED")
            price = None if spot or not running else _price(instance, zone)
            found.append(_leftover("instance", instance.name, values, zone, instance.status, price))
        rules = api.call(
            api.firewalls.list,
            "listing firewall rules",
            request={"project": api.project, "filter": 'name eq "skyward-.*"'},
        )
        for rule in rules:
            tags = gce.tags_of_rule(rule)
            if tags is None or (pool is not None and tags.get(TAG_POOL) != pool):
                continue
            found.append(_leftover("firewall rule", rule.name, tags, "global"))
        return found

    def delete(self, leftovers: Sequence[Leftover], reporter: Reporter) -> None:
        mine = [x for x in leftovers if x.provider == "gcp"]
        instances = [(x.region, x.id) for x in mine if x.kind == "instance"]
        rules = [x.id for x in mine if x.kind == "firewall rule"]
        for count, kind in ((len(instances), "instance"), (len(rules), "firewall rule")):
            if count:
                reporter.status(f"deleting {count} {kind}(s) in project {self.api.project}")
        timeout = self._release_timeout
        deadline = Deadline(timeout, f"release_timeout ({timeout:g} s)")
        left = gce.delete(self.api, instances=instances, firewalls=rules, deadline=deadline)
        if left:
            raise ProvisionError(f"could not delete {', '.join(left)} in {self.api.project}")


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


def _leftover(
    kind: str,
    name: str,
    values: dict[str, str],
    where: str,
    state: str = "exists",
    hourly: float | None = None,
) -> Leftover:
    return tagged_leftover(
        "gcp", kind, name, values, state=state.lower(), region=where, hourly_cost=hourly
    )
