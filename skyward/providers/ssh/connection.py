"""SSH on paramiko: connect, check host keys, run commands, upload files, open exec channels.

One ``Connection`` per node for the pool's lifetime; every worker of that node, and every
command the pool runs there, is a channel on it. Anything that goes wrong on the way in
becomes a ``ProvisionError`` (``HostKeyError`` for keys) that names the host and says what
to do. paramiko is imported here only, so ``import skyward`` never needs it.

A dead link must be noticed in seconds, not after TCP's fifteen minutes of retries: the
transport sends a keepalive every ``keepalive`` seconds, and ``TCP_USER_TIMEOUT`` drops the
connection once sent data has gone unacknowledged for ``dead_after`` seconds. Every channel
on it then ends, and the workers on it are lost.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyward._errors import HostKeyError, ProvisionError

if TYPE_CHECKING:
    import paramiko

_TARGET = re.compile(
    r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s\[\]]+)(?::(?P<port>\d+))?$"
)
# The fastest ciphers paramiko has (it has no chacha20), first.
_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")


@dataclass(frozen=True)
class Target:
    """``[user@]host[:port]``; the user defaults to the client's login name."""

    host: str
    port: int = 22
    user: str = ""

    @classmethod
    def parse(cls, text: str) -> Target:
        match = _TARGET.match(text.strip())
        if not match or not 0 < int(match["port"] or 22) < 65536:
            raise ValueError(f"{text!r} is not an SSH host; write it as [user@]host[:port]")
        return cls(
            host=match["host"].strip("[]"),
            port=int(match["port"] or 22),
            user=match["user"] or _login_name(),
        )

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH names this host in ``known_hosts``."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def __str__(self) -> str:
        port = "" if self.port == 22 else f":{self.port}"
        return f"{self.user}@{self.host}{port}"


def _login_name() -> str:
    import getpass

    return getpass.getuser()


@dataclass(frozen=True)
class HostKeyPolicy:
    """How to trust host keys: a ``known_hosts`` file, and whether to add unknown hosts.

    (A pool's reconnects do not consult it: ``Connection.open(pinned_key=...)`` accepts only
    the key seen first, even when ``accept_new`` is set.)
    """

    known_hosts: Path
    accept_new: bool = False

    def check(self, target: Target, key: paramiko.PKey) -> None:
        import paramiko

        known = paramiko.HostKeys()
        if self.known_hosts.exists():
            try:
                known.load(str(self.known_hosts))
            except (OSError, paramiko.SSHException) as exc:
                raise HostKeyError(
                    f"{target}: cannot read known hosts file {self.known_hosts}: {exc}"
                ) from exc
        name = target.known_hosts_name
        entries = known.lookup(name)
        fingerprint = _fingerprint(key)
        if entries:
            if key.get_name() in entries and entries[key.get_name()] == key:
                return
            # A known host offering another key, of the same type or not, is refused.
            raise HostKeyError(
                f"{target}: the host key CHANGED ({key.get_name()} {fingerprint}) and "
                f"does not match {self.known_hosts}. This can mean someone is "
                f"intercepting the connection, or the machine was rebuilt. If you know "
                f"it was rebuilt, remove the old key with "
                f"`ssh-keygen -f {shlex.quote(str(self.known_hosts))} -R "
                f"{shlex.quote(name)}` and connect again."
            )
        if not self.accept_new:
            file = shlex.quote(str(self.known_hosts))
            raise HostKeyError(
                f"{target}: unknown host key ({key.get_name()} {fingerprint}); it is not in "
                f"{self.known_hosts}. Check the fingerprint and add it (for example by "
                f"connecting once with `ssh -o UserKnownHostsFile={file} -p {target.port} "
                f"{target.user}@{target.host}`), or pass "
                f"accept_new_hosts=True to trust hosts seen for the first time."
            )
        self._remember(name, key)

    def known_types(self, target: Target) -> list[str]:
        """The key types ``known_hosts`` has for this host (none if it cannot be read)."""
        import paramiko

        known = paramiko.HostKeys()
        try:
            known.load(str(self.known_hosts))
        except (OSError, paramiko.SSHException):
            return []
        return list(known.lookup(target.known_hosts_name) or [])

    def _remember(self, name: str, key: paramiko.PKey) -> None:
        # Appended like OpenSSH's accept-new does, so the next pool checks against it.
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with _KNOWN_HOSTS_LOCK, open(self.known_hosts, "a+b") as file:
            file.seek(0, os.SEEK_END)
            if file.tell() > 0:
                file.seek(-1, os.SEEK_END)
                if file.read(1) != b"\n":  # a hand-edited file may end without one
                    file.write(b"\n")
            file.write(f"{name} {key.get_name()} {key.get_base64()}\n".encode())


_KNOWN_HOSTS_LOCK = threading.Lock()  # guards: appends to known_hosts from parallel connects


def _first(preferred: Sequence[str], available: Sequence[str]) -> tuple[str, ...]:
    """``available``, with those of ``preferred`` it has moved to the front, in that order."""
    front = [name for name in preferred if name in available]
    return tuple(front) + tuple(name for name in available if name not in front)


def _fingerprint(key: paramiko.PKey) -> str:
    return str(key.fingerprint)


def default_key_files(home: Path | None = None) -> list[Path]:
    """The private keys tried when ``SSH(key=...)`` is not given, besides the agent's."""
    ssh = (home or Path.home()) / ".ssh"
    return [ssh / name for name in ("id_ed25519", "id_ecdsa", "id_rsa") if (ssh / name).exists()]


class Connection:
    """An authenticated SSH connection to one host. Thread-safe (paramiko's transport is).

    Open it with ``Connection.open``; ``close()`` is idempotent.
    """

    def __init__(self, target: Target, transport: paramiko.Transport) -> None:
        self.target = target
        self.transport = transport
        self.host_key: paramiko.PKey = transport.get_remote_server_key()

    @classmethod
    def open(
        cls,
        target: Target,
        *,
        policy: HostKeyPolicy,
        key_file: Path | None = None,
        pinned_key: paramiko.PKey | None = None,
        expected_key: bool = False,
        connect_timeout: float = 15.0,
        keepalive: float = 5.0,
        dead_after: float = 20.0,
    ) -> Connection:
        import paramiko

        sock = _connect_socket(target, connect_timeout, dead_after)
        try:
            transport = paramiko.Transport(sock)
        except BaseException:
            sock.close()
            raise
        try:
            options = transport.get_security_options()
            options.ciphers = _first(_CIPHERS, options.ciphers)
            # Ask for the key type we already know the host by, as OpenSSH does; otherwise
            # a host known by its RSA or ECDSA key would offer ed25519 and look changed.
            known = (
                [pinned_key.get_name()] if pinned_key is not None else policy.known_types(target)
            )
            options.key_types = _first(known, options.key_types)
            # A port that accepts but never speaks (sshd still starting behind a listening
            # socket, a middlebox) must fail this attempt within connect_timeout, as a
            # refused one does, so that the caller's boot retries apply to it too.
            transport.banner_timeout = connect_timeout
            try:
                transport.start_client(timeout=connect_timeout)
                # start_client returns quietly when its timeout passes mid-handshake.
                key = transport.get_remote_server_key()
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise ProvisionError(_handshake_failure(target, exc, connect_timeout)) from exc
            if pinned_key is not None and expected_key:
                if key != pinned_key:
                    raise HostKeyError(
                        f"{target}: the host presented {key.get_name()} {_fingerprint(key)}, "
                        f"not the key the provider gave this machine "
                        f"({pinned_key.get_name()} {_fingerprint(pinned_key)}); refusing to "
                        f"connect. Something else answers at this address."
                    )
            elif pinned_key is not None:
                if key != pinned_key:
                    raise HostKeyError(
                        f"{target}: the host key changed while the pool was running "
                        f"(now {key.get_name()} {_fingerprint(key)}); refusing to reconnect"
                    )
            else:
                policy.check(target, key)
            _authenticate(transport, target, key_file)
            # Keepalives are sent from the transport's reader when its socket read times
            # out; paramiko set that timeout, and it must stay (no settimeout(None) here).
            transport.set_keepalive(max(1, int(keepalive)))
        except BaseException:
            transport.close()
            raise
        return cls(target, transport)

    @property
    def alive(self) -> bool:
        return bool(self.transport.is_active())

    def exec(self, command: str) -> paramiko.Channel:
        """Start ``command`` on the host; its stdin, stdout and stderr are the channel."""
        import paramiko

        try:
            channel = self.transport.open_session(timeout=15.0)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ProvisionError(f"{self.target}: could not run a command: {exc}") from exc
        try:
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            channel.close()  # not left open on the connection
            raise ProvisionError(f"{self.target}: could not run a command: {exc}") from exc
        return channel

    def run(
        self,
        command: str,
        *,
        on_line: Callable[[str], None] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
    ) -> tuple[int, str]:
        """Run ``command`` to its end; stdout and stderr merged, streamed line by line.

        Returns the exit status (-1 if the link ended first) and everything it printed.
        """
        channel = self.exec(command)
        try:
            channel.set_combine_stderr(True)
            channel.settimeout(timeout)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            chunks: list[bytes] = []
            partial = b""
            while True:
                try:
                    data = channel.recv(1 << 16)
                except TimeoutError as exc:
                    raise ProvisionError(
                        f"{self.target}: {command!r} did not finish within {timeout} s"
                    ) from exc
                if not data:
                    break
                chunks.append(data)
                lines = (partial + data).split(b"\n")
                partial = lines.pop()
                if on_line is not None:
                    for line in lines:
                        on_line(line.decode("utf-8", "replace"))
            if partial and on_line is not None:
                on_line(partial.decode("utf-8", "replace"))
            status = channel.recv_exit_status()
            return status, b"".join(chunks).decode("utf-8", "replace")
        finally:
            channel.close()

    def upload(self, data: bytes, path: str, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` on the host, atomically (a temporary name, then rename).

        Over SFTP when the host offers it; a host whose sshd has no SFTP subsystem (hardened
        hosts, some appliances) gets the bytes on the stdin of ``cat`` instead. A relative
        ``path`` is from the login directory either way."""
        import paramiko

        partial = f"{path}.part-{os.getpid()}-{threading.get_ident()}"
        try:
            sftp = self._sftp()
        except _NoSFTP:
            self._upload_by_exec(data, path, partial, mode)
            return
        try:
            with sftp:
                with sftp.open(partial, "wb") as file:
                    file.set_pipelined(True)
                    file.write(data)
                sftp.chmod(partial, mode)
                sftp.posix_rename(partial, path)
        except (paramiko.SSHException, OSError) as exc:
            raise ProvisionError(f"{self.target}: could not upload {path}: {exc}") from exc

    def _upload_by_exec(self, data: bytes, path: str, partial: str, mode: int) -> None:
        """``upload`` through a shell: ``cat`` into a temporary name, chmod, rename."""
        quoted, temporary = shlex.quote(path), shlex.quote(partial)
        command = (
            f"cat > {temporary} && chmod {mode:o} {temporary} && mv -f {temporary} {quoted} "
            f"|| {{ status=$?; rm -f {temporary}; exit $status; }}"
        )
        status, output = self.run(command, stdin=data, timeout=600.0)
        if status != 0:
            raise ProvisionError(
                f"{self.target}: could not upload {path}: the host has no SFTP subsystem, and "
                f"writing it through the shell failed (exit status {status}): "
                f"{output.strip()[-500:] or 'no output'}"
            )

    def _sftp(self) -> paramiko.SFTPClient:
        """An SFTP session; ``_NoSFTP`` when the host refuses the subsystem."""
        import paramiko

        try:
            sftp = paramiko.SFTPClient.from_transport(self.transport)
        except (paramiko.SSHException, EOFError) as exc:
            # sshd closes the channel when no "Subsystem sftp" line is configured; a dead
            # connection is said by the fallback's own attempt to open a channel.
            raise _NoSFTP(str(exc)) from exc
        if sftp is None:
            raise _NoSFTP("the SFTP subsystem is not available")
        return sftp

    def close(self) -> None:
        self.transport.close()


class _NoSFTP(Exception):
    """The host offers no SFTP subsystem (``upload`` then writes through the shell)."""


def _handshake_failure(target: Target, exc: BaseException, timeout: float) -> str:
    text = str(exc)
    if "banner" in text or "No existing session" in text or "timed out" in text.lower():
        return (
            f"{target}: port {target.port} accepted the connection but no SSH server answered "
            f"within {timeout:g} s (no SSH banner: sshd may still be starting, or something "
            f"else holds the port)"
        )
    return f"{target}: SSH handshake failed: {text}"


def parse_public_key(text: str) -> paramiko.PKey:
    """``"ssh-ed25519 AAAA... [comment]"`` as a paramiko key; ``ValueError`` if it is not one."""
    import base64

    import paramiko

    parts = text.split()
    if len(parts) < 2:
        raise ValueError(f"not an OpenSSH public key: {text!r}")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
    except (paramiko.SSHException, ValueError, TypeError) as exc:
        raise ValueError(f"not an OpenSSH public key: {text[:40]!r}...: {exc}") from exc


def _connect_socket(target: Target, timeout: float, dead_after: float) -> socket.socket:
    try:
        sock = socket.create_connection((target.host, target.port), timeout=timeout)
    except TimeoutError as exc:
        raise ProvisionError(
            f"{target}: connecting timed out after {timeout:g} s; is the host up, and is "
            f"port {target.port} open to this machine?"
        ) from exc
    except ConnectionRefusedError as exc:
        raise ProvisionError(
            f"{target}: connection refused; is sshd running and listening on port {target.port}?"
        ) from exc
    except OSError as exc:
        raise ProvisionError(f"{target}: cannot connect: {exc}") from exc
    # Small frames (a call, a result) must not wait for Nagle: this alone takes a round
    # trip from tens of milliseconds to a fraction of one.
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(dead_after * 1000))
    except OSError as exc:
        sock.close()
        raise ProvisionError(f"{target}: cannot configure the connection: {exc}") from exc
    return sock


def _authenticate(transport: paramiko.Transport, target: Target, key_file: Path | None) -> None:
    import paramiko

    tried: list[str] = []
    keys: list[tuple[str, Any]] = []
    if key_file is not None:
        try:
            keys.append((str(key_file), paramiko.PKey.from_path(str(key_file))))
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise ProvisionError(f"{target}: cannot load the key {key_file}: {exc}") from exc
    else:
        try:
            keys += [(f"agent key {k.get_name()}", k) for k in paramiko.Agent().get_keys()]
        except paramiko.SSHException:
            pass  # no agent
        for path in default_key_files():
            try:
                keys.append((str(path), paramiko.PKey.from_path(str(path))))
            except (OSError, paramiko.SSHException, ValueError):
                continue  # encrypted or unreadable: the agent may hold it
    for label, key in keys:
        tried.append(label)
        try:
            transport.auth_publickey(target.user, key)
        except paramiko.AuthenticationException:
            continue
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ProvisionError(f"{target}: authentication failed: {exc}") from exc
        if transport.is_authenticated():
            return
    if not tried:
        raise ProvisionError(
            f"{target}: no SSH key to log in with: no agent, and none of ~/.ssh/id_ed25519, "
            f"id_ecdsa, id_rsa. Pass key='path/to/private_key'."
        )
    raise ProvisionError(
        f"{target}: authentication failed for user {target.user!r} with "
        f"{', '.join(tried)}. Check that the public key is in that user's "
        f"~/.ssh/authorized_keys on the host."
    )


# Written beside a pool key: who it belongs to (see PoolKey.label).
ABOUT_FILE = "about.json"
KEY_PREFIX = "skyward-key-"


class PoolKey:
    """An ed25519 key made for one pool: mode 0600 in a private directory, deleted on close.

    Cloud providers put its public half on the machines they create.
    """

    def __init__(self, directory: Path | None = None) -> None:
        import tempfile

        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        private = Ed25519PrivateKey.generate()
        pem = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        self._directory = Path(tempfile.mkdtemp(prefix=KEY_PREFIX, dir=directory))
        self.path = self._directory / "id_ed25519"
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(pem)
        except BaseException:
            self.delete()  # no half-written key directory left behind
            raise
        self.public = (
            private.public_key()
            .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            .decode()
        )

    @classmethod
    def existing(cls, directory: Path) -> PoolKey:
        """A pool key made earlier, found in ``directory`` (machines kept warm, adopted by
        the next pool, which deletes it with them); its public half is on the machines."""
        key = cls.__new__(cls)
        key._directory = directory
        key.path = directory / "id_ed25519"
        key.public = ""
        return key

    @property
    def directory(self) -> Path:
        return self._directory

    def label(self, about: Mapping[str, str]) -> None:
        """Say whose key this is (provider, region, pool, key pair), in ``about.json`` beside
        it: ``skyward ls`` lists a key whose client died, ``skyward down`` removes it once
        the pool's key pair is gone."""
        import json

        (self._directory / ABOUT_FILE).write_text(json.dumps(dict(about)))

    def delete(self) -> None:
        """Idempotent."""
        import shutil

        shutil.rmtree(self._directory, ignore_errors=True)
