"""One Vast.ai pool's instances: the cloud contract's calls (``cloud/contract.py``) on Vast's
marketplace.

::

    offers      Vast's offer search (bundles) for the GPU, count, reliability, places,
                verified hosts, vCPUs, memory and max_hourly_cost, cheapest first; one
                ``Offer`` per market (interruptible = spot, at a bid), priced by the
                ``nodes`` cheapest asks
    prepare     the boot payload as the container's start command (``Boot.start_script``):
                the host key the client made, the login key, sshd on 22, the watchdog,
                whose last act ends the container's main process; nothing is registered
    launch      one rent per node (PUT /asks/{id}/), labelled with its name; an ask rented
                by someone else meanwhile: the next one
    describe    the account's instances: actual_status, and where port 22 is mapped
    delete      every instance recorded, and any labelled with a name asked for

Vast runs the image with our command as its main process (``runtype: args``, the entrypoint
``sh``, and ``-p 22:22`` for a direct port), not its own SSH setup: sshd presents the
client's host key from its first connection, and the login key travels in the command,
so no SSH key is added to the account and none is left there. The account's API key never
goes to the machine.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud import capacity
from skyward.providers.cloud.boot import END_CONTAINER, END_CONTAINER_PATH, Boot
from skyward.providers.cloud.capacity import CapacityError, Market, Offer
from skyward.providers.cloud.catalog import Machine
from skyward.providers.cloud.contract import Described, Offers, Reach, Want
from skyward.providers.cloud.record import Record
from skyward.providers.cloud.start import unique_name
from skyward.providers.vastai.api import Api, OfferGone

PLACE = "vast.ai"  # the one "zone": an offer is any host of the marketplace
# Skyward's names -> Vast's gpu_name values, where more than "_" -> " " (Vast's own CLI's
# reading: RTX_4090 -> "RTX 4090") is needed.
GPU_NAMES: dict[str, tuple[str, ...]] = {
    "A100": ("A100 PCIE", "A100 SXM4", "A100X"),
    "H100": ("H100 SXM", "H100 PCIE", "H100 NVL"),
    "H200": ("H200", "H200 NVL"),
    "T4": ("Tesla T4",),
    "V100": ("Tesla V100",),
    "P100": ("Tesla P100",),
    "A6000": ("RTX A6000",),
    "RTX_6000_ADA": ("RTX 6000Ada",),
    "RTX_4080": ("RTX 4080", "RTX 4080S"),
    "RTX_3090": ("RTX 3090", "RTX 3090 Ti"),
    "RTX_3080": ("RTX 3080", "RTX 3080 Ti"),
}
# geolocation= regions, as Vast's CLI expands them into country codes.
REGIONS = {
    "NA": "CA US",
    "EU": "AL AD AT BY BE BA BG HR CY CZ DK EE FI FR GE DE GR HU IS IT LV LI LT LU MT MD MC "
    "ME NL NO PL PT RO RS SK SI ES SE CH UA GB MK",
    "AS": "AE AM AZ BD BH BN BT MM KH IN ID IL JP JO KZ MY MV MN NP KR PK PH QA SA SG LK TW TH "
    "TR VN HK CN OM",
    "OC": "AU FJ NZ PG",
    "LC": "AR BS BB BZ BO BR CL CO CR DO EC SV GT HN JM MX NI PA PY PE PR TT UY VE",
    "AF": "DZ AO BW CM EG ET GH KE MA MU NG RW SN ZA TN UG ZM ZW",
}
_NAME = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_]*?)(?:-(?P<gb>\d+)GB)?(?::(?P<count>\d+))?$")
_STARTING = {None, "", "created", "loading", "scheduling", "rebooting", "unknown"}
# The container's main process, after the boot: it lives until the watchdog ends it.
_MAIN = "trap 'exit 0' TERM INT\nwhile :; do sleep 60 & wait $!; done\n"


def wanted_gpus(accelerator: str | None) -> tuple[str | None, list[str], int, int | None]:
    """(the name, Vast's gpu_names for it, GPUs per node, GB per GPU) of ``accelerator``;
    ``ValueError`` for a name that is no accelerator's."""
    if accelerator is None:
        return None, [], 1, None
    found = _NAME.match(accelerator.strip())
    if found is None:
        raise ValueError(f"{accelerator!r} is no accelerator name ('RTX_4090', 'A100-80GB:2')")
    name = found["name"].upper()
    names = list(GPU_NAMES.get(name, (name.replace("_", " "),)))
    gb = int(found["gb"]) if found["gb"] else None
    return name, names, int(found["count"] or 1), gb


class Settings(Protocol):
    """What the machines read of ``sky.VastAI`` (``options.py``)."""

    geolocation: str | tuple[str, ...] | None
    min_reliability: float
    verified: bool
    min_cuda: float | None
    bid_multiplier: float
    image: str | None
    disk_gb: int
    endpoint_url: str | None

    @property
    def release_timeout(self) -> float: ...


class VastMachines:
    """A pool's instances on Vast.ai: the asks found, and what the rents send."""

    noun = "instance"
    instance_profile = False

    def __init__(self, options: Settings, api: Api, pool: str) -> None:
        self.options, self.api = options, api
        self.base = unique_name(pool, unsafe=r"[^A-Za-z0-9-]", length=30)
        self.prefix = f"{self.base}-node-"
        self._lock = threading.Lock()  # guards: _asks, _tried
        self._asks: dict[str, list[dict[str, Any]]] = {}  # market -> asks not tried, cheapest first
        self._tried: set[int] = set()
        self._want: Want | None = None  # set by offers(), read by a launch that searches again
        self._body: dict[str, Any] = {}  # set by prepare(), read by launch

    @property
    def scope(self) -> tuple[str, str]:
        return " on Vast.ai", "--cloud vastai"

    def key_label(self, first: Offer) -> tuple[str, str, str]:
        return PLACE, self.base, self.options.endpoint_url or ""

    def resume(self, name: str) -> None:
        self.base, self.prefix = name, f"{name}-node-"  # the instances' labels, the sweep's

    # ── offers ─────────────────────────────────────────────────────────────────────────

    def offers(self, want: Want) -> Offers:
        request, nodes = want.request, want.request.nodes
        self.api.user()  # the key is checked here, before anything is rented
        self._want = want
        found, short = [], []
        for market in capacity.markets(want.strategy):
            asks = self._search(want, market)
            with self._lock:
                self._asks[market] = asks
            if len(asks) < nodes:
                short.append(f"{len(asks)} {market}")
                continue
            cheapest = asks[:nodes]
            hourly = sum(self.price(a, market) for a in cheapest) / nodes
            found.append(Offer(machine_of(cheapest[0], request.accelerator), PLACE, market, hourly))
        if not found:
            raise ProvisionError(
                f"Vast.ai has {' and '.join(short)} offer(s) of {self._asked(request)}, and the "
                f"pool needs {nodes}; nothing was rented. Lower min_reliability, widen or drop "
                f"geolocation, allow unverified hosts (verified=False), raise max_hourly_cost, "
                f"or ask for another accelerator"
            )
        if want.strategy == "cheapest":
            found.sort(key=lambda o: o.hourly or 0.0)
        return Offers(found, PLACE)

    def _asked(self, request: ProvisionRequest) -> str:
        name, _, count, gb = wanted_gpus(request.accelerator)
        return f"{count}x {name or 'any GPU'}" + (f" {gb} GB" if gb else "")

    def _search(self, want: Want, market: Market) -> list[dict[str, Any]]:
        request, options = want.request, self.options
        _, names, count, gb = wanted_gpus(request.accelerator)
        query: dict[str, Any] = {
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "external": {"eq": False},
            "num_gpus": {"eq": count},
            "reliability": {"gte": options.min_reliability},
            "direct_port_count": {"gte": 1},  # port 22 mapped straight to the container
            "order": [["dph_total", "asc"]],
            "type": "bid" if market == "spot" else "on-demand",
            "allocated_storage": options.disk_gb,
            "limit": 200,
        }
        conditions = {
            "verified": {"eq": True} if options.verified else None,
            "gpu_name": {"in": names} if names else None,
            "gpu_ram": {"gte": gb * 1000, "lte": gb * 1100} if gb else None,
            "cuda_max_good": {"gte": options.min_cuda} if options.min_cuda else None,
            "cpu_cores_effective": {"gte": request.vcpus} if request.vcpus else None,
            "cpu_ram": {"gte": request.memory_gb * 1000} if request.memory_gb else None,
            "geolocation": {"in": countries(options.geolocation)} if options.geolocation else None,
        }
        query.update({key: value for key, value in conditions.items() if value is not None})
        want.deadline.check("searching Vast.ai's offers")
        found = self.api.offers(query)
        with self._lock:
            asks = [a for a in found if a.get("id") not in self._tried]
        cap = request.max_hourly_cost
        if cap is not None:
            asks = [a for a in asks if self.price(a, market) * request.nodes <= cap]
        return sorted(asks, key=lambda a: self.price(a, market))

    def price(self, ask: Mapping[str, Any], market: Market) -> float:
        """USD per hour: the on-demand price, or the bid an interruptible one is rented at."""
        on_demand = float(ask.get("dph_total") or 0.0)
        if market == "on-demand" or ask.get("min_bid") is None:
            return on_demand
        return round(float(ask["min_bid"]) * self.options.bid_multiplier, 4)

    # ── prepare, launch ────────────────────────────────────────────────────────────────

    def prepare(self, want: Want, offers: Sequence[Offer], boot: Boot, record: Record) -> None:
        ended = boot.with_last_act(idle_action=END_CONTAINER_PATH, files=[END_CONTAINER])
        self._body = {
            "client_id": "me",
            "image": self.options.image or ubuntu(),
            "disk": self.options.disk_gb,
            "runtype": "args",  # our command is the main process; Vast injects nothing
            "onstart": "sh",  # the entrypoint, in args mode
            "args": ["-c", ended.start_script() + _MAIN],
            "env": {"-p 22:22": "1"},
        }

    def launch(
        self, offer: Offer, names: Sequence[str], record: Record, deadline: Deadline
    ) -> list[str]:
        made: list[str] = []
        try:
            for name in names:
                made.append(self._rent(offer.market, name, record, deadline))
        except CapacityError:
            timeout = self.options.release_timeout
            left = self.discard(PLACE, made, Deadline(timeout, f"release_timeout ({timeout:g} s)"))
            if left:
                raise ProvisionError(f"could not destroy {', '.join(left)} on Vast.ai") from None
            raise
        return made

    def _rent(self, market: Market, name: str, record: Record, deadline: Deadline) -> str:
        """Rent the cheapest ask left for one node; an ask gone meanwhile: the next one."""
        gone: list[str] = []
        searched = False
        while True:
            deadline.check(f"renting a Vast.ai instance for {name}")
            with self._lock:
                asks = self._asks.get(market) or []
                ask = asks.pop(0) if asks else None
                if ask is not None:
                    self._tried.add(ask["id"])
            if ask is None and not searched and self._want is not None:
                searched = True  # the asks found first are spent: what is there now
                fresh = self._search(self._want, market)
                with self._lock:
                    self._asks[market] = fresh
                continue
            if ask is None:
                raise CapacityError(
                    f"renting {name}: no {market} offer left on Vast.ai"
                    + (f" (gone when rented: {', '.join(gone)})" if gone else "")
                )
            body = {**self._body, "label": name}
            if market == "spot":
                body["price"] = self.price(ask, market)
            try:
                id = str(self.api.rent(int(ask["id"]), body))
            except OfferGone:
                gone.append(str(ask["id"]))
                continue
            record.made(PLACE, [id])
            return id

    # ── describe, discard, delete ──────────────────────────────────────────────────────

    def describe(self, place: str, ids: Sequence[str], *, quick: bool = False) -> list[Described]:
        listed = {str(i.get("id")): i for i in self.api.instances()}
        return [described(listed.get(id)) for id in ids]

    def discard(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[str]:
        return destroy(self.api, list(ids), deadline)

    def delete(self, record: Record, deadline: Deadline) -> list[str]:
        asked = {name for _, name in record.asked()}
        ids = [id for _, id in record.machines()]
        try:  # a rent cut off in flight: its instance is found by its label
            ids += [str(i["id"]) for i in self.api.instances() if i.get("label") in asked]
        except ProvisionError as exc:
            return [*destroy(self.api, ids, deadline), f"the label sweep ({exc})"]
        return destroy(self.api, list(dict.fromkeys(ids)), deadline)


def ubuntu(version: str = "24.04", cuda: str = "12.9.1", cuda_dist: str = "runtime") -> str:
    """NVIDIA's CUDA image (its userland, no driver: the host's is mounted in) of that
    Ubuntu, CUDA and flavour; the default image. sshd is installed by the start command."""
    return f"nvcr.io/nvidia/cuda:{cuda}-{cuda_dist}-ubuntu{version}"


def countries(geolocation: str | Sequence[str]) -> list[str]:
    codes = [geolocation] if isinstance(geolocation, str) else list(geolocation)
    return [c for code in codes for c in REGIONS.get(code, code).split()]


def machine_of(ask: Mapping[str, Any], accelerator: str | None) -> Machine:
    """The catalog's idea of one offer: ``"1x RTX 4090"``, its GPUs, vCPUs and memory."""
    count = int(ask.get("num_gpus") or 1)
    return Machine(
        cloud="vastai",
        type=f"{count}x {ask.get('gpu_name', 'GPU')}",
        accelerator=wanted_gpus(accelerator)[0] or str(ask.get("gpu_name", "GPU")),
        count=count,
        memory_gb=round(float(ask.get("gpu_ram") or 0) / 1024),
        vcpus=int(float(ask.get("cpu_cores_effective") or 0)),
        ram_gb=round(float(ask.get("cpu_ram") or 0) / 1000, 1),
    )


def described(instance: Mapping[str, Any] | None) -> Described:
    """An instance as the start reads it: on its way, running (and where 22 is mapped), or
    ended, with Vast's own words for why."""
    if instance is None:
        return Described("ended", "gone", why="Vast.ai no longer lists it (destroyed)")
    status, said = instance.get("actual_status"), str(instance.get("status_msg") or "").strip()
    if status in _STARTING:
        return Described("starting", str(status or "created"))
    if status == "running":
        mapped = (instance.get("ports") or {}).get("22/tcp") or []
        host = str(instance.get("public_ipaddr") or "").strip()
        if not mapped or not host:
            return Described("starting", "running")
        reach = Reach(host=host, peer=host, port=int(mapped[0]["HostPort"]))
        return Described("running", "running", reach=reach)
    if status == "stopped" and instance.get("is_bid"):
        why = "interrupted by Vast.ai: outbid (an interruptible instance)"
    elif status == "exited":
        why = "its main process ended (the idle watchdog, or the start command failed)"
    elif status == "offline":
        why = "its host went offline"
    else:
        why = f"Vast.ai reports it {status}"
    return Described("ended", str(status), why=f"{why}: {said}" if said else why)


def destroy(api: Api, ids: Sequence[str], deadline: Deadline) -> list[str]:
    """Destroy every instance of ``ids``, then wait (within ``deadline``) until Vast lists
    none of them: what could not be destroyed, as ``"instance id (why)"``."""
    failed = []
    for id in ids:
        try:
            api.destroy(id)
        except ProvisionError as exc:
            failed.append(f"instance {id} ({exc})")
    if deadline.remaining() <= 0:  # a lost machine let go: not waited for
        return failed
    waiting = [id for id in ids if not any(f.startswith(f"instance {id} ") for f in failed)]
    while waiting and deadline.remaining() > 0:
        try:
            listed = {str(i.get("id")) for i in api.instances()}
        except ProvisionError:
            listed = set(waiting)
        waiting = [id for id in waiting if id in listed]
        if waiting:
            deadline.sleep(1.0)
    return failed + [f"instance {id} (still listed after destroy)" for id in waiting]
