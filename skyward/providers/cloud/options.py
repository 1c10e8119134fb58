"""The options every cloud provider has, and what they decide alike: ``CloudOptions``.

``sky.AWS``, ``sky.GCP`` and ``sky.Azure`` are ``CloudOptions`` with their own SDK's options
added (region or project, machine type, image, disk). What is decided here the same way for
every cloud, before anything is created::

    strategy(request)          allocation= against spot=
    machines_for(request)      the catalog's machines, in the order to try them
    refuse_above(...)          an on-demand pool above max_hourly_cost, from the price table
    ssh_cidrs(private_ranges)  who may reach SSH ("auto": this machine's public address)
    pool_keys(made, ...)       the pool's login key and host key, recorded on the allocation
    boot(host_key, key)        the #cloud-config the machines boot with (watchdog included)
    hint(rule)                 what to check when SSH never answered

and the sequence every cloud provisions by (``provision``), each step but the shared ones
the cloud's own::

    check(request)             when the pool is built: nothing touched yet
    allocation(request)        what records the pool's resources; from here on a failure
                               destroys what was recorded (``open_or_destroy``)
    offers(made, reporter)     the machines, the places that offer them, at what price
      affordable, announce       within max_hourly_cost; the choice reported (shared)
    prepare(made, offers, ...) keys, network, image: how one offer is launched
      launch_first, chose        the first offer with room takes the pool, recorded, and
                                 each node's machine named (shared)
    started(made, offer, ...)  the machines recorded and running: how each is reached
                               (by default, an ``InstanceAllocation``'s ``targets``)
      reach                      over SSH, ``hint(ssh_rule)`` when it never answered (shared)
"""

from __future__ import annotations

import ipaddress
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skyward._errors import ProvisionError
from skyward.client.extras import check as check_extra
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.base import Allocation, ProvisionRequest
from skyward.providers.cloud import capacity, catalog
from skyward.providers.cloud.allocation import CloudAllocation, open_or_destroy
from skyward.providers.cloud.boot import HostKey, first_client_bound, user_data
from skyward.providers.cloud.capacity import Offer, Strategy
from skyward.providers.cloud.catalog import Cloud, Machine
from skyward.providers.cloud.keys import key_label
from skyward.providers.ssh.connection import PoolKey
from skyward.providers.ssh.hosts import Access, HostTarget

Launch = Callable[[Offer], Any]  # launches one offer's machines (``CapacityError``: no room)
DEFAULT_IP_LOOKUP = "https://checkip.amazonaws.com"
MAX_SECONDS = 7 * 24 * 3600.0


class CloudOptions(BaseModel):
    """The options every cloud provider's configuration has, validated alike: spot, who may
    reach SSH, how the nodes are reached, the watchdog's and the waits' bounds, and how
    workers run on the nodes. A subclass names its catalog (``cloud``) and its option that
    names a machine type (``machine_option``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    cloud: ClassVar[Cloud]
    machine_option: ClassVar[str]
    # The cloud's word for what opens SSH to the machines, for ``hint``; the modules of its
    # SDK, which ``check`` asks for (imported only when a pool uses the cloud).
    ssh_rule: ClassVar[str]
    needs: ClassVar[tuple[str, ...]]

    spot: bool = False
    username: str = Field(default="skyward", pattern=r"^[a-z_][a-z0-9_-]*$")
    ssh_cidr: str = "auto"
    connect: Literal["public", "private"] = "public"
    idle_timeout: float = Field(default=1800.0, gt=0, le=MAX_SECONDS)
    boot_timeout: float = Field(default=600.0, gt=0, le=MAX_SECONDS)
    release_timeout: float = Field(default=600.0, gt=0, le=MAX_SECONDS)
    ip_lookup_url: str = DEFAULT_IP_LOOKUP
    python: str | None = Field(default=None, min_length=1)
    workdir: str = Field(default="~/.cache/skyward", pattern=r"^(/|~/|~$)")

    @field_validator("ssh_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        if value == "auto":
            return value
        try:
            return str(ipaddress.ip_network(value, strict=False))
        except ValueError as exc:
            message = "ssh_cidr must be 'auto' or a network such as '203.0.113.7/32'"
            raise ValueError(message) from exc

    @property
    def kind(self) -> str:
        return self.cloud

    @property
    def catalog_region(self) -> str | None:
        """The region whose prices rank the catalog's machines (None: the reference one)."""
        return None

    @property
    def allocation_options(self) -> dict[str, Any]:
        """What the pool's ``CloudAllocation`` is made with, from these options."""
        return {
            "connect": self.connect,
            "username": self.username,
            "release_timeout": self.release_timeout,
        }

    def strategy(self, request: ProvisionRequest) -> Strategy:
        """The pool's ``allocation=``, or this provider's default (its ``spot``)."""
        name = f"sky.{type(self).__name__}"
        return capacity.strategy_of(request.allocation, spot=self.spot, provider=name)

    def machines_for(self, request: ProvisionRequest, region: str | None = None) -> list[Machine]:
        """The catalog's machines for the request, in the order to try them (the choice
        first, then what a capacity failover may move to); empty when the machine option
        names a type the catalog lacks (the cloud describes it at provision). ``ValueError``
        for a request no machine satisfies, or a named type it contradicts."""
        return capacity.machines_for(
            self.cloud,
            request.accelerator,
            strategy=self.strategy(request),
            vcpus=request.vcpus,
            memory_gb=request.memory_gb,
            named=getattr(self, self.machine_option),
            given=self.machine_option,
            region=region or self.catalog_region,
        )

    def described(self, request: ProvisionRequest, **facts: Any) -> list[Machine]:
        """The machine type the machine option names, which the catalog lacks, as the cloud
        described it (``facts``: ``Machine``'s fields); ``ValueError`` if it is smaller than
        the pool's ``vcpus=``/``memory_gb=``."""
        named = str(getattr(self, self.machine_option))
        machine = Machine(cloud=self.cloud, type=named, **facts)
        sizes = {"vcpus": request.vcpus, "memory_gb": request.memory_gb}
        catalog.refuse_contradiction(machine, given=self.machine_option, **sizes)
        return [machine]

    def refuse_above(
        self,
        request: ProvisionRequest,
        machines: Sequence[Machine],
        regions: Sequence[str],
        price: Callable[[Machine, str], float | None] = catalog.machine_price,
    ) -> None:
        """When the pool is built: an on-demand pool whose every known price is above
        ``max_hourly_cost`` is refused (the table needs no network; unknown prices are
        judged at provision, still before anything is created)."""
        if self.strategy(request) == "on-demand":
            capacity.refuse_above(
                machines,
                nodes=request.nodes,
                max_hourly_cost=request.max_hourly_cost,
                regions=regions,
                price=price,
            )

    def ssh_cidrs(self, private_ranges: Sequence[str] | Callable[[], Sequence[str]]) -> list[str]:
        """Who may reach SSH: ``ssh_cidr``, or for ``"auto"`` this machine's public address
        (``connect="public"``) or the network's own ``private_ranges`` (a callable is asked
        only then)."""
        if self.ssh_cidr == "auto" and self.connect == "private":
            return list(private_ranges() if callable(private_ranges) else private_ranges)
        return [client_cidr(self.ssh_cidr, lookup_url=self.ip_lookup_url)]

    def access(self, key_file: Path, **more: Any) -> Access:
        """How the pool's machines are reached and prepared (the shared SSH-host layer)."""
        return Access(
            key_file=key_file,
            python=self.python,
            workdir=self.workdir,
            boot_timeout=self.boot_timeout,
            **more,
        )

    def pool_keys(
        self, made: CloudAllocation[Any, Any], *, region: str, name: str, endpoint: str, **more: Any
    ) -> tuple[PoolKey, HostKey]:
        """The pool's login key, labelled for ``skyward ls`` / ``down`` (``name``: what plays
        the key pair's part) and deleted with ``made``, and the host key its machines
        present; both recorded on ``made`` with the access (``more``: ``Access`` options)."""
        key = PoolKey()
        made.adopt_pool_key(key)
        key.label(key_label(self.cloud, region, made.request.pool, name, endpoint))
        host_key = HostKey.generate()
        made.host_key = host_key.public
        made.access = self.access(key.path, **more)
        return key, host_key

    def boot(
        self,
        host_key: HostKey,
        key: PoolKey,
        *,
        idle_action: str | None = None,
        files: Sequence[Mapping[str, str]] = (),
    ) -> str:
        """The ``#cloud-config`` of the pool's machines. A machine waits for its first client
        as long as the client waits for it (and a margin), not ``idle_timeout``: a client
        killed mid-start costs minutes."""
        return user_data(
            host_key=host_key,
            authorized_key=key.public,
            idle_timeout=self.idle_timeout,
            first_client_timeout=first_client_bound(self.boot_timeout),
            idle_action=idle_action,
            files=files,
        )

    def hint(self, rule: str) -> str:
        """What to check when the machines run but SSH never answered; ``rule``: the cloud's
        word for what opens SSH ("the security group")."""
        return (
            f"check that this machine's address is inside {rule}'s SSH range "
            f"(ssh_cidr={self.ssh_cidr!r}) and that their {self.connect} addresses are "
            f"reachable from this network."
        )

    # ── the sequence of a start ────────────────────────────────────────────────────────

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is touched: the cloud's SDK and
        paramiko are installed (a subclass checks its options after this)."""
        for module in (*self.needs, "paramiko"):
            check_extra(module, feature=f"sky.{type(self).__name__}")

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        """``check``, then the cloud's ``allocation`` built by ``build``; whatever it
        recorded is destroyed when the start fails."""
        self.check(request)
        return open_or_destroy(self.allocation(request), lambda made: self.build(made, reporter))

    def build(self, made: Any, reporter: Reporter) -> None:
        """The offers in order, within the price limit and announced; the first place with
        room takes the pool; its machines are reached over SSH."""
        request, deadline = made.request, self.launch_deadline(made)
        offers, region = self.offers(made, reporter)
        offers = capacity.affordable(offers, request.nodes, request.max_hourly_cost)
        capacity.announce(offers, request.nodes, reporter, region or offers[0].zone)
        launch = self.prepare(made, offers, reporter)
        offer, launched = capacity.launch_first(
            offers, launch, nodes=request.nodes, reporter=reporter, deadline=deadline
        )
        made.chose(offer, launched)
        for rank in range(request.nodes):  # each node's row names its machine
            machine = made.machine(rank)
            if machine is not None:
                reporter.phase(rank, "provisioning", f"{machine[1]} ({offer.where})")
        targets = self.started(made, offer, launched, reporter)
        made.reach(targets, reporter, hint=self.hint(self.ssh_rule), deadline=deadline)

    def allocation(self, request: ProvisionRequest) -> CloudAllocation[Any, Any]:
        """The pool's allocation, with the cloud's API connected (nothing made yet)."""
        raise NotImplementedError

    def launch_deadline(self, made: Any) -> Deadline:
        """What bounds the launch and the reach: the start's deadline."""
        return made.request.deadline  # type: ignore[no-any-return]

    def offers(self, made: Any, reporter: Reporter) -> tuple[list[Offer], str | None]:
        """Before anything exists: every (machine, place, market) to try, in the strategy's
        order, and the region to announce (``None``: the first offer's place)."""
        raise NotImplementedError

    def prepare(self, made: Any, offers: Sequence[Offer], reporter: Reporter) -> Launch:
        """What the pool needs before its machines (keys, network, image), recorded on
        ``made``; how one offer is launched (``CapacityError``: no room there)."""
        raise NotImplementedError

    def started(
        self, made: Any, offer: Offer, launched: Any, reporter: Reporter
    ) -> list[HostTarget]:
        """After ``offer`` took the pool (``launched``: what its launch returned): the
        machines recorded and running, and how to reach each. By default, a cloud that names
        its machines (``InstanceAllocation``): each named machine once it runs."""
        return made.targets(offer.zone, launched, self.launch_deadline(made))  # type: ignore[no-any-return]


def prices(
    on_demand: Callable[[Machine, str], float | None],
    spot: Callable[[Machine, str], float | None] = lambda machine, place: None,
) -> Callable[[Machine, str, capacity.Market], float | None]:
    """An offer's hourly price for ``capacity.plan``: ``on_demand(machine, place)``; a spot
    one's ``spot(machine, place)``, or when that is unknown the on-demand price, its ceiling
    (the most a spot machine is charged by default)."""

    def price(machine: Machine, place: str, market: capacity.Market) -> float | None:
        on_demand_price = on_demand(machine, place)
        if market == "on-demand":
            return on_demand_price
        found = spot(machine, place)
        return on_demand_price if found is None else found

    return price


def client_cidr(
    ssh_cidr: str, *, lookup_url: str = DEFAULT_IP_LOOKUP, timeout: float = 10.0
) -> str:
    """The network allowed to reach the machines' SSH port: ``ssh_cidr`` itself, or for
    ``"auto"`` this machine's public address as a single-address network."""
    if ssh_cidr != "auto":
        return str(ipaddress.ip_network(ssh_cidr, strict=False))
    try:
        with urllib.request.urlopen(lookup_url, timeout=timeout) as response:
            text = response.read(200).decode("ascii", "replace").strip()
    except (OSError, urllib.error.URLError) as exc:
        raise ProvisionError(
            f"could not find this machine's public address at {lookup_url} ({exc}); pass "
            f"ssh_cidr='203.0.113.7/32' with the address SSH connections will come from"
        ) from exc
    try:
        address = ipaddress.ip_address(text)
    except ValueError as exc:
        raise ProvisionError(
            f"{lookup_url} did not answer with an IP address (it said {text[:60]!r}); pass "
            f"ssh_cidr='203.0.113.7/32' with the address SSH connections will come from"
        ) from exc
    return f"{address}/{address.max_prefixlen}"
