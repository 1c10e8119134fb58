"""The AWS provider end to end: moto creates the instances, stand-in VMs (network-namespace
hosts that boot from the instances' user data, in sandboxes that cannot stop this machine)
play the machines, and the pool reaches them at their private addresses."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from support import standin_contract as contract
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import Checkpoint, held, nothing, pool_key_of, request
from support.clouds.aws.pools import standin_provider as aws
from support.clouds.aws.proxy import Ec2Proxy, in_subnet
from support.clouds.aws.standins import StandIn, StandInCloud
from support.reporter import Recorder
from support.sshhosts import Hosts, PackageIndex
from support.standin_contract import Cloud

import skyward as sky
from skyward.client.futures import Deadline


def aws_cloud(cloud: StandInCloud) -> Cloud:
    """EC2 (moto) and its stand-ins, for the stand-in contract."""
    return Cloud(
        name="ec2",
        standins=cloud,
        provider=lambda **options: aws(cloud, **options),
        machines=lambda pool: held(cloud.moto, pool)["instances"],
        left=lambda pool: held(cloud.moto, pool),
        client_provider="sky.AWS(**settings)",
        cli_env={"AWS_ENDPOINT_URL": cloud.moto.url, "AWS_DEFAULT_REGION": cloud.moto.region},
        cli_args=("--cloud", "aws"),
    )


@pytest.mark.timeout(600)
def test_jax_toy_runs_on_two_stand_ins_kept_warm_adopted_and_the_adopter_leaves_nothing(
    standin_cloud: StandInCloud, package_index: PackageIndex
) -> None:
    def inside(pool: sky.ComputePool) -> None:
        names = pool.broadcast(lambda: os.uname().nodename)
        infos = pool.broadcast(sky.instance_info)
        addresses = [s.address for s in standin_cloud.standins.values()]
        assert names == ["ip-" + a.replace(".", "-") for a in addresses]
        assert [i.head_addr for i in infos] == [addresses[0], addresses[0]]

    contract.runs_kept_warm_and_adopted(
        aws_cloud(standin_cloud),
        package_index,
        contract.jax_toy,
        plugins=contract.jax_plugins(),
        inside=inside,
    )


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


@pytest.mark.timeout(300)
def test_a_killed_clients_machines_power_themselves_off_and_down_removes_the_rest(
    standin_cloud: StandInCloud, package_index: PackageIndex, tmp_path: Path
) -> None:
    moto, ec2 = standin_cloud.moto, aws_cloud(standin_cloud)

    def after_the_watchdog() -> None:
        left = held(moto, "orphan")
        assert left["instances"] == []  # terminated by EC2 on power-off
        assert len(left["security groups"]) == 1 and len(left["key pairs"]) == 1
        assert pool_key_of(moto, "orphan", tmp_path) is not None  # the client's, left

    def listed(stdout: str) -> None:
        left = held(moto, "orphan")
        assert left["security groups"][0] in stdout and left["key pairs"][0] in stdout, stdout
        # down asks first: answered no, it removes nothing (one cloud checks the prompt).
        refused = contract.skyward(ec2, tmp_path, "down", "--pool", "orphan", answer="n\n")
        assert refused.returncode != 0, refused.stdout + refused.stderr
        assert held(moto, "orphan") == left

    contract.killed_clients_machines_end_themselves(
        ec2,
        package_index,
        tmp_path,
        ended_as=frozenset({"poweroff"}),
        after_the_watchdog=after_the_watchdog,
        listed=listed,
    )


@pytest.mark.timeout(180)
def test_ls_and_down_all_after_a_client_killed_mid_start(
    moto: MotoServer, ssh_hosts: Hosts, tmp_path: Path
) -> None:
    log = tmp_path / "client.log"
    with StandInCloud(moto, ssh_hosts, boot=False) as cloud:
        ec2 = aws_cloud(cloud)
        client = contract.start_client(ec2, "http://127.0.0.1:9/simple/", "killed", log)
        try:
            contract.wait_for_line(log, "connecting", client, 120)
            key_file = pool_key_of(moto, "killed", tmp_path)
            assert key_file is not None
        finally:
            client.kill()
            client.wait(30)
        left = held(moto, "killed")
        assert len(left["instances"]) == 2, log.read_text()
        listed = contract.skyward(ec2, tmp_path, "ls")
        assert listed.returncode == 0, listed.stderr
        # The resource table's rows (the recent pools below it name the pool too).
        rows = [line for line in listed.stdout.splitlines() if line.split()[:1] == ["aws"]]
        rows = [line for line in rows if " killed " in f" {line} "]
        assert len(rows) == 4, listed.stdout  # 2 instances, a group, a key pair
        instances = [r for r in rows if "instance" in r]
        assert all("running" in r and "0.20" in r for r in instances), listed.stdout
        assert "about $0.40/h" in listed.stdout
        removed = contract.skyward(ec2, tmp_path, "down", "--all", "--yes")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert nothing(held(moto, "killed"))
        assert not key_file.parent.exists()


# ── a machine lost (as AWS reclaims a spot instance) is replaced ───────────────────────


@pytest.mark.timeout(300)
def test_an_instance_aws_takes_away_is_replaced_and_the_pool_goes_on(
    standin_cloud: StandInCloud, package_index: PackageIndex, tmp_path: Path
) -> None:
    def take_away(lost: StandIn) -> str:
        standin_cloud.ec2.terminate_instances(InstanceIds=[lost.instance])  # AWS reclaims it
        return f"instance {lost.instance} is"  # EC2's reason is in the message

    contract.lost_machine_is_replaced(
        aws_cloud(standin_cloud), package_index, tmp_path, take_away, provider={"boot_timeout": 60}
    )


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
