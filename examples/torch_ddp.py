"""PyTorch DistributedDataParallel across a pool: every node trains on its shard of the data,
DDP averages the gradients, and every node ends with the same model.

Runs on the local default (2 worker processes, gloo on CPU); change ``provider=`` and
``accelerator=`` to run it on GPUs, where the plugin picks nccl and CUDA wheels.
"""

import skyward as sky


@sky.compute
def train(steps: int) -> float:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    info = sky.instance_info()
    torch.manual_seed(0)  # the same initial weights on every node
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(info.node)  # each node its own data
    x = torch.randn(256, 8, generator=data)
    y = x.sum(dim=1, keepdim=True)
    for _ in range(steps):
        optimiser.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # gradients averaged across the nodes here
        optimiser.step()
    weights = next(model.parameters()).detach()
    print(f"node {info.node}/{info.total_nodes}: loss {loss.item():.4f}")
    return float(weights.sum())


if __name__ == "__main__":
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.torch()]) as pool:
        sums = train(200) @ pool
    assert len(set(sums)) == 1, sums  # every node holds the same weights
    print(f"weights agree on every node: {sums[0]:.6f}")
