"""The Lambda provider end to end: the fake of Lambda's API launches the instances, stand-in
VMs (network-namespace hosts that boot from the instances' ``user_data``, in sandboxes that
cannot stop this machine) play the machines, and the pool reaches them at their private
addresses, which their peers use too. The scenarios are the stand-in contract's
(``support/standin_contract.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import standin_contract as contract
from support.clouds.lambdacloud.fake import KEY
from support.clouds.lambdacloud.standins import LambdaStandIns, held
from support.clouds.lambdacloud.standins import standin_provider as lam
from support.sshhosts import PackageIndex
from support.standin_contract import Cloud

import skyward as sky


def lambda_cloud(cloud: LambdaStandIns) -> Cloud:
    """The fake of Lambda's API and its stand-in VMs, for the stand-in contract. The
    instance type is outside the catalog: the pool has no accelerator, and installs CPU jax."""
    return Cloud(
        name="lambda",
        standins=cloud,
        provider=lambda **options: lam(cloud, instance_type="gpu_1x_a10", **options),
        machines=lambda pool: held(cloud.fake, pool)["instances"],
        left=lambda pool: held(cloud.fake, pool),
        client_provider="sky.Lambda(**settings)",
        cli_env={"LAMBDA_API_KEY": KEY, "SKYWARD_LAMBDA_ENDPOINT": cloud.fake.url},
        cli_args=("--cloud", "lambdacloud"),
    )


@pytest.mark.timeout(600)
def test_jax_toy_on_two_lambda_stand_ins_kept_warm_adopted_and_the_adopter_leaves_nothing(
    lambda_standins: LambdaStandIns, package_index: PackageIndex
) -> None:
    def inside(pool: sky.ComputePool) -> None:
        names = pool.broadcast(lambda: os.uname().nodename)
        heads = pool.broadcast(lambda: sky.instance_info().head_addr)
        addresses = [s.address for s in lambda_standins.standins.values()]
        assert names == ["ip-" + a.replace(".", "-") for a in addresses]
        assert heads == [addresses[0], addresses[0]]  # peers meet at the private address

    contract.runs_kept_warm_and_adopted(
        lambda_cloud(lambda_standins),
        package_index,
        contract.jax_toy,
        plugins=contract.jax_plugins(),
        inside=inside,
    )


# ── a client killed: its machines power off, still billed; skyward ls / down end them ──


@pytest.mark.timeout(300)
def test_a_killed_clients_machines_power_off_and_down_terminates_them(
    lambda_standins: LambdaStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    def after_the_watchdog() -> None:
        # Lambda keeps an instance that powered itself off, and bills it: the watchdog
        # holds no key to terminate it with (the account's key never goes on a machine).
        left = held(lambda_standins.fake, "orphan")
        assert len(left["instances"]) == 2 and left["rulesets"] and left["ssh keys"]

    def listed(stdout: str) -> None:
        rows = [line for line in stdout.splitlines() if line.startswith("lambdacloud ")]
        assert len(rows) == 4, stdout  # two instances, the ruleset, the key

    contract.killed_clients_machines_end_themselves(
        lambda_cloud(lambda_standins),
        package_index,
        tmp_path,
        ended_as=frozenset({"poweroff"}),
        after_the_watchdog=after_the_watchdog,
        listed=listed,
        watchdog_says=("skyward-watchdog: no SSH client for", "powering off"),
    )
