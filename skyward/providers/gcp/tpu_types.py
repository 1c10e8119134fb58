"""Cloud TPU accelerator types: what ``"v4-16"`` or ``"v5litepod-8"`` is, where Google sells
it, and its price; read from ``tpus.json`` (no SDK, no network), by ``sky.GCP``, the jax
plugin, ``sky.accelerators`` and ``skyward catalog tpu``.

::

    "v4-16"          generation v4, 16 TensorCores = 8 chips, 2 hosts of 4 chips
    "v5litepod-8"    generation v5e, 8 chips on 1 host (v5e and v6e name chips, not cores)
    "v5litepod-16"   4 hosts of 4 chips

A type is one slice: the unit Google creates, preempts and deletes. Each of its hosts (TPU
VMs) is one node of the pool; ``nodes`` is a multiple of the hosts (several slices:
multislice). An unknown type, or a zone that does not sell it, is a ``ValueError`` listing
what exists.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources

from skyward.providers.cloud.catalog import Machine

_TYPE = re.compile(r"^(?P<prefix>[a-z0-9]+?)-(?P<size>\d+)$")


@dataclass(frozen=True)
class Generation:
    """One TPU generation, as ``tpus.json`` describes it."""

    name: str  # "v5e"
    prefix: str  # how its types start: "v5litepod"
    counts: str  # "cores" or "chips": what the number in a type counts
    cores_per_chip: int
    chips_per_host: int
    single_host_chips: int
    memory_gb: int  # HBM per chip
    vcpus_per_host: int
    ram_gb_per_host: int
    sizes: tuple[int, ...]
    zones: dict[str, tuple[str, ...]]  # type or "*" -> zones
    runtime: str
    on_demand: float  # USD per chip-hour
    spot: float


@dataclass(frozen=True)
class TpuType:
    """One accelerator type: a slice of ``chips`` chips on ``hosts`` hosts."""

    name: str  # "v4-16"
    generation: Generation
    chips: int
    hosts: int

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    @property
    def zones(self) -> tuple[str, ...]:
        zones = self.generation.zones
        return zones.get(self.name) or zones.get("*", ())

    @property
    def runtime(self) -> str:
        return self.generation.runtime

    def hourly(self, spot: bool = False) -> float:
        """USD per hour for the whole slice."""
        chip = self.generation.spot if spot else self.generation.on_demand
        return chip * self.chips

    def host_hourly(self, spot: bool = False) -> float:
        """USD per hour for one host (one node) of the slice."""
        return self.hourly(spot) / self.hosts

    def machine(self) -> Machine:
        """One host of this slice as the clouds' catalog describes a machine."""
        generation = self.generation
        return Machine(
            cloud="gcp",
            type=self.name,
            accelerator=self.name,
            count=self.chips_per_host,
            memory_gb=generation.memory_gb,
            vcpus=generation.vcpus_per_host,
            hourly_list=self.host_hourly(),
            ram_gb=float(generation.ram_gb_per_host),
        )

    def describe(self) -> str:
        hosts = f"{self.hosts} hosts of {self.chips_per_host}" if self.hosts > 1 else "1 host"
        return f"{self.name} ({self.chips} TPU {self.generation.name} chips, {hosts})"

    def check_zone(self, zone: str) -> None:
        if zone not in self.zones:
            raise ValueError(
                f"Google sells {self.name} in {', '.join(self.zones)}, not in {zone}; pass "
                f"sky.GCP(zone='{self.zones[0]}')"
            )


@functools.cache
def generations() -> tuple[Generation, ...]:
    file = resources.files("skyward.providers") / "gcp" / "tpus.json"
    data = json.loads(file.read_text(encoding="utf-8"))
    found = []
    for row in data["generations"]:
        zones = {k: tuple(v) for k, v in row.pop("zones").items()}
        sizes = tuple(row.pop("sizes"))
        found.append(Generation(**row, sizes=sizes, zones=zones))
    return tuple(found)


def as_of() -> str:
    file = resources.files("skyward.providers") / "gcp" / "tpus.json"
    return str(json.loads(file.read_text(encoding="utf-8"))["as_of"])


def _of(generation: Generation, size: int) -> TpuType:
    chips = size // generation.cores_per_chip if generation.counts == "cores" else size
    single = chips <= generation.single_host_chips
    hosts = 1 if single else chips // generation.chips_per_host
    return TpuType(f"{generation.prefix}-{size}", generation, chips, hosts)


def every() -> list[TpuType]:
    """Every type Google sells, by generation, smallest first."""
    return [_of(g, size) for g in generations() for size in g.sizes]


def looks_like_tpu(name: str | None) -> bool:
    """Whether an accelerator name is spelled as a TPU type (``v4-16``, ``v5litepod-8``)."""
    if name is None:
        return False
    match = _TYPE.match(name.strip().lower())
    return match is not None and any(g.prefix == match["prefix"] for g in generations())


def find(name: str | None) -> TpuType | None:
    """The type ``name`` names, or ``None`` when it is no TPU type."""
    if name is None:
        return None
    wanted = name.strip().lower()
    return next((t for t in every() if t.name == wanted), None)


def parse(name: str) -> TpuType:
    """The type ``name`` names; ``ValueError`` listing the sizes of its generation (or every
    generation, for a name that is none of them)."""
    found = find(name)
    if found is not None:
        return found
    match = _TYPE.match(name.strip().lower())
    generation = next(
        (g for g in generations() if match is not None and g.prefix == match["prefix"]), None
    )
    if generation is not None:
        sizes = ", ".join(f"{generation.prefix}-{s}" for s in generation.sizes)
        raise ValueError(f"Google sells no TPU type {name!r}; {generation.name} comes as {sizes}")
    kinds = ", ".join(f"{g.prefix}-N ({g.name})" for g in generations())
    raise ValueError(f"{name!r} is no Cloud TPU type; the types are {kinds}, such as 'v4-16'")
