"""``sky.Spec`` and fallback across them: a pool that may run on one of several providers (or
accelerators), tried in order or cheapest first, using the first whose machines are made.

::

    ComputePool(Spec(AWS(), accelerator="H100"), Spec(GCP(), accelerator="H100"),
                nodes=4, selection="first" | "cheapest")
      __init__   every spec → a PoolSpec (the pool's keywords, then what the spec sets),
                 validated, transformed by the plugins, checked by its provider: a wrong one
                 is an error before anything is created; "cheapest" orders them by estimate
      start()    Choices.provision: for each candidate in order, Machines.provision; one that
                 fails has destroyed what it made (the provider's all-or-nothing contract),
                 its reason is kept, and the next is tried; the first that succeeds is the
                 pool's spec from then on (pool.spec, pool.attempts)
      all fail   NoSpecStarted, listing every spec and why

The keyword form (``ComputePool(provider=..., nodes=...)``) is one candidate, and fails as it
always did. What falls back is the making of machines (no capacity, a quota, an unreachable
host, a failed bootstrap); once they exist, a worker that cannot start fails the pool as it
would with one spec: it is the program's or the image's, and would fail on the next too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from skyward._errors import NoSpecStarted, PoolClosed, ProvisionCancelled, SkywardError
from skyward._image import Image
from skyward.client.phases import Reporter
from skyward.pool.machines import Machines
from skyward.pool.spec import FROM_05, PoolSpec, apply_transforms
from skyward.providers.base import Provider

Selection = Literal["first", "cheapest"]

_SPEC_FROM_05 = {
    "region": "the region is the provider's: sky.Spec(sky.AWS(region='us-east-1'), ...)",
}

# The providers whose machines exist already: a pool on them adds nothing to the bill.
_OWN_MACHINES = ("local", "ssh", "slurm")


class Spec(BaseModel):
    """One way to make a pool's machines: a provider and what to ask it for.

    Give several to ``ComputePool`` to fall back from one to the next. A field left out is
    the pool's keyword of the same name (or its default); ``nodes`` must come to the same
    count in every spec, since the pool's size is fixed when it is built.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    provider: Any = None
    nodes: int | tuple[int, int] | None = None
    accelerator: Any = None  # a name ("H100:8") or sky.accelerators.H100(count=8): PoolSpec's
    vcpus: float | None = None
    memory_gb: float | None = None
    allocation: str | None = None
    max_hourly_cost: float | None = None

    def __init__(self, provider: Any = None, /, **fields: Any) -> None:
        # sky.Spec(sky.AWS(), accelerator="H100") as well as sky.Spec(provider=sky.AWS(), ...)
        if provider is not None:
            if "provider" in fields:
                raise TypeError("Spec() got the provider twice")
            fields["provider"] = provider
        super().__init__(**fields)

    @model_validator(mode="before")
    @classmethod
    def _from_05(cls, given: Any) -> Any:
        """skyward 0.5's Spec fields we have no counterpart for say what to write instead."""
        if isinstance(given, dict):
            for name in given:
                why = _SPEC_FROM_05.get(name) or FROM_05.get(name)
                if why is not None:
                    raise ValueError(f"sky.Spec has no {name}=: {why}")
        return given

    def given(self) -> dict[str, Any]:
        """What this spec sets, as pool options."""
        return {name: getattr(self, name) for name in self.model_fields_set}


@dataclass(frozen=True)
class Candidate:
    """One spec, made whole: its validated options and its image after the transforms."""

    spec: PoolSpec
    image: Image
    hourly: float | None  # the estimate "cheapest" orders by (USD per hour); None: unknown

    def describe(self) -> str:
        parts = [self.spec.provider_kind, f"{self.spec.nodes} node(s)"]
        if self.spec.accelerator:
            parts.append(self.spec.accelerator)
        if self.hourly is not None and self.spec.provider_kind not in _OWN_MACHINES:
            parts.append(f"about ${self.hourly:.2f}/h")
        return ", ".join(parts)


@dataclass(frozen=True)
class Attempt:
    """A candidate the pool tried when it started, and why it was given up (``error``;
    ``None`` for the one that was used)."""

    candidate: Candidate
    error: BaseException | None

    @property
    def spec(self) -> PoolSpec:
        return self.candidate.spec

    def __str__(self) -> str:
        outcome = "used" if self.error is None else f"failed: {self.error}"
        return f"{self.candidate.describe()}: {outcome}"


def candidates(
    first: Provider | Spec | None,
    more: Sequence[Spec],
    options: Mapping[str, Any],
) -> list[Candidate]:
    """Every spec validated, transformed and checked by its provider, in the order the pool
    tries them. ``first`` and ``more`` are ``ComputePool``'s positional arguments."""
    from skyward.providers.local import Local

    listed: list[Any] = [first, *more] if isinstance(first, Spec) or more else []
    if not listed:  # the keyword form: one spec, as the pool always took it
        single = {**options, "provider": Local() if first is None else first}
        return [_candidate(PoolSpec.model_validate(single))]
    specs: list[Spec] = []
    for number, spec in enumerate(listed, 1):
        if not isinstance(spec, Spec):
            raise TypeError(
                f"ComputePool's argument {number} is a {type(spec).__name__}: with several "
                f"positional arguments each is a sky.Spec(provider, ...)"
            )
        specs.append(spec)
    selection = options.get("selection", "first")
    made: list[Candidate] = []
    for number, spec in enumerate(specs, 1):
        given: dict[str, Any] = {**options, **spec.given()}
        if given.get("provider") is None:
            given["provider"] = Local()
        if made:  # one pool, one name: the first spec's (its default is made afresh)
            given["name"] = made[0].spec.name
        try:
            made.append(_candidate(PoolSpec.model_validate(given)))
        except (ValueError, TypeError, SkywardError) as error:
            error.add_note(f"(in sky.Spec {number} of the pool, provider {_kind(given)})")
            raise
    sizes = {(c.spec.min_nodes, c.spec.nodes) for c in made}
    if len(sizes) > 1:
        counts = ", ".join(f"{c.spec.nodes} ({c.spec.provider_kind})" for c in made)
        raise ValueError(
            f"every sky.Spec of a pool has the same nodes (the pool's size is fixed when it "
            f"is built), not {counts}: give nodes= once, to the pool"
        )
    if selection == "cheapest":
        # Unknown prices last; equal ones in the order given (sorted is stable).
        made.sort(key=lambda c: (c.hourly is None, c.hourly or 0.0))
    return made


def _candidate(spec: PoolSpec) -> Candidate:
    image = apply_transforms(spec.image, spec)
    # Provider-specific limits and missing SDKs, before anything is touched.
    spec.provider.check(spec.request(image))
    return Candidate(spec, image, estimate(spec))


def _kind(given: Mapping[str, Any]) -> str:
    return str(getattr(given.get("provider"), "kind", type(given.get("provider")).__name__))


def estimate(spec: PoolSpec) -> float | None:
    """The pool's price per hour on this spec, from the catalog's list prices (USD; on-demand,
    the first machine type the provider would ask for); 0 for machines that exist already
    (local, SSH hosts, a Slurm cluster); None when the catalog does not know."""
    from skyward.providers.cloud import catalog

    kind = spec.provider_kind
    if kind in _OWN_MACHINES:
        return 0.0
    machines_for = getattr(spec.provider, "machines_for", None)
    if machines_for is None:
        return None
    try:
        machines = machines_for(spec.request(spec.image))
    except Exception:  # an estimate, never a failure: check() has said what is wrong
        return None
    if not machines:
        return None
    region = getattr(spec.provider, "region", None)
    hourly = catalog.machine_price(machines[0], region) or machines[0].hourly
    return None if hourly is None else float(hourly) * spec.nodes


class Choices:
    """The pool's candidates, and which one its machines came from. Used by one thread (the
    one that starts the pool); ``attempts`` is read by any."""

    def __init__(self, made: Sequence[Candidate]) -> None:
        self.candidates = tuple(made)
        self.attempts: tuple[Attempt, ...] = ()

    def provision(self, machines: Machines, reporter: Reporter) -> Candidate:
        """Make the machines of the first candidate that can; its candidate. A close meanwhile
        (``PoolClosed``), Ctrl-C and the like end the start at once, as with one spec."""
        if len(self.candidates) == 1:
            only = self.candidates[0]
            machines.provision(
                only.spec.request(only.image), only.spec.initial_nodes, only.spec.workers_per_node
            )
            self.attempts = (Attempt(only, None),)
            return only
        tried: list[Attempt] = []
        for number, candidate in enumerate(self.candidates, 1):
            reporter.status(f"spec {number} of {len(self.candidates)}: {candidate.describe()}")
            try:
                machines.provision(
                    candidate.spec.request(candidate.image),
                    candidate.spec.initial_nodes,
                    candidate.spec.workers_per_node,
                    provider=candidate.spec.provider,
                )
            except (PoolClosed, ProvisionCancelled):
                raise
            except SkywardError as error:
                tried.append(Attempt(candidate, error))
                self.attempts = tuple(tried)
                reporter.status(f"spec {number} ({candidate.describe()}) failed: {error}")
                continue
            tried.append(Attempt(candidate, None))
            self.attempts = tuple(tried)
            return candidate
        listed = "\n".join(f"  {n}. {attempt}" for n, attempt in enumerate(tried, 1))
        raise NoSpecStarted(
            f"no spec of pool {self.candidates[0].spec.name!r} could start:\n{listed}",
            attempts=tried,
        )
