"""Fixtures of the Vast.ai provider's own tests: its API fake on loopback (``vast``), and on
the test bridge with stand-in hosts for the instances it rents (``vast_standins``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from support.clouds.vastai.fake import VastFake
from support.hostimage import HostImage, fake_nvidia_smi
from support.sshhosts import Hosts

if TYPE_CHECKING:
    from support.clouds.vastai.standins import VastStandIns


@pytest.fixture(scope="session")
def vast_server() -> Iterator[VastFake]:
    with VastFake() as fake:
        yield fake


@pytest.fixture
def vast(vast_server: VastFake, monkeypatch: pytest.MonkeyPatch) -> VastFake:
    """The fake on loopback, with eight RTX 4090 offers; no key in this process's
    environment (each test gives the provider its key)."""
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    vast_server.reset()
    return vast_server


@pytest.fixture(scope="session")
def vast_bridge(ssh_hosts: Hosts) -> Iterator[VastFake]:
    """The fake on the test bridge, beside the stand-ins."""
    with VastFake(host=ssh_hosts.bridge_address) as fake:
        yield fake


@pytest.fixture
def vast_standins(vast_bridge: VastFake, ssh_hosts: Hosts) -> Iterator[VastStandIns]:
    from support.clouds.vastai.standins import VastStandIns

    vast_bridge.reset()
    # A Vast container sees its host's GPU through the NVIDIA runtime: nvidia-smi lists it.
    gpu = fake_nvidia_smi(1, "NVIDIA GeForce RTX 4090")
    cloud = VastStandIns(vast_bridge, ssh_hosts, HostImage(tools={"nvidia-smi": gpu}))
    try:
        yield cloud
    finally:
        cloud.close()
    assert not cloud.leftovers(), f"stand-ins left behind: {cloud.leftovers()}"
