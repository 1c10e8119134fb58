"""Small helpers for multi-controller programs run with ``@``.

In a multi-controller (SPMD) program every node runs the same function on its own part of
the data, as in JAX's multi-process guide: each process loads only its share, and a result
that spans processes must be gathered by all of them together before one host can read it.

``shard`` picks this node's rows. Its layouts, for ``n`` nodes and this node ``i``:

=====================  ===========================================  =======================
option                 rows of node ``i``                           shares
=====================  ===========================================  =======================
(default)              ``i, i + n, i + 2n, ...`` (strided)          differ by at most one
``drop_last=True``     one contiguous block of ``len // n`` rows     all equal
``even=True``          one contiguous block, see ``_even_rows``      all equal
=====================  ===========================================  =======================

``shuffle=True`` permutes the row numbers first, the same way on every node (a seeded
``random.Random``), so the shares still cover the data exactly once between them.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from typing import Any, TypeVar, overload

from skyward._info import InstanceInfo, instance_info

S = TypeVar("S")
S1 = TypeVar("S1")
S2 = TypeVar("S2")
S3 = TypeVar("S3")
S4 = TypeVar("S4")

# seed=None shuffles with this seed: every node must draw the same permutation, so "no
# seed" cannot mean "a fresh random one" as it does for random.Random().
_DEFAULT_SEED = 0


@overload
def shard(
    data: S,
    /,
    *,
    shuffle: bool = ...,
    seed: int | None = ...,
    drop_last: bool = ...,
    node: int | None = ...,
    total_nodes: int | None = ...,
    even: bool = ...,
    info: InstanceInfo | None = ...,
    devices: int | None = ...,
) -> S: ...
@overload
def shard(
    data1: S1,
    data2: S2,
    /,
    *,
    shuffle: bool = ...,
    seed: int | None = ...,
    drop_last: bool = ...,
    node: int | None = ...,
    total_nodes: int | None = ...,
    even: bool = ...,
    info: InstanceInfo | None = ...,
    devices: int | None = ...,
) -> tuple[S1, S2]: ...
@overload
def shard(
    data1: S1,
    data2: S2,
    data3: S3,
    /,
    *,
    shuffle: bool = ...,
    seed: int | None = ...,
    drop_last: bool = ...,
    node: int | None = ...,
    total_nodes: int | None = ...,
    even: bool = ...,
    info: InstanceInfo | None = ...,
    devices: int | None = ...,
) -> tuple[S1, S2, S3]: ...
@overload
def shard(
    data1: S1,
    data2: S2,
    data3: S3,
    data4: S4,
    /,
    *,
    shuffle: bool = ...,
    seed: int | None = ...,
    drop_last: bool = ...,
    node: int | None = ...,
    total_nodes: int | None = ...,
    even: bool = ...,
    info: InstanceInfo | None = ...,
    devices: int | None = ...,
) -> tuple[S1, S2, S3, S4]: ...
@overload
def shard(
    *arrays: Any,
    shuffle: bool = ...,
    seed: int | None = ...,
    drop_last: bool = ...,
    node: int | None = ...,
    total_nodes: int | None = ...,
    even: bool = ...,
    info: InstanceInfo | None = ...,
    devices: int | None = ...,
) -> tuple[Any, ...]: ...
def shard(
    *arrays: Any,
    shuffle: bool = False,
    seed: int | None = None,
    drop_last: bool = False,
    node: int | None = None,
    total_nodes: int | None = None,
    even: bool = False,
    info: InstanceInfo | None = None,
    devices: int | None = None,
) -> Any:
    """This node's share of each of ``arrays``: one array in, its share out; several in, a
    tuple of their shares out.

    Anything with ``len`` and indexing works, and keeps its type: lists, tuples, ranges,
    strings, numpy arrays, jax arrays, torch tensors (``data[[i, j]]``), pandas objects
    (``.iloc``). Arrays of the same length get the same rows, so ``x[k]`` still goes with
    ``y[k]`` after ``x, y = shard(x, y)``.

    - default: strided, ``rows[node::total_nodes]``; shares differ in length by at most one.
    - ``shuffle``: permute the rows first, with ``seed`` (``None``: a fixed seed), the same
      way on every node; the shares still cover every row exactly once.
    - ``drop_last``: contiguous blocks of ``len // total_nodes`` rows; the rest is dropped so
      every node gets the same number.
    - ``even``: contiguous blocks, equal on every node and a multiple of its ``devices``;
      the few rows left over (fewer than ``total_nodes * devices``) are dropped. For
      data-parallel jax: nodes that take different numbers of steps wait for each other
      forever, and ``jax.make_array_from_process_local_data`` over a mesh of every device
      splits each node's rows among its local devices. ``devices`` defaults to
      ``jax.local_device_count()`` once jax runs in this process (the jax plugin started
      it, or your code used it), else 1; every node is assumed to have as many.
    - ``node``, ``total_nodes`` (or ``info``): whose share, for use outside a worker;
      default ``instance_info()``, which outside a worker is node 0 of 1 (all the data).
      With several workers per node (``workers_per_node``) each worker is a share: its
      ``global_worker_index`` of ``total_workers``.
    """
    if not arrays:
        raise TypeError("shard needs at least one array or sequence")
    here = info or instance_info()
    node = here.global_worker_index if node is None else node
    total = here.total_workers if total_nodes is None else total_nodes
    if total < 1 or not 0 <= node < total:
        raise ValueError(f"shard: node {node} is not one of {total} node(s)")
    split = 1
    if even:
        split = devices if devices is not None else _local_devices()
        if split < 1:
            raise ValueError(f"shard: devices must be at least 1, not {split}")
    shares = tuple(
        _take(data, _rows(len(data), node, total, shuffle, seed, drop_last, even, split))
        for data in arrays
    )
    return shares[0] if len(shares) == 1 else shares


def _even_rows(length: int, nodes: int, devices: int) -> int:
    """Rows every node gets with ``even=True``: the same on each node, so data-parallel
    steps line up, and a multiple of its ``devices``, which share them."""
    return length // (nodes * devices) * devices


def _local_devices() -> int:
    """This process's jax devices if jax is running here; 1 otherwise.

    Only a jax that is imported *and* started is asked: counting devices starts jax's
    backend, after which ``jax.distributed.initialize`` is refused, so a process that has
    not started jax yet (or never imports it) is left alone.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return 1
    try:
        from jax._src import xla_bridge

        started = xla_bridge.backends_are_initialized() or jax.distributed.is_initialized()
    except (ImportError, AttributeError):  # a jax older or newer than these names
        return 1
    return int(jax.local_device_count()) if started else 1


def _rows(
    length: int,
    node: int,
    nodes: int,
    shuffle: bool,
    seed: int | None,
    drop_last: bool,
    even: bool,
    devices: int,
) -> range | list[int]:
    """Which rows of ``length`` belong to ``node``, as a range while that is possible (a
    slice keeps numpy views and is cheap for any sequence)."""
    if even or drop_last:
        size = _even_rows(length, nodes, devices) if even else length // nodes
        block = range(node * size, node * size + size)
    else:
        block = range(node, length, nodes)
    if not shuffle:
        return block
    order = list(range(length))
    random.Random(_DEFAULT_SEED if seed is None else seed).shuffle(order)
    return [order[i] for i in block]


def _take(data: Any, rows: range | list[int]) -> Any:
    """``data`` at ``rows``, of ``data``'s own type."""
    if isinstance(rows, range):
        return data[rows.start : rows.stop : rows.step]
    if isinstance(data, list | tuple):
        return type(data)(data[i] for i in rows)
    if hasattr(data, "iloc"):  # pandas: [] would select columns, not rows
        return data.iloc[rows]
    if (hasattr(data, "shape") and hasattr(data, "__array__")) or _is_torch(data):
        return data[rows]  # numpy, jax (it copies), torch: a list of rows selects those rows
    if isinstance(data, str):
        return "".join(data[i] for i in rows)
    if isinstance(data, Sequence):
        return [data[i] for i in rows]
    return data[rows]


def _is_torch(data: Any) -> bool:
    return type(data).__module__.startswith("torch")


def jax_gather(tree: Any) -> Any:
    """A jax array (or pytree of them) spanning every node, as numpy arrays on every node.

    Each array comes back with its global shape. This is a collective: call it on every node,
    in the same order (inside an ``@`` broadcast), never on one node only; a node that skips
    it leaves the others waiting until jax's heartbeat gives up. (Before 0.2 this was
    ``sky.gather``; ``sky.gather`` now groups pending calls.)
    """
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)
