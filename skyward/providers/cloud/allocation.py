"""What one cloud pool made, and the life every cloud's allocation shares: recorded as it is
made, destroyed on any failure, reached over SSH, released once, a lost machine replaced.

::

    open_or_destroy(made, build)   build records each resource on ``made`` as soon as it
                                   exists; any failure, Ctrl-C included, terminates ``made``
    made.pool_keys / host_key      the login key (deleted with ``made``) and the host key
    made.record(kind, name)        a pool-wide resource recorded (``recorded(kind)``)
    made.reach(targets, ...)       open_hosts, while a watcher asks the cloud every two
                                   seconds whether a machine ended (a spot reclaim, its
                                   watchdog): then the start fails at once, with the
                                   cloud's reason, instead of after ``boot_timeout``
    made.release()                 once: the cloud's ``delete_all``, the pool key, and a
                                   ``ProvisionError`` naming what is left and the
                                   ``skyward down`` command that removes it
    made.replace(rank, ...)        close the old node, the cloud's ``remake`` (the old
                                   machine dropped, a new one made alike), reach it

    made.loss_reason(rank)         why node ``rank``'s machine ended ("instance i-1 is
                                   terminated: reclaimed by AWS (spot interruption)"), from
                                   the cloud's ``status`` and ``why_ended``

A cloud's allocation adds its resources and the SDK calls: ``delete_all``, ``remake``,
``machine``, ``status``, ``why_ended`` and ``target``. Every field that changes is guarded
by ``_guard``, since a replacement may race the pool's teardown.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from skyward._errors import HostKeyError, ProvisionError
from skyward.client.futures import Deadline, settle
from skyward.client.phases import Choice, Phase, Reporter
from skyward.client.shield import finish
from skyward.providers.base import Allocation, Node, ProvisionRequest, Resource
from skyward.providers.ssh.connection import PoolKey, Target
from skyward.providers.ssh.hosts import Access, HostNode, HostTarget, open_hosts

A = TypeVar("A", bound=Allocation)
ApiT = TypeVar("ApiT")
SpecT = TypeVar("SpecT")
# On everything one provision creates, besides the pool's tags: a value unique to that
# provision (the pool's name need not be unique), so that its clean-up can sweep for what
# a create call cut off in flight made, and never touch another run's resources.
TAG_ALLOCATION = "skyward-allocation"


def unique_name(pool: str, *, unsafe: str, length: int) -> str:
    """``skyward-<pool>-<6 hex>``, the base of what one provision names (AWS's key pair and
    group, GCP's rules and instances, Azure's resource group): unique to that provision,
    since a pool's name need not be. What the cloud refuses in names (``unsafe``, a regex)
    becomes ``-``; ``length`` characters of the pool at most."""
    slug = re.sub(unsafe, "-", pool)[:length].strip("-")
    return f"skyward-{slug or 'pool'}-{secrets.token_hex(3)}"


def open_or_destroy(allocation: A, build: Callable[[A], None]) -> A:
    """Run ``build``, which creates resources, records each on ``allocation`` as soon as it
    exists, and reaches the machines; on any failure, Ctrl-C included, terminate what it
    recorded and re-raise.

    The clean-up runs on its own thread and is waited for through any number of Ctrl-Cs
    (``_shield.finish``): a second Ctrl-C must not turn a failed start into a running GPU
    bill. It is bounded by the allocation's own waits, not by the start's deadline, which
    may be what just passed.
    """
    try:
        build(allocation)
    except BaseException as exc:
        failure = finish(allocation.terminate)
        if failure is not None:
            exc.add_note(f"and cleaning up failed: {failure}")
        raise
    return allocation


def delete_each(
    deletions: Sequence[tuple[str, Callable[[], object]]], *, gone: Callable[[BaseException], bool]
) -> list[str]:
    """Run every deletion at once (each a (``"kind name"``, call that deletes and waits)) and
    wait for all: what could not be deleted, as ``"kind name (why)"``. One the cloud says was
    gone already (``gone(error)``) counts as done."""
    ended = settle(lambda deletion: deletion[1](), deletions)
    failures = [
        (named, future.exception()) for (named, _), future in zip(deletions, ended, strict=True)
    ]
    return [f"{named} ({exc})" for named, exc in failures if exc is not None and not gone(exc)]


class WatchedDeadline(Deadline):
    """A deadline that ends with ``parent`` and can also be failed, with a reason, by a watcher
    of the machines being reached: a spot instance reclaimed while it booted fails the start
    at once instead of being retried until ``boot_timeout``."""

    def __init__(self, parent: Deadline) -> None:
        super().__init__(parent.remaining(), parent.what)
        self._parent = parent
        self._failure: str | None = None

    @property
    def failure(self) -> str | None:
        return self._failure

    def fail(self, reason: str) -> None:
        self._failure = reason
        self.cancel(reason)  # wakes whoever sleeps on this deadline

    def check(self, doing: str) -> None:
        self._parent.check(doing)
        if self._failure is not None:
            raise ProvisionError(f"{doing}: {self._failure}")
        super().check(doing)


def reach(
    targets: Sequence[HostTarget],
    access: Access,
    request: ProvisionRequest,
    reporter: Reporter,
    *,
    gone: Callable[[], str | None],
    hint: str,
    poll: float = 2.0,
) -> list[HostNode]:
    """``open_hosts`` for a cloud's machines. ``gone()`` says why one of them ended (or
    ``None``; its errors are ignored: it is a hint, the connections' own bounds still
    hold); ``hint`` is added to a start that failed with machines SSH never answered."""
    reached = _Reached(reporter)
    deadline = WatchedDeadline(request.deadline)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(poll):
            try:
                why = gone()
            except Exception:
                continue
            if why is not None:
                deadline.fail(why)
                return

    threading.Thread(target=watch, name="skyward-watch-machines", daemon=True).start()
    try:
        return open_hosts(targets, access, dataclasses.replace(request, deadline=deadline), reached)
    except (ProvisionError, TimeoutError) as exc:
        silent = [t.target.host for r, t in enumerate(targets) if r not in reached.reached]
        if silent and deadline.failure is None and not isinstance(exc, HostKeyError):
            exc.add_note(
                f"Machines {', '.join(silent)} are running, but SSH did not answer from here: "
                f"{hint}"
            )
        raise
    finally:
        stop.set()


class _Reached:
    """A reporter that also remembers which nodes got past connecting (SSH answered)."""

    def __init__(self, reporter: Reporter) -> None:
        self._reporter = reporter
        self.reached: set[int] = set()

    def phase(self, node: int, phase: Phase, detail: str = "") -> None:
        if phase not in ("provisioning", "connecting"):
            self.reached.add(node)
        self._reporter.phase(node, phase, detail)

    def log(self, node: int, line: str) -> None:
        self._reporter.log(node, line)

    def status(self, line: str) -> None:
        self._reporter.status(line)

    def chosen(self, choice: Choice) -> None:
        self._reporter.chosen(choice)


class CloudAllocation(Allocation, Generic[ApiT, SpecT]):
    """A cloud pool's machines and resources, made through ``api`` for ``request``.

    ``spec`` is how a node's machine is made, kept so that a lost one is replaced alike;
    ``access`` and ``host_key`` how the machines are reached. Subclasses implement
    ``delete_all`` (and, to replace machines, ``remake``; to say why one was lost,
    ``loss_reason``)."""

    def __init__(
        self,
        api: ApiT,
        request: ProvisionRequest,
        *,
        connect: str,
        username: str,
        release_timeout: float,
    ) -> None:
        super().__init__([])
        self.api = api
        self.request = request
        self.connect = connect
        self.username = username
        self.release_timeout = release_timeout
        self.access: Access | None = None
        self.host_key: str | None = None
        self.spec: SpecT | None = None
        self.pool_key: PoolKey | None = None
        # Where the pool's resources are: words for messages (" in us-east-1"), and the
        # `skyward down` option that names it ("--region us-east-1").
        self.scope = ("", "")
        self._released = False
        # guards: every field that changes (a Condition, for waits on in-flight requests)
        self._guard = threading.Condition(threading.RLock())

    # ── what every cloud records ───────────────────────────────────────────────────────

    def adopt_pool_key(self, key: PoolKey) -> None:
        with self._guard:
            self.pool_key = key

    def record(self, kind: str, name: str) -> str:
        """Record a pool-wide resource (``"security group"``, its id): from now on its
        deletion is the release's. Called as soon as the cloud answers, or, for a name we
        choose, before we ask (an answer lost in flight still counts); ``name`` back."""
        with self._guard:
            self.resources.append(Resource(kind, name))
        return name

    def recorded(self, kind: str) -> list[str]:
        """The names recorded as ``kind``, in order."""
        with self._guard:
            return [r.id for r in self.resources if r.kind == kind]

    def chose(self, offer: Any, launched: Any) -> None:
        """The place that took the pool (a ``capacity.Offer``), for the cost report;
        ``launched``: what its launch returned, which a cloud's allocation records."""
        nodes = self.request.nodes
        self.hourly_cost = offer.pool_hourly(nodes)
        self.describe = f"{nodes} x {offer.machine.type} {offer.market} in {offer.zone}"

    def host_target(self, private: str, public: str | None) -> HostTarget:
        """How to reach a machine: its public address when the pool connects there."""
        address = public if self.connect == "public" and public else private
        return HostTarget(
            Target(host=address, port=22, user=self.username),
            peer_address=private,
            host_key=self.host_key,
        )

    def reach(
        self,
        targets: Sequence[HostTarget],
        reporter: Reporter,
        *,
        hint: str,
        deadline: Deadline | None = None,
    ) -> None:
        """Reach every machine over SSH and prepare it (``reach``): the pool's nodes. A
        machine that ends meanwhile fails the start at once, with ``loss_reason``."""
        assert self.access is not None
        request = self.request
        if deadline is not None:
            request = dataclasses.replace(request, deadline=deadline)
        self.nodes = list(reach(targets, self.access, request, reporter, gone=self.gone, hint=hint))

    # The statuses of a machine that runs or is on its way there, in the cloud's words,
    # and its word for a machine.
    alive: ClassVar[frozenset[str]] = frozenset()
    noun: ClassVar[str] = "instance"

    def machine(self, rank: int) -> tuple[str, str] | None:
        """(place, name) of node ``rank``'s machine; ``None`` before it has one. Called
        holding ``_guard``."""
        return None

    def status(self, place: str, name: str, *, quick: bool = False) -> tuple[str, Any] | None:
        """(status, description) of a machine, ``None`` when the cloud says it does not
        exist; ``quick``: one bounded try (the watcher asks again in seconds)."""
        raise NotImplementedError

    def why_ended(self, place: str, name: str, described: Any) -> str:
        """Why a machine stopped or vanished, in words (``described``: its status's
        description, ``None`` when it is gone)."""
        raise NotImplementedError

    def loss_reason(self, rank: int) -> str | None:
        """Why node ``rank``'s machine is gone or stopped, when the cloud says so; ``None``
        while it lives or if the cloud cannot be asked."""
        with self._guard:
            found = self.machine(rank)
        if found is None:
            return None
        place, name = found
        try:
            got = self.status(place, name, quick=True)
        except Exception:
            return None  # a message's detail; never a reason to fail the report of a loss
        if got is None:
            return f"{self.noun} {name} is gone: {self.why_ended(place, name, None)}"
        if got[0] in self.alive:
            return None
        return f"{self.noun} {name} is {got[0]}: {self.why_ended(place, name, got[1])}"

    def gone(self) -> str | None:
        """Why one of the pool's machines ended, or ``None`` while all run."""
        reasons = (self.loss_reason(rank) for rank in range(self.request.nodes))
        return next(filter(None, reasons), None)

    # ── the contract ───────────────────────────────────────────────────────────────────

    @property
    def down_command(self) -> str:
        """The ``skyward down`` command that removes what this pool leaves behind."""
        return " ".join(["skyward down --pool", self.request.pool, self.scope[1]]).rstrip()

    def delete_all(self) -> list[str]:
        """Delete everything the pool made (once, after its nodes are closed); what could
        not be deleted, as ``"kind name (why)"``."""
        return []

    def release(self) -> None:
        """``delete_all``, then the pool key. Idempotent; raises ``ProvisionError`` naming
        what is left and the command that removes it, after trying everything."""
        with self._guard:
            if self._released:
                return
            self._released = True
            pool_key = self.pool_key
        try:
            left = self.delete_all()
        finally:
            if pool_key is not None:
                pool_key.delete()
        if left:
            raise ProvisionError(
                f"pool {self.request.pool}: could not delete {', '.join(left)}{self.scope[0]}. "
                f"Remove what is left with: {self.down_command}"
            )

    @property
    def can_replace(self) -> bool:
        return self.spec is not None and self.access is not None

    def closing(self) -> ProvisionError:
        return ProvisionError(f"pool {self.request.pool} is closing; not replacing")

    def replace(self, rank: int, reporter: Reporter, deadline: Deadline) -> Node:
        """A new machine for node ``rank``, made alike (same network, key, host key)."""
        with self._guard:
            if self._released or self.spec is None or self.access is None:
                raise self.closing()
            old_node = self.nodes[rank] if rank < len(self.nodes) else None
            spec, access = self.spec, self.access
        if old_node is not None:
            old_node.close()
        target = self.remake(rank, spec, reporter, deadline)
        request = dataclasses.replace(self.request, nodes=1, deadline=deadline)
        (node,) = open_hosts([target], access, request, reporter, ranks=[rank])
        with self._guard:
            if self._released:
                node.close()
                raise self.closing()
            self.nodes[rank] = node
        return node

    def remake(self, rank: int, spec: SpecT, reporter: Reporter, deadline: Deadline) -> HostTarget:
        """Drop node ``rank``'s machine without waiting, make a new one from ``spec``,
        record it (raising ``closing()`` when the pool was released meanwhile) and wait
        until it runs: how to reach it."""
        raise NotImplementedError(f"{type(self).__name__} cannot replace a machine")
