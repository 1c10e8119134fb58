"""Machines kept warm between pools (``keep_warm``), end to end on the GCP stand-ins: the
Compute Engine fake makes the instances, stand-in VMs boot from their user data (the
watchdog included) and the pools reach them over SSH with their pinned host key.

What is asserted is what a user sees: the second pool runs on the same machines (same
addresses, no new instance asked of the fake), a set that does not match or cannot be used
is not adopted (and is ended), the watchdog ends a set nobody came for, two pools never
share one, and ``skyward down`` ends kept machines and forgets their record. The warm start's
time is printed (``-s`` shows it), never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.clouds.gcp.standins import PROJECT, ZONE, GCPStandIns, TokenServer, held, nothing
from support.clouds.gcp.standins import standin_provider as gcp
from support.sshhosts import PackageIndex

import skyward as sky
from skyward.providers.cloud import warm
from skyward.providers.cloud.boot import KEEP_FILE, HostKey


def _pool(
    cloud: GCPStandIns, index: PackageIndex, name: str, *, nodes: int = 2, **options: Any
) -> sky.ComputePool:
    settings = {k: options.pop(k) for k in ("idle_timeout",) if k in options}
    return sky.ComputePool(
        provider=gcp(cloud, boot_timeout=60, **settings),
        nodes=nodes,
        image=sky.Image(index_url=index.url),
        name=name,
        quiet=True,
        **options,
    )


def _hostname() -> str:
    return os.uname().nodename


def _inserts(cloud: GCPStandIns) -> int:
    return len(cloud.fake.requests("POST", "projects/*/zones/*/instances"))


def _kept(pool: str) -> list[warm.WarmSet]:
    return [w for w in warm.kept() if w.pool == pool]


def _keep_file(cloud: GCPStandIns, instance: str) -> Path:
    return cloud.standins[instance].directory / "home" / KEEP_FILE


@pytest.mark.timeout(300)
def test_a_pool_closed_with_keep_warm_leaves_its_machines_to_the_next_pool_like_it(
    gcp_standins: GCPStandIns, package_index: PackageIndex
) -> None:
    with _pool(gcp_standins, package_index, "warm-a", keep_warm=300) as first:
        before = first.broadcast(_hostname)
    (kept,) = _kept("warm-a")
    assert kept.nodes == 2 and 280 < kept.left() <= 300
    assert len(held(gcp_standins.fake, "warm-a")["instances"]) == 2
    assert not any(s.ended for s in gcp_standins.standins.values())
    for machine in kept.machines:  # each watchdog was told how long to keep its machine
        assert _keep_file(gcp_standins, machine.id).read_text().strip().isdigit()
    inserts = _inserts(gcp_standins)

    started = time.monotonic()
    with _pool(gcp_standins, package_index, "warm-b") as second:
        ready = time.monotonic() - started
        after = second.broadcast(_hostname)
        timings = second.timings()
        lifted = [_keep_file(gcp_standins, m.id).exists() for m in kept.machines]
    print(f"\nwarm start, 2 nodes on GCP stand-ins: ready in {ready:.2f} s; {timings}")
    assert after == before  # the same machines, node for node
    assert _inserts(gcp_standins) == inserts  # and no new instance asked for
    assert lifted == [False, False]  # the adopter's own idle bound holds again
    assert {"provision", "workers", "warm.claim", "warm.reach"} <= set(timings)
    assert _kept("warm-a") == []
    # The second pool kept nothing: its close deleted the first pool's machines and rules.
    assert nothing(held(gcp_standins.fake, "warm-a"))


@pytest.mark.timeout(300)
def test_a_pool_of_another_spec_or_size_starts_its_own_machines(
    gcp_standins: GCPStandIns, package_index: PackageIndex
) -> None:
    with _pool(gcp_standins, package_index, "warm-c", nodes=1, keep_warm=300) as first:
        (before,) = first.broadcast(_hostname)
    inserts = _inserts(gcp_standins)
    with _pool(gcp_standins, package_index, "other-spec", nodes=1, idle_timeout=900) as other:
        (elsewhere,) = other.broadcast(_hostname)
    with _pool(gcp_standins, package_index, "other-size", nodes=2) as bigger:
        bigger.broadcast(_hostname)
    assert elsewhere != before
    assert _inserts(gcp_standins) == inserts + 3
    assert len(_kept("warm-c")) == 1  # still kept, for a pool like it
    with _pool(gcp_standins, package_index, "like-c", nodes=1) as same:
        assert same.broadcast(_hostname) == [before]
    assert nothing(held(gcp_standins.fake, "warm-c"))


def _marker() -> str:
    return Path(os.environ["SKYWARD_TEST_MARK_FILE"]).read_text()


@pytest.mark.timeout(300)
def test_a_pool_with_another_image_adopts_the_machines_and_builds_its_environment_there(
    gcp_standins: GCPStandIns, package_index: PackageIndex
) -> None:
    with _pool(gcp_standins, package_index, "warm-i", nodes=1, keep_warm=300) as first:
        (before,) = first.broadcast(_hostname)
    inserts = _inserts(gcp_standins)
    image = sky.Image(
        index_url=package_index.url,
        setup=["echo adopted > $HOME/mark"],  # a new environment, made on the kept machine
        env={"SKYWARD_TEST_MARK_FILE": "/home/skytest/mark"},
    )
    with sky.ComputePool(
        provider=gcp(gcp_standins, boot_timeout=60), nodes=1, image=image, name="new-image"
    ) as second:
        (after,) = second.broadcast(_hostname)
        (mark,) = second.broadcast(_marker)
    assert after == before and _inserts(gcp_standins) == inserts
    assert mark.strip() == "adopted"
    assert nothing(held(gcp_standins.fake, "warm-i"))


def _delete_one(cloud: GCPStandIns, kept: warm.WarmSet) -> None:
    cloud.fake.delete_instance(PROJECT, ZONE, kept.machines[1].id)
    cloud.wait_for(
        lambda: cloud.standins[kept.machines[1].id].ended, 30, "the deleted instance's stand-in"
    )


def _wrong_host_key(cloud: GCPStandIns, kept: warm.WarmSet) -> None:
    path = warm.warm_dir() / f"{kept.id}.json"
    record = json.loads(path.read_text())
    record["host_key"] = HostKey.generate().public  # another machine now answers there
    path.write_text(json.dumps(record))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "harm", [_delete_one, _wrong_host_key], ids=["machine-deleted", "host-key-changed"]
)
def test_a_kept_set_with_a_machine_gone_or_untrusted_is_ended_and_new_machines_start(
    gcp_standins: GCPStandIns, package_index: PackageIndex, harm: Any
) -> None:
    with _pool(gcp_standins, package_index, "warm-k", keep_warm=300) as first:
        before = first.broadcast(_hostname)
    (kept,) = _kept("warm-k")
    harm(gcp_standins, kept)
    inserts = _inserts(gcp_standins)
    with _pool(gcp_standins, package_index, "after-harm") as second:
        after = second.broadcast(_hostname)
        assert nothing(held(gcp_standins.fake, "warm-k"))  # the kept set was ended whole
    assert set(after).isdisjoint(before)
    assert _inserts(gcp_standins) == inserts + 2
    assert _kept("warm-k") == []


@pytest.mark.timeout(300)
def test_the_watchdog_ends_kept_machines_when_their_time_is_up_and_no_pool_came(
    gcp_standins: GCPStandIns, package_index: PackageIndex
) -> None:
    # idle_timeout=30: the watchdog looks every 5 s; it would wait 30 s for a client, but
    # the keep ends the machines 4 s after the pool's close.
    with _pool(gcp_standins, package_index, "warm-w", idle_timeout=30, keep_warm=4) as first:
        first.broadcast(_hostname)
    (kept,) = _kept("warm-w")
    gcp_standins.wait_for(
        lambda: all(gcp_standins.standins[m.id].ended for m in kept.machines),
        60,
        "the kept machines ended by their watchdog",
    )
    for machine in kept.machines:
        standin = gcp_standins.standins[machine.id]
        said = (standin.directory / "var-log" / "skyward-watchdog.log").read_text()
        assert "kept warm until" in said and "no pool came for it" in said, said
        # GCE keeps a powered-off instance (and bills its disk): its watchdog's hook
        # deleted it through the API first, as for a client that vanished.
        assert f"skyward-release: deleting {machine.id}" in said, said
    assert held(gcp_standins.fake, "warm-w")["instances"] == []
    # The next pool like it finds the set's time up: it deletes what is left (the rules) and
    # starts its own.
    with _pool(gcp_standins, package_index, "after-w", idle_timeout=30) as second:
        second.broadcast(_hostname)
    assert nothing(held(gcp_standins.fake, "warm-w"))
    assert _kept("warm-w") == []


@pytest.mark.timeout(300)
def test_two_pools_racing_for_one_kept_set_one_adopts_it_the_other_starts_its_own(
    gcp_standins: GCPStandIns, package_index: PackageIndex
) -> None:
    with _pool(gcp_standins, package_index, "warm-r", nodes=1, keep_warm=300) as first:
        (before,) = first.broadcast(_hostname)
    inserts = _inserts(gcp_standins)
    both = threading.Barrier(2)
    seen: dict[str, str] = {}
    errors: list[BaseException] = []

    def race(name: str) -> None:
        try:
            both.wait(10)
            with _pool(gcp_standins, package_index, name, nodes=1) as pool:
                (seen[name],) = pool.broadcast(_hostname)
                both.wait(120)  # both run at once: neither closes before the other started
        except BaseException as exc:
            errors.append(exc)
            both.abort()

    threads = [threading.Thread(target=race, args=(f"racer-{i}",)) for i in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    assert errors == []
    assert sorted(name == before for name in seen.values()) == [False, True]
    assert _inserts(gcp_standins) == inserts + 1
    assert nothing(held(gcp_standins.fake, "warm-r"))


def _skyward(cloud: GCPStandIns, key: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_"))}
    env.update(GOOGLE_APPLICATION_CREDENTIALS=str(key), SKYWARD_GCP_ENDPOINT=cloud.fake.url)
    return subprocess.run(
        [str(Path(sys.executable).parent / "skyward"), *args, "--cloud", "gcp"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.timeout(300)
def test_skyward_ls_shows_kept_machines_and_down_ends_them_and_forgets_them(
    gcp_standins: GCPStandIns, package_index: PackageIndex, tmp_path: Path
) -> None:
    with _pool(gcp_standins, package_index, "warm-d", nodes=1, keep_warm=600) as first:
        first.broadcast(_hostname)
    (kept,) = _kept("warm-d")
    tokens = TokenServer()
    try:
        key = tokens.key_file(tmp_path)
        listed = _skyward(gcp_standins, key, "ls", "--pool", "warm-d")
        assert listed.returncode == 0, listed.stderr
        assert "Warm machines" in listed.stdout, listed.stdout
        rows = [line for line in listed.stdout.splitlines() if kept.machines[0].id in line]
        assert len(rows) == 2, listed.stdout  # the tagged instance, and the warm record
        assert any("warm-d" in row and "min left" in row and "/h" in row for row in rows)
        removed = _skyward(gcp_standins, key, "down", "--pool", "warm-d", "--yes")
        assert removed.returncode == 0, removed.stdout + removed.stderr
    finally:
        tokens.close()
    assert nothing(held(gcp_standins.fake, "warm-d"))
    assert _kept("warm-d") == []
    assert not Path(kept.key_dir).exists()
