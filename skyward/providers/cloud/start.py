"""The one start of every cloud pool, and its allocation: the only writer of its record.

::

    start(options, machines, request, reporter)      (CloudOptions.provision calls it)
      CloudPool(...)                      the record: nothing made yet
      open_or_destroy ── open():
        machines.offers(want)             every place to try, priced
        affordable, announce              within max_hourly_cost; the choice reported
        keys                              the pool's login key and the host key its machines
                                          present, and the boot payload (Boot) with the watchdog
        machines.prepare(...)             network, rules, image: recorded as made
        launch_first: machines.launch     the first place with room takes the pool; names
                                          recorded before each create is asked for
        wait_running: machines.describe   every machine running, or why one ended
        reach                             SSH where describe says, the bootstrap; a machine
                                          that ends meanwhile fails the start at once
      any failure, Ctrl-C included ──>    terminate(): machines.delete(record), the key

    the pool runs:
      loss_reason(rank)                   machines.describe: why a node's machine ended
      replace(rank)                       the old machine discarded, a new one launched in
                                          the same place, reached alike; where the cloud's
                                          machines come in units (``unit``: a TPU slice's
                                          hosts), the rank's whole unit at once
    close:
      terminate() -> release()            machines.delete(record), waited for; the key
      or keep(seconds) (keep_warm)        each watchdog told to keep its machine that long;
                                          the workers stopped; the set written down
                                          (warm.py): nothing deleted

    adopt(...), before any start          a kept set of the same cloud, spec and node count,
      (CloudOptions.provision)            claimed: describe, SSH with its pinned host key,
                                          the bootstrap (its environment is there), the
                                          watchdog's keep lifted; a set that fails any of it
                                          is ended whole, and the next one (or a start) tried

The record (``Record``) is what exists: pool-wide resources by kind, every machine ever
asked for, each node's machine, and the creates still on the wire. It has one lock; only
its methods write it, and a cloud's calls write it only through them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from skyward._errors import HostKeyError, ProvisionCancelled, ProvisionError, SkywardError
from skyward.client.futures import Deadline, settle
from skyward.client.phases import Choice, Phase, Reporter
from skyward.client.shield import finish
from skyward.providers.base import Allocation, Node, ProvisionRequest, owner
from skyward.providers.cloud import capacity, warm
from skyward.providers.cloud.api import poll
from skyward.providers.cloud.boot import (
    Boot,
    HostKey,
    first_client_bound,
    keep_command,
    unkeep_command,
)
from skyward.providers.cloud.capacity import CapacityError, Offer
from skyward.providers.cloud.contract import Described, Machines, Options, Resumable, Want
from skyward.providers.cloud.keys import key_label
from skyward.providers.cloud.record import Record
from skyward.providers.ssh.connection import ABOUT_FILE, PoolKey, Target
from skyward.providers.ssh.hosts import Access, HostNode, HostTarget, bootstrap_plan, open_hosts

A = TypeVar("A", bound=Allocation)
_log = logging.getLogger("skyward")
# A kept set with less time left than this is not adopted: its watchdogs could end it under
# the new pool. It is ended instead.
ADOPT_MARGIN = 30.0
# How long SSH to a kept machine is retried: it is up already, and one that does not answer
# within this is unhealthy (the set is ended and the pool starts new machines).
ADOPT_CONNECT = 10.0
# On everything one provision creates, besides the pool's tags: a value unique to that
# provision (the pool's name need not be unique), so that its clean-up can sweep for what
# a create call cut off in flight made, and never touch another run's resources.
TAG_ALLOCATION = "skyward-allocation"
POLL = 1.0  # seconds between reads while waiting for machines to run


def unique_name(pool: str, *, unsafe: str, length: int) -> str:
    """``skyward-<pool>-<6 hex>``, the base of what one provision names (AWS's key pair and
    group, GCP's rules and instances, Azure's resource group): unique to that provision,
    since a pool's name need not be. What the cloud refuses in names (``unsafe``, a regex)
    becomes ``-``; ``length`` characters of the pool at most."""
    slug = re.sub(unsafe, "-", pool)[:length].strip("-")
    return f"skyward-{slug or 'pool'}-{secrets.token_hex(3)}"


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


def start(
    options: Options, machines: Machines, request: ProvisionRequest, reporter: Reporter
) -> CloudPool:
    """A cloud pool's machines, running and reached, or nothing: whatever the start made is
    destroyed when it fails (``open_or_destroy``)."""
    pool = CloudPool(options, machines, request)
    return open_or_destroy(pool, lambda made: made.open(reporter))


def adopt(
    options: Options,
    machines_of: Callable[[str], Machines],
    request: ProvisionRequest,
    reporter: Reporter,
    *,
    spec: str,
) -> CloudPool | None:
    """A kept set of machines for this pool (``warm.py``), reached and bootstrapped, or
    ``None``: there is none of this cloud, ``spec`` and node count, or each there was could
    not be used (it is ended then, whole, and said so). ``machines_of(pool)``: the cloud's
    calls for the pool that made a set, which release it."""
    tried: list[str] = []
    while True:
        started = time.monotonic()
        held = warm.claim(options.cloud, spec, request.nodes, exclude=tried)
        if held is None:
            return None
        with held:  # the lock goes on every path; the record only when the set is used up
            kept = held.warm
            tried.append(kept.id)
            pool = CloudPool.of_kept(options, machines_of(kept.pool), request, kept)
            pool.timings["warm.claim"] = time.monotonic() - started
            left = kept.left()
            if left < ADOPT_MARGIN:
                why = f"{max(0, round(left))} s of their {kept.until - kept.kept_at:g} s left"
                _end_kept(pool, kept, why, reporter)
                held.forget()
                continue
            try:
                pool.reopen(kept, reporter)
            except ProvisionCancelled:
                raise  # the pool was closed meanwhile: the set stays, for another pool
            except (SkywardError, TimeoutError, OSError) as exc:
                request.deadline.check("adopting warm machines")
                _end_kept(pool, kept, str(exc), reporter)
                held.forget()
                continue
            except BaseException:  # Ctrl-C: the set is ended, as a start's machines are
                finish(pool.terminate)
                held.forget()
                raise
            held.forget()  # the set is this pool's now
            return pool


def _end_kept(pool: CloudPool, kept: warm.WarmSet, why: str, reporter: Reporter) -> None:
    """A kept set that is not adopted (too little time left, a machine gone or unhealthy)
    is ended whole, as its own pool's close would; what cannot be is named with its
    ``skyward down``."""
    reporter.status(
        f"warm machines of pool {kept.pool} ({kept.describe}) not used: {why}; ending them"
    )
    try:
        finish(pool.terminate)
    except ProvisionError as exc:
        reporter.status(f"could not end them all: {exc}")
        _log.warning("warm machines of pool %s: %s", kept.pool, exc)


def open_or_destroy(allocation: A, build: Callable[[A], None]) -> A:
    """Run ``build``, which creates resources, records each on ``allocation`` as soon as it
    exists, and reaches the machines; on any failure, Ctrl-C included, terminate what it
    recorded and re-raise.

    The clean-up runs on its own thread and is waited for through any number of Ctrl-Cs
    (``client.shield.finish``): a second Ctrl-C must not turn a failed start into a running GPU
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


class CloudPool(Allocation):
    """A cloud pool's machines and resources: the record, the cloud's ``machines``, and
    how the machines are reached (``access``, the ``host_key`` they present)."""

    def __init__(self, options: Options, machines: Machines, request: ProvisionRequest):
        super().__init__([])
        self.options = options
        self.cloud = machines
        self.request = request
        self.record = Record(request.pool)
        # Launches and the reach wait on this; a release wakes them.
        self.launching = WatchedDeadline(request.deadline)
        # Set once by open(), before any machine exists; read by replace().
        self._access: Access | None = None
        self._host_key: str | None = None
        self._offer: Offer | None = None
        # A cloud whose machines come in units replaces a whole unit for one lost node: the
        # unit's other ranks get their new node here when the pool asks for them next.
        self._unit = int(getattr(machines, "unit", 1) or 1)
        self._replacing = threading.Lock()  # one unit replacement at a time
        self._fresh: set[int] = set()  # guarded by _replacing: replaced, not yet asked for
        self._label = ""  # set by open(), or from the kept set adopted

    @classmethod
    def of_kept(
        cls, options: Options, machines: Machines, request: ProvisionRequest, kept: warm.WarmSet
    ) -> CloudPool:
        """The allocation of a kept set (``warm.WarmSet``), for ``request``: its record and
        key restored (so that its release deletes everything its own pool made), reached as
        that pool reached it, under that pool's name (the machines' tags say it)."""
        if not isinstance(machines, Resumable):  # never kept (keep): never found here
            raise ProvisionError(f"{options.cloud} machines cannot be adopted")
        machines.resume(kept.label)
        request = dataclasses.replace(request, pool=kept.pool)
        pool = cls(options, machines, request)
        pool._label = kept.label
        key = PoolKey.existing(Path(kept.key_dir))
        pool.record = Record.restored(kept.record, key)
        pool._host_key = kept.host_key
        pool._access = Access(
            key_file=key.path,
            python=options.python,
            workdir=options.workdir,
            boot_timeout=ADOPT_CONNECT,
            gpus=kept.gpus,
            machine_type=kept.machine_type,
            instance_profile=kept.instance_profile,
        )
        pool.hourly_cost = kept.hourly_cost
        pool.describe = kept.describe
        return pool

    def reopen(self, kept: warm.WarmSet, reporter: Reporter) -> None:
        """Make a kept set this pool's: every machine still running (``describe``), SSH
        with the pinned host key, the bootstrap (quick when the image is the one the set
        was kept with: its environment is there; else this image's is built beside it,
        from the machine's package cache), and each watchdog's keep lifted. Raises (and
        closes what it opened) when any of it fails."""
        cloud, deadline = self.cloud, self.launching
        access = self._access
        assert access is not None and access.key_file is not None
        if not access.key_file.exists():
            raise ProvisionError(f"the login key {access.key_file} of the warm machines is gone")
        with_key = dict(_about(access.key_file.parent), pid=str(os.getpid()))
        (access.key_file.parent / ABOUT_FILE).write_text(json.dumps(with_key))  # ours now
        image = bootstrap_plan(self.request.image, access).digest
        reporter.status(
            f"adopting {kept.nodes} warm machine(s) of pool {kept.pool} ({kept.describe}, "
            f"{max(0, round(kept.left()))} s left)"
            + ("" if image == kept.image else "; this image's environment is built on them")
        )
        started = time.monotonic()
        for machine in kept.machines:
            reporter.phase(machine.rank, "provisioning", f"warm {machine.id} ({machine.place})")
        found: list[Described] = []
        for machine in kept.machines:  # one place per pool, but describe asks per place
            found += cloud.describe(machine.place, [machine.id], quick=True)
        for machine, now in zip(kept.machines, found, strict=True):
            if now.state != "running" or now.reach is None:
                why = f": {now.why}" if now.why else ""
                raise ProvisionError(f"{cloud.noun} {machine.id} is {now.status}{why}")
        self.timings["warm.describe"] = time.monotonic() - started
        started = time.monotonic()
        deadline.check("reaching the warm machines")
        nodes = self._reach([self._target(m) for m in found], reporter)
        self.timings["warm.reach"] = time.monotonic() - started
        started = time.monotonic()
        try:
            for future in settle(lambda node: _run(node, unkeep_command()), nodes):
                future.result()
        except BaseException:
            for node in nodes:
                node.close()
            raise
        self.timings["warm.unkeep"] = time.monotonic() - started
        self.nodes = list(nodes)

    # ── the start ──────────────────────────────────────────────────────────────────────

    def open(self, reporter: Reporter) -> None:
        request, cloud, deadline = self.request, self.cloud, self.launching
        strategy = self.options.strategy(request)
        want = Want(request, strategy, deadline, reporter)
        found = cloud.offers(want)
        offers = capacity.affordable(found.offers, request.nodes, request.max_hourly_cost)
        capacity.announce(offers, request.nodes, reporter, found.region or offers[0].zone)
        boot = self._keys(offers[0])
        deadline.check("preparing the network")
        cloud.prepare(want, offers, boot, self.record)
        offer, ids = capacity.launch_first(
            offers,
            lambda offer: self._launch(offer, range(request.nodes), deadline),
            nodes=request.nodes,
            reporter=reporter,
            deadline=deadline,
        )
        self._offer = offer
        self.hourly_cost = offer.pool_hourly(request.nodes)
        self.describe = f"{request.nodes} x {offer.machine.type} {offer.market} in {offer.zone}"
        for rank, id in enumerate(ids):  # each node's row names its machine
            reporter.phase(rank, "provisioning", f"{id} ({offer.where})")
        targets = self._running(offer.zone, ids, deadline)
        self.nodes = list(self._reach(targets, reporter))

    def _keys(self, first: Offer) -> Boot:
        """The pool's login key (labelled for ``skyward ls`` / ``down``, deleted with the
        pool), the host key its machines present, how they are reached, and the boot
        payload that carries both."""
        options, cloud = self.options, self.cloud
        key = PoolKey()
        self.record.key(key)
        region, name, endpoint = cloud.key_label(first)
        self._label = name  # the cloud's identity of this pool's things (Resumable.resume)
        key.label(key_label(options.cloud, region, self.request.pool, name, endpoint))
        host_key = HostKey.generate()
        gpu = self.request.accelerator is not None or first.machine.accelerator is not None
        # A cloud whose accelerators are no NVIDIA GPUs (TPU chips) says how many it gave.
        chips: int | None = getattr(cloud, "chips", None)
        self._host_key = host_key.public
        self._access = Access(
            key_file=key.path,
            python=options.python,
            workdir=options.workdir,
            boot_timeout=options.boot_timeout,
            gpus=(first.machine.count or None) if gpu and chips is None else None,
            chips=chips,
            machine_type=first.machine.type,
            instance_profile=cloud.instance_profile,
        )
        return Boot(
            host_key=host_key,
            authorized_key=key.public,
            user=options.username,
            idle_timeout=options.idle_timeout,
            # A machine waits for its first client as long as the client waits for it
            # (and a margin), not idle_timeout: a client killed mid-start costs minutes.
            first_client_timeout=first_client_bound(options.boot_timeout),
        )

    def _launch(self, offer: Offer, ranks: Sequence[int], deadline: Deadline) -> list[str]:
        """One machine per rank where ``offer`` is: their ids, each node's recorded."""
        names = self.record.ask(offer.zone, ranks, self.cloud.prefix)
        try:
            ids = self.cloud.launch(offer, names, self.record, deadline)
            # Recorded before the create counts as answered: a release waiting for creates
            # on the wire must find the ids a cloud gave (EC2's), not only the names asked.
            self.record.made(offer.zone, ids)
        finally:
            self.record.answered()
        for rank, id in zip(ranks, ids, strict=True):
            self.record.place(rank, offer.zone, id)
        return ids

    def _running(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[HostTarget]:
        """How to reach each machine, once every one runs; one that ends on the way fails
        the wait, with the cloud's reason."""
        noun = self.cloud.noun
        doing = f"waiting for {len(ids)} {noun}(s) to run"

        def probe() -> list[HostTarget] | None:
            found = self.cloud.describe(place, ids)
            for id, machine in zip(ids, found, strict=True):
                if machine.state == "ended":
                    raise ProvisionError(f"{doing}: {_ended(noun, id, machine)}")
            if all(m.state == "running" and m.reach is not None for m in found):
                return [self._target(m) for m in found]
            return None

        deadline.check(doing)
        return poll(probe, doing, deadline, pause=POLL, most=POLL)

    def _target(self, machine: Described) -> HostTarget:
        assert machine.reach is not None
        reach = machine.reach
        user = reach.user or self.options.username
        return HostTarget(
            Target(host=reach.host, port=reach.port, user=user),
            peer_address=reach.peer,
            host_key=self._host_key,
        )

    def _reach(
        self,
        targets: Sequence[HostTarget],
        reporter: Reporter,
        ranks: Sequence[int] | None = None,
        deadline: Deadline | None = None,
    ) -> list[HostNode]:
        """``open_hosts`` for the machines: SSH and the bootstrap. A machine that ends
        meanwhile fails it at once (a watcher asks ``loss_reason``); a start that failed
        with machines SSH never answered says what to check."""
        assert self._access is not None
        ranks = list(range(len(targets))) if ranks is None else list(ranks)
        reached = _Reached(reporter)
        watched = WatchedDeadline(deadline or self.launching)
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(2.0):
                try:
                    why = next(filter(None, map(self.loss_reason, ranks)), None)
                except Exception:
                    continue  # a hint only: the connections' own bounds still hold
                if why is not None:
                    watched.fail(why)
                    return

        threading.Thread(target=watch, name="skyward-watch-machines", daemon=True).start()
        request = dataclasses.replace(self.request, nodes=len(targets), deadline=watched)
        try:
            return open_hosts(targets, self._access, request, reached, ranks=ranks)
        except (ProvisionError, TimeoutError) as exc:
            pairs = zip(ranks, targets, strict=True)
            silent = [t.target.host for r, t in pairs if r not in reached.reached]
            if silent and watched.failure is None and not isinstance(exc, HostKeyError):
                exc.add_note(
                    f"Machines {', '.join(silent)} are running, but SSH did not answer from "
                    f"here: {self.options.hint()}"
                )
            raise
        finally:
            stop.set()

    # ── the pool's life ────────────────────────────────────────────────────────────────

    def loss_reason(self, rank: int) -> str | None:
        """Why node ``rank``'s machine is gone or stopped, when the cloud says so; ``None``
        while it runs or if the cloud cannot be asked."""
        found = self.record.node(rank)
        if found is None:
            return None
        place, id = found
        try:
            (machine,) = self.cloud.describe(place, [id], quick=True)
        except Exception:
            return None  # a message's detail; never a reason to fail the report of a loss
        if machine.state != "ended":
            return None
        return _ended(self.cloud.noun, id, machine)

    @property
    def can_replace(self) -> bool:
        return self._offer is not None and self._access is not None

    def replace(self, rank: int, reporter: Reporter, deadline: Deadline) -> Node:
        """A new machine for node ``rank``, made alike (same place, network, keys); where the
        cloud's machines come in units, every node of the rank's unit."""
        if self._unit > 1:
            return self._replace_unit(rank, reporter, deadline)
        offer, old = self._offer, self.record.node(rank)
        if self.record.released or offer is None or old is None:
            raise self._closing()
        if rank < len(self.nodes):
            self.nodes[rank].close()
        reporter.phase(rank, "provisioning", f"replacing {old[1]}")
        self.cloud.discard(old[0], [old[1]], Deadline(0.0, "no wait"))
        (id,) = self._launch(offer, [rank], deadline)
        (target,) = self._running(offer.zone, [id], deadline)
        (node,) = self._reach([target], reporter, ranks=[rank], deadline=deadline)
        with self._lock:
            if self.record.released:
                node.close()
                raise self._closing()
            self.nodes[rank] = node
        return node

    def _replace_unit(self, rank: int, reporter: Reporter, deadline: Deadline) -> Node:
        """Node ``rank``'s whole unit made again (one launch), once: the unit's other ranks,
        lost with it, find their new nodes made already."""
        first = rank - rank % self._unit
        ranks = list(range(first, first + self._unit))
        with self._replacing:
            if rank in self._fresh:
                self._fresh.discard(rank)
                return self.nodes[rank]
            offer, old = self._offer, self.record.node(rank)
            if self.record.released or offer is None or old is None:
                raise self._closing()
            for each in ranks:
                if each < len(self.nodes):
                    self.nodes[each].close()
                reporter.phase(each, "provisioning", f"replacing {old[1]} (its whole unit)")
            lost = [found for r in ranks if (found := self.record.node(r)) is not None]
            self.cloud.discard(old[0], [id for _, id in lost], Deadline(0.0, "no wait"))
            ids = self._launch(offer, ranks, deadline)
            targets = self._running(offer.zone, ids, deadline)
            nodes = self._reach(targets, reporter, ranks=ranks, deadline=deadline)
            with self._lock:
                if self.record.released:
                    for node in nodes:
                        node.close()
                    raise self._closing()
                for each, node in zip(ranks, nodes, strict=True):
                    self.nodes[each] = node
            self._fresh = set(ranks) - {rank}
            return self.nodes[rank]

    def keep(self, seconds: float) -> bool:
        """Leave the machines for the next pool like this one, ``seconds`` at most: each
        watchdog is told to keep its machine that long with no client and to end it then
        (``keep_command``), the set is written down (``warm.save``), and the nodes are
        closed (their workers stopped); nothing is deleted. False, having changed nothing
        that a ``terminate`` does not undo, when the set cannot be kept whole (a machine
        lost, the pool released); a failure on the way raises (terminate then)."""
        access, host_key, key = self._access, self._host_key, self.record.pool_key
        nodes = list(self.nodes)
        hosts = [n for n in nodes if isinstance(n, HostNode) and n.connection.alive]
        if (
            self.terminated
            or self.record.released
            or access is None
            or host_key is None
            or key is None
            or len(hosts) != self.request.nodes
            or len(hosts) != len(nodes)
            or not isinstance(self.cloud, Resumable)
            or not self._label
        ):
            return False
        placed = [self.record.node(rank) for rank in range(len(hosts))]
        if any(p is None for p in placed):
            return False
        for future in settle(lambda node: _run(node, keep_command(seconds)), hosts):
            future.result()
        now = time.time()
        machines = tuple(
            warm.WarmMachine(
                rank=rank,
                host=node.connection.target.host,
                port=node.connection.target.port,
                user=node.connection.target.user,
                peer=node.address,
                place=where[0],
                id=where[1],
            )
            for rank, (node, where) in enumerate(zip(hosts, placed, strict=True))
            if where is not None
        )
        kept = warm.WarmSet(
            id=warm.new_id(),
            cloud=self.options.cloud,
            spec=warm.spec_digest(self.options, self.request),
            image=bootstrap_plan(self.request.image, access).digest,
            pool=self.request.pool,
            owner=owner(),
            kept_at=now,
            until=now + seconds,
            hourly_cost=self.hourly_cost,
            describe=self.describe,
            host_key=host_key,
            label=self._label,
            key_dir=str(key.directory),
            gpus=access.gpus,
            machine_type=access.machine_type,
            instance_profile=access.instance_profile,
            down=self.down_command,
            machines=machines,
            record=self.record.snapshot(),
        )
        warm.save(kept)  # first: a failure here leaves the terminate to the caller
        with self._lock:
            if self._terminated:  # terminated meanwhile: nothing is left to keep
                warm.forget(kept.id)
                return False
            self._terminated = True  # from here on the machines are the record's
        # No client holds the key now: ``skyward down`` may remove it once the set is gone.
        (key.directory / ABOUT_FILE).write_text(json.dumps(dict(_about(key.directory), pid="0")))
        self.record.let_go()
        self.launching.fail("the pool's machines were kept warm")
        for node in nodes:
            try:
                node.close()  # its workers stopped; the machine stays
            except Exception as exc:
                _log.warning("%s: stopping its workers: %s", node.address, exc)
        return True

    def _closing(self) -> ProvisionError:
        return ProvisionError(f"pool {self.request.pool} is closing; not replacing")

    @property
    def down_command(self) -> str:
        """The ``skyward down`` command that removes what this pool leaves behind."""
        return " ".join(["skyward down --pool", self.request.pool, self.cloud.scope[1]]).rstrip()

    def deleting(self) -> str:
        made = [f"{self.cloud.noun} {id}" for _, id in self.record.machines()]
        return ", ".join(made + [f"{r.kind} {r.id}" for r in self.record.recorded()])

    def release(self) -> None:
        """Delete everything recorded, then the pool key. Idempotent; raises
        ``ProvisionError`` naming what is left and the command that removes it, after
        trying everything."""
        self.launching.fail("the pool is being released")
        already, pool_key = self.record.close()
        if already:
            return
        timeout = self.options.release_timeout
        try:
            left = self.cloud.delete(
                self.record, Deadline(timeout, f"release_timeout ({timeout:g} s)")
            )
        finally:
            if pool_key is not None:
                pool_key.delete()
        if left:
            raise ProvisionError(
                f"pool {self.request.pool}: could not delete {', '.join(left)}"
                f"{self.cloud.scope[0]}. Remove what is left with: {self.down_command}"
            )


def _run(node: HostNode, command: str) -> None:
    status, output = node.connection.run(command, timeout=30)
    if status != 0:
        raise ProvisionError(f"{node.connection.target}: `{command}` failed ({status}): {output}")


def _about(directory: Path) -> dict[str, str]:
    try:
        return {str(k): str(v) for k, v in json.loads((directory / ABOUT_FILE).read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _ended(noun: str, id: str, machine: Described) -> str:
    if machine.status == "gone":
        return f"{noun} {id} is gone: {machine.why}"
    return f"{noun} {id} is {machine.status}: {machine.why}"


def launch_each(
    place: str,
    names: Sequence[str],
    create: Callable[[str], None],
    discard: Callable[[str, Sequence[str], Deadline], list[str]],
    *,
    release_timeout: float,
    down: str,
) -> list[str]:
    """For a cloud that makes machines one create each, by name (GCP, Azure): every
    ``create(name)`` at once, all settled; the first failure raised. When every failure was
    a ``CapacityError`` the attempt's machines are deleted first (``discard``, waited for),
    so that the next place starts clean."""
    errors = [e for f in settle(create, names) if (e := f.exception()) is not None]
    if errors and all(isinstance(e, CapacityError) for e in errors):
        deadline = Deadline(release_timeout, f"release_timeout ({release_timeout:g} s)")
        left = discard(place, names, deadline)
        if left:
            raise ProvisionError(f"could not delete {', '.join(left)}. Remove them with: {down}")
    if errors:
        raise errors[0]
    return list(names)


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
