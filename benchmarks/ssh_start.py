"""How long a 2-node SSH pool takes from ``ComputePool(...)`` to ready, by phase, on test
hosts that start from nothing (the test suite's fixtures: root and ``openssh-server``
needed), and where the bootstrap spends its time.

::

    .venv/bin/python benchmarks/ssh_start.py                    # Debian-like hosts, 3 rounds
    .venv/bin/python benchmarks/ssh_start.py --hosts ubuntu     # python3 = 3.12, no pip, no
                                                                #   ensurepip, no unzip

Per round: new hosts (empty homes: no uv, no cache, no environment), a package index and a
CPython mirror on their bridge, one pool. Phases, cumulative seconds from ``ComputePool(...)``:

    connect      until the last node is connected over SSH
    bootstrap    until the last node's environment is ready and skyward uploaded
    ready        until the pool is ready (workers spawned, Hello, Start, Ready)

and the bootstrap's own steps (from its ``::skyward::`` markers, node 0): the seconds from
each command to the next. Run it against another skyward (an older checkout) by putting that
one first on ``PYTHONPATH``; the test fixtures come from this checkout's ``tests/``.
Nothing leaves the test bridge; everything is stopped by PID and removed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))

from support.hostimage import HostImage
from support.pythons import PythonMirror, build_install_only
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.client.phases import Phase, Reporter
from skyward.providers.base import Allocation, ProvisionRequest

_WHEELS = Path.home() / ".cache" / "skyward-tests" / "wheels"
_MARKER = "::skyward:: "


class _Stamps:
    """A reporter that notes when each node reached each phase, and when node 0's bootstrap
    printed each command marker."""

    def __init__(self, inner: Reporter, start: float) -> None:
        self.inner, self.start = inner, start
        self.at: dict[tuple[int, str], float] = {}
        self.steps: list[tuple[float, str]] = []
        self.installed = 0.0  # when node 0's script said its environment was ready
        self.show = False  # print node 0's lines as they come
        self._lock = threading.Lock()  # guards: at, steps

    def phase(self, node: int, phase: Phase, detail: str = "") -> None:
        with self._lock:
            self.at.setdefault((node, phase), time.monotonic() - self.start)
        self.inner.phase(node, phase, detail)

    def log(self, node: int, line: str) -> None:
        now = time.monotonic() - self.start
        if node == 0 and line.startswith(_MARKER):
            with self._lock:
                self.steps.append((now, line[len(_MARKER) :]))
        elif node == 0 and line.startswith("skyward: image ") and line.endswith(" installed"):
            self.installed = now
        if node == 0 and self.show:
            print(f"{now:7.2f} {line}")
        self.inner.log(node, line)

    def status(self, line: str) -> None:
        self.inner.status(line)

    def chosen(self, choice: Any) -> None:
        self.inner.chosen(choice)


class _Timed:
    """``sky.SSH`` with its reports timestamped."""

    def __init__(self, inner: sky.SSH, start: float) -> None:
        self.inner, self.start = inner, start
        self.stamps: _Stamps | None = None
        self.provisioned = 0.0
        self.show = False

    @property
    def kind(self) -> str:
        return self.inner.kind

    def check(self, request: ProvisionRequest) -> None:
        self.inner.check(request)

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        self.stamps = _Stamps(reporter, self.start)
        self.stamps.show = self.show
        allocation = self.inner.provision(request, self.stamps)
        self.provisioned = time.monotonic() - self.start
        return allocation

    def inventory(self) -> Any:
        return None


def _step_name(command: str) -> str:
    """A short name for a bootstrap command."""
    for key, name in (
        ("install uv", "install uv"),
        ("-m venv", "tools venv + pip install uv"),
        ("--managed-python", "uv venv (managed CPython)"),
        ("venv", "uv venv"),
        ("pip install", "uv pip install"),
    ):
        if key in command:
            return name
    return command[:40]


def one_round(nodes: int, image_kind: str, show: bool = False) -> dict[str, Any]:
    image = HostImage(python="3.12", unzip=False) if image_kind == "ubuntu" else HostImage()
    hosts = Hosts.start(nodes, image=image)
    index = PackageIndex(hosts.root / "index", hosts.bridge_address)
    mirror = PythonMirror(
        hosts.root / "mirror",
        [build_install_only("{}.{}".format(*sys.version_info[:2]))],
        bind=hosts.bridge_address,
    )
    try:
        pins = [f"{n}=={metadata.version(n)}" for n in ("cloudpickle", "pydantic")]
        index.download([*pins, f"uv=={metadata.version('uv')}"], _WHEELS)
        options: dict[str, Any] = {"index_url": index.url}
        if "python_mirror" in sky.Image.model_fields:  # an older skyward has no mirror
            options |= {"python_mirror": mirror.url, "python_downloads_json_url": mirror.json_url}
        provider = sky.SSH(
            hosts=[h.target for h in hosts.hosts],
            key=hosts.client_key,
            known_hosts=hosts.known_hosts,
        )
        start = time.monotonic()
        timed = _Timed(provider, start)
        timed.show = show
        with sky.ComputePool(
            provider=timed,  # type: ignore[arg-type]
            nodes=nodes,
            image=sky.Image(**options),
            quiet=True,
        ) as pool:
            ready = time.monotonic() - start
            assert len(pool.broadcast(os.getpid)) == nodes
        stamps = timed.stamps
        assert stamps is not None
        steps: dict[str, float] = {}
        begun = stamps.at[(0, "bootstrapping")]
        marks = [(begun, "(before the first command)"), *stamps.steps, (stamps.installed, "")]
        for (at, command), (after, _) in itertools.pairwise(marks):
            name = _step_name(command)
            steps[name] = steps.get(name, 0.0) + after - at
        return {
            "connect": max(stamps.at[(n, "bootstrapping")] for n in range(nodes)),
            "bootstrap": timed.provisioned,
            "ready": ready,
            "steps": steps,
        }
    finally:
        mirror.close()
        index.close()
        hosts.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hosts", choices=["debian", "ubuntu"], default="debian")
    parser.add_argument("--show", action="store_true", help="print node 0's bootstrap")
    args = parser.parse_args()
    samples = [one_round(args.nodes, args.hosts, args.show) for _ in range(args.rounds)]
    print(f"\nskyward from {Path(sky.__file__).parent}, {args.hosts} hosts, {args.nodes} nodes")
    print(f"median seconds from ComputePool(...), cumulative ({args.rounds} rounds):")
    for phase in ("connect", "bootstrap", "ready"):
        values = [s[phase] for s in samples]
        print(f"  {phase:<10} {statistics.median(values):6.2f}  (min {min(values):.2f})")
    print("node 0's bootstrap, median seconds per step:")
    names = list(dict.fromkeys(n for s in samples for n in s["steps"]))
    for name in names:
        values = [s["steps"].get(name, 0.0) for s in samples]
        print(f"  {name:<30} {statistics.median(values):6.2f}")


if __name__ == "__main__":
    main()
