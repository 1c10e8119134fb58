"""Plugins that only make sense on NVIDIA GPUs: ``sky.plugins.cuml()`` (RAPIDS cuML, with its
zero-code-change accelerator) and ``sky.plugins.mps()`` (NVIDIA's Multi-Process Service, so
several processes share a GPU).

Both refuse a pool without an accelerator when it is built: there is nothing for them to do
there, and a CPU pool that installed cuML would fail at its first import instead.

MPS with several workers per node: one control daemon per node, shared by the node's workers
through a directory of the node's own (``<tmp>/skyward-mps/<run>-node<N>``)::

    start    local worker 0 starts the daemon, unless one from this run is alive there (a
             gang restart, a replaced worker: the daemon outlived the workers it served);
             the node's other workers wait until it answers
    life     every worker holds a shared lock on ``members`` while it runs; the kernel drops
             it when the worker dies, however it dies
    stop     a leaving worker that can then take ``members`` exclusively is the node's last
             one: it tells the daemon to ``quit``; not when the pool is replacing it (a gang
             restart, ``hooks.replaced()``): the daemon is kept for the workers that come next,
             and a keeper (a process of its own) quits it should none join it in time

An exclusive lock on ``lock`` makes each start and stop one step, so a worker joining while
another leaves never meets a daemon that is being stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skyward._errors import PluginError
from skyward._image import Image, PipIndex
from skyward._info import InstanceInfo, worker_label
from skyward._plugin import Plugin
from skyward.client.options import check_version, keyword_signature, leading, pinned, validated
from skyward.worker import hooks

if TYPE_CHECKING:
    from skyward.pool.spec import PoolSpec

NVIDIA_INDEX = "https://pypi.nvidia.com"
# What ``cuml-cuXX`` pulls from NVIDIA's index: scoping the index to these keeps it from
# answering for anything else the image installs.
_RAPIDS = ("cuml", "cudf", "pylibraft", "raft-dask", "rmm", "dask-cudf", "libcuml", "libcudf")
_MPS_CONTROL = "nvidia-cuda-mps-control"
_MPS_PID_FILE = "nvidia-cuda-mps-control.pid"  # the daemon writes it in its pipe directory
# Plugins whose around_app may start CUDA: a process that starts CUDA before the MPS daemon
# runs never uses it, so mps comes before them.
_STARTS_CUDA = ("torch", "jax", "keras", "cuml")
_DAEMON_TIMEOUT = 60.0  # seconds for the daemon to start, or for a worker to see it answer
_QUIT_WAIT = 10.0  # seconds a daemon told to quit gets to exit before its directory goes
# Seconds a daemon kept through a gang restart waits for the replacement to join it before
# its keeper quits it; a replacement that comes later starts a new one.
_KEPT_FOR = 300.0
_KEEPER_SECONDS = "SKYWARD_MPS_KEEPER_SECONDS"
# Where the worker keeps the node's own CUDA_VISIBLE_DEVICES (skyward.worker.__main__), when
# it narrows the variable to the worker's GPUs: the daemon must see every GPU of the node.
_NODE_DEVICES = "SKYWARD_NODE_CUDA_VISIBLE_DEVICES"


def _needs_gpu(plugin: str, spec: PoolSpec) -> None:
    if spec.accelerator is None:
        raise PluginError(
            f"{plugin} plugin: needs NVIDIA GPUs, and this pool has no accelerator; give the "
            f"pool one (accelerator='L4', 'A100', ...) or leave the plugin out"
        )


class CumlOptions(TypedDict, total=False):
    """``sky.plugins.cuml()``'s keyword options (``cuda`` comes first, and may be
    positional); the defaults and limits are ``_CumlOptions``'s."""

    version: str | None
    accelerate: bool


class _CumlOptions(BaseModel):
    """The plugin's options, checked when it is made: a wrong value is a ``ValidationError``
    naming the option, before any pool exists. The only home of their defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, title="sky.plugins.cuml")

    cuda: str | int = 12
    version: str | None = Field(default=None, min_length=1)
    accelerate: bool = True

    _version = field_validator("version")(check_version)


def cuml(cuda: str | int = 12, **options: Unpack[CumlOptions]) -> Plugin:
    """RAPIDS cuML from NVIDIA's index.

    - ``cuda``: the CUDA major of the wheels (``12`` or ``13``; ``"cu12"`` works too).
    - ``version``: pin cuML (``"25.10"``) or constrain it.
    - ``accelerate``: turn on ``cuml.accel`` on every worker, so scikit-learn, UMAP and
      HDBSCAN code runs on the GPU unchanged.
    """
    chosen = validated(_CumlOptions, options, CumlOptions, "cuml", cuda=cuda)
    match = re.fullmatch(r"(?:cu|cuda)?(\d{2})(?:\.\d)?", str(chosen.cuda).strip().lower())
    if not match or match.group(1) not in ("12", "13"):
        raise PluginError(f"cuml plugin: cuda={cuda!r}: RAPIDS publishes wheels for CUDA 12 and 13")
    suffix = f"cu{match.group(1)}"
    requirement = pinned(f"cuml-{suffix}", chosen.version)
    accelerate = chosen.accelerate

    def transform(image: Image, spec: PoolSpec) -> Image:
        _needs_gpu("cuml", spec)
        packages = tuple(f"{name}-{suffix}" for name in _RAPIDS)
        index = PipIndex(url=NVIDIA_INDEX, packages=packages)
        return image.with_pip(requirement, indexes=(index,))

    @contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        if accelerate:
            import cuml.accel  # type: ignore[import-not-found]

            cuml.accel.install()
        yield

    return Plugin(name="cuml", transform=transform, around_app=around_app)


cuml.__signature__ = keyword_signature(  # type: ignore[attr-defined]
    CumlOptions,
    _CumlOptions,
    before=[leading("cuda", _CumlOptions)],
    returns=Plugin,
)


class MpsOptions(TypedDict, total=False):
    """``sky.plugins.mps()``'s keyword options; the defaults and limits are
    ``_MpsOptions``'s."""

    active_thread_percentage: int | None
    pinned_memory_limit: str | None


class _MpsOptions(BaseModel):
    """As ``_CumlOptions``, for mps."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, title="sky.plugins.mps")

    active_thread_percentage: int | None = Field(default=None, ge=1, le=100)
    pinned_memory_limit: str | None = Field(default=None, pattern=r"^\d+[MG]$")


def mps(**options: Unpack[MpsOptions]) -> Plugin:
    """NVIDIA's Multi-Process Service on every GPU node, for the life of the pool.

    - ``active_thread_percentage``: the share of each GPU's SMs a client may use
      (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``).
    - ``pinned_memory_limit``: device memory each client may pin on each of its GPUs, such
      as ``"16G"`` (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``).

    One control daemon per node (``nvidia-cuda-mps-control -d``), with its pipe and log
    directories private to the pool, started before any worker's code runs and told to
    ``quit`` when the node's last worker leaves (see the module docstring). Put it before
    ``torch()``, ``jax()``, ``keras()`` and ``cuml()``, whose start may touch CUDA.
    """
    chosen = validated(_MpsOptions, options, MpsOptions, "mps")
    percentage, limit = chosen.active_thread_percentage, chosen.pinned_memory_limit

    def transform(image: Image, spec: PoolSpec) -> Image:
        _needs_gpu("mps", spec)
        names = [plugin.name for plugin in spec.plugins]
        early = [name for name in names[: names.index("mps")] if name in _STARTS_CUDA]
        if early:
            raise PluginError(
                f"mps plugin: it must come before {', '.join(early)} in plugins: their start "
                f"may touch CUDA, and a process that starts CUDA before the MPS daemon runs "
                f"never uses it. Use plugins=[sky.plugins.mps(...), "
                f"{', '.join(f'sky.plugins.{n}(...)' for n in early)}]."
            )
        return image

    @contextmanager
    def around_app(info: InstanceInfo) -> Iterator[None]:
        with node_daemon(info, active_thread_percentage=percentage, pinned_memory_limit=limit):
            yield

    return Plugin(name="mps", transform=transform, around_app=around_app)


mps.__signature__ = keyword_signature(  # type: ignore[attr-defined]
    MpsOptions, _MpsOptions, returns=Plugin
)


def node_directory(info: InstanceInfo) -> str:
    """This node's MPS directory for this run of the pool: the same for every worker of the
    node and for the workers that replace them (``job_id`` outlives a restart), and short,
    since the daemon makes Unix sockets in it (at most 107 bytes a path)."""
    run = hashlib.sha256((info.job_id or f"pid{os.getpid()}").encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), "skyward-mps", f"{run}-node{info.node}")


@contextmanager
def node_daemon(
    info: InstanceInfo, *, active_thread_percentage: int | None, pinned_memory_limit: str | None
) -> Iterator[None]:
    """The node's MPS control daemon for the life of the block, shared by the node's
    workers: started by local worker 0, waited for by the others, stopped by the last to
    leave (see the module docstring)."""
    base = node_directory(info)
    pipe, log = os.path.join(base, "pipe"), os.path.join(base, "log")
    for directory in (pipe, log):
        os.makedirs(directory, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}
    if active_thread_percentage is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(active_thread_percentage)
    daemon_env = {**os.environ, **env}
    # The daemon serves every GPU of the node, and numbers them from 0 for its clients
    # (NVIDIA: "the devices will be remapped by the MPS server"): it gets the node's own
    # list, and this worker names its GPUs by their place in that list.
    node_devices = os.environ.get(_NODE_DEVICES, os.environ.get("CUDA_VISIBLE_DEVICES"))
    daemon_env.pop(_NODE_DEVICES, None)
    if node_devices:
        daemon_env["CUDA_VISIBLE_DEVICES"] = node_devices
    else:
        daemon_env.pop("CUDA_VISIBLE_DEVICES", None)
    node_count = len(node_devices.split(",")) if node_devices else info.accelerators
    count = node_count
    if info.workers_per_node > 1 and info.devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in info.devices)
        count = len(info.devices)
    elif node_devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(count))
    if pinned_memory_limit is not None:
        # Per device, numbered as each process sees them: the daemon's default for the
        # node's GPUs, and this worker's own limit for its GPUs.
        limit = pinned_memory_limit
        daemon_env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = _per_device(limit, node_count)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = _per_device(limit, count)
    members = os.open(os.path.join(base, "members"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _join(base, pipe, daemon_env, info, members)
        os.environ.update(env)  # this worker's CUDA clients find the daemon through these
        try:
            yield
        finally:
            _leave(base, daemon_env, info, members)
    finally:
        os.close(members)  # drops this worker's shared lock, if it still holds it


def _per_device(limit: str, devices: int) -> str:
    return ",".join(f"{i}={limit}" for i in range(max(1, devices)))


@contextmanager
def _node_lock(base: str) -> Iterator[None]:
    """One start or stop at a time on this node."""
    fd = os.open(os.path.join(base, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and with it the lock


def _join(base: str, pipe: str, env: dict[str, str], info: InstanceInfo, members: int) -> None:
    """Become one of the node's members, once its daemon runs (starting it on worker 0)."""
    deadline = time.monotonic() + _DAEMON_TIMEOUT
    while True:
        with _node_lock(base):
            if _running(base, pipe):
                fcntl.flock(members, fcntl.LOCK_SH)
                return
            if info.worker == 0:
                _control(["-d"], env, info)
                # The daemon writes its pid file once it runs; until then (and with drivers
                # that write none) this says a start succeeded, for the node's other workers.
                with open(os.path.join(base, "started"), "w") as f:
                    f.write(f"{os.getpid()}\n")
                fcntl.flock(members, fcntl.LOCK_SH)
                return
        if time.monotonic() > deadline:
            raise PluginError(
                f"mps plugin: {_who(info)}: the node's MPS control daemon was not running "
                f"within {_DAEMON_TIMEOUT:g} s (the node's worker 0 starts it); its log is in "
                f"{os.path.join(base, 'log')}"
            )
        time.sleep(0.05)


def _leave(base: str, env: dict[str, str], info: InstanceInfo, members: int) -> None:
    """Stop being a member; the last member stops the daemon."""
    with _node_lock(base):
        fcntl.flock(members, fcntl.LOCK_UN)
        try:
            fcntl.flock(members, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another worker of this node still runs
        if hooks.replaced():
            # A gang restart: the pool kills this worker next and starts the node's workers
            # again, and they join this daemon. A quit here would race that kill, and a
            # daemon half-way through quitting could be joined by the new worker 0. Should
            # no replacement ever join (its start failed), a keeper quits the daemon.
            fcntl.flock(members, fcntl.LOCK_UN)
            _keep(base, env)
            return
        try:
            pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
            if _running(base, pipe):
                daemon = daemon_pid(pipe)
                _control([], env, info, stdin="quit\n")
                _wait_gone(daemon)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(base, "started"))
            fcntl.flock(members, fcntl.LOCK_UN)
        # The daemon quit: its run's directory (pipes, its log, the lock) goes with it, or
        # every pool would leave one on the node. A quit that failed keeps it, log included.
        shutil.rmtree(base, ignore_errors=True)


def _keep(base: str, env: dict[str, str]) -> None:
    """Leave a keeper for the daemon a replaced worker kept: a process of its own session
    (the pool's kill of this worker does not reach it) that quits the daemon unless a
    worker joins it within ``_KEPT_FOR`` seconds. Without it a replacement that fails to
    start leaves the daemon running on the node for good."""
    with contextlib.suppress(OSError):  # at worst the daemon outlives the pool, as before
        subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import keeper; keeper()", base],
            env={**env, _KEEPER_SECONDS: str(_KEPT_FOR)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )


def keeper() -> None:
    """The keeper's body (``_keep``): ``sys.argv[1]`` is the node's directory, and the
    daemon's environment is this process's. Ends as soon as a worker joins the daemon (it
    is theirs again), or the daemon is gone; else, once the time is up, quits it."""
    base = sys.argv[1]
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    deadline = time.monotonic() + float(os.environ[_KEEPER_SECONDS])
    while True:
        time.sleep(0.2)
        try:
            members = os.open(os.path.join(base, "members"), os.O_RDWR)
        except OSError:
            return  # the directory went with the daemon
        try:
            with _node_lock(base):
                try:
                    fcntl.flock(members, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # a worker joined
                if not _running(base, pipe):
                    return
                if time.monotonic() < deadline:
                    continue
                # Nobody came: quit it, as the last worker to leave would have. The node's
                # directory stays: a replacement that comes now may have opened it already.
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(
                        [_MPS_CONTROL], input="quit\n", text=True, capture_output=True, timeout=30
                    )
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(base, "started"))
                return
        finally:
            os.close(members)


def _running(base: str, pipe: str) -> bool:
    """Whether this node's daemon runs: its pid file names a live process; or, before it
    has written one (or with a driver that writes none), a start of it succeeded."""
    if os.path.exists(os.path.join(pipe, _MPS_PID_FILE)):
        return daemon_pid(pipe) is not None
    return os.path.exists(os.path.join(base, "started"))


def daemon_pid(pipe: str) -> int | None:
    """The pid of the control daemon serving ``pipe``, if it is alive."""
    try:
        with open(os.path.join(pipe, _MPS_PID_FILE)) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs; one that exited and is not yet reaped does not."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _wait_gone(daemon: int | None) -> None:
    """Wait, bounded by ``_QUIT_WAIT``, for a daemon told to ``quit`` to exit. The control
    command returns once the daemon has the command, not once it has gone: the worker that
    quit it would leave it still running, and a start on the node right after (the next
    pool's first worker) would find that instance and be refused."""
    deadline = time.monotonic() + _QUIT_WAIT
    while daemon is not None and _alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.02)


def _who(info: InstanceInfo) -> str:
    return worker_label(info.node, info.worker, info.workers_per_node)


def _control(args: list[str], env: dict[str, str], info: InstanceInfo, stdin: str = "") -> None:
    try:
        done = subprocess.run(
            [_MPS_CONTROL, *args],
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except FileNotFoundError as exc:
        raise PluginError(
            f"mps plugin: {_who(info)} has no {_MPS_CONTROL} on PATH; it comes with "
            f"NVIDIA's driver (the CUDA images and Deep Learning AMIs have it)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise PluginError(f"mps plugin: {_who(info)}: {_MPS_CONTROL} did not answer") from exc
    if done.returncode != 0:
        what = "start" if args else "stop"
        raise PluginError(
            f"mps plugin: {_who(info)} could not {what} the MPS control daemon "
            f"(exit {done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}"
        )
