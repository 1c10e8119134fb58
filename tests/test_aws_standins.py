"""The AWS provider end to end: moto creates the instances, stand-in VMs (network-namespace
hosts that boot from the instances' user data, in sandboxes that cannot stop this machine)
play the machines, and the pool reaches them at their private addresses."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
from support.aws import Checkpoint, held, nothing, provider, request
from support.moto import MotoServer
from support.reporter import Recorder
from support.sshhosts import USER, Hosts, PackageIndex
from support.standin import StandInCloud

import skyward as sky

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def aws(cloud: StandInCloud, **options: Any) -> sky.AWS:
    """The provider, pointed at the stand-ins' subnet and reaching them privately."""
    settings: dict[str, Any] = {
        "subnet_id": cloud.subnet,
        "connect": "private",
        "username": USER,
        **options,
    }
    return provider(cloud.moto, **settings)


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
                provider=aws(cloud), nodes=2, name="unreachable", provision_timeout=8, quiet=True
            ):
                pass
        message = str(caught.value) + "".join(getattr(caught.value, "__notes__", []))
        cause = caught.value.__cause__
        if cause is not None:
            message += str(cause) + "".join(getattr(cause, "__notes__", []))
        assert "provision_timeout (8 s)" in message, message
        assert "SSH did not answer from here" in message, message
        assert nothing(held(moto, "unreachable"))
