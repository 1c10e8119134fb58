"""``SSH(hosts=[...])``: nodes are machines you already have, reached over SSH.

::

    provision   per host, in parallel: connect (host key checked, then pinned) → run the
                image's bootstrap script (cached by the image's hash) → upload this very
                skyward package (cached by its hash) → an SSHNode
    spawn       an exec channel running ``<env>/bin/python -m skyward.worker``; the channel's
                stdin/stdout carry the protocol, its stderr the worker's stderr
    terminate   kill the workers' process groups, close the connections; the hosts keep
                only Skyward's cache directory (``workdir``)

Cloud providers build on this: they create machines, then reach them the same way.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skyward import _protocol as proto
from skyward._bootstrap import MARKER, Plan, render, shell_path
from skyward._errors import BootstrapError, HostKeyError, ProvisionError
from skyward._ssh import Connection, HostKeyPolicy, Target

if TYPE_CHECKING:
    import paramiko

    from skyward._pool import PoolSpec
    from skyward.providers.base import Reporter

_LOG_TAIL_LINES = 30
_RECONNECT_TO_KILL = 5.0  # seconds; a pool's close waits this long at most per lost host
_PID_WAIT = 5.0  # seconds kill() waits for a just-spawned worker's PID line
_RECONNECT_PAUSE = 0.5  # seconds between attempts to reach a host again
_log = logging.getLogger("skyward")
_CHUNK = 1 << 18  # large buffers go out in slices: paramiko copies each send into a packet


class SSH(BaseModel):
    """Run the pool's nodes on existing hosts over SSH.

    - ``hosts``: ``"[user@]host[:port]"``; node ``i`` is ``hosts[i]``, and a pool may use
      fewer nodes than there are hosts.
    - ``key``: a private key file; by default the SSH agent's keys and ``~/.ssh/id_*``.
    - ``known_hosts``: the file host keys are checked against (default
      ``~/.ssh/known_hosts``). An unknown host is refused unless ``accept_new_hosts=True``,
      which adds it to that file; a changed key is always refused.
    - ``python``: the interpreter the environment is made from; by default ``python3.X`` or
      ``python3`` of the client's minor version, found on the host's ``PATH``.
    - ``workdir``: Skyward's directory on each host: environments, the uploaded package,
      the workers' working directory. The only thing a pool leaves behind.
    - ``peer_addresses``: where the hosts reach each other (``head_addr``, ``peers``), when
      that differs from the address this machine uses (a bastion, a public IP).
    - ``connect_timeout``; ``keepalive`` (seconds between keepalives) and ``link_timeout``
      (unacknowledged data for this long ends the link, and the workers on it are lost).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    hosts: tuple[str, ...] = Field(min_length=1)
    key: Path | None = None
    known_hosts: Path | None = None
    accept_new_hosts: bool = False
    python: str | None = Field(default=None, min_length=1)
    workdir: str = Field(default="~/.cache/skyward", min_length=1)
    peer_addresses: tuple[str, ...] | None = None
    connect_timeout: float = Field(default=15.0, gt=0)
    keepalive: float = Field(default=5.0, ge=1)
    link_timeout: float = Field(default=20.0, ge=2)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        for host in hosts:
            Target.parse(host)
        if len(set(hosts)) != len(hosts):
            raise ValueError("a host is listed more than once")
        return hosts

    @field_validator("key")
    @classmethod
    def _key(cls, key: Path | None) -> Path | None:
        if key is not None and not key.expanduser().is_file():
            raise ValueError(f"no private key file at {key}")
        return None if key is None else key.expanduser()

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, workdir: str) -> str:
        if not (workdir.startswith("/") or workdir == "~" or workdir.startswith("~/")):
            raise ValueError(f"workdir must be absolute or start with ~/, not {workdir!r}")
        return workdir.rstrip("/") or "/"

    @model_validator(mode="after")
    def _peers(self) -> SSH:
        if self.peer_addresses is not None and len(self.peer_addresses) != len(self.hosts):
            raise ValueError(
                f"peer_addresses has {len(self.peer_addresses)} entries for "
                f"{len(self.hosts)} hosts; give one per host, in the same order"
            )
        return self

    @property
    def kind(self) -> str:
        return "ssh"

    def check(self, spec: PoolSpec) -> None:
        """Called when the pool is built, before anything is touched."""
        if spec.nodes > len(self.hosts):
            raise ValueError(
                f"the pool asks for {spec.nodes} nodes but SSH has {len(self.hosts)} host(s); "
                f"list more hosts or ask for fewer nodes"
            )

    def provision(self, spec: PoolSpec, reporter: Reporter) -> Sequence[SSHNode]:
        from skyward._pool import _parallel

        self.check(spec)
        policy = HostKeyPolicy(
            known_hosts=(self.known_hosts or Path("~/.ssh/known_hosts")).expanduser(),
            accept_new=self.accept_new_hosts,
        )
        plan = Plan(
            image=spec.image,
            python_version="{}.{}".format(*sys.version_info[:2]),
            python=self.python,
            workdir=self.workdir,
            runtime=_runtime_requirements(),
        )
        made: list[SSHNode] = []
        connections: list[Connection] = []
        cancelled = False
        lock = threading.Lock()  # guards: made, connections, cancelled

        def adopt(connection: Connection) -> None:
            with lock:
                connections.append(connection)
                if cancelled:  # another node failed while this one was connecting
                    connection.close()
                    raise ProvisionError(f"{connection.target}: provisioning was cancelled")

        def open_node(rank: int) -> SSHNode:
            node = self._open_node(rank, policy, plan, reporter, adopt)
            with lock:
                made.append(node)
                if cancelled:
                    node.close()
                    raise ProvisionError(f"{node.connection.target}: provisioning was cancelled")
            return node

        try:
            return _parallel(open_node, list(range(spec.nodes)))
        except BaseException:
            # All or nothing. The first failure (or Ctrl-C) arrives while other nodes may
            # still be connecting or bootstrapping: close their connections now, which ends
            # what they are doing; a node that finishes later closes itself (cancelled).
            with lock:
                cancelled = True
                nodes, opened = list(made), list(connections)
            self.terminate(nodes)
            for connection in opened:
                connection.close()
            raise

    def _open_node(
        self,
        rank: int,
        policy: HostKeyPolicy,
        plan: Plan,
        reporter: Reporter,
        adopt: Callable[[Connection], None],
    ) -> SSHNode:
        target = Target.parse(self.hosts[rank])
        reporter.phase(rank, "connecting", str(target))
        connection = Connection.open(
            target,
            policy=policy,
            key_file=self.key,
            connect_timeout=self.connect_timeout,
            keepalive=self.keepalive,
            dead_after=self.link_timeout,
        )
        adopt(connection)
        try:
            reporter.phase(rank, "bootstrapping", f"image {plan.digest}")
            bootstrap(connection, plan, lambda line: reporter.log(rank, line))
            package = upload_package(connection, plan, lambda line: reporter.log(rank, line))
            accelerators = _count_gpus(connection)
        except BaseException:
            connection.close()
            raise
        address = self.peer_addresses[rank] if self.peer_addresses else target.host
        return SSHNode(
            self,
            connection,
            address=address,
            plan=plan,
            package=package,
            accelerators=accelerators,
        )

    def terminate(self, nodes: Sequence[object]) -> None:
        for node in nodes:
            if isinstance(node, SSHNode):
                node.close()


def _runtime_requirements() -> tuple[str, ...]:
    """What the worker imports besides the standard library, at the client's versions.

    Pinned because values pickled on one side are unpickled on the other.
    """
    from importlib import metadata

    return tuple(f"{name}=={metadata.version(name)}" for name in ("cloudpickle", "pydantic"))


def bootstrap(connection: Connection, plan: Plan, on_line: Any) -> None:
    """Run the image's script on the host, streaming its output; ``BootstrapError`` if it fails."""
    tail: list[str] = []
    command: list[str] = []

    def line(text: str) -> None:
        if text.startswith(MARKER):
            command[:] = [text[len(MARKER) :]]
        tail.append(text)
        del tail[:-_LOG_TAIL_LINES]
        on_line(text)

    # On stdin: no limit on the script's length, and no quoting through the login shell.
    status, _ = connection.run("sh -s", stdin=render(plan).encode(), on_line=line)
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
        raise BootstrapError(
            f"{connection.target}: bootstrap failed: `{failed}` exited with {status}\n"
            f"--- last lines of its output ---\n{log}",
            command=failed,
            exit_status=status,
            log_tail=log,
        )


_package: tuple[str, bytes] | None = None
_package_lock = threading.Lock()  # guards: _package


def package_archive() -> tuple[str, bytes]:
    """This skyward package as a zip (its hash, its bytes); made once per process."""
    global _package
    with _package_lock:
        if _package is None:
            root = Path(__file__).resolve().parents[1]
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sorted(root.rglob("*")):
                    if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                        name = f"skyward/{path.relative_to(root).as_posix()}"
                        # A fixed timestamp: the same sources give the same hash.
                        archive.writestr(
                            zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), path.read_bytes()
                        )
            data = buffer.getvalue()
            _package = (hashlib.sha256(data).hexdigest()[:16], data)
        return _package


def upload_package(connection: Connection, plan: Plan, on_line: Callable[[str], None]) -> str:
    """Put this skyward on the host, unless the same one is there; returns its directory."""
    digest, data = package_archive()
    home = shell_path(plan.workdir)
    directory = f"{plan.workdir}/pkg/{digest}"
    status, output = connection.run(
        f"mkdir -p {home}/pkg && if [ -d {home}/pkg/{digest} ]; then echo present; fi"
    )
    if status != 0:
        raise BootstrapError(f"{connection.target}: cannot create {plan.workdir}/pkg: {output}")
    if "present" not in output:
        on_line(f"skyward: uploading this skyward ({len(data) // 1024} KiB) to {directory}")
        # A name of its own: another client may be uploading the same package right now.
        upload = f"{digest}.{secrets.token_hex(4)}"
        connection.upload(data, f"{_sftp_path(plan.workdir)}/pkg/{upload}.zip")
        status, output = connection.run(
            f"{shell_path(plan.env_dir)}/bin/python -c {shlex.quote(_UNPACK)} "
            f"{home}/pkg/{upload}.zip {home}/pkg/{upload}.tmp {home}/pkg/{digest}"
        )
        if status != 0:
            raise BootstrapError(
                f"{connection.target}: cannot unpack skyward into {plan.workdir}/pkg: {output}"
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


def _count_gpus(connection: Connection) -> int:
    status, output = connection.run("nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true")
    try:
        return int(output.strip() or 0) if status == 0 else 0
    except ValueError:
        return 0


class SSHNode:
    """One host of the pool and its connection; each ``spawn_worker`` is one exec channel."""

    shares_files = False

    def __init__(
        self,
        provider: SSH,
        connection: Connection,
        *,
        address: str,
        plan: Plan,
        package: str,
        accelerators: int,
    ) -> None:
        self._provider = provider
        self.connection = connection
        self.address = address
        self.accelerators = accelerators
        self._plan = plan
        self._package = package
        self._lock = threading.Lock()  # guards: connection, _transports, _closed
        self._transports: list[SSHTransport] = []
        self._closed = False

    def spawn_worker(self, rank: int, env: Mapping[str, str]) -> SSHTransport:
        assignments = " ".join(
            [f"{name}={shlex.quote(value)}" for name, value in sorted(env.items())]
            + [f"PYTHONPATH={shell_path(self._package)}"]
        )
        # sshd makes the shell a session and process-group leader, so the PID it prints
        # names the group that kill() ends. The line carries a fresh nonce: a login shell
        # may print its own lines to stderr first. The shell waits for the worker rather
        # than exec'ing it: paramiko ignores SSH's exit-signal, and the shell turns death
        # by signal N into the exit status 128 + N, which paramiko does report.
        marker = f"skyward-pid-{secrets.token_hex(6)}"
        command = (
            f"cd {shell_path(self._plan.workdir)} || exit 1; echo {marker} $$ >&2; "
            f"env {assignments} {shell_path(self._plan.env_dir)}/bin/python "
            f"-m skyward.worker --node {rank}; exit $?"
        )
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
        deadline = time.monotonic() + (timeout or self._provider.connect_timeout)
        while True:
            try:
                self.connection = Connection.open(
                    old.target,
                    policy=HostKeyPolicy(known_hosts=Path("/dev/null")),
                    key_file=self._provider.key,
                    pinned_key=old.host_key,
                    connect_timeout=max(0.5, deadline - time.monotonic()),
                    keepalive=self._provider.keepalive,
                    dead_after=self._provider.link_timeout,
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
            finally:
                self._transports = []
                self.connection.close()


class _ChannelReader(io.RawIOBase):
    """A paramiko channel's stdout as a raw stream, for ``io.BufferedReader``."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._channel.recv(len(view))
        view[: len(data)] = data
        return len(data)


class SSHTransport:
    """A worker over an SSH exec channel: the protocol on stdin/stdout, stderr as itself."""

    def __init__(self, connection: Connection, channel: paramiko.Channel, marker: str) -> None:
        self._connection = connection
        self._channel = channel
        self._stdout = io.BufferedReader(_ChannelReader(channel), 1 << 16)
        self._marker = marker.encode() + b" "
        self._pid: int | None = None
        self._pid_known = threading.Event()  # set once the PID line is read, or never comes
        self._stderr_partial = b""
        self._killed = False
        self.finished = False

    def write(self, parts: Sequence[proto.Part]) -> None:
        if self._channel.closed:
            raise BrokenPipeError("the worker's SSH channel is closed")
        # SSH wraps every send in its own packet: small parts (a frame, a batch of frames)
        # are gathered into one send; large buffers go in slices of _CHUNK, since paramiko
        # copies each send. (Handing it memoryviews instead measured no faster: the cipher
        # is the cost.)
        pending = bytearray()
        try:
            for part in parts:
                view = memoryview(part).cast("B")
                if len(view) < _CHUNK:
                    pending += view
                    if len(pending) < _CHUNK:
                        continue
                if pending:
                    self._channel.sendall(bytes(pending))
                    pending.clear()
                if len(view) >= _CHUNK:
                    for start in range(0, len(view), _CHUNK):
                        self._channel.sendall(bytes(view[start : start + _CHUNK]))
            if pending:
                self._channel.sendall(bytes(pending))
        except Exception as exc:
            import paramiko  # loaded already; imported here to keep it off the hot path

            if isinstance(exc, paramiko.SSHException):  # a stalled key exchange, a dead link
                raise BrokenPipeError(f"the worker's SSH channel failed: {exc}") from exc
            raise

    def readinto(self, buffer: memoryview) -> int | None:
        return self._stdout.readinto(buffer)

    def read_stderr(self) -> bytes:
        while True:
            data: bytes = self._channel.recv_stderr(1 << 16)
            if not data:
                self.finished = True
                self._pid_known.set()
                rest, self._stderr_partial = self._stderr_partial, b""
                return rest  # b"" once nothing is left: the end of the stream
            if self._pid_known.is_set():
                return data
            # Until the launch command's PID line: pass whole lines on (a login shell's own
            # messages), and keep that one line off the output.
            self._stderr_partial += data
            out = b""
            while not self._pid_known.is_set() and b"\n" in self._stderr_partial:
                line, self._stderr_partial = self._stderr_partial.split(b"\n", 1)
                if line.startswith(self._marker):
                    self._pid = int(line[len(self._marker) :].split()[0])
                    self._pid_known.set()
                else:
                    out += line + b"\n"
            if self._pid_known.is_set():
                out, self._stderr_partial = out + self._stderr_partial, b""
            if out:
                return out

    def can_write_now(self, nbytes: int) -> bool:
        # The peer's receive window has room, so sendall() will not wait for the remote side
        # to reopen it (it still encrypts and writes to the socket in this thread).
        return bool(self._channel.closed or self._channel.out_window_size >= nbytes)

    def _exited(self) -> bool:
        # The host reported an exit status. (paramiko's exit_status_ready() and status_event
        # also fire for a channel closed because its connection died, which is no exit;
        # exit_status stays -1 until the host sends one.)
        return int(self._channel.exit_status) >= 0

    def link_lost(self) -> str | None:
        if self._exited() or self._connection.alive:
            return None
        return (
            f"the SSH connection to {self._connection.target} dropped (the host stopped "
            f"answering, or the network between went down)"
        )

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while not self._channel.exit_status_ready():
            if self._channel.closed or not self._connection.alive:
                return None  # the link ended: the status is unknown
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        status = self._channel.recv_exit_status()
        return None if status < 0 else _signed_status(status)

    @property
    def pid(self) -> int | None:
        """The worker's launch shell on the host, which leads its process group."""
        return self._pid

    @property
    def stranded(self) -> bool:
        """Started, not yet killed, and its link is gone: only a new connection can stop it."""
        return (
            self._pid is not None
            and not self._killed
            and not self._exited()
            and not self._connection.alive
        )

    def kill(self, connection: Connection | None = None) -> None:
        """Kill the worker's process group on the host; harmless once it is gone.

        ``connection`` replaces a dropped one (the node reconnected to stop its workers).
        """
        connection = connection or self._connection
        # A worker closed right after it was spawned: its PID line may still be in flight.
        self._pid_known.wait(_PID_WAIT)
        if self._killed or self._pid is None or not connection.alive:
            return
        self._killed = True
        try:
            # The POSIX spelling: dash, /bin/sh on Debian and Ubuntu, rejects `kill -KILL --`.
            connection.run(
                f"kill -s KILL -- -{self._pid} 2>/dev/null; "
                f"kill -s KILL {self._pid} 2>/dev/null; true",
                timeout=10.0,
            )
        except (ProvisionError, OSError):
            pass  # the link went down meanwhile: the host's sshd ends the session

    def close(self) -> None:
        self._channel.close()


def _signed_status(status: int) -> int:
    # A shell reports death by signal N as 128 + N; the Transport contract says -N.
    return -(status - 128) if 128 < status < 160 else status
