"""The RunPod provider end to end: the fake of RunPod's APIs rents the pods, stand-in
containers (network-namespace hosts in sandboxes, with no cloud-init) run each pod's start
command as RunPod runs it, and the pool reaches them on the public port RunPod maps to their
port 22 (a forwarder on the test bridge, never 22)."""

from __future__ import annotations

import os
import time

import pytest
from support.clouds.runpod.standins import RunPodStandIns, standin_provider
from support.pools import broadcast_in_background
from support.sshhosts import PackageIndex

import skyward as sky


@sky.compute
def square(x: int) -> tuple[int, str]:
    return x * x, os.uname().nodename


@pytest.mark.timeout(300)
def test_a_map_over_two_pods_returns_its_results_and_leaves_nothing(
    runpod_standins: RunPodStandIns, package_index: PackageIndex
) -> None:
    fake = runpod_standins.fake
    with sky.ComputePool(
        provider=standin_provider(runpod_standins),
        accelerator="RTX_4090",
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        name="runpod-map",
        quiet=True,
    ) as pool:
        pods = {p["id"] for p in fake.live()}
        ports = {int(p["portMappings"]["22"]) for p in fake.live()}
        results = list(pool.map(square, range(8)))
        names = pool.broadcast(lambda: os.uname().nodename)
    assert [value for value, _ in results] == [x * x for x in range(8)]
    assert {runpod_standins.pod_of(name) for name in names} == pods and len(pods) == 2
    assert 22 not in ports and len(ports) == 2  # SSH through RunPod's mapped ports
    assert fake.live() == []
    runpod_standins.wait_for(
        lambda: all(s.ended for s in runpod_standins.standins.values()),
        30,
        "stand-ins stopped when their pods were terminated",
    )


def _sleep_on(rank: int) -> None:
    if sky.instance_info().node == rank:
        time.sleep(600)


@pytest.mark.timeout(300)
def test_an_interrupted_spot_pod_is_named_in_worker_lost_and_replaced(
    runpod_standins: RunPodStandIns, package_index: PackageIndex
) -> None:
    fake = runpod_standins.fake
    with sky.ComputePool(
        provider=standin_provider(runpod_standins, spot=True, boot_timeout=60),
        accelerator="RTX_4090",
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        name="runpod-outbid",
        quiet=True,
    ) as pool:
        before = pool.broadcast(lambda: os.uname().nodename)
        lost = runpod_standins.pod_of(before[1])
        in_flight = broadcast_in_background(pool, _sleep_on, 1)
        time.sleep(0.5)
        fake.interrupt(lost)  # outbid: RunPod stops node 1's pod
        failure = in_flight.exception(timeout=120)
        assert isinstance(failure, sky.WorkerLost)
        assert f"pod {lost} is EXITED: interrupted: RunPod stopped this spot pod" in str(failure)
        end = time.monotonic() + 180
        while pool.statistics().ready_nodes < 2 or len(runpod_standins.standins) < 3:
            assert time.monotonic() < end, runpod_standins.events
            time.sleep(0.2)
        after = pool.broadcast(lambda: os.uname().nodename)
        rents = fake.requests("podRentInterruptable")
    assert after[0] == before[0] and after[1] not in before
    assert len(rents) == 3 and rents[2]["input"]["name"].endswith("-n1-r1")
    assert all(r["input"]["bidPerGpu"] == 0.2 for r in rents)
    assert fake.live() == []
