"""One Lambda Cloud pool's machines: the cloud contract's calls (``cloud/contract.py``) on
Lambda's REST API.

::

    offers      instance-types: the catalog's types for the request, each in the regions
                where Lambda says it has capacity now, at Lambda's price
    prepare     the pool's SSH key registered under the pool's unique name; the boot payload
                as cloud-init user data
    launch      a firewall ruleset for the region (SSH from the client only; made once per
                region), then one launch of every node: ``quantity``, the user data, tags
    describe    one list of the account's instances: booting, active, or ended (terminating,
                terminated, preempted, unhealthy, gone)
    delete      terminate, wait until gone, then the rulesets and the key; a sweep by name

Names are chosen before anything is asked for (``skyward-<pool>-<6 hex>``): a launch whose
answer is lost (a Ctrl-C in flight) is still found, by its name's prefix, and terminated.
The pool's nodes share one region, and talk over their private addresses.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.cloud import capacity
from skyward.providers.cloud.api import poll
from skyward.providers.cloud.boot import Boot
from skyward.providers.cloud.capacity import Offer, Strategy
from skyward.providers.cloud.catalog import Machine
from skyward.providers.cloud.contract import Described, Offers, Reach, State, Want
from skyward.providers.cloud.record import Record
from skyward.providers.cloud.start import unique_name
from skyward.providers.lambdacloud.api import IN_USE, Api, LambdaError

_STATES: dict[str, State] = {"booting": "starting", "active": "running"}
_WHY = {
    "terminating": "ended through the API or the console",
    "terminated": "ended through the API or the console",
    "preempted": "reclaimed by Lambda Cloud (preempted)",
    "unhealthy": "Lambda Cloud reports it unhealthy; it is terminated with the pool",
}
_TAG_KEY = re.compile(r"^[a-z][a-z0-9-:]{1,54}$")  # what Lambda takes as a tag's key


class Settings(Protocol):
    """What the machines read of ``sky.Lambda`` (``options.py``)."""

    @property
    def region(self) -> str | None: ...
    @property
    def file_system(self) -> str | None: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def connect(self) -> Literal["public", "private"]: ...

    def machines_for(self, request: Any, region: str | None = None) -> list[Machine]: ...
    def ssh_cidrs(self, private_ranges: Sequence[str]) -> list[str]: ...


def instances(api: Api, doing: str, *, tries: int = 4) -> list[dict[str, Any]]:
    """The account's instances, as Lambda lists them (one call: it allows about one a second)."""
    return list(api.get("instances", doing, tries=tries) or [])


class LambdaMachines:
    """A pool's key, rulesets and instances on one Lambda Cloud account."""

    noun = "instance"
    instance_profile = False

    def __init__(self, options: Settings, api: Api, pool: str) -> None:
        self.options, self.api = options, api
        self.base = unique_name(pool, unsafe=r"[^a-z0-9-]", length=40)
        self.prefix = f"{self.base}-n"
        self._user_data = ""
        self._tags: list[dict[str, str]] = []
        self._cidrs: list[str] = []
        self._rulesets: dict[str, str] = {}  # region -> the pool's ruleset there
        self._asked: set[str] = set()  # what a create was asked for: swept by name
        self._listing: tuple[float, list[dict[str, Any]]] = (0.0, [])  # when, what
        self._lock = threading.Lock()  # guards: _rulesets, _listing

    @property
    def scope(self) -> tuple[str, str]:
        return " on Lambda Cloud", "--cloud lambdacloud"

    def key_label(self, first: Offer) -> tuple[str, str, str]:
        return first.zone, self.base, self.api.endpoint

    def resume(self, name: str) -> None:
        self.base, self.prefix = name, f"{name}-n"  # its key, rulesets, instances, sweep

    def offers(self, want: Want) -> Offers:
        want.deadline.check("reading Lambda's instance types")
        listed = self.api.get("instance-types", "reading Lambda's instance types") or {}
        machines = self.options.machines_for(want.request)
        wanted = self.options.region
        zones: dict[str, list[str]] = {}
        prices: dict[str, float] = {}
        for machine in machines:
            found = listed.get(machine.type)
            if found is None:
                continue
            prices[machine.type] = found["instance_type"]["price_cents_per_hour"] / 100
            regions = [r["name"] for r in found.get("regions_with_capacity_available", [])]
            zones[machine.type] = [r for r in sorted(regions) if wanted in (None, r)]
        if not any(zones.values()):
            where = f" in {wanted}" if wanted else " in any region"
            types = ", ".join(m.type for m in machines)
            free = sorted(t for t, x in listed.items() if x.get("regions_with_capacity_available"))
            raise ProvisionError(
                f"Lambda Cloud has no capacity now for {types}{where}; nothing was created. "
                f"Types with capacity now: {', '.join(free) or 'none'}. Try again later, "
                f"leave region out, or ask for another accelerator"
            )
        price = lambda machine, zone, market: prices.get(machine.type)  # noqa: E731
        strategy: Strategy = "cheapest" if want.strategy == "cheapest" else "on-demand"
        offers = capacity.plan(machines, zones, strategy=strategy, price=price)
        offers = [o for o in offers if o.market == "on-demand"]  # Lambda has no spot
        return Offers(offers, wanted or offers[0].zone)

    def prepare(self, want: Want, offers: Sequence[Offer], boot: Boot, record: Record) -> None:
        want.deadline.check("registering the pool's SSH key")
        body = {"name": self.base, "public_key": boot.authorized_key}
        self._asked.add("ssh-keys")
        key = self.api.call("POST", "ssh-keys", f"registering SSH key {self.base}", body)
        record.add("ssh key", str(key["id"]))
        self._user_data = boot.cloud_config()
        tags = {**want.request.tags, "skyward-name": self.base}
        self._tags = [{"key": k, "value": v[:128]} for k, v in tags.items() if _TAG_KEY.match(k)]
        self._cidrs = self.options.ssh_cidrs([])

    def _ruleset(self, region: str, record: Record, deadline: Deadline) -> str:
        """The pool's firewall ruleset in ``region`` (rulesets belong to one region): SSH
        from the client's networks; made on the first launch there."""
        with self._lock:
            if region not in self._rulesets:
                deadline.check(f"creating the firewall ruleset in {region}")
                rules = [
                    {
                        "protocol": "tcp",
                        "port_range": [22, 22],
                        "source_network": cidr,
                        "description": "SSH from the Skyward client",
                    }
                    for cidr in self._cidrs
                ]
                body = {"name": self.base, "region": region, "rules": rules}
                doing = f"creating firewall ruleset {self.base} in {region}"
                self._asked.add("firewall-rulesets")
                made = self.api.call("POST", "firewall-rulesets", doing, body)
                self._rulesets[region] = record.add("firewall ruleset", str(made["id"]))
            return self._rulesets[region]

    def launch(
        self, offer: Offer, names: Sequence[str], record: Record, deadline: Deadline
    ) -> list[str]:
        region = offer.zone
        ruleset = self._ruleset(region, record, deadline)
        body: dict[str, Any] = {
            "region_name": region,
            "instance_type_name": offer.machine.type,
            "ssh_key_names": [self.base],
            "quantity": len(names),
            # One name for all the launch makes: the first's, else the pool's base.
            "name": names[0] if len(names) == 1 else f"{self.base}-n",
            "user_data": self._user_data,
            "tags": self._tags,
            "firewall_rulesets": [{"id": ruleset}],
        }
        if self.options.file_system:
            body["file_system_names"] = [self.options.file_system]
        doing = f"launching {len(names)} x {offer.machine.type} in {region}"
        deadline.check(doing)
        # Asked again only after a 429, which Lambda answers before doing anything.
        launched = self.api.call(
            "POST", "instance-operations/launch", doing, body, deadline=deadline
        )
        return [str(i) for i in launched["instance_ids"]]

    def describe(self, place: str, ids: Sequence[str], *, quick: bool = False) -> list[Described]:
        # A quick look (the start's watcher asks for each node every 2 s) shares a listing
        # younger than a second: Lambda allows about one request a second.
        with self._lock:
            taken, listed = self._listing
        if not quick or time.monotonic() - taken > 1.0:
            listed = instances(self.api, "reading instances", tries=1 if quick else 4)
            with self._lock:
                self._listing = (time.monotonic(), listed)
        found = {i["id"]: i for i in listed}
        return [self._one(found.get(id)) for id in ids]

    def _one(self, instance: dict[str, Any] | None) -> Described:
        if instance is None:
            return Described("ended", "gone", why="Lambda Cloud no longer lists it (terminated)")
        status = str(instance["status"])
        state = _STATES.get(status, "ended")
        if state == "ended":
            return Described(state, status, why=_WHY.get(status, "no reason given"))
        public, private = instance.get("ip"), instance.get("private_ip")
        host = public if self.options.connect == "public" else private
        reach = Reach(host=host, peer=private or host) if host and state == "running" else None
        return Described(state, status, reach)

    def discard(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[str]:
        return terminate(self.api, ids, deadline, wait=deadline.remaining() > 0)

    def delete(self, record: Record, deadline: Deadline) -> list[str]:
        """Every instance made, and any named after the pool (a launch cut off in flight),
        terminated and waited for; then the rulesets (in use until then) and the key, with
        those named after the pool (a create cut off in flight)."""
        left: list[str] = []
        made = [id for _, id in record.machines()]
        if record.asked():
            made += [i["id"] for i in self._sweep("instances", left) if self._mine(i)]
        left += terminate(self.api, list(dict.fromkeys(made)), deadline, wait=True)
        rulesets = record.resources("firewall ruleset")
        if "firewall-rulesets" in self._asked:
            rulesets += [r["id"] for r in self._sweep("firewall-rulesets", left)]
        for ruleset in dict.fromkeys(rulesets):
            left += delete_ruleset(self.api, ruleset, deadline)
        keys = record.resources("ssh key")
        if "ssh-keys" in self._asked and not keys:
            keys = [k["id"] for k in self._sweep("ssh-keys", left)]
        return left + [f"ssh key {k} ({e})" for k in keys if (e := delete_key(self.api, k))]

    def _sweep(self, what: str, left: list[str]) -> list[dict[str, Any]]:
        """The account's ``what`` (``instances``, ``ssh-keys``, ...) named after the pool."""
        try:
            listed = self.api.get(what, f"listing {what}") or []
        except ProvisionError as exc:
            left.append(f"the sweep of {what} by name ({exc})")
            return []
        return [x for x in listed if str(x.get("name") or "").startswith(self.base)]

    def _mine(self, instance: dict[str, Any]) -> bool:
        return str(instance.get("name") or "").startswith(self.prefix)


def terminate(api: Api, ids: Sequence[str], deadline: Deadline, *, wait: bool) -> list[str]:
    """Terminate the instances of ``ids`` Lambda still runs (one call), then, with ``wait``,
    until none of them is listed or past ``terminated``; one Lambda will not terminate yet
    (``global/conflict``: still launching) is asked again. What is left, as ``"instance id
    (why)"``."""
    doing = f"terminating {len(ids)} instance(s)"

    def ended() -> bool | None:
        now = {i["id"]: i["status"] for i in instances(api, doing)}
        live = [id for id in ids if now.get(id) not in (None, "terminating", "terminated")]
        if live:
            try:
                body = {"instance_ids": live}
                api.call("POST", "instance-operations/terminate", doing, body)
            except LambdaError as exc:
                if exc.code != "global/conflict":
                    raise
        return not wait or all(now.get(id) in (None, "terminated") for id in ids) or None

    try:
        if ids:
            poll(ended, doing, deadline, pause=1.0, most=5.0)
    except (ProvisionError, TimeoutError) as exc:
        return [f"instance {id} ({exc})" for id in ids]
    return []


def delete_ruleset(api: Api, ruleset: str, deadline: Deadline) -> list[str]:
    """Delete a firewall ruleset, asked again while its instances are still ending."""
    doing = f"deleting firewall ruleset {ruleset}"

    def deleted() -> bool | None:
        try:
            api.call("DELETE", f"firewall-rulesets/{ruleset}", doing)
        except LambdaError as exc:
            if exc.gone:
                return True
            if exc.code == IN_USE:
                return None
            raise
        return True

    try:
        poll(deleted, doing, deadline, pause=1.0, most=5.0)
    except (ProvisionError, TimeoutError) as exc:
        return [f"firewall ruleset {ruleset} ({exc})"]
    return []


def delete_key(api: Api, key: str) -> str:
    """Delete an SSH key: ``""`` when done (or gone already), else why not."""
    try:
        api.call("DELETE", f"ssh-keys/{key}", f"deleting SSH key {key}")
    except LambdaError as exc:
        return "" if exc.gone else str(exc)
    except ProvisionError as exc:
        return str(exc)
    return ""
