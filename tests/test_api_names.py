"""The public skyward project's names and shapes, as its users write them: ``@sky.function``,
``sky.Compute``, ``PendingCompute``, ``from skyward.api import ...``, ``InstanceInfo.peers``
and ``.accelerator`` read as dicts, ``.network``, ``instance_info()`` outside a pool, and
``sky.plugins.jax("cu124")``. Run on local and SSH pools where a node is involved."""

from __future__ import annotations

import inspect
import ipaddress
import pickle
import subprocess
import sys
from typing import Any

import pytest
from support.pools import PoolFactory

import skyward as sky
import skyward.api
from skyward._info import InstanceInfo
from skyward.pool.spec import FROM_05, PoolSpec


@sky.function
def where() -> dict[str, Any]:
    info = sky.instance_info()
    network = info.network
    return {
        "node": info.node,
        "peers": [(p["node"], p["private_ip"], p.get("public_ip")) for p in info.peers],
        "plain": list(info.peers),
        "address": network.address,
        "interface": network.interface,
        "interface_by_key": network["interface"],
        "bandwidth": network.get("bandwidth_gbps"),
    }


def test_the_later_names_are_the_same_objects() -> None:
    assert sky.function is sky.compute
    assert sky.Compute is sky.ComputePool
    assert sky.PendingCompute is sky.PendingCall
    assert sky.PendingComputeGroup is sky.CallGroup
    assert isinstance(where, sky.ComputeFunction)
    assert isinstance(where(), sky.PendingCompute)
    assert isinstance(where() & where(), sky.PendingComputeGroup)


@pytest.mark.timeout(60)
def test_a_function_runs_on_a_compute_pool_as_the_later_docs_write_it() -> None:
    @sky.function(timeout=30)
    def double(x: int) -> int:
        return 2 * x

    with sky.Compute(nodes=2, quiet=True) as compute:
        assert double(21) >> compute == 42
        assert double(1) @ compute == [2, 2]
        assert (double(1) & double(2)) >> compute == (2, 4)


def test_skyward_api_gives_the_very_objects_skyward_does() -> None:
    from skyward.api import InstanceInfo as Info
    from skyward.api import Worker

    assert Worker is sky.Worker and Info is sky.InstanceInfo
    for name in skyward.api.__all__:
        assert getattr(skyward.api, name) is getattr(sky, name), name
    assert dir(skyward.api) == sorted(skyward.api.__all__)


def test_a_name_skyward_api_lacks_says_what_to_write() -> None:
    with pytest.raises(AttributeError, match="write name the pool"):
        skyward.api.sky  # noqa: B018
    with pytest.raises(AttributeError, match=r"coming-from-0\.5"):
        skyward.api.NoSuchThing  # noqa: B018


def test_importing_skyward_api_imports_nothing_heavy() -> None:
    probe = (
        "import sys, skyward.api\n"
        "print(*[m for m in ('pydantic', 'cloudpickle', 'numpy', 'paramiko', 'boto3') "
        "if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == []


# ── InstanceInfo in both shapes ─────────────────────────────────────────────────────────


def _info(**fields: Any) -> InstanceInfo:
    base: dict[str, Any] = {
        "node": 1,
        "total_nodes": 2,
        "head_addr": "10.0.0.1",
        "head_port": 1234,
        "peers": ("10.0.0.1", "10.0.0.2"),
        "hostname": "h",
    }
    return InstanceInfo(**{**base, **fields})


def test_peers_are_addresses_that_also_read_as_skyward_05_peer_dicts() -> None:
    info = _info()
    assert info.peers == ("10.0.0.1", "10.0.0.2") and info.peers[0] == info.head_addr
    assert info.peers[1][:4] == "10.0"  # still a string
    assert [dict(p) for p in info.peers] == [
        {"node": 0, "private_ip": "10.0.0.1", "public_ip": None},
        {"node": 1, "private_ip": "10.0.0.2", "public_ip": None},
    ]
    with pytest.raises(KeyError):
        info.peers[0]["region"]


def test_the_accelerator_is_its_name_and_reads_as_skyward_05_accelerator_dict() -> None:
    info = _info(accelerator="A100-80GB:8", accelerators=8)
    assert info.accelerator == "A100-80GB:8"
    assert dict(info.accelerator) == {
        "type": "A100",
        "count": 8,
        "memory_gb": 80.0,
        "is_trainium": False,
    }
    asked = _info(accelerator=str(sky.accelerators.H100(count=4)))
    assert (asked.accelerator["type"], asked.accelerator["count"]) == ("H100", 4)
    assert asked.accelerator.get("memory_gb") is None
    assert _info().accelerator is None  # as in skyward 0.5, no accelerator is None


def test_both_shapes_survive_the_trip_to_a_worker() -> None:
    info = _info(accelerator="T4:1", accelerators=1)
    back = pickle.loads(pickle.dumps(info))
    assert back == info
    assert back.peers[1]["node"] == 1 and back.accelerator["type"] == "T4"
    assert info.model_dump()["peers"] == ("10.0.0.1", "10.0.0.2")


def test_instance_info_outside_a_pool_is_this_process_as_a_one_node_pool() -> None:
    # Decided: never None (skyward 0.5 returned None): code that shards by node runs
    # unchanged with f.local(), and `info.pool is None` says it is outside a pool.
    info = sky.instance_info()
    assert info is not None and info.pool is None
    assert (info.node, info.total_nodes, info.is_head) == (0, 1, True)
    assert info.peers[0]["private_ip"] == "127.0.0.1"
    assert (info.network.address, info.network.interface) == ("127.0.0.1", "lo")
    assert where.local()["node"] == 0


@pytest.mark.timeout(120)
def test_every_node_reads_peers_and_its_network_in_both_shapes(make_pool: PoolFactory) -> None:
    with make_pool(nodes=2) as pool:
        seen = where() @ pool
    plain = seen[0]["plain"]
    assert [s["plain"] for s in seen] == [plain, plain]
    for rank, node in enumerate(seen):
        assert node["peers"] == [(i, address, None) for i, address in enumerate(plain)]
        assert node["address"] == plain[rank]
        # The interface holding the node's own address, found on the node itself.
        assert node["interface"] is not None
        assert node["interface"] == node["interface_by_key"]
        if ipaddress.ip_address(node["address"]).is_loopback:
            assert node["interface"] == "lo" and node["bandwidth"] is None


# ── sky.plugins.jax("cu124") ────────────────────────────────────────────────────────────


def test_jax_takes_its_cuda_version_by_position_as_skyward_05_did() -> None:
    spec = PoolSpec.model_validate({"provider": sky.SSH(hosts=["h"]), "accelerator": "A100"})
    by_position = sky.plugins.jax("cu124")
    by_keyword = sky.plugins.jax(cuda="cu124")
    assert by_position.transform is not None and by_keyword.transform is not None
    image = by_position.transform(sky.Image(), spec)
    assert image == by_keyword.transform(sky.Image(), spec)
    assert any(r.startswith("jax[cuda12") for r in image.pip), image.pip
    assert list(inspect.signature(sky.plugins.jax).parameters)[:2] == ["cuda", "version"]
    with pytest.raises(TypeError, match="both by position and by keyword"):
        sky.plugins.jax("cu124", cuda=12)


@pytest.mark.parametrize("name", sorted(FROM_05))
def test_a_05_pool_option_we_lack_says_what_to_write_instead(name: str) -> None:
    with pytest.raises(TypeError) as caught:
        sky.ComputePool(**{name: 1})  # type: ignore[misc]
    assert str(caught.value) == (
        f"ComputePool() got an unexpected keyword argument {name!r}; {FROM_05[name]}"
    )
