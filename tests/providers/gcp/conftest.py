"""Fixtures of the GCP provider's own tests: the Compute Engine fake on loopback, which only
``test_gcp.py`` uses (the stand-in tests and the contract suite use the one on the bridge,
``gce_bridge`` in ``tests/providers/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.clouds.gcp.fake import GCPFake
from support.clouds.gcp.standins import MetadataServer
from support.clouds.gcp.tpu_fake import TPUFake
from support.clouds.gcp.tpu_standins import TPUStandIns
from support.sshhosts import Hosts

# ── the Compute Engine fake ─────────────────────────────────────────────────────────────


@pytest.fixture(scope="session")
def gce_server() -> Iterator[GCPFake]:
    with GCPFake() as fake, pytest.MonkeyPatch.context() as patch:
        for name, value in fake.environ().items():  # no metadata server for google.auth
            patch.setenv(name, value)
        yield fake


@pytest.fixture
def gce(gce_server: GCPFake) -> GCPFake:
    """The Compute Engine fake on loopback, empty, operations done at once."""
    gce_server.reset()
    return gce_server


# ── the Cloud TPU fake ──────────────────────────────────────────────────────────────────


@pytest.fixture
def tpu(gce_server: GCPFake) -> Iterator[TPUFake]:
    """The Cloud TPU fake on loopback, empty (beside the Compute Engine one, for the rules)."""
    with TPUFake() as fake:
        yield fake


@pytest.fixture(scope="session")
def tpu_bridge(ssh_hosts: Hosts) -> Iterator[TPUFake]:
    """The Cloud TPU fake on the test bridge: its hosts' addresses are in the bridge's subnet."""
    with TPUFake(host=ssh_hosts.bridge_address, subnet=ssh_hosts.subnet) as fake:
        yield fake


@pytest.fixture
def tpu_standins(
    tpu_bridge: TPUFake, gce_bridge: tuple[GCPFake, MetadataServer], ssh_hosts: Hosts
) -> Iterator[TPUStandIns]:
    """The bridge's TPU fake (and Compute Engine fake, for the rules) with a stand-in host
    per TPU host."""
    gce_bridge[0].reset()
    tpu_bridge.reset()
    cloud = TPUStandIns.start_tpu(tpu_bridge, ssh_hosts, fake=gce_bridge[0])
    try:
        yield cloud
    finally:
        cloud.close()
    assert not cloud.leftovers(), f"stand-ins left behind: {cloud.leftovers()}"
