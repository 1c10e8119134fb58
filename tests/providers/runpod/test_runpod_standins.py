"""The RunPod provider end to end: the fake of RunPod's APIs rents the pods, stand-in
containers (network-namespace hosts in sandboxes, with no cloud-init) run each pod's start
command as RunPod runs it, and the pool reaches them on the public port RunPod maps to their
port 22 (a forwarder on the test bridge, never 22). The scenarios are the stand-in
contract's (``support/standin_contract.py``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import standin_contract as contract
from support.clouds.aws.standins import StandIn
from support.clouds.runpod.fake import KEY
from support.clouds.runpod.standins import RunPodStandIns, standin_provider
from support.sshhosts import PackageIndex
from support.standin_contract import Cloud

import skyward as sky


def runpod_cloud(cloud: RunPodStandIns) -> Cloud:
    """The fake of RunPod's APIs and its stand-in containers (each named after its pod), for
    the stand-in contract."""
    fake = cloud.fake

    def pods(pool: str) -> list[str]:
        return [p["id"] for p in fake.live(f"skyward-{pool}-")]

    return Cloud(
        name="runpod",
        standins=cloud,
        provider=lambda **options: standin_provider(cloud, **options),
        machines=pods,
        left=lambda pool: {"pods": pods(pool)},
        hostname=lambda standin: standin.instance,
        accelerator="RTX_4090",
        client_provider="sky.RunPod(**settings)",
        cli_env={"RUNPOD_API_KEY": KEY, "SKYWARD_RUNPOD_ENDPOINT": fake.url},
        cli_args=("--cloud", "runpod"),
    )


@pytest.mark.timeout(300)
def test_a_map_over_two_pods_kept_warm_adopted_and_the_adopter_leaves_nothing(
    runpod_standins: RunPodStandIns, package_index: PackageIndex
) -> None:
    fake = runpod_standins.fake

    def inside(pool: sky.ComputePool) -> None:
        pods = {p["id"] for p in fake.live()}
        ports = {int(p["portMappings"]["22"]) for p in fake.live()}
        names = contract.nodenames(pool)
        assert {runpod_standins.pod_of(name) for name in names} == pods and len(pods) == 2
        assert 22 not in ports and len(ports) == 2  # SSH through RunPod's mapped ports

    contract.runs_kept_warm_and_adopted(
        runpod_cloud(runpod_standins), package_index, contract.a_map, inside=inside
    )
    assert fake.live() == []


@pytest.fixture
def seen_by_pods() -> Iterator[Path]:
    """A directory the pods see too, for the test's markers: each has a /tmp of its own."""
    path = Path(tempfile.mkdtemp(prefix="skyward-runpod-markers-", dir="/var/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(300)
def test_an_interrupted_spot_pod_is_named_in_worker_lost_and_replaced(
    runpod_standins: RunPodStandIns, package_index: PackageIndex, seen_by_pods: Path
) -> None:
    fake = runpod_standins.fake

    def take_away(lost: StandIn) -> str:
        pod = runpod_standins.pod_of(lost.instance)
        fake.interrupt(pod)  # outbid: RunPod stops node 1's pod
        return f"pod {pod} is EXITED: interrupted: RunPod stopped this spot pod"

    def inside(lost: StandIn, replacement: StandIn) -> None:
        rents = fake.requests("podRentInterruptable")
        assert len(rents) == 3 and rents[2]["input"]["name"].endswith("-n1-r1")
        assert all(r["input"]["bidPerGpu"] == 0.2 for r in rents)

    replaced = contract.lost_machine_is_replaced(
        runpod_cloud(runpod_standins),
        package_index,
        seen_by_pods,
        take_away,
        inside=inside,
        provider={"spot": True, "boot_timeout": 60},
    )
    assert replaced.after[1] not in replaced.before
    assert fake.live() == []


# ── a client killed: the watchdog ends its containers; skyward ls / down the pods ────────


@pytest.mark.timeout(300)
def test_a_killed_clients_containers_end_themselves_and_down_terminates_their_pods(
    runpod_standins: RunPodStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    fake = runpod_standins.fake

    def after_the_watchdog() -> None:
        pods = fake.live()
        # RunPod keeps a stopped pod (and bills its volume): EXITED until it is terminated.
        assert [p["desiredStatus"] for p in pods] == ["EXITED", "EXITED"]
        assert all(p["volumeInGb"] == 0 for p in pods)

    def listed(stdout: str) -> None:
        rows = [line for line in stdout.splitlines() if line.startswith("runpod ")]
        assert len(rows) == 2 and all("exited" in row for row in rows), stdout

    contract.killed_clients_machines_end_themselves(
        runpod_cloud(runpod_standins),
        package_index,
        tmp_path,
        ended_as=frozenset({"signal-TERM"}),
        after_the_watchdog=after_the_watchdog,
        listed=listed,
        # An idle bound short enough for a test, long enough that a loaded machine's pauses
        # in the watchdog's reading of /proc/net/tcp never read as an absent client.
        idle_timeout=6,
        attached=12,
    )
    assert fake.live() == []
