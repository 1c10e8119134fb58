"""The GCP provider end to end: the Compute Engine fake creates the instances, stand-in VMs
(network-namespace hosts that boot from the instances' ``user-data`` metadata, in sandboxes
that cannot stop this machine) play the machines, and the pool reaches them at their private
addresses. The stand-ins reach the fake and a metadata server on the test bridge, as a VM
reaches Google's. The scenarios are the stand-in contract's (``support/standin_contract.py``);
warm adoption on GCP has tests of its own (``test_gcp_warm.py``)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from support import standin_contract as contract
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.standins import StandIn
from support.clouds.gcp.standins import PROJECT, ZONE, GCPStandIns, TokenServer, held
from support.clouds.gcp.standins import standin_provider as gcp
from support.sshhosts import PackageIndex
from support.standin_contract import Cloud

import skyward as sky


def gcp_cloud(cloud: GCPStandIns, cli_env: Mapping[str, str] | None = None) -> Cloud:
    """The Compute Engine fake and its stand-in VMs, for the stand-in contract."""
    return Cloud(
        name="gcp",
        standins=cloud,
        provider=lambda **options: gcp(cloud, **options),
        machines=lambda pool: held(cloud.fake, pool)["instances"],
        left=lambda pool: held(cloud.fake, pool),
        client_imports="from google.auth.credentials import AnonymousCredentials",
        client_provider="sky.GCP(credentials=AnonymousCredentials(), **settings)",
        unpicklable=frozenset({"credentials"}),
        cli_env=cli_env or {},
        cli_drop=("GOOGLE_", "CLOUDSDK_"),
        cli_args=("--cloud", "gcp", "--cloud", "aws"),
    )


@pytest.mark.timeout(600)
def test_jax_multi_controller_toy_on_two_gce_stand_ins_leaves_nothing(
    gcp_standins: GCPStandIns, package_index: PackageIndex
) -> None:
    def inside(pool: sky.ComputePool) -> None:
        names = pool.broadcast(lambda: os.uname().nodename)
        addresses = [s.address for s in gcp_standins.standins.values()]
        assert names == ["ip-" + a.replace(".", "-") for a in addresses]

    contract.runs_and_leaves_nothing(
        gcp_cloud(gcp_standins),
        package_index,
        contract.jax_toy,
        plugins=contract.jax_plugins(),
        inside=inside,
    )


# ── a client killed: the watchdog deletes its machines; skyward ls / down the rest ─────


@pytest.fixture
def tokens() -> Iterator[TokenServer]:
    """Google's token endpoint, for the ``skyward`` command's service-account key."""
    server = TokenServer()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.timeout(300)
def test_a_killed_clients_machines_delete_themselves_and_down_removes_the_rules(
    gcp_standins: GCPStandIns,
    package_index: PackageIndex,
    moto: MotoServer,
    tokens: TokenServer,
    tmp_path: Path,
) -> None:
    fake = gcp_standins.fake
    env = {
        "GOOGLE_APPLICATION_CREDENTIALS": str(tokens.key_file(tmp_path)),
        "SKYWARD_GCP_ENDPOINT": fake.url,
        "AWS_ENDPOINT_URL": moto.url,  # ls looks at AWS too: at moto, never at AWS
        "AWS_DEFAULT_REGION": moto.region,
    }

    def after_the_watchdog() -> None:
        left = held(fake, "orphan")
        # Deleted by their own watchdog's hook, through the API (the client, SIGKILLed,
        # could not), before it powered off: GCE keeps a powered-off instance, and bills
        # its disk.
        deletes = fake.requests("DELETE", "projects/*/zones/*/instances/*")
        assert left["instances"] == [], (
            gcp_standins.events,
            [r.path for r in deletes],
            {name: s.log() for name, s in gcp_standins.standins.items()},
        )
        assert sorted(r.path.rsplit("/", 1)[-1] for r in deletes) == sorted(gcp_standins.standins)
        events = {what for what, _ in gcp_standins.events}
        assert "powered-off-kept" not in events, gcp_standins.events
        for name, standin in gcp_standins.standins.items():  # said before it asks
            said = (standin.directory / "var-log" / "skyward-watchdog.log").read_text()
            assert f"skyward-release: deleting {name}" in said, said
        assert len(left["firewall rules"]) == 2

    def listed(stdout: str) -> None:
        rows = [line for line in stdout.splitlines() if line.startswith("gcp ")]
        assert len(rows) == 2, stdout
        rules = held(fake, "orphan")["firewall rules"]
        assert all(any(rule in row for row in rows) for rule in rules), stdout

    contract.killed_clients_machines_end_themselves(
        gcp_cloud(gcp_standins, env),
        package_index,
        tmp_path,
        ended_as=None,
        after_the_watchdog=after_the_watchdog,
        listed=listed,
        watchdog_says=("skyward-watchdog: no SSH client for",),
    )


# ── a Spot VM Google reclaims is replaced ──────────────────────────────────────────────


@pytest.mark.timeout(300)
def test_a_reclaimed_spot_vm_is_named_in_worker_lost_and_replaced(
    gcp_standins: GCPStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    def take_away(lost: StandIn) -> str:
        gcp_standins.fake.preempt(PROJECT, ZONE, lost.instance)  # Google reclaims, deletes
        return f"instance {lost.instance} is gone: reclaimed by GCP (spot preemption)"

    def inside(lost: StandIn, replacement: StandIn) -> None:
        assert replacement.instance.endswith("-n1-r1")

    contract.lost_machine_is_replaced(
        gcp_cloud(gcp_standins),
        package_index,
        tmp_path,
        take_away,
        inside=inside,
        provider={"spot": True, "boot_timeout": 60},
    )
