"""The pool's machines: asked of the provider once, terminated on every path.

A close can come from another thread at any moment of a start, including while the provider
is still creating machines. The rule that keeps anything from leaking: the close cancels the
provision's deadline and waits for it to end; whoever holds the allocation last (the
starting thread, if the close came first) terminates it.

It also knows each node's current machine (``node(rank)``): a lost machine's replacement
takes its place here, and the start-up barrier and relays ask here where a node is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from skyward._errors import PoolClosed, ProvisionError, SkywardError
from skyward._futures import Deadline
from skyward._phases import Reporter
from skyward._shield import shielded
from skyward.providers.base import Allocation, Node, Provider, ProvisionRequest

if TYPE_CHECKING:
    from skyward.link.channel import Transport

# How long a close waits, past the provision deadline, for a provider that is still
# provisioning to notice it was cancelled and destroy what it made.
_PROVISION_GRACE = 120.0
_log = logging.getLogger("skyward")


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
        self._cancelled = False  # the pool is closing: what a provider returns is terminated
        self._replacing: set[Deadline] = set()  # replacements under way
        self._provisioned = threading.Event()  # provision() has returned or raised
        self._since = 0.0  # when the allocation was handed over

    def provision(
        self, request: ProvisionRequest, nodes: int, *, provider: Provider | None = None
    ) -> Allocation:
        """Ask the provider (``provider``, when the pool falls back to another one) for
        ``nodes`` machines. Anything but a ``SkywardError`` that escapes the provider becomes
        a ``ProvisionError`` (its cause kept); a pool closed meanwhile gets ``PoolClosed``,
        and what the provider made anyway is terminated. After a failure it may be called
        again (the next ``sky.Spec``)."""
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
                raise ProvisionError(
                    f"{kind}: the machines were not ready within {request.deadline.what}: "
                    f"{exc}. Raise provision_timeout if they need longer."
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
        return allocation

    def node(self, rank: int) -> Node:
        """Node ``rank``'s machine now."""
        with self._lock:
            return self._nodes[rank]

    def address(self, rank: int) -> str:
        """Where node ``rank`` is now (its machine's address)."""
        return self.node(rank).address

    def spawn(self, rank: int, env: Mapping[str, str], *, replace: bool) -> Transport:
        """A worker on node ``rank``; with ``replace``, on a new machine in its place if
        that node's machine is gone and the provider can make another."""
        try:
            return self.node(rank).spawn_worker(rank, env)
        except ProvisionError as error:
            with self._lock:
                allocation = self._allocation
            if not replace or allocation is None or not allocation.can_replace:
                raise
            self._reporter.status(f"node {rank}: its machine is lost ({error}); replacing it")
        return self.replace(rank).spawn_worker(rank, env)

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
        return node

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

    def terminate(self) -> None:
        """Destroy what the provider made, once it has stopped making it. Idempotent."""
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
        if allocation is not None:
            self._shielded(allocation)
            self._report_cost(allocation, time.monotonic() - since)

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

    def _shielded(self, allocation: Allocation) -> None:
        """``allocation.terminate()`` through ``_shield.shielded``, so that one Ctrl-C (often
        pressed again while a cloud takes a minute to delete things) does not stop it
        half-way: the first is noted and the wait goes on; a second leaves, and says what
        may be left."""

        def noted(count: int) -> None:
            self._reporter.status(
                f"pool {self._pool}: still destroying its machines; Ctrl-C again to leave "
                f"now (then `skyward down --pool {self._pool}`)"
            )

        try:
            shielded(
                allocation.terminate, name="skyward-terminate", on_interrupt=noted, leave_after=2
            )
        except KeyboardInterrupt:
            _log.warning(
                "pool %s: left while its machines were being destroyed; "
                "`skyward ls` lists what is left, `skyward down --pool %s` removes it",
                self._pool,
                self._pool,
            )
            raise
