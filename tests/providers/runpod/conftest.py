"""Fixtures of the RunPod provider's tests: the fake of RunPod's APIs on loopback, and
stand-in pods for it on the SSH hosts' bridge."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.clouds.runpod.fake import RunPodFake
from support.clouds.runpod.standins import RunPodStandIns
from support.sshhosts import Hosts


@pytest.fixture(scope="session")
def runpod_server() -> Iterator[RunPodFake]:
    with RunPodFake() as fake:
        yield fake


@pytest.fixture
def fake(runpod_server: RunPodFake) -> RunPodFake:
    """The fake, emptied."""
    runpod_server.reset()
    return runpod_server


@pytest.fixture
def runpod_standins(fake: RunPodFake, ssh_hosts: Hosts) -> Iterator[RunPodStandIns]:
    """The fake with stand-in containers for the pods it runs."""
    cloud = RunPodStandIns.start(fake, ssh_hosts)
    try:
        yield cloud
    finally:
        cloud.close()
    assert not cloud.leftovers(), f"stand-ins left behind: {cloud.leftovers()}"
