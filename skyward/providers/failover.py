"""Capacity failover, for every cloud: try each placement in turn until one has room.

::

    first_available(places, attempt)
        attempt(place 1)  ── Unavailable ("no capacity", "type not offered there") ──┐
        attempt(place 2)  ── Unavailable ───────────────────────────────────────────┤ noted
        attempt(place 3)  ── the nodes: returned                                     │
        (all refused)     ── ProvisionError naming every place and why ◄─────────────┘

A place is whatever a cloud varies (a zone, a zone with spot or on-demand). An attempt
undoes what it made before it raises ``Unavailable``: nothing of a refused place is left.
Any other error ends the search at once; a quota, a permission or a bad image is not fixed
by moving to another zone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from skyward._errors import ProvisionError

P = TypeVar("P")
T = TypeVar("T")


class Unavailable(ProvisionError):
    """A placement cannot host the machines now (no capacity, type not offered there, spot
    refused); another placement may."""


def first_available(
    places: Sequence[P],
    attempt: Callable[[P], T],
    *,
    describe: Callable[[P], str] = str,
    on_refused: Callable[[P, Unavailable], None] | None = None,
) -> T:
    """``attempt(place)`` for the first place that is not ``Unavailable``; if every one is,
    a ``ProvisionError`` that lists each place tried and why it refused."""
    tried: list[str] = []
    last: Unavailable | None = None
    for place in places:
        try:
            return attempt(place)
        except Unavailable as refused:
            tried.append(f"{describe(place)}: {refused}")
            last = refused
            if on_refused is not None:
                on_refused(place, refused)
    if last is not None and len(tried) == 1:
        raise last
    raise ProvisionError(
        f"no placement could take the pool; tried {len(tried)}: " + "; ".join(tried)
    ) from last
