"""The calls a cloud writes: the one contract every cloud provider implements, in one place.

A cloud is a folder of three modules: ``options`` (its public, pydantic configuration),
``api`` (its SDK's calls and the table that translates its errors) and ``machines`` (the
calls below). Everything else is the start's (``start.py``): validation, the pool's keys,
the boot payload, the order of offers and the failover, the waits, SSH, the bootstrap,
destroying what was made when anything fails, replacing a lost machine, and the record of
what exists. The start calls a cloud's ``Machines`` in this order::

    start.py                                  Machines (one cloud, one pool)
    ─────────────────────────────────────     ──────────────────────────────────────────────
    options.check(request)                    refuse bad input; nothing touched
    options.machines(request)                 this pool's Machines, its API connected
    key_label(first offer)                    what the pool's key is labelled with
    offers(want)                              (machine, place, market, price) to try, and
                                              the region to announce
    prepare(want, offers, boot, record)       network, rules, key pair, image: each thing
                                              recorded the moment it exists
    for each offer, until one takes the pool:
        launch(offer, names, ...)             one machine per name in that place, all or
                                              none; ``CapacityError``: the next offer
    describe(place, ids) until all run        state, where SSH is reached, why one ended
    ...the pool runs; a node is lost:
        describe(place, [id])                 why (added to the ``WorkerLost``)
        discard(place, [id], no wait)         the lost machine let go
        launch(offer, [name], ...)            its replacement, made alike
    delete(record, deadline)                  everything recorded, then a sweep by tag
    ...or, closed with keep_warm, nothing; a later pool of the same spec:
        resume(name)                          this pool's calls take back the identity of
                                              the pool that kept them (``Resumable``)
        describe(place, ids), delete(...)     as above, on what that pool made

What a call may rely on, and must keep:

- ``record`` is the pool's record (``Record``): a cloud adds what it creates with
  ``record.add(kind, id)`` as soon as the cloud answers (or, for a name it chose, before it
  asks: an answer lost to a Ctrl-C still leaves a name to delete). The record has one lock,
  and only its methods write it.
- A machine is reached where ``describe`` says (``Reach``: host, port, login user), not on
  port 22 by rule: a marketplace maps a container's SSH to another port or a proxy.
- The boot payload (``boot.Boot``) is made by the start, once per pool: the host key the
  client made, the login key, the idle watchdog and its last act. A cloud carries it the
  way its machines boot: cloud-init user data, or a start script where there is no
  cloud-init (``Boot.cloud_config()`` / ``Boot.start_script()``).
- Errors are ``ProvisionError``s that say what to do (the cloud's ``api`` translates its
  SDK's); ``CapacityError`` when another place may take the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud.boot import Boot
from skyward.providers.cloud.capacity import Offer, Strategy
from skyward.providers.cloud.record import Record

# What a machine is doing, in the start's words: on its way, running, or ended (stopped,
# reclaimed, deleted). Each cloud maps its own states onto these three.
State = Literal["starting", "running", "ended"]


class Options(Protocol):
    """What the start reads of a cloud's options (``CloudOptions`` has all of it)."""

    @property
    def cloud(self) -> str: ...
    @property
    def username(self) -> str: ...
    @property
    def python(self) -> str | None: ...
    @property
    def workdir(self) -> str: ...
    @property
    def idle_timeout(self) -> float: ...
    @property
    def boot_timeout(self) -> float: ...
    @property
    def release_timeout(self) -> float: ...

    def strategy(self, request: ProvisionRequest) -> Strategy:
        """The pool's ``allocation=``, or the cloud's default (its ``spot=``)."""
        ...

    def hint(self) -> str:
        """What to check when the machines run but SSH never answered."""
        ...


@dataclass(frozen=True)
class Want:
    """What the start asks of a cloud: the pool's request, the strategy it resolved
    (``allocation=`` against the cloud's ``spot=``), and the deadline that bounds the calls
    (it ends early when the pool is closed meanwhile)."""

    request: ProvisionRequest
    strategy: Strategy
    deadline: Deadline
    reporter: Reporter


@dataclass(frozen=True)
class Offers:
    """Every place to try, in the strategy's order, and the region to announce."""

    offers: list[Offer]
    region: str


@dataclass(frozen=True)
class Reach:
    """Where a machine's SSH answers, as the cloud said: ``host`` and ``port`` from here,
    ``peer`` the address the pool's other nodes use (a private address), and ``user`` when
    the cloud decides the login (a proxy that routes by user name); ``None``: the options'
    ``username``."""

    host: str
    peer: str
    port: int = 22
    user: str | None = None


@dataclass(frozen=True)
class Described:
    """One machine as the cloud describes it now: its ``state``, where it is reached once
    it runs (``None`` before the cloud knows), and when it ``ended``, why, in words
    ("reclaimed by AWS (spot interruption)")."""

    state: State
    status: str  # the cloud's own word for it ("RUNNING", "terminated"), for messages
    reach: Reach | None = None
    why: str = ""


class Machines(Protocol):
    """One pool's machines on one cloud: the calls the start makes. Built per pool by the
    options (``options.machines(request)``), so it may keep what ``prepare`` found (the
    image, the network, the launch template) for ``launch`` and replacements."""

    # The cloud's word for a machine ("instance", "VM", "pod"), for messages; the start
    # of its machines' names (``node-``: rank 0's is ``node-0``, its replacement
    # ``node-0-r1``); whether they run as an identity that volumes without keys use.
    noun: str
    prefix: str
    instance_profile: bool

    def key_label(self, first: Offer) -> tuple[str, str, str]:
        """What the pool's key is labelled with for ``skyward ls`` / ``down`` (``keys.py``),
        when ``first`` is the offer tried first: the region, the name of what plays the key
        pair's part, the endpoint ("": the cloud's own)."""
        ...

    @property
    def scope(self) -> tuple[str, str]:
        """Where the pool's things are: words for messages (``" in us-east-1"``) and the
        ``skyward down`` option that names it (``"--region us-east-1"``)."""
        ...

    def offers(self, want: Want) -> Offers:
        """Before anything exists: every (machine, place, market, price) that could serve
        the request, in the strategy's order (``capacity.plan``). A request nothing can
        serve is a ``ProvisionError`` that says what to change."""
        ...

    def prepare(self, want: Want, offers: Sequence[Offer], boot: Boot, record: Record) -> None:
        """What the machines need before they exist (network, firewall, key pair, image),
        each recorded as made; the launch template, kept for ``launch``."""
        ...

    def launch(
        self, offer: Offer, names: Sequence[str], record: Record, deadline: Deadline
    ) -> list[str]:
        """One machine per name in ``offer``'s place, type and market, all or none: their
        ids by rank (the names themselves where the cloud names machines). Each recorded as
        soon as it is asked for or answered. ``CapacityError`` (having left nothing of this
        attempt behind) when another place may take the pool."""
        ...

    def describe(self, place: str, ids: Sequence[str], *, quick: bool = False) -> list[Described]:
        """Each machine now, in ``ids``' order; one the cloud no longer has is ``ended``
        with its reason. ``quick``: one bounded try (a watcher asks again in seconds)."""
        ...

    def discard(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[str]:
        """Delete these machines, waiting within ``deadline`` (``Deadline(0)``: do not wait,
        a lost machine being replaced): what could not be deleted, as ``"kind name (why)"``."""
        ...

    def delete(self, record: Record, deadline: Deadline) -> list[str]:
        """Delete everything ``record`` holds (machines first, and wait), then sweep by the
        pool's tags for what a create cut off in flight made: what could not be deleted, as
        ``"kind name (why)"``. Called once, after the nodes are closed; also while launches
        are still on the wire (a Ctrl-C), which it must not miss."""
        ...


@runtime_checkable
class Resumable(Protocol):
    """A cloud whose machines a pool may keep warm (``keep_warm``) for a later pool: that
    pool's ``Machines`` (built for the pool that made them, by its name) take back the
    identity the making pool's had, which may hold a random part (a resource group's
    name, the sweep's tag). A cloud without it has its machines destroyed at close, as
    without ``keep_warm``, and says so."""

    def resume(self, name: str) -> None:
        """``name``: what ``key_label`` gave as the key pair's part for the making pool;
        from now on ``describe`` and ``delete`` act on what that pool made."""
        ...
