"""Fixtures of the Verda provider's tests: the REST API fake on loopback (``verda``), and the
fake on the test bridge with stand-in VMs for its instances (``verda_standins``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.clouds.verda.fake import VerdaFake
from support.clouds.verda.standins import VerdaStandIns
from support.sshhosts import Hosts


@pytest.fixture(scope="session")
def verda_server() -> Iterator[VerdaFake]:
    with VerdaFake() as fake:
        yield fake


@pytest.fixture
def verda(verda_server: VerdaFake) -> VerdaFake:
    """The fake on loopback, emptied; instances pass each state in two reads."""
    verda_server.reset()
    return verda_server


@pytest.fixture(scope="session")
def verda_bridge(ssh_hosts: Hosts) -> Iterator[VerdaFake]:
    with VerdaFake(host=ssh_hosts.bridge_address) as fake:
        yield fake


@pytest.fixture
def verda_standins(verda_bridge: VerdaFake, ssh_hosts: Hosts) -> Iterator[VerdaStandIns]:
    """The bridge's fake, emptied, with stand-in VMs for the instances it runs."""
    verda_bridge.reset()
    cloud = VerdaStandIns.start(verda_bridge, ssh_hosts)
    try:
        yield cloud
    finally:
        cloud.close()
    assert not cloud.leftovers(), f"stand-ins left behind: {cloud.leftovers()}"
