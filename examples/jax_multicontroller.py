"""JAX's multi-controller toy example, on a 4-node local pool with 2 CPU devices per node.

Every node runs the same program (SPMD). Together the nodes see 8 devices, arranged as a
(4, 2) mesh; a (4, 8) array is sharded over it, and a jitted sum reduces across all nodes.
Every node prints its own shards and gets the same result, -0.12398731708526611, exactly as
in JAX's multi-process guide. Flip ``provider=`` and ``cpu_devices`` for GPUs; the program
does not change.
"""

import numpy as np

import skyward as sky


@sky.compute
def toy() -> tuple[float, list[list[list[int]]]]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    assert jax.device_count() == 8  # 4 nodes x 2 devices, one distributed runtime
    mesh = jax.make_mesh((4, 2), ("i", "j"))
    global_data = np.arange(32).reshape((4, 8))
    # Every node holds the full host array here, so device_put can place each shard; with
    # real data each node would load only its rows (see sky.shard in docs/plugins.md).
    global_array = jax.device_put(global_data, NamedSharding(mesh, P("i", "j")))
    shards = [shard.data.tolist() for shard in global_array.addressable_shards]
    for shard in global_array.addressable_shards:
        print(f"device {shard.device} holds {shard.index}: {shard.data.tolist()}")
    result = jnp.sum(jnp.sin(global_array))  # a reduction across every node's devices
    return float(result), shards


if __name__ == "__main__":
    with sky.ComputePool(nodes=4, plugins=[sky.plugins.jax(cpu_devices=2)]) as pool:
        results = toy() @ pool
    for node, (value, shards) in enumerate(results):
        print(f"node {node}: result {value!r}, shards {shards}")
    assert all(value == results[0][0] for value, _ in results)
