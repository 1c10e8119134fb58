"""Pool options from skyward 0.5's documented API: ``vcpus=``, ``memory_gb=``,
``allocation=``, ``nodes=(min, max)``. Each is honoured, refused with a reason, or a
documented no-op; none is an unknown keyword."""

from __future__ import annotations

import os

import pydantic
import pytest
from support.pools import ssh_provider
from support.sshhosts import Hosts

import skyward as sky


def test_the_documented_keywords_are_accepted_by_the_local_pool() -> None:
    # skyward 0.5's distributed-collections example, with the provider swapped
    pool = sky.ComputePool(nodes=4, vcpus=1, memory_gb=0.5, allocation="spot-if-available")
    assert (pool.spec.vcpus, pool.spec.memory_gb, pool.spec.allocation) == (
        1,
        0.5,
        "spot-if-available",
    )
    request = pool.spec.request(pool.image)
    assert (request.vcpus, request.memory_gb, request.allocation) == (1, 0.5, "spot-if-available")


@pytest.mark.parametrize("allocation", ["on-demand", "spot-if-available", "cheapest"])
def test_allocations_that_can_mean_this_machine_run_here(allocation: str) -> None:
    with sky.ComputePool(allocation=allocation, quiet=True) as pool:  # type: ignore[arg-type]
        assert pool.run(os.getpid) != os.getpid()


def test_spot_is_refused_by_the_local_provider_with_why() -> None:
    with pytest.raises(ValueError, match="allocation='spot' cannot be honoured: the local"):
        sky.ComputePool(allocation="spot")


def test_an_unknown_allocation_names_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="allocation"):
        sky.ComputePool(allocation="preemptible")  # type: ignore[arg-type]


def test_more_cpus_or_memory_than_this_machine_has_is_refused() -> None:
    with pytest.raises(ValueError, match=r"vcpus=4096 per node, but this machine has \d+ CPU"):
        sky.ComputePool(vcpus=4096)
    with pytest.raises(ValueError, match="memory_gb=1e\\+06 per node"):
        sky.ComputePool(memory_gb=1_000_000)
    with pytest.raises(pydantic.ValidationError, match="vcpus"):
        sky.ComputePool(vcpus=0)


def test_ssh_refuses_spot_and_leaves_sizes_to_the_hosts(ssh_hosts: Hosts) -> None:
    provider = ssh_provider(ssh_hosts)
    with pytest.raises(ValueError, match="SSH runs on hosts you already have"):
        sky.ComputePool(provider=provider, allocation="spot")
    sky.ComputePool(provider=provider, vcpus=64, memory_gb=512, allocation="on-demand")


@pytest.mark.timeout(60)
def test_a_node_range_runs_the_maximum_and_says_it_does_not_autoscale(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sky.ComputePool(nodes=(1, 3), console="plain") as pool:
        assert pool.spec.nodes == 3 and pool.spec.min_nodes == 1
        assert pool.broadcast(lambda: sky.instance_info().total_nodes) == [3, 3, 3]
    assert "do not autoscale; this one runs 3 nodes" in capsys.readouterr().err


@pytest.mark.parametrize("nodes", [(3, 1), (0, 2), (1, 2, 3)])
def test_a_wrong_node_range_is_refused(nodes: tuple[int, ...]) -> None:
    with pytest.raises(pydantic.ValidationError, match="nodes"):
        sky.ComputePool(nodes=nodes)  # type: ignore[arg-type]
