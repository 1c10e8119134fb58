"""Which machine each cloud gives for a request: the catalog the clouds share.

::

    "A100"          the smallest machine with A100s on that cloud (on AWS: 8 of them)
    "A100:8"        a machine with exactly 8 A100s, either memory size
    "A100-80GB:8"   exactly 8 A100s with 80 GB each
    None            a CPU machine
    vcpus=, memory_gb=   at least this many vCPUs / GB of memory per machine: the cheapest
                    machine of the kind asked for that has them

``parse`` reads a name without knowing the cloud (the pool checks it when it is built);
``choose(cloud, name, vcpus=, memory_gb=)`` picks the machine, or raises ``ValueError``
listing what that cloud has; ``matching`` lists every machine that satisfies a request,
cheapest first (for ``allocation="cheapest"``), and ``alternatives`` the ones a capacity
failover may move to (same accelerator and count, at least as large).

The rows and prices are data in each cloud's folder, read once, on first use, and shipped
with the package (``pyproject.toml``'s package-data)::

    providers/<cloud>/machines.json   how the cloud is spelled to users and names its
                                      regions, its reference region (where prices are read
                                      when none is given), and its machine types in order:
                                      per accelerator, the default for a bare name first
                                      (``choose`` takes the first that fits), then larger
                                      sizes a request for more, "cheapest" or a failover
                                      may take
    providers/<cloud>/prices.json     the dated on-demand list prices, per type and region
                                      (USD per hour; ``scripts/refresh_prices.py``), and
                                      whether a region missing for a type means the cloud
                                      does not sell it there

``price(cloud, type, region)`` reads them, ``None`` where they do not know one. Facts come
from each cloud's public instance-type pages (and agree with EC2's
``describe_instance_types``, which a test checks). Current spot prices are the cloud's to
tell: ``catalog(spot=True)`` asks through the lookups its caller passes, and this module
imports no cloud's code.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from typing import TYPE_CHECKING

from skyward._errors import ProvisionError, SkywardError
from skyward.providers.registry import SpotPrices, catalog_clouds, spot_lookups

_log = logging.getLogger("skyward")

# The clouds with a catalog, in the order listings show them; each has its data files in
# ``providers/<cloud>/``.
Cloud = str  # a provider's ``type`` in the registry ("aws")
CLOUDS: tuple[Cloud, ...] = catalog_clouds()


_NAME = re.compile(r"^(?P<name>[A-Za-z0-9]+?)(?:-(?P<memory>\d+)GB)?(?::(?P<count>\d+))?$", re.I)
# Names outside the catalog (sky.accelerators.Custom): what a Slurm gres or an SSH host's
# label can be.
_FREE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Accelerator:
    """An accelerator request as a value: ``name`` (``"A100"``), and ``count`` (per node)
    and ``memory_gb`` (per device) when the request pins them; ``None`` leaves them to the
    provider, exactly as the string form does.

    ``sky.accelerators.A100(count=8)`` makes one, and so does ``parse("A100:8")``; the two
    are the same request, and ``str()`` gives the string form back (``"A100-80GB:8"``),
    which is what the pool hands providers, plugins and ``InstanceInfo``.
    """

    name: str
    count: int | None = None
    memory_gb: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _FREE_NAME.match(self.name):
            raise ValueError(
                f"an accelerator's name is letters, digits, '_', '.' or '-', starting with a "
                f"letter (such as 'A100'), not {self.name!r}"
            )
        for field, value in (("count", self.count), ("memory_gb", self.memory_gb)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(f"{self.name}: {field} must be a whole number >= 1, not {value!r}")

    @property
    def memory(self) -> str:
        """The memory per device as skyward 0.5 wrote it (``"80GB"``); ``""`` when not pinned."""
        return f"{self.memory_gb}GB" if self.memory_gb else ""

    def with_count(self, count: int) -> Accelerator:
        """This accelerator, ``count`` of them per node."""
        return Accelerator(self.name, count, self.memory_gb)

    def __str__(self) -> str:
        memory = f"-{self.memory_gb}GB" if self.memory_gb else ""
        count = f":{self.count}" if self.count else ""
        return f"{self.name}{memory}{count}"


@dataclass(frozen=True)
class Machine:
    """One machine type of one cloud.

    ``memory_gb`` is per accelerator, as the vendor names it; ``ram_gb`` the machine's own
    memory (0: not known). ``attach`` is, on GCP, the accelerator type attached to a
    general-purpose machine (N1 with T4 or V100); machine types with built-in GPUs leave it
    ``None``. ``arch`` is the CPU architecture images must be built for.
    """

    cloud: Cloud
    type: str
    accelerator: str | None
    count: int  # accelerators per machine (0 for CPU)
    memory_gb: int  # per accelerator, as the vendor names it (0 for CPU)
    vcpus: int
    # this row's own price, reference region only: for rows prices.json cannot key by type
    hourly_list: float | None = None
    attach: str | None = None
    ram_gb: float = 0.0
    arch: str = "x86_64"

    @property
    def hourly(self) -> float | None:
        """The on-demand list price in the cloud's reference region (USD per hour)."""
        return machine_price(self)

    def describe(self) -> str:
        if self.accelerator is None:
            memory = f", {self.ram_gb:g} GB" if self.ram_gb else ""
            return f"{self.type} ({self.vcpus} vCPUs{memory}, no accelerator)"
        return f"{self.type} ({self.count}x {self.accelerator} {self.memory_gb} GB)"

    def hardware(self) -> str:
        """``"8x A100 40 GB"``; ``"4 vCPUs, 16 GB"`` for a CPU machine."""
        if self.accelerator is None:
            return f"{self.vcpus} vCPUs" + (f", {self.ram_gb:g} GB" if self.ram_gb else "")
        return f"{self.count}x {self.accelerator} {self.memory_gb} GB"

    def satisfies(self, vcpus: float | None, memory_gb: float | None) -> bool:
        """At least ``vcpus`` vCPUs and ``memory_gb`` GB of memory (``None``: any)."""
        if vcpus is not None and self.vcpus < vcpus:
            return False
        return memory_gb is None or (self.ram_gb > 0 and self.ram_gb >= memory_gb)


# ── the data files ───────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class _Tables:
    """Every cloud's data files, as read: the module-level names below are these fields."""

    machines: tuple[Machine, ...]
    names: tuple[str, ...]
    providers: dict[Cloud, str]
    reference_region: dict[Cloud, str]
    as_of: dict[Cloud, str]
    # cloud -> machine type -> region -> USD per hour
    on_demand: dict[Cloud, dict[str, dict[str, float]]]
    # clouds whose price list names every region that sells a type
    regions_complete: frozenset[Cloud]
    region_patterns: dict[Cloud, re.Pattern[str]]
    region_examples: dict[Cloud, str]


# A machines.json row's keys and the JSON types each may hold; those in _OPTIONAL may be
# left out (the field's default).
_ROW: dict[str, tuple[type, ...]] = {
    "type": (str,),
    "accelerator": (str, type(None)),
    "count": (int,),
    "memory_gb": (int,),
    "vcpus": (int,),
    "ram_gb": (int, float),
    "hourly_list": (int, float, type(None)),
    "attach": (str, type(None)),
    "arch": (str,),
}
_OPTIONAL = {"hourly_list", "attach", "arch"}


def _read(cloud: Cloud, name: str) -> dict[str, object] | None:
    """``providers/<cloud>/<name>`` as a JSON object; ``None`` when the cloud has no such file
    (read through the package, so an installed wheel reads its own copy, and the cloud's
    package itself is not imported)."""
    file = resources.files("skyward.providers") / cloud / name
    if not file.is_file():
        return None
    loaded: object = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict):
        raise ValueError(f"providers/{cloud}/{name} is not a JSON object")
    return loaded


def _text(data: Mapping[str, object], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key!r} must be a string, not {value!r}")
    return value


def _machine(cloud: Cloud, row: object) -> Machine:
    where = f"providers/{cloud}/machines.json"
    if not isinstance(row, dict) or not set(_ROW) - _OPTIONAL <= row.keys() <= set(_ROW):
        raise ValueError(f"{where}: a row has {', '.join(_ROW)} (the last 3 optional): {row}")
    for key, value in row.items():
        if not isinstance(value, _ROW[key]) or isinstance(value, bool):
            raise ValueError(f"{where}: {key} has the wrong type in {row}")
    return Machine(cloud, **row)


def _prices(cloud: Cloud, table: object) -> dict[str, dict[str, float]]:
    """``on_demand`` of a cloud's prices.json: machine type -> region -> USD per hour."""
    if not isinstance(table, dict) or not all(
        isinstance(regions, dict) and all(isinstance(usd, int | float) for usd in regions.values())
        for regions in table.values()
    ):
        raise ValueError(f"providers/{cloud}/prices.json: 'on_demand' is type -> region -> USD")
    return table


@functools.cache
def _tables() -> _Tables:
    """Read every cloud's files, once (importing the catalog reads nothing)."""
    rows: list[Machine] = []
    providers: dict[Cloud, str] = {}
    reference: dict[Cloud, str] = {}
    patterns: dict[Cloud, re.Pattern[str]] = {}
    examples: dict[Cloud, str] = {}
    on_demand: dict[Cloud, dict[str, dict[str, float]]] = {}
    as_of: dict[Cloud, str] = {}
    complete: set[Cloud] = set()
    for cloud in CLOUDS:
        where = f"providers/{cloud}/machines.json"
        machines = _read(cloud, "machines.json")
        if machines is None:
            raise ValueError(f"{where} is missing: every cloud of the catalog has one")
        listed = machines.get("machines")
        if not isinstance(listed, list):
            raise ValueError(f"{where}: 'machines' must be a list of rows")
        rows += [_machine(cloud, row) for row in listed]
        providers[cloud] = _text(machines, "provider", where)
        reference[cloud] = _text(machines, "reference_region", where)
        patterns[cloud] = re.compile(_text(machines, "region_pattern", where))
        examples[cloud] = _text(machines, "region_example", where)
        prices = _read(cloud, "prices.json") or {"on_demand": {}}
        on_demand[cloud] = _prices(cloud, prices.get("on_demand"))
        if prices.get("as_of") is not None:
            as_of[cloud] = _text(prices, "as_of", f"providers/{cloud}/prices.json")
        if prices.get("regions_complete") is True:
            complete.add(cloud)
    return _Tables(
        machines=tuple(rows),
        names=tuple(dict.fromkeys(m.accelerator for m in rows if m.accelerator is not None)),
        providers=providers,
        reference_region=reference,
        as_of=as_of,
        on_demand=on_demand,
        regions_complete=frozenset(complete),
        region_patterns=patterns,
        region_examples=examples,
    )


if TYPE_CHECKING:
    # Read on first use (``__getattr__``), as if they were constants.
    MACHINES: tuple[Machine, ...]  # every cloud's rows, in CLOUDS' order
    NAMES: tuple[str, ...]  # every accelerator name any cloud has, canonical spelling
    PROVIDERS: dict[Cloud, str]  # how the clouds are spelled to users ("sky.AWS")
    REFERENCE_REGION: dict[Cloud, str]  # where prices are read when no region is given
    AS_OF: dict[Cloud, str]  # the date of each cloud's price table, where it has one
    ON_DEMAND: dict[Cloud, dict[str, dict[str, float]]]  # cloud -> type -> region -> USD/h

_LAZY = {
    "MACHINES": "machines",
    "NAMES": "names",
    "PROVIDERS": "providers",
    "REFERENCE_REGION": "reference_region",
    "AS_OF": "as_of",
    "ON_DEMAND": "on_demand",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(_tables(), _LAZY[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse(text: str) -> Accelerator:
    """``"a100-80gb:8"`` -> ``Accelerator("A100", 8, 80)``; ``ValueError`` for a name no
    cloud has, listing those that exist."""
    match = _NAME.match(text.strip())
    names = _tables().names
    canonical = {n.upper(): n for n in names}
    if match is None or match["name"].upper() not in canonical:
        raise ValueError(
            f"unknown accelerator {text!r}; the clouds' catalog knows {', '.join(names)} "
            f"(optionally with memory and count, for example 'A100-80GB:8'), or None for CPU "
            f"machines. A name outside it (sky.accelerators.Custom) suits sky.SSH and "
            f"sky.Slurm, which take the machines' own names"
        )
    count = int(match["count"]) if match["count"] else None
    if count == 0:
        raise ValueError(f"{text!r}: the count after ':' must be at least 1")
    memory = int(match["memory"]) if match["memory"] else None
    return Accelerator(canonical[match["name"].upper()], count, memory)


def regions(cloud: Cloud) -> list[str]:
    """Every region the cloud's price table names, sorted: the places a "did you mean" can
    point at without asking the cloud."""
    return sorted({r for prices in _tables().on_demand[cloud].values() for r in prices})


def selling(accelerator: str) -> dict[Cloud, list[str]]:
    """Per cloud, the regions whose prices list a machine with ``accelerator``, sorted:
    where it is sold, as far as the price tables say."""
    tables = _tables()
    found: dict[Cloud, list[str]] = {}
    for cloud in CLOUDS:
        places = {
            region
            for machine in _browse(cloud, accelerator)
            for region in tables.on_demand[cloud].get(machine.type, {})
        }
        if places:
            found[cloud] = sorted(places)
    return found


def machines(cloud: Cloud) -> list[Machine]:
    return [m for m in _tables().machines if m.cloud == cloud]


def find(cloud: Cloud, machine_type: str) -> Machine | None:
    """The catalog's entry for ``machine_type`` (the first, for GCP's N1 with GPUs)."""
    return next((m for m in machines(cloud) if m.type == machine_type), None)


def price(cloud: Cloud, machine_type: str, region: str | None = None) -> float | None:
    """The on-demand list price per hour of ``machine_type`` in ``region`` (default: the
    cloud's reference region), when the table has it."""
    tables = _tables()
    table = tables.on_demand[cloud].get(machine_type)
    if table is not None:
        return table.get(region or tables.reference_region[cloud])
    if region is None or region == tables.reference_region[cloud]:
        machine = find(cloud, machine_type)
        return machine.hourly_list if machine is not None else None
    return None


def _named(cloud: Cloud, accelerator: str | None) -> tuple[Accelerator | None, list[Machine]]:
    """The parsed name and the machines of that accelerator (CPU ones for ``None``)."""
    if accelerator is None:
        return None, [m for m in machines(cloud) if m.accelerator is None]
    wanted = parse(accelerator)
    offered = [m for m in machines(cloud) if m.accelerator == wanted.name]
    if not offered:
        have = sorted({m.accelerator for m in machines(cloud) if m.accelerator})
        raise ValueError(
            f"{cloud} has no {wanted.name} machines; it has {', '.join(have)} "
            f"(or pass the instance type yourself). {who_offers(wanted, besides=cloud)}"
        )
    pinned = [m for m in offered if fits(m, wanted)]
    if not pinned:
        options = ", ".join(
            f"'{m.accelerator}-{m.memory_gb}GB:{m.count}' ({m.type})"
            for m in dict((m.type, m) for m in offered).values()
        )
        raise ValueError(
            f"{cloud} has no machine with {wanted}; it has {options}. "
            f"{who_offers(wanted, besides=cloud)}"
        )
    return wanted, pinned


def fits(machine: Machine, wanted: Accelerator) -> bool:
    """Whether ``machine`` has the accelerator ``wanted`` asks for, in its count and memory
    when they are pinned."""
    return (
        machine.accelerator == wanted.name
        and (wanted.count is None or machine.count == wanted.count)
        and (wanted.memory_gb is None or machine.memory_gb == wanted.memory_gb)
    )


def offered_by(wanted: Accelerator) -> dict[Cloud, list[Machine]]:
    """Per cloud, the machines that have ``wanted`` (in its count and memory when pinned);
    clouds with none are left out."""
    found: dict[Cloud, list[Machine]] = {}
    for machine in _tables().machines:
        if fits(machine, wanted):
            found.setdefault(machine.cloud, []).append(machine)
    return found


def who_offers(wanted: Accelerator | str, *, besides: str | None = None) -> str:
    """One sentence naming the providers whose catalog has ``wanted`` and a few of their
    machine types, for errors that refuse it elsewhere (``besides``: the cloud refusing)."""
    if isinstance(wanted, str):
        wanted = parse(wanted)
    offers = {c: ms for c, ms in offered_by(wanted).items() if c != besides}
    if not offers:
        elsewhere = " elsewhere" if besides else ""
        return f"No provider's catalog has {wanted}{elsewhere}."
    parts = []
    for cloud, found in offers.items():
        types = list(dict.fromkeys(m.type for m in found))
        more = f" and {len(types) - 3} more" if len(types) > 3 else ""
        parts.append(f"{_tables().providers[cloud]} ({', '.join(types[:3])}{more})")
    return f"{wanted} is offered by {'; '.join(parts)}."


def machine_price(machine: Machine, region: str | None = None) -> float | None:
    """``price`` of this very machine: GCP's N1 machines with attached GPUs share a type
    and differ by their GPUs, so their price is the catalog row's (reference region only)."""
    if machine.attach is None:
        return price(machine.cloud, machine.type, region)
    if region is None or region == _tables().reference_region[machine.cloud]:
        return machine.hourly_list
    return None


def _cost(machine: Machine, region: str | None) -> float:
    known = machine_price(machine, region)
    if known is None:
        known = machine.hourly
    return known if known is not None else float("inf")


def matching(
    cloud: Cloud,
    accelerator: str | None,
    *,
    vcpus: float | None = None,
    memory_gb: float | None = None,
    region: str | None = None,
) -> list[Machine]:
    """Every machine of ``cloud`` that satisfies the request, cheapest first (in
    ``region``'s prices, else the reference region's); ``ValueError`` naming the largest
    there is when none does."""
    _, named = _named(cloud, accelerator)
    fitting = [m for m in named if m.satisfies(vcpus, memory_gb)]
    if not fitting:
        kind = f"{accelerator} machine" if accelerator else "CPU machine"
        asked = " and ".join(
            part
            for part in (
                f"{vcpus:g} vCPUs" if vcpus is not None else "",
                f"{memory_gb:g} GB of memory" if memory_gb is not None else "",
            )
            if part
        )
        largest = max(named, key=lambda m: (m.vcpus, m.ram_gb))
        raise ValueError(
            f"{cloud} has no {kind} with {asked} in the catalog; the largest is "
            f"{largest.type} ({largest.vcpus} vCPUs, {largest.ram_gb:g} GB). Ask for "
            f"fewer, or pass the instance type yourself"
        )
    order = {m.type: i for i, m in enumerate(named)}
    return sorted(fitting, key=lambda m: (_cost(m, region), order[m.type]))


def choose(
    cloud: Cloud,
    accelerator: str | None,
    *,
    vcpus: float | None = None,
    memory_gb: float | None = None,
    region: str | None = None,
) -> Machine:
    """The machine ``cloud`` gives for the request; ``ValueError`` listing what it has.

    With no ``vcpus``/``memory_gb``, the catalog's default for the name (the smallest of
    its kind); with them, the cheapest machine of that kind that has them."""
    if vcpus is None and memory_gb is None:
        return _named(cloud, accelerator)[1][0]
    return matching(cloud, accelerator, vcpus=vcpus, memory_gb=memory_gb, region=region)[0]


def alternatives(
    first: Machine,
    accelerator: str | None,
    *,
    vcpus: float | None = None,
    memory_gb: float | None = None,
    region: str | None = None,
) -> list[Machine]:
    """Machines a capacity failover may move to after ``first``: the same accelerator and
    count, at least as much accelerator memory, vCPUs and RAM, still within the request
    (``"A100:8"`` moves from 40 GB to 80 GB; ``"A100-40GB:8"`` does not); cheapest first.
    None for CPU machines: their sizes share one pool of capacity."""
    if first.accelerator is None or accelerator is None:
        return []
    _, named = _named(first.cloud, accelerator)
    found = [
        m
        for m in named
        if m.type != first.type
        and m.count == first.count
        and m.memory_gb >= first.memory_gb
        and m.vcpus >= first.vcpus
        and m.ram_gb >= first.ram_gb
        and m.satisfies(vcpus, memory_gb)
    ]
    return sorted(found, key=lambda m: (_cost(m, region), m.vcpus))


def refuse_contradiction(
    machine: Machine, *, vcpus: float | None, memory_gb: float | None, given: str
) -> None:
    """``ValueError`` when a machine type the user named has fewer vCPUs or less memory
    than the pool asks for."""
    if vcpus is not None and machine.vcpus < vcpus:
        raise ValueError(
            f"{given}={machine.type!r} has {machine.vcpus} vCPUs, fewer than vcpus={vcpus:g}; "
            f"drop one of them, or name a larger type"
        )
    if memory_gb is not None and machine.ram_gb and machine.ram_gb < memory_gb:
        raise ValueError(
            f"{given}={machine.type!r} has {machine.ram_gb:g} GB of memory, less than "
            f"memory_gb={memory_gb:g}; drop one of them, or name a larger type"
        )


# ── browsing: sky.catalog() and `skyward catalog` ────────────────────────────────────────


@dataclass(frozen=True)
class CatalogEntry:
    """One machine type of one cloud, priced in one region: a row of ``sky.catalog()``.

    ``accelerators`` per machine (0 for CPU machines), ``accelerator_memory_gb`` each;
    ``memory_gb`` the machine's own memory (0: not known). Prices are USD per hour for one
    machine: ``on_demand`` the dated list price (``None`` where the table does not know one),
    ``spot`` the cloud's current price when asked for and the cloud says (AWS), else None.
    """

    cloud: str
    type: str
    accelerator: str | None
    accelerators: int
    accelerator_memory_gb: int
    vcpus: int
    memory_gb: float
    region: str
    on_demand: float | None
    spot: float | None = None

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def cloud_of_region(region: str) -> Cloud | None:
    """Which cloud names a region this way (``us-west-2``, ``europe-west4``, ``westeurope``):
    the first whose price list knows it or whose region names have its shape (each cloud's
    ``region_pattern``); None when none does."""
    tables = _tables()
    for cloud in CLOUDS:
        known = any(region in regions for regions in tables.on_demand[cloud].values())
        if known or tables.region_patterns[cloud].fullmatch(region):
            return cloud
    return None


def catalog(
    accelerator: str | None = None,
    *,
    cloud: str | None = None,
    region: str | None = None,
    spot: bool = False,
    spot_prices: Mapping[str, SpotPrices] | None = None,
) -> list[CatalogEntry]:
    """What each cloud offers for ``accelerator``, with GPUs, memory and price per hour.

    ``accelerator``: a name as a pool takes it (``"A100"``, ``"A100-80GB:8"``), ``"cpu"``
    for machines without one, or None for everything. ``cloud``: one of ``CLOUDS``
    (default: every cloud, or the one ``region`` belongs to). ``region``: whose prices to
    show (default: each cloud's reference region, where its prices are lowest); where a
    cloud's price list names every region that sells a type (AWS's), types it says the
    region does not sell are left out. ``spot``: ask each cloud in ``spot_prices`` (cloud ->
    its lookup; by default the registry's, ``registry.spot_lookups``: a network call, with
    that cloud's extra and credentials) for its current spot prices, the lowest of the
    region's zones; the other clouds' rows keep ``spot=None``. Cheapest first within each
    accelerator. Reads no network otherwise. ``ValueError`` for an unknown accelerator,
    cloud or region."""
    if spot and spot_prices is None:
        spot_prices = spot_lookups()
    tables = _tables()
    clouds = _clouds_for(cloud, region)
    entries: list[CatalogEntry] = []
    for each in clouds:
        where = region or tables.reference_region[each]
        for machine in _browse(each, accelerator):
            table = tables.on_demand[each].get(machine.type)
            if each in tables.regions_complete and table is not None and where not in table:
                continue  # not sold there, per the cloud's price list
            entries.append(
                CatalogEntry(
                    cloud=each,
                    type=machine.type,
                    accelerator=machine.accelerator,
                    accelerators=machine.count,
                    accelerator_memory_gb=machine.memory_gb,
                    vcpus=machine.vcpus,
                    memory_gb=machine.ram_gb,
                    region=where,
                    on_demand=machine_price(machine, where),
                )
            )
    if spot and spot_prices:
        entries = _with_spot(entries, spot_prices)
    order = {name: i for i, name in enumerate((None, *tables.names))}
    return sorted(
        entries,
        key=lambda e: (
            CLOUDS.index(e.cloud),
            order[e.accelerator],
            e.accelerators,
            e.on_demand is None,
            e.on_demand or 0.0,
            e.vcpus,
        ),
    )


def _clouds_for(cloud: str | None, region: str | None) -> list[Cloud]:
    if cloud is not None:
        if cloud not in CLOUDS:
            raise ValueError(f"unknown cloud {cloud!r}; the catalog has {', '.join(CLOUDS)}")
        return [cloud]
    if region is None:
        return list(CLOUDS)
    owner = cloud_of_region(region)
    if owner is None:
        tables = _tables()
        examples = ", ".join(
            f"{tables.providers[c].removeprefix('sky.')}: {tables.region_examples[c]!r}"
            for c in CLOUDS
        )
        raise ValueError(
            f"{region!r} is no region of {', '.join(CLOUDS)} ({examples}); name the cloud too"
        )
    return [owner]


def _browse(cloud: Cloud, accelerator: str | None) -> list[Machine]:
    """The machines of ``cloud`` for ``accelerator`` (None: all; "cpu": CPU machines),
    each type once (GCP's N1 rows differ by their GPUs, and stay)."""
    if accelerator is None:
        return machines(cloud)
    if accelerator.strip().lower() == "cpu":
        return [m for m in machines(cloud) if m.accelerator is None]
    wanted = parse(accelerator)
    return [m for m in machines(cloud) if fits(m, wanted)]


def _with_spot(
    entries: list[CatalogEntry], spot_prices: Mapping[str, SpotPrices]
) -> list[CatalogEntry]:
    """The rows of each cloud in ``spot_prices`` with its current spot price (the lowest of
    the region's zones), asked once per region. A cloud that could not be asked keeps
    ``spot=None`` on its rows; when none could, ``ProvisionError`` naming each one and why
    (spot prices were asked for, and there are none to show)."""
    lowest: dict[tuple[str, str, str], float] = {}
    missing: list[str] = []
    asked = 0
    for cloud, ask in spot_prices.items():
        for region in sorted({e.region for e in entries if e.cloud == cloud}):
            types = sorted({e.type for e in entries if e.cloud == cloud and e.region == region})
            asked += 1
            try:
                answer = ask(region, types)
            except SkywardError as exc:
                missing.append(f"{cloud} {region}: {exc}")
                continue
            for (kind, _zone), price in answer.items():
                key = (cloud, region, kind)
                lowest[key] = min(price, lowest.get(key, price))
    if asked and len(missing) == asked:
        raise ProvisionError(f"no spot prices could be had: {'; '.join(missing)}")
    for line in missing:
        _log.warning("spot prices missing for %s", line)
    return [replace(e, spot=lowest.get((e.cloud, e.region, e.type))) for e in entries]
