"""``sky.metrics``: what each node samples about itself while the pool runs.

::

    image = sky.Image(metrics=[sky.metrics.CPU(interval=0.5), sky.metrics.GPU(),
                               sky.metrics.Memory()])     # None: no sampling at all

    with sky.ComputePool(nodes=2, image=image) as pool:
        train() @ pool
        pool.metrics()          # a row per node and sample time (a DataFrame with pandas)
        pool.plot_metrics()     # a PNG, a panel per metric (matplotlib)

Each value is a ``Metric``: a name, what is read, and how often. On the node, one thread of
the first worker reads them (``skyward/worker/metrics.py``: ``/proc`` for CPU, memory and
network, ``statvfs`` for disks, NVML for GPUs, a shell command for ``Custom``) and sends the
values due at each tick to the client as one small frame on the worker's link, between
calls' frames. GPUs are read through ``nvidia-ml-py`` (``pynvml``), added to the image of a
remote pool with an NVIDIA accelerator that names GPU metrics (the default adds nothing
and reads GPUs where the node has it); a node without it, or without a GPU, sends no GPU
values, and nothing else changes. Names follow skyward 0.5's (``cpu``, ``mem``, ``gpu_util``,
...); a per-GPU value is suffixed with the GPU's index (``gpu_util_0``).

The client keeps the samples (``pool.metrics()``), appends them to ``metrics.jsonl`` in
the pool's log directory (``skyward logs --plot POOL`` draws them after the run), and shows
the latest per node in the console.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CPU",
    "GPU",
    "Custom",
    "Default",
    "Disk",
    "GPUMemory",
    "GPUMemoryTotal",
    "GPUTemp",
    "Memory",
    "MemoryTotal",
    "MemoryUsed",
    "Metric",
    "NetworkRx",
    "NetworkTx",
]

# What a node can read; the worker's sampler has one reader per kind.
Kind = Literal[
    "cpu",
    "mem",
    "mem_used",
    "mem_total",
    "gpu_util",
    "gpu_mem",
    "gpu_mem_total",
    "gpu_temp",
    "disk",
    "net_rx",
    "net_tx",
    "command",
]
GPU_KINDS = frozenset({"gpu_util", "gpu_mem", "gpu_mem_total", "gpu_temp"})
_MIN_INTERVAL = 0.05  # below this the sampler's own cost shows in the node's CPU


@dataclass(frozen=True)
class Metric:
    """One value a node samples: ``name`` (its column), ``kind`` (what is read),
    ``interval`` (seconds between samples; ``None``: once, at start), ``arg`` (a path, an
    interface, a GPU index or a shell command, by kind)."""

    name: str
    kind: Kind
    interval: float | None = 2.0
    arg: str | None = None

    def __post_init__(self) -> None:
        if self.interval is not None and not (
            isinstance(self.interval, int | float) and self.interval >= _MIN_INTERVAL
        ):
            raise ValueError(
                f"metric {self.name!r}: interval is seconds, at least {_MIN_INTERVAL}, "
                f"not {self.interval!r}"
            )
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"a metric's name is letters, digits and '_', not {self.name!r}")

    def wire(self) -> tuple[str, str, float, str]:
        """As the worker receives it (plain values: the worker imports no client module);
        an interval of 0 means once."""
        return (self.name, self.kind, self.interval or 0.0, self.arg or "")


def CPU(interval: float = 2) -> Metric:
    """The node's CPU use, percent of all its cores (``cpu``)."""
    return Metric("cpu", "cpu", interval)


def Memory(interval: float = 2) -> Metric:
    """The node's memory in use, percent of its total (``mem``)."""
    return Metric("mem", "mem", interval)


def MemoryUsed(interval: float = 2) -> Metric:
    """The node's memory in use, MB (``mem_used_mb``)."""
    return Metric("mem_used_mb", "mem_used", interval)


def MemoryTotal() -> Metric:
    """The node's memory, MB, read once (``mem_total_mb``)."""
    return Metric("mem_total_mb", "mem_total", None)


def _gpu(name: str, kind: Kind, index: int | None, interval: float | None) -> Metric:
    if index is not None and (not isinstance(index, int) or index < 0):
        raise ValueError(f"a GPU index is a whole number >= 0, not {index!r}")
    return Metric(name, kind, interval, None if index is None else str(index))


def GPU(index: int | None = None, interval: float = 3) -> Metric:
    """Each GPU's utilization, percent (``gpu_util_<i>``); ``index``: that GPU only."""
    return _gpu("gpu_util", "gpu_util", index, interval)


def GPUMemory(index: int | None = None, interval: float = 3) -> Metric:
    """Each GPU's memory in use, MB (``gpu_mem_mb_<i>``)."""
    return _gpu("gpu_mem_mb", "gpu_mem", index, interval)


def GPUMemoryTotal(index: int | None = None) -> Metric:
    """Each GPU's memory, MB, read once (``gpu_mem_total_mb_<i>``)."""
    return _gpu("gpu_mem_total_mb", "gpu_mem_total", index, None)


def GPUTemp(index: int | None = None, interval: float = 3) -> Metric:
    """Each GPU's temperature, °C (``gpu_temp_<i>``)."""
    return _gpu("gpu_temp", "gpu_temp", index, interval)


def Disk(path: str = "/", interval: float = 5.0) -> Metric:
    """The file system holding ``path``: percent used (``disk``)."""
    return Metric("disk", "disk", interval, path)


def NetworkRx(interface: str | None = None, interval: float = 3) -> Metric:
    """Bytes received per second, MB/s, on ``interface`` (``None``: every interface but
    loopback) (``net_rx_mbps``)."""
    return Metric("net_rx_mbps", "net_rx", interval, interface)


def NetworkTx(interface: str | None = None, interval: float = 3) -> Metric:
    """Bytes sent per second, MB/s (``net_tx_mbps``)."""
    return Metric("net_tx_mbps", "net_tx", interval, interface)


def Custom(name: str, command: str, interval: float = 3) -> Metric:
    """The number a shell command prints (its first line), run on the node every
    ``interval`` seconds (bounded by it); no value when it fails or prints none."""
    if not command.strip():
        raise ValueError(f"metric {name!r}: the command is empty")
    return Metric(name, "command", interval, command)


def Default(
    *, cpu_interval: float = 2, memory_interval: float = 2, gpu_interval: float = 3
) -> tuple[Metric, ...]:
    """CPU, memory, network, and each GPU's utilization and memory (where the node has
    GPUs): what ``sky.Image()`` samples unless told otherwise."""
    return (
        CPU(cpu_interval),
        Memory(memory_interval),
        NetworkRx(interval=memory_interval),
        NetworkTx(interval=memory_interval),
        GPU(interval=gpu_interval),
        GPUMemory(interval=gpu_interval),
    )


def check(metrics: tuple[Metric, ...]) -> tuple[Metric, ...]:
    """Metrics as an image holds them: no name twice."""
    names = [m.name for m in metrics]
    for m in metrics:
        if not isinstance(m, Metric):
            raise ValueError(f"metrics are sky.metrics values (CPU(), GPU(), ...), not {m!r}")
        if names.count(m.name) > 1:
            raise ValueError(f"metric {m.name!r} is listed more than once")
    return metrics


def default_metrics() -> tuple[Metric, ...]:
    """What ``sky.Image()`` samples when it names no ``metrics``."""
    return Default()
