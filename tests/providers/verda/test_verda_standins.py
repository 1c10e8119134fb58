"""The Verda provider end to end: the fake of Verda's API rents the instances, stand-in VMs
(network-namespace hosts in sandboxes that cannot stop this machine) boot from the pool's
startup script as a Verda image does, and the pool reaches them at the one address Verda
gives each. The peers use that address too: Verda's instances share no private network."""

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
from support.clouds.verda.fake import CLIENT_ID, CLIENT_SECRET
from support.clouds.verda.standins import VerdaStandIns, held, nothing
from support.clouds.verda.standins import standin_provider as verda
from support.pools import broadcast_in_background
from support.sshhosts import PackageIndex

import skyward as sky


def _toy() -> Any:
    spec = importlib.util.spec_from_file_location(
        "jax_multicontroller", ROOT / "examples" / "jax_multicontroller.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.toy


@pytest.mark.timeout(600)
def test_jax_multi_controller_toy_on_two_verda_stand_ins_leaves_nothing(
    verda_standins: VerdaStandIns, package_index: PackageIndex
) -> None:
    toy = _toy()
    with sky.ComputePool(
        provider=verda(verda_standins),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.jax(cpu_devices=4)],
        name="verda-jax",
        quiet=True,
    ) as pool:
        names = pool.broadcast(lambda: os.uname().nodename)
        peers = pool.broadcast(lambda: sky.instance_info().peers)
        results = toy() @ pool
        by_rank = sorted((i["hostname"], i["ip"]) for i in verda_standins.fake.instances())
    assert [value for value, _ in results] == [-0.12398731708526611, -0.12398731708526611]
    addresses = [ip for _, ip in by_rank]  # <base>-n0, <base>-n1: the one address Verda gives
    assert names == ["ip-" + a.replace(".", "-") for a in addresses]
    assert all(a in str(peers) for a in addresses)
    assert nothing(held(verda_standins.fake, "verda-jax"))
    verda_standins.wait_for(
        lambda: all(s.ended for s in verda_standins.standins.values()),
        30,
        "stand-ins stopped when their instances were deleted",
    )


# ── a client killed: the watchdog powers the instances off; skyward down deletes them ──

_CLIENT = """
import time
import skyward as sky
verda = sky.Verda(**{settings!r})
with sky.ComputePool(provider=verda, nodes=2, image=sky.Image(index_url={index!r}),
                     name={pool!r}, console="plain") as pool:
    print("READY", flush=True)
    pool.broadcast(time.sleep, 3600)  # a long job, its client attached
"""


def _skyward(cloud: VerdaStandIns, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERDA_")}
    env.update(
        VERDA_CLIENT_ID=CLIENT_ID,
        VERDA_CLIENT_SECRET=CLIENT_SECRET,
        SKYWARD_VERDA_ENDPOINT=cloud.fake.url,
    )
    return subprocess.run(
        [str(Path(sys.executable).parent / "skyward"), *args, "--cloud", "verda"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.timeout(300)
def test_a_killed_clients_instances_power_off_and_down_deletes_them(
    verda_standins: VerdaStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    settings = verda(verda_standins, idle_timeout=3, boot_timeout=120).model_dump(
        exclude_defaults=True
    )
    settings.update(client_id=CLIENT_ID, client_secret=CLIENT_SECRET)
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
        time.sleep(8)  # well past idle_timeout, its client attached: nothing stops
        assert client.poll() is None, log.read_text()
        assert all(not s.ended for s in verda_standins.standins.values()), verda_standins.events
    finally:
        client.kill()
        client.wait(30)
    for stale in Path(tempfile.gettempdir()).glob("skyward-key-*/about.json"):
        if '"pool": "orphan"' in stale.read_text():
            shutil.rmtree(stale.parent)  # a killed client cannot delete its pool key
    verda_standins.wait_for(
        lambda: all(s.ended for s in verda_standins.standins.values()),
        90,
        "the stand-ins powered themselves off",
    )
    # Verda keeps an instance that powered itself off, offline, and bills it: the account's
    # key never went to the machine, so nothing there could delete it.
    fake = verda_standins.fake
    left = [i for i in fake.instances() if i["hostname"].startswith("skyward-orphan-")]
    assert [i["status"] for i in left] == ["offline", "offline"], verda_standins.events
    for standin in verda_standins.standins.values():
        said = (standin.directory / "var-log" / "skyward-watchdog.log").read_text()
        assert "skyward-watchdog: no SSH client for" in said, said
    listed = _skyward(verda_standins, "ls", "--pool", "orphan")
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if line.startswith("verda ")]
    assert len(rows) == 4, listed.stdout  # two instances, the script, the key
    removed = _skyward(verda_standins, "down", "--pool", "orphan", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert nothing(held(fake, "orphan")), held(fake, "orphan")
    assert "Nothing left" in _skyward(verda_standins, "ls").stdout


# ── a spot instance Verda takes back is replaced ───────────────────────────────────────


def _sleep_on(rank: int) -> None:
    if sky.instance_info().node == rank:
        time.sleep(600)


@pytest.mark.timeout(300)
def test_a_reclaimed_spot_instance_is_named_in_worker_lost_and_replaced(
    verda_standins: VerdaStandIns, package_index: PackageIndex
) -> None:
    fake = verda_standins.fake
    with sky.ComputePool(
        provider=verda(verda_standins, spot=True, boot_timeout=60),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        name="reclaimed",
        quiet=True,
    ) as pool:
        before = pool.broadcast(lambda: os.uname().nodename)
        first = {s.address: s.instance for s in verda_standins.standins.values()}
        lost = first[before[1].removeprefix("ip-").replace("-", ".")]
        in_flight = broadcast_in_background(pool, _sleep_on, 1)
        time.sleep(0.5)
        fake.reclaim(lost)
        failure = in_flight.exception(timeout=120)
        assert isinstance(failure, sky.WorkerLost)
        assert f"instance {lost} is discontinued: Verda discontinued it" in str(failure)
        end = time.monotonic() + 180
        while pool.statistics().ready_nodes < 2 or len(verda_standins.standins) < 3:
            assert time.monotonic() < end, verda_standins.events
            time.sleep(0.2)
        after = pool.broadcast(lambda: os.uname().nodename)
        (replacement,) = [
            s for s in verda_standins.standins.values() if s.instance not in first.values()
        ]
        hostnames = {i["id"]: i["hostname"] for i in fake.instances()}
        assert hostnames[replacement.instance].endswith("-n1-r1") and not replacement.ended
    assert after[0] == before[0]
    assert after[1] == "ip-" + replacement.address.replace(".", "-")
    assert nothing(held(fake, "reclaimed"))


@pytest.mark.timeout(300)
def test_instances_kept_warm_are_adopted_by_the_next_pool_and_its_close_ends_them(
    verda_standins: VerdaStandIns, package_index: PackageIndex
) -> None:
    fake = verda_standins.fake

    def pool(name: str, **options: float) -> sky.ComputePool:
        return sky.ComputePool(
            provider=verda(verda_standins),
            nodes=2,
            image=sky.Image(index_url=package_index.url),
            name=name,
            quiet=True,
            **options,
        )

    with pool("verda-warm", keep_warm=300) as first:
        before = first.broadcast(lambda: os.uname().nodename)
    kept = held(fake, "verda-warm")["instances"]
    assert len(kept) == 2  # still there after the close
    started = time.monotonic()
    with pool("verda-next") as second:
        ready = time.monotonic() - started
        after = second.broadcast(lambda: os.uname().nodename)
        assert held(fake, "verda-warm")["instances"] == kept  # no instance created anew
        assert nothing(held(fake, "verda-next"))
    print(f"\nwarm start, 2 instances on Verda stand-ins: ready in {ready:.2f} s")
    assert after == before
    assert nothing(held(fake, "verda-warm"))
