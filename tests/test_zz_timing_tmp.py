from __future__ import annotations

import time

from support.aws import request
from support.gcpcloud import GCPStandIns
from support.gcpcloud import standin_provider as gcp
from support.sshhosts import PackageIndex

import skyward as sky


class Stamped:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.events: list[tuple[float, str]] = []

    def phase(self, node: int, phase: str, detail: str = "") -> None:
        self.events.append((time.monotonic() - self.t0, f"node {node} {phase} {detail[:60]}"))

    def log(self, node: int, line: str) -> None:
        pass

    def status(self, line: str) -> None:
        self.events.append((time.monotonic() - self.t0, f"status {line[:90]}"))


def test_timing(gcp_standins: GCPStandIns, package_index: PackageIndex) -> None:
    for delay in (0.0, 2.0):
        gcp_standins.fake.operation_delay = delay
        for attempt in range(2):
            stamped = Stamped()
            made = request(image=sky.Image(index_url=package_index.url))
            allocation = gcp(gcp_standins).provision(made, stamped)
            provisioned = time.monotonic() - stamped.t0
            t = time.monotonic()
            allocation.terminate()
            print(f"\n== op delay {delay}, run {attempt}: provision {provisioned:.2f}s, terminate {time.monotonic() - t:.2f}s")
            for at, what in stamped.events:
                print(f"  {at:6.2f}  {what}")
        t = time.monotonic()
        with sky.ComputePool(provider=gcp(gcp_standins), nodes=2,
                             image=sky.Image(index_url=package_index.url), quiet=True) as pool:
            ready = time.monotonic() - t
            pool.broadcast(lambda: 1)
            t2 = time.monotonic()
        print(f"== op delay {delay}: ComputePool ready {ready:.2f}s, close {time.monotonic() - t2:.2f}s")
