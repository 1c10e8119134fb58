"""The pool's machines: asked of the provider once, terminated on every path.

A close can come from another thread at any moment of a start, including while the provider
is still creating machines. The rule that keeps anything from leaking: the close cancels the
provision's deadline and waits for it to end; whoever holds the allocation last (the
starting thread, if the close came first) terminates it.

It also knows each node's current machine (``node(rank)``): a lost machine's replacement
takes its place here, and the start-up barrier and relays ask here where a node is. And it
knows which node each worker runs on (``Layout``): workers are what the scheduler and the
start-up barrier deal in, numbered node-major, one per node unless ``workers_per_node``
asks for more. When a node's machine is lost all its workers are lost; each is started again
through ``spawn``, and the machine is replaced once, by whichever of them comes first. An
autoscaling pool's new machines are added here (``grow``) and its last ones let go
(``shrink``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from skyward._errors import PoolClosed, ProvisionError, SkywardError
from skyward._info import worker_label
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.client.shield import shielded
from skyward.providers.base import Allocation, Node, Provider, ProvisionRequest

if TYPE_CHECKING:
    from skyward.link.channel import Transport

# How long a close waits, past the provision deadline, for a provider that is still
# provisioning to notice it was cancelled and destroy what it made.
_PROVISION_GRACE = 120.0
_log = logging.getLogger("skyward")


@dataclass(frozen=True)
class Layout:
    """Which node each worker runs on, and which of its GPUs it owns. Workers are numbered
    node-major: node ``n``'s are ``n * per_node .. n * per_node + per_node - 1``."""

    nodes: int
    per_node: int = 1

    @property
    def workers(self) -> int:
        return self.nodes * self.per_node

    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def local_of(self, rank: int) -> int:
        """The worker's rank on its node (torch's ``LOCAL_RANK``)."""
        return rank % self.per_node

    def label(self, rank: int) -> str:
        """How messages, output and reports name a worker: ``node 2``, or ``node 2 worker
        1`` (``worker_label``, the worker's own prints say the same)."""
        return worker_label(self.node_of(rank), self.local_of(rank), self.per_node)

    def label_all(self, ranks: Sequence[int]) -> str:
        """Several workers, as ``label`` names one: ``node(s) 1, 2`` or ``node 0 worker 1,
        node 1 worker 0``; ``none`` for none."""
        if not ranks:
            return "none"
        if self.per_node == 1:
            return "node(s) " + ", ".join(str(rank) for rank in ranks)
        return ", ".join(self.label(rank) for rank in ranks)

    def devices(self, rank: int, gpus: int) -> tuple[int, ...]:
        """The node's GPUs (of ``gpus``) that worker ``rank`` owns: an equal block each when
        the workers divide the GPUs; one GPU shared by ``per_node / gpus`` workers when the
        GPUs divide the workers (``sky.plugins.mps`` lets them share it well)."""
        local, per = self.local_of(rank), self.per_node
        if gpus == 0:
            return ()
        if gpus % per == 0:
            size = gpus // per
            return tuple(range(local * size, (local + 1) * size))
        return (local // (per // gpus),)  # lay_out() made sure per % gpus == 0


def lay_out(workers_per_node: int | Literal["gpus"], nodes: Sequence[Node]) -> Layout:
    """The layout of a pool on these machines; ``ValueError`` when its GPUs cannot be dealt
    out evenly (checked once the machines exist: only then is each node's GPU count known)."""
    counts = [node.accelerators for node in nodes]
    if workers_per_node == "gpus":
        if len(set(counts)) != 1 or counts[0] < 1:
            found = ", ".join(f"node {rank}: {count}" for rank, count in enumerate(counts))
            raise ValueError(
                f"workers_per_node='gpus' needs the same number of GPUs, at least one, on "
                f"every node; found {found}. Give workers_per_node a number instead."
            )
        return Layout(len(nodes), counts[0])
    for rank, gpus in enumerate(counts):
        if gpus and gpus % workers_per_node and workers_per_node % gpus:
            raise ValueError(
                f"workers_per_node={workers_per_node} cannot share node {rank}'s {gpus} GPUs "
                f"evenly: give a number that divides {gpus}, or a multiple of it (workers "
                f"then share a GPU), or 'gpus'"
            )
    return Layout(len(nodes), workers_per_node)


class Machines:
    """One pool's allocation and its nodes. ``cancel`` (the pool closes) stops a provision
    or a replacement under way. Thread-safe."""

    def __init__(self, provider: Provider, *, pool: str, reporter: Reporter) -> None:
        self._provider = provider
        self._pool = pool
        self._reporter = reporter
        self._lock = threading.Lock()  # guards: everything below but _provisioned
        self._request: ProvisionRequest | None = None
        self._allocation: Allocation | None = None
        self._nodes: list[Node] = []  # by rank, the machine each node is now
        self._generations: list[int] = []  # by rank, how many times its machine was replaced
        # by rank: held while a node's machine is replaced, so its workers wait for one
        self._node_locks: list[threading.Lock] = []
        self._layout: Layout | None = None
        self._cancelled = False  # the pool is closing: what a provider returns is terminated
        self._replacing: set[Deadline] = set()  # replacements and growths under way
        self._provisioned = threading.Event()  # provision() has returned or raised
        self._since = 0.0  # when the allocation was handed over

    def provision(
        self,
        request: ProvisionRequest,
        nodes: int,
        workers_per_node: int | Literal["gpus"] = 1,
        *,
        provider: Provider | None = None,
    ) -> Allocation:
        """Ask the provider (``provider``, when the pool falls back to another one) for
        ``nodes`` machines, and lay ``workers_per_node`` workers out on them. Anything but a
        ``SkywardError`` that escapes the provider becomes a ``ProvisionError`` (its cause
        kept); a pool closed meanwhile gets ``PoolClosed``, and what the provider made anyway
        is terminated; a layout the machines' GPUs do not allow is a ``ValueError`` (the
        pool's close terminates them). After a failure it may be called again (the next
        ``sky.Spec``)."""
        with self._lock:
            if self._cancelled:
                raise PoolClosed(f"pool {self._pool!r} was closed while it started")
            if provider is not None:
                self._provider = provider
            self._request = request
            self._provisioned.clear()  # a close from now on waits for this attempt
        kind = self._provider.kind
        try:
            try:
                allocation = self._provider.provision(request, self._reporter)
            except SkywardError:
                raise
            except TimeoutError as exc:
                # The provider's notes (which machines SSH never answered, and what to
                # check) are the heart of the message: said in it, not only on its cause.
                notes = "".join(f" {note}" for note in getattr(exc, "__notes__", []))
                raise ProvisionError(
                    f"{kind}: the machines were not ready within {request.deadline.what}: "
                    f"{exc}.{notes} Raise provision_timeout if they need longer."
                ) from exc
            except Exception as exc:
                raise ProvisionError(
                    f"provider {kind} failed: {type(exc).__name__}: {exc}"
                ) from exc
            with self._lock:
                closed = self._cancelled
                if not closed:
                    self._allocation = allocation
                    self._nodes = list(allocation.nodes)
                    self._generations = [0] * len(self._nodes)
                    self._node_locks = [threading.Lock() for _ in self._nodes]
                    self._since = time.monotonic()
            if closed:  # closed by another thread while the provider worked
                allocation.terminate()
                raise PoolClosed(f"pool {self._pool!r} was closed while it started")
        finally:
            self._provisioned.set()
        if len(allocation.nodes) != nodes:
            with self._lock:
                self._allocation, self._nodes = None, []
            allocation.terminate()  # nothing of a failed attempt stays
            raise ProvisionError(
                f"provider {kind} returned {len(allocation.nodes)} nodes, not {nodes}"
            )
        layout = lay_out(workers_per_node, allocation.nodes)
        with self._lock:
            self._layout = layout
        return allocation

    @property
    def layout(self) -> Layout:
        """Which node each worker runs on; known once ``provision`` has returned."""
        with self._lock:
            assert self._layout is not None, "the pool's machines are not provisioned yet"
            return self._layout

    def node(self, rank: int) -> Node:
        """Node ``rank``'s machine now."""
        with self._lock:
            return self._nodes[rank]

    def address(self, rank: int) -> str:
        """Where node ``rank`` is now (its machine's address)."""
        return self.node(rank).address

    def worker_address(self, rank: int) -> str:
        """Where worker ``rank`` is now: its node's address."""
        return self.address(self.layout.node_of(rank))

    def spawn(self, rank: int, env: Mapping[str, str], *, replace: bool) -> Transport:
        """Worker ``rank`` on its node; with ``replace``, on a new machine in the node's place
        if its machine is gone and the provider can make another. The node's other workers,
        lost with it, find the new machine here: one replacement per lost machine."""
        node = self.layout.node_of(rank)
        with self._lock:
            machine, generation = self._nodes[node], self._generations[node]
        try:
            return machine.spawn_worker(rank, env)
        except ProvisionError as error:
            with self._lock:
                allocation = self._allocation
            if not replace or allocation is None or not allocation.can_replace:
                raise
            lost = error
        with self._node_locks[node]:  # a second worker of the node waits for the first's
            with self._lock:
                replaced = self._generations[node] != generation
                machine = self._nodes[node]
            if not replaced:
                self._reporter.status(f"node {node}: its machine is lost ({lost}); replacing it")
                machine = self.replace(node)
        return machine.spawn_worker(rank, env)

    def replace(self, rank: int) -> Node:
        """A new machine for node ``rank``, whose machine was lost; bounded by a fresh
        ``provision_timeout``, and cancelled by a close like the first provision."""
        with self._lock:
            allocation, request = self._allocation, self._request
        assert allocation is not None and request is not None
        deadline = Deadline(request.deadline.seconds, request.deadline.what)
        with self._lock:
            self._replacing.add(deadline)
        try:
            node = allocation.replace(rank, self._reporter, deadline)
        finally:
            with self._lock:
                self._replacing.discard(deadline)
        with self._lock:
            self._nodes[rank] = node
            self._generations[rank] += 1
        return node

    def grow(self, ranks: list[int]) -> list[Node]:
        """New machines for nodes ``ranks``, the next ones (autoscaling), all or nothing;
        bounded by a fresh ``provision_timeout`` and cancelled by a close."""
        with self._lock:
            allocation, request = self._allocation, self._request
            cancelled = self._cancelled
        if allocation is None or request is None or cancelled:
            raise PoolClosed(f"pool {self._pool!r} is closing; no machines are added")
        deadline = Deadline(request.deadline.seconds, request.deadline.what)
        with self._lock:
            self._replacing.add(deadline)
        try:
            try:
                nodes = allocation.grow(ranks, self._reporter, deadline)
            except BaseException:
                for rank in reversed(ranks):  # what it made before it failed goes too
                    allocation.shrink(rank)
                raise
        except SkywardError:
            raise
        except Exception as exc:
            raise ProvisionError(
                f"provider {self._provider.kind} could not add node(s) "
                f"{', '.join(map(str, ranks))}: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            with self._lock:
                self._replacing.discard(deadline)
        with self._lock:
            self._nodes.extend(nodes)
            self._generations += [0] * len(nodes)
            self._node_locks += [threading.Lock() for _ in nodes]
            self._layout = Layout(len(self._nodes))  # one worker per node (autoscaling)
        return nodes

    def shrink(self, rank: int) -> None:
        """Let node ``rank``, the last one, go: its machine is released (autoscaling)."""
        with self._lock:
            allocation = self._allocation
            if rank == len(self._nodes) - 1:
                self._nodes.pop()
                self._generations.pop()
                self._node_locks.pop()
                self._layout = Layout(len(self._nodes))
        if allocation is not None:
            allocation.shrink(rank)

    def timings(self) -> dict[str, float]:
        """The provider's steps of the provision, in seconds (``Allocation.timings``)."""
        with self._lock:
            allocation = self._allocation
        return {} if allocation is None else dict(allocation.timings)

    @property
    def count(self) -> int:
        """How many nodes have a machine now."""
        with self._lock:
            return len(self._nodes)

    def loss_reason(self, rank: int) -> str | None:
        """Why node ``rank``'s machine is gone, if the provider can tell."""
        with self._lock:
            allocation = self._allocation
        if allocation is None:
            return None
        try:
            return allocation.loss_reason(rank)
        except Exception:  # a detail of a message, never a second failure
            return None

    def cancel(self, reason: str) -> None:
        """The pool closes: stop a provision or replacement under way (their deadlines'
        flags), and have what a provider still returns terminated. Idempotent."""
        with self._lock:
            self._cancelled = True
            request = self._request
            replacing = list(self._replacing)
        if request is not None:
            request.deadline.cancel(reason)
        for deadline in replacing:
            deadline.cancel(reason)

    def terminate(self, *, keep: float = 0.0, leave_after: int = 2) -> None:
        """Destroy what the provider made, once it has stopped making it. Idempotent.
        ``keep`` (``keep_warm``, for a pool that ran): seconds to keep the machines for the
        next pool instead, when the allocation can (``Allocation.keep``); destroyed when it
        cannot. The ``leave_after``-th Ctrl-C while the provider deletes leaves (see
        ``_shielded``)."""
        with self._lock:
            request = self._request
        if request is not None and not self._provisioned.is_set():
            # The starting thread terminates whatever the cancelled provider still returns;
            # wait for that, so that a close returns with nothing left behind.
            self._reporter.status("waiting for the provider to stop and clean up")
            bound = request.deadline.remaining() + _PROVISION_GRACE
            if not self._provisioned.wait(bound):
                _log.warning(
                    "pool %s: the provider is still provisioning after %.0f s; what it makes "
                    "is terminated when it returns. `skyward ls` lists leftovers.",
                    self._pool,
                    bound,
                )
        with self._lock:
            allocation, since = self._allocation, self._since
        if allocation is None:
            return
        if keep and self._keep(allocation, keep, leave_after):
            self._report_cost(allocation, time.monotonic() - since)
            return
        self._shielded(allocation.terminate, allocation, leave_after)
        self._report_cost(allocation, time.monotonic() - since)

    def _keep(self, allocation: Allocation, seconds: float, leave_after: int) -> bool:
        """``allocation.keep(seconds)``, shielded like a terminate; whether it kept them (a
        failure is said, and the caller terminates)."""
        answer: list[bool] = []
        try:
            self._shielded(lambda: answer.append(allocation.keep(seconds)), allocation, leave_after)
        except Exception as exc:  # a machine, SSH or this disk: terminated instead
            self._reporter.status(f"pool {self._pool}: could not keep its machines ({exc})")
            _log.warning("pool %s: could not keep its machines warm: %s", self._pool, exc)
            return False
        if not answer or not answer[0]:
            self._reporter.status(
                f"pool {self._pool}: its machines cannot be kept (one was lost, or its provider "
                f"cannot keep them); destroying them"
            )
            return False
        hourly = allocation.hourly_cost
        price = f", billing about ${hourly:.2f}/h meanwhile" if hourly else ""
        down = allocation.down_command or f"skyward down --pool {self._pool}"
        line = (
            f"pool {self._pool}: {allocation.describe or 'its machines'} kept warm for "
            f"{seconds:g} s{price}: the next pool like it adopts them; `{down}` ends them now"
        )
        self._reporter.status(line)
        _log.info("%s", line)
        return True

    def _report_cost(self, allocation: Allocation, seconds: float) -> None:
        """The pool's approximate cost, from the provider's hourly estimate (clouds bill
        from boot, often per second, so this is close, not the bill)."""
        hourly = allocation.hourly_cost
        if not hourly:
            return
        what = f" ({allocation.describe})" if allocation.describe else ""
        line = (
            f"pool {self._pool}: about ${hourly * seconds / 3600:.2f} for "
            f"{seconds / 60:.1f} min at about ${hourly:.2f}/h{what}"
        )
        self._reporter.status(line)
        _log.info("%s", line)

    def _shielded(self, act: Callable[[], None], allocation: Allocation, leave_after: int) -> None:
        """``act`` (``allocation.terminate``, or a ``keep``) through
        ``client.shield.shielded``, so that a Ctrl-C (often pressed again while a cloud takes
        a minute to delete things) does not stop it half-way: the ``leave_after``-th leaves
        (the deletion goes on in the background) and says what is still being deleted and
        the ``skyward down`` command that finishes it; one before it is noted and the wait
        goes on."""
        down = allocation.down_command or f"skyward down --pool {self._pool}"

        def noted(count: int) -> None:
            self._reporter.status(
                f"pool {self._pool}: still destroying its machines; Ctrl-C again to leave "
                f"now (then `{down}`)"
            )

        try:
            shielded(act, name="skyward-terminate", on_interrupt=noted, leave_after=leave_after)
        except KeyboardInterrupt:
            try:
                what = allocation.deleting()
            except Exception:  # a detail of a message, never a second failure
                what = "its machines"
            line = (
                f"pool {self._pool}: left while these were still being deleted: {what}; "
                f"`skyward ls` lists what is left, `{down}` removes it"
            )
            self._reporter.status(line)
            _log.warning("%s", line)
            raise
