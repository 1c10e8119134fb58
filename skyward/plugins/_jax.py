"""``sky.plugins.jax()``: the right jax on every node, and one distributed runtime across them.

On the client (``transform``): picks the jax requirement for the pool's accelerator (CUDA
wheels on NVIDIA GPUs, TPU wheels on TPUs, plain jax otherwise), optionally scoped to an
index of the user's, and sets the environment every worker needs *before* it imports jax:
CPU device count, and NVIDIA's GPU performance defaults.

On every worker (``around_app``): ``jax.distributed.initialize`` from ``instance_info()``,
once, with timeouts short enough that a missing or dead rank fails the pool in seconds, and a
bounded ``jax.distributed.shutdown`` when the worker leaves. CPU collectives (gloo) listen on
and advertise the node's pool address, not whatever its hostname resolves to. Nothing here
imports jax on the client.
"""

from __future__ import annotations

import inspect
import ipaddress
import os
import re
import shlex
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Literal, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field

from skyward._errors import PluginError
from skyward._image import Image, PipIndex
from skyward._info import InstanceInfo, worker_label
from skyward._plugin import Plugin
from skyward.client.options import keyword_signature, leading, refuse_unknown
from skyward.plugins._jax_output import GlooFilter, quiet_when_stopped
from skyward.worker import hooks

if TYPE_CHECKING:
    from skyward.pool.spec import PoolSpec

Platform = Literal["cpu", "cuda", "tpu"]

# Extras that jax itself declares (Provides-Extra in its metadata, checked by a test against
# the installed jax): cuda12/cuda13 pull NVIDIA's CUDA wheels, tpu pulls libtpu.
CUDA_EXTRAS = {12: "cuda12", 13: "cuda13"}
TPU_EXTRA = "tpu"
DEFAULT_CUDA = 12  # runs on every driver from 525 on; CUDA 13 needs driver 580+

# What NVIDIA's JAX containers set by default, plus what their performance guide pairs with
# it on Hopper. Only flags that exist in current XLA: an unknown flag in XLA_FLAGS kills the
# process at backend start, and the async-collective flags older guides list are gone
# (async collectives are on by default now).
GPU_XLA_FLAGS: dict[str, str] = {
    "--xla_gpu_enable_latency_hiding_scheduler": "true",
}
GPU_ENV: dict[str, str] = {
    # One hardware queue: XLA already orders its launches, and this lets compute and
    # collectives overlap as the latency-hiding scheduler planned.
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "NCCL_PROTO": "SIMPLE,LL,LL128",
}
# Blackwell is slower with one connection, per NVIDIA's guide; it gets CUDA graphs instead.
_BLACKWELL = re.compile(r"^(B|GB)\d", re.IGNORECASE)
_BLACKWELL_XLA_FLAGS = {"--xla_gpu_enable_command_buffer": "FUSION,CUSTOM_CALL"}

_TPU = re.compile(r"^(TPU|V[2-6][A-Z]*|TRILLIUM)([-:].*)?$", re.IGNORECASE)
_NOT_JAX = re.compile(r"^(TRAINIUM|INFERENTIA|TRN|INF|GAUDI|MI\d+)", re.IGNORECASE)


_DAY = 24 * 3600


class JaxOptions(TypedDict, total=False):
    """``sky.plugins.jax()``'s options as a caller gives them; the defaults and limits are
    ``_Options``'s, and ``jax()``'s docstring says what each does."""

    version: str | None
    cuda: str | int | None
    index_url: str | None
    find_links: bool | None
    cpu_devices: int | None
    gpu_defaults: bool
    initialization_timeout: int
    heartbeat_timeout: int
    shutdown_timeout: int
    verbose: bool


class _Options(BaseModel):
    """The plugin's options, checked when it is made: a wrong type or range is a
    ``ValidationError`` naming the option, before any pool exists. The only home of their
    defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, title="sky.plugins.jax")

    version: str | None = Field(default=None, min_length=1)
    cuda: str | int | None = None
    index_url: str | None = Field(default=None, min_length=1)
    find_links: bool | None = None
    cpu_devices: int | None = Field(default=None, ge=1, le=4096)
    gpu_defaults: bool = True
    # jax.distributed takes whole seconds.
    initialization_timeout: int = Field(default=45, ge=1, le=_DAY)
    heartbeat_timeout: int = Field(default=15, ge=1, le=_DAY)
    shutdown_timeout: int = Field(default=5, ge=1, le=_DAY)
    verbose: bool = False


def jax(cuda: str | int | None = None, /, **options: Unpack[JaxOptions]) -> Plugin:
    """The jax plugin. ``cuda`` may be given by position, as skyward 0.5 did:
    ``sky.plugins.jax("cu124")``.

    - ``version``: pin jax (``"0.10.2"``) or constrain it (``">=0.6,<0.11"``); default, the
      newest the index has.
    - ``cuda``: CUDA major on NVIDIA pools: ``12``, ``"13"``, ``"cu124"``, ``"cuda12"`` all
      work; default 12. jax publishes one wheel per CUDA major, so minors map to it.
    - ``index_url``: where to get jax from, used for jax's own packages only.
    - ``find_links``: whether ``index_url`` is a find-links page (such as JAX's release
      pages) rather than an index; by default, when it ends in ``.html``.
    - ``cpu_devices``: give each node this many CPU devices (``JAX_NUM_CPU_DEVICES``), so
      sharded code runs on a laptop exactly as it will on GPUs.
    - ``gpu_defaults``: on NVIDIA pools, set NVIDIA's performance defaults (``XLA_FLAGS``
      latency-hiding scheduler, ``CUDA_DEVICE_MAX_CONNECTIONS=1``, ``NCCL_PROTO``); your own
      ``XLA_FLAGS`` and variables win.
    - ``initialization_timeout``, ``heartbeat_timeout``, ``shutdown_timeout``: seconds, passed
      to ``jax.distributed.initialize``. A rank that never arrives fails the pool's start after
      about ``initialization_timeout + 5``; one that dies is detected by the others within
      ``heartbeat_timeout`` (jax's own defaults are 300 and 100).
    - ``verbose``: show everything JAX writes. By default gloo's ``[Gloo] Rank N is
      connected to ...`` lines are dropped, and when the pool stops ranks in the middle of a
      call (Ctrl-C, ``close(wait=False)``), what JAX logs while it stops (the coordination
      service's fatal errors and stack traces) goes to a file on each node instead of your
      terminal; node 0 says so in one line.
    """
    refuse_unknown(options, JaxOptions, "jax")
    if cuda is not None:
        if "cuda" in options:
            raise TypeError("jax() got cuda both by position and by keyword; give it once")
        options = {**options, "cuda": cuda}
    chosen = _Options.model_validate(options)  # only what the caller gave
    # The hooks below travel to every worker: they close over plain values, not the model.
    version, cuda, index_url = chosen.version, chosen.cuda, chosen.index_url
    find_links, cpu_devices, verbose = chosen.find_links, chosen.cpu_devices, chosen.verbose
    gpu_defaults = chosen.gpu_defaults
    timeouts = chosen.model_dump(
        include={"initialization_timeout", "heartbeat_timeout", "shutdown_timeout"}
    )
    major = _cuda_major(cuda) if cuda is not None else None

    def transform(image: Image, spec: PoolSpec) -> Image:
        platform = accelerator_platform(spec.accelerator)
        requirement, packages = jax_requirement(platform, major or DEFAULT_CUDA, version)
        indexes: tuple[PipIndex, ...] = ()
        if index_url:
            links = index_url.endswith(".html") if find_links is None else find_links
            indexes = (PipIndex(url=index_url, packages=packages, find_links=links),)
        image = image.with_pip(requirement, indexes=indexes)
        env: dict[str, str] = {}
        if cpu_devices is not None:
            preset = image.env.get("JAX_NUM_CPU_DEVICES")
            if preset is not None and preset != str(cpu_devices):
                raise PluginError(
                    f"jax plugin: cpu_devices={cpu_devices} but the image sets "
                    f"JAX_NUM_CPU_DEVICES={preset}; keep one of the two"
                )
            env["JAX_NUM_CPU_DEVICES"] = str(cpu_devices)
        if platform == "cuda" and gpu_defaults:
            env.update(gpu_environment(spec.accelerator or "", image.env))
        return image.with_env(env)

    @contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        for name, value in efa_environment().items():
            os.environ.setdefault(name, value)  # before NCCL starts; the user's own win
        with ExitStack() as stack:
            if not verbose and info.total_workers > 1:
                stack.enter_context(hooks.stdout_filter(GlooFilter()))
                stack.enter_context(quiet_when_stopped(info))
            stack.enter_context(distributed(info, **timeouts))
            yield

    return Plugin(name="jax", transform=transform, around_app=around_app, gang=True)


# help() and notebooks show every option with _Options' default.
jax.__signature__ = keyword_signature(  # type: ignore[attr-defined]
    JaxOptions,
    _Options,
    before=[leading("cuda", _Options)],
    returns=Plugin,
)


def efa_environment(sys_root: str = "/sys") -> dict[str, str]:
    """What NCCL's libfabric plugin (aws-ofi-nccl, on AWS's Deep Learning AMIs) needs to run
    collectives over EFA, when this node has an EFA device; nothing otherwise.

    An EFA device is an RDMA device whose driver is ``efa``. ``FI_PROVIDER=efa`` keeps
    libfabric from choosing the TCP provider, and ``FI_EFA_USE_DEVICE_RDMA=1`` lets it use
    the device's RDMA reads (p4d, p5 and later), as AWS's EFA guide for NCCL sets them.
    """
    devices = os.path.join(sys_root, "class", "infiniband")
    try:
        names = os.listdir(devices)
    except OSError:
        return {}
    for name in names:
        driver = os.path.join(devices, name, "device", "driver")
        if os.path.basename(os.path.realpath(driver)) == "efa":
            return {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}
    return {}


def accelerator_platform(accelerator: str | None) -> Platform:
    """Which jax build an accelerator needs: ``"cpu"``, ``"cuda"`` or ``"tpu"``."""
    if accelerator is None or accelerator.lower() == "cpu":
        return "cpu"
    if _TPU.match(accelerator):
        return "tpu"
    if _NOT_JAX.match(accelerator):
        raise PluginError(
            f"jax plugin: no jax build on PyPI runs on {accelerator!r}; use an NVIDIA GPU, a "
            f"TPU or CPU nodes, or install a vendor build through Image(pip=...) yourself"
        )
    return "cuda"  # every other accelerator name a provider accepts is an NVIDIA GPU


def jax_requirement(
    platform: Platform, cuda_major: int, version: str | None
) -> tuple[str, tuple[str, ...]]:
    """The pip requirement for jax on ``platform``, and the packages an index for it serves."""
    pin = ""
    if version:
        # "0.10.2" pins; a specifier (">=0.6,<0.11") is kept as the user wrote it.
        pin = version if version.lstrip()[:1] in "<>=!~" else f"=={version}"
    if platform == "cuda":
        extra = CUDA_EXTRAS[cuda_major]
        packages = ("jax", "jaxlib", f"jax-cuda{cuda_major}-plugin", f"jax-cuda{cuda_major}-pjrt")
        return f"jax[{extra}]{pin}", packages
    if platform == "tpu":
        return f"jax[{TPU_EXTRA}]{pin}", ("jax", "jaxlib", "libtpu")
    return f"jax{pin}", ("jax", "jaxlib")


def _cuda_major(cuda: str | int) -> int:
    text = str(cuda).strip().lower()
    match = re.fullmatch(r"(?:cu|cuda)?(\d+)(?:\.\d+)?", text)
    if match:
        digits = match.group(1)
        # "cu124" / "cu130" are major+minor run together, as in PyTorch's wheel tags.
        major = int(digits[:2]) if len(digits) >= 3 else int(digits)
        if major in CUDA_EXTRAS:
            return major
    supported = ", ".join(str(m) for m in CUDA_EXTRAS)
    raise PluginError(
        f"jax plugin: cuda={cuda!r} is not a CUDA version jax publishes wheels for; "
        f"use one of {supported} (or 'cu124'-style tags for them)"
    )


def gpu_environment(accelerator: str, env: Mapping[str, str]) -> dict[str, str]:
    """NVIDIA's defaults merged under what ``env`` already sets (the user's values win)."""
    flags: dict[str, str | None] = dict(GPU_XLA_FLAGS)
    out = dict(GPU_ENV)
    if _BLACKWELL.match(accelerator):
        flags.update(_BLACKWELL_XLA_FLAGS)
        del out["CUDA_DEVICE_MAX_CONNECTIONS"]
    flags.update(_parse_flags(env.get("XLA_FLAGS", "")))
    out["XLA_FLAGS"] = " ".join(f"{k}={v}" if v is not None else k for k, v in flags.items())
    return {key: value for key, value in out.items() if key == "XLA_FLAGS" or key not in env}


def _parse_flags(text: str) -> dict[str, str | None]:
    parsed: dict[str, str | None] = {}
    for token in shlex.split(text):
        name, eq, value = token.partition("=")
        parsed[name] = value if eq else None
    return parsed


@contextmanager
def distributed(
    info: InstanceInfo,
    *,
    initialization_timeout: int,
    heartbeat_timeout: int,
    shutdown_timeout: int,
) -> Iterator[None]:
    """``jax.distributed`` for the life of the block on a pool of several workers (one
    process each: ``global_worker_index`` of ``total_workers``); nothing on one worker.

    With several workers per node each owns some of the node's GPUs (``info.devices``, and
    only those are visible to it): ``local_device_ids`` names them, as JAX's guide does for
    one process per GPU.

    Idempotent: if something already initialized the runtime in this process, it is left as
    it is, and not shut down here either.
    """
    if info.total_workers == 1:
        yield
        return
    _refuse_unreachable_head(info)
    import jax as jax_module

    if jax_module.distributed.is_initialized():
        yield
        return
    address = f"{_host(info.head_addr)}:{info.head_port}"
    deadline = time.monotonic() + initialization_timeout
    rank = info.global_worker_index
    # Visible to this worker are its own GPUs only (CUDA_VISIBLE_DEVICES), numbered from 0.
    local = list(range(len(info.devices))) if info.workers_per_node > 1 and info.devices else None
    if rank == 0:
        _check_coordinator_port(info.head_port)
    else:
        _wait_for_coordinator(info.head_addr, info.head_port, initialization_timeout)
    try:
        jax_module.distributed.initialize(
            coordinator_address=address,
            num_processes=info.total_workers,
            process_id=rank,
            local_device_ids=local,
            # one budget for waiting on the coordinator and joining it, not one each
            initialization_timeout=max(1, int(deadline - time.monotonic())),
            heartbeat_timeout_seconds=heartbeat_timeout,
            shutdown_timeout_seconds=shutdown_timeout,
            # Our values, not ones guessed from Slurm/MPI/Kubernetes variables on the node.
            cluster_detection_method="deactivate",
        )
    except Exception as exc:  # JaxRuntimeError: jax's own words are kept as the cause
        role = "start the coordinator" if rank == 0 else "join the coordinator"
        who = worker_label(info.node, info.worker, info.workers_per_node)
        raise PluginError(
            f"jax plugin: {who} (rank {rank}) could not {role} at {address}: {exc}"
        ) from exc
    try:
        _cpu_collectives_on(collectives_address(info))
        yield
    finally:
        jax_module.distributed.shutdown()  # type: ignore[no-untyped-call]


def collectives_address(info: InstanceInfo) -> str:
    """The address this node's CPU collectives listen on and give their peers.

    Left to itself, gloo resolves the host's own name and advertises that; on hosts with
    Debian's and Ubuntu's default ``127.0.1.1 <hostname>`` line that is loopback, and every
    other rank's connection is refused. The pool address (``peers[node]``) is what the other
    nodes already reach this one at. When this host cannot listen on it (a name that
    resolves to loopback here, an address behind NAT), the address this host sends from
    towards its peers is the next best: it is local, and on the network they share.
    """
    spans_hosts = len(set(info.peers)) > 1
    own = info.peers[info.node]
    for address in _addresses_of(own):
        if spans_hosts and ipaddress.ip_address(address).is_loopback:
            continue
        if _can_listen_on(address):
            return address
    others = [peer for rank, peer in enumerate(info.peers) if rank != info.node]
    for peer in others:
        try:
            family = socket.AF_INET6 if ":" in peer else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((peer, info.head_port or 9))  # UDP: picks a route, sends nothing
                return str(probe.getsockname()[0])
        except OSError:
            continue
    return own  # gloo reports what it cannot do with it, at the first collective


def _addresses_of(host: str) -> list[str]:
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    return list(dict.fromkeys(str(entry[4][0]) for entry in found))


def _can_listen_on(address: str) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def _cpu_collectives_on(address: str) -> None:
    """Have jax's CPU backend, made on first use, build its gloo collectives on ``address``.

    jax makes them with ``make_gloo_tcp_collectives(distributed_client)`` and no hostname,
    and offers no option or variable for one. The documented way in is a backend factory
    (``jax.extend.backend.register_backend_factory``), allowed until the backend exists:
    ours calls jax's own ``make_cpu_client`` (every other CPU setting stays jax's) with
    collectives made on ``address``. A user who chose other collectives (``mpi``, none) keeps
    them. A jax without these hooks is left as it is.
    """
    import jax as jax_module

    try:
        from jax._src import distributed as jax_distributed
        from jax._src import xla_bridge
        from jax.extend.backend import register_backend_factory
        from jaxlib import _jax
    except ImportError:
        return
    make_cpu_client = getattr(xla_bridge, "make_cpu_client", None)
    make_collectives = getattr(_jax, "make_gloo_tcp_collectives", None)
    if make_cpu_client is None or make_collectives is None:
        return
    if "collectives" not in inspect.signature(make_cpu_client).parameters:
        return

    def cpu_client() -> object:
        client = jax_distributed.global_state.client
        chosen = getattr(jax_module.config, "jax_cpu_collectives_implementation", "gloo")
        if client is None or chosen != "gloo":
            return make_cpu_client()
        collectives = make_collectives(distributed_client=client, hostname=address)
        return make_cpu_client(collectives=collectives)

    try:
        register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)
    except RuntimeError:
        pass  # the CPU backend exists already: its collectives are made, nothing to change


def _wait_for_coordinator(host: str, port: int, timeout: float) -> None:
    """Return once node 0's coordinator accepts connections (or ``timeout`` passes).

    Every node imports jax at the same moment, and node 0 is often not the first to finish;
    a rank that calls ``initialize`` before the coordinator listens has its connection
    refused and backs off for about a second, which made a pool's start bimodal. Waiting
    here, 10 ms at a time, joins as soon as it can. If the coordinator never comes,
    ``initialize`` reports it, with its own timeout.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.01)


def _check_coordinator_port(port: int) -> None:
    """Say that the coordinator port is taken, rather than jax's "Failed to start RPC server".

    The port is the one node 0 found free when it said Hello; something may have taken it
    since. SO_REUSEADDR as gRPC sets it, so a port in TIME_WAIT is not reported as taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as exc:
            raise PluginError(
                f"jax plugin: node 0 cannot start the JAX coordinator on port {port}: "
                f"{exc.strerror} (another process holds it)"
            ) from exc


def _refuse_unreachable_head(info: InstanceInfo) -> None:
    try:
        loopback = ipaddress.ip_address(info.head_addr).is_loopback
    except ValueError:
        loopback = info.head_addr == "localhost"
    if loopback and len(set(info.peers)) > 1:
        raise PluginError(
            f"jax plugin: the coordinator address {info.head_addr} is loopback but the nodes "
            f"are on different hosts ({', '.join(info.peers)}); the other nodes could not "
            f"reach it. The provider must give node 0 an address its peers can reach."
        )


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
