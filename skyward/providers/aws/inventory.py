"""What Skyward left in one AWS region, by tag, and its removal (``skyward ls`` / ``down``).

A pool's resources carry ``skyward-pool``; that tag alone finds them, whoever made them and
whether or not the client that made them still runs. Instances go first, then security
groups (in use until the instances' interfaces are gone), then key pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from skyward._errors import ProvisionError
from skyward._phases import Reporter
from skyward.providers import catalog
from skyward.providers.aws import resources as ec2
from skyward.providers.aws.api import Api
from skyward.providers.base import TAG_CREATED, TAG_OWNER, TAG_POOL, Leftover

_LIVE = ["pending", "running", "shutting-down", "stopping", "stopped"]


class AWSInventory:
    """Leftovers in one region, reached with an ``AWS`` configuration's credentials and
    endpoint (handed over as values: the configuration's module builds this one)."""

    def __init__(
        self,
        *,
        region: str | None,
        profile: str | None,
        endpoint_url: str | None,
        release_timeout: float,
    ) -> None:
        self._region, self._profile, self._endpoint_url = region, profile, endpoint_url
        self._release_timeout = release_timeout
        self._api: Api | None = None

    @property
    def api(self) -> Api:
        if self._api is None:
            self._api = Api.connect(
                region=self._region, profile=self._profile, endpoint_url=self._endpoint_url
            )
        return self._api

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        api = self.api
        tag = (
            {"Name": f"tag:{TAG_POOL}", "Values": [pool]}
            if pool is not None
            else {"Name": "tag-key", "Values": [TAG_POOL]}
        )
        found: list[Leftover] = []
        reservations = api.call(
            api.ec2.describe_instances,
            "listing instances",
            Filters=[tag, {"Name": "instance-state-name", "Values": _LIVE}],
        )["Reservations"]
        for reservation in reservations:
            for instance in reservation["Instances"]:
                spot = instance.get("InstanceLifecycle") == "spot"
                price = None if spot else catalog.price("aws", instance["InstanceType"])
                found.append(
                    self._leftover(
                        "instance",
                        instance["InstanceId"],
                        instance.get("Tags", []),
                        instance["State"]["Name"],
                        hourly=price if instance["State"]["Name"] != "stopped" else 0.0,
                    )
                )
        groups = api.call(
            api.ec2.describe_security_groups, "listing security groups", Filters=[tag]
        )["SecurityGroups"]
        for group in groups:
            found.append(self._leftover("security group", group["GroupId"], group.get("Tags", [])))
        keys = api.call(api.ec2.describe_key_pairs, "listing key pairs", Filters=[tag])["KeyPairs"]
        for key in keys:
            found.append(self._leftover("key pair", key["KeyName"], key.get("Tags", [])))
        return found

    def delete(self, leftovers: Sequence[Leftover], reporter: Reporter) -> None:
        mine = [x for x in leftovers if x.provider == "aws" and x.region == self.api.region]
        by_kind = {
            kind: [x.id for x in mine if x.kind == kind]
            for kind in ("instance", "security group", "key pair")
        }
        for kind, ids in by_kind.items():
            if ids:
                reporter.status(f"deleting {len(ids)} {kind}(s) in {self.api.region}")
        left = ec2.delete(
            self.api,
            instances=by_kind["instance"],
            groups=by_kind["security group"],
            key_pairs=by_kind["key pair"],
            timeout=self._release_timeout,
        )
        if left:
            raise ProvisionError(f"could not delete {', '.join(left)} in {self.api.region}")

    def _leftover(
        self,
        kind: str,
        id: str,
        tags: list[Any],
        state: str = "exists",
        hourly: float | None = None,
    ) -> Leftover:
        values = {t["Key"]: t["Value"] for t in tags}
        return Leftover(
            provider="aws",
            kind=kind,
            id=id,
            pool=values.get(TAG_POOL, ""),
            owner=values.get(TAG_OWNER, ""),
            created=_parse_time(values.get(TAG_CREATED)),
            state=state,
            region=self.api.region,
            hourly_cost=hourly,
        )


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
