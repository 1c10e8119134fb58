"""``sky.shard``: the data-sharding guide of skyward 0.5, on a local pool, and ours (``even``).

Most cases pass ``node``/``total_nodes`` explicitly, as the upstream docs do for use outside
a worker; one test runs the guide's example on a real 4-node pool.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
from support.processes import shared_pool

import skyward as sky


def shares(data: object, nodes: int, **options: object) -> list[object]:
    return [sky.shard(data, node=i, total_nodes=nodes, **options) for i in range(nodes)]


# ── "shard() divides them using modulo striding" ─────────────────────────────────────────


def test_the_default_is_modulo_striding() -> None:
    # "with 4 nodes and 1000 samples, node 0 gets indices [0, 4, 8, ...], node 1 gets
    # [1, 5, 9, ...], and so on"
    data = list(range(1000))
    assert shares(data, 4)[0][:3] == [0, 4, 8]  # type: ignore[index]
    assert shares(data, 4)[1][:3] == [1, 5, 9]  # type: ignore[index]
    assert [len(s) for s in shares(data, 4)] == [250] * 4  # type: ignore[arg-type]


def test_strided_shares_differ_by_at_most_one_and_cover_everything_once() -> None:
    data = list(range(10))
    parts = shares(data, 4)
    assert parts == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert sorted(x for part in parts for x in part) == data  # type: ignore[attr-defined]


def test_multiple_arrays_are_split_at_the_same_indices() -> None:
    x = [f"x{i}" for i in range(11)]
    y = [f"y{i}" for i in range(11)]
    for node in range(3):
        xs, ys = sky.shard(x, y, node=node, total_nodes=3, shuffle=True, seed=7)
        assert [a[1:] for a in xs] == [b[1:] for b in ys]


def test_several_arrays_of_different_lengths_each_get_their_own_share() -> None:
    # the upstream docstring: x_train, y_train, x_test, y_test = shard(x_train, ..., y_test)
    x_train, y_train, x_test, y_test = sky.shard(
        list(range(8)), list(range(8)), list(range(4)), list(range(4)), node=1, total_nodes=2
    )
    assert (x_train, y_train, x_test, y_test) == ([1, 3, 5, 7], [1, 3, 5, 7], [1, 3], [1, 3])


def test_shuffle_with_a_seed_gives_every_node_the_same_permutation() -> None:
    data = list(range(100))
    first = shares(data, 4, shuffle=True, seed=42)
    again = shares(data, 4, shuffle=True, seed=42)
    assert first == again  # each node computes its share alone, and they agree
    assert sorted(x for part in first for x in part) == data  # type: ignore[attr-defined]
    assert first != shares(data, 4)  # it did shuffle
    assert first != shares(data, 4, shuffle=True, seed=43)


def test_shuffle_without_a_seed_still_agrees_across_nodes() -> None:
    data = list(range(50))
    parts = shares(data, 3, shuffle=True)
    assert parts == shares(data, 3, shuffle=True)
    assert sorted(x for part in parts for x in part) == data  # type: ignore[attr-defined]


# ── "shard() returns the same type it receives" ──────────────────────────────────────────


def test_types_are_preserved() -> None:
    assert isinstance(sky.shard(list(range(100)), node=1, total_nodes=4), list)
    assert isinstance(sky.shard(tuple(range(100)), node=1, total_nodes=4), tuple)
    array = sky.shard(np.arange(100), node=1, total_nodes=4)
    assert isinstance(array, np.ndarray) and array.tolist()[:3] == [1, 5, 9]
    shuffled = sky.shard(np.arange(100), node=1, total_nodes=4, shuffle=True, seed=1)
    assert isinstance(shuffled, np.ndarray) and len(shuffled) == 25
    shuffled_tuple = sky.shard(tuple(range(9)), node=0, total_nodes=2, shuffle=True)
    assert isinstance(shuffled_tuple, tuple)


def test_numpy_rows_of_a_2d_array_stay_rows() -> None:
    x = np.arange(20).reshape(10, 2)
    mine = sky.shard(x, node=0, total_nodes=2, shuffle=True, seed=3)
    assert mine.shape == (5, 2)
    assert all(row[1] == row[0] + 1 for row in mine.tolist())


# ── "Equal-Size Shards with drop_last" ───────────────────────────────────────────────────


def test_drop_last_gives_contiguous_equal_blocks_and_drops_the_rest() -> None:
    # "This switches from striding to contiguous blocks and discards leftover elements"
    assert shares(list(range(10)), 4, drop_last=True) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_drop_last_with_shuffle_keeps_shares_equal_and_disjoint() -> None:
    parts = shares(list(range(103)), 4, drop_last=True, shuffle=True, seed=42)
    assert {len(p) for p in parts} == {25}  # type: ignore[arg-type]
    flat = [x for part in parts for x in part]  # type: ignore[attr-defined]
    assert len(set(flat)) == 100


# ── ours: even=True and info= ────────────────────────────────────────────────────────────


def test_even_gives_contiguous_equal_blocks_a_multiple_of_the_devices() -> None:
    assert shares(list(range(10)), 4, even=True, devices=1) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    x = np.arange(10)
    assert sky.shard(x, even=True, devices=1, node=3, total_nodes=4).tolist() == [6, 7]
    # two devices per node: 10 rows over 2 nodes x 2 devices -> 4 rows each, 2 dropped
    assert shares(list(range(10)), 2, even=True, devices=2) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_info_names_the_node_as_node_and_total_nodes_do() -> None:
    info = sky.InstanceInfo(
        node=2,
        total_nodes=3,
        head_addr="10.0.0.1",
        head_port=1234,
        peers=("10.0.0.1", "10.0.0.2", "10.0.0.3"),
        hostname="h",
    )
    assert sky.shard(list(range(9)), info=info) == [2, 5, 8]
    assert sky.shard(list(range(9)), info=info, even=True, devices=1) == [6, 7, 8]


def test_outside_a_worker_the_whole_data_is_this_nodes_share() -> None:
    assert sky.shard([1, 2, 3]) == [1, 2, 3]
    assert sorted(sky.shard([1, 2, 3], shuffle=True)) == [1, 2, 3]


def test_wrong_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="at least one"):
        sky.shard()
    with pytest.raises(ValueError, match="node 4 is not one of 4"):
        sky.shard([1], node=4, total_nodes=4)


# ── the guide's example, on a real pool ──────────────────────────────────────────────────


@sky.compute
def train_on_shard(full_x: list[list[float]], full_y: list[int]) -> dict[str, object]:
    x, y = sky.shard(full_x, full_y, shuffle=True, seed=42)
    info = sky.instance_info()
    return {
        "node": info.node,
        "shard_size": len(x),
        "pairs": [(row[0], y[i]) for i, row in enumerate(x)],
    }


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.ComputePool]:
    with shared_pool(nodes=4) as pool:
        yield pool


@pytest.mark.timeout(120)
def test_the_guides_example_splits_paired_data_across_a_broadcast(pool: sky.ComputePool) -> None:
    rng = random.Random(42)
    x = [[float(i)] + [rng.gauss(0, 1) for _ in range(9)] for i in range(1000)]
    y = [i % 10 for i in range(1000)]
    results = train_on_shard(x, y) @ pool
    assert [r["node"] for r in results] == [0, 1, 2, 3]
    assert [r["shard_size"] for r in results] == [250] * 4
    pairs = [pair for r in results for pair in r["pairs"]]  # type: ignore[attr-defined]
    assert sorted(int(first) for first, _ in pairs) == list(range(1000))  # each row once
    assert all(label == int(first) % 10 for first, label in pairs)  # x[i] still with y[i]
