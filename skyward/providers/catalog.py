"""Which machine each cloud gives for an accelerator name: the catalog AWS, GCP and Azure share.

::

    "A100"          the smallest machine with A100s on that cloud (on AWS: 8 of them)
    "A100:8"        a machine with exactly 8 A100s, either memory size
    "A100-80GB:8"   exactly 8 A100s with 80 GB each
    None            a CPU machine

``parse`` reads a name without knowing the cloud (the pool checks it when it is built);
``choose(cloud, name)`` picks the machine, or raises ``ValueError`` listing what that cloud
has. Facts come from each cloud's public instance-type pages; prices are on-demand Linux list
prices per hour in USD in one region (us-east-1 for AWS), an estimate for ``skyward ls``
that can drift from the bill: ``None`` where we do not know one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Cloud = Literal["aws", "gcp", "azure"]

_NAME = re.compile(r"^(?P<name>[A-Za-z0-9]+?)(?:-(?P<memory>\d+)GB)?(?::(?P<count>\d+))?$", re.I)


@dataclass(frozen=True)
class Accelerator:
    """A parsed accelerator request: ``name`` canonical (``"A100"``), ``count`` and
    ``memory_gb`` when the request pins them."""

    name: str
    count: int | None = None
    memory_gb: int | None = None

    def __str__(self) -> str:
        memory = f"-{self.memory_gb}GB" if self.memory_gb else ""
        count = f":{self.count}" if self.count else ""
        return f"{self.name}{memory}{count}"


@dataclass(frozen=True)
class Machine:
    """One machine type of one cloud.

    ``attach`` is, on GCP, the accelerator type attached to a general-purpose machine (N1
    with T4 or V100); machine types with built-in GPUs leave it ``None``.
    """

    cloud: Cloud
    type: str
    accelerator: str | None
    count: int  # accelerators per machine (0 for CPU)
    memory_gb: int  # per accelerator, as the vendor names it (0 for CPU)
    vcpus: int
    hourly: float | None = None
    attach: str | None = None

    def describe(self) -> str:
        if self.accelerator is None:
            return f"{self.type} ({self.vcpus} vCPUs, no accelerator)"
        return f"{self.type} ({self.count}x {self.accelerator} {self.memory_gb} GB)"


def _m(
    cloud: Cloud,
    type: str,
    accelerator: str | None,
    count: int,
    memory_gb: int,
    vcpus: int,
    hourly: float | None = None,
    attach: str | None = None,
) -> Machine:
    return Machine(cloud, type, accelerator, count, memory_gb, vcpus, hourly, attach)


# Per cloud, per accelerator, smallest first: ``choose`` takes the first that fits. One
# machine per (count, memory); where a family has several sizes with the same GPUs, the one
# with the fewest vCPUs (the cheapest).
MACHINES: tuple[Machine, ...] = (
    # ── AWS (EC2 accelerated computing instances) ──────────────────────────────────────
    _m("aws", "m7i.xlarge", None, 0, 0, 4, 0.2016),
    _m("aws", "p4d.24xlarge", "A100", 8, 40, 96, 21.96),
    _m("aws", "p4de.24xlarge", "A100", 8, 80, 96, 27.45),
    _m("aws", "p5.4xlarge", "H100", 1, 80, 16, 6.88),
    _m("aws", "p5.48xlarge", "H100", 8, 80, 192, 55.04),
    _m("aws", "p5en.48xlarge", "H200", 8, 141, 192, 63.30),
    _m("aws", "g6.xlarge", "L4", 1, 24, 4, 0.8048),
    _m("aws", "g6.12xlarge", "L4", 4, 24, 48, 4.6016),
    _m("aws", "g6.48xlarge", "L4", 8, 24, 192, 13.3504),
    _m("aws", "g4dn.xlarge", "T4", 1, 16, 4, 0.526),
    _m("aws", "g4dn.12xlarge", "T4", 4, 16, 48, 3.912),
    _m("aws", "g4dn.metal", "T4", 8, 16, 96, 7.824),
    _m("aws", "g5.xlarge", "A10G", 1, 24, 4, 1.006),
    _m("aws", "g5.12xlarge", "A10G", 4, 24, 48, 5.672),
    _m("aws", "g5.48xlarge", "A10G", 8, 24, 192, 16.288),
    _m("aws", "g6e.xlarge", "L40S", 1, 48, 4, 1.861),
    _m("aws", "g6e.12xlarge", "L40S", 4, 48, 48, 10.493),
    _m("aws", "g6e.48xlarge", "L40S", 8, 48, 192, 30.131),
    _m("aws", "p3.2xlarge", "V100", 1, 16, 8, 3.06),
    _m("aws", "p3.8xlarge", "V100", 4, 16, 32, 12.24),
    _m("aws", "p3.16xlarge", "V100", 8, 16, 64, 24.48),
    _m("aws", "p3dn.24xlarge", "V100", 8, 32, 96, 31.212),
    # ── GCP (Compute Engine GPU machine types; N1 with attached GPUs) ──────────────────
    _m("gcp", "n2-standard-4", None, 0, 0, 4),
    _m("gcp", "a2-highgpu-1g", "A100", 1, 40, 12),
    _m("gcp", "a2-highgpu-2g", "A100", 2, 40, 24),
    _m("gcp", "a2-highgpu-4g", "A100", 4, 40, 48),
    _m("gcp", "a2-highgpu-8g", "A100", 8, 40, 96),
    _m("gcp", "a2-megagpu-16g", "A100", 16, 40, 96),
    _m("gcp", "a2-ultragpu-1g", "A100", 1, 80, 12),
    _m("gcp", "a2-ultragpu-2g", "A100", 2, 80, 24),
    _m("gcp", "a2-ultragpu-4g", "A100", 4, 80, 48),
    _m("gcp", "a2-ultragpu-8g", "A100", 8, 80, 96),
    _m("gcp", "a3-highgpu-1g", "H100", 1, 80, 26),
    _m("gcp", "a3-highgpu-2g", "H100", 2, 80, 52),
    _m("gcp", "a3-highgpu-4g", "H100", 4, 80, 104),
    _m("gcp", "a3-highgpu-8g", "H100", 8, 80, 208),
    _m("gcp", "a3-ultragpu-8g", "H200", 8, 141, 224),
    _m("gcp", "g2-standard-4", "L4", 1, 24, 4),
    _m("gcp", "g2-standard-24", "L4", 2, 24, 24),
    _m("gcp", "g2-standard-48", "L4", 4, 24, 48),
    _m("gcp", "g2-standard-96", "L4", 8, 24, 96),
    _m("gcp", "n1-standard-4", "T4", 1, 16, 4, attach="nvidia-tesla-t4"),
    _m("gcp", "n1-standard-8", "T4", 2, 16, 8, attach="nvidia-tesla-t4"),
    _m("gcp", "n1-standard-16", "T4", 4, 16, 16, attach="nvidia-tesla-t4"),
    _m("gcp", "n1-standard-8", "V100", 1, 16, 8, attach="nvidia-tesla-v100"),
    _m("gcp", "n1-standard-16", "V100", 2, 16, 16, attach="nvidia-tesla-v100"),
    _m("gcp", "n1-standard-32", "V100", 4, 16, 32, attach="nvidia-tesla-v100"),
    _m("gcp", "n1-standard-64", "V100", 8, 16, 64, attach="nvidia-tesla-v100"),
    # ── Azure (N-series VM sizes; NCv3 V100 sizes were retired in 2025; eastus prices) ─
    _m("azure", "Standard_D4s_v5", None, 0, 0, 4, 0.192),
    _m("azure", "Standard_D8s_v5", None, 0, 0, 8, 0.384),
    _m("azure", "Standard_D16s_v5", None, 0, 0, 16, 0.768),
    _m("azure", "Standard_D32s_v5", None, 0, 0, 32, 1.536),
    _m("azure", "Standard_D64s_v5", None, 0, 0, 64, 3.072),
    _m("azure", "Standard_D96s_v5", None, 0, 0, 96, 4.608),
    _m("azure", "Standard_NC24ads_A100_v4", "A100", 1, 80, 24, 3.673),
    _m("azure", "Standard_NC48ads_A100_v4", "A100", 2, 80, 48, 7.346),
    _m("azure", "Standard_NC96ads_A100_v4", "A100", 4, 80, 96, 14.692),
    _m("azure", "Standard_ND96asr_v4", "A100", 8, 40, 96, 27.197),
    _m("azure", "Standard_ND96amsr_A100_v4", "A100", 8, 80, 96, 32.77),
    _m("azure", "Standard_NC40ads_H100_v5", "H100", 1, 94, 40, 6.98),
    _m("azure", "Standard_NC80adis_H100_v5", "H100", 2, 94, 80, 13.96),
    _m("azure", "Standard_ND96isr_H100_v5", "H100", 8, 80, 96, 98.32),
    _m("azure", "Standard_ND96isr_H200_v5", "H200", 8, 141, 96),
    _m("azure", "Standard_NC4as_T4_v3", "T4", 1, 16, 4, 0.526),
    _m("azure", "Standard_NC64as_T4_v3", "T4", 4, 16, 64, 4.352),
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
            f"unknown accelerator {text!r}; known: {', '.join(NAMES)} (optionally with "
            f"memory and count, for example 'A100-80GB:8'), or None for CPU machines"
        )
    count = int(match["count"]) if match["count"] else None
    if count == 0:
        raise ValueError(f"{text!r}: the count after ':' must be at least 1")
    memory = int(match["memory"]) if match["memory"] else None
    return Accelerator(canonical[match["name"].upper()], count, memory)


def machines(cloud: Cloud) -> list[Machine]:
    return [m for m in MACHINES if m.cloud == cloud]


def choose(cloud: Cloud, accelerator: str | None) -> Machine:
    """The machine ``cloud`` gives for ``accelerator``; ``ValueError`` listing what it has."""
    if accelerator is None:
        return next(m for m in machines(cloud) if m.accelerator is None)
    wanted = parse(accelerator)
    offered = [m for m in machines(cloud) if m.accelerator == wanted.name]
    if not offered:
        have = sorted({m.accelerator for m in machines(cloud) if m.accelerator})
        raise ValueError(
            f"{cloud} has no {wanted.name} machines; it has {', '.join(have)} "
            f"(or pass the instance type yourself)"
        )
    for machine in offered:
        if wanted.count is not None and machine.count != wanted.count:
            continue
        if wanted.memory_gb is not None and machine.memory_gb != wanted.memory_gb:
            continue
        return machine
    options = ", ".join(f"'{m.accelerator}-{m.memory_gb}GB:{m.count}' ({m.type})" for m in offered)
    raise ValueError(f"{cloud} has no machine with {wanted}; it has {options}")


def price(cloud: Cloud, machine_type: str) -> float | None:
    """The catalog's hourly list price for a machine type, when it has one."""
    for machine in machines(cloud):
        if machine.type == machine_type and machine.hourly is not None:
            return machine.hourly
    return None
