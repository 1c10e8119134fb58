"""Programs written for ``torchrun`` run unchanged as calls on a pool, call after call: the
torch plugin sets torchrun's variables (checked against torchrun's own), a program's own
``init_process_group`` / ``destroy_process_group`` work, and a group re-made after a DDP call
does not hang (the cause is in ``skyward.plugins._torchrun``'s docstring)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.pools import ssh_provider
from support.sshhosts import Hosts, PackageIndex

import skyward as sky

# What torchrun sets that a pool's worker has no use for: the agent's error file (an agent
# reads it; ``@record`` logs the error when it is unset) and the signals the agent forwards.
AGENT_ONLY = {"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE", "_"}
# Values that name this launch rather than a rank's place in it.
PER_LAUNCH = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}

# Bounds every program's call, so that a hang fails the test with the call's name.
CALL_TIMEOUT = 120

_DUMP = """
import json, os
before = set(json.loads(os.environ["SKYWARD_TEST_BEFORE"]))
print(json.dumps({k: v for k, v in os.environ.items() if k not in before}))
"""


def _torchrun(tmp_path: Path, nodes: int, per_node: int) -> list[dict[str, str]]:
    """The variables torchrun gives each process, one torchrun per node on this machine."""
    script = tmp_path / "dump.py"
    script.write_text(_DUMP)
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env["SKYWARD_TEST_BEFORE"] = json.dumps([*env, "SKYWARD_TEST_BEFORE"])
    port = "29571"
    launches = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={nodes}",
                f"--nproc_per_node={per_node}",
                f"--node_rank={node}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                str(script),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for node in range(nodes)
    ]
    lines = [line for p in launches for line in p.communicate(timeout=240)[0].splitlines()]
    assert all(p.returncode == 0 for p in launches)
    return sorted((json.loads(line) for line in lines), key=lambda e: int(e["RANK"]))


@sky.compute
def torchrun_variables(names: list[str]) -> dict[str, str]:
    import os

    return {name: os.environ[name] for name in names if name in os.environ}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("nodes", "per_node"), [(1, 2), (2, 1)])
def test_every_rank_gets_the_variables_torchrun_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: int, per_node: int
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    launched = _torchrun(tmp_path, nodes, per_node)
    expected = [{k: v for k, v in e.items() if k not in AGENT_ONLY} for e in launched]
    names = sorted(set().union(*expected))
    with sky.ComputePool(
        nodes=nodes, workers_per_node=per_node, plugins=[sky.plugins.torch()], console="off"
    ) as pool:
        seen = torchrun_variables(names) @ pool
        info = pool.run(sky.instance_info)
    assert [set(s) for s in seen] == [set(e) for e in expected]  # the same names, every rank
    for ours, theirs in zip(seen, expected, strict=True):
        assert {k: v for k, v in ours.items() if k not in PER_LAUNCH} == {
            k: v for k, v in theirs.items() if k not in PER_LAUNCH
        }
        assert (ours["MASTER_ADDR"], ours["MASTER_PORT"]) == (info.head_addr, str(info.head_port))


# ── the programs: each as its authors wrote it for torchrun ─────────────────────────────────
# (No ``assert`` in them: pytest rewrites asserts into references to itself, which SSH
# workers do not have.)


@sky.compute(timeout=CALL_TIMEOUT)
def torchrun_script() -> tuple[int, int, float]:
    """The shape of every torchrun script: init from the environment, work, clean up."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="gloo")
    total = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(total)
    result = (dist.get_rank(), dist.get_world_size(), float(total))
    dist.destroy_process_group()
    return result


@sky.compute(timeout=CALL_TIMEOUT)
def relies_on_the_plugin() -> tuple[bool, int, int]:
    """A program written for the pool: the group is simply there."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return False, -1, -1
    return True, dist.get_rank(), dist.get_world_size()


@sky.compute(timeout=CALL_TIMEOUT)
def multinode_ddp(epochs: int) -> tuple[int, list[float]]:
    """pytorch/examples' distributed/ddp-tutorial-series/multinode.py, on CPU (gloo, no
    ``.to(gpu_id)``): ``ddp_setup``, a ``Trainer`` around DDP with a ``DistributedSampler``,
    ``destroy_process_group`` at the end."""
    import os

    import torch
    import torch.nn.functional as F
    from torch.distributed import destroy_process_group, init_process_group
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    def ddp_setup() -> None:
        init_process_group(backend="gloo")

    torch.manual_seed(0)
    features, targets = torch.rand(64, 20), torch.rand(64, 1)
    ddp_setup()
    model = DDP(torch.nn.Linear(20, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    data = DataLoader(
        TensorDataset(features, targets),
        batch_size=8,
        shuffle=False,
        sampler=DistributedSampler(TensorDataset(features, targets)),
    )
    for epoch in range(epochs):
        data.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for source, target in data:
            optimizer.zero_grad()
            F.mse_loss(model(source), target).backward()
            optimizer.step()
    params = [float(v) for p in model.parameters() for v in p.detach().flatten()]
    destroy_process_group()
    return int(os.environ["RANK"]), params


@sky.compute(timeout=CALL_TIMEOUT)
def reinitializes_when_gone() -> tuple[int, int, float]:
    """accelerate's and many tutorials' way: make the group only if there is none."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    result = (dist.get_rank(), dist.get_world_size(), float(total))
    dist.destroy_process_group()
    return result


@sky.compute(timeout=CALL_TIMEOUT)
def asks_for_its_own_group() -> tuple[str, int]:
    """A program that asks for a group other than the pool's (``cpu:gloo``, not ``gloo``)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="cpu:gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    backend = str(dist.get_backend())
    dist.destroy_process_group()
    return backend, int(total)


def _run_the_programs(pool: sky.ComputePool, ranks: int, init: str) -> None:
    """Both kinds of program, each twice, a DDP call followed by re-initializing ones."""
    sum_of_ranks = ranks * (ranks + 1) / 2
    expected = [(rank, ranks, sum_of_ranks) for rank in range(ranks)]
    assert (torchrun_script() @ pool) == expected
    assert (torchrun_script() @ pool) == expected  # its destroy did not take the group
    first = multinode_ddp(2) @ pool
    assert (reinitializes_when_gone() @ pool) == [(r, ranks, float(ranks)) for r in range(ranks)]
    second = multinode_ddp(2) @ pool  # a second launch of the same program
    assert [rank for rank, _ in first] == list(range(ranks))
    assert all(params == first[0][1] for _, params in first + second)
    after = relies_on_the_plugin() @ pool
    if init == "program":  # as under torchrun: a launch starts with no group
        assert after == [(False, -1, -1)] * ranks
    else:
        assert after == [(True, rank, ranks) for rank in range(ranks)]
        assert (asks_for_its_own_group() @ pool) == [("cpu:gloo", ranks)] * ranks
        assert (relies_on_the_plugin() @ pool) == after  # the pool's group is back


@pytest.mark.timeout(600)
@pytest.mark.parametrize("init", ["auto", "program"])
def test_torchrun_programs_run_call_after_call_on_a_local_pool(init: str) -> None:
    with sky.ComputePool(
        nodes=2,
        workers_per_node=2,
        plugins=[sky.plugins.torch(init=init)],  # type: ignore[arg-type]
        console="off",
    ) as pool:
        _run_the_programs(pool, 4, init)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("init", ["auto", "program"])
def test_torchrun_programs_run_call_after_call_on_ssh_hosts(
    ssh_hosts: Hosts, package_index: PackageIndex, torch_index: str, init: str
) -> None:
    """Real OpenSSH hosts in their own namespaces, two workers on each: every group's
    rendezvous crosses the bridge to host 0's store."""
    with sky.ComputePool(
        provider=ssh_provider(ssh_hosts),
        nodes=2,
        workers_per_node=2,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.torch(index_url=torch_index, init=init)],  # type: ignore[arg-type]
        quiet=True,
    ) as pool:
        _run_the_programs(pool, 4, init)


def test_init_plugin_keeps_the_pools_group_and_refuses_another() -> None:
    with sky.ComputePool(
        nodes=2, plugins=[sky.plugins.torch(init="plugin")], console="off"
    ) as pool:
        assert (torchrun_script() @ pool) == [(0, 2, 3.0), (1, 2, 3.0)]
        with pytest.raises(sky.PluginError, match="init='plugin'"):
            asks_for_its_own_group() @ pool
        assert (relies_on_the_plugin() @ pool) == [(True, 0, 2), (True, 1, 2)]


@sky.compute
def ranks_as_they_come() -> Any:
    import torch.distributed as dist

    yield dist.get_rank()
    yield dist.get_world_size()


def test_a_streaming_call_keeps_its_group_until_it_is_exhausted() -> None:
    with sky.ComputePool(nodes=1, plugins=[sky.plugins.torch()], console="off") as pool:
        assert list(ranks_as_they_come() >> pool) == [0, 1]
        assert (relies_on_the_plugin() >> pool) == (True, 0, 1)


# ── accelerate's own test script, twice on one pool ────────────────────────────────────────


@sky.compute
def accelerate_test_script() -> tuple[str, int]:
    """accelerate's ``test_utils/scripts/test_script.py`` (what ``accelerate test`` launches),
    unchanged; then what accelerate saw."""
    from accelerate import PartialState
    from accelerate.test_utils.scripts import test_script

    test_script.main()
    state = PartialState()
    return state.distributed_type.value, state.num_processes


@pytest.mark.timeout(600)
def test_accelerates_test_script_runs_twice_on_a_cpu_pool_distributed_both_times() -> None:
    plugins = [sky.plugins.torch(), sky.plugins.huggingface(transformers=False, accelerate=True)]
    with sky.ComputePool(nodes=1, workers_per_node=2, plugins=plugins, console="off") as pool:
        first = accelerate_test_script() @ pool
        second = accelerate_test_script() @ pool
    assert first == second == [("MULTI_CPU", 2)] * 2
