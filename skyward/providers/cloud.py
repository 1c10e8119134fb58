"""What the cloud providers share, with no cloud SDK: the user data a VM boots with, its SSH
host key, the client's address for the SSH rule, and "create, then open, or destroy".

::

    client                                            VM, first boot (cloud-init)
    ──────────────────────────────────────────        ─────────────────────────────────────
    HostKey.generate()  ── user data ─────────────>   ssh_keys: the host key we made; no other
    PoolKey().public    ── user data (+ key pair) ─>  ssh_authorized_keys: the login user's key
    watchdog_script()   ── user data ─────────────>   write_files + runcmd: the idle watchdog
    open_hosts(host_key=HostKey.public)               sshd presents that key: the first
                                                      connection already checks a known key

The user data is cloud-init's ``#cloud-config`` (stock Ubuntu images and the Deep Learning
AMIs run it at boot), written as JSON, which YAML reads as it is. The idle watchdog is a
POSIX sh loop (no systemd needed) that powers the machine off when no SSH client has been
connected for ``idle_timeout`` seconds; the clouds turn a power-off into a deletion (AWS:
``InstanceInitiatedShutdownBehavior=terminate``). It counts ESTABLISHED connections on sshd's
port, so a long job with its client attached is never stopped, and a client that vanished
(SIGKILL, a laptop closed) is let go by sshd's own keepalive within a minute.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from skyward._errors import ProvisionError
from skyward._futures import Deadline
from skyward.providers.base import Allocation

A = TypeVar("A", bound=Allocation)

WATCHDOG_PATH = "/usr/local/sbin/skyward-watchdog"
# sshd drops a client that answers none of 4 probes 15 s apart: a vanished client's
# connection ends within a minute, and the watchdog's idle time starts counting.
SSHD_DROPIN_PATH = "/etc/ssh/sshd_config.d/60-skyward.conf"
SSHD_DROPIN = "ClientAliveInterval 15\nClientAliveCountMax 4\n"
DEFAULT_IP_LOOKUP = "https://checkip.amazonaws.com"


@dataclass(frozen=True)
class HostKey:
    """An ed25519 SSH host key made by the client for the machines of one pool.

    The pool's machines share it: any one of them could pose as another of the same pool
    (one trust domain), and nothing outside the pool can pose as any of them.
    """

    private: str  # OpenSSH PEM
    public: str  # "ssh-ed25519 AAAA..."

    @classmethod
    def generate(cls) -> HostKey:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ).decode()
        public = (
            key.public_key()
            .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            .decode()
        )
        return cls(private=private, public=public)


def watchdog_script() -> str:
    """The idle watchdog: ``skyward-watchdog IDLE [PORT] [EVERY] [FIRST]`` (seconds).

    Time is read from ``/proc/uptime``, which the clock synchronised at boot cannot make
    jump. Until a first client arrives the bound is ``FIRST`` (default ``IDLE``): a machine
    waits for its client as long as the client waits for it, and one whose client never
    comes (it crashed while creating the pool) still goes ``FIRST`` seconds after boot.
    """
    return r"""#!/bin/sh
# Skyward idle watchdog: power this machine off when no SSH client has been connected to
# port PORT for IDLE seconds. Started by cloud-init (runcmd); needs only sh and /proc.
idle=${1:?usage: skyward-watchdog IDLE_SECONDS [PORT] [EVERY_SECONDS] [FIRST_CLIENT_SECONDS]}
port=${2:-22}
every=${3:-10}
bound=${4:-$idle}  # until the first client has come
suffix=$(printf ':%04X' "$port")

say() {
    echo "skyward-watchdog: $*" >&2
    logger -t skyward-watchdog "$*" 2>/dev/null || true
}

uptime_s() {
    read -r up _ < /proc/uptime
    echo "${up%.*}"
}

# An ESTABLISHED (state 01) TCP connection whose local port is sshd's.
attached() {
    for table in /proc/net/tcp /proc/net/tcp6; do
        [ -r "$table" ] || continue
        while read -r _ local _ state _; do
            case $local in
                *"$suffix") [ "$state" = 01 ] && return 0 ;;
            esac
        done < "$table"
    done
    return 1
}

say "powering off after ${idle}s without an SSH client on port $port (${bound}s for the first)"
last=$(uptime_s)
while :; do
    now=$(uptime_s)
    if attached; then
        last=$now
        bound=$idle
    elif [ $((now - last)) -ge "$bound" ]; then
        say "no SSH client for $((now - last))s: powering off"
        poweroff || shutdown -h now || halt -p
        sleep 60
    fi
    sleep "$every"
done
"""


def user_data(
    *,
    host_key: HostKey,
    authorized_key: str,
    idle_timeout: float,
    first_client_timeout: float | None = None,
    ssh_port: int = 22,
) -> str:
    """The ``#cloud-config`` a pool's machines boot with. The watchdog powers a machine off
    after ``idle_timeout`` without an SSH client, or ``first_client_timeout`` (default: the
    same) while it waits for its first one."""
    idle = max(1, round(idle_timeout))
    first = max(idle, round(first_client_timeout or 0))
    every = max(1, min(10, idle // 6))  # notice idleness within about a sixth of the bound
    watchdog = shlex.join([WATCHDOG_PATH, str(idle), str(ssh_port), str(every), str(first)])
    config = {
        # Only the host key we made: the image's keys are deleted, and cloud-init generates
        # none when ssh_keys is given (its schema refuses an empty ssh_genkeytypes).
        "ssh_deletekeys": True,
        "ssh_keys": {"ed25519_private": host_key.private, "ed25519_public": host_key.public},
        "ssh_authorized_keys": [authorized_key],
        "write_files": [
            {
                "path": WATCHDOG_PATH,
                "owner": "root:root",
                "permissions": "0755",
                "content": watchdog_script(),
            },
            {"path": SSHD_DROPIN_PATH, "permissions": "0644", "content": SSHD_DROPIN},
        ],
        "runcmd": [
            # The drop-in may land after sshd started; a reload reads it (no systemd: no-op).
            ["sh", "-c", "systemctl reload ssh || systemctl reload sshd || true"],
            ["sh", "-c", f"setsid {watchdog} </dev/null >/dev/null 2>&1 &"],
        ],
    }
    return "#cloud-config\n" + json.dumps(config, indent=1) + "\n"


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


def open_or_destroy(allocation: A, build: Callable[[A], None]) -> A:
    """Run ``build``, which creates resources, records each on ``allocation`` as soon as it
    exists, and reaches the machines; on any failure, Ctrl-C included, terminate what it
    recorded and re-raise.

    The clean-up runs on its own thread and is waited for even through another Ctrl-C: a
    second Ctrl-C must not turn a failed start into a running GPU bill. It is bounded by the
    allocation's own waits, not by the start's deadline, which may be what just passed.
    """
    try:
        build(allocation)
    except BaseException as exc:
        failure = _run_shielded(allocation.terminate)
        if failure is not None:
            exc.add_note(f"and cleaning up failed: {failure}")
        raise
    return allocation


def _run_shielded(fn: Callable[[], None]) -> BaseException | None:
    """Run ``fn`` on its own thread to the end, through any Ctrl-C; what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="skyward-cleanup")
    thread.start()
    while thread.is_alive():
        try:
            thread.join()
        except KeyboardInterrupt:
            continue  # see open_or_destroy: the clean-up finishes first
    return errors[0] if errors else None


class WatchedDeadline(Deadline):
    """A deadline that ends with ``parent`` and can also be failed, with a reason, by a watcher
    of the machines being reached: a spot instance reclaimed while it booted fails the start
    at once instead of being retried until ``boot_timeout``."""

    def __init__(self, parent: Deadline) -> None:
        super().__init__(parent.remaining(), parent.what)
        self._parent = parent
        self._failure: str | None = None

    @property
    def failure(self) -> str | None:
        return self._failure

    def fail(self, reason: str) -> None:
        self._failure = reason
        self.cancel(reason)  # wakes whoever sleeps on this deadline

    def check(self, doing: str) -> None:
        self._parent.check(doing)
        if self._failure is not None:
            raise ProvisionError(f"{doing}: {self._failure}")
        super().check(doing)
