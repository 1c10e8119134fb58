"""The provider contract: create machines, say how to start a worker on each, destroy them.

A provider never schedules work or speaks the worker protocol; the pool does both::

    ComputePool(...)     provider.check(request)            refuse bad input, touch nothing
    pool.start()         provider.provision(request, rep)   -> Allocation (nodes + resources)
                         node.spawn_worker(rank, env)       per node; again to replace a worker
                         allocation.replace(rank, ...)      a lost machine (optional)
    autoscaling          allocation.grow(ranks, ...)        more machines (optional)
                         allocation.shrink(rank)            the last one, released
    pool.close()         allocation.terminate()             always, on every path; idempotent
    skyward ls / down    provider.inventory()               leftovers by tag (optional)

- ``check(request)``: provider-specific limits (more nodes than hosts, an accelerator the
  provider cannot give, a missing SDK: ``MissingDependency``), raised when the pool is built.
- ``provision(request, reporter)`` returns an ``Allocation`` of exactly ``request.nodes``
  nodes, all or nothing: if it fails part-way (or ``request.deadline`` passes, or is
  cancelled because the pool was closed meanwhile) it destroys what it made before raising.
  It tells ``reporter`` each node's phase (``provisioning``, ``connecting``,
  ``bootstrapping``) and the lines its bootstrap prints. It tags everything it creates with
  ``request.tags`` (``skyward-pool``, ``skyward-owner``, ``skyward-created``), so that
  ``skyward ls`` can find it after a crash. Errors are ``SkywardError``s that say what to do;
  anything else that escapes is wrapped by the pool in ``ProvisionError``.
- The ``Allocation`` owns the nodes *and* the pool-wide resources (a security group, a key
  pair, a resource group). ``terminate()`` stops every node, then deletes those resources;
  it is idempotent and thread-safe, and raises ``ProvisionError`` naming what it could not
  delete (with the ``skyward down`` command that removes it), after trying everything.
- An autoscaling pool (``nodes=(min, max)``) provisions ``request.nodes`` (the ``min``)
  and later asks the allocation for more (``grow``) and gives the last ones back
  (``shrink``), never past ``request.max_nodes``. A provider whose allocations can do that
  says so with a class attribute ``grows = True``; the pool refuses ``nodes=(min, max)``
  on any other, when it is built.
- ``Node.spawn_worker(rank, env)`` starts ``python -m skyward.worker --node RANK`` and returns
  its byte streams. ``Node.close()`` kills its workers and lets go of the machine's link.

A provider that reaches its machines over SSH builds on ``providers.ssh.hosts``: it hands over
targets (address, user, key, expected host key) and gets nodes back.
"""

from __future__ import annotations

import getpass
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from skyward._errors import ProvisionCancelled, ProvisionError
from skyward._image import Image
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.client.volume import Volume

if TYPE_CHECKING:
    from skyward.link.channel import Transport

# The tags every created resource carries (AWS tags, GCP labels, Azure tags).
TAG_POOL = "skyward-pool"
TAG_OWNER = "skyward-owner"
TAG_CREATED = "skyward-created"


def identity_tags(pool: str, *, now: datetime | None = None) -> dict[str, str]:
    """The tags that tie a resource to its pool, its owner and its creation time (UTC)."""
    created = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {TAG_POOL: pool, TAG_OWNER: owner(), TAG_CREATED: created}


def owner() -> str:
    """``user@host`` of this client: who to ask about a leftover."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class ProvisionRequest:
    """What a provider is asked for: no console options, no scheduling knobs.

    ``image`` is the pool's image after the plugins' transforms. ``deadline`` bounds the whole
    provision (``provision_timeout``) and is cancelled when the pool is closed meanwhile.
    """

    pool: str
    nodes: int
    accelerator: str | None
    image: Image
    tags: Mapping[str, str]
    deadline: Deadline = field(compare=False)
    # Per node, at least (None: any). A provider that picks machines picks ones this large;
    # one that runs on machines that exist checks them or says in its docs that it cannot.
    vcpus: float | None = None
    memory_gb: float | None = None
    # "spot", "on-demand", "spot-if-available" or "cheapest"; None: the provider's default.
    # A provider with no spot machines refuses "spot" in check().
    allocation: str | None = None
    # USD per hour for the whole pool; a provider that knows prices refuses to create a
    # pool it estimates above it (before creating anything). None: no limit.
    max_hourly_cost: float | None = None
    # An autoscaling pool may grow to this many nodes (Allocation.grow); None: it keeps
    # ``nodes``. A provider that can only ever have so many (SSH's hosts) checks it.
    max_nodes: int | None = None
    # Object storage to mount on every node before its workers start, and to unmount when
    # the node is closed (``providers/volumes.py``). A provider that cannot refuses them in
    # check().
    volumes: tuple[Volume, ...] = ()
    # The plugins that tie the nodes into one runtime whose processes connect to each other
    # (jax, torch), when there are several nodes: a provider whose machines cannot reach
    # each other refuses them in check() (``refuse_gang``).
    gang: tuple[str, ...] = ()
    # Seconds to keep the machines for the next pool like this one once the pool closes
    # (``Allocation.keep``); 0: destroy them. A provider that cannot refuses it in check()
    # (``refuse_keep_warm``).
    keep_warm: float = 0.0


def refuse_gang(request: ProvisionRequest, why: str) -> None:
    """``ValueError`` for a gang plugin across several machines that cannot reach each
    other (``why`` says so, in the provider's words); one node is always fine."""
    if request.gang:
        raise ValueError(
            f"plugin {', '.join(request.gang)} connects every node to the others, but {why}. "
            f"Use one machine with more accelerators (nodes=1, workers_per_node='gpus'), or a "
            f"provider whose machines share a network; calls without such a plugin (>>, map, "
            f"@) work across nodes here"
        )


def refuse_keep_warm(request: ProvisionRequest, why: str) -> None:
    """``ValueError`` for ``keep_warm`` from a provider that does not create its machines
    (``why`` says so, in its words): there is nothing to keep."""
    if request.keep_warm:
        raise ValueError(
            f"keep_warm={request.keep_warm:g} cannot be honoured: {why}. Leave keep_warm out "
            f"(it keeps machines a cloud pool created for the next pool like it)"
        )


def refuse_spot(request: ProvisionRequest, why: str) -> None:
    """``ValueError`` for ``allocation="spot"`` from a provider with no spot machines; the
    other strategies mean the machines it has."""
    if request.allocation == "spot":
        raise ValueError(
            f"allocation='spot' cannot be honoured: {why}, and none of it is spot capacity. "
            f"Leave allocation out, or use 'on-demand' or 'spot-if-available', which run on "
            f"the machines there are"
        )


@runtime_checkable
class Node(Protocol):
    """One machine of a pool, as the provider made it."""

    @property
    def address(self) -> str:
        """Where the other nodes of the pool reach this one (``InstanceInfo.peers``)."""
        ...

    @property
    def accelerators(self) -> int:
        """Accelerator devices on this node (0 for CPU-only)."""
        ...

    @property
    def shares_files(self) -> bool:
        """True when the node sees the client's files (local processes): workers then import
        the client's own modules by path. Otherwise they are sent by value."""
        ...

    def spawn_worker(self, rank: int, env: Mapping[str, str]) -> Transport: ...

    def close(self) -> None:
        """Kill this node's workers and release its link. Idempotent; later spawns fail."""
        ...


@dataclass(frozen=True)
class Resource:
    """A pool-wide thing a provider created (for messages and ``terminate``'s report)."""

    kind: str  # "security group", "key pair", "resource group"
    id: str


class Allocation:
    """What one ``provision`` made: the nodes, by rank, and the pool-wide resources.

    Providers subclass it to delete their resources (``release``) and, when they can, to
    replace a lost machine (``replace``). ``terminate`` is the only teardown the pool calls:
    it closes every node, then releases, once, whatever happened before.
    """

    def __init__(self, nodes: Sequence[Node], resources: Sequence[Resource] = ()) -> None:
        self.nodes: list[Node] = list(nodes)
        self.resources: list[Resource] = list(resources)
        self._lock = threading.Lock()  # guards: _terminated, and nodes while they change
        self._terminated = False
        # The estimated price of every machine together, USD per hour, when the provider
        # knows it (the pool reports the approximate cost at close); 0 for free machines.
        self.hourly_cost: float | None = None
        self.describe: str = ""  # what the machines are, for that report ("2 x g6.xlarge")
        # Seconds each step of the provision took, by name ("warm.claim", "warm.reach"), as
        # the provider measured them: ``ComputePool.timings()`` shows them.
        self.timings: dict[str, float] = {}

    @property
    def can_replace(self) -> bool:
        """Whether ``replace`` can make a new machine for a lost one."""
        return False

    def replace(self, rank: int, reporter: Reporter, deadline: Deadline) -> Node:
        """A new machine in place of node ``rank``'s, which was lost (a preempted VM);
        it becomes ``nodes[rank]``. The old node is closed and its machine destroyed first.
        Only when ``can_replace``; the pool calls it when it cannot start a worker on the
        old node any more."""
        raise NotImplementedError(f"{type(self).__name__} cannot replace a machine")

    def grow(self, ranks: Sequence[int], reporter: Reporter, deadline: Deadline) -> list[Node]:
        """New machines for nodes ``ranks`` (the next ones: ``len(nodes)`` onwards), all or
        nothing, bounded by ``deadline`` (cancelled when the pool closes); they are added to
        ``nodes`` with ``adopt`` as they come, so that a ``terminate`` meanwhile ends them.
        Only when the provider ``grows``."""
        raise NotImplementedError(f"{type(self).__name__} cannot add machines")

    def shrink(self, rank: int) -> None:
        """Release node ``rank``, the last one: close it, destroy its machine, and drop it
        from ``nodes``. Idempotent. Only when the provider ``grows``; the pool has stopped its
        worker first."""
        raise NotImplementedError(f"{type(self).__name__} cannot release a machine")

    def adopt(self, node: Node) -> None:
        """Add a machine ``grow`` made to ``nodes``; a pool terminated meanwhile closes it
        here instead, and ``ProvisionCancelled`` says so."""
        with self._lock:
            if not self._terminated:
                self.nodes.append(node)
                return
        node.close()
        raise ProvisionCancelled("the pool was closed while a machine was added")

    def drop(self, rank: int) -> Node | None:
        """Take node ``rank`` out of ``nodes`` (``shrink``'s first step): the last one only."""
        with self._lock:
            if rank != len(self.nodes) - 1:
                return None
            return self.nodes.pop()

    def loss_reason(self, rank: int) -> str | None:
        """Why node ``rank``'s machine is gone (``"reclaimed by AWS (spot interruption)"``),
        when the provider can tell; ``None`` otherwise. Asked when a node's link drops, and
        added to the ``WorkerLost`` its calls get."""
        return None

    def keep(self, seconds: float) -> bool:
        """Instead of ``terminate``: stop the workers and leave the machines running for
        ``seconds`` for the next pool like this one (``keep_warm``), bounded on the machines
        themselves; whether they were kept (False: the caller terminates). Default: never."""
        return False

    def release(self) -> None:
        """Delete the pool-wide resources, after every node is closed. Default: none."""

    def deleting(self) -> str:
        """What ``terminate`` deletes, named for a user who leaves before it is done."""
        machines = self.describe or f"{len(self.nodes)} machine(s)"
        return ", ".join([machines] + [f"{r.kind} {r.id}" for r in self.resources])

    @property
    def down_command(self) -> str:
        """The ``skyward down`` command that removes what is left; "" when ``skyward down
        --pool NAME`` does."""
        return ""

    @property
    def terminated(self) -> bool:
        return self._terminated

    def terminate(self) -> None:
        """Close every node, then ``release``. Idempotent and thread-safe; tries everything,
        then raises the first failure (a ``ProvisionError`` names what is left)."""
        with self._lock:
            if self._terminated:
                return
            self._terminated = True
            nodes = list(self.nodes)  # a shrink may drop one meanwhile; it closes that one
        errors: list[BaseException] = []
        for node in nodes:
            try:
                node.close()
            except Exception as exc:
                errors.append(exc)
        try:
            self.release()
        except Exception as exc:
            errors.append(exc)
        if errors:
            first = errors[0]
            if isinstance(first, ProvisionError) and len(errors) == 1:
                raise first
            raise ProvisionError("; ".join(f"{type(e).__name__}: {e}" for e in errors)) from first


@dataclass(frozen=True)
class Leftover:
    """Something a provider made for a pool that still exists (``skyward ls``)."""

    provider: str  # "aws"
    kind: str  # "instance", "security group", "key pair"
    id: str
    pool: str
    owner: str
    created: datetime | None
    state: str
    region: str = ""
    hourly_cost: float | None = None  # USD, when known


def tagged_leftover(
    provider: str,
    kind: str,
    id: str,
    tags: Mapping[str, str],
    *,
    state: str = "exists",
    region: str = "",
    hourly_cost: float | None = None,
) -> Leftover:
    """A leftover read from the identity tags it carries (``identity_tags``, in reverse)."""
    return Leftover(
        provider=provider,
        kind=kind,
        id=id,
        pool=tags.get(TAG_POOL, ""),
        owner=tags.get(TAG_OWNER, ""),
        created=created_at(tags.get(TAG_CREATED)),
        state=state,
        region=region,
        hourly_cost=hourly_cost,
    )


def created_at(text: str | None) -> datetime | None:
    """A creation time as a tag (``2026-01-02T03:04:05Z``) or as a GCP label value of one
    (lower case, ``_`` for ``:``); ``None`` when it is neither."""
    for form in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dt%H_%M_%Sz"):
        try:
            return datetime.strptime(text or "", form).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


class Inventory(Protocol):
    """Leftovers by tag, for ``skyward ls`` / ``skyward down`` and the tests' leak checks."""

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        """What carries Skyward's tags (of ``pool`` only, when given), live ones included."""
        ...

    def delete(self, leftovers: Sequence[Leftover], reporter: Reporter) -> None:
        """Delete them, instances first; raises ``ProvisionError`` naming what remains."""
        ...


@runtime_checkable
class Provider(Protocol):
    """Creates and destroys nodes. See the module docstring for the contract."""

    @property
    def kind(self) -> str:
        """A short name for ``InstanceInfo.provider`` and messages: ``"local"``, ``"aws"``."""
        ...

    def check(self, request: ProvisionRequest) -> None:
        """Refuse what this provider cannot do, before anything is created."""
        ...

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation: ...

    def inventory(self) -> Inventory | None:
        """Where to find this provider's leftovers; ``None`` when it creates nothing."""
        ...
