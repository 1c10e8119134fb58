"""The Lambda provider end to end: the fake of Lambda's API launches the instances, stand-in
VMs (network-namespace hosts that boot from the instances' ``user_data``, in sandboxes that
cannot stop this machine) play the machines, and the pool reaches them at their private
addresses, which their peers use too."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from support.clouds.lambdacloud.fake import KEY
from support.clouds.lambdacloud.standins import LambdaStandIns, held, nothing
from support.clouds.lambdacloud.standins import standin_provider as lam
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


@pytest.mark.timeout(600)
def test_jax_multi_controller_toy_on_two_lambda_stand_ins_leaves_nothing(
    lambda_standins: LambdaStandIns, package_index: PackageIndex
) -> None:
    toy = _toy()
    with sky.ComputePool(
        # A type outside the catalog: the pool has no accelerator, and installs CPU jax.
        provider=lam(lambda_standins, instance_type="gpu_1x_a10"),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.jax(cpu_devices=4)],
        name="lambda-jax",
        quiet=True,
    ) as pool:
        names = pool.broadcast(lambda: os.uname().nodename)
        heads = pool.broadcast(lambda: sky.instance_info().head_addr)
        results = toy() @ pool
    assert [value for value, _ in results] == [-0.12398731708526611, -0.12398731708526611]
    addresses = [s.address for s in lambda_standins.standins.values()]
    assert names == ["ip-" + a.replace(".", "-") for a in addresses]
    assert heads == [addresses[0], addresses[0]]  # peers meet at the private address
    assert nothing(held(lambda_standins.fake, "lambda-jax"))
    lambda_standins.wait_for(
        lambda: all(s.ended for s in lambda_standins.standins.values()),
        30,
        "stand-ins stopped when their instances were terminated",
    )


# ── a client killed: its machines power off, still billed; skyward ls / down end them ──

_CLIENT = """
import time
import skyward as sky
lam = sky.Lambda(**{settings!r})
with sky.ComputePool(provider=lam, nodes=2,
                     image=sky.Image(index_url={index!r}), name={pool!r},
                     console="plain") as pool:
    print("READY", flush=True)
    pool.broadcast(time.sleep, 3600)  # a long job, its client attached
"""


def _skyward(cloud: LambdaStandIns, *args: str) -> Any:
    env = {**os.environ, "LAMBDA_API_KEY": KEY, "SKYWARD_LAMBDA_ENDPOINT": cloud.fake.url}
    return subprocess.run(
        [str(Path(sys.executable).parent / "skyward"), *args, "--cloud", "lambdacloud"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.timeout(300)
def test_a_killed_clients_machines_power_off_and_down_terminates_them(
    lambda_standins: LambdaStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    settings = lam(
        lambda_standins, instance_type="gpu_1x_a10", idle_timeout=3, boot_timeout=120
    ).model_dump(exclude_defaults=True)
    script = _CLIENT.format(settings=settings, index=package_index.url, pool="orphan")
    log = tmp_path / "client.log"
    with open(log, "wb") as out:
        client = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=out)
    try:
        end = time.monotonic() + 240
        while "READY" not in log.read_text():
            assert client.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.1)
        # The job runs well past idle_timeout while its client is attached: nothing stops.
        time.sleep(8)
        assert client.poll() is None, log.read_text()
        assert all(not s.ended for s in lambda_standins.standins.values())
    finally:
        client.kill()
        client.wait(30)
    for stale in Path(tempfile.gettempdir()).glob("skyward-key-*/about.json"):
        if '"pool": "orphan"' in stale.read_text():
            shutil.rmtree(stale.parent)  # a killed client cannot delete its pool key
    lambda_standins.wait_for(
        lambda: all(s.ended == "poweroff" for s in lambda_standins.standins.values()),
        90,
        "the stand-ins powered themselves off",
    )
    # Lambda keeps an instance that powered itself off, and bills it: the watchdog holds no
    # key to terminate it with (the account's key never goes on a machine).
    left = held(lambda_standins.fake, "orphan")
    assert len(left["instances"]) == 2 and left["rulesets"] and left["ssh keys"]
    for standin in lambda_standins.standins.values():
        said = (standin.directory / "var-log" / "skyward-watchdog.log").read_text()
        assert "skyward-watchdog: no SSH client for" in said and "powering off" in said, said

    listed = _skyward(lambda_standins, "ls", "--pool", "orphan")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = [line for line in listed.stdout.splitlines() if line.startswith("lambdacloud ")]
    assert len(rows) == 4, listed.stdout  # two instances, the ruleset, the key
    removed = _skyward(lambda_standins, "down", "--pool", "orphan", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert nothing(held(lambda_standins.fake, "orphan"))
    assert "Nothing left" in _skyward(lambda_standins, "ls").stdout


@pytest.mark.timeout(300)
def test_instances_kept_warm_are_adopted_by_the_next_pool_and_its_close_ends_them(
    lambda_standins: LambdaStandIns, package_index: PackageIndex
) -> None:
    fake = lambda_standins.fake

    def pool(name: str, **options: float) -> sky.ComputePool:
        return sky.ComputePool(
            provider=lam(lambda_standins, instance_type="gpu_1x_a10"),
            nodes=2,
            image=sky.Image(index_url=package_index.url),
            name=name,
            quiet=True,
            **options,
        )

    with pool("lambda-warm", keep_warm=300) as first:
        before = first.broadcast(lambda: os.uname().nodename)
    kept = held(fake, "lambda-warm")["instances"]
    assert len(kept) == 2  # still there after the close
    started = time.monotonic()
    with pool("lambda-next") as second:
        ready = time.monotonic() - started
        after = second.broadcast(lambda: os.uname().nodename)
        assert held(fake, "lambda-warm")["instances"] == kept  # no instance launched anew
        assert nothing(held(fake, "lambda-next"))
    print(f"\nwarm start, 2 instances on Lambda stand-ins: ready in {ready:.2f} s")
    assert after == before
    assert nothing(held(fake, "lambda-warm"))
