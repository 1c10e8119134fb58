"""``sky.plugins.torch()``: the right wheels from PyTorch's index, and one process group per
pool, on real worker processes (gloo on CPU)."""

from __future__ import annotations

import inspect
from typing import Any, get_type_hints

import pytest
import torch  # the dev extra installs the CPU build
from support.pools import ssh_provider
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.plugins._torch import TorchOptions, _Options, cuda_build
from skyward.pool.spec import PoolSpec


def _image(plugin: sky.Plugin, **pool: object) -> sky.Image:
    spec = PoolSpec(provider=sky.Local(), plugins=(plugin,), **pool)  # type: ignore[arg-type]
    assert plugin.transform is not None
    return plugin.transform(sky.Image(), spec)


def test_cpu_pools_get_cpu_wheels_from_pytorchs_index_scoped_to_torch() -> None:
    image = _image(sky.plugins.torch(vision=True))
    assert image.pip == ("torch", "torchvision")
    [index] = image.pip_indexes
    assert index.url == "https://download.pytorch.org/whl/cpu"
    assert index.packages == ("torch", "torchvision")


def test_gpu_pools_get_the_cuda_build_asked_for() -> None:
    plugin = sky.plugins.torch(cuda="12.4", version="2.6.0", audio=True)
    spec = PoolSpec.model_construct(plugins=(plugin,), accelerator="A100", nodes=1)
    assert plugin.transform is not None
    image = plugin.transform(sky.Image(), spec)
    assert image.pip == ("torch==2.6.0", "torchaudio")
    assert image.pip_indexes[0].url == "https://download.pytorch.org/whl/cu124"


@pytest.mark.parametrize(
    ("given", "tag"), [(12, "cu126"), ("12.4", "cu124"), ("cu118", "cu118"), ("cuda12.8", "cu128")]
)
def test_cuda_versions_map_to_pytorchs_wheel_tags(given: object, tag: str) -> None:
    assert cuda_build(given) == tag  # type: ignore[arg-type]


def test_bad_options_fail_when_the_plugin_is_made_or_the_pool_built() -> None:
    with pytest.raises(ValueError, match="backend"):
        sky.plugins.torch(backend="tcp")  # type: ignore[arg-type]
    with pytest.raises(sky.PluginError, match="not a CUDA version"):
        sky.plugins.torch(cuda="eleven")
    with pytest.raises(sky.PluginError, match="needs NVIDIA GPUs"):
        sky.ComputePool(plugins=[sky.plugins.torch("nccl")], console="off")
    with pytest.raises(sky.PluginError, match="one distributed runtime"):
        sky.ComputePool(plugins=[sky.plugins.jax(), sky.plugins.torch()], console="off")


@sky.compute
def ddp_step(
    features: list[list[float]], targets: list[float]
) -> tuple[list[float], tuple[int, ...], tuple[int, ...]]:
    """One DDP step on this rank's shard; the parameters after it, and this rank as
    ``torch.distributed`` and the torchrun variables see it, beside ``instance_info()``'s.
    (No ``assert`` here: pytest rewrites them into references to itself, which SSH workers
    do not have.)"""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    info = sky.instance_info()
    seen = (dist.get_rank(), dist.get_world_size())
    seen += tuple(int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    seen += (int(os.environ["LOCAL_WORLD_SIZE"]),)
    rank, world, per = info.global_worker_index, info.total_workers, info.workers_per_node
    expected = (rank, world, rank, world, info.worker, per)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.tensor(sky.shard(features), dtype=torch.float32)
    y = torch.tensor(sky.shard(targets), dtype=torch.float32).unsqueeze(1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # DDP all-reduces (averages) the gradients across the ranks here
    optimiser.step()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()], seen, expected


def _check_step(results: list[Any], ranks: int) -> None:
    assert len(results) == ranks  # one rank per worker
    for _, seen, expected in results:
        assert seen == expected
    params = [p for p, _, _ in results]
    assert all(p == params[0] for p in params)  # every rank holds the same parameters
    assert params[0] == pytest.approx(_reference(FEATURES, TARGETS), rel=1e-5, abs=1e-6)


def _reference(features: list[list[float]], targets: list[float]) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.tensor(features)
    y = torch.tensor(targets).unsqueeze(1)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimiser.step()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


FEATURES = [[float(i + j) / 10 for j in range(4)] for i in range(8)]
TARGETS = [float(i % 3) for i in range(8)]


@pytest.mark.parametrize("workers_per_node", [1, 2])
def test_a_ddp_step_on_two_nodes_matches_one_process_on_all_the_data(
    workers_per_node: int,
) -> None:
    with sky.ComputePool(
        nodes=2,
        workers_per_node=workers_per_node,
        plugins=[sky.plugins.torch()],
        console="off",
    ) as pool:
        results = ddp_step(FEATURES, TARGETS) @ pool
    _check_step(results, 2 * workers_per_node)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers_per_node", [1, 2])
def test_a_ddp_step_on_two_ssh_hosts_matches_one_process_on_all_the_data(
    ssh_hosts: Hosts, package_index: PackageIndex, torch_index: str, workers_per_node: int
) -> None:
    """Real OpenSSH hosts in their own namespaces: the process group's store is on host 0's
    namespace address, and gloo's ranks connect across the bridge."""
    with sky.ComputePool(
        provider=ssh_provider(ssh_hosts),
        nodes=2,
        workers_per_node=workers_per_node,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.torch(index_url=torch_index)],
        quiet=True,
    ) as pool:
        infos = pool.broadcast(sky.instance_info)
        results = ddp_step(FEATURES, TARGETS) @ pool
    assert infos[0].head_addr == ssh_hosts.hosts[0].address
    _check_step(results, 2 * workers_per_node)


@sky.compute
def world() -> tuple[int, int, str]:
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size(), dist.get_backend()


def test_one_node_is_a_group_of_one_so_the_same_code_runs() -> None:
    with sky.ComputePool(nodes=1, plugins=[sky.plugins.torch()], console="off") as pool:
        assert (world() >> pool) == (0, 1, "gloo")


def test_keras_on_torch_needs_the_torch_plugin_before_it() -> None:
    with pytest.raises(sky.PluginError, match=r"sky\.plugins\.torch\(\)"):
        sky.ComputePool(nodes=2, plugins=[sky.plugins.keras(backend="torch")], console="off")


# ── each option spelled once: TorchOptions (names, types) against _Options (defaults) ───────


def test_torch_options_name_and_type_every_field_of_the_options_model() -> None:
    fields = {name: field.annotation for name, field in _Options.model_fields.items()}
    given = {"backend": _Options.model_fields["backend"].annotation, **get_type_hints(TorchOptions)}
    assert fields == given


def test_the_torch_signature_shows_each_option_with_the_model_default() -> None:
    parameters = inspect.signature(sky.plugins.torch).parameters
    assert list(parameters) == list(_Options.model_fields)
    assert parameters["backend"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    for name, field in _Options.model_fields.items():
        assert parameters[name].default == field.default, name
    doc = sky.plugins.torch.__doc__ or ""
    assert {name for name in parameters if f"``{name}``" not in doc} == set()


def test_a_misspelled_torch_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"torch\(\) got an unexpected keyword argument 'visio'"):
        sky.plugins.torch(visio=True)  # type: ignore[call-arg]
