"""Fixtures of the Lambda provider's own tests: the fake of Lambda's API on loopback (the
stand-in tests use the one on the test bridge, ``lambda_standins``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.clouds.lambdacloud.fake import LambdaFake
from support.clouds.lambdacloud.standins import LambdaStandIns
from support.sshhosts import Hosts


@pytest.fixture(scope="session")
def lambda_server() -> Iterator[LambdaFake]:
    with LambdaFake() as fake:
        yield fake


@pytest.fixture
def lam(lambda_server: LambdaFake, monkeypatch: pytest.MonkeyPatch) -> LambdaFake:
    """The fake on loopback, empty; no key in the environment (each test gives its own)."""
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    lambda_server.reset()
    return lambda_server


@pytest.fixture(scope="session")
def lambda_bridge(ssh_hosts: Hosts) -> Iterator[LambdaFake]:
    """The fake on the test bridge, beside the stand-ins."""
    with LambdaFake(host=ssh_hosts.bridge_address) as fake:
        yield fake


@pytest.fixture
def lambda_standins(lambda_bridge: LambdaFake, ssh_hosts: Hosts) -> Iterator[LambdaStandIns]:
    """The bridge's fake with stand-in VMs for the instances it runs."""
    lambda_bridge.reset()
    cloud = LambdaStandIns.start(lambda_bridge, ssh_hosts)
    try:
        yield cloud
    finally:
        cloud.close()
    assert not cloud.leftovers(), f"stand-ins left behind: {cloud.leftovers()}"
