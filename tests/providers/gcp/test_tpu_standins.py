"""Cloud TPU pools end to end: the TPU fake creates the slices, a stand-in host per TPU host
boots from the node's ``startup-script`` (as a TPU VM does), and the pool reaches each host
at its ``networkEndpoint``. CPU jax stands in for libtpu: the tests set
``SKYWARD_JAX_TPU_AS_CPU=1`` (``plugins/_jax.py``), so the plugin installs plain jax with
``JAX_PLATFORMS=cpu`` and ``cpu_devices`` plays each host's chips."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from support import standin_contract as contract
from support.clouds.gcp.standins import PROJECT, held, nothing
from support.clouds.gcp.tpu_standins import TPUStandIns, held_tpu
from support.pools import broadcast_in_background
from support.sshhosts import USER, PackageIndex

import skyward as sky
from skyward.plugins._jax import TPU_AS_CPU

ZONE = "us-central2-b"


def tpu_provider(cloud: TPUStandIns, **options: Any) -> sky.GCP:
    from google.auth.credentials import AnonymousCredentials

    settings: dict[str, Any] = {
        "project": PROJECT,
        "zone": ZONE,
        "endpoint": cloud.fake.url,
        "tpu_endpoint": cloud.tpu.url,
        "credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
        "ssh_cidr": "10.123.0.0/16",
        "connect": "private",
        "username": USER,
        "release_timeout": 30.0,
        "service_account": None,
        **options,
    }
    return sky.GCP(**settings)


def _left(cloud: TPUStandIns, pool: str) -> dict[str, list[str]]:
    return {**held_tpu(cloud.tpu, pool), "firewall rules": held(cloud.fake, pool)["firewall rules"]}


@pytest.mark.timeout(600)
def test_jax_toy_on_a_two_host_v4_16_slice_then_an_exception_in_the_pool_leaves_nothing(
    tpu_standins: TPUStandIns, package_index: PackageIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TPU_AS_CPU, "1")
    toy = contract.toy()
    phases: dict[str, float] = {}
    started = time.monotonic()
    # The user's own exception ends the pool: its close still deletes the slice, its queued
    # resource and its rules (the other tests close their pools without one).
    with pytest.raises(RuntimeError, match="the user's own"):
        with sky.ComputePool(
            provider=tpu_provider(tpu_standins),
            accelerator="v4-16",
            nodes=2,
            image=sky.Image(index_url=package_index.url),
            plugins=contract.jax_plugins(),
            name="tpu-jax",
            quiet=True,
        ) as pool:
            ready = time.monotonic()
            hosts = pool.broadcast(lambda: (os.uname().nodename, sky.instance_info().node))
            results = toy() @ pool
            raise RuntimeError("the user's own")
    tpu = tpu_standins.tpu
    (create,) = tpu.requests("POST", "projects/*/locations/*/queuedResources")
    (active,) = tpu.active_at.values()
    booted = max(tpu_standins.booted_at.values())
    phases = {
        "checks, keys, firewall rules": create.at - started,
        "queued resource to ACTIVE": active - create.at,
        "hosts seen READY and booted (stand-ins)": booted - active,
        "SSH, bootstrap, jax installed, workers, jax.distributed": ready - booted,
        "total": ready - started,
    }
    print("ComputePool(...) to ready: " + "; ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
    assert [value for value, _ in results] == [contract.TOY_RESULT] * 2
    (node,) = {name.split("/")[0] for name in tpu_standins.standins}
    by_worker = {
        int(name.split("/")[1]): "t1v-" + s.address.replace(".", "-")
        for name, s in tpu_standins.standins.items()
    }
    assert hosts == [(by_worker[0], 0), (by_worker[1], 1)]  # ranked as Google numbers workers
    assert _left(tpu_standins, "tpu-jax") == {
        "queued resources": [],
        "nodes": [],
        "firewall rules": [],
    }
    assert nothing(held(tpu_standins.fake, "tpu-jax"))
    assert node.startswith("skyward-tpu-jax-")
    tpu_standins.wait_for(
        lambda: all(s.ended for s in tpu_standins.standins.values()),
        30,
        "stand-ins stopped when their slice was deleted",
    )


def _sleep_on(rank: int) -> None:
    if sky.instance_info().node == rank:
        time.sleep(600)


@pytest.mark.timeout(600)
def test_a_preempted_spot_slice_is_named_replaced_whole_and_the_next_call_succeeds(
    tpu_standins: TPUStandIns, package_index: PackageIndex
) -> None:
    tpu = tpu_standins.tpu
    with sky.ComputePool(
        provider=tpu_provider(tpu_standins, boot_timeout=120),
        accelerator="v4-16",
        nodes=2,
        allocation="spot",
        image=sky.Image(index_url=package_index.url),
        name="tpu-preempted",
        quiet=True,
    ) as pool:
        before = pool.broadcast(lambda: os.uname().nodename)
        (node,) = {name.split("/")[0] for name in tpu_standins.standins}
        in_flight = broadcast_in_background(pool, _sleep_on, 1)
        time.sleep(0.5)
        tpu.preempt(PROJECT, ZONE, node)
        failure = in_flight.exception(timeout=120)
        assert isinstance(failure, sky.WorkerLost)
        assert f"TPU host {node}/1 is PREEMPTED: preempted by Google (spot)" in str(failure)
        end = time.monotonic() + 240
        while pool.statistics().ready_nodes < 2 or len(tpu_standins.standins) < 4:
            assert time.monotonic() < end, tpu_standins.events
            time.sleep(0.2)
        after = pool.broadcast(lambda: os.uname().nodename)
        fresh = {n.split("/")[0] for n, s in tpu_standins.standins.items() if not s.ended}
        assert len(fresh) == 1 and fresh != {node} and fresh.pop().endswith("-r1")
    assert len(set(after)) == 2 and not set(after) & set(before)
    assert _left(tpu_standins, "tpu-preempted") == {
        "queued resources": [],
        "nodes": [],
        "firewall rules": [],
    }
    # The deleted slices' hosts stop with their processes (a close that could not reach a
    # host in time leaves its workers to the machine's end, as on Google's).
    tpu_standins.wait_for(
        lambda: all(s.ended for s in tpu_standins.standins.values()),
        60,
        "stand-ins stopped when their slices were deleted",
    )


def _slice_of_host() -> tuple[str, str, str]:
    return (
        os.uname().nodename,
        os.environ.get("MEGASCALE_SLICE_ID", ""),
        os.environ.get("MEGASCALE_NUM_SLICES", ""),
    )


@pytest.mark.timeout(600)
def test_two_v4_16_slices_are_one_multislice_mesh_with_each_hosts_slice_id(
    tpu_standins: TPUStandIns, package_index: PackageIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TPU_AS_CPU, "1")
    toy = contract.toy()
    with sky.ComputePool(
        provider=tpu_provider(tpu_standins),
        accelerator="v4-16",
        nodes=4,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.jax(cpu_devices=2)],
        name="tpu-multislice",
        quiet=True,
    ) as pool:
        slices = pool.broadcast(_slice_of_host)
        results = toy() @ pool
    assert [value for value, _ in results] == [contract.TOY_RESULT] * 4
    hostname = {
        name: "t1v-" + s.address.replace(".", "-") for name, s in tpu_standins.standins.items()
    }
    (queued,) = {name.split("/")[0].rsplit("-", 1)[0] for name in hostname}
    expected = [(hostname[f"{queued}-{s}/{w}"], str(s), "2") for s in range(2) for w in range(2)]
    assert slices == expected  # slice after slice, workers in Google's order
    assert _left(tpu_standins, "tpu-multislice") == {
        "queued resources": [],
        "nodes": [],
        "firewall rules": [],
    }
