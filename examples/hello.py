"""The smallest Skyward program: one call on one node, then one on every node."""

import skyward as sky


@sky.compute
def hello(name: str) -> str:
    info = sky.instance_info()
    print(f"running on node {info.node} of {info.total_nodes}")
    return f"hello {name} from node {info.node}"


if __name__ == "__main__":
    with sky.ComputePool(nodes=4) as pool:  # no provider: local worker processes
        print(hello("world") >> pool)  # one node, the least busy
        print(hello("everyone") @ pool)  # every node, results by rank
