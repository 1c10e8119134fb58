"""Which machine each cloud gives for a request: the catalog AWS, GCP and Azure share.

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
failover may move to (same accelerator and count, at least as large). Facts come from each
cloud's public instance-type pages (and agree with EC2's ``describe_instance_types``, which
a test checks); prices are the on-demand list prices in ``prices.py`` (dated), per region:
``price(cloud, type, region)``, ``None`` where the table does not know one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from skyward.providers.cloud.prices import ON_DEMAND

Cloud = Literal["aws", "gcp", "azure"]

# Where a cloud's prices are read when no region is given (the cheapest, usually).
REFERENCE_REGION: dict[str, str] = {"aws": "us-east-1", "gcp": "us-central1", "azure": "eastus"}

_NAME = re.compile(r"^(?P<name>[A-Za-z0-9]+?)(?:-(?P<memory>\d+)GB)?(?::(?P<count>\d+))?$", re.I)
# Names outside the catalog (sky.accelerators.Custom): what a Slurm gres or an SSH host's
# label can be.
_FREE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
# How the clouds are spelled to users.
PROVIDERS: dict[str, str] = {"aws": "sky.AWS", "gcp": "sky.GCP", "azure": "sky.Azure"}


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
    hourly_list: float | None = None  # for clouds whose prices are not in prices.py
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


def _m(
    cloud: Cloud,
    type: str,
    accelerator: str | None,
    count: int,
    memory_gb: int,
    vcpus: int,
    hourly: float | None = None,
    attach: str | None = None,
    *,
    ram: float = 0.0,
) -> Machine:
    return Machine(cloud, type, accelerator, count, memory_gb, vcpus, hourly, attach, ram)


def _m7i(size: str, vcpus: int) -> Machine:
    return _m("aws", f"m7i.{size}", None, 0, 0, vcpus, ram=vcpus * 4)


def _n2(vcpus: str) -> Machine:
    return _m("gcp", f"n2-standard-{vcpus}", None, 0, 0, int(vcpus), ram=4 * int(vcpus))


def _n1(vcpus: str, gpu: str, count: int, memory: int, gpu_hourly: float) -> Machine:
    """An N1 machine with ``count`` attached GPUs (3.75 GB of RAM and $0.0475/h per vCPU)."""
    n, attach = int(vcpus), f"nvidia-tesla-{gpu.lower()}"
    hourly = round(n * 0.0474998 + count * gpu_hourly, 6)
    return _m("gcp", f"n1-standard-{vcpus}", gpu, count, memory, n, hourly, attach, ram=3.75 * n)


# Per cloud, per accelerator: the default machine for a bare name first (``choose`` with
# no vcpus/memory_gb takes the first that fits the name), then larger sizes of the same
# family, which a request for more vCPUs or memory, "cheapest", or a capacity failover
# may take. RAM is GiB as EC2 reports it.
MACHINES: tuple[Machine, ...] = (
    # ── AWS (EC2; general purpose m7i for CPU pools, accelerated computing for GPUs) ───
    _m7i("xlarge", 4),
    _m7i("large", 2),
    _m7i("2xlarge", 8),
    _m7i("4xlarge", 16),
    _m7i("8xlarge", 32),
    _m7i("12xlarge", 48),
    _m7i("16xlarge", 64),
    _m7i("24xlarge", 96),
    _m7i("48xlarge", 192),
    _m("aws", "p4d.24xlarge", "A100", 8, 40, 96, ram=1152),
    _m("aws", "p4de.24xlarge", "A100", 8, 80, 96, ram=1152),
    _m("aws", "p5.4xlarge", "H100", 1, 80, 16, ram=256),
    _m("aws", "p5.48xlarge", "H100", 8, 80, 192, ram=2048),
    _m("aws", "p5en.48xlarge", "H200", 8, 141, 192, ram=2048),
    _m("aws", "g6.xlarge", "L4", 1, 24, 4, ram=16),
    _m("aws", "g6.2xlarge", "L4", 1, 24, 8, ram=32),
    _m("aws", "g6.4xlarge", "L4", 1, 24, 16, ram=64),
    _m("aws", "g6.8xlarge", "L4", 1, 24, 32, ram=128),
    _m("aws", "g6.16xlarge", "L4", 1, 24, 64, ram=256),
    _m("aws", "g6.12xlarge", "L4", 4, 24, 48, ram=192),
    _m("aws", "g6.24xlarge", "L4", 4, 24, 96, ram=384),
    _m("aws", "g6.48xlarge", "L4", 8, 24, 192, ram=768),
    _m("aws", "g4dn.xlarge", "T4", 1, 16, 4, ram=16),
    _m("aws", "g4dn.2xlarge", "T4", 1, 16, 8, ram=32),
    _m("aws", "g4dn.4xlarge", "T4", 1, 16, 16, ram=64),
    _m("aws", "g4dn.8xlarge", "T4", 1, 16, 32, ram=128),
    _m("aws", "g4dn.16xlarge", "T4", 1, 16, 64, ram=256),
    _m("aws", "g4dn.12xlarge", "T4", 4, 16, 48, ram=192),
    _m("aws", "g4dn.metal", "T4", 8, 16, 96, ram=384),
    _m("aws", "g5.xlarge", "A10G", 1, 24, 4, ram=16),
    _m("aws", "g5.2xlarge", "A10G", 1, 24, 8, ram=32),
    _m("aws", "g5.4xlarge", "A10G", 1, 24, 16, ram=64),
    _m("aws", "g5.8xlarge", "A10G", 1, 24, 32, ram=128),
    _m("aws", "g5.16xlarge", "A10G", 1, 24, 64, ram=256),
    _m("aws", "g5.12xlarge", "A10G", 4, 24, 48, ram=192),
    _m("aws", "g5.24xlarge", "A10G", 4, 24, 96, ram=384),
    _m("aws", "g5.48xlarge", "A10G", 8, 24, 192, ram=768),
    _m("aws", "g6e.xlarge", "L40S", 1, 48, 4, ram=32),
    _m("aws", "g6e.2xlarge", "L40S", 1, 48, 8, ram=64),
    _m("aws", "g6e.4xlarge", "L40S", 1, 48, 16, ram=128),
    _m("aws", "g6e.8xlarge", "L40S", 1, 48, 32, ram=256),
    _m("aws", "g6e.16xlarge", "L40S", 1, 48, 64, ram=512),
    _m("aws", "g6e.12xlarge", "L40S", 4, 48, 48, ram=384),
    _m("aws", "g6e.24xlarge", "L40S", 4, 48, 96, ram=768),
    _m("aws", "g6e.48xlarge", "L40S", 8, 48, 192, ram=1536),
    _m("aws", "p3.2xlarge", "V100", 1, 16, 8, ram=61),
    _m("aws", "p3.8xlarge", "V100", 4, 16, 32, ram=244),
    _m("aws", "p3.16xlarge", "V100", 8, 16, 64, ram=488),
    _m("aws", "p3dn.24xlarge", "V100", 8, 32, 96, ram=768),
    # ── GCP (Compute Engine; N2 for CPU pools, N1 with attached GPUs) ────────────────
    # Prices: the table in prices.py, per region. N1 rows are priced here, in us-central1
    # (the reference region; elsewhere unknown), from cloud.google.com/compute/gpus-pricing,
    # late 2025: the machine's price and the attached GPUs'.
    _n2("4"),
    _n2("2"),
    _n2("8"),
    _n2("16"),
    _n2("32"),
    _n2("48"),
    _n2("64"),
    _n2("96"),
    _n2("128"),
    _m("gcp", "a2-highgpu-1g", "A100", 1, 40, 12, ram=85),
    _m("gcp", "a2-highgpu-2g", "A100", 2, 40, 24, ram=170),
    _m("gcp", "a2-highgpu-4g", "A100", 4, 40, 48, ram=340),
    _m("gcp", "a2-highgpu-8g", "A100", 8, 40, 96, ram=680),
    _m("gcp", "a2-megagpu-16g", "A100", 16, 40, 96, ram=1360),
    _m("gcp", "a2-ultragpu-1g", "A100", 1, 80, 12, ram=170),
    _m("gcp", "a2-ultragpu-2g", "A100", 2, 80, 24, ram=340),
    _m("gcp", "a2-ultragpu-4g", "A100", 4, 80, 48, ram=680),
    _m("gcp", "a2-ultragpu-8g", "A100", 8, 80, 96, ram=1360),
    # A3 High with 1, 2 or 4 GPUs is sold as Spot (or flex-start) only: a bare "H100" is
    # the 8-GPU machine, which on-demand pools can get.
    _m("gcp", "a3-highgpu-8g", "H100", 8, 80, 208, ram=1872),
    _m("gcp", "a3-highgpu-1g", "H100", 1, 80, 26, ram=234),
    _m("gcp", "a3-highgpu-2g", "H100", 2, 80, 52, ram=468),
    _m("gcp", "a3-highgpu-4g", "H100", 4, 80, 104, ram=936),
    _m("gcp", "a3-megagpu-8g", "H100", 8, 80, 208, ram=1872),
    _m("gcp", "a3-ultragpu-8g", "H200", 8, 141, 224, ram=2952),
    _m("gcp", "g2-standard-4", "L4", 1, 24, 4, ram=16),
    _m("gcp", "g2-standard-8", "L4", 1, 24, 8, ram=32),
    _m("gcp", "g2-standard-12", "L4", 1, 24, 12, ram=48),
    _m("gcp", "g2-standard-16", "L4", 1, 24, 16, ram=64),
    _m("gcp", "g2-standard-32", "L4", 1, 24, 32, ram=128),
    _m("gcp", "g2-standard-24", "L4", 2, 24, 24, ram=96),
    _m("gcp", "g2-standard-48", "L4", 4, 24, 48, ram=192),
    _m("gcp", "g2-standard-96", "L4", 8, 24, 96, ram=384),
    _n1("4", "T4", 1, 16, 0.35),
    _n1("8", "T4", 2, 16, 0.35),
    _n1("16", "T4", 4, 16, 0.35),
    _n1("8", "V100", 1, 16, 2.48),
    _n1("16", "V100", 2, 16, 2.48),
    _n1("32", "V100", 4, 16, 2.48),
    _n1("64", "V100", 8, 16, 2.48),
    _n1("4", "P100", 1, 16, 1.46),
    _n1("8", "P100", 2, 16, 1.46),
    _n1("16", "P100", 4, 16, 1.46),
    # ── Azure (N-series VM sizes; NCv3 V100 sizes were retired in 2025; eastus prices) ─
    _m("azure", "Standard_D4s_v5", None, 0, 0, 4, 0.192, ram=16),
    _m("azure", "Standard_D8s_v5", None, 0, 0, 8, 0.384, ram=32),
    _m("azure", "Standard_D16s_v5", None, 0, 0, 16, 0.768, ram=64),
    _m("azure", "Standard_D32s_v5", None, 0, 0, 32, 1.536, ram=128),
    _m("azure", "Standard_D64s_v5", None, 0, 0, 64, 3.072, ram=256),
    _m("azure", "Standard_D96s_v5", None, 0, 0, 96, 4.608, ram=384),
    _m("azure", "Standard_NC24ads_A100_v4", "A100", 1, 80, 24, 3.673, ram=220),
    _m("azure", "Standard_NC48ads_A100_v4", "A100", 2, 80, 48, 7.346, ram=440),
    _m("azure", "Standard_NC96ads_A100_v4", "A100", 4, 80, 96, 14.692, ram=880),
    _m("azure", "Standard_ND96asr_v4", "A100", 8, 40, 96, 27.197, ram=900),
    _m("azure", "Standard_ND96amsr_A100_v4", "A100", 8, 80, 96, 32.77, ram=1900),
    _m("azure", "Standard_NC40ads_H100_v5", "H100", 1, 94, 40, 6.98, ram=320),
    _m("azure", "Standard_NC80adis_H100_v5", "H100", 2, 94, 80, 13.96, ram=640),
    _m("azure", "Standard_ND96isr_H100_v5", "H100", 8, 80, 96, 98.32, ram=1900),
    _m("azure", "Standard_ND96isr_H200_v5", "H200", 8, 141, 96, ram=1850),
    _m("azure", "Standard_NC4as_T4_v3", "T4", 1, 16, 4, 0.526, ram=28),
    _m("azure", "Standard_NC8as_T4_v3", "T4", 1, 16, 8, 0.752, ram=56),
    _m("azure", "Standard_NC16as_T4_v3", "T4", 1, 16, 16, 1.204, ram=110),
    _m("azure", "Standard_NC64as_T4_v3", "T4", 4, 16, 64, 4.352, ram=440),
)

# Every accelerator name any cloud has, canonical spelling.
NAMES: tuple[str, ...] = tuple(
    dict.fromkeys(m.accelerator for m in MACHINES if m.accelerator is not None)
)


def parse(text: str) -> Accelerator:
    """``"a100-80gb:8"`` -> ``Accelerator("A100", 8, 80)``; ``ValueError`` for a name no
    cloud has, listing those that exist."""
    match = _NAME.match(text.strip())
    canonical = {n.upper(): n for n in NAMES}
    if match is None or match["name"].upper() not in canonical:
        raise ValueError(
            f"unknown accelerator {text!r}; the clouds' catalog knows {', '.join(NAMES)} "
            f"(optionally with memory and count, for example 'A100-80GB:8'), or None for CPU "
            f"machines. A name outside it (sky.accelerators.Custom) suits sky.SSH and "
            f"sky.Slurm, which take the machines' own names"
        )
    count = int(match["count"]) if match["count"] else None
    if count == 0:
        raise ValueError(f"{text!r}: the count after ':' must be at least 1")
    memory = int(match["memory"]) if match["memory"] else None
    return Accelerator(canonical[match["name"].upper()], count, memory)


def machines(cloud: Cloud) -> list[Machine]:
    return [m for m in MACHINES if m.cloud == cloud]


def find(cloud: Cloud, machine_type: str) -> Machine | None:
    """The catalog's entry for ``machine_type`` (the first, for GCP's N1 with GPUs)."""
    return next((m for m in machines(cloud) if m.type == machine_type), None)


def price(cloud: Cloud, machine_type: str, region: str | None = None) -> float | None:
    """The on-demand list price per hour of ``machine_type`` in ``region`` (default: the
    cloud's reference region), when the table has it."""
    table = ON_DEMAND.get(cloud, {}).get(machine_type)
    if table is not None:
        return table.get(region or REFERENCE_REGION[cloud])
    if region is None or region == REFERENCE_REGION[cloud]:
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
    for machine in MACHINES:
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
        parts.append(f"{PROVIDERS[cloud]} ({', '.join(types[:3])}{more})")
    return f"{wanted} is offered by {'; '.join(parts)}."


def machine_price(machine: Machine, region: str | None = None) -> float | None:
    """``price`` of this very machine: GCP's N1 machines with attached GPUs share a type
    and differ by their GPUs, so their price is the catalog row's (reference region only)."""
    if machine.attach is None:
        return price(machine.cloud, machine.type, region)
    if region is None or region == REFERENCE_REGION[machine.cloud]:
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

CLOUDS: tuple[Cloud, ...] = ("aws", "gcp", "azure")


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
    """Which cloud names a region this way: AWS ``us-west-2`` (one its price list knows, or
    its shape), GCP ``europe-west4``, Azure ``westeurope``; None when none does."""
    aws = {r for table in ON_DEMAND.get("aws", {}).values() for r in table}
    if region in aws or re.fullmatch(r"[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d", region):
        return "aws"
    if re.fullmatch(r"[a-z]+-[a-z]+\d+", region):
        return "gcp"
    if re.fullmatch(r"[a-z]+\d*", region):
        return "azure"
    return None


def catalog(
    accelerator: str | None = None,
    *,
    cloud: str | None = None,
    region: str | None = None,
    spot: bool = False,
) -> list[CatalogEntry]:
    """What each cloud offers for ``accelerator``, with GPUs, memory and price per hour.

    ``accelerator``: a name as a pool takes it (``"A100"``, ``"A100-80GB:8"``), ``"cpu"``
    for machines without one, or None for everything. ``cloud``: ``"aws"``, ``"gcp"`` or
    ``"azure"`` (default: every cloud, or the one ``region`` belongs to). ``region``: whose
    prices to show (default: each cloud's reference region, where its prices are lowest);
    on AWS, types its price list says the region does not sell are left out. ``spot``: ask
    the cloud for its current spot prices (AWS only, with the ``aws`` extra and credentials;
    a network call). Cheapest first within each accelerator. Reads no network otherwise.
    ``ValueError`` for an unknown accelerator, cloud or region."""
    clouds = _clouds_for(cloud, region)
    entries: list[CatalogEntry] = []
    for each in clouds:
        where = region or REFERENCE_REGION[each]
        for machine in _browse(each, accelerator):
            table = ON_DEMAND.get(each, {}).get(machine.type)
            if each == "aws" and table is not None and where not in table:
                continue  # not sold there, per AWS's price list (GCP's lists fewer regions)
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
    if spot:
        entries = _with_spot(entries)
    order = {name: i for i, name in enumerate((None, *NAMES))}
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
        raise ValueError(
            f"{region!r} is no region of {', '.join(CLOUDS)} (AWS: 'us-west-2', GCP: "
            f"'europe-west4', Azure: 'westeurope'); name the cloud too"
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


def _with_spot(entries: list[CatalogEntry]) -> list[CatalogEntry]:
    """AWS rows with EC2's current spot price (the lowest of the region's zones)."""
    from dataclasses import replace

    from skyward.providers.aws.api import Api

    regions = sorted({e.region for e in entries if e.cloud == "aws"})
    lowest: dict[tuple[str, str], float] = {}
    for region in regions:
        api = Api.connect(region=region, profile=None, endpoint_url=None)
        types = sorted({e.type for e in entries if e.cloud == "aws" and e.region == region})
        for (kind, _zone), price in api.spot_prices(types).items():
            key = (region, kind)
            lowest[key] = min(price, lowest.get(key, price))
    return [
        replace(e, spot=lowest.get((e.region, e.type))) if e.cloud == "aws" else e for e in entries
    ]
