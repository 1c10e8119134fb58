"""``sky.accelerators``: accelerators as values, and what the clouds' catalog offers.

::

    sky.accelerators.A100()                  "A100"          the provider's default count
    sky.accelerators.A100(count=8)           "A100:8"
    sky.accelerators.A100(memory="80GB")     "A100-80GB"
    sky.accelerators.RTX_4090(count=2)       "RTX_4090:2"    a marketplace's GPU (RunPod, Vast.ai)
    sky.accelerators.Custom("GH200", count=8)                 a name outside both
    sky.accelerators.machines("H100")        every machine type with H100s, per cloud,
                                             with its list price

A value and its string are the same request: ``ComputePool(accelerator=A100(count=8))`` is
``ComputePool(accelerator="A100:8")``, and the pool hands providers, plugins and
``InstanceInfo`` the string. The names and their memory sizes come from the catalog
(``skyward/providers/cloud/catalog.py``), the one table of machine types and prices every cloud
provider reads; nothing here repeats it.

skyward 0.5's ``A100()`` meant one 80 GB device; here it leaves count and memory to the
provider, as ``"A100"`` does (on AWS the smallest A100 machine has 8). Pin them when they
matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from skyward.providers.cloud import catalog
from skyward.providers.cloud.catalog import Accelerator, Machine

__all__ = [
    "A10G",
    "A100",
    "B200",
    "GH200",
    "H100",
    "H200",
    "L4",
    "L40S",
    "MI300X",
    "P100",
    "RTX_3080",
    "RTX_3090",
    "RTX_4080",
    "RTX_4090",
    "RTX_5080",
    "RTX_5090",
    "T4",
    "TPU",
    "V100",
    "Accelerator",
    "CudaAccelerator",
    "Custom",
    "Inferentia2",
    "Machine",
    "TPUv2",
    "TPUv2_8",
    "TPUv3",
    "TPUv3_8",
    "TPUv3_32",
    "TPUv4",
    "TPUv4_64",
    "TPUv5e",
    "TPUv5e_4",
    "TPUv5p",
    "TPUv5p_8",
    "TPUv6",
    "Trainium2",
    "machines",
    "names",
]

_MEMORY = re.compile(r"^\s*(\d+)\s*(?:GB|G|GIB)?\s*$", re.IGNORECASE)


class Factory(Protocol):
    """``A100(count=..., memory=...)``: one accelerator of the catalog, as a value."""

    __name__: str

    def __call__(
        self, *, count: int | None = None, memory: str | int | None = None
    ) -> Accelerator: ...


def _memory_gb(name: str, memory: str | int | None) -> int | None:
    if memory is None or memory == "":
        return None
    if isinstance(memory, bool) or not isinstance(memory, int | str):
        raise TypeError(f"{name}: memory is '80GB' or 80, not {type(memory).__name__}")
    match = _MEMORY.match(str(memory))
    if match is None:
        raise ValueError(f"{name}: memory is written '80GB' or 80 (GB per device), not {memory!r}")
    return int(match[1])


def _factory(name: str) -> Factory:
    sizes = sorted({m.memory_gb for m in catalog.MACHINES if m.accelerator == name})

    def make(*, count: int | None = None, memory: str | int | None = None) -> Accelerator:
        memory_gb = _memory_gb(name, memory)
        if memory_gb is not None and memory_gb not in sizes:
            raise ValueError(
                f"{name} comes with {' or '.join(map(str, sizes))} GB per device in the "
                f"catalog, not {memory_gb} GB; leave memory out, or use Custom({name!r}, "
                f"memory=...) for a machine outside it (sky.SSH, sky.Slurm)"
            )
        return Accelerator(name, count, memory_gb)

    make.__name__ = make.__qualname__ = name
    clouds = ", ".join(
        f"{catalog.PROVIDERS[cloud]} ({len(found)} types)"
        for cloud, found in catalog.offered_by(Accelerator(name)).items()
    )
    make.__doc__ = (
        f"NVIDIA {name} ({' or '.join(map(str, sizes))} GB per device), as a pool's "
        f"``accelerator``. ``count``: devices per node, ``memory``: GB per device (``'80GB'`` "
        f"or ``80``); either left out means the provider's default, as ``{name!r}`` does. "
        f"In the catalog: {clouds}."
    )
    return make


A100 = _factory("A100")
H100 = _factory("H100")
H200 = _factory("H200")
B200 = _factory("B200")
L4 = _factory("L4")
L40S = _factory("L40S")
A10G = _factory("A10G")
T4 = _factory("T4")
V100 = _factory("V100")
P100 = _factory("P100")
GH200 = _factory("GH200")


# What the GPU marketplaces sell besides the catalog's (RunPod, Vast.ai; consumer cards and
# AMD's): name -> GB per device. No cloud of the catalog has them; a marketplace's provider
# maps each name to its own GPU ids.
MARKETPLACE: dict[str, int] = {
    "RTX_5090": 32,
    "RTX_5080": 16,
    "RTX_4090": 24,
    "RTX_4080": 16,
    "RTX_3090": 24,
    "RTX_3080": 10,
    "MI300X": 192,
}


def _sold(name: str) -> Factory:
    """``RTX_4090(count=...)``: a marketplace's GPU, its one memory size."""
    size = MARKETPLACE[name]

    def make(*, count: int | None = None, memory: str | int | None = None) -> Accelerator:
        memory_gb = _memory_gb(name, memory)
        if memory_gb is not None and memory_gb != size:
            raise ValueError(f"{name} comes with {size} GB per device, not {memory_gb} GB")
        return Accelerator(name, count, memory_gb)

    make.__name__ = make.__qualname__ = name
    make.__doc__ = (
        f"{name} ({size} GB per device), as a pool's ``accelerator`` on a GPU marketplace "
        f"(sky.RunPod, sky.VastAI). ``count``: devices per node."
    )
    return make


RTX_5090 = _sold("RTX_5090")
RTX_5080 = _sold("RTX_5080")
RTX_4090 = _sold("RTX_4090")
RTX_4080 = _sold("RTX_4080")
RTX_3090 = _sold("RTX_3090")
RTX_3080 = _sold("RTX_3080")
MI300X = _sold("MI300X")


_CUDA = re.compile(r"^\d{1,2}(\.\d{1,2})?$")


@dataclass(frozen=True)
class CudaAccelerator(Accelerator):
    """``Custom(..., cuda_min="12.0")``: the request, and the least CUDA version the pool's
    image may be built for (checked when the pool is built, against the CUDA the image's
    packages name: PyTorch's ``cu126`` wheels, jax's ``cuda12``)."""

    cuda_min: str | None = None


def Custom(
    name: str,
    *,
    count: int | None = None,
    memory: str | int | None = None,
    cuda_min: str | None = None,
) -> Accelerator:
    """An accelerator outside the catalog, or one named as a machine names it: sky.SSH and
    sky.Slurm take any name (``Custom("MI300X", count=8)`` is ``gres=gpu:mi300x:8`` on
    Slurm); a cloud provider refuses a name its catalog lacks, when the pool is built.
    ``cuda_min="12.0"``: a pool whose image names an older CUDA build (``cu118`` wheels)
    is refused when it is built."""
    if cuda_min is None:
        return Accelerator(name, count, _memory_gb(name, memory))
    if not isinstance(cuda_min, str) or not _CUDA.match(cuda_min):
        raise ValueError(f"{name}: cuda_min is a version such as '12.0', not {cuda_min!r}")
    return CudaAccelerator(name, count, _memory_gb(name, memory), cuda_min)


# skyward 0.5's AWS Neuron accelerators: no provider here sells them yet (the AWS catalog has
# no trn2/inf2 types, and the pool's default image is NVIDIA's), so making one says what works
# instead, before anything starts.
NOT_OFFERED = {
    "Trainium2": "trn2",
    "Inferentia2": "inf2",
}


def _not_offered(name: str) -> Factory:
    family = NOT_OFFERED[name]

    def make(*, count: int | None = None, memory: str | int | None = None) -> Accelerator:
        raise ValueError(
            f"sky.accelerators.{name}(): no provider here offers AWS {family} machines yet "
            f"(the AWS catalog has no {family} types, and Skyward has no Neuron image). On "
            f"{family} machines you already run, use sky.SSH(hosts=[...]) with "
            f"accelerator=sky.accelerators.Custom({name!r}, count=...) and "
            f"image=sky.Image(pip=['torch-neuronx'], pip_indexes=[sky.PipIndex(url="
            f"'https://pip.repos.neuron.amazonaws.com', packages=['torch-neuronx'])])"
        )

    make.__name__ = make.__qualname__ = name
    make.__doc__ = f"AWS {name} ({family}): not offered yet; calling it says what to write."
    return make


Trainium2 = _not_offered("Trainium2")
Inferentia2 = _not_offered("Inferentia2")


def names() -> tuple[str, ...]:
    """Every accelerator name in the clouds' catalog, as pools take it."""
    return catalog.NAMES


def machines(
    accelerator: str | Accelerator | None = None, *, cloud: str | None = None
) -> list[Machine]:
    """Every machine type in the catalog that has accelerators, or ``accelerator`` (its
    count and memory too, when pinned), on every cloud or on ``cloud`` (``"aws"``,
    ``"gcp"``, ``"azure"``): by accelerator, then cloud, then count, then price.

    Each row says its ``cloud``, ``type``, ``accelerator``, ``count`` (per machine),
    ``memory_gb`` (per device), ``vcpus``, ``ram_gb`` and ``hourly`` (the on-demand list
    price in the cloud's reference region, USD; ``None`` where not published)::

        for m in sky.accelerators.machines("H100"):
            print(m.cloud, m.type, m.count, m.hourly)
    """
    if cloud is not None and cloud not in catalog.PROVIDERS:
        raise ValueError(f"cloud is one of {', '.join(catalog.PROVIDERS)}, not {cloud!r}")
    wanted = catalog.parse(accelerator) if isinstance(accelerator, str) else accelerator
    rows = [
        m
        for m in catalog.MACHINES
        if m.accelerator is not None
        and (cloud is None or m.cloud == cloud)
        and (wanted is None or catalog.fits(m, wanted))
    ]
    order = {name: i for i, name in enumerate(catalog.NAMES)}
    clouds = list(catalog.PROVIDERS)

    def key(m: Machine) -> tuple[int, int, int, float]:
        price = m.hourly
        return (
            order[str(m.accelerator)],
            clouds.index(m.cloud),
            m.count,
            price if price is not None else float("inf"),
        )

    return sorted(rows, key=key)


# ── Cloud TPU (sky.GCP): a type is one slice, its hosts the pool's nodes ─────────────────


def TPU(name: str, *, count: int | None = None) -> Accelerator:
    """A Cloud TPU accelerator type as Google names it (``"v4-32"``, ``"v5litepod-8"``,
    ``"v6e-16"``): one slice, each of its hosts a node (``skyward catalog tpu`` lists them).
    ``ValueError`` for a type Google does not sell, listing those it does. ``count`` is
    accepted as 1 only (skyward 0.5's spelling): more slices are ``nodes=``, a multiple of
    the hosts (multislice)."""
    from skyward.providers.gcp import tpu_types

    if count not in (None, 1):
        raise ValueError(
            f"{name}: a TPU type is one slice; for {count} slices ask for nodes= {count} x "
            f"its hosts (multislice), or a larger type"
        )
    return Accelerator(tpu_types.parse(name).name)


def _tpu_factory(public: str, name: str) -> Factory:
    def make(*, count: int | None = None, memory: str | int | None = None) -> Accelerator:
        if memory is not None:
            raise ValueError(f"{public}: a TPU's memory is its generation's; leave memory out")
        return TPU(name, count=count)

    make.__name__ = make.__qualname__ = public
    make.__doc__ = f"Cloud TPU {name} on sky.GCP (``TPU({name!r})``): one slice."
    return make


# skyward 0.5's names: a generation alone is its smallest slice.
TPUv2 = _tpu_factory("TPUv2", "v2-8")
TPUv3 = _tpu_factory("TPUv3", "v3-8")
TPUv4 = _tpu_factory("TPUv4", "v4-8")
TPUv5e = _tpu_factory("TPUv5e", "v5litepod-1")
TPUv5p = _tpu_factory("TPUv5p", "v5p-8")
TPUv6 = _tpu_factory("TPUv6", "v6e-1")
TPUv2_8 = _tpu_factory("TPUv2_8", "v2-8")
TPUv3_8 = _tpu_factory("TPUv3_8", "v3-8")
TPUv3_32 = _tpu_factory("TPUv3_32", "v3-32")
TPUv4_64 = _tpu_factory("TPUv4_64", "v4-64")
TPUv5e_4 = _tpu_factory("TPUv5e_4", "v5litepod-4")
TPUv5p_8 = _tpu_factory("TPUv5p_8", "v5p-8")
