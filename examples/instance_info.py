"""What a worker knows about its place in the pool."""

import skyward as sky


@sky.compute
def describe() -> sky.InstanceInfo:
    return sky.instance_info()


if __name__ == "__main__":
    with sky.ComputePool(nodes=3, name="info-demo") as pool:
        for info in describe() @ pool:
            role = "head" if info.is_head else "worker"
            print(
                f"node {info.node}/{info.total_nodes} ({role}) on {info.hostname}: "
                f"head at {info.head_addr}:{info.head_port}, peers {list(info.peers)}"
            )
    # Outside a worker, instance_info() describes this process as a one-node pool,
    # so the same function also runs with describe.local().
    print(describe.local())
