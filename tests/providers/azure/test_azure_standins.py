"""The Azure provider end to end: the fake ARM server creates the VMs, stand-in VMs (network-
namespace hosts that boot from the VMs' customData, in sandboxes that cannot stop this
machine, each with an instance metadata service of its own) play the machines, and the pool
reaches them at their private addresses."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, TESTS
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import Checkpoint, request
from support.clouds.azure.pools import groups_of, only_group, signed_in_env, skyward_cli
from support.clouds.azure.pools import standin_provider as azure
from support.clouds.azure.standins import AzureStandIns
from support.dispositions import as_from_a_terminal
from support.markers import wait_for_markers
from support.pools import broadcast_in_background
from support.reporter import Recorder
from support.sshhosts import PackageIndex

import skyward as sky

EXAMPLES = ROOT / "examples"


def _toy() -> Any:
    spec = importlib.util.spec_from_file_location(
        "jax_multicontroller", EXAMPLES / "jax_multicontroller.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.toy


def _all_ended(cloud: AzureStandIns, how: set[str] | None = None) -> bool:
    standins = list(cloud.standins.values())
    return bool(standins) and all(s.ended and (how is None or s.ended in how) for s in standins)


@pytest.mark.timeout(600)
def test_jax_toy_runs_across_two_azure_stand_ins_and_nothing_is_left(
    azure_standins: AzureStandIns, package_index: PackageIndex
) -> None:
    with sky.ComputePool(
        provider=azure(azure_standins),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.jax(cpu_devices=4)],
        name="azure-jax",
        quiet=True,
    ) as pool:
        infos = pool.broadcast(sky.instance_info)
        results = _toy()() @ pool
    assert [value for value, _ in results] == [-0.12398731708526611, -0.12398731708526611]
    # The nodes reach each other at the private addresses the fake gave their VMs.
    addresses = sorted(s.address for s in azure_standins.standins.values())
    assert sorted(infos[0].peers) == addresses and infos[1].peers == infos[0].peers
    assert {i.head_addr for i in infos} == {infos[0].peers[0]}
    assert {i.provider for i in infos} == {"azure"}
    assert groups_of(azure_standins.fake, "azure-jax") == []  # type: ignore[arg-type]
    azure_standins.wait_for(
        lambda: _all_ended(azure_standins, {"deleted"}), 30, "stand-ins gone with their VMs"
    )


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
    client = _client(azure_standins, "http://127.0.0.1:9/simple/", "sigterm", log)
    try:
        _wait_for_line(log, "connecting", client, 120)
        assert len(fake.vms(only_group(fake, "sigterm"))) == 2
        client.send_signal(signal.SIGTERM)  # a job scheduler's cancel, `kill PID`
        assert client.wait(120) == -signal.SIGTERM, log.read_text()
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(30)
    assert groups_of(fake, "sigterm") == [], log.read_text()


# ── a client killed: the watchdog deletes the VMs (never merely stops them) ────────────

_CLIENT = """
import sys, time
sys.path.insert(0, {tests!r})
import skyward as sky
from support.clouds.azure.fake import FakeCredential
settings = {settings!r}
azure = sky.Azure(credential=FakeCredential(), **settings)
with sky.ComputePool(provider=azure, nodes=2, image=sky.Image(index_url={index!r}),
                     name={pool!r}, console="plain") as pool:
    print("READY", flush=True)
    pool.broadcast(time.sleep, 3600)  # a long job, its client attached
"""


def _client(cloud: AzureStandIns, index: str, pool: str, log: Path, **options: Any) -> Any:
    settings = azure(cloud, **options).model_dump(exclude_defaults=True, exclude={"credential"})
    script = _CLIENT.format(tests=str(TESTS), settings=settings, index=index, pool=pool)
    with open(log, "wb") as out:  # signalled as from a terminal, however this run started
        return subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=as_from_a_terminal,
        )


def _wait_for_line(log: Path, text: str, process: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while text not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < end, f"no {text!r} within {timeout:g} s: {log.read_text()}"
        time.sleep(0.1)


@pytest.mark.timeout(300)
def test_a_killed_clients_vms_delete_themselves_and_down_removes_the_group(
    azure_standins: AzureStandIns,
    package_index: PackageIndex,
    moto: MotoServer,
    tmp_path: Path,
) -> None:
    fake = azure_standins.fake
    assert fake is not None
    log = tmp_path / "client.log"
    client = _client(azure_standins, package_index.url, "orphan", log, idle_timeout=3)
    try:
        _wait_for_line(log, "READY", client, 240)
        # The job runs well past idle_timeout while its client is attached: nothing stops.
        time.sleep(8)
        assert client.poll() is None, log.read_text()
        assert not any(s.ended for s in azure_standins.standins.values()), azure_standins.events
        group = only_group(fake, "orphan")
        assert len(fake.vms(group)) == 2
    finally:
        client.kill()
        client.wait(30)
    azure_standins.wait_for(
        lambda: _all_ended(azure_standins), 120, "the stand-ins' watchdogs released their VMs"
    )
    # Deleted through ARM by the VMs themselves, with the pool's identity: not powered off
    # (which Azure would keep billing), not even deallocated.
    assert {s.ended for s in azure_standins.standins.values()} == {"deleted"}, azure_standins.events
    assert fake.vms(group) == []
    for standin in azure_standins.standins.values():
        imds = azure_standins.imds_log(standin)
        assert "/metadata/identity/oauth2/token" in imds and "client_id=" in imds, imds
    deletes = fake.requests("DELETE", "/virtualMachines/")
    assert len(deletes) == 2, deletes
    # What stays costs nothing (the group, its network, the identity); ls shows it, down
    # removes it.
    env = {
        **signed_in_env(fake, tmp_path / "az"),
        "AWS_ENDPOINT_URL": moto.url,
        "AWS_DEFAULT_REGION": moto.region,
    }

    def skyward(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [skyward_cli(), *args, "--azure-base-url", fake.url],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    listed = skyward("ls", "--pool", "orphan")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert group in listed.stdout
    removed = skyward("down", "--pool", "orphan", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert groups_of(fake, "orphan") == []


# ── a spot VM evicted by Azure is replaced ─────────────────────────────────────────────


@pytest.mark.timeout(300)
def test_an_evicted_spot_vm_is_replaced_and_the_pool_goes_on(
    azure_standins: AzureStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    fake = azure_standins.fake
    assert fake is not None
    with sky.ComputePool(
        provider=azure(azure_standins, spot=True, boot_timeout=60),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        name="evicted",
        quiet=True,
    ) as pool:
        before = pool.broadcast(lambda: os.uname().nodename)
        group = only_group(fake, "evicted")
        started = tmp_path / "started"
        in_flight = broadcast_in_background(pool, _sleep_on, 1, str(started))
        wait_for_markers(started)
        fake.evict(group, "node-1")  # Azure takes node 1 back (eviction policy Delete)
        failure = in_flight.exception(timeout=120)
        assert isinstance(failure, sky.WorkerLost)
        assert "evicted by Azure" in str(failure), str(failure)
        end = time.monotonic() + 180
        while time.monotonic() < end:
            if pool.statistics().ready_nodes == 2 and len(azure_standins.standins) == 3:
                break
            time.sleep(0.2)
        after = pool.broadcast(lambda: os.uname().nodename)
        names = sorted(vm["name"] for vm in fake.vms(group))
    assert after[0] == before[0] and after[1] != before[1]
    assert names == ["node-0", "node-1-r1"]
    assert groups_of(fake, "evicted") == []


def _sleep_on(rank: int, started: str) -> None:
    if sky.instance_info().node == rank:
        Path(started).touch()
        time.sleep(600)


@pytest.mark.timeout(300)
def test_vms_kept_warm_are_adopted_on_azure_and_the_adopter_deletes_their_group(
    azure_standins: AzureStandIns, package_index: PackageIndex
) -> None:
    def pool(name: str, **options: Any) -> sky.ComputePool:
        image = sky.Image(index_url=package_index.url)
        provider = azure(azure_standins)
        return sky.ComputePool(provider=provider, nodes=2, image=image, name=name, **options)

    with pool("azure-warm", keep_warm=300, quiet=True) as first:
        before = first.broadcast(lambda: os.uname().nodename)
    group = only_group(azure_standins.fake, "azure-warm")  # type: ignore[arg-type]
    count = len(azure_standins.standins)
    started = time.monotonic()
    with pool("azure-next", quiet=True) as second:
        ready = time.monotonic() - started
        after = second.broadcast(lambda: os.uname().nodename)
    print(f"\nwarm start, 2 nodes on Azure stand-ins: ready in {ready:.2f} s; {second.timings()}")
    assert after == before
    assert len(azure_standins.standins) == count  # no new VM
    assert group not in [g["name"] for g in azure_standins.fake.resource_groups()]
    assert groups_of(azure_standins.fake, "azure-next") == []  # type: ignore[arg-type]
