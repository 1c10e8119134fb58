"""Images that fit the machine: the AMI follows the instance type's architecture (arm64 for
Graviton), GPU types whose GPUs the default driver cannot run get no default image, and a
GPU node that shows fewer GPUs than its type has fails the pool, naming what it saw.

moto answers ``describe_instance_types`` (architectures, GPUs) as EC2 does; stand-in VMs
(``support/clouds/aws/standins.py``) play the machines, with a fake ``nvidia-smi`` laid over their
``/usr/bin`` (``support/hostimage.py``) standing in for the driver.
"""

from __future__ import annotations

import pytest
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import held, nothing, provider, request
from support.clouds.aws.pools import standin_provider as aws
from support.clouds.aws.standins import StandInCloud
from support.hostimage import HostImage, fake_nvidia_smi
from support.reporter import Recorder
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.providers.aws.machines import CPU_AMI_PARAMETERS, GPU_AMI_PARAMETERS


@pytest.mark.parametrize(
    ("instance_type", "parameter"),
    [
        ("m7i.xlarge", CPU_AMI_PARAMETERS["x86_64"]),
        ("m7g.large", CPU_AMI_PARAMETERS["arm64"]),
        ("g5.xlarge", GPU_AMI_PARAMETERS["x86_64"]),
        ("g5g.xlarge", GPU_AMI_PARAMETERS["arm64"]),
    ],
)
def test_the_default_image_follows_the_types_architecture_and_gpus(
    moto: MotoServer, instance_type: str, parameter: str
) -> None:
    """moto has none of AWS's public parameters: the error names the one that was read."""
    made = request(nodes=1)
    aws_ = provider(moto, instance_type=instance_type, ami_parameter=None)
    with pytest.raises(sky.ProvisionError, match=f"reading {parameter}"):
        aws_.provision(made, Recorder())
    assert nothing(held(moto, made.pool))
    assert ("arm64" in parameter) == instance_type.startswith(("m7g", "g5g"))


def test_an_image_for_another_architecture_is_refused_before_anything_is_made(
    moto: MotoServer,
) -> None:
    made = request(nodes=1)
    graviton = provider(moto, instance_type="m7g.large")  # moto's Ubuntu AMI is x86_64
    with pytest.raises(sky.ProvisionError, match=r"built for x86_64, but m7g\.large runs arm64"):
        graviton.provision(made, Recorder())
    assert nothing(held(moto, made.pool))


def test_v100_types_get_no_default_image(moto: MotoServer) -> None:
    """The open-driver image cannot run a V100: said when the pool is built, unless the user
    names an image (one with NVIDIA's proprietary driver)."""
    with pytest.raises(ValueError, match=r"p3\.2xlarge has GPUs older than Turing"):
        sky.ComputePool(
            provider=provider(moto, instance_type="p3.2xlarge", ami_parameter=None), quiet=True
        )
    sky.ComputePool(provider=provider(moto, instance_type="p3.2xlarge"), quiet=True)


def _read(path: str) -> str:
    with open(path, errors="replace") as file:
        return file.read()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shown", [None, 3, 4])
def test_a_gpu_node_must_show_as_many_gpus_as_its_type_has(
    moto: MotoServer, ssh_hosts: Hosts, package_index: PackageIndex, shown: int | None
) -> None:
    """A g5.12xlarge has 4 A10G. A node without nvidia-smi, or whose nvidia-smi lists 3,
    fails the start (a JAX program would run on its CPU); one that lists 4 runs."""
    tools = {} if shown is None else {"nvidia-smi": fake_nvidia_smi(shown)}
    with StandInCloud(moto, ssh_hosts, image=HostImage(tools=tools)) as cloud:
        pool = sky.ComputePool(
            provider=aws(cloud),
            accelerator="A10G:4",
            image=sky.Image(index_url=package_index.url),
            name=f"gpus-{shown}",
            quiet=True,
        )
        if shown == 4:
            with pool:
                assert pool.run(sky.instance_info).accelerators == 4
                # The image's overlay on /usr/bin keeps the sandbox's stand-in for systemctl.
                assert "sandbox shim" in pool.run(_read, "/usr/bin/systemctl")
        else:
            with pytest.raises(sky.ProvisionError) as caught:
                pool.start()
            message = str(caught.value)
            assert "node 0 (skytest@" in message
            assert "a g5.12xlarge has 4 GPU(s), but this node shows 0" in message or (
                "a g5.12xlarge has 4 GPU(s), but this node shows 3" in message
            )
            if shown is None:
                assert "no nvidia-smi, and device files none" in message
            else:
                assert "`nvidia-smi -L` listed 3: GPU 0: NVIDIA A10G" in message
        cloud.wait_for(lambda: all(s.ended for s in cloud.standins.values()), 30, "stand-ins down")
        assert nothing(held(moto, f"gpus-{shown}"))
    assert not cloud.leftovers()
