"""The record of what one cloud pool made, as it is made: pool-wide resources by kind, every
machine ever asked for, each node's machine, and the creates still on the wire. One lock;
only its methods write it (the start, and a cloud's calls through ``add``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from skyward._errors import ProvisionError
from skyward.providers.base import Resource
from skyward.providers.ssh.connection import PoolKey

_INFLIGHT_WAIT = 90.0  # seconds a release waits for create calls still on the wire


class Record:
    """What one pool made, as it is made. Every method takes the one lock; nothing else
    writes these fields. A ``Condition``: a release waits on it for creates on the wire."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self._resources: list[Resource] = []
        self._asked: list[tuple[str, str]] = []  # (place, name) of every machine asked for
        self._made: list[tuple[str, str]] = []  # (place, id) of every machine the cloud made
        self._nodes: list[tuple[str, str]] = []  # (place, id) of each node's machine, by rank
        self._inflight = 0
        self._generation = 0
        self._released = False
        self._pool_key: PoolKey | None = None
        self._lock = threading.Condition(threading.RLock())  # guards: every field above

    # ── written by the start and, through these, by a cloud's calls ────────────────────

    def add(self, kind: str, id: str) -> str:
        """A pool-wide resource (``"security group"``, its id): from now on its deletion
        is the release's. Called as soon as the cloud answers, or, for a name we choose,
        before we ask (an answer lost in flight still counts); ``id`` back."""
        with self._lock:
            self._resources.append(Resource(kind, id))
        return id

    def made(self, place: str, ids: Sequence[str]) -> None:
        """Machines the cloud made (their ids, as it answered)."""
        with self._lock:
            self._made += [(place, i) for i in ids if (place, i) not in self._made]

    def key(self, key: PoolKey) -> None:
        with self._lock:
            self._pool_key = key

    def ask(self, place: str, ranks: Sequence[int], prefix: str) -> list[str]:
        """Names for new machines of ``ranks``, recorded before anything is asked for: an
        answer lost to a Ctrl-C still leaves a name to delete. A replacement's name says its
        generation (the old machine's name may still be in use while it is deleted)."""
        with self._lock:
            if self._released:
                raise ProvisionError(f"pool {self.pool} is closing; not launching")
            generation = self._generation
            self._generation += 1
            names = [f"{prefix}{r}" + (f"-r{generation}" if generation else "") for r in ranks]
            self._asked += [(place, n) for n in names]
            self._inflight += 1
            return names

    def answered(self) -> None:
        with self._lock:
            self._inflight -= 1
            self._lock.notify_all()

    def place(self, rank: int, place: str, id: str) -> None:
        with self._lock:
            if rank < len(self._nodes):
                self._nodes[rank] = (place, id)
            else:
                self._nodes.append((place, id))

    def close(self) -> tuple[bool, PoolKey | None]:
        """Mark the record released (once): whether it was already, and the key to delete.
        Waits (bounded) for creates still on the wire, so the delete sees every name."""
        with self._lock:
            if self._released:
                return True, None
            self._released = True
            self._lock.wait_for(lambda: self._inflight == 0, timeout=_INFLIGHT_WAIT)
            return False, self._pool_key

    # ── read by a cloud's ``delete`` and by the pool ───────────────────────────────────

    def resources(self, kind: str) -> list[str]:
        """The ids recorded as ``kind``, in order."""
        with self._lock:
            return [r.id for r in self._resources if r.kind == kind]

    def recorded(self) -> list[Resource]:
        """Every pool-wide resource, in order."""
        with self._lock:
            return list(self._resources)

    def asked(self) -> list[tuple[str, str]]:
        """(place, name) of every machine ever asked for, replacements included."""
        with self._lock:
            return list(self._asked)

    def machines(self) -> list[tuple[str, str]]:
        """(place, id) of every machine the cloud made, replaced ones included."""
        with self._lock:
            return list(self._made)

    def node(self, rank: int) -> tuple[str, str] | None:
        """(place, id) of node ``rank``'s machine; ``None`` before it has one."""
        with self._lock:
            return self._nodes[rank] if rank < len(self._nodes) else None

    @property
    def released(self) -> bool:
        with self._lock:
            return self._released

    # ── kept warm (``warm.py``): written down whole, and read back by the next pool ────

    def snapshot(self) -> dict[str, object]:
        """Everything recorded, as JSON values: what a release of the kept machines needs."""
        with self._lock:
            return {
                "pool": self.pool,
                "resources": [[r.kind, r.id] for r in self._resources],
                "asked": [list(pair) for pair in self._asked],
                "made": [list(pair) for pair in self._made],
                "nodes": [list(pair) for pair in self._nodes],
                "generation": self._generation,
            }

    @classmethod
    def restored(cls, snapshot: dict[str, Any], key: PoolKey | None) -> Record:
        """The record ``snapshot`` wrote, with its pool key: whoever holds it now releases
        what it names."""

        def pairs(name: str) -> list[tuple[str, str]]:
            return [(str(a), str(b)) for a, b in snapshot.get(name, [])]

        record = cls(str(snapshot["pool"]))
        record._resources = [Resource(str(k), str(i)) for k, i in snapshot.get("resources", [])]
        record._asked, record._made = pairs("asked"), pairs("made")
        record._nodes = pairs("nodes")
        record._generation = int(snapshot.get("generation", 0))
        record._pool_key = key
        return record

    @property
    def pool_key(self) -> PoolKey | None:
        with self._lock:
            return self._pool_key

    def let_go(self) -> None:
        """Mark the record released without deleting anything: its machines were kept warm,
        and the next pool (or ``skyward down``) releases them. Later releases do nothing."""
        with self._lock:
            self._released = True
