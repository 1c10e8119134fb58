"""Within one pool, one node builds a missing cache entry and the others wait for it.

::

    node A bootstrap (first to start: "build")      node B, C bootstrap ("wait")
    ── fetch: miss, probe: writable ──> building     ── fetch: miss ──> wait (script ends)
       uv, python, packages, publish ──> published      ...wait here, on the client...
    (its script ends) ────────────────> released ─────> run again: fetch: hit
                                                        (or, released as "unwritable" as
                                                        soon as A says so: build, each)

The client, not the store, decides who builds: it runs every node's bootstrap and reads
the ``::skyward-cache::`` states the script prints (``bootstrap.CACHE``). A node whose
builder fails, or cannot write the cache, builds itself; nothing waits longer than the
pool's deadline. Thread-safe: one thread per node calls it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal

from skyward.client.futures import Deadline

Role = Literal["build", "wait"]


@dataclass
class CacheTurns:
    """The roles of one pool's bootstraps for its image's cache entry."""

    tags: str  # the pool's tags as a query string, for the entry the builder uploads
    _lock: threading.Lock = field(default_factory=threading.Lock)  # guards: _builder, _outcome
    _builder: bool = False  # a node has taken the builder's turn
    _outcome: str = ""  # what the builder said that ends the others' wait
    _released: threading.Event = field(default_factory=threading.Event)

    def take(self) -> Role:
        """The first node to ask builds; the others wait if the entry is missing."""
        with self._lock:
            if self._builder:
                return "wait"
            self._builder = True
            return "build"

    def said(self, role: Role, state: str) -> None:
        """The builder's script said ``state``: ``unwritable`` or ``off`` lets the others
        build at once, each; ``published``/``unpublished`` after its build."""
        if role == "build" and state in ("unwritable", "off", "published", "unpublished"):
            self._release(state)

    def builder_ended(self) -> None:
        """The builder's bootstrap ended, whichever way: nobody waits for it any longer."""
        self._release("ended")

    def _release(self, outcome: str) -> None:
        with self._lock:
            if not self._outcome:
                self._outcome = outcome
        self._released.set()

    def wait(self, deadline: Deadline) -> str:
        """Block until the builder is done; a line for the node's log saying what now."""
        while not self._released.wait(timeout=min(1.0, max(0.05, deadline.remaining()))):
            deadline.check("waiting for the node that builds the environment")
        with self._lock:
            outcome = self._outcome
        if outcome == "published":
            return "skyward: cache: the pool's builder uploaded the environment; downloading it"
        if outcome in ("unwritable", "off"):
            return (
                "skyward: cache: the cache cannot be written (or used) from the pool's "
                "builder: this node builds the environment itself"
            )
        return "skyward: cache: the pool's builder did not upload the environment: building it"
