"""Where a cloud pool's machines are asked for, in what order, at what price; and moving on
when a place has no capacity. Cloud-neutral: AWS, GCP and Azure build on it.

(``Allocation`` in ``base.py`` is what one provision made; this module is about the
allocation *strategy*, hence its own name.)

::

    request (accelerator, vcpus, memory_gb, allocation=, max_hourly_cost)
      │  catalog.choose / matching / alternatives          machine types, in preference order
      │  provider: zones of the region offering each type, spot prices when spot is asked
      ▼
    plan(...)        -> [Offer(machine, zone, market, hourly), ...]   every place to try, in order
    affordable(...)  -> the offers within max_hourly_cost, or a ProvisionError naming the estimate
    launch_first(offers, launch)                        the provider's one launch attempt:
        launch(offer) -> T       all ``nodes`` machines in that one zone and market, or nothing;
                                 raises CapacityError when the place has no capacity, does not
                                 offer the type, or refuses spot: then the next offer is tried
        -> (offer, T), or a CapacityError listing every place tried and why

A provider implements only ``launch(offer)``: one request for every node of the pool in
``offer.zone`` with ``offer.machine.type`` on ``offer.market``, that leaves nothing behind
when it fails, raising ``CapacityError`` for the three refusals above and any other
``ProvisionError`` for the rest (a quota, a permission), which stops the failover.

Strategies (``ComputePool(allocation=...)``):

- ``"on-demand"`` / ``"spot"``: that market only; every zone of the first machine type, then
  of each alternative type (same accelerator and count, at least as large).
- ``"spot-if-available"``: every spot offer first, then every on-demand one.
- ``"cheapest"``: every machine type that satisfies the request on both markets, by
  estimated price (spot from the cloud's current prices), cheapest first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.client.phases import Choice, Reporter
from skyward.providers.cloud import catalog
from skyward.providers.cloud.api import Refusal
from skyward.providers.cloud.catalog import Cloud, Machine

T = TypeVar("T")
Market = Literal["on-demand", "spot"]
Strategy = Literal["on-demand", "spot", "spot-if-available", "cheapest"]
STRATEGIES: tuple[Strategy, ...] = ("on-demand", "spot", "spot-if-available", "cheapest")


class CapacityError(ProvisionError):
    """A place (zone, machine type, market) could not take the pool now; another may.

    Raised by a provider's launch attempt, which left nothing of itself behind; and by
    ``launch_first`` when every place refused, with ``attempts`` (offer, why) in order."""

    def __init__(
        self,
        message: str,
        *,
        refusal: Refusal = "capacity",
        attempts: Sequence[tuple[Offer, str]] = (),
    ) -> None:
        super().__init__(message)
        self.refusal = refusal
        self.attempts = list(attempts)

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields would be lost by Exception's default pickling.
        return (CapacityError, (str(self),), self.__dict__)


@dataclass(frozen=True)
class Offer:
    """One place to ask for the pool's machines: a type, a zone, a market, and the price of
    one machine there per hour (USD; ``None``: unknown)."""

    machine: Machine
    zone: str
    market: Market
    hourly: float | None

    @property
    def where(self) -> str:
        return f"{self.machine.type} {self.market} in {self.zone}"

    def pool_hourly(self, nodes: int) -> float | None:
        return None if self.hourly is None else self.hourly * nodes


def markets(strategy: Strategy) -> list[Market]:
    if strategy == "on-demand":
        return ["on-demand"]
    if strategy == "spot":
        return ["spot"]
    return ["spot", "on-demand"]


def offered(
    machines: Sequence[Machine],
    places: Sequence[str],
    refusal: Callable[[Machine, str], str | None],
    *,
    nowhere: str | None = None,
) -> tuple[dict[str, list[str]], list[str]]:
    """Per machine type, the places that offer it, in ``places``' order (what ``plan``
    takes), and each pair left out, as ``"TYPE in PLACE: why"``; ``refusal(machine,
    place)`` says why not, or ``None``. With ``nowhere``, a ``ProvisionError`` saying it
    when no place offers any type, before anything exists."""
    zones: dict[str, list[str]] = {m.type: [] for m in machines}
    left_out: list[str] = []
    for machine in machines:
        for place in places:
            why = refusal(machine, place)
            if why is None:
                zones[machine.type].append(place)
            else:
                left_out.append(f"{machine.type} in {place}: {why}")
    if nowhere is not None and not any(zones.values()):
        raise ProvisionError(nowhere)
    return zones, left_out


def plan(
    machines: Sequence[Machine],
    zones: Mapping[str, Sequence[str]],
    *,
    strategy: Strategy,
    price: Callable[[Machine, str, Market], float | None],
) -> list[Offer]:
    """Every offer to try, in order. ``machines`` are in preference order (the first is
    the catalog's choice); ``zones[type]`` the zones of the region that offer that type,
    in the order to try them; ``price(machine, zone, market)`` one machine's hourly price.
    Types no zone offers are skipped."""
    offers = [
        Offer(machine, zone, market, price(machine, zone, market))
        for market in markets(strategy)
        for machine in machines
        for zone in zones.get(machine.type, ())
    ]
    if strategy == "cheapest":
        rank = {id(o): i for i, o in enumerate(offers)}
        offers.sort(key=lambda o: (o.hourly is None, o.hourly or 0.0, rank[id(o)]))
    return offers


def affordable(offers: Sequence[Offer], nodes: int, max_hourly_cost: float | None) -> list[Offer]:
    """The offers whose pool price is at most ``max_hourly_cost`` (all of them when it is
    ``None``); a ``ProvisionError`` naming the estimate when none is, or when a price is
    unknown, so that nothing is created."""
    if max_hourly_cost is None:
        return list(offers)
    kept = [o for o in offers if o.hourly is not None and o.hourly * nodes <= max_hourly_cost]
    if kept:
        return kept
    priced = [o for o in offers if o.hourly is not None]
    if not priced:
        raise ProvisionError(
            f"max_hourly_cost=${max_hourly_cost:g}: no price is known for "
            f"{', '.join(sorted({o.machine.type for o in offers}))} here, so the pool's cost "
            f"cannot be checked; nothing was created. Leave max_hourly_cost out to start it"
        )
    cheapest = min(priced, key=lambda o: o.hourly or 0.0)
    assert cheapest.hourly is not None
    raise ProvisionError(
        f"the pool would cost about ${cheapest.hourly * nodes:.2f}/h at the cheapest "
        f"({nodes} x {cheapest.machine.type} {cheapest.market} in {cheapest.zone} at "
        f"${cheapest.hourly:.4g}/h), above max_hourly_cost=${max_hourly_cost:g}; nothing "
        f"was created. Ask for fewer or smaller nodes, allow spot, or raise the limit"
    )


def failover(attempt: Callable[[], T], refusal: Callable[[ProvisionError], Refusal | None]) -> T:
    """``attempt()``, one launch; a refusal another place may meet (``refusal(error)`` says
    which: a cloud's ``Refusals.refusal`` of its code) leaves as a ``CapacityError`` whose
    cause is the SDK's error, and ``launch_first`` moves on."""
    try:
        return attempt()
    except ProvisionError as exc:
        why = refusal(exc)
        if why is None:
            raise
        raise CapacityError(str(exc), refusal=why) from (exc.__cause__ or exc)


def launch_first(
    offers: Sequence[Offer],
    launch: Callable[[Offer], T],
    *,
    nodes: int,
    reporter: Reporter,
    deadline: Deadline,
) -> tuple[Offer, T]:
    """``launch`` each offer in turn until one takes the pool; the first that did, and what
    ``launch`` returned. Moves on only on ``CapacityError``; after the last, raises one that
    lists every place tried and why."""
    attempts: list[tuple[Offer, str]] = []
    for index, offer in enumerate(offers):
        deadline.check(f"launching {nodes} instance(s): {offer.where}")
        try:
            return offer, launch(offer)
        except CapacityError as exc:
            why = str(exc)
            attempts.append((offer, why))
            if index + 1 < len(offers):
                following = offers[index + 1]
                reporter.status(f"{offer.where}: {_short(why)}; trying {following.where}")
    if not attempts:
        raise ProvisionError("no zone of the region offers the machine types asked for")
    tried = "; ".join(f"{offer.where}: {_short(why)}" for offer, why in attempts)
    raise CapacityError(
        f"no place could take {nodes} machine(s); tried {len(attempts)}: {tried}. Try again "
        f"later, another region, allocation='spot-if-available' or 'cheapest', or another "
        f"accelerator",
        attempts=attempts,
    )


def _short(why: str) -> str:
    """The part of an error that says why (after the ``doing:`` prefix), first sentence."""
    reason = why.split(": ", 1)[-1]
    return reason.split(". ", 1)[0].rstrip(".")


# ── what every cloud provider asks of the request (``CloudOptions`` calls these) ──────────


def strategy_of(allocation: str | None, *, spot: bool, provider: str) -> Strategy:
    """The pool's ``allocation=``, or the provider's default (its ``spot=`` setting)."""
    if allocation is None:
        return "spot" if spot else "on-demand"
    if allocation not in STRATEGIES:
        raise ValueError(f"unknown allocation {allocation!r}")
    if spot and allocation == "on-demand":
        raise ValueError(
            f"{provider}(spot=True) contradicts allocation='on-demand'; give one of them"
        )
    return allocation


def machines_for(
    cloud: Cloud,
    accelerator: str | None,
    *,
    strategy: Strategy,
    vcpus: float | None,
    memory_gb: float | None,
    named: str | None,
    given: str,
    region: str | None,
) -> list[Machine]:
    """The catalog's machines for a request, in the order to try them (the choice, then
    what a failover may move to). A type the user ``named`` (the provider's option
    ``given``) is the only one, refused if it contradicts ``vcpus``/``memory_gb``; empty
    when the catalog does not know it (the cloud is asked). ``ValueError`` for a request
    no machine satisfies."""
    sizes = {"vcpus": vcpus, "memory_gb": memory_gb}
    if named is not None:
        rows = [m for m in catalog.machines(cloud) if m.type == named]
        wanted = catalog.parse(accelerator).name if accelerator else None
        known = next((m for m in rows if m.accelerator == wanted), rows[0] if rows else None)
        if known is not None:
            catalog.refuse_contradiction(known, given=given, **sizes)
        return [known] if known is not None else []
    if strategy == "cheapest":
        return catalog.matching(cloud, accelerator, region=region, **sizes)
    first = catalog.choose(cloud, accelerator, region=region, **sizes)
    return [first, *catalog.alternatives(first, accelerator, region=region, **sizes)]


def refuse_above(
    machines: Sequence[Machine],
    *,
    nodes: int,
    max_hourly_cost: float | None,
    regions: Sequence[str],
    price: Callable[[Machine, str], float | None] = catalog.machine_price,
) -> None:
    """When the pool is built: an on-demand pool whose every known price (``price`` of a
    machine in one of ``regions``) is above ``max_hourly_cost`` is refused (the table needs
    no network; unknown prices are judged at provision, still before anything is created)."""
    if max_hourly_cost is None:
        return
    priced = [(m, r, price(m, r)) for r in regions for m in machines]
    offers = [Offer(m, r, "on-demand", p) for m, r, p in priced if p is not None]
    if offers:
        affordable(offers, nodes, max_hourly_cost)


def announce(offers: Sequence[Offer], nodes: int, reporter: Reporter, where: str) -> None:
    """The choice, where and the price, before anything is created: ``reporter.chosen``
    (the progress display shows it), then every node's row says what it waits for.
    ``where``: the region (on Azure the location, which is also the offer's "zone")."""
    first = offers[0]
    reporter.chosen(
        Choice(
            nodes=nodes,
            machine=first.machine.type,
            hardware=first.machine.hardware(),
            where=where if where == first.zone else f"{where} ({first.zone})",
            market=first.market,
            hourly=first.hourly,
            fallbacks=len({o.where for o in offers[1:]}),
        )
    )
    for rank in range(nodes):
        reporter.phase(rank, "provisioning", f"{first.machine.type} in {first.zone}")
