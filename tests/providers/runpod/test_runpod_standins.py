"""The RunPod provider end to end: the fake of RunPod's APIs rents the pods, stand-in
containers (network-namespace hosts in sandboxes, with no cloud-init) run each pod's start
command as RunPod runs it, and the pool reaches them on the public port RunPod maps to their
port 22 (a forwarder on the test bridge, never 22)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.clouds.runpod.fake import KEY, RunPodFake
from support.clouds.runpod.standins import RunPodStandIns, standin_provider
from support.pools import broadcast_in_background
from support.sshhosts import PackageIndex

import skyward as sky


@sky.compute
def square(x: int) -> tuple[int, str]:
    return x * x, os.uname().nodename


@pytest.mark.timeout(300)
def test_a_map_over_two_pods_returns_its_results_and_leaves_nothing(
    runpod_standins: RunPodStandIns, package_index: PackageIndex
) -> None:
    fake = runpod_standins.fake
    with sky.ComputePool(
        provider=standin_provider(runpod_standins),
        accelerator="RTX_4090",
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        name="runpod-map",
        quiet=True,
    ) as pool:
        pods = {p["id"] for p in fake.live()}
        ports = {int(p["portMappings"]["22"]) for p in fake.live()}
        results = list(pool.map(square, range(8)))
        names = pool.broadcast(lambda: os.uname().nodename)
    assert [value for value, _ in results] == [x * x for x in range(8)]
    assert {runpod_standins.pod_of(name) for name in names} == pods and len(pods) == 2
    assert 22 not in ports and len(ports) == 2  # SSH through RunPod's mapped ports
    assert fake.live() == []
    runpod_standins.wait_for(
        lambda: all(s.ended for s in runpod_standins.standins.values()),
        30,
        "stand-ins stopped when their pods were terminated",
    )


def _sleep_on(rank: int) -> None:
    if sky.instance_info().node == rank:
        time.sleep(600)


@pytest.mark.timeout(300)
def test_an_interrupted_spot_pod_is_named_in_worker_lost_and_replaced(
    runpod_standins: RunPodStandIns, package_index: PackageIndex
) -> None:
    fake = runpod_standins.fake
    with sky.ComputePool(
        provider=standin_provider(runpod_standins, spot=True, boot_timeout=60),
        accelerator="RTX_4090",
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        name="runpod-outbid",
        quiet=True,
    ) as pool:
        before = pool.broadcast(lambda: os.uname().nodename)
        lost = runpod_standins.pod_of(before[1])
        in_flight = broadcast_in_background(pool, _sleep_on, 1)
        time.sleep(0.5)
        fake.interrupt(lost)  # outbid: RunPod stops node 1's pod
        failure = in_flight.exception(timeout=120)
        assert isinstance(failure, sky.WorkerLost)
        assert f"pod {lost} is EXITED: interrupted: RunPod stopped this spot pod" in str(failure)
        end = time.monotonic() + 180
        while pool.statistics().ready_nodes < 2 or len(runpod_standins.standins) < 3:
            assert time.monotonic() < end, runpod_standins.events
            time.sleep(0.2)
        after = pool.broadcast(lambda: os.uname().nodename)
        rents = fake.requests("podRentInterruptable")
    assert after[0] == before[0] and after[1] not in before
    assert len(rents) == 3 and rents[2]["input"]["name"].endswith("-n1-r1")
    assert all(r["input"]["bidPerGpu"] == 0.2 for r in rents)
    assert fake.live() == []


# ── a client killed: the watchdog ends its containers; skyward ls / down the pods ────────

_CLIENT = """
import time
import skyward as sky
runpod = sky.RunPod(**{settings!r})
with sky.ComputePool(provider=runpod, accelerator="RTX_4090", nodes=2,
                     image=sky.Image(index_url={index!r}), name="orphan", console="plain") as pool:
    print("READY", flush=True)
    pool.broadcast(time.sleep, 3600)  # a long job, its client attached
"""


def _skyward(fake: RunPodFake, keys: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUNPOD_API_KEY": KEY, "SKYWARD_RUNPOD_ENDPOINT": fake.url}
    env["TMPDIR"] = str(keys)  # where the client left its pool key
    return subprocess.run(
        [str(Path(sys.executable).parent / "skyward"), *args, "--cloud", "runpod"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.timeout(300)
def test_a_killed_clients_containers_end_themselves_and_down_terminates_their_pods(
    runpod_standins: RunPodStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    fake = runpod_standins.fake
    # An idle bound short enough for a test, long enough that a loaded machine's pauses in
    # the watchdog's reading of /proc/net/tcp never read as an absent client.
    settings = standin_provider(runpod_standins, idle_timeout=6, boot_timeout=120).model_dump(
        exclude_defaults=True
    )
    script = _CLIENT.format(settings=settings, index=package_index.url)
    log = tmp_path / "client.log"
    with open(log, "wb") as out:
        env = {**os.environ, "TMPDIR": str(tmp_path)}  # its pool key, which it cannot delete
        client = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=out, env=env)
    try:
        end = time.monotonic() + 240
        while "READY" not in log.read_text():
            assert client.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.1)
        time.sleep(12)  # well past idle_timeout, its client attached: nothing stops
        assert client.poll() is None, log.read_text()
        assert all(not s.ended for s in runpod_standins.standins.values())
    finally:
        client.kill()
        client.wait(30)
    (key,) = tmp_path.glob("skyward-key-*")
    runpod_standins.wait_for(
        lambda: all(s.ended == "signal-TERM" for s in runpod_standins.standins.values()),
        90,
        "the watchdog ended each container's main process",
    )
    pods = fake.live()
    # RunPod keeps a stopped pod (and bills its volume): EXITED until it is terminated.
    assert [p["desiredStatus"] for p in pods] == ["EXITED", "EXITED"]
    assert all(p["volumeInGb"] == 0 for p in pods)
    listed = _skyward(fake, tmp_path, "ls", "--pool", "orphan")
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if line.startswith("runpod ")]
    assert len(rows) == 2 and all("exited" in row for row in rows), listed.stdout
    removed = _skyward(fake, tmp_path, "down", "--pool", "orphan", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert fake.live() == []
    assert not key.exists()  # the killed client's pool key, stale once its pods are gone
    assert "Nothing left" in _skyward(fake, tmp_path, "ls").stdout


@pytest.mark.timeout(300)
def test_pods_kept_warm_are_adopted_by_the_next_pool_and_its_close_terminates_them(
    runpod_standins: RunPodStandIns, package_index: PackageIndex
) -> None:
    fake = runpod_standins.fake

    def pool(name: str, **options: float) -> sky.ComputePool:
        return sky.ComputePool(
            provider=standin_provider(runpod_standins),
            accelerator="RTX_4090",
            nodes=2,
            image=sky.Image(index_url=package_index.url),
            name=name,
            quiet=True,
            **options,
        )

    with pool("runpod-warm", keep_warm=300) as first:
        before = first.broadcast(lambda: os.uname().nodename)
        pods = {p["id"] for p in fake.live()}
    assert {p["id"] for p in fake.live()} == pods  # kept: still rented
    started = time.monotonic()
    with pool("runpod-next") as second:
        ready = time.monotonic() - started
        after = second.broadcast(lambda: os.uname().nodename)
        assert {p["id"] for p in fake.live()} == pods  # no pod rented anew
    print(f"\nwarm start, 2 pods on RunPod stand-ins: ready in {ready:.2f} s; {second.timings()}")
    assert after == before
    assert fake.live() == []
