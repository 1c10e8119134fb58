"""What a worker runs for one chunk of a map: the function over a few items, in order.

A leaf of the standard library only, pickled by reference
("skyward.worker.chunks.run_chunk"), so a worker imports nothing of the client's side to run
it. ``pool.map(f, items, chunksize=N)`` sends ``partial(run_chunk, f)`` (pickled once per
map) with N items per call: one round trip for N results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def run_chunk(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]``: the first failure ends the chunk and is raised as itself."""
    return [fn(item) for item in items]
