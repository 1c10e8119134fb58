"""The Vast.ai provider end to end: the fake rents the instances, stand-in hosts run each
rent's start command the way Vast runs a container (as its main process, as root), and the
pool reaches them through a published port that is not 22, on an address they share. The
scenarios are the stand-in contract's (``support/standin_contract.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import standin_contract as contract
from support.clouds.aws.standins import StandIn
from support.clouds.vastai.fake import KEY
from support.clouds.vastai.standins import VastStandIns, provider
from support.sshhosts import PackageIndex
from support.standin_contract import Cloud

import skyward as sky


def vast_cloud(cloud: VastStandIns) -> Cloud:
    """The Vast.ai fake and its stand-in containers, for the stand-in contract."""
    fake = cloud.fake

    def instances(pool: str) -> list[str]:
        return [str(i["id"]) for i in fake.live(f"skyward-{pool}-")]

    return Cloud(
        name="vast",
        standins=cloud,
        provider=lambda **options: provider(fake, **options),
        machines=instances,
        left=lambda pool: {"instances": instances(pool)},
        hostname=lambda standin: "c-" + standin.address.replace(".", "-"),
        accelerator="RTX_4090",
        client_provider="sky.VastAI(**settings)",
        cli_env={"VAST_API_KEY": KEY, "SKYWARD_VASTAI_ENDPOINT": fake.url},
        cli_args=("--cloud", "vastai"),
    )


@pytest.mark.timeout(300)
def test_a_map_over_two_rented_instances_kept_warm_adopted_and_the_adopter_leaves_nothing(
    vast_standins: VastStandIns, package_index: PackageIndex
) -> None:
    fake = vast_standins.fake

    def inside(pool: sky.ComputePool) -> None:
        live = fake.live()
        ports = [int(i["ports"]["22/tcp"][0]["HostPort"]) for i in live]
        assert all(port != 22 for port in ports) and len(set(ports)) == 2
        assert {i["public_ipaddr"].strip() for i in live} == {vast_standins.hosts.bridge_address}

    contract.runs_kept_warm_and_adopted(
        vast_cloud(vast_standins), package_index, contract.a_map, inside=inside
    )
    assert fake.live() == [] and fake.ssh_keys == []


@pytest.mark.timeout(300)
def test_an_outbid_interruptible_instance_is_worker_lost_saying_so_and_replaced(
    vast_standins: VastStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    fake = vast_standins.fake

    def take_away(lost: StandIn) -> str:
        (label,) = [i["label"] for i in fake.live() if str(i["id"]) == lost.instance]
        assert label.endswith("-node-1"), label
        fake.interrupt(int(lost.instance))
        return f"instance {lost.instance} is stopped: interrupted by Vast.ai: outbid"

    def inside(lost: StandIn, replacement: StandIn) -> None:
        (rented,) = [i for i in fake.live() if str(i["id"]) == replacement.instance]
        assert rented["label"].endswith("-node-1-r1") and rented["is_bid"]

    replaced = contract.lost_machine_is_replaced(
        vast_cloud(vast_standins),
        package_index,
        tmp_path,
        take_away,
        inside=inside,
        provider={"boot_timeout": 90},
        allocation="spot",
    )
    assert replaced.after[1] != replaced.before[1]
    assert fake.live() == []


@pytest.mark.timeout(300)
def test_a_killed_clients_containers_end_themselves_and_down_destroys_them(
    vast_standins: VastStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    fake = vast_standins.fake

    def after_the_watchdog() -> None:
        ids = sorted(str(i["id"]) for i in fake.live())
        assert {i["actual_status"] for i in fake.live()} == {"exited"}  # kept: its disk billed
        inventory = provider(fake).inventory()
        assert inventory is not None
        found = inventory.leftovers(pool="orphan")
        assert sorted(x.id for x in found) == ids and {x.state for x in found} == {"exited"}

    def listed(stdout: str) -> None:
        rows = [line for line in stdout.splitlines() if line.startswith("vastai ")]
        ids = [str(i["id"]) for i in fake.live()]
        assert len(rows) == 2 and all(any(id in row for row in rows) for id in ids), stdout

    contract.killed_clients_machines_end_themselves(
        vast_cloud(vast_standins),
        package_index,
        tmp_path,
        ended_as=None,
        after_the_watchdog=after_the_watchdog,
        listed=listed,
        watchdog_says=("running /usr/local/sbin/skyward-end-container",),
        attached=6,
    )
    assert fake.live() == []
