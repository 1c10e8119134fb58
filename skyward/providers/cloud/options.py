"""The options every cloud provider has, and what they decide alike: ``CloudOptions``.

``sky.AWS``, ``sky.GCP`` and ``sky.Azure`` are ``CloudOptions`` with their own options added
(region or project, machine type, image, disk). What is decided here the same way for every
cloud, before anything is created (the start and each cloud's ``machines`` ask)::

    check(request)             when the pool is built: the cloud's SDK and paramiko installed
    strategy(request)          allocation= against spot=
    machines_for(request)      the catalog's machines, in the order to try them
    refuse_above(...)          an on-demand pool above max_hourly_cost, from the price table
    ssh_cidrs(private_ranges)  who may reach SSH ("auto": this machine's public address)
    hint()                     what to check when SSH never answered
    machines(request)          the cloud's: this pool's ``Machines`` (``contract.py``)
    provision(request, ...)    check, then the one start (``start.py``)
"""

from __future__ import annotations

import dataclasses
import ipaddress
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skyward._errors import ProvisionError
from skyward.client.extras import check as check_extra
from skyward.client.phases import Reporter
from skyward.providers.base import Allocation, ProvisionRequest
from skyward.providers.cloud import capacity, catalog, warm
from skyward.providers.cloud.capacity import Strategy
from skyward.providers.cloud.catalog import Cloud, Machine
from skyward.providers.cloud.contract import Machines
from skyward.providers.cloud.start import adopt, start

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

    def hint(self) -> str:
        """What to check when the machines run but SSH never answered (``ssh_rule``: the
        cloud's word for what opens SSH, "the security group")."""
        return (
            f"check that this machine's address is inside {self.ssh_rule}'s SSH range "
            f"(ssh_cidr={self.ssh_cidr!r}) and that their {self.connect} addresses are "
            f"reachable from this network."
        )

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is touched: the cloud's SDK and
        paramiko are installed (a subclass checks its options after this)."""
        for module in (*self.needs, "paramiko"):
            check_extra(module, feature=f"sky.{type(self).__name__}")

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        """``check``, then machines a pool closed with ``keep_warm`` left, when a set of
        this spec and size is kept (``start.adopt``), else the one start
        (``cloud/start.py``) of this pool's ``machines``; whatever it made is destroyed when
        the start fails."""
        self.check(request)
        spec = warm.spec_digest(self, request)
        machines_of = self._machines_of(request)
        adopted = adopt(self, machines_of, request, reporter, spec=spec)
        if adopted is not None:
            return adopted
        return start(self, self.machines(request), request, reporter)

    def _machines_of(self, request: ProvisionRequest) -> Callable[[str], Machines]:
        """The cloud's calls for the pool named so (a kept set's, which releases it)."""
        return lambda pool: self.machines(dataclasses.replace(request, pool=pool))

    def machines(self, request: ProvisionRequest) -> Machines:
        """This pool's machines on the cloud (the contract's calls), its API connected;
        nothing is made yet."""
        raise NotImplementedError


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
