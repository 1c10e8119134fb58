"""The Azure provider end to end: the fake ARM server creates the VMs, stand-in VMs (network-
namespace hosts that boot from the VMs' customData, in sandboxes that cannot stop this
machine, each with an instance metadata service of its own) play the machines, and the pool
reaches them at their private addresses."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path

import pytest
from support import standin_contract as contract
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import Checkpoint, request
from support.clouds.aws.standins import StandIn
from support.clouds.azure.pools import groups_of, only_group, signed_in_env
from support.clouds.azure.pools import standin_provider as azure
from support.clouds.azure.standins import AzureStandIns
from support.reporter import Recorder
from support.sshhosts import PackageIndex
from support.standin_contract import Cloud

import skyward as sky


def azure_cloud(cloud: AzureStandIns, cli_env: Mapping[str, str] | None = None) -> Cloud:
    """The fake ARM server and its stand-in VMs, for the stand-in contract. A VM Azure
    deletes, or a pool's close, ends its stand-in as deleted."""
    fake = cloud.fake
    assert fake is not None
    return Cloud(
        name="azure",
        standins=cloud,
        provider=lambda **options: azure(cloud, **options),
        machines=lambda pool: [vm["id"] for g in groups_of(fake, pool) for vm in fake.vms(g)],
        left=lambda pool: {"resource groups": groups_of(fake, pool)},
        gone_as="deleted",
        closed_as=frozenset({"deleted"}),
        client_imports="from support.clouds.azure.fake import FakeCredential",
        client_provider="sky.Azure(credential=FakeCredential(), **settings)",
        unpicklable=frozenset({"credential"}),
        cli_env=cli_env or {},
        cli_args=("--azure-base-url", fake.url),
    )


def _all_ended(cloud: AzureStandIns, how: set[str] | None = None) -> bool:
    standins = list(cloud.standins.values())
    return bool(standins) and all(s.ended and (how is None or s.ended in how) for s in standins)


@pytest.mark.timeout(600)
def test_jax_toy_runs_on_two_azure_stand_ins_kept_warm_adopted_and_nothing_is_left(
    azure_standins: AzureStandIns, package_index: PackageIndex
) -> None:
    fake = azure_standins.fake
    assert fake is not None

    def inside(pool: sky.ComputePool) -> None:
        infos = pool.broadcast(sky.instance_info)
        # The nodes reach each other at the private addresses the fake gave their VMs.
        addresses = sorted(s.address for s in azure_standins.standins.values())
        assert sorted(infos[0].peers) == addresses and infos[1].peers == infos[0].peers
        assert {i.head_addr for i in infos} == {infos[0].peers[0]}
        assert {i.provider for i in infos} == {"azure"}

    adopted = contract.runs_kept_warm_and_adopted(
        azure_cloud(azure_standins),
        package_index,
        contract.jax_toy,
        plugins=contract.jax_plugins(),
        inside=inside,
    )
    (group,) = adopted.kept["resource groups"]
    assert group not in [g["name"] for g in fake.resource_groups()]  # the adopter deleted it


# ── the leak matrix, from the SSH stage on ─────────────────────────────────────────────


@pytest.mark.timeout(180)
def test_ctrl_c_while_the_vms_boot_leaves_nothing(
    azure_standins: AzureStandIns, package_index: PackageIndex
) -> None:
    azure_standins.boot_delay = 10  # sshd comes up 10 s after the network: refused meanwhile
    recorder = Recorder()
    checkpoint = Checkpoint(
        "reaching the machines",
        when=lambda: (
            len(azure_standins.standins) == 2 and recorder.phases_of(0)[-1:] == ["connecting"]
        ),
    )
    made = request(deadline=checkpoint, image=sky.Image(index_url=package_index.url))
    with pytest.raises(KeyboardInterrupt):
        azure(azure_standins).provision(made, recorder)
    assert groups_of(azure_standins.fake, made.pool) == []  # type: ignore[arg-type]
    assert "bootstrapping" not in recorder.phases_of(0)
    azure_standins.wait_for(
        lambda: _all_ended(azure_standins, {"deleted"}), 30, "stand-ins gone with their VMs"
    )


@pytest.mark.timeout(120)
def test_vms_that_never_answer_fail_the_start_in_time_and_leave_nothing(
    azure_standins: AzureStandIns,
) -> None:
    azure_standins.boot = False  # the VMs run; no machine ever answers
    with pytest.raises(sky.ProvisionError) as caught:
        with sky.ComputePool(
            provider=azure(azure_standins), nodes=2, name="silent", provision_timeout=8, quiet=True
        ):
            pass
    message = str(caught.value) + "".join(getattr(caught.value, "__notes__", []))
    cause = caught.value.__cause__
    if cause is not None:
        message += str(cause) + "".join(getattr(cause, "__notes__", []))
    assert "provision_timeout (8 s)" in message, message
    assert "SSH did not answer from here" in message, message
    assert groups_of(azure_standins.fake, "silent") == []  # type: ignore[arg-type]


@pytest.mark.timeout(180)
def test_sigterm_while_the_vms_boot_leaves_nothing(
    azure_standins: AzureStandIns, tmp_path: Path
) -> None:
    fake = azure_standins.fake
    assert fake is not None
    azure_standins.boot = False
    log = tmp_path / "client.log"
    cloud = azure_cloud(azure_standins)
    client = contract.start_client(cloud, "http://127.0.0.1:9/simple/", "sigterm", log)
    try:
        contract.wait_for_line(log, "connecting", client, 120)
        assert len(fake.vms(only_group(fake, "sigterm"))) == 2
        client.send_signal(signal.SIGTERM)  # a job scheduler's cancel, `kill PID`
        assert client.wait(120) == -signal.SIGTERM, log.read_text()
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(30)
    assert groups_of(fake, "sigterm") == [], log.read_text()


# ── a client killed: the watchdog deletes the VMs (never merely stops them) ────────────


@pytest.mark.timeout(300)
def test_a_killed_clients_vms_delete_themselves_and_down_removes_the_group(
    azure_standins: AzureStandIns,
    package_index: PackageIndex,
    moto: MotoServer,
    tmp_path: Path,
) -> None:
    fake = azure_standins.fake
    assert fake is not None
    env = {
        **signed_in_env(fake, tmp_path / "az"),
        "AWS_ENDPOINT_URL": moto.url,
        "AWS_DEFAULT_REGION": moto.region,
    }

    def after_the_watchdog() -> None:
        # Deleted through ARM by the VMs themselves, with the pool's identity: not powered
        # off (which Azure would keep billing), not even deallocated.
        assert fake.vms(only_group(fake, "orphan")) == []
        for standin in azure_standins.standins.values():
            imds = azure_standins.imds_log(standin)
            assert "/metadata/identity/oauth2/token" in imds and "client_id=" in imds, imds
        deletes = fake.requests("DELETE", "/virtualMachines/")
        assert len(deletes) == 2, deletes

    def listed(stdout: str) -> None:
        # What stays costs nothing (the group, its network, the identity).
        assert only_group(fake, "orphan") in stdout, stdout

    contract.killed_clients_machines_end_themselves(
        azure_cloud(azure_standins, env),
        package_index,
        tmp_path,
        ended_as=frozenset({"deleted"}),
        after_the_watchdog=after_the_watchdog,
        listed=listed,
    )


# ── a spot VM evicted by Azure is replaced ─────────────────────────────────────────────


@pytest.mark.timeout(300)
def test_an_evicted_spot_vm_is_replaced_and_the_pool_goes_on(
    azure_standins: AzureStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    fake = azure_standins.fake
    assert fake is not None

    def take_away(lost: StandIn) -> str:
        fake.evict(only_group(fake, "azure-lost"), "node-1")  # eviction policy Delete
        return "evicted by Azure"

    def inside(lost: StandIn, replacement: StandIn) -> None:
        names = sorted(vm["name"] for vm in fake.vms(only_group(fake, "azure-lost")))
        assert names == ["node-0", "node-1-r1"]

    replaced = contract.lost_machine_is_replaced(
        azure_cloud(azure_standins),
        package_index,
        tmp_path,
        take_away,
        inside=inside,
        provider={"spot": True, "boot_timeout": 60},
    )
    assert replaced.after[1] != replaced.before[1]  # a new VM, at a new address
