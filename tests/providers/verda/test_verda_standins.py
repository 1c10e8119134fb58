"""The Verda provider end to end: the fake of Verda's API rents the instances, stand-in VMs
(network-namespace hosts in sandboxes that cannot stop this machine) boot from the pool's
startup script as a Verda image does, and the pool reaches them at the one address Verda
gives each. The peers use that address too: Verda's instances share no private network.
The scenarios are the stand-in contract's (``support/standin_contract.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import standin_contract as contract
from support.clouds.aws.standins import StandIn
from support.clouds.verda.fake import CLIENT_ID, CLIENT_SECRET
from support.clouds.verda.standins import VerdaStandIns, held
from support.clouds.verda.standins import standin_provider as verda
from support.sshhosts import PackageIndex
from support.standin_contract import Cloud

import skyward as sky


def verda_cloud(cloud: VerdaStandIns) -> Cloud:
    """The fake of Verda's API and its stand-in VMs, for the stand-in contract."""
    return Cloud(
        name="verda",
        standins=cloud,
        provider=lambda **options: verda(cloud, **options),
        machines=lambda pool: held(cloud.fake, pool)["instances"],
        left=lambda pool: held(cloud.fake, pool),
        client_provider="sky.Verda(**settings)",
        client_settings={"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET},
        cli_env={
            "VERDA_CLIENT_ID": CLIENT_ID,
            "VERDA_CLIENT_SECRET": CLIENT_SECRET,
            "SKYWARD_VERDA_ENDPOINT": cloud.fake.url,
        },
        cli_drop=("VERDA_",),
        cli_args=("--cloud", "verda"),
    )


@pytest.mark.timeout(600)
def test_jax_toy_on_two_verda_stand_ins_kept_warm_adopted_and_the_adopter_leaves_nothing(
    verda_standins: VerdaStandIns, package_index: PackageIndex
) -> None:
    def inside(pool: sky.ComputePool) -> None:
        names = pool.broadcast(lambda: os.uname().nodename)
        peers = pool.broadcast(lambda: sky.instance_info().peers)
        by_rank = sorted((i["hostname"], i["ip"]) for i in verda_standins.fake.instances())
        addresses = [ip for _, ip in by_rank]  # <base>-n0, <base>-n1: the one address each
        assert names == ["ip-" + a.replace(".", "-") for a in addresses]
        assert all(a in str(peers) for a in addresses)

    contract.runs_kept_warm_and_adopted(
        verda_cloud(verda_standins),
        package_index,
        contract.jax_toy,
        plugins=contract.jax_plugins(),
        inside=inside,
    )


# ── a client killed: the watchdog powers the instances off; skyward down deletes them ──


@pytest.mark.timeout(300)
def test_a_killed_clients_instances_power_off_and_down_deletes_them(
    verda_standins: VerdaStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    fake = verda_standins.fake

    def after_the_watchdog() -> None:
        # Verda keeps an instance that powered itself off, offline, and bills it: the
        # account's key never went to the machine, so nothing there could delete it.
        left = [i for i in fake.instances() if i["hostname"].startswith("skyward-orphan-")]
        assert [i["status"] for i in left] == ["offline", "offline"], verda_standins.events

    def listed(stdout: str) -> None:
        rows = [line for line in stdout.splitlines() if line.startswith("verda ")]
        assert len(rows) == 4, stdout  # two instances, the script, the key

    contract.killed_clients_machines_end_themselves(
        verda_cloud(verda_standins),
        package_index,
        tmp_path,
        ended_as=None,
        after_the_watchdog=after_the_watchdog,
        listed=listed,
        watchdog_says=("skyward-watchdog: no SSH client for",),
    )


# ── a spot instance Verda takes back is replaced ───────────────────────────────────────


@pytest.mark.timeout(300)
def test_a_reclaimed_spot_instance_is_named_in_worker_lost_and_replaced(
    verda_standins: VerdaStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    fake = verda_standins.fake

    def take_away(lost: StandIn) -> str:
        fake.reclaim(lost.instance)
        return f"instance {lost.instance} is discontinued: Verda discontinued it"

    def inside(lost: StandIn, replacement: StandIn) -> None:
        hostnames = {i["id"]: i["hostname"] for i in fake.instances()}
        assert hostnames[replacement.instance].endswith("-n1-r1")

    contract.lost_machine_is_replaced(
        verda_cloud(verda_standins),
        package_index,
        tmp_path,
        take_away,
        inside=inside,
        provider={"spot": True, "boot_timeout": 60},
    )
