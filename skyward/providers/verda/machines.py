"""One Verda pool's machines: the cloud contract's calls (``cloud/contract.py``) on Verda.

::

    offers      the instance types and their prices (GET /instance-types), the locations
                that have each available now on each market (GET /instance-availability)
    prepare     the pool's SSH key (POST /sshkeys) and the boot payload as a startup
                script (POST /scripts), each named after the pool and recorded
    launch      asked again whether the type is available there, one POST /instances per
                node (``is_spot`` for spot), waited until Verda has placed them: no
                capacity (a 503, or an instance that ends ``no_capacity``) deletes them and
                moves to the next offer
    describe    GET /instances: running with its address, on the way, or ended (and why)
    delete      the instances with their OS volumes, waited for, found by id and by name;
                then the script and the key

Verda's instances have one address, a public one, and no firewall in the API: peers reach
each other there (docs/providers.md, Verda).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline, settle
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud import capacity
from skyward.providers.cloud.api import Refusal, poll
from skyward.providers.cloud.boot import Boot
from skyward.providers.cloud.capacity import CapacityError, Offer
from skyward.providers.cloud.catalog import Machine
from skyward.providers.cloud.contract import Described, Offers, Reach, State, Want
from skyward.providers.cloud.record import Record
from skyward.providers.cloud.start import unique_name
from skyward.providers.verda import api as rest
from skyward.providers.verda.api import Api, VerdaError

# Verda's image with NVIDIA's open driver, CUDA and Docker, for GPU types that list it; its
# images log in as root and run a startup script at first boot.
GPU_IMAGE = "ubuntu-24.04-cuda-12.8-open-docker"
_STATES: dict[str, State] = {
    **dict.fromkeys(
        ("new", "ordered", "validating", "provisioning", "restoring", "unknown"), "starting"
    ),
    "running": "running",
}
_PLACING = {"new", "ordered", "validating"}  # Verda has not yet found it a host
_WHY = {
    "offline": "it was shut down (the idle watchdog, or a shutdown run on it); Verda bills "
    "a shut-down instance until it is deleted",
    "discontinued": "Verda discontinued it (a spot instance reclaimed, or deleted)",
    "no_capacity": "Verda had no capacity for it",
    "installation_failed": "Verda could not install its image",
    "error": "Verda reports an error with it",
}
# sshd already runs when Verda starts the script: restarted, it presents the host key the
# script wrote (and reads its settings). No systemd (a stand-in): nothing to restart.
_RESTART_SSHD = "systemctl restart ssh 2>/dev/null || systemctl restart sshd 2>/dev/null || true\n"


class Settings(Protocol):
    """What the machines read of ``sky.Verda`` (``options.py``)."""

    @property
    def location(self) -> str | None: ...
    @property
    def image(self) -> str | None: ...
    @property
    def os_volume_gb(self) -> int: ...
    @property
    def instance_type(self) -> str | None: ...
    @property
    def release_timeout(self) -> float: ...

    def machines_for(self, request: ProvisionRequest, region: str | None = None) -> list[Machine]:
        """The catalog's machines for the request."""
        ...

    def described(self, request: ProvisionRequest, **facts: Any) -> list[Machine]: ...


class VerdaMachines:
    """A pool's SSH key, startup script and instances in one Verda account."""

    noun = "instance"
    instance_profile = False

    def __init__(self, options: Settings, api: Api, pool: str) -> None:
        self.options = options
        self.api = api
        # Unique per provision: the key's and the script's name, the instances' names' base.
        self.base = unique_name(pool, unsafe=r"[^A-Za-z0-9-]", length=30)
        self.prefix = f"{self.base}-n"
        self._types: dict[str, dict[str, Any]] = {}  # GET /instance-types, by name
        self._template: dict[str, Any] = {}  # set by prepare, read by launch

    @property
    def scope(self) -> tuple[str, str]:
        return " in your Verda account", "--cloud verda"

    def key_label(self, first: Offer) -> tuple[str, str, str]:
        own = self.api.endpoint == rest.ENDPOINT  # labelled "" : the cloud's own
        return first.zone, self.base, "" if own else self.api.endpoint

    def resume(self, name: str) -> None:
        self.base, self.prefix = name, f"{name}-n"  # its key, script, instances, sweep

    # ── before anything is made ────────────────────────────────────────────────────────

    def offers(self, want: Want) -> Offers:
        api, request = self.api, want.request
        want.deadline.check("reading Verda's instance types")
        listed = api.call(
            "GET", "/instance-types", "reading instance types", query={"currency": "usd"}
        )
        self._types = {str(t["instance_type"]): t for t in listed}
        machines = [m for m in self._machines(request) if m.type in self._types]
        if not machines:
            raise ProvisionError(
                f"Verda offers none of {', '.join(m.type for m in self._machines(request))} "
                f"now; choose another accelerator or instance_type"
            )
        markets = capacity.markets(want.strategy)
        available: dict[str, dict[str, set[str]]] = {}
        for market in markets:  # what is available now, where, on each market
            query = {"isSpot": str(market == "spot").lower()}
            rows = api.call(
                "GET", "/instance-availability", f"reading {market} capacity", query=query
            )
            available[market] = {str(r["location_code"]): set(r["availabilities"]) for r in rows}
        first = self.options.location
        places = sorted({p for by in available.values() for p in by}, key=lambda p: (p != first, p))

        def free(machine: Machine, place: str, market: str) -> bool:
            return machine.type in available[market].get(place, set())

        zones = {
            m.type: [p for p in places if any(free(m, p, k) for k in markets)] for m in machines
        }
        plan = capacity.plan(machines, zones, strategy=want.strategy, price=self._price)
        offers = [o for o in plan if free(o.machine, o.zone, o.market)]
        if not offers:
            raise CapacityError(
                f"no Verda location has {' or '.join(m.type for m in machines)} available "
                f"now on {' or '.join(markets)} (looked in {', '.join(places) or 'none'}); try "
                f"again later, allocation='spot-if-available', or another accelerator"
            )
        return Offers(offers, offers[0].zone)

    def _machines(self, request: ProvisionRequest) -> list[Machine]:
        """The catalog's machines; an ``instance_type`` it lacks, as Verda describes it."""
        found = self.options.machines_for(request)
        named = self.options.instance_type
        if found or named is None or named not in self._types:
            return found or [Machine("verda", str(named), None, 0, 0, 0)]
        kind = self._types[named]
        gpus = int(kind.get("gpu", {}).get("number_of_gpus") or 0)
        return self.options.described(
            request,
            accelerator=str(kind.get("model")) if gpus else None,
            count=gpus,
            memory_gb=int(kind["gpu_memory"]["size_in_gigabytes"]) // gpus if gpus else 0,
            vcpus=int(kind["cpu"]["number_of_cores"]),
            ram_gb=float(kind["memory"]["size_in_gigabytes"]),
        )

    def _price(self, machine: Machine, place: str, market: capacity.Market) -> float | None:
        kind = self._types.get(machine.type, {})
        value = kind.get("spot_price" if market == "spot" else "price_per_hour")
        return float(value) if value not in (None, "") else None

    def _image(self, machine: Machine) -> str:
        """The type's own list of images (``supported_os``): for GPUs ``GPU_IMAGE``, else
        the first with CUDA; for CPUs the first without."""
        listed = [str(i) for i in self._types.get(machine.type, {}).get("supported_os", [])]
        cuda = [i for i in listed if "cuda" in i]
        if machine.accelerator is not None:
            return GPU_IMAGE if GPU_IMAGE in listed or not listed else (cuda or listed)[0]
        return next((i for i in listed if i not in cuda), listed[0] if listed else "ubuntu-24.04")

    # ── making ─────────────────────────────────────────────────────────────────────────

    def prepare(self, want: Want, offers: Sequence[Offer], boot: Boot, record: Record) -> None:
        api, base, reporter = self.api, self.base, want.reporter
        tags = json.dumps(dict(want.request.tags))
        want.deadline.check("registering the SSH key")
        body = {"name": base, "key": boot.authorized_key}
        record.add(
            "ssh key", str(api.call("POST", "/sshkeys", f"registering SSH key {base}", body))
        )
        want.deadline.check("registering the startup script")
        script = boot.start_script() + _RESTART_SSHD + f"{rest.TAGS_LINE}{tags}\n"
        body = {"name": base, "script": script}
        made = str(api.call("POST", "/scripts", f"registering startup script {base}", body))
        record.add("startup script", made)
        reporter.status(f"SSH key and startup script {base}")
        self._template = {
            "ssh_key_ids": record.resources("ssh key"),
            "startup_script_id": made,
            "description": rest.DESCRIPTION + tags,
        }

    def launch(
        self, offer: Offer, names: Sequence[str], record: Record, deadline: Deadline
    ) -> list[str]:
        """Every node's instance in ``offer``'s location and market, placed by Verda; a
        capacity refusal deletes this attempt's instances and is a ``CapacityError``."""
        assert self._template, "prepare comes first"
        spot, place, api = offer.market == "spot", offer.zone, self.api
        refusal: Refusal = "spot" if spot else "capacity"
        query = {"isSpot": str(spot).lower(), "location_code": place}
        doing = f"asking whether {offer.where} is available"
        path = f"/instance-availability/{offer.machine.type}"
        if api.call("GET", path, doing, query=query) is False:
            raise CapacityError(f"{doing}: not available now", refusal=refusal)
        made: dict[int, str] = {}

        def create(rank: int) -> None:
            name = names[rank]
            volume: dict[str, Any] = {"name": name, "size": self.options.os_volume_gb}
            if spot:  # else a reclaimed spot instance leaves its volume, billed
                volume["on_spot_discontinue"] = "delete_permanently"
            body = {
                **self._template,
                "image": self.options.image or self._image(offer.machine),
                "instance_type": offer.machine.type,
                "hostname": name,
                "location_code": place,
                "os_volume": volume,
                "is_spot": spot,
            }
            made[rank] = str(api.call("POST", "/instances", f"creating instance {name}", body))
            record.made(place, [made[rank]])  # a Ctrl-C from here on still deletes it

        errors = [e for f in settle(create, range(len(names))) if (e := f.exception())]
        ids = [made[rank] for rank in sorted(made)]
        if not errors:
            errors = self._placed(place, ids, deadline)
        if errors and all(map(_no_room, errors)):
            timeout = self.options.release_timeout
            left = self.discard(place, ids, Deadline(timeout, f"release_timeout ({timeout:g} s)"))
            if left:
                down = f"skyward down --pool {record.pool} --cloud verda"
                raise ProvisionError(f"could not delete {', '.join(left)}. Run: {down}")
            raise CapacityError(str(errors[0]), refusal=refusal) from errors[0]
        if errors:
            raise errors[0]
        return ids

    def _placed(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[BaseException]:
        """Wait until Verda has found each instance a host: a refusal per instance that
        ended ``no_capacity``."""

        def probe() -> list[dict[str, Any]] | None:
            listed = rest.instances(self.api, "waiting for Verda to place the instances")
            found = [listed.get(id, {"id": id, "status": "gone"}) for id in ids]
            return None if any(i["status"] in _PLACING for i in found) else found

        found = poll(probe, "waiting for Verda to place the instances", deadline, most=2.0)
        return [
            CapacityError(f"instance {i['id']} in {place}: {_WHY['no_capacity']}")
            for i in found
            if i["status"] == "no_capacity"
        ]

    # ── the machines ───────────────────────────────────────────────────────────────────

    def describe(self, place: str, ids: Sequence[str], *, quick: bool = False) -> list[Described]:
        listed = rest.instances(self.api, f"reading {len(ids)} instance(s)")
        return [_described(listed.get(id)) for id in ids]

    def discard(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[str]:
        listed = rest.instances(self.api) if ids else {}
        return rest.delete_instances(self.api, list(ids), listed, deadline)

    def delete(self, record: Record, deadline: Deadline) -> list[str]:
        """The instances (by id, and by name for a create whose answer was lost), waited
        for; then the startup script and the SSH key, by id and by name."""
        api, left = self.api, []
        try:
            listed = rest.instances(api)
        except ProvisionError as exc:
            listed, left = {}, [f"the instances ({exc})"]
        ids = [id for _, id in record.machines()]
        ids += [
            i
            for i, x in listed.items()
            if str(x.get("hostname")).startswith(self.prefix) and i not in ids
        ]
        left += rest.delete_instances(api, ids, listed, deadline)
        for kind, path in (("startup script", "/scripts"), ("ssh key", "/sshkeys")):
            made = record.resources(kind)
            try:
                made += [
                    str(x["id"]) for x in rest.named(api, path, self.base) if x["id"] not in made
                ]
            except ProvisionError as exc:
                left.append(f"the sweep for {kind}s ({exc})")
            left += rest.delete_named(api, path, kind, made)
        return left


def _no_room(error: BaseException) -> bool:
    return isinstance(error, CapacityError) or (isinstance(error, VerdaError) and error.capacity)


def _described(instance: dict[str, Any] | None) -> Described:
    if instance is None:
        return Described("ended", "gone", why="Verda no longer lists it (deleted)")
    status = str(instance["status"])
    state = _STATES.get(status, "ended")
    if state == "ended":
        return Described(state, status, why=_WHY.get(status, f"Verda says {status}"))
    address = str(instance.get("ip") or "")
    if state != "running" or not address:
        return Described("starting", status)
    return Described(state, status, Reach(host=address, peer=address))
