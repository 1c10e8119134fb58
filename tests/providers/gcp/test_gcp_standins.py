"""The GCP provider end to end: the Compute Engine fake creates the instances, stand-in VMs
(network-namespace hosts that boot from the instances' ``user-data`` metadata, in sandboxes
that cannot stop this machine) play the machines, and the pool reaches them at their private
addresses. The stand-ins reach the fake and a metadata server on the test bridge, as a VM
reaches Google's."""

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
from support.clouds.aws.fake import MotoServer
from support.clouds.gcp.standins import PROJECT, ZONE, GCPStandIns, TokenServer, held, nothing
from support.clouds.gcp.standins import standin_provider as gcp
from support.pools import broadcast_in_background
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
def test_jax_multi_controller_toy_on_two_gce_stand_ins_leaves_nothing(
    gcp_standins: GCPStandIns, package_index: PackageIndex
) -> None:
    toy = _toy()
    started = time.monotonic()
    with sky.ComputePool(
        provider=gcp(gcp_standins),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.jax(cpu_devices=4)],
        name="gcp-jax",
        quiet=True,
    ) as pool:
        ready = time.monotonic() - started
        names = pool.broadcast(lambda: os.uname().nodename)
        results = toy() @ pool
    print(f"ready after {ready:.1f} s")
    assert [value for value, _ in results] == [-0.12398731708526611, -0.12398731708526611]
    addresses = [s.address for s in gcp_standins.standins.values()]
    assert names == ["ip-" + a.replace(".", "-") for a in addresses]
    assert nothing(held(gcp_standins.fake, "gcp-jax"))
    gcp_standins.wait_for(
        lambda: all(s.ended for s in gcp_standins.standins.values()),
        30,
        "stand-ins stopped when their instances were deleted",
    )


# ── a client killed: the watchdog deletes its machines; skyward ls / down the rest ─────

_CLIENT = """
import time
from google.auth.credentials import AnonymousCredentials
import skyward as sky
gcp = sky.GCP(credentials=AnonymousCredentials(), **{settings!r})
with sky.ComputePool(provider=gcp, nodes=2, image=sky.Image(index_url={index!r}),
                     name={pool!r}, console="plain") as pool:
    print("READY", flush=True)
    pool.broadcast(time.sleep, 3600)  # a long job, its client attached
"""


def _skyward(cloud: GCPStandIns, key: Path, moto: MotoServer, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_"))}
    env.update(
        GOOGLE_APPLICATION_CREDENTIALS=str(key),
        SKYWARD_GCP_ENDPOINT=cloud.fake.url,
        AWS_ENDPOINT_URL=moto.url,  # ls looks at AWS too: at moto, never at AWS
        AWS_DEFAULT_REGION=moto.region,
    )
    return subprocess.run(
        [str(Path(sys.executable).parent / "skyward"), *args, "--cloud", "gcp", "--cloud", "aws"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.timeout(300)
def test_a_killed_clients_machines_delete_themselves_and_down_removes_the_rules(
    gcp_standins: GCPStandIns, package_index: PackageIndex, moto: MotoServer, tmp_path: Path
) -> None:
    settings = gcp(gcp_standins, idle_timeout=3, boot_timeout=120).model_dump(
        exclude_defaults=True, exclude={"credentials"}
    )
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
        assert all(not s.ended for s in gcp_standins.standins.values()), gcp_standins.events
        assert len(held(gcp_standins.fake, "orphan")["instances"]) == 2
    finally:
        client.kill()
        client.wait(30)
    for stale in Path(tempfile.gettempdir()).glob("skyward-key-*/about.json"):
        if '"pool": "orphan"' in stale.read_text():
            shutil.rmtree(stale.parent)  # a killed client cannot delete its pool key
    gcp_standins.wait_for(
        lambda: all(s.ended for s in gcp_standins.standins.values()),
        90,
        "the stand-ins powered themselves off",
    )
    left = held(gcp_standins.fake, "orphan")
    # Deleted by their own watchdog's hook, through the API (the client, SIGKILLed, could
    # not), before it powered off: GCE keeps a powered-off instance, and bills its disk.
    deletes = gcp_standins.fake.requests("DELETE", "projects/*/zones/*/instances/*")
    assert left["instances"] == [], (
        gcp_standins.events,
        [r.path for r in deletes],
        {name: s.log() for name, s in gcp_standins.standins.items()},
    )
    assert sorted(r.path.rsplit("/", 1)[-1] for r in deletes) == sorted(gcp_standins.standins)
    events = {what for what, _ in gcp_standins.events}
    assert "powered-off-kept" not in events, gcp_standins.events
    for name, standin in gcp_standins.standins.items():  # each kept its own account of it
        said = (standin.directory / "var-log" / "skyward-watchdog.log").read_text()
        assert f"skyward-release: deleting {name}" in said, said  # said before it asks
        assert "skyward-watchdog: no SSH client for" in said, said
    assert len(left["firewall rules"]) == 2

    tokens = TokenServer()
    try:
        key = tokens.key_file(tmp_path)
        listed = _skyward(gcp_standins, key, moto, "ls", "--pool", "orphan")
        assert listed.returncode == 0, listed.stderr
        rows = [line for line in listed.stdout.splitlines() if line.startswith("gcp ")]
        assert len(rows) == 2, listed.stdout
        assert all(any(rule in row for row in rows) for rule in left["firewall rules"])
        removed = _skyward(gcp_standins, key, moto, "down", "--pool", "orphan", "--yes")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert nothing(held(gcp_standins.fake, "orphan"))
        assert "Nothing left" in _skyward(gcp_standins, key, moto, "ls").stdout
    finally:
        tokens.close()


# ── a Spot VM Google reclaims is replaced ──────────────────────────────────────────────


def _sleep_on(rank: int) -> None:
    if sky.instance_info().node == rank:
        time.sleep(600)


@pytest.mark.timeout(300)
def test_a_reclaimed_spot_vm_is_named_in_worker_lost_and_replaced(
    gcp_standins: GCPStandIns, package_index: PackageIndex
) -> None:
    fake = gcp_standins.fake
    with sky.ComputePool(
        provider=gcp(gcp_standins, spot=True, boot_timeout=60),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        name="reclaimed",
        quiet=True,
    ) as pool:
        before = pool.broadcast(lambda: os.uname().nodename)
        first = {s.address: s.instance for s in gcp_standins.standins.values()}
        lost = first["-".join(before[1].split("-")[1:]).replace("-", ".")]
        in_flight = broadcast_in_background(pool, _sleep_on, 1)
        time.sleep(0.5)
        fake.preempt(PROJECT, ZONE, lost)  # Google reclaims node 1, and deletes it
        failure = in_flight.exception(timeout=120)
        assert isinstance(failure, sky.WorkerLost)
        assert f"instance {lost} is gone: reclaimed by GCP (spot preemption)" in str(failure)
        end = time.monotonic() + 180
        while pool.statistics().ready_nodes < 2 or len(gcp_standins.standins) < 3:
            assert time.monotonic() < end, gcp_standins.events
            time.sleep(0.2)
        after = pool.broadcast(lambda: os.uname().nodename)
        (replacement,) = [
            s for s in gcp_standins.standins.values() if s.instance not in first.values()
        ]
        assert replacement.instance.endswith("-n1-r1") and not replacement.ended
        assert gcp_standins.standins[lost].ended == "terminated"
    assert after[0] == before[0]
    assert after[1] == "ip-" + replacement.address.replace(".", "-")
    assert nothing(held(fake, "reclaimed"))
