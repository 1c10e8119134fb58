"""Fixtures of the provider tests (``tests/providers/`` and its clouds' folders): the clouds
whose stand-ins the contract suite (``test_providers.py``) and each cloud's end-to-end tests
both use, and the Slurm testbed that the contract suite and ``slurm/`` both start.

Each is started on first use and stopped by the fixture; the stand-ins join the SSH hosts'
bridge (``ssh_hosts``, in ``tests/conftest.py``), where the fakes listen so that a stand-in's
watchdog can call its cloud.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support.clouds.gcp.fake import GCPFake
from support.clouds.gcp.standins import GCPStandIns, MetadataServer
from support.slurm import SlurmCluster, slurm_cluster_fixture
from support.sshhosts import Hosts, PackageIndex

if TYPE_CHECKING:
    from support.clouds.azure.fake import AzureFake
    from support.clouds.azure.standins import AzureStandIns
    from support.clouds.vastai.fake import VastFake
    from support.clouds.vastai.standins import VastStandIns

_WHEEL_CACHE = Path.home() / ".cache" / "skyward-tests" / "wheels"


# ── the fake Azure Resource Manager, and stand-in VMs for its VMs ──────────────────────


@pytest.fixture(scope="session")
def azure_bridge_fake(ssh_hosts: Hosts) -> Iterator[AzureFake]:
    """The fake ARM server listening on the test bridge, where stand-in VMs reach it too
    (their watchdog calls it to delete their VM)."""
    from support.clouds.azure.fake import AzureFake

    with AzureFake(host=ssh_hosts.bridge_address) as fake:
        yield fake


@pytest.fixture
def azure_standins(azure_bridge_fake: AzureFake, ssh_hosts: Hosts) -> Iterator[AzureStandIns]:
    """The fake ARM server, emptied, with stand-in VMs for the VMs it runs."""
    from support.clouds.azure.standins import AzureStandIns

    azure_bridge_fake.reset()
    azure_bridge_fake.operation_polls, azure_bridge_fake.operation_seconds = 1, 1.0
    cloud = AzureStandIns(moto=None, hosts=ssh_hosts, fake=azure_bridge_fake)
    try:
        yield cloud
    finally:
        cloud.close()
    assert not cloud.leftovers(), f"stand-ins left behind: {cloud.leftovers()}"
    assert not azure_bridge_fake.errors, azure_bridge_fake.errors[0]


@pytest.fixture(scope="session")
def gce_bridge(ssh_hosts: Hosts) -> Iterator[tuple[GCPFake, MetadataServer]]:
    """A Compute Engine fake and a metadata server on the test bridge, where stand-ins can
    call them (the watchdog's hook deletes its own instance)."""
    with GCPFake(host=ssh_hosts.bridge_address) as fake, pytest.MonkeyPatch.context() as patch:
        for name, value in fake.environ().items():
            patch.setenv(name, value)
        metadata = MetadataServer(fake, ssh_hosts.bridge_address)
        try:
            yield fake, metadata
        finally:
            metadata.close()


@pytest.fixture
def gcp_standins(
    gce_bridge: tuple[GCPFake, MetadataServer], ssh_hosts: Hosts
) -> Iterator[GCPStandIns]:
    """The bridge's Compute Engine fake with stand-in VMs for the instances it runs."""
    fake, metadata = gce_bridge
    fake.reset()
    cloud = GCPStandIns.start(fake, ssh_hosts, metadata=metadata)
    try:
        yield cloud
    finally:
        cloud.close()
    assert not cloud.leftovers(), f"stand-ins left behind: {cloud.leftovers()}"


# ── the Slurm testbed ─────────────────────────────────────────────────────────────────────

# Module-scoped: each module that asks for it starts a cluster of its own (a login host, a
# controller, two compute nodes), as each did when it held this line itself.
slurm_cluster = slurm_cluster_fixture(nodes=2)


@pytest.fixture(scope="module")
def slurm_index(slurm_cluster: SlurmCluster) -> Iterator[PackageIndex]:
    """What the compute nodes install from: the worker's needs, uv, jax."""
    served = PackageIndex(slurm_cluster.root / "index", slurm_cluster.bridge_address)
    try:
        names = ("cloudpickle", "pydantic", "jax", "jaxlib", "packaging")
        served.download([*(f"{n}=={metadata.version(n)}" for n in names), "uv"], _WHEEL_CACHE)
        yield served
    finally:
        served.close()


# ── the Vast.ai fake, and stand-in hosts for its instances ─────────────────────────────


@pytest.fixture(scope="session")
def vast_bridge(ssh_hosts: Hosts) -> Iterator[VastFake]:
    """The Vast.ai fake on the test bridge, beside the stand-ins."""
    from support.clouds.vastai.fake import VastFake

    with VastFake(host=ssh_hosts.bridge_address) as fake:
        yield fake


@pytest.fixture
def vast_standins(vast_bridge: VastFake, ssh_hosts: Hosts) -> Iterator[VastStandIns]:
    """The bridge's Vast.ai fake, emptied, with stand-in hosts for the instances it rents."""
    from support.clouds.vastai.standins import VastStandIns
    from support.hostimage import HostImage, fake_nvidia_smi

    vast_bridge.reset()
    # A Vast container sees its host's GPU through the NVIDIA runtime: nvidia-smi lists it.
    gpu = fake_nvidia_smi(1, "NVIDIA GeForce RTX 4090")
    cloud = VastStandIns(vast_bridge, ssh_hosts, HostImage(tools={"nvidia-smi": gpu}))
    try:
        yield cloud
    finally:
        cloud.close()
    assert not cloud.leftovers(), f"stand-ins left behind: {cloud.leftovers()}"
