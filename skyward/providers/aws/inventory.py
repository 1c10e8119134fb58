"""What Skyward left on AWS, by tag, and its removal (``skyward ls`` / ``down``).

A pool's resources carry ``skyward-pool``; that tag alone finds them, whoever made them and
whether or not the client that made them still runs. With no region named, every region the
account has enabled is searched (``describe_regions``), in parallel: a pool made in
us-west-2 is found from a shell whose default is us-east-1. Instances go first, then
security groups (in use until the instances' interfaces are gone), placement groups, then
key pairs.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from skyward._errors import ProvisionError, SkywardError
from skyward.client.futures import Deadline
from skyward.providers.aws import api as ec2
from skyward.providers.aws.api import Api
from skyward.providers.base import TAG_POOL, Leftover
from skyward.providers.cloud import catalog
from skyward.providers.cloud.inventory import CloudInventory

_LIVE = ["pending", "running", "shutting-down", "stopping", "stopped"]
_PARALLEL = 8  # regions searched at once


class AWSInventory(CloudInventory[Api]):
    """Leftovers in one region, or in every enabled one (``region=None``), reached with an
    ``AWS`` configuration's credentials and endpoint (handed over as values: the
    configuration's module builds this one). ``problems`` lists regions that could not be
    searched, after ``leftovers``, and ``searched`` those that were. ``api``: the configured
    region's, else boto3's default."""

    provider = "aws"
    kinds = ("instance", "security group", "key pair", "placement group")

    def __init__(
        self,
        *,
        region: str | None,
        profile: str | None,
        endpoint_url: str | None,
        release_timeout: float,
    ) -> None:
        where = {"profile": profile, "endpoint_url": endpoint_url}
        super().__init__(
            functools.partial(Api.connect, region=region, **where),
            release_timeout=release_timeout,
        )
        self._region, self._profile, self._endpoint_url = region, profile, endpoint_url
        self._apis: dict[str, Api] = {}
        self.problems: list[str] = []
        self.searched: list[str] = []

    @property
    def where(self) -> str:
        return f"aws {self._region}" if self._region else "aws (every enabled region)"

    def api_in(self, region: str) -> Api:
        """The API of ``region``."""
        if region not in self._apis:
            self._apis[region] = Api.connect(
                region=region, profile=self._profile, endpoint_url=self._endpoint_url
            )
        return self._apis[region]

    def regions(self) -> list[str]:
        """The regions searched: the one named, or every region the account has enabled."""
        if self._region is not None:
            return [self._region]
        api = self._default_api()
        answer = api.call(api.ec2.describe_regions, "listing the enabled regions")
        return sorted(str(r["RegionName"]) for r in answer["Regions"])

    def _default_api_session(self) -> Any:
        return Api.session(region=self._default_api().region, profile=self._profile)

    def _default_api(self) -> Api:
        try:
            return self.api
        except ProvisionError:
            # No default region configured: any region answers describe_regions.
            return self.api_in("us-east-1")

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        regions = self.regions()
        self.problems = []
        if len(regions) > 1:  # the clients first, one at a time, from one session
            session = self._default_api_session()
            for region in regions:
                if region not in self._apis:
                    self._apis[region] = Api.in_region(
                        session, region, endpoint_url=self._endpoint_url
                    )

        def search(region: str) -> list[Leftover] | str:
            try:
                return self._leftovers_in(self.api_in(region), pool)
            except SkywardError as exc:
                return f"{region}: {exc}"

        with ThreadPoolExecutor(max_workers=_PARALLEL) as workers:
            results = list(workers.map(search, regions))
        found: list[Leftover] = []
        self.searched = []
        for region, result in zip(regions, results, strict=True):
            if isinstance(result, str):
                self.problems.append(result)
            else:
                self.searched.append(region)
                found += result
        if self.problems and len(self.problems) == len(regions):
            raise ProvisionError("; ".join(self.problems))
        return found

    def _leftovers_in(self, api: Api, pool: str | None) -> list[Leftover]:
        tag = (
            {"Name": f"tag:{TAG_POOL}", "Values": [pool]}
            if pool is not None
            else {"Name": "tag-key", "Values": [TAG_POOL]}
        )
        found: list[Leftover] = []
        reservations = api.call(
            api.ec2.describe_instances,
            f"listing instances in {api.region}",
            Filters=[tag, {"Name": "instance-state-name", "Values": _LIVE}],
        )["Reservations"]
        instances = [i for r in reservations for i in r["Instances"]]
        spot_types = sorted(
            {i["InstanceType"] for i in instances if i.get("InstanceLifecycle") == "spot"}
        )
        spot = api.spot_prices(spot_types) if spot_types else {}
        for instance in instances:
            kind, state = str(instance["InstanceType"]), instance["State"]["Name"]
            if instance.get("InstanceLifecycle") == "spot":
                zone = str(instance["Placement"]["AvailabilityZone"])
                price = spot.get((kind, zone))
            else:
                price = catalog.price("aws", kind, api.region)
            found.append(
                self._leftover(
                    api,
                    "instance",
                    instance["InstanceId"],
                    instance.get("Tags", []),
                    state,
                    hourly=price if state != "stopped" else 0.0,
                )
            )
        groups = api.call(
            api.ec2.describe_security_groups,
            f"listing security groups in {api.region}",
            Filters=[tag],
        )["SecurityGroups"]
        for group in groups:
            found.append(
                self._leftover(api, "security group", group["GroupId"], group.get("Tags", []))
            )
        keys = api.call(
            api.ec2.describe_key_pairs, f"listing key pairs in {api.region}", Filters=[tag]
        )["KeyPairs"]
        for key in keys:
            found.append(self._leftover(api, "key pair", key["KeyName"], key.get("Tags", [])))
        placed = api.call(
            api.ec2.describe_placement_groups,
            f"listing placement groups in {api.region}",
            Filters=[tag],
        )["PlacementGroups"]
        for group in placed:
            found.append(
                self._leftover(api, "placement group", group["GroupName"], group.get("Tags", []))
            )
        return found

    def place(self, leftover: Leftover) -> str:
        return leftover.region  # each region has its own API

    def remove(self, by_kind: Mapping[str, list[Leftover]], deadline: Deadline) -> list[str]:
        region = next(x.region for some in by_kind.values() for x in some)
        ids = {kind: [x.id for x in some] for kind, some in by_kind.items()}
        return ec2.delete(
            self.api_in(region),
            instances=ids["instance"],
            groups=ids["security group"],
            key_pairs=ids["key pair"],
            placement_groups=ids["placement group"],
            timeout=deadline.remaining(),
        )

    def _leftover(
        self, api: Api, kind: str, id: str, tags: list[Any], state: str = "exists", **more: Any
    ) -> Leftover:
        values = {t["Key"]: t["Value"] for t in tags}
        return self.leftover(kind, id, values, region=api.region, state=state, **more)
