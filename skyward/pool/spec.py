"""``PoolSpec``: a pool's validated configuration, and what is derived from it before
anything starts: the plugins checked and pickled, their transforms applied, and the narrow
``ProvisionRequest`` a provider receives.

Everything here runs in ``ComputePool.__init__``, so a wrong value is an error before any
machine is touched. Each option is spelled here once: ``PoolOptions`` names what a caller may
give and its type, ``PoolSpec`` holds the default and the limits, and ``ComputePool`` passes
on only what the caller gave (``tests/pool/test_pool_options.py`` keeps the two, and the docs, in
step).
"""

from __future__ import annotations

import inspect
import re
import secrets
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skyward._errors import PluginError
from skyward._image import Image
from skyward._plugin import Plugin
from skyward.client.futures import Deadline
from skyward.client.options import keyword_signature
from skyward.client.volume import Volume, check_volumes
from skyward.console import ConsoleMode, OutputMode
from skyward.console.handlers import LogConfig
from skyward.link import protocol as proto
from skyward.metrics import GPU_KINDS, default_metrics
from skyward.providers.base import Provider, ProvisionRequest, identity_tags
from skyward.providers.cloud.catalog import Accelerator

# Bounds for the durations users give: enough for any real start, and small enough that the
# standard library's timeouts (threading's TIMEOUT_MAX) never overflow.
_MAX_SECONDS = 7 * 24 * 3600.0

# skyward 0.5's names: "spot-if-available" falls back to on-demand machines when no spot
# ones are to be had; "cheapest" takes whichever costs less.
AllocationStrategy = Literal["spot", "on-demand", "spot-if-available", "cheapest"]


class Worker(BaseModel):
    """How each node runs calls: ``concurrency`` at once, and where.

    ``executor="thread"`` (``"auto"`` means the same): on threads of the node's worker
    process, sharing its memory and its GIL; right for I/O, and for numpy, jax or torch
    code, which releases the GIL. ``executor="process"``: each call in one of
    ``concurrency`` child processes of the worker, so pure-Python CPU-bound calls use as
    many cores; arguments and results are copied across once more, plugins' ``around_app``
    contexts are not entered in the children (their ``decorate`` hooks are), and streaming
    calls still run on the worker's threads.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(default=1, ge=1, le=1024)
    executor: Literal["auto", "thread", "process"] = "auto"


class PoolOptions(TypedDict, total=False):
    """``ComputePool``'s keyword options as a caller gives them; the defaults and limits are
    ``PoolSpec``'s. A few are wider than the field they set: ``nodes=(min, max)``,
    ``worker=``, and ``None`` for ``image``, ``name`` and ``concurrency`` (the default)."""

    nodes: int | tuple[int, int]
    """Nodes in the pool, 1 to 4096; ``(min, max)`` starts ``min`` and autoscales between
    the two (pool/autoscale.py)."""
    accelerator: str | Accelerator | None
    """An accelerator such as ``"A100"``, ``"A100:8"`` or ``sky.accelerators.A100(count=8)``
    (the same request as a value); passed to the provider, plugins and ``InstanceInfo`` as
    its string."""
    vcpus: float | None
    """At least this many CPUs per node; ``None`` leaves it to the provider."""
    memory_gb: float | None
    """At least this much memory per node; ``None`` leaves it to the provider."""
    allocation: AllocationStrategy | None
    """``"spot"``, ``"on-demand"``, ``"spot-if-available"`` or ``"cheapest"``."""
    max_hourly_cost: float | None
    """USD per hour: a pool whose estimated price is above it is refused before anything is
    created."""
    image: Image | None
    """What every worker needs (``sky.Image()`` when ``None``)."""
    plugins: Sequence[Plugin]
    """Plugins, first = outermost ``around_app``."""
    workers_per_node: int | Literal["gpus"]
    """Worker processes on each node (1 to 256), each its own rank with its own
    ``instance_info()``; ``"gpus"``: one per GPU of the node (needs ``accelerator``)."""
    concurrency: int | None
    """Calls at once per worker."""
    worker: Worker | None
    """``sky.Worker(concurrency=N, executor=...)``: concurrency and where calls run."""
    name: str | None
    """The pool's name, in tags and progress; ``None`` makes ``"pool-<6 hex digits>"``."""
    provision_timeout: float
    """Seconds to make the machines: create, boot, connect, bootstrap."""
    start_timeout: float
    """Seconds for every worker to be ready (plugins included) once the machines exist."""
    shutdown_timeout: float
    """Seconds workers get to leave their plugins' contexts before they are killed."""
    hang_timeout: float | None
    """Gang pools (jax): seconds ranks may stay blocked in a collective the others left
    before the call fails with ``CollectiveHang``; ``None``: never."""
    default_compute_timeout: float | None
    """Seconds every call may run once sent, unless it has its own ``timeout``; ``None``:
    no bound."""
    autoscale_cooldown: float
    """``nodes=(min, max)``: seconds calls wait in the queue before nodes are added, and
    at least between two additions."""
    autoscale_idle_timeout: float
    """``nodes=(min, max)``: seconds a node stays idle before it is released (never below
    ``min``)."""
    reconcile_tick_interval: float | None
    """``nodes=(min, max)``: seconds between two looks of the autoscaler at the queue and
    the idle nodes (``None``: a quarter of the shorter of ``autoscale_cooldown`` and
    ``autoscale_idle_timeout``, within 0.02 to 1 s). A fixed-size pool has nothing to look
    at: a lost node is seen on its link at once, with no polling."""
    console: ConsoleMode
    """Progress display while nodes come up: ``"auto"``, ``"rich"``, ``"plain"`` or
    ``"off"``."""
    output: OutputMode
    """Whose prints are shown: ``"all"``, ``"head"`` (node 0) or ``"none"``."""
    quiet: bool
    """The older spelling of ``console="off"``."""
    volumes: Sequence[Volume]
    """Object storage (``sky.Volume``) mounted on every node before its workers start."""
    selection: Literal["first", "cheapest"]
    """With several ``sky.Spec``: try them in the order given, or cheapest first."""
    logging: LogConfig | bool | None
    """``sky.LogConfig(level=, file=, console=)``: handlers on the standard ``skyward``
    logger while the pool is open; ``True`` is ``LogConfig()``; ``None``/``False``: none
    added (the program's own logging configuration decides)."""
    keep_warm: float
    """Seconds a cloud pool's machines stay after ``close()``, their workers stopped, for
    the next pool of the same provider, spec and node count to adopt (it starts in about
    a local pool's time); the machines bill meanwhile, and end themselves when the time
    runs out. 0 (the default): destroyed at close."""


# skyward 0.5's pool options that have no counterpart here, and what to write instead: a
# program moved over is told, not met with a bare "unexpected keyword argument".
FROM_05: dict[str, str] = {
    "architecture": "the catalog's machines are all x86_64: leave it out",
    "ttl": (
        "cloud machines shut themselves down once the client has been gone for the "
        "provider's idle_timeout, as in sky.AWS(idle_timeout=600)"
    ),
    "ssh_timeout": (
        "the cloud providers' boot_timeout bounds the wait for SSH (sky.AWS(boot_timeout=...)), "
        "and provision_timeout the whole start"
    ),
    "ssh_retry_interval": "leave it out: SSH is retried until boot_timeout on its own",
    "provision_retry_delay": (
        "leave it out: a pool tries each place its allocation allows (zone, type, market) "
        "once, within provision_timeout"
    ),
    "max_provision_attempts": (
        "leave it out: a pool tries each place its allocation allows (zone, type, market) "
        "once, within provision_timeout"
    ),
}

# Options whose None means "the default" though their field takes no None: ComputePool has
# always accepted these, and the signature shows the afresh-made ones so.
_NONE_MEANS_DEFAULT = ("image", "name", "concurrency")


class PoolSpec(BaseModel):
    """A pool's validated configuration; plugins' ``transform`` hooks receive it.

    skyward 0.5's form, with no provider, is a spec not yet resolved against one; ``region``
    is then the provider's region, set when it is resolved::

        >>> spec = PoolSpec(
        ...     nodes=4,
        ...     accelerator=sky.accelerators.H100(),
        ...     region="us-east-1",
        ...     allocation="spot-if-available",
        ...     image=sky.Image(pip=["torch"]),
        ... )
        >>> spec.provider is None
        True
        >>> spec.resolve(sky.AWS()).provider.region
        'us-east-1'

    A pool never holds an unresolved spec: ``ComputePool`` makes its own from its options,
    with its provider (``sky.Local()`` when none is given).

    ``provision_timeout`` bounds making the machines ready to run workers (creating,
    booting, connecting, bootstrapping); ``start_timeout`` bounds the workers, once the
    machines exist, from spawn to ``Ready`` (their plugins' ``around_app`` included).
    ``hang_timeout``, in a gang pool (jax), is how long ranks may stay blocked in a collective
    that the other ranks have left before the call fails with ``CollectiveHang`` (``None``:
    never).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    # None: not resolved yet (skyward 0.5's PoolSpec(...) form; see resolve()).
    provider: Any = None
    # The provider's region when the spec is resolved (0.5 put it on the spec).
    region: str | None = Field(default=None, min_length=1)
    # The most nodes; with nodes=(min, max), min_nodes is where the pool starts and the
    # least it keeps (autoscaling, pool/autoscale.py).
    # Counts and timeouts are numbers, not strings that look like them: nodes="4" is a
    # mistake to name (a TOML value in quotes, a CLI argument passed on unconverted).
    nodes: int = Field(strict=True, default=1, ge=1, le=4096)
    min_nodes: int | None = Field(strict=True, default=None, ge=1)
    vcpus: float | None = Field(strict=True, default=None, gt=0)
    memory_gb: float | None = Field(strict=True, default=None, gt=0)
    allocation: AllocationStrategy | None = None
    max_hourly_cost: float | None = Field(strict=True, default=None, gt=0)
    accelerator: str | None = Field(default=None, min_length=1)
    image: Image = Field(default_factory=Image)
    plugins: tuple[Plugin, ...] = ()
    # "gpus": one per GPU, resolved from each node's GPU count once the machines exist.
    workers_per_node: int | Literal["gpus"] = Field(default=1)
    concurrency: int = Field(strict=True, default=1, ge=1, le=1024)
    executor: Literal["thread", "process"] = "thread"
    name: str = Field(default_factory=lambda: f"pool-{secrets.token_hex(3)}", min_length=1)
    provision_timeout: float = Field(strict=True, default=1800.0, gt=0, le=_MAX_SECONDS)
    start_timeout: float = Field(strict=True, default=120.0, gt=0, le=_MAX_SECONDS)
    shutdown_timeout: float = Field(strict=True, default=10.0, gt=0, le=_MAX_SECONDS)
    hang_timeout: float | None = Field(strict=True, default=60.0, gt=0, le=_MAX_SECONDS)
    # None: a call runs as long as it takes. A default bound would kill the long training
    # call that is this library's main use, on a node that is healthy; set one per pool or
    # per function where a call that runs long means something is wrong.
    default_compute_timeout: float | None = Field(strict=True, default=None, gt=0, le=_MAX_SECONDS)
    # skyward 0.5's defaults: long enough that a burst of short calls is served by the
    # nodes there are, short enough that machines billed by the second are let go soon.
    autoscale_cooldown: float = Field(strict=True, default=30.0, gt=0, le=_MAX_SECONDS)
    autoscale_idle_timeout: float = Field(strict=True, default=60.0, gt=0, le=_MAX_SECONDS)
    # skyward 0.5's reconciler tick: here only the autoscaler ticks (pool/autoscale.py).
    reconcile_tick_interval: float | None = Field(strict=True, default=None, gt=0, le=_MAX_SECONDS)
    console: ConsoleMode = "auto"
    output: OutputMode = "all"
    quiet: bool = False  # the older spelling of console="off"; kept working
    volumes: tuple[Volume, ...] = ()
    selection: Literal["first", "cheapest"] = "first"
    logging: LogConfig | None = None
    keep_warm: float = Field(default=0.0, ge=0, le=_MAX_SECONDS, allow_inf_nan=False)
    # The least CUDA the image may name, from accelerator=Custom(..., cuda_min=).
    cuda_min: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _none_means_the_default(cls, options: Any) -> Any:
        if not isinstance(options, dict):
            return options
        return {
            key: value
            for key, value in options.items()
            if value is not None or key not in _NONE_MEANS_DEFAULT
        }

    @model_validator(mode="before")
    @classmethod
    def _worker(cls, options: Any) -> Any:
        """``worker=sky.Worker(...)`` (skyward 0.5) sets ``concurrency`` and ``executor``."""
        if not isinstance(options, dict):
            return options
        worker = options.get("worker")
        options = {k: v for k, v in options.items() if k != "worker"}
        if worker is None:
            return options
        if not isinstance(worker, Worker):
            raise ValueError(f"worker must be a sky.Worker, not {type(worker).__name__}")
        given = options.get("concurrency")
        if given is not None and given != worker.concurrency:
            raise ValueError(
                f"concurrency={given} contradicts worker=Worker(concurrency="
                f"{worker.concurrency}); give one of them"
            )
        executor = "process" if worker.executor == "process" else "thread"
        return {**options, "concurrency": worker.concurrency, "executor": executor}

    @model_validator(mode="before")
    @classmethod
    def _nodes_the_machine_has(cls, options: Any) -> Any:
        """No ``nodes`` given: a provider whose accelerator comes as several hosts (a Cloud
        TPU slice) says how many (``default_nodes``); else the default, 1."""
        if not isinstance(options, dict) or options.get("nodes") is not None:
            return options
        default = getattr(options.get("provider"), "default_nodes", None)
        accelerator = options.get("accelerator")
        if not callable(default) or accelerator is None:
            return options
        nodes = default(str(accelerator))
        return {**options, "nodes": nodes} if isinstance(nodes, int) else options

    @model_validator(mode="before")
    @classmethod
    def _node_range(cls, options: Any) -> Any:
        nodes = options.get("nodes") if isinstance(options, dict) else None
        if isinstance(nodes, tuple | list):
            if len(nodes) != 2 or not all(isinstance(n, int) for n in nodes):
                raise ValueError(f"nodes must be a count or (min, max), not {nodes!r}")
            low, high = nodes
            if not 1 <= low <= high:
                raise ValueError(f"nodes=(min, max) needs 1 <= min <= max, not {nodes!r}")
            options = {**options, "nodes": high, "min_nodes": low}
        elif isinstance(options, dict):
            given = [k for k in ("autoscale_cooldown", "autoscale_idle_timeout") if k in options]
            if given:
                raise ValueError(
                    f"{given[0]} applies to an autoscaling pool, nodes=(min, max); this one "
                    f"has a fixed nodes={nodes or 1}. Give nodes=(min, max), or leave "
                    f"{given[0]} out"
                )
        return options

    @model_validator(mode="after")
    def _can_autoscale(self) -> PoolSpec:
        if not self.autoscaling:
            return self
        asked = f"nodes=({self.min_nodes}, {self.nodes})"
        if self.workers_per_node != 1:
            raise ValueError(
                f"{asked}: an autoscaling pool runs one worker per node, so it adds and "
                f"releases whole workers with their machines; workers_per_node="
                f"{self.workers_per_node!r} cannot go with it. Give a fixed count, "
                f"nodes={self.nodes}, or leave workers_per_node out"
            )
        gang = [p.name for p in self.plugins if p.gang]
        if gang:
            raise ValueError(
                f"{asked}: plugin {', '.join(gang)} ties every node into one runtime that "
                f"no node can join or leave while it runs, so this pool cannot grow or "
                f"shrink. Give a fixed count, nodes={self.nodes} or nodes={self.min_nodes}"
            )
        if self.provider is not None and not getattr(self.provider, "grows", False):
            raise ValueError(
                f"{asked}: provider {self.provider_kind} cannot add or release machines "
                f"while a pool runs, so this pool cannot autoscale. Give a fixed count, "
                f"nodes={self.nodes} or nodes={self.min_nodes}, or use a provider that "
                f"can (sky.Local, sky.SSH)"
            )
        return self

    @model_validator(mode="after")
    def _quiet_means_console_off(self) -> PoolSpec:
        if self.quiet and self.console not in ("auto", "off"):
            raise ValueError(f"quiet=True means console='off'; it contradicts {self.console=}")
        return self

    @field_validator("workers_per_node", mode="before")
    @classmethod
    def _workers_per_node(cls, value: Any) -> Any:
        if value == "gpus" or (type(value) is int and 1 <= value <= 256):
            return value
        raise ValueError(f"workers_per_node must be 1 to 256, or 'gpus'; not {value!r}")

    @model_validator(mode="after")
    def _gpus_need_an_accelerator(self) -> PoolSpec:
        if self.workers_per_node == "gpus" and self.accelerator is None:
            raise ValueError(
                "workers_per_node='gpus' runs one worker per GPU, but this pool asks for no "
                "accelerator; give accelerator= (such as 'A100'), or a number of workers"
            )
        return self

    @field_validator("logging", mode="before")
    @classmethod
    def _logging(cls, logging: Any) -> Any:
        """skyward 0.5's ``logging=True`` / ``False``."""
        if logging is True:
            return LogConfig()
        return None if logging is False else logging

    @model_validator(mode="before")
    @classmethod
    def _cuda_min(cls, options: Any) -> Any:
        """``accelerator=Custom(..., cuda_min=)`` keeps its CUDA bound, which its string
        form has no room for (checked against the image in ``apply_transforms``)."""
        if not isinstance(options, dict):
            return options
        bound = getattr(options.get("accelerator"), "cuda_min", None)
        return options if bound is None else {**options, "cuda_min": bound}

    @field_validator("accelerator", mode="before")
    @classmethod
    def _accelerator(cls, accelerator: Any) -> Any:
        """``sky.accelerators.A100(count=8)`` is the request ``"A100:8"``."""
        if isinstance(accelerator, Accelerator):
            return str(accelerator)
        if accelerator is not None and not isinstance(accelerator, str):
            raise ValueError(
                f"accelerator is a name such as 'A100:8' or sky.accelerators.A100(count=8), "
                f"not {type(accelerator).__name__}"
            )
        return accelerator

    @field_validator("provider")
    @classmethod
    def _provider(cls, provider: Any) -> Any:
        if provider is not None and not isinstance(provider, Provider):
            raise ValueError(
                f"expected a provider such as sky.Local(), not {type(provider).__name__}"
            )
        return provider

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, volumes: tuple[Volume, ...]) -> tuple[Volume, ...]:
        return check_volumes(volumes)

    @field_validator("plugins")
    @classmethod
    def _unique(cls, plugins: tuple[Plugin, ...]) -> tuple[Plugin, ...]:
        names = [p.name for p in plugins]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"plugin {name!r} is listed more than once")
        return plugins

    @property
    def provider_kind(self) -> str:
        return "unresolved" if self.provider is None else str(self.provider.kind)

    def resolve(self, provider: Provider) -> PoolSpec:
        """This spec with ``provider``, given ``region`` when the spec names one (a
        ``ValueError`` if the provider has another region, or none to set)."""
        if self.region is not None:
            if not isinstance(provider, BaseModel) or "region" not in type(provider).model_fields:
                raise ValueError(
                    f"PoolSpec(region={self.region!r}): provider {provider.kind} has no "
                    f"region; leave region out"
                )
            theirs = getattr(provider, "region", None)
            if theirs is not None and theirs != self.region:
                raise ValueError(
                    f"PoolSpec(region={self.region!r}) contradicts the provider's "
                    f"region={theirs!r}; give one of them"
                )
            provider = type(provider).model_validate(
                {**provider.model_dump(exclude_unset=True), "region": self.region}
            )
        given = {field: getattr(self, field) for field in self.model_fields_set}
        return PoolSpec.model_validate(
            {**given, "name": self.name, "provider": provider, "region": None}
        )

    @property
    def autoscaling(self) -> bool:
        """``nodes=(min, max)`` with ``min < max``: the pool grows and shrinks between them."""
        return self.min_nodes is not None and self.min_nodes < self.nodes

    @property
    def initial_nodes(self) -> int:
        """How many nodes the pool starts with: ``min`` of a range, else ``nodes``."""
        return self.min_nodes if self.autoscaling and self.min_nodes else self.nodes

    @property
    def gang(self) -> list[str]:
        """Plugins that tie every worker into one runtime (jax, torch), when there are
        several workers: a worker lost is every worker lost, and a broadcast runs on one
        generation."""
        several = self.nodes > 1 or self.workers_per_node != 1
        return [p.name for p in self.plugins if p.gang] if several else []

    def request(self, image: Image) -> ProvisionRequest:
        """What the provider is asked for, with a fresh ``provision_timeout`` deadline."""
        return ProvisionRequest(
            pool=self.name,
            nodes=self.initial_nodes,
            max_nodes=self.nodes if self.autoscaling else None,
            accelerator=self.accelerator,
            image=image,
            tags=identity_tags(self.name),
            vcpus=self.vcpus,
            memory_gb=self.memory_gb,
            allocation=self.allocation,
            max_hourly_cost=self.max_hourly_cost,
            volumes=self.volumes,
            gang=tuple(p.name for p in self.plugins if p.gang) if self.nodes > 1 else (),
            keep_warm=self.keep_warm,
            deadline=Deadline(
                self.provision_timeout, f"provision_timeout ({self.provision_timeout:g} s)"
            ),
        )


def pool_signature() -> inspect.Signature:
    """``ComputePool(...)`` as ``help()`` and notebooks show it: ``provider``, then every
    option with its type and ``PoolSpec``'s default."""
    provider = inspect.Parameter(
        "provider",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=None,
        annotation="Provider | Spec | None",
    )
    # More sky.Spec to fall back to (pool/fallback.py).
    specs = inspect.Parameter("specs", inspect.Parameter.VAR_POSITIONAL, annotation="Spec")
    return keyword_signature(PoolOptions, PoolSpec, before=[provider, specs])


def apply_transforms(image: Image, spec: PoolSpec) -> Image:
    """Run every plugin's ``transform`` in list order, each followed by its ``bootstrap``
    steps (added to the image's ``setup``); wrap foreign failures in PluginError."""
    for plugin in spec.plugins:
        if plugin.transform is not None:
            try:
                result = plugin.transform(image, spec)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(f"plugin {plugin.name!r}: transform failed: {exc}") from exc
            if not isinstance(result, Image):
                raise PluginError(
                    f"plugin {plugin.name!r}: transform must return an Image, "
                    f"not {type(result).__name__}"
                )
            image = result
        image = _add_bootstrap(image, plugin, spec)
    _check_cuda(image, spec)
    return _with_nvml(image, spec)


_CUDA_TAG = re.compile(r"(?<![a-z])cu(\d{2})(\d)(?!\d)|cuda-?(\d{2})(?!\d)", re.IGNORECASE)


def image_cuda(image: Image) -> tuple[int, int | None] | None:
    """The CUDA version the image's packages are built for, where they name one: PyTorch's
    wheel tags (``cu126`` in an index URL or a requirement) or jax's extras (``cuda12``,
    major only); the lowest when several do; None when none does."""
    texts = [*image.pip, *(i.url for i in image.pip_indexes), image.index_url or ""]
    found: list[tuple[int, int | None]] = []
    for text in texts:
        for match in _CUDA_TAG.finditer(text):
            if match[1]:
                found.append((int(match[1]), int(match[2])))
            else:
                found.append((int(match[3]), None))
    return min(found, key=lambda v: (v[0], v[1] or 0)) if found else None


def _check_cuda(image: Image, spec: PoolSpec) -> None:
    if spec.cuda_min is None:
        return
    found = image_cuda(image)
    if found is None:
        return  # nothing in the image pins CUDA: the node's driver decides
    major, _, minor = spec.cuda_min.partition(".")
    wanted = (int(major), int(minor or 0))
    if found[0] < wanted[0] or (found[1] is not None and found < wanted):
        have = f"{found[0]}.{found[1]}" if found[1] is not None else f"{found[0]}"
        raise ValueError(
            f"accelerator {spec.accelerator} needs CUDA {spec.cuda_min} or newer "
            f"(cuda_min), but the image's packages are built for CUDA {have}; give the "
            f"plugin a newer build (sky.plugins.torch(cuda='{wanted[0]}.{wanted[1]}')) or "
            f"lower cuda_min"
        )


# NVIDIA's GPUs by name (the catalog's, the marketplaces' RTX cards, Grace Hopper/Blackwell):
# only they have NVML. A TPU ("v5e"), AMD's MI300X, AWS's Neuron chips or a Custom name get
# no nvidia-ml-py (a user who wants it there adds it to the image).
_NVIDIA = re.compile(r"^(?:[ABHLTVP]\d|A10G|L40S|RTX_|GH\d|GB\d)")


def _with_nvml(image: Image, spec: PoolSpec) -> Image:
    """GPU metrics asked for by name (``metrics=[sky.metrics.GPU(), ...]``) on a remote pool
    with NVIDIA GPUs read NVML through ``nvidia-ml-py``, which the image then installs. The
    default metrics install nothing: they read GPUs where the node has it already (a pool's
    image is not changed behind its back). A CPU pool, another accelerator, or a local pool
    (the client's own environment, never changed) gets nothing, and sends no GPU values."""
    asked = image.metrics is not None and image.metrics != default_metrics()
    wants = asked and any(m.kind in GPU_KINDS for m in image.metrics or ())
    accelerator = spec.accelerator
    if not wants or accelerator is None or not _NVIDIA.match(accelerator):
        return image
    if spec.provider is None or spec.provider_kind == "local":
        return image
    return image.with_pip("nvidia-ml-py")


def _add_bootstrap(image: Image, plugin: Plugin, spec: PoolSpec) -> Image:
    try:
        steps = plugin.bootstrap_steps(spec)
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(f"plugin {plugin.name!r}: bootstrap failed: {exc}") from exc
    if not steps:
        return image
    if spec.provider_kind == "local":
        # Its nodes are processes on this machine, run by the client's own interpreter:
        # running a plugin's shell steps here would change the user's machine.
        raise PluginError(
            f"plugin {plugin.name!r} adds bootstrap steps, which prepare a remote node before "
            f"its worker starts; the local pool's nodes are this machine, which Skyward does "
            f"not change. Run them here yourself ({'; '.join(steps)}) and leave the plugin "
            f"out of local pools, or use a remote provider (sky.SSH, a cloud)"
        )
    return image.model_copy(update={"setup": (*image.setup, *steps)})


def pickle_plugins(plugins: tuple[Plugin, ...]) -> proto.Parts:
    """The plugins as the workers receive them; ``PluginError`` names one that cannot go."""
    workers = [plugin.for_workers() for plugin in plugins]  # the client's hooks stay here
    for plugin in workers:
        try:
            proto.dumps(plugin)
        except Exception as exc:
            raise PluginError(
                f"plugin {plugin.name!r} cannot be pickled, so it cannot reach the workers: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return proto.dumps(workers)
