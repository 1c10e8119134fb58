"""Where Slurm's commands run: the login host over SSH, or this machine when it is one.

::

    Slurm(login="alice@cluster")   RemoteLogin: one SSH connection (``ssh.hosts.connect``,
                                   host key checked); every command an exec channel on it
    Slurm(login=None)              LocalLogin: ``/bin/sh -c`` subprocesses on this machine

Both are a ``shell.Runner`` (``run``: a command to its end, stdout and stderr merged, within
``COMMAND_TIMEOUT`` unless told otherwise) that also answers ``spawn`` (a long-running
command whose stdin and stdout are a worker's link, ``Transport``), so nothing above this
module knows which one it has. Every command runs in a session of its own: a
Ctrl-C in the client's terminal reaches the client, which then cancels the job in order,
not the ``scancel`` doing it.

A login host's non-interactive shell may lack Slurm on its ``PATH`` (a cluster that adds it
in ``/etc/profile.d``): ``open_login`` looks for the commands first, and if they are missing
takes the ``PATH`` a login shell would have.
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.local import PipeTransport
from skyward.providers.shell import Access, Runner
from skyward.providers.ssh.transport import SSHTransport

if TYPE_CHECKING:
    from skyward.link.channel import Transport
    from skyward.providers.ssh.connection import Connection
    from skyward.providers.ssh.hosts import HostTarget

COMMANDS = ("sbatch", "squeue", "scancel", "srun", "scontrol")
COMMAND_TIMEOUT = 60.0  # seconds: a Slurm command that takes longer has a sick controller


class Login(Runner, Protocol):
    """Runs commands where Slurm's client commands are, each bounded by ``COMMAND_TIMEOUT``
    unless ``run`` is told otherwise. Thread-safe; ``close`` idempotent."""

    @property
    def target(self) -> str:
        """For messages: ``alice@cluster`` or ``this machine``."""
        ...

    def spawn(self, command: str) -> Transport:
        """Start ``command``; its stdin and stdout are the returned transport's streams."""
        ...

    def close(self) -> None: ...


class RemoteLogin:
    """The login host over one SSH connection."""

    def __init__(self, connection: Connection, prefix: str = "") -> None:
        self.connection = connection
        self._prefix = prefix  # "PATH=...; export PATH; " when a login shell had to say

    @property
    def target(self) -> str:
        return str(self.connection.target)

    @property
    def alive(self) -> bool:
        return self.connection.alive

    def run(
        self,
        command: str,
        *,
        on_line: Callable[[str], None] | None = None,
        stdin: bytes = b"",
        timeout: float | None = COMMAND_TIMEOUT,
    ) -> tuple[int, str]:
        return self.connection.run(self._sh(command), on_line=on_line, stdin=stdin, timeout=timeout)

    def spawn(self, command: str) -> Transport:
        # As ssh.hosts does: the shell names its process group (the PID line) and waits, so
        # that a death by signal comes back as an exit status paramiko reports.
        marker = f"skyward-pid-{secrets.token_hex(6)}"
        line = self._sh(f"echo {marker} $$ >&2; {command}; exit $?")
        return SSHTransport(self.connection, self.connection.exec(line), marker)

    def _sh(self, command: str) -> str:
        # The login shell may be csh or tcsh: every command is POSIX sh, which replaces the
        # login shell (so it keeps its PID, the session's, that the PID line names).
        return f"exec /bin/sh -c {shlex.quote(self._prefix + command)}"

    def close(self) -> None:
        self.connection.close()


class LocalLogin:
    """This machine, which has Slurm's commands (a cluster's login node)."""

    target = "this machine"
    alive = True

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix

    def run(
        self,
        command: str,
        *,
        on_line: Callable[[str], None] | None = None,
        stdin: bytes = b"",
        timeout: float | None = COMMAND_TIMEOUT,
    ) -> tuple[int, str]:
        process = subprocess.Popen(
            ["/bin/sh", "-c", self._prefix + command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert process.stdin is not None and process.stdout is not None

        def feed() -> None:
            try:
                if stdin:
                    process.stdin.write(stdin)  # type: ignore[union-attr]
                process.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass  # it ended without reading it all; its status says why

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            process.kill()

        killer = threading.Timer(timeout, expire) if timeout is not None else None
        if killer is not None:
            killer.daemon = True
            killer.start()
        chunks: list[bytes] = []
        try:
            for raw in process.stdout:
                chunks.append(raw)
                if on_line is not None:
                    on_line(raw.decode("utf-8", "replace").rstrip("\n"))
            status = process.wait()
        except BaseException:
            process.kill()
            process.wait()
            raise
        finally:
            if killer is not None:
                killer.cancel()
            process.stdout.close()
        writer.join()
        if expired.is_set():
            raise ProvisionError(f"this machine: {command!r} did not finish within {timeout} s")
        return status, b"".join(chunks).decode("utf-8", "replace")

    def spawn(self, command: str) -> Transport:
        process = subprocess.Popen(
            ["/bin/sh", "-c", f"exec {command}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            env={**os.environ, **_path_of(self._prefix)},
            # Its own session: Ctrl-C reaches the client, which shuts the workers down.
            start_new_session=True,
        )
        return PipeTransport(process)

    def close(self) -> None:
        pass


def _path_of(prefix: str) -> dict[str, str]:
    """The ``PATH`` a prefix sets, as an environment (spawn sets it without a shell line)."""
    if not prefix:
        return {}
    assignment = shlex.split(prefix.split(";", 1)[0])[0]  # "PATH=..."
    return {"PATH": assignment.split("=", 1)[1]}


_FIND = "; ".join(
    [f'command -v {c} >/dev/null 2>&1 || echo "skyward-missing {c}"' for c in COMMANDS]
)
# A login shell's profile may print (a banner, module messages): only the marked line counts.
_PROFILE_PATH = '. /etc/profile >/dev/null 2>&1; echo "skyward-path $PATH"'


def open_login(
    target: HostTarget | None, access: Access, deadline: Deadline
) -> RemoteLogin | LocalLogin:
    """Reach the login host (``None``: this machine) and make sure Slurm's commands are
    there; ``ProvisionError`` naming the missing ones otherwise."""
    login: RemoteLogin | LocalLogin
    if target is None:
        login = LocalLogin()
    else:
        from skyward.providers.ssh.hosts import connect

        login = RemoteLogin(connect(target, access, deadline))
    try:
        prefix = _find_commands(login)
        if prefix:
            login = (
                RemoteLogin(login.connection, prefix)
                if isinstance(login, RemoteLogin)
                else (LocalLogin(prefix))
            )
        return login
    except BaseException:
        login.close()
        raise


def _find_commands(login: RemoteLogin | LocalLogin) -> str:
    """``""`` when the commands are on the shell's ``PATH``; else the prefix that puts
    them there (a login shell's ``PATH``)."""
    status, output = login.run(_FIND)
    missing = [
        line.split()[1] for line in output.splitlines() if line.startswith("skyward-missing ")
    ]
    if status == 0 and not missing:
        return ""
    _, profiled = login.run(_PROFILE_PATH)
    path = next(
        (
            line[len("skyward-path ") :]
            for line in profiled.splitlines()
            if line.startswith("skyward-path ")
        ),
        "",
    )
    if path:
        prefix = f"PATH={shlex.quote(path)}; export PATH; "
        status, output = login.run(prefix + _FIND)
        still = [
            line.split()[1] for line in output.splitlines() if line.startswith("skyward-missing ")
        ]
        if status == 0 and not still:
            return prefix
    raise ProvisionError(
        f"{login.target}: Slurm's commands are not there ({', '.join(missing) or 'sbatch'} "
        f"not found, also not on a login shell's PATH). Is this a Slurm login node? "
        f"Give sky.Slurm(login=...) the host you run sbatch on."
    )
