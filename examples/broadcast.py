"""Send one payload to every node; each node works on its own part of it."""

import numpy as np

import skyward as sky


@sky.compute
def partial_sum(data: np.ndarray) -> float:
    info = sky.instance_info()
    mine = np.array_split(data, info.total_nodes)[info.node]  # this node's share
    return float(mine.sum())


if __name__ == "__main__":
    data = np.random.default_rng(0).random(10_000_000)
    with sky.ComputePool(nodes=4) as pool:
        parts = partial_sum(data) @ pool  # the array is pickled once for all four nodes
    print(f"by node: {[round(p, 1) for p in parts]}")
    print(f"total {sum(parts):.1f} (numpy says {data.sum():.1f})")
