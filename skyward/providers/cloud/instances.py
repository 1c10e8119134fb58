"""A pool's machines made one create request each, under names chosen first: the allocation
of a cloud that names its machines itself (GCP, Azure), all but the cloud's own calls.

::

    launch(place, ranks)     names recorded before any request (an answer lost to a Ctrl-C
                             still leaves a name to delete), one create per name, in
                             parallel; all settle, then the first failure is raised; when
                             every failure was a ``CapacityError`` the attempt's machines
                             are deleted first, so that the next place starts clean
    running(place, names)    each machine once it runs; one that ends on the way fails the
                             wait, with the cloud's reason
    remake(rank, ...)        the old machine dropped (not waited for), a new one launched
                             in the same place, waited for
    drain()                  for ``delete_all``: launches woken, creates still on the wire
                             waited for (bounded), every machine ever asked for

A cloud's subclass gives the calls on one machine: ``start`` a create and ``finish`` it,
its ``status`` and ``why_ended`` (which ``CloudAllocation.loss_reason`` also asks),
``delete_machines`` (and ``forget``, which does not wait), and the ``prefix`` of its
machines' names (``node-``; a replacement's name says its generation, ``node-0-r1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline, settle
from skyward.client.phases import Reporter
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud.allocation import CloudAllocation, WatchedDeadline
from skyward.providers.cloud.api import poll
from skyward.providers.cloud.capacity import CapacityError
from skyward.providers.ssh.hosts import HostTarget

ApiT = TypeVar("ApiT")
SpecT = TypeVar("SpecT")
POLL = 1.0  # seconds between reads while waiting for machines to run
_INFLIGHT_WAIT = 90.0  # seconds a release waits for create calls still on the wire


class InstanceAllocation(CloudAllocation[ApiT, SpecT]):
    """Machines made one by one, by name: node ``i`` runs on ``instances[i]``, a
    (place, name). ``running_status``: the status a start waits for; ``ended``: those
    that fail that wait at once."""

    running_status: ClassVar[str]
    ended: ClassVar[frozenset[str]]
    prefix = "node-"  # of the machines' names

    def __init__(self, api: ApiT, request: ProvisionRequest, **options: Any) -> None:
        super().__init__(api, request, **options)
        self.instances: list[tuple[str, str]] = []  # by rank
        self._made: list[tuple[str, str]] = []  # every machine ever asked for
        self._generation = 0
        self._inflight = 0
        # Launches wait on this; release wakes them.
        self.launching = WatchedDeadline(request.deadline)

    # ── the cloud's calls ──────────────────────────────────────────────────────────────

    def name(self, rank: int, generation: int) -> str:
        """Rank ``rank``'s machine: ``prefix`` and the rank, and for a replacement its
        generation (the old machine's name may still be in use while it is deleted)."""
        return f"{self.prefix}{rank}" + (f"-r{generation}" if generation else "")

    def start(self, place: str, name: str, spec: SpecT, deadline: Deadline) -> Any:
        """Send the create request (not retried); what ``finish`` waits on. A refusal
        that another place may not meet is a ``CapacityError``."""
        raise NotImplementedError

    def finish(self, started: Any, doing: str, deadline: Deadline) -> None:
        """Wait until the create has finished (nothing, for a ``start`` that waited)."""

    def delete_machines(self, machines: Sequence[tuple[str, str]], deadline: Deadline) -> list[str]:
        """Delete (and wait, within ``deadline``); what could not be, as ``"kind name (why)"``."""
        raise NotImplementedError

    def target(self, described: Any) -> HostTarget:
        raise NotImplementedError

    def forget(self, place: str, name: str) -> None:
        """Start deleting a lost machine; do not wait."""
        self.delete_machines([(place, name)], Deadline(0.0, "no wait"))

    # ── what is the same for every such cloud ──────────────────────────────────────────

    def launch(self, place: str, ranks: Sequence[int], deadline: Deadline) -> list[str]:
        """One machine per rank in ``place``, from ``spec``, made in parallel: their names."""
        with self._guard:
            spec = self.spec
            if self._released or spec is None:
                raise ProvisionError(f"pool {self.request.pool} is closing; not launching")
            self._generation += 1
            names = [self.name(r, self._generation - 1) for r in ranks]
            self._made += [(place, n) for n in names]
            self._inflight += len(names)

        def create(name: str) -> None:
            try:
                started = self.start(place, name, spec, deadline)
            finally:
                with self._guard:  # on the wire no more: release may delete it by name
                    self._inflight -= 1
                    self._guard.notify_all()
            self.finish(started, f"creating {self.noun} {name} in {place}", deadline)

        # A Ctrl-C while waiting leaves the creates to release(), which waits for them.
        errors = [e for f in settle(create, names) if (e := f.exception()) is not None]
        if errors and all(isinstance(e, CapacityError) for e in errors):
            left = self.delete_machines([(place, n) for n in names], self.release_deadline())
            if left:
                raise ProvisionError(
                    f"pool {self.request.pool}: could not delete {', '.join(left)}. Remove "
                    f"them with: {self.down_command}"
                )
        if errors:
            raise errors[0]
        return names

    def running(self, place: str, names: Sequence[str], deadline: Deadline) -> list[Any]:
        """Each machine's description once it runs, in ``names``' order."""
        doing = f"waiting for {len(names)} {self.noun}(s) to run"

        def probe() -> list[Any] | None:
            found = []
            for name in names:
                got = self.status(place, name)
                if got is None:
                    why = self.why_ended(place, name, None)
                    raise ProvisionError(f"{doing}: {self.noun} {name} is gone: {why}")
                if got[0] in self.ended:
                    why = self.why_ended(place, name, got[1])
                    raise ProvisionError(f"{doing}: {self.noun} {name} is {got[0]}: {why}")
                found.append(got)
            if all(status == self.running_status for status, _ in found):
                return [described for _, described in found]
            return None

        deadline.check(doing)
        return poll(probe, doing, deadline, pause=POLL, most=POLL)

    def chose(self, offer: Any, launched: Any) -> None:
        """``launched``: the names of the machines made where ``offer`` is, by rank."""
        super().chose(offer, launched)
        self.instances = [(offer.zone, name) for name in launched]

    def machine(self, rank: int) -> tuple[str, str] | None:
        return self.instances[rank] if rank < len(self.instances) else None

    def remake(self, rank: int, spec: SpecT, reporter: Reporter, deadline: Deadline) -> HostTarget:
        with self._guard:
            place, old = self.instances[rank]
        reporter.phase(rank, "provisioning", f"replacing {old}")
        self.forget(place, old)
        (new,) = self.launch(place, [rank], deadline)
        with self._guard:
            self.instances[rank] = (place, new)
        (target,) = self.targets(place, [new], deadline)
        return target

    def targets(self, place: str, names: Sequence[str], deadline: Deadline) -> list[HostTarget]:
        """How to reach each machine, once it runs (``CloudOptions.started``'s default)."""
        return [self.target(described) for described in self.running(place, names, deadline)]

    def drain(self) -> list[tuple[str, str]]:
        """Wake the launches and wait (bounded) for creates still on the wire: every
        machine ever asked for, to delete by name."""
        with self._guard:
            self.launching.fail("the pool is being released")
            self._guard.wait_for(lambda: self._inflight == 0, timeout=_INFLIGHT_WAIT)
            return list(self._made)

    def release_deadline(self) -> Deadline:
        return Deadline(self.release_timeout, f"release_timeout ({self.release_timeout:g} s)")
