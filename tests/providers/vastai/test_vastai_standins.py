"""The Vast.ai provider end to end: the fake rents the instances, stand-in hosts run each
rent's start command the way Vast runs a container (as its main process, as root), and the
pool reaches them through a published port that is not 22, on an address they share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.clouds.vastai.standins import VastStandIns, provider
from support.pools import broadcast_in_background
from support.reporter import Recorder
from support.sshhosts import PackageIndex

import skyward as sky


def _square(x: int) -> tuple[int, str]:
    return x * x, os.uname().nodename


@pytest.mark.timeout(300)
def test_a_map_over_two_rented_instances_returns_every_result_and_leaves_nothing(
    vast_standins: VastStandIns, package_index: PackageIndex
) -> None:
    fake = vast_standins.fake
    with sky.ComputePool(
        provider=provider(fake),
        accelerator="RTX_4090",
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        name="vast-map",
        quiet=True,
    ) as pool:
        results = list(pool.map(_square, range(12)))
        live = fake.live()
        names = pool.broadcast(lambda: os.uname().nodename)
    assert [value for value, _ in results] == [x * x for x in range(12)]
    assert {host for _, host in results} <= set(names) and len(set(names)) == 2
    ports = [int(i["ports"]["22/tcp"][0]["HostPort"]) for i in live]
    assert all(port != 22 for port in ports) and len(set(ports)) == 2
    assert {i["public_ipaddr"].strip() for i in live} == {vast_standins.hosts.bridge_address}
    assert fake.live() == [] and fake.ssh_keys == []
    vast_standins.wait_for(
        lambda: all(s.ended for s in vast_standins.standins.values()),
        30,
        "the containers ended when their instances were destroyed",
    )


def _sleep_on(rank: int) -> None:
    if sky.instance_info().node == rank:
        time.sleep(600)


@pytest.mark.timeout(300)
def test_an_outbid_interruptible_instance_is_worker_lost_saying_so_and_replaced(
    vast_standins: VastStandIns, package_index: PackageIndex
) -> None:
    fake = vast_standins.fake
    with sky.ComputePool(
        provider=provider(fake, boot_timeout=90),
        accelerator="RTX_4090",
        nodes=2,
        allocation="spot",
        image=sky.Image(index_url=package_index.url),
        name="vast-outbid",
        quiet=True,
    ) as pool:
        before = pool.broadcast(lambda: os.uname().nodename)
        first = {str(i["id"]): i for i in fake.live()}
        (lost,) = [id for id, i in first.items() if i["label"].endswith("-node-1")]
        in_flight = broadcast_in_background(pool, _sleep_on, 1)
        time.sleep(0.5)
        fake.interrupt(int(lost))
        failure = in_flight.exception(timeout=120)
        assert isinstance(failure, sky.WorkerLost)
        assert f"instance {lost} is stopped: interrupted by Vast.ai: outbid" in str(failure)
        end = time.monotonic() + 180
        while pool.statistics().ready_nodes < 2 or len(vast_standins.standins) < 3:
            assert time.monotonic() < end, vast_standins.events
            time.sleep(0.2)
        after = pool.broadcast(lambda: os.uname().nodename)
        (replacement,) = [i for i in fake.live() if str(i["id"]) not in first]
        assert replacement["label"].endswith("-node-1-r1") and replacement["is_bid"]
    assert after[0] == before[0] and after[1] != before[1]
    assert fake.live() == []


_CLIENT = """
import time
import skyward as sky
vast = sky.VastAI(**{settings!r})
with sky.ComputePool(provider=vast, nodes=2, image=sky.Image(index_url={index!r}),
                     name="vast-orphan", console="plain") as pool:
    print("READY", flush=True)
    pool.broadcast(time.sleep, 3600)  # a long job, its client attached
"""


@pytest.mark.timeout(300)
def test_a_killed_clients_containers_end_themselves_and_down_destroys_them(
    vast_standins: VastStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    fake = vast_standins.fake
    settings = provider(fake, idle_timeout=3, boot_timeout=120).model_dump(exclude_defaults=True)
    script = _CLIENT.format(settings=settings, index=package_index.url)
    log = tmp_path / "client.log"
    with open(log, "wb") as out:
        client = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=out,
            stderr=out,
            env={**os.environ, "TMPDIR": str(tmp_path)},  # its pool key, once it is killed
        )
    try:
        end = time.monotonic() + 240
        while "READY" not in log.read_text():
            assert client.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.1)
        time.sleep(6)  # well past idle_timeout, its client attached: nothing ends
        assert all(not s.ended for s in vast_standins.standins.values()), vast_standins.events
    finally:
        client.kill()
        client.wait(30)
    ids = sorted(str(i["id"]) for i in fake.live())
    assert len(ids) == 2
    vast_standins.wait_for(
        lambda: all(vast_standins.standins[id].ended for id in ids),
        90,
        "the watchdog ended each container's main process",
    )
    assert {i["actual_status"] for i in fake.live()} == {"exited"}  # kept: its disk billed
    for id in ids:
        said = vast_standins.standins[id].directory / "var-log" / "skyward-watchdog.log"
        assert "running /usr/local/sbin/skyward-end-container" in said.read_text()
    inventory = provider(fake).inventory()
    assert inventory is not None
    found = inventory.leftovers(pool="vast-orphan")
    assert sorted(x.id for x in found) == ids and {x.state for x in found} == {"exited"}
    inventory.delete(found, Recorder())
    assert fake.live() == []


@pytest.mark.timeout(300)
def test_instances_kept_warm_are_adopted_by_the_next_pool_and_its_close_destroys_them(
    vast_standins: VastStandIns, package_index: PackageIndex
) -> None:
    fake = vast_standins.fake

    def pool(name: str, **options: float) -> sky.ComputePool:
        return sky.ComputePool(
            provider=provider(fake),
            accelerator="RTX_4090",
            nodes=2,
            image=sky.Image(index_url=package_index.url),
            name=name,
            quiet=True,
            **options,
        )

    with pool("vast-warm", keep_warm=300) as first:
        before = first.broadcast(lambda: os.uname().nodename)
        rented = {i["id"] for i in fake.live()}
    assert {i["id"] for i in fake.live()} == rented  # kept: still rented
    started = time.monotonic()
    with pool("vast-next") as second:
        ready = time.monotonic() - started
        after = second.broadcast(lambda: os.uname().nodename)
        assert {i["id"] for i in fake.live()} == rented  # nothing rented anew
    print(f"\nwarm start, 2 instances on Vast.ai stand-ins: ready in {ready:.2f} s")
    assert after == before
    assert fake.live() == [] and fake.ssh_keys == []
