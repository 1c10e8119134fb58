"""The node's side of ``sky.metrics``: one thread that reads the node's numbers and sends
them to the client as ``Sample`` frames.

::

    Start.metrics ──> Sampler thread ("skyward-metrics"), on the node's first worker only
                        every tick: the metrics that are due ──> readers below
                        ──> one Sample(time, {name: value}) ──> link.send (its lock, between
                                                                 whole frames of calls)

Readers need only the standard library and Linux's ``/proc``: CPU (``/proc/stat``, busy
share between two reads), memory (``/proc/meminfo``), network (``/proc/net/dev``, bytes per
second between two reads), disks (``os.statvfs``), a ``Custom`` shell command. GPUs are read
through NVML with ``pynvml`` (``nvidia-ml-py``) when it can be imported and initialised;
otherwise the GPU metrics are left out, once, quietly: a CPU node has nothing to report.

A reader that fails (a missing interface, a command that prints no number) gives no value
that tick; the others still go. The thread sleeps between ticks, so a node sampling every
0.5 s spends well under a millisecond of CPU a second on it; the frame is ~100 bytes.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward.link import protocol as proto

Spec = tuple[str, str, float, str]  # (name, kind, interval (0: once), arg)
_GPU = ("gpu_util", "gpu_mem", "gpu_mem_total", "gpu_temp")
_RATES = ("cpu", "net_rx", "net_tx")


class Sampler:
    """Samples ``specs`` until ``stop`` (or the link fails), sending each tick's values."""

    def __init__(self, send: Callable[[object], None], specs: tuple[Spec, ...]) -> None:
        self._send = send
        self._specs = specs
        self._stopped = threading.Event()
        self._unreadable: set[str] = set()  # metrics whose read failed: said once each
        self._cpu: tuple[int, int] | None = None  # (busy, total) jiffies at the last read
        # key -> (time, bytes by interface) at the last read
        self._net: dict[str, tuple[float, dict[str, int]]] = {}
        self._nvml: Any = None  # pynvml, once initialised; False when it cannot be
        self._thread = threading.Thread(target=self._run, name="skyward-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        # index -> when it is next due (monotonic); a rate (CPU, network) needs a first
        # read, so its first value comes one interval after it.
        start = time.monotonic()
        due = {
            i: start + (interval if kind in _RATES else 0.0)
            for i, (_, kind, interval, _) in enumerate(self._specs)
        }
        self._cpu_read()  # the first CPU share needs an earlier read
        for spec in self._specs:
            if spec[1] in ("net_rx", "net_tx"):
                self._net_read(spec)
        while not self._stopped.is_set():
            now = time.monotonic()
            values: dict[str, float] = {}
            for index, when in list(due.items()):
                if when > now:
                    continue
                name, kind, interval, arg = self._specs[index]
                try:
                    self._read(name, kind, arg, values)
                except Exception as exc:  # this metric's tick only: the others go on
                    if name not in self._unreadable:
                        self._unreadable.add(name)
                        os.write(2, f"skyward: metric {name} could not be read: {exc!r}\n".encode())
                if interval > 0:
                    due[index] = max(when + interval, now)  # no burst after a slow tick
                else:
                    del due[index]  # read once
            if values:
                try:
                    self._send(proto.Sample(time.time(), values))
                except OSError:
                    return  # the client is gone
            if not due:
                return
            self._stopped.wait(max(min(due.values()) - time.monotonic(), 0.0))

    def _read(self, name: str, kind: str, arg: str, values: dict[str, float]) -> None:
        if kind == "cpu":
            share = self._cpu_read()
            if share is not None:
                values[name] = share
        elif kind in ("mem", "mem_used", "mem_total"):
            total, available = _meminfo()
            values[name] = {
                "mem": 100.0 * (total - available) / total if total else 0.0,
                "mem_used": (total - available) / 1024,
                "mem_total": total / 1024,
            }[kind]
        elif kind in ("net_rx", "net_tx"):
            rate = self._net_read((name, kind, 0.0, arg))
            if rate is not None:
                values[name] = rate
        elif kind == "disk":
            stat = os.statvfs(arg or "/")
            total = stat.f_blocks * stat.f_frsize
            free = stat.f_bavail * stat.f_frsize
            values[name] = 100.0 * (total - free) / total if total else 0.0
        elif kind == "command":
            values[name] = _command(arg, self._interval_of(name))
        elif kind in _GPU:
            self._gpu_read(name, kind, arg, values)

    def _interval_of(self, name: str) -> float:
        return next((s[2] for s in self._specs if s[0] == name), 3.0) or 3.0

    def _cpu_read(self) -> float | None:
        """Busy share of every core since the last read, percent."""
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        total = sum(fields[:8])  # guest time is counted in user already
        busy = total - idle
        last, self._cpu = self._cpu, (busy, total)
        if last is None or total <= last[1]:
            return None
        return 100.0 * (busy - last[0]) / (total - last[1])

    def _net_read(self, spec: Spec) -> float | None:
        """MB/s received or sent on an interface (all but loopback) since the last read.
        By interface: one that came or went meanwhile (a container's veth), or whose
        counter was reset, adds nothing rather than a negative rate."""
        _, kind, _, interface = spec
        column = 0 if kind == "net_rx" else 8
        counts: dict[str, int] = {}
        with open("/proc/net/dev", "rb") as f:
            for line in f.readlines()[2:]:
                name, _, rest = line.decode().partition(":")
                name = name.strip()
                if (interface and name != interface) or (not interface and name == "lo"):
                    continue
                counts[name] = int(rest.split()[column])
        key = f"{kind}:{interface}"
        now = time.monotonic()
        last = self._net.get(key)
        self._net[key] = (now, counts)
        if last is None or now <= last[0]:
            return None
        before = last[1]
        moved = sum(max(n - before[i], 0) for i, n in counts.items() if i in before)
        return moved / (now - last[0]) / 1e6

    def _gpu_read(self, name: str, kind: str, arg: str, values: dict[str, float]) -> None:
        nvml = self._nvml_module()
        if nvml is None:
            return
        count = nvml.nvmlDeviceGetCount()
        indices = [int(arg)] if arg else range(count)
        for i in indices:
            if i >= count:
                continue
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            if kind == "gpu_util":
                value = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            elif kind == "gpu_temp":
                value = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            else:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                value = (memory.used if kind == "gpu_mem" else memory.total) / 2**20
            values[f"{name}_{i}"] = value

    def _nvml_module(self) -> Any:
        """pynvml, initialised once; None where there is no NVML (no package, no driver)."""
        if self._nvml is None:
            try:
                import importlib

                pynvml = importlib.import_module("pynvml")  # nvidia-ml-py, when the node has it
                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # no nvidia-ml-py, or no driver: a node without GPUs
                self._nvml = False
        return self._nvml or None


def _meminfo() -> tuple[int, int]:
    """(total, available) KiB."""
    found: dict[str, int] = {}
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            key, _, rest = line.decode().partition(":")
            if key in ("MemTotal", "MemAvailable"):
                found[key] = int(rest.split()[0])
                if len(found) == 2:
                    break
    return found["MemTotal"], found.get("MemAvailable", 0)


def _command(command: str, bound: float) -> float:
    """The number a shell command prints first; ``ValueError`` when none."""
    done = subprocess.run(
        command, shell=True, capture_output=True, text=True, timeout=max(bound, 1.0)
    )
    return float(done.stdout.split()[0])
