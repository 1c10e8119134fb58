"""Reach machines over SSH and run workers on them: the layer every provider whose machines
are SSH hosts shares (``SSH`` for hosts you have; the clouds for the VMs they create).

::

    open_hosts(targets)   per target, in parallel, all or nothing, cancellable:
                          connect (host key checked against known_hosts, or the key the
                          provider gave the machine; retried while a VM boots) → bootstrap
                          → upload skyward → count GPUs → a HostNode
    HostNode.spawn_worker an exec channel running ``<env>/bin/python -m skyward.worker``
    HostNode.close        kill the workers' process groups (reconnecting if the link
                          dropped under them), close the connection

A provider gives targets and gets nodes; it never touches a connection itself.
"""

from __future__ import annotations

import hashlib
import io
import logging
import secrets
import shlex
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from skyward._errors import BootstrapError, HostKeyError, ProvisionError
from skyward._image import Image
from skyward.client.extras import require
from skyward.client.futures import Deadline, parallel
from skyward.client.phases import Reporter

# The module, not its names: volumes.py loads the bootstrap, and so this package, first.
from skyward.providers import volumes
from skyward.providers.base import ProvisionRequest
from skyward.providers.envcache.turns import CacheTurns

# Access: the clouds import it from here, where reaching machines is.
from skyward.providers.shell import Access as Access
from skyward.providers.shell import Shell, WorkerFiles, shell_path
from skyward.providers.ssh.bootstrap import CACHE, ERROR, MARKER, STEP, Plan, render
from skyward.providers.ssh.connection import Connection, HostKeyPolicy, Target, parse_public_key
from skyward.providers.ssh.transport import SSHTransport

_RECONNECT_TO_KILL = 5.0  # seconds; a pool's close waits this long at most per lost host
_RECONNECT_PAUSE = 0.5  # seconds between attempts to reach a host again
_log = logging.getLogger("skyward")


@dataclass(frozen=True)
class HostTarget:
    """One machine to reach.

    ``peer_address`` is where the pool's other machines reach it (a private address), when
    that differs from ``target.host``. ``host_key`` (``"ssh-ed25519 AAAA..."``) is the key
    the machine must present, when the provider gave it one: then known_hosts is not used.
    """

    target: Target
    peer_address: str | None = None
    host_key: str | None = None


def open_hosts(
    targets: Sequence[HostTarget],
    access: Access,
    request: ProvisionRequest,
    reporter: Reporter,
    *,
    ranks: Sequence[int] | None = None,
) -> list[HostNode]:
    """Reach and prepare every target in parallel; the nodes, in the targets' order.

    All or nothing: the first failure, a Ctrl-C, the deadline passing or being cancelled
    closes every connection made so far (which ends what the others are doing) and raises.
    ``ranks`` are the nodes' ranks for the reporter (default ``0..n-1``).
    """
    require("paramiko", feature="reaching machines over SSH")
    ranks = list(range(len(targets))) if ranks is None else list(ranks)
    plan = bootstrap_plan(request.image, access)
    cache = (
        CacheUse(CacheTurns(urlencode(dict(request.tags))), request.deadline)
        if plan.image.cache is not None
        else None
    )
    made: list[HostNode] = []
    connections: list[Connection] = []
    cancelled = False
    lock = threading.Lock()  # guards: made, connections, cancelled

    def adopt(connection: Connection) -> None:
        with lock:
            connections.append(connection)
            if cancelled:  # another node failed while this one was connecting
                connection.close()
                raise ProvisionError(f"{connection.target}: provisioning was cancelled")

    def open_one(index: int) -> HostNode:
        rank, host = ranks[index], targets[index]
        reporter.phase(rank, "connecting", str(host.target))
        connection = connect(host, access, request.deadline)
        adopt(connection)
        try:
            reporter.phase(rank, "bootstrapping", f"image {plan.digest}")
            steps: list[str] = []

            def on_step(step: str) -> None:
                steps.append(step)
                reporter.phase(rank, "bootstrapping", step)

            bootstrap(
                connection,
                plan,
                lambda line: reporter.log(rank, line),
                on_step=on_step,
                cache=cache,
            )
            if steps:  # the script did something: what follows is a step of its own
                reporter.phase(rank, "bootstrapping", "skyward")
            package = upload_package(connection, plan, lambda line: reporter.log(rank, line))
            included = upload_includes(
                connection, plan, request.image, lambda line: reporter.log(rank, line)
            )
            if access.chips is not None:
                accelerators, seen = access.chips, ""
            else:
                accelerators, seen = list_gpus(connection)
            if access.gpus is not None and accelerators < access.gpus:
                raise ProvisionError(missing_gpus(rank, host, access, accelerators, seen))
            # Last: a node that fails after this would leave a FUSE mount behind.
            mounts = mount_volumes(
                connection, request, access, lambda line: reporter.log(rank, line)
            )
        except BaseException:
            connection.close()
            raise
        if steps:
            reporter.phase(rank, "bootstrapping", "wait")  # for the pool's other nodes
        node = HostNode(
            connection,
            access,
            address=host.peer_address or host.target.host,
            files=WorkerFiles(plan.workdir, plan.env_dir, package, included),
            accelerators=accelerators,
            mounts=mounts,
        )
        with lock:
            made.append(node)
            if cancelled:
                node.close()
                raise ProvisionError(f"{node.connection.target}: provisioning was cancelled")
        return node

    try:
        return parallel(open_one, range(len(targets)), request.deadline, "reaching the machines")
    except BaseException:
        with lock:
            cancelled = True
            nodes, opened = list(made), list(connections)
        for node in nodes:
            node.close()
        for connection in opened:
            connection.close()
        raise


def connect(host: HostTarget, access: Access, deadline: Deadline) -> Connection:
    """Connect and authenticate, retrying within ``access.boot_timeout`` while the machine
    boots (refused, reset, no SSH banner yet); a wrong host key is never retried."""
    pinned = parse_public_key(host.host_key) if host.host_key else None
    boot_end = time.monotonic() + access.boot_timeout
    while True:
        deadline.check(f"{host.target}: connecting")
        try:
            return Connection.open(
                host.target,
                policy=HostKeyPolicy(
                    known_hosts=(access.known_hosts or Path("~/.ssh/known_hosts")).expanduser(),
                    accept_new=access.accept_new_hosts,
                ),
                key_file=access.key_file,
                pinned_key=pinned,
                expected_key=pinned is not None,
                connect_timeout=max(0.5, min(access.connect_timeout, deadline.remaining())),
                keepalive=access.keepalive,
                dead_after=access.link_timeout,
            )
        except HostKeyError:
            raise
        except ProvisionError as error:
            if time.monotonic() + _RECONNECT_PAUSE >= boot_end:
                if access.boot_timeout > 0:
                    raise ProvisionError(
                        f"{error} (still failing after {access.boot_timeout:g} s of retries "
                        f"while the machine booted)"
                    ) from error
                raise
            deadline.sleep(_RECONNECT_PAUSE)


class HostNode:
    """One host of the pool and its connection; each ``spawn_worker`` is one exec channel."""

    shares_files = False

    def __init__(
        self,
        connection: Connection,
        access: Access,
        *,
        address: str,
        files: WorkerFiles,
        accelerators: int,
        mounts: volumes.Mounts | None = None,
    ) -> None:
        self._access = access
        self._mounts = mounts  # the pool's volumes on this host, unmounted by close()
        self.connection = connection
        self.address = address
        self.accelerators = accelerators
        self._files = files
        self._lock = threading.Lock()  # guards: connection, _transports, _closed
        self._transports: list[SSHTransport] = []
        self._closed = False

    def spawn_worker(self, rank: int, env: Mapping[str, str]) -> SSHTransport:
        # sshd makes the shell a session and process-group leader, so the PID it prints
        # names the group that kill() ends. The line carries a fresh nonce: a login shell
        # may print its own lines to stderr first. The shell waits for the worker rather
        # than exec'ing it: paramiko ignores SSH's exit-signal.
        marker = f"skyward-pid-{secrets.token_hex(6)}"
        command = self._files.command(rank, env, announce=f"{marker} $$", wait=True)
        with self._lock:
            if self._closed:
                raise ProvisionError(f"{self.connection.target}: the pool is closing")
            if not self.connection.alive:
                self._reconnect()
                for stranded in [t for t in self._transports if t.stranded]:
                    stranded.kill(self.connection)  # the workers the dropped link left
            transport = SSHTransport(self.connection, self.connection.exec(command), marker)
            self._transports = [t for t in self._transports if not t.finished or t.stranded]
            self._transports.append(transport)
        return transport

    def _reconnect(self, timeout: float | None = None) -> None:
        """The link dropped (a reboot, a network blip): connect again, same host key only.

        Tries until ``timeout`` (default ``connect_timeout``) runs out: a host whose link
        just came back is "unreachable" for a moment, until the network relearns its
        address.
        """
        old = self.connection
        deadline = time.monotonic() + (timeout or self._access.connect_timeout)
        while True:
            try:
                self.connection = Connection.open(
                    old.target,
                    policy=HostKeyPolicy(known_hosts=Path("/dev/null")),
                    key_file=self._access.key_file,
                    pinned_key=old.host_key,
                    connect_timeout=max(0.5, deadline - time.monotonic()),
                    keepalive=self._access.keepalive,
                    dead_after=self._access.link_timeout,
                )
                break
            except HostKeyError:
                raise
            except ProvisionError:
                if time.monotonic() + _RECONNECT_PAUSE >= deadline:
                    raise
                time.sleep(_RECONNECT_PAUSE)
        old.close()

    def close(self) -> None:
        """Kill this node's workers and close the connection. Idempotent; after it,
        ``spawn_worker`` refuses (a replacement racing the pool's teardown)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                stranded = [t for t in self._transports if t.stranded]
                if stranded:
                    # The link dropped under running workers. The host's sshd may not
                    # notice for hours, and the workers would run on: reach the host again.
                    try:
                        self._reconnect(timeout=_RECONNECT_TO_KILL)
                    except (ProvisionError, OSError) as error:
                        pids = ", ".join(str(t.pid) for t in stranded)
                        _log.warning(
                            "%s: cannot reach the host to stop worker process(es) %s (%s); "
                            "they end when the host's sshd notices the dropped connection",
                            self.connection.target,
                            pids,
                            error,
                        )
                for transport in self._transports:
                    transport.kill(self.connection)
                if self._mounts is not None and self.connection.alive:
                    unmount_volumes(self.connection, self._mounts)
            finally:
                self._transports = []
                self.connection.close()


# ----------------------------------------------------------------------------------------------
# Make a reached host able to run workers: run the image's bootstrap script, put this very
# skyward package there, count its GPUs. Each step is cached on the host by hash, so a second
# pool with the same image and the same skyward costs two quick commands. The steps take any
# ``shell.Shell``: an SSH connection, or a Slurm job step (``providers.slurm.steps``).


_LOG_TAIL_LINES = 30
_TIMED_OUT = 124  # coreutils' timeout: the command ran past its bound


def bootstrap_plan(image: Image, access: Access) -> Plan:
    """What the bootstrap makes on every machine of a pool: ``image``'s environment from
    ``access.python`` in ``access.workdir``, for this client's Python."""
    return Plan(
        image=image,
        python_version="{}.{}".format(*sys.version_info[:2]),
        python=access.python,
        workdir=access.workdir,
        runtime=runtime_requirements(),
    )


def runtime_requirements() -> tuple[str, ...]:
    """What the worker imports besides the standard library, at the client's versions.

    Pinned because values pickled on one side are unpickled on the other.
    """
    from importlib import metadata

    return tuple(f"{name}=={metadata.version(name)}" for name in ("cloudpickle", "pydantic"))


@dataclass(frozen=True)
class CacheUse:
    """How one pool's bootstraps share its image's cache entry (``Image.cache``)."""

    turns: CacheTurns
    deadline: Deadline


def bootstrap(
    connection: Shell,
    plan: Plan,
    on_line: Any,
    *,
    on_step: Callable[[str], None] | None = None,
    cache: CacheUse | None = None,
) -> None:
    """Run the image's script on the host, streaming its output, and ``on_step`` each step
    it enters (``bootstrap.STEPS``); ``BootstrapError`` if it fails or outlasts the image's
    ``bootstrap_timeout``. With ``cache``, the first node to get here builds a missing
    entry and the others wait for it, then run the script again (``envcache/turns.py``)."""
    if cache is None or plan.image.cache is None:
        _run_script(connection, plan, on_line, on_step, {})
        return
    turns = cache.turns
    role = turns.take()
    env = {"SKYWARD_CACHE_ROLE": role, "SKYWARD_CACHE_TAGS": turns.tags}

    def on_state(state: str) -> None:
        turns.said(role, state)

    try:
        state = _run_script(connection, plan, on_line, on_step, env, on_state)
    finally:
        if role == "build":
            turns.builder_ended()
    if state == "wait":
        on_line(turns.wait(cache.deadline))
        _run_script(connection, plan, on_line, on_step, {**env, "SKYWARD_CACHE_ROLE": "build"})


def _run_script(
    connection: Shell,
    plan: Plan,
    on_line: Any,
    on_step: Callable[[str], None] | None,
    env: Mapping[str, str],
    on_state: Callable[[str], None] | None = None,
) -> str:
    """One run of the script; the last cache state it said (``bootstrap.CACHE``), or ""."""
    tail: list[str] = []
    command: list[str] = []
    reason: list[str] = []  # the script's own "skyward: error: ..." line, if it gave one
    state: list[str] = [""]

    def line(text: str) -> None:
        if text.startswith(STEP):
            if on_step is not None:
                on_step(text[len(STEP) :].strip())
            return
        if text.startswith(CACHE):
            state[0] = text[len(CACHE) :].strip()
            if on_state is not None:
                on_state(state[0])
            return
        if text.startswith(MARKER):
            command[:] = [text[len(MARKER) :]]
        elif text.startswith(ERROR):
            reason[:] = [text[len(ERROR) :]]
        tail.append(text)
        del tail[:-_LOG_TAIL_LINES]
        on_line(text)

    # On stdin: no limit on the script's length, and no quoting through the login shell.
    bound = plan.image.bootstrap_timeout
    shell = "sh -s"
    if bound is not None:
        # coreutils' timeout ends the script's whole process group, then kills it 5 s later;
        # a host without it (not a Linux distribution) runs the script unbounded.
        shell = (
            f"if command -v timeout >/dev/null 2>&1; then exec timeout -k 5 {bound:g} sh -s; "
            f"else exec sh -s; fi"
        )
    if env:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        shell = f"{exports}; export {' '.join(env)}; {shell}"
    started = time.monotonic()
    status, _ = connection.run(shell, stdin=render(plan).encode(), on_line=line)
    if bound is not None and status == _TIMED_OUT and time.monotonic() - started >= bound:
        running = command[0] if command else "the bootstrap script"
        raise BootstrapError(
            f"{connection.target}: the bootstrap did not finish within the image's "
            f"bootstrap_timeout ({bound:g} s); `{running}` was running\n"
            f"--- last lines of its output ---\n" + "\n".join(tail),
            command=running,
            exit_status=None,
            log_tail="\n".join(tail),
        )
    if status != 0:
        failed = command[0] if command else "the bootstrap script"
        log = "\n".join(tail)
        if status < 0 or not connection.alive:
            raise BootstrapError(
                f"{connection.target}: the SSH connection dropped during the bootstrap, "
                f"while `{failed}` ran\n--- last lines of its output ---\n{log}",
                command=failed,
                exit_status=None,
                log_tail=log,
            )
        why = f": {reason[0]}" if reason else ""
        raise BootstrapError(
            f"{connection.target}: bootstrap failed: `{failed}` exited with {status}{why}\n"
            f"--- last lines of its output ---\n{log}",
            command=failed,
            exit_status=status,
            log_tail=log,
        )
    return state[0]


def mount_volumes(
    connection: Shell, request: ProvisionRequest, access: Access, on_line: Callable[[str], None]
) -> volumes.Mounts | None:
    """Mount the pool's volumes on the host (``providers/volumes.py``); what ``close`` needs
    to unmount them, or None when the pool has none. ``BootstrapError`` names why not."""
    if not request.volumes:
        return None
    mounts = volumes.Mounts(request.volumes, volumes.volume_dir(access.workdir, request.pool))
    profile = access.instance_profile
    script = volumes.mount_script(mounts.volumes, mounts.directory, instance_profile=profile)
    status, output = connection.run("sh -s", stdin=script.encode(), on_line=on_line)
    if status != 0:
        raise volumes.mount_failed(connection.target, status, output)
    return mounts


def unmount_volumes(connection: Shell, mounts: volumes.Mounts) -> None:
    """Unmount the pool's volumes from the host; what goes wrong is logged (a close goes on)."""
    try:
        status, output = connection.run(
            "sh -s",
            stdin=volumes.unmount_script(mounts.volumes, mounts.directory).encode(),
            timeout=60,
        )
    except (ProvisionError, OSError) as error:
        status, output = -1, str(error)
    if status != 0 or "could not unmount" in output:
        _log.warning("%s: unmounting the pool's volumes: %s", connection.target, output.strip())


_package: tuple[str, bytes] | None = None
_package_lock = threading.Lock()  # guards: _package


def package_archive() -> tuple[str, bytes]:
    """This skyward package as a zip (its hash, its bytes); made once per process."""
    global _package
    with _package_lock:
        if _package is None:
            root = Path(__file__).resolve().parents[2]  # skyward/providers/ssh/hosts.py
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sorted(root.rglob("*")):
                    if (
                        path.suffix in (".py", ".typed", ".json")
                        and "__pycache__" not in path.parts
                    ):
                        name = f"skyward/{path.relative_to(root).as_posix()}"
                        # A fixed timestamp: the same sources give the same hash.
                        archive.writestr(
                            zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), path.read_bytes()
                        )
            data = buffer.getvalue()
            _package = (hashlib.sha256(data).hexdigest()[:16], data)
        return _package


def upload_package(connection: Shell, plan: Plan, on_line: Callable[[str], None]) -> str:
    """Put this skyward on the host, unless the same one is there; returns its directory."""
    digest, data = package_archive()
    return _upload(connection, plan, "pkg", digest, data, "this skyward", on_line)


def upload_includes(
    connection: Shell, plan: Plan, image: Image, on_line: Callable[[str], None]
) -> str | None:
    """Put the image's ``includes`` on the host, unless the same files are there; returns
    the directory to put on the workers' path (None: nothing to include)."""
    if not image.includes:
        return None
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for local, name in image.included_files():
            archive.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), Path(local).read_bytes())
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    return _upload(connection, plan, "inc", digest, data, "the image's includes", on_line)


def _upload(
    connection: Shell,
    plan: Plan,
    kind: str,
    digest: str,
    data: bytes,
    what: str,
    on_line: Callable[[str], None],
) -> str:
    """Unzip ``data`` into ``workdir/kind/digest`` unless it is there; returns that."""
    home = shell_path(plan.workdir)
    directory = f"{plan.workdir}/{kind}/{digest}"
    status, output = connection.run(
        f"mkdir -p {home}/{kind} && if [ -d {home}/{kind}/{digest} ]; then echo present; fi"
    )
    if status != 0:
        raise BootstrapError(f"{connection.target}: cannot create {plan.workdir}/{kind}: {output}")
    if "present" not in output:
        on_line(f"skyward: uploading {what} ({len(data) // 1024} KiB) to {directory}")
        # A name of its own: another client may be uploading the same archive right now.
        upload = f"{digest}.{secrets.token_hex(4)}"
        connection.upload(data, f"{_sftp_path(plan.workdir)}/{kind}/{upload}.zip")
        status, output = connection.run(
            f"{shell_path(plan.env_dir)}/bin/python -c {shlex.quote(_UNPACK)} "
            f"{home}/{kind}/{upload}.zip {home}/{kind}/{upload}.tmp {home}/{kind}/{digest}"
        )
        if status != 0:
            raise BootstrapError(
                f"{connection.target}: cannot unpack {what} into {plan.workdir}/{kind}: {output}"
            )
    return directory


# Unpack next to the final directory and rename into place; whoever renames first wins, and
# the loser's copy (identical) goes. Nothing is left behind on any path.
_UNPACK = """
import os, shutil, sys, zipfile
archive, scratch, final = sys.argv[1:]
try:
    zipfile.ZipFile(archive).extractall(scratch)
    try:
        os.rename(scratch, final)
    except OSError:
        if not os.path.isdir(final):
            raise
finally:
    shutil.rmtree(scratch, ignore_errors=True)
    os.remove(archive)
"""


def _sftp_path(workdir: str) -> str:
    # SFTP resolves relative paths from the login directory, which is where ~ points.
    if workdir == "~":
        return "."
    return workdir[2:] if workdir.startswith("~/") else workdir


# What a node shows of its GPUs: nvidia-smi's list, or (no nvidia-smi) the device files the
# driver makes. A line "::status N" ends nvidia-smi's output with its exit status.
_LIST_GPUS = (
    'if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>&1; echo "::status $?"; '
    "else echo 'no nvidia-smi on PATH'; ls -d /dev/nvidia[0-9]* 2>/dev/null || true; fi"
)


def list_gpus(connection: Connection) -> tuple[int, str]:
    """How many GPUs the host shows, and what it showed (for an error that names it)."""
    _, output = connection.run(_LIST_GPUS)
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    status = next((line for line in lines if line.startswith("::status ")), "::status 0")
    shown = [line for line in lines if not line.startswith("::status ")]
    if lines and lines[0] == "no nvidia-smi on PATH":
        devices = [line for line in shown[1:] if line.startswith("/dev/nvidia")]
        seen = f"no nvidia-smi, and device files {' '.join(devices) or 'none'}"
        return len(devices), seen
    gpus = [line for line in shown if line.startswith("GPU ")]
    if status != "::status 0":
        return 0, f"`nvidia-smi -L` failed ({status[2:]}): {' / '.join(shown[-3:]) or 'no output'}"
    return len(gpus), f"`nvidia-smi -L` listed {len(gpus)}: {' / '.join(gpus) or 'nothing'}"


def missing_gpus(rank: int, host: HostTarget, access: Access, found: int, seen: str) -> str:
    machine = access.machine_type or "machine"
    return (
        f"node {rank} ({host.target}): a {machine} has {access.gpus} GPU(s), but this node "
        f"shows {found} ({seen}). Its driver may not support this GPU, or a GPU is faulty; "
        f"the pool does not start on it, since a JAX program would run on the CPU instead."
    )
