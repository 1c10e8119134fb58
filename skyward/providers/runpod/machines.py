"""One RunPod pool's pods: the cloud contract's calls (``cloud/contract.py``) on RunPod.

::

    offers      the GPU types of the accelerator asked for, in stock, at their lowest price
                for the pool's GPU count (on demand; spot: the minimum bid), cheapest first
    prepare     the pods' input: image, disks, port 22/tcp, the boot payload as the start
                command's environment (a container has no cloud-init), the pool's tags
    launch      one rent per node, at once; an attempt that failed is terminated whole
    describe    REST's pod: RUNNING with port 22 mapped, on the way, or EXITED (an
                interruptible pod outbid) or gone
    delete      every pod the pool rented, then a sweep by the pool's name prefix

A pod is reached at its public address on the port RunPod maps to its 22 (``portMappings``,
the REST form of GraphQL's ``runtime.ports``). Its start command unpacks the boot payload
(``Boot.start_script``: the host key the client made, the login key, sshd, the idle
watchdog) and then waits as the container's main process; the watchdog's last act ends that
process, so a pod whose client is gone stops (``END_CONTAINER``).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline, settle
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud import capacity
from skyward.providers.cloud.boot import END_CONTAINER, END_CONTAINER_PATH, Boot
from skyward.providers.cloud.capacity import CapacityError, Offer
from skyward.providers.cloud.catalog import Machine
from skyward.providers.cloud.contract import Described, Offers, Reach, Want
from skyward.providers.cloud.record import Record
from skyward.providers.cloud.start import unique_name
from skyward.providers.runpod import api as runpod
from skyward.providers.runpod.api import Api

# The accelerator names pools take -> RunPod's GPU type ids, in the order to try them.
GPU_IDS: dict[str, tuple[str, ...]] = {
    "A100": ("NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"),
    "H100": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"),
    "H200": ("NVIDIA H200",),
    "L40S": ("NVIDIA L40S",),
    "L4": ("NVIDIA L4",),
    "V100": ("Tesla V100-SXM2-32GB", "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"),
    "RTX_5090": ("NVIDIA GeForce RTX 5090",),
    "RTX_5080": ("NVIDIA GeForce RTX 5080",),
    "RTX_4090": ("NVIDIA GeForce RTX 4090",),
    "RTX_4080": ("NVIDIA GeForce RTX 4080",),
    "RTX_3090": ("NVIDIA GeForce RTX 3090",),
    "RTX_3080": ("NVIDIA GeForce RTX 3080",),
    "MI300X": ("AMD Instinct MI300X OAM",),
}
# RunPod's own images: Ubuntu 22.04 with the CUDA 12.4 (or ROCm 6.1) userland, PyTorch, and
# openssh-server installed (RunPod's start.sh is replaced by ours, which starts it).
CUDA_IMAGE = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
ROCM_IMAGE = "runpod/pytorch:2.1.2-py3.10-rocm6.1-ubuntu22.04"
TAGS_ENV = "SKYWARD_TAGS"  # a pod has no labels: its pool's tags ride in its environment
BOOT_ENV = "SKYWARD_BOOT"
# The container's command: the boot payload from its environment, then a main process that
# a watchdog's ``kill -TERM 1`` ends (PID 1 ignores signals it has no handler for).
START = (
    'sh -c \'printf %s "$SKYWARD_BOOT" | base64 -d >/tmp/skyward-boot.sh && '
    'sh /tmp/skyward-boot.sh || exit 1; trap "exit 0" TERM; '
    "while :; do sleep 3600 & wait $!; done'"
)
_ACCELERATOR = re.compile(
    r"^(?P<name>[A-Za-z][A-Za-z0-9_]*?)(?:-(?P<gb>\d+)GB)?(?::(?P<n>[1-9]\d*))?$"
)


def gpus(accelerator: str | None) -> tuple[str, int, int | None]:
    """``"RTX_4090:2"`` -> (``"RTX_4090"``, 2, None); ``ValueError`` for a name RunPod's
    table lacks, or none (RunPod's pods here are GPU pods)."""
    found = _ACCELERATOR.match(accelerator or "")
    known = {name.upper(): name for name in GPU_IDS}
    if found is None or found["name"].upper() not in known:
        raise ValueError(
            f"sky.RunPod rents GPU pods: accelerator is one of {', '.join(GPU_IDS)} "
            f"(optionally with a count, 'RTX_4090:2'), not {accelerator!r}"
        )
    memory = int(found["gb"]) if found["gb"] else None
    return known[found["name"].upper()], int(found["n"] or 1), memory


class Settings(Protocol):
    """What the pods read of ``sky.RunPod`` (``options.py``)."""

    @property
    def cloud_type(self) -> str: ...
    @property
    def data_center(self) -> str | None: ...
    @property
    def image(self) -> str | None: ...
    @property
    def container_disk_gb(self) -> int: ...
    @property
    def volume_gb(self) -> int: ...
    @property
    def network_volume(self) -> str | None: ...
    @property
    def endpoint_url(self) -> str | None: ...
    @property
    def release_timeout(self) -> float: ...


class RunPodMachines:
    """A pool's pods in one account."""

    noun = "pod"
    instance_profile = False

    def __init__(self, options: Settings, api: Api, request: ProvisionRequest) -> None:
        self.options, self.api = options, api
        self.base = unique_name(request.pool, unsafe=r"[^A-Za-z0-9-]", length=30)
        self.prefix = f"{self.base}-n"
        self._input: dict[str, Any] = {}  # the pods' input, made by prepare
        self._gpus = 1  # per pod, read by offers

    @property
    def scope(self) -> tuple[str, str]:
        return " on RunPod", ""

    def key_label(self, first: Offer) -> tuple[str, str, str]:
        return self.options.data_center or "global", self.base, self.options.endpoint_url or ""

    def resume(self, name: str) -> None:
        self.base, self.prefix = name, f"{name}-n"  # the pods' names, and the sweep's

    def offers(self, want: Want) -> Offers:
        options, request = self.options, want.request
        name, count, memory = gpus(request.accelerator)
        self._gpus = count
        # The start counts a node's GPUs with nvidia-smi: AMD's are left uncounted.
        counted = 0 if name == "MI300X" else count
        lowest: dict[str, Any] = {"gpuCount": count}
        if options.cloud_type != "all":
            lowest["secureCloud"] = options.cloud_type == "secure"
        if options.data_center:
            lowest["dataCenterId"] = options.data_center
        want.deadline.check("reading RunPod's GPU types")
        types = {t["id"]: t for t in runpod.gpu_types(self.api, lowest)}
        where = options.data_center or f"RunPod's {options.cloud_type} cloud"
        found: list[Offer] = []
        for market in capacity.markets(want.strategy):
            key = "uninterruptablePrice" if market == "on-demand" else "minimumBidPrice"
            here = []
            for kind in (types[id] for id in GPU_IDS[name] if id in types):
                price, gb = (kind.get("lowestPrice") or {}).get(key), kind.get("memoryInGb")
                stocked = (kind.get("lowestPrice") or {}).get("stockStatus")
                if price is not None and stocked and (memory is None or gb == memory):
                    machine = Machine("runpod", kind["id"], name, counted, int(gb or 0), 0)
                    here.append(Offer(machine, where, market, float(price) * count))
            found += sorted(here, key=lambda o: o.hourly or 0.0)
        if want.strategy == "cheapest":
            found.sort(key=lambda o: o.hourly or 0.0)
        if not found:
            raise ProvisionError(
                f"RunPod has no {count} x {name} in stock in {where} "
                f"({', '.join(GPU_IDS[name])}); nothing was rented. Try later, cloud_type='all', "
                f"another data center or accelerator, or allocation='spot-if-available'"
            )
        return Offers(found, where)

    def prepare(self, want: Want, offers: Sequence[Offer], boot: Boot, record: Record) -> None:
        options, request = self.options, want.request
        boot = boot.with_last_act(idle_action=END_CONTAINER_PATH, files=[END_CONTAINER])
        amd = offers[0].machine.accelerator == "MI300X"
        script = base64.b64encode(boot.start_script().encode()).decode()
        self._input = {
            "cloudType": options.cloud_type.upper(),
            "gpuCount": self._gpus,
            "imageName": options.image or (ROCM_IMAGE if amd else CUDA_IMAGE),
            "containerDiskInGb": options.container_disk_gb,
            "volumeInGb": options.volume_gb,
            "volumeMountPath": "/workspace",
            "ports": "22/tcp",
            "supportPublicIp": True,
            "startSsh": False,  # sshd is ours, started with the client's host key
            "dockerArgs": START,
            "env": [
                {"key": "PUBLIC_KEY", "value": boot.authorized_key},
                {"key": BOOT_ENV, "value": script},
                {"key": TAGS_ENV, "value": json.dumps(dict(request.tags))},
            ],
        }
        optional = {
            "dataCenterId": options.data_center,
            "networkVolumeId": options.network_volume,
            "minVcpuCount": int(request.vcpus) if request.vcpus else None,
            "minMemoryInGb": int(request.memory_gb) if request.memory_gb else None,
        }
        self._input.update({k: v for k, v in optional.items() if v is not None})

    def launch(
        self, offer: Offer, names: Sequence[str], record: Record, deadline: Deadline
    ) -> list[str]:
        spot = offer.market == "spot"
        spec = {**self._input, "gpuTypeId": offer.machine.type}
        if spot:  # the bid: the minimum RunPod asked for when the offers were read
            spec["bidPerGpu"] = round((offer.hourly or 0.0) / self._gpus, 4)
        made: dict[str, str] = {}

        def rent(name: str) -> None:
            doing = f"renting pod {name} ({offer.where})"
            id = runpod.deploy(self.api, {**spec, "name": name}, spot=spot, doing=doing)
            record.made(offer.zone, [id])
            made[name] = id

        errors = [e for f in settle(rent, names) if (e := f.exception()) is not None]
        if errors:  # all or none: what this attempt rented goes before the next offer
            timeout = self.options.release_timeout
            left = self.discard(offer.zone, list(made.values()), Deadline(timeout, "release"))
            if left:
                raise ProvisionError(
                    f"could not terminate {', '.join(left)}; remove them with: "
                    f"skyward down --pool {record.pool}"
                ) from errors[0]
            capacities = [e for e in errors if isinstance(e, CapacityError)]
            raise errors[0] if len(capacities) < len(errors) else capacities[0]
        return [made[name] for name in names]

    def describe(self, place: str, ids: Sequence[str], *, quick: bool = False) -> list[Described]:
        return [self._one(id, quick) for id in ids]

    def _one(self, id: str, quick: bool) -> Described:
        found = runpod.pod(self.api, id, quick=quick)
        if found is None:
            return Described("ended", "gone", why="RunPod no longer has it (terminated)")
        status = str(found.get("desiredStatus") or "")
        if status in ("EXITED", "TERMINATED"):
            said = str(found.get("lastStatusChange") or "no reason given")
            if found.get("interruptible"):
                why = f"interrupted: RunPod stopped this spot pod ({said})"
            else:
                why = f"its container stopped ({said})"
            return Described("ended", status, why=why)
        port = (found.get("portMappings") or {}).get("22")
        address = found.get("publicIp")
        if status != "RUNNING" or not port or not address:
            return Described("starting", status or "PROVISIONING")
        return Described("running", status, Reach(host=address, peer=address, port=int(port)))

    def discard(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[str]:
        return runpod.terminate(self.api, ids)  # synchronous: nothing to wait for

    def delete(self, record: Record, deadline: Deadline) -> list[str]:
        """Every pod rented, then a sweep by name for one whose rent answer was lost."""
        ids = list(dict.fromkeys(id for _, id in record.machines()))
        left: list[str] = []
        if record.asked():
            try:
                named = [p for p in runpod.pods(self.api) if _named(p, self.base)]
                ids += [str(p["id"]) for p in named if p["id"] not in ids]
            except ProvisionError as exc:
                left.append(f"the sweep by name ({exc})")
        return self.discard("", ids, deadline) + left


def _named(pod: dict[str, Any], base: str) -> bool:
    return str(pod.get("name") or "").startswith(base + "-")
