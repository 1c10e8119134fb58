import time
from typing import Any
import pytest
from support.azure_pools import standin_provider as azure
import skyward as sky

class Timed:
    def __init__(self, inner: Any) -> None:
        self.inner, self.t0, self.events = inner, time.monotonic(), []
    @property
    def kind(self) -> str: return self.inner.kind
    def check(self, r: Any) -> None: self.inner.check(r)
    def inventory(self) -> Any: return self.inner.inventory()
    def provision(self, request: Any, reporter: Any) -> Any:
        outer = self
        class R:
            def phase(self, node, phase, detail=""):
                outer.events.append((time.monotonic() - outer.t0, f"node {node} {phase} {detail}"))
                reporter.phase(node, phase, detail)
            def log(self, node, line): reporter.log(node, line)
            def status(self, line):
                outer.events.append((time.monotonic() - outer.t0, "status " + line[:100]))
                reporter.status(line)
        a = self.inner.provision(request, R())
        self.events.append((time.monotonic() - self.t0, "provision returned"))
        return a

@sky.compute
def one() -> int:
    return 1

@pytest.mark.timeout(600)
def test_timing(azure_standins, package_index) -> None:
    p = Timed(azure(azure_standins))
    t0 = time.monotonic(); p.t0 = t0
    pool = sky.ComputePool(provider=p, nodes=2, image=sky.Image(index_url=package_index.url), quiet=True)
    pool.start()
    ready = time.monotonic() - t0
    one() @ pool
    t1 = time.monotonic()
    pool.close()
    closed = time.monotonic() - t1
    for t, e in p.events: print(f"{t:7.2f} {e}")
    print(f"ready {ready:.2f}  close {closed:.2f}")

@sky.compute
def whoami() -> tuple[int, str]:
    info = sky.instance_info()
    return info.node, info.provider

@pytest.mark.timeout(600)
def test_contract_like(azure_standins, package_index) -> None:
    from skyward.pool.spec import PoolSpec
    made = azure(azure_standins)
    image = sky.Image(index_url=package_index.url)
    t0 = time.monotonic()
    with sky.ComputePool(provider=made, nodes=2, image=image, quiet=True) as pool:
        print("ready", time.monotonic() - t0)
        assert sorted(whoami() @ pool) == [(0, made.kind), (1, made.kind)]
        print("called", time.monotonic() - t0)
    print("closed", time.monotonic() - t0)
