"""``sky.plugins.torch()``: the right wheels from PyTorch's index, and one process group per
pool, on real worker processes (gloo on CPU)."""

from __future__ import annotations

import pytest
import torch  # the dev extra installs the CPU build

import skyward as sky
from skyward.plugins._torch import cuda_build
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
def ddp_step(features: list[list[float]], targets: list[float]) -> list[float]:
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    info = sky.instance_info()
    assert dist.get_world_size() == info.total_nodes and dist.get_rank() == info.node
    assert os.environ["RANK"] == str(info.node) and os.environ["MASTER_ADDR"] == info.head_addr
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.tensor(sky.shard(features), dtype=torch.float32)
    y = torch.tensor(sky.shard(targets), dtype=torch.float32).unsqueeze(1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # DDP all-reduces (averages) the gradients across the ranks here
    optimiser.step()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def _reference(features: list[list[float]], targets: list[float]) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.tensor(features)
    y = torch.tensor(targets).unsqueeze(1)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimiser.step()
    return [float(v) for p in model.parameters() for v in p.detach().flatten()]


def test_a_ddp_step_on_two_nodes_matches_one_process_on_all_the_data() -> None:
    features = [[float(i + j) / 10 for j in range(4)] for i in range(8)]
    targets = [float(i % 3) for i in range(8)]
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.torch()], console="off") as pool:
        params = ddp_step(features, targets) @ pool
    assert params[0] == params[1]  # every rank holds the same parameters after the step
    assert params[0] == pytest.approx(_reference(features, targets), rel=1e-5, abs=1e-6)


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
