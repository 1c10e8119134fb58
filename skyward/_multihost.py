"""Small helpers for multi-controller programs run with ``@``.

In a multi-controller (SPMD) program every node runs the same function on its own part of
the data, as in JAX's multi-process guide: each process loads only its share, and a result
that spans processes must be gathered by all of them together before one host can read it.
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

from skyward._info import InstanceInfo, instance_info

S = TypeVar("S")


def shard(
    data: S, *, even: bool = False, info: InstanceInfo | None = None, devices: int | None = None
) -> S:
    """This node's contiguous share of ``data`` (anything with ``len`` and slicing).

    Node ``i`` of ``n`` gets rows ``[lo, hi)``; shares differ in length by at most one, and
    together they cover ``data`` in order.

    ``even=True`` gives every node the same number of rows, a multiple of its ``devices``,
    and drops the few rows left over (fewer than ``n * devices``): data-parallel training
    needs both, since nodes that take different numbers of steps wait for each other
    forever, and ``jax.make_array_from_process_local_data`` over a mesh of every device
    splits each node's rows among its local devices. ``devices`` defaults to
    ``jax.local_device_count()`` once jax runs in this process (the jax plugin started it,
    or your code used it), else 1; every node of a pool is assumed to have as many.

    Outside a worker it returns all of ``data`` (a one-node pool); with ``even=True``, as
    many rows as the local devices split evenly.
    """
    info = info or instance_info()
    total = len(data)  # type: ignore[arg-type]
    if even:
        split = devices if devices is not None else _local_devices()
        if split < 1:
            raise ValueError(f"shard: devices must be at least 1, not {split}")
        rows = total // (info.total_nodes * split) * split
        lo = info.node * rows
        return data[lo : lo + rows]  # type: ignore[index, no-any-return]
    base, extra = divmod(total, info.total_nodes)
    lo = info.node * base + min(info.node, extra)
    hi = lo + base + (1 if info.node < extra else 0)
    return data[lo:hi]  # type: ignore[index, no-any-return]


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


def gather(tree: Any) -> Any:
    """A jax array (or pytree of them) spanning every node, as numpy arrays on every node.

    Each array comes back with its global shape. This is a collective: call it on every node,
    in the same order (inside an ``@`` broadcast), never on one node only; a node that skips
    it leaves the others waiting until jax's heartbeat gives up.
    """
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)
