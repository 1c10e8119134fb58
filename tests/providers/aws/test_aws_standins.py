"""The AWS provider end to end: moto creates the instances, stand-in VMs (network-namespace
hosts that boot from the instances' user data, in sandboxes that cannot stop this machine)
play the machines, and the pool reaches them at their private addresses."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import Checkpoint, held, nothing, pool_key_of, request
from support.clouds.aws.pools import standin_provider as aws
from support.clouds.aws.proxy import Ec2Proxy, in_subnet
from support.clouds.aws.standins import StandInCloud
from support.markers import wait_for_markers
from support.pools import broadcast_in_background
from support.reporter import Recorder
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.client.futures import Deadline

EXAMPLES = ROOT / "examples"


def _toy() -> Any:
    spec = importlib.util.spec_from_file_location(
        "jax_multicontroller", EXAMPLES / "jax_multicontroller.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.toy


@pytest.mark.timeout(300)
def test_a_pool_runs_on_stand_ins_and_leaves_nothing(
    standin_cloud: StandInCloud, package_index: PackageIndex
) -> None:
    with sky.ComputePool(
        provider=aws(standin_cloud),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        name="standins",
        quiet=True,
    ) as pool:
        names = pool.broadcast(lambda: os.uname().nodename)
        infos = pool.broadcast(sky.instance_info)
    addresses = [s.address for s in standin_cloud.standins.values()]
    assert names == ["ip-" + a.replace(".", "-") for a in addresses]
    assert [i.head_addr for i in infos] == [addresses[0], addresses[0]]
    standin_cloud.wait_for(
        lambda: all(s.ended for s in standin_cloud.standins.values()),
        30,
        "stand-ins stopped when their instances were terminated",
    )
    assert nothing(held(standin_cloud.moto, "standins"))


@pytest.mark.timeout(600)
def test_jax_multi_controller_toy_on_two_stand_ins(
    standin_cloud: StandInCloud, package_index: PackageIndex
) -> None:
    toy = _toy()
    with sky.ComputePool(
        provider=aws(standin_cloud),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.jax(cpu_devices=4)],
        name="jax-standins",
        quiet=True,
    ) as pool:
        results = toy() @ pool
    assert [value for value, _ in results] == [-0.12398731708526611, -0.12398731708526611]
    assert nothing(held(standin_cloud.moto, "jax-standins"))


@pytest.mark.timeout(300)
def test_with_no_capacity_in_one_zone_the_pool_starts_in_the_next(
    moto: MotoServer, ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    with StandInCloud(moto, ssh_hosts, second_zone="us-east-1b") as cloud:
        first, second = cloud.subnets
        with Ec2Proxy(moto.url) as proxy:
            proxy.refuse(
                "RunInstances",
                "InsufficientInstanceCapacity",
                "We currently do not have sufficient m7i.xlarge capacity in the Availability "
                "Zone you requested (us-east-1a).",
                when=in_subnet(first),
                status=500,
            )
            # The VPC, not a subnet: the provider picks among its zones.
            provider = aws(cloud, endpoint_url=proxy.url, vpc_id=cloud.vpc, subnet_id=None)
            with sky.ComputePool(
                provider=provider,
                nodes=2,
                image=sky.Image(index_url=package_index.url),
                name="failover",
                quiet=True,
            ) as pool:
                infos = pool.broadcast(sky.instance_info)
            tried = [p["NetworkInterface.1.SubnetId"] for p in proxy.calls("RunInstances")]
        assert tried[0] == first and tried[-1] == second
        addresses = sorted(s.address for s in cloud.standins.values())
        assert [i.head_addr for i in infos] == [addresses[0]] * 2
        assert all(a.startswith(f"{ssh_hosts.subnet}.6") for a in addresses), addresses
        assert nothing(held(moto, "failover"))


# ── the leak matrix, from the SSH stage on ─────────────────────────────────────────────


@pytest.mark.timeout(120)
def test_ctrl_c_while_the_machines_boot_leaves_nothing(
    moto: MotoServer, ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    # sshd comes up 10 s after the network: connections are refused meanwhile, and retried.
    with StandInCloud(moto, ssh_hosts, boot_delay=10) as cloud:
        recorder = Recorder()
        checkpoint = Checkpoint(
            "reaching the machines",
            when=lambda: len(cloud.standins) == 2 and recorder.phases_of(0)[-1] == "connecting",
        )
        made = request(deadline=checkpoint, image=sky.Image(index_url=package_index.url))
        with pytest.raises(KeyboardInterrupt):
            aws(cloud).provision(made, recorder)
        assert nothing(held(moto, made.pool))
        assert "bootstrapping" not in recorder.phases_of(0)
        cloud.wait_for(
            lambda: all(s.ended == "terminated" for s in cloud.standins.values()),
            30,
            "stand-ins stopped with their instances",
        )


@pytest.mark.timeout(180)
def test_ctrl_c_during_the_bootstrap_leaves_nothing(
    standin_cloud: StandInCloud, package_index: PackageIndex
) -> None:
    recorder = Recorder()
    checkpoint = Checkpoint(
        "reaching the machines", when=lambda: "bootstrapping" in recorder.phases_of(1)
    )
    # jax makes the bootstrap long enough to be caught in the middle of it.
    image = sky.Image(index_url=package_index.url, pip=["jax"])
    made = request(deadline=checkpoint, image=image)
    with pytest.raises(KeyboardInterrupt):
        aws(standin_cloud).provision(made, recorder)
    assert nothing(held(standin_cloud.moto, made.pool))
    standin_cloud.wait_for(
        lambda: all(s.ended == "terminated" for s in standin_cloud.standins.values()),
        30,
        "stand-ins stopped with their instances",
    )


@pytest.mark.timeout(120)
def test_instances_that_never_answer_fail_the_start_in_time_and_leave_nothing(
    moto: MotoServer, ssh_hosts: Hosts
) -> None:
    with StandInCloud(moto, ssh_hosts, boot=False) as cloud:
        with pytest.raises(sky.ProvisionError) as caught:
            with sky.ComputePool(
                # 20 s: under load, moto alone took over 8 s to answer for the machine types
                provider=aws(cloud),
                nodes=2,
                name="unreachable",
                provision_timeout=20,
                quiet=True,
            ):
                pass
        message = str(caught.value) + "".join(getattr(caught.value, "__notes__", []))
        cause = caught.value.__cause__
        if cause is not None:
            message += str(cause) + "".join(getattr(cause, "__notes__", []))
        assert "provision_timeout (20 s)" in message, message
        assert "SSH did not answer from here" in message, message
        # Every silent machine is named in the error the user reads, not only on its cause.
        tag = [{"Name": "tag:skyward-pool", "Values": ["unreachable"]}]
        described = moto.client("ec2").describe_instances(Filters=tag)["Reservations"]
        addresses = [i["PrivateIpAddress"] for r in described for i in r["Instances"]]
        assert len(addresses) == 2 and all(a in str(caught.value) for a in addresses), message
        assert nothing(held(moto, "unreachable"))


# ── a client killed: the watchdog, then skyward ls / down ──────────────────────────────

_CLIENT = """
import time
import skyward as sky
aws = sky.AWS(**{settings!r})
with sky.ComputePool(provider=aws, nodes=2, image=sky.Image(index_url={index!r}),
                     name={pool!r}, console="plain") as pool:
    print("READY", flush=True)
    pool.broadcast(time.sleep, 3600)  # a long job, its client attached
"""


def _client(cloud: StandInCloud, index: str, pool: str, log: Path, **options: Any) -> Any:
    """The client, its temporary directory (where its pool key goes) beside ``log``."""
    settings = aws(cloud, **options).model_dump(exclude_defaults=True)
    script = _CLIENT.format(settings=settings, index=index, pool=pool)
    env = {**os.environ, "TMPDIR": str(log.parent)}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT, env=env
        )


def _wait_for_line(log: Path, text: str, process: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while text not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < end, f"no {text!r} within {timeout:g} s: {log.read_text()}"
        time.sleep(0.1)


def _skyward(
    moto: MotoServer, *args: str, answer: str = "", tmp: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AWS_ENDPOINT_URL": moto.url, "AWS_DEFAULT_REGION": moto.region}
    if tmp is not None:  # where the clients of the test put their pool keys
        env["TMPDIR"] = str(tmp)
    return subprocess.run(
        [str(Path(sys.executable).parent / "skyward"), *args, "--cloud", "aws"],
        input=answer,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.timeout(300)
def test_a_killed_clients_machines_power_themselves_off_and_down_removes_the_rest(
    standin_cloud: StandInCloud, package_index: PackageIndex, tmp_path: Path
) -> None:
    log = tmp_path / "client.log"
    client = _client(
        standin_cloud, package_index.url, "orphan", log, idle_timeout=3, boot_timeout=120
    )
    try:
        _wait_for_line(log, "READY", client, 240)
        # The job runs well past idle_timeout while its client is attached: nothing stops.
        time.sleep(8)
        assert client.poll() is None, log.read_text()
        assert all(not s.ended for s in standin_cloud.standins.values()), standin_cloud.events
        assert len(held(standin_cloud.moto, "orphan")["instances"]) == 2
        key_file = pool_key_of(standin_cloud.moto, "orphan", tmp_path)
        assert key_file is not None
    finally:
        client.kill()
        client.wait(30)
    assert key_file.exists()  # a killed client cannot delete its pool key: down does
    standin_cloud.wait_for(
        lambda: all(s.ended for s in standin_cloud.standins.values()),
        90,
        "the stand-ins powered themselves off",
    )
    assert {s.ended for s in standin_cloud.standins.values()} == {"poweroff"}
    left = held(standin_cloud.moto, "orphan")
    assert left["instances"] == []  # terminated by EC2 on power-off
    assert len(left["security groups"]) == 1 and len(left["key pairs"]) == 1

    listed = _skyward(standin_cloud.moto, "ls", "--pool", "orphan")
    assert listed.returncode == 0, listed.stderr
    assert left["security groups"][0] in listed.stdout
    assert left["key pairs"][0] in listed.stdout
    refused = _skyward(standin_cloud.moto, "down", "--pool", "orphan", answer="n\n")
    assert refused.returncode != 0
    assert held(standin_cloud.moto, "orphan") == left
    removed = _skyward(standin_cloud.moto, "down", "--pool", "orphan", "--yes", tmp=tmp_path)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert nothing(held(standin_cloud.moto, "orphan"))
    assert not key_file.parent.exists(), removed.stdout
    assert "Nothing left" in _skyward(standin_cloud.moto, "ls", tmp=tmp_path).stdout


@pytest.mark.timeout(180)
def test_ls_and_down_all_after_a_client_killed_mid_start(
    moto: MotoServer, ssh_hosts: Hosts, tmp_path: Path
) -> None:
    log = tmp_path / "client.log"
    with StandInCloud(moto, ssh_hosts, boot=False) as cloud:
        client = _client(cloud, "http://127.0.0.1:9/simple/", "killed", log)
        try:
            _wait_for_line(log, "connecting", client, 120)
            key_file = pool_key_of(moto, "killed", tmp_path)
            assert key_file is not None
        finally:
            client.kill()
            client.wait(30)
        left = held(moto, "killed")
        assert len(left["instances"]) == 2, log.read_text()
        listed = _skyward(moto, "ls")
        assert listed.returncode == 0, listed.stderr
        # The resource table's rows (the recent pools below it name the pool too).
        rows = [line for line in listed.stdout.splitlines() if line.split()[:1] == ["aws"]]
        rows = [line for line in rows if " killed " in f" {line} "]
        assert len(rows) == 4, listed.stdout  # 2 instances, a group, a key pair
        instances = [r for r in rows if "instance" in r]
        assert all("running" in r and "0.20" in r for r in instances), listed.stdout
        assert "about $0.40/h" in listed.stdout
        removed = _skyward(moto, "down", "--all", "--yes", tmp=tmp_path)
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert nothing(held(moto, "killed"))
        assert not key_file.parent.exists()


# ── a machine lost (as AWS reclaims a spot instance) is replaced ───────────────────────


@pytest.mark.timeout(300)
def test_an_instance_aws_takes_away_is_replaced_and_the_pool_goes_on(
    standin_cloud: StandInCloud, package_index: PackageIndex, tmp_path: Path
) -> None:
    with sky.ComputePool(
        provider=aws(standin_cloud, boot_timeout=60),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        name="reclaimed",
        quiet=True,
    ) as pool:
        before = pool.broadcast(lambda: os.uname().nodename)
        first = {s.address: s.instance for s in standin_cloud.standins.values()}
        lost = first["-".join(before[1].split("-")[1:]).replace("-", ".")]
        # A call in flight on node 1 when its machine goes.
        started = tmp_path / "started"
        in_flight = broadcast_in_background(pool, _sleep_on, 1, str(started))
        wait_for_markers(started)
        standin_cloud.ec2.terminate_instances(InstanceIds=[lost])  # AWS reclaims node 1
        failure = in_flight.exception(timeout=120)
        assert isinstance(failure, sky.WorkerLost)
        assert f"instance {lost} is" in str(failure), "EC2's reason is in the message"
        end = time.monotonic() + 180
        while time.monotonic() < end:
            stats = pool.statistics()
            if stats.ready_nodes == 2 and len(standin_cloud.standins) == 3:
                break
            time.sleep(0.2)
        after = pool.broadcast(lambda: os.uname().nodename)
        replacement = [
            s for s in standin_cloud.standins.values() if s.instance not in first.values()
        ]
        assert len(replacement) == 1 and not replacement[0].ended
        assert standin_cloud.standins[lost].ended == "terminated"
    assert after[0] == before[0]
    # (EC2 may give the new instance the address the old one freed.)
    assert after[1] == "ip-" + replacement[0].address.replace(".", "-")
    assert nothing(held(standin_cloud.moto, "reclaimed"))


@pytest.mark.timeout(180)
def test_an_instance_that_ends_while_it_is_reached_fails_the_start_with_why(
    moto: MotoServer, ssh_hosts: Hosts
) -> None:
    # sshd never comes up in time; AWS takes node 1's instance back while it is awaited.
    with StandInCloud(moto, ssh_hosts, boot_delay=600) as cloud:
        recorder = Recorder()
        made = request(deadline=Deadline(150, "provision_timeout (150 s)"))

        reclaimed: list[str] = []

        def reclaim() -> None:
            cloud.wait_for(
                lambda: all(recorder.phases_of(n)[-1:] == ["connecting"] for n in (0, 1)),
                60,
                "both nodes connecting",
            )
            reclaimed.append(held(moto, made.pool)["instances"][1])
            cloud.ec2.terminate_instances(InstanceIds=reclaimed)

        thread = threading.Thread(target=reclaim, daemon=True)
        thread.start()
        with pytest.raises(sky.ProvisionError) as caught:
            aws(cloud, boot_timeout=600).provision(made, recorder)
        thread.join(10)
        assert f"instance {reclaimed[0]} is terminated" in str(caught.value)
        assert "SSH did not answer" not in "".join(getattr(caught.value, "__notes__", []))
        assert nothing(held(moto, made.pool))


def _sleep_on(rank: int, started: str) -> None:
    if sky.instance_info().node == rank:
        Path(started).touch()
        time.sleep(600)


@pytest.mark.timeout(300)
def test_a_pool_kept_warm_is_adopted_on_ec2_and_its_adopter_leaves_nothing(
    standin_cloud: StandInCloud, package_index: PackageIndex
) -> None:
    from skyward.providers.cloud import warm

    def pool(name: str, **options: Any) -> sky.ComputePool:
        image = sky.Image(index_url=package_index.url)
        provider = aws(standin_cloud)
        return sky.ComputePool(provider=provider, nodes=2, image=image, name=name, **options)

    with pool("ec2-warm", keep_warm=300, quiet=True) as first:
        before = first.broadcast(lambda: os.uname().nodename)
    assert len(held(standin_cloud.moto, "ec2-warm")["instances"]) == 2
    runs = len(standin_cloud.events)
    started = time.monotonic()
    with pool("ec2-next", quiet=True) as second:
        ready = time.monotonic() - started
        after = second.broadcast(lambda: os.uname().nodename)
    print(f"\nwarm start, 2 nodes on EC2 stand-ins: ready in {ready:.2f} s; {second.timings()}")
    assert after == before
    assert not [e for e in standin_cloud.events[runs:] if e[0] == "booted"]  # none new
    assert [w for w in warm.kept() if w.pool == "ec2-warm"] == []
    assert nothing(held(standin_cloud.moto, "ec2-warm"))
