"""How long an AWS pool takes from ``ComputePool(...)`` to ready, by phase, against the moto
server and stand-in VMs (the test suite's fixtures: root and ``openssh-server`` needed).

::

    .venv/bin/python benchmarks/aws_start.py            # 2 and 8 nodes, 3 rounds each
    .venv/bin/python benchmarks/aws_start.py --nodes 4 --rounds 1

Per round: a fresh pool on fresh stand-ins (every machine bootstraps from nothing, as a new
VM does). The phases are timed from the provider's own reports, through a provider that
wraps ``sky.AWS`` and timestamps what it tells the pool:

    api          ComputePool(...) until every instance runs (key pair, group, run, wait)
    boot         until the last stand-in's sshd started: the machines' own boot, not ours
    connect      until the last node is connected over SSH (waiting for sshd included)
    bootstrap    until the last node's environment is ready and skyward uploaded
    workers      until the pool is ready (workers spawned, Hello, Start, Ready)

Nothing leaves loopback and the test bridge; everything is stopped by PID and removed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
os.environ.update(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_EC2_METADATA_DISABLED="true",
)

from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import held, nothing, standin_provider
from support.clouds.aws.standins import StandInCloud
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.client.phases import Phase, Reporter
from skyward.providers.base import Allocation, ProvisionRequest

_WHEELS = Path.home() / ".cache" / "skyward-tests" / "wheels"


class _Stamps:
    """A reporter that notes when each node first reached each phase, then passes it on."""

    def __init__(self, inner: Reporter, start: float) -> None:
        self.inner, self.start = inner, start
        self.at: dict[tuple[int, str], float] = {}
        self.done: float | None = None
        self._lock = threading.Lock()  # guards: at

    def phase(self, node: int, phase: Phase, detail: str = "") -> None:
        with self._lock:
            self.at.setdefault((node, phase), time.monotonic() - self.start)
        self.inner.phase(node, phase, detail)

    def log(self, node: int, line: str) -> None:
        self.inner.log(node, line)

    def status(self, line: str) -> None:
        self.inner.status(line)

    def chosen(self, choice: Any) -> None:
        self.inner.chosen(choice)

    def last(self, phase: str, nodes: int) -> float:
        return max(self.at[(n, phase)] for n in range(nodes))


class _Timed:
    """``sky.AWS`` with its reports timestamped."""

    def __init__(self, inner: sky.AWS, start: float) -> None:
        self.inner, self.start = inner, start
        self.stamps: _Stamps | None = None

    @property
    def kind(self) -> str:
        return self.inner.kind

    def check(self, request: ProvisionRequest) -> None:
        self.inner.check(request)

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        self.stamps = _Stamps(reporter, self.start)
        allocation = self.inner.provision(request, self.stamps)
        self.stamps.done = time.monotonic() - self.start
        return allocation

    def inventory(self) -> Any:
        return self.inner.inventory()


def one_round(cloud: StandInCloud, index: PackageIndex, nodes: int) -> dict[str, float]:
    start = time.monotonic()
    provider = _Timed(standin_provider(cloud), start)
    pool_name = f"bench-{nodes}-{int(start)}"
    with sky.ComputePool(
        provider=provider,
        nodes=nodes,
        image=sky.Image(index_url=index.url),
        name=pool_name,
        quiet=True,
    ) as pool:
        ready = time.monotonic() - start
        assert len(pool.broadcast(os.getpid)) == nodes
    stamps = provider.stamps
    assert stamps is not None and stamps.done is not None
    booted = [cloud.booted_at[s.instance] - start for s in cloud.standins.values()]
    cloud.wait_for(lambda: all(s.ended for s in cloud.standins.values()), 60, "stand-ins down")
    assert nothing(held(cloud.moto, pool_name))
    return {
        "api": stamps.last("connecting", nodes),
        "boot": max(booted),
        "connect": stamps.last("bootstrapping", nodes),
        "bootstrap": stamps.done,
        "workers": ready,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    moto = MotoServer()
    hosts = Hosts.start(0)  # the bridge only; stand-ins join it
    index = PackageIndex(hosts.root / "index", hosts.bridge_address)
    try:
        pins = [f"{n}=={metadata.version(n)}" for n in ("cloudpickle", "pydantic")]
        index.download([*pins, "uv"], _WHEELS)
        rows = []
        for nodes in args.nodes:
            samples = []
            for _ in range(args.rounds):
                moto.reset()
                moto.seed_ami()
                with StandInCloud(moto, hosts) as cloud:
                    samples.append(one_round(cloud, index, nodes))
            rows.append((nodes, samples))
        print(f"\nmedian seconds from ComputePool(...), cumulative (rounds: {args.rounds})")
        print("nodes  api    boot   connect  bootstrap  workers(ready)")
        for nodes, samples in rows:
            med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
            print(
                f"{nodes:<6} {med['api']:<6.2f} {med['boot']:<6.2f} {med['connect']:<8.2f} "
                f"{med['bootstrap']:<10.2f} {med['workers']:.2f}"
            )
    finally:
        index.close()
        hosts.close()
        moto.close()


if __name__ == "__main__":
    main()
