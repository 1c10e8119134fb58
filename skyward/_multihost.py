"""Small helpers for multi-controller programs run with ``@``.

In a multi-controller (SPMD) program every node runs the same function on its own part of
the data, as in JAX's multi-process guide: each process loads only its share, and a result
that spans processes must be gathered by all of them together before one host can read it.
"""

from __future__ import annotations

from typing import Any, TypeVar

from skyward._info import InstanceInfo, instance_info

S = TypeVar("S")


def shard(data: S, *, even: bool = False, info: InstanceInfo | None = None) -> S:
    """This node's contiguous share of ``data`` (anything with ``len`` and slicing).

    Node ``i`` of ``n`` gets rows ``[lo, hi)``; shares differ in length by at most one, and
    together they cover ``data`` in order. ``even=True`` drops the last ``len(data) % n`` rows
    so that every share has the same length: data-parallel training needs it, since nodes
    that take different numbers of steps wait for each other forever.

    Outside a worker it returns all of ``data`` (a one-node pool).
    """
    info = info or instance_info()
    total = len(data)  # type: ignore[arg-type]
    base, extra = divmod(total, info.total_nodes)
    if even:
        extra = 0
    lo = info.node * base + min(info.node, extra)
    hi = lo + base + (1 if info.node < extra else 0)
    return data[lo:hi]  # type: ignore[index, no-any-return]


def gather(tree: Any) -> Any:
    """A jax array (or pytree of them) spanning every node, as numpy arrays on every node.

    Each array comes back with its global shape. This is a collective: call it on every node,
    in the same order (inside an ``@`` broadcast), never on one node only; a node that skips
    it leaves the others waiting until jax's heartbeat gives up.
    """
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)
