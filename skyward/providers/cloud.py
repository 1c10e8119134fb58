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
import os
import shlex
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skyward._errors import ProvisionError
from skyward._futures import Deadline
from skyward._shield import finish
from skyward.providers.base import Allocation
from skyward.providers.ssh.hosts import Access

A = TypeVar("A", bound=Allocation)

WATCHDOG_PATH = "/usr/local/sbin/skyward-watchdog"
# Run by the watchdog, when present, just before it powers the machine off: a cloud whose
# powered-off machines are kept (and bill their disks) deletes the machine there (GCP).
BEFORE_POWEROFF_PATH = "/usr/local/sbin/skyward-before-poweroff"
# sshd drops a client that answers none of 4 probes 15 s apart: a vanished client's
# connection ends within a minute, and the watchdog's idle time starts counting.
SSHD_DROPIN_PATH = "/etc/ssh/sshd_config.d/60-skyward.conf"
SSHD_DROPIN = "ClientAliveInterval 15\nClientAliveCountMax 4\n"
DEFAULT_IP_LOOKUP = "https://checkip.amazonaws.com"
# On everything one provision creates, besides the pool's tags: a value unique to that
# provision (the pool's name need not be unique), so that its clean-up can sweep for what
# a create call cut off in flight made, and never touch another run's resources.
TAG_ALLOCATION = "skyward-allocation"


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
    """The idle watchdog: ``skyward-watchdog IDLE [PORT] [EVERY] [FIRST] [ACTION]`` (seconds).

    Time is read from ``/proc/uptime``, which the clock synchronised at boot cannot make
    jump. Until a first client arrives the bound is ``FIRST`` (default ``IDLE``): a machine
    waits for its client as long as the client waits for it, and one whose client never
    comes (it crashed while creating the pool) still goes ``FIRST`` seconds after boot.
    ``ACTION`` is a command to run instead of powering off, for a cloud where a machine that
    powers itself off is still billed (Azure); it is run again every minute until the machine
    is gone.
    """
    return r"""#!/bin/sh
# Skyward idle watchdog: power this machine off when no SSH client has been connected to
# port PORT for IDLE seconds. Started by cloud-init (runcmd); needs only sh and /proc.
idle=${1:?usage: skyward-watchdog IDLE_SECONDS [PORT] [EVERY_SECONDS] [FIRST_SECONDS] [ACTION]}
port=${2:-22}
every=${3:-10}
bound=${4:-$idle}  # until the first client has come
action=${5:-}  # instead of powering off
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
        if [ -n "$action" ]; then
            say "no SSH client for $((now - last))s: running $action"
            "$action" || say "$action failed; trying again in a minute"
        else
            say "no SSH client for $((now - last))s: powering off"
            hook=/usr/local/sbin/skyward-before-poweroff  # BEFORE_POWEROFF_PATH
            [ -x "$hook" ] && "$hook"
            poweroff || shutdown -h now || halt -p
        fi
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
    idle_action: str | None = None,
    files: Sequence[Mapping[str, str]] = (),
) -> str:
    """The ``#cloud-config`` a pool's machines boot with. The watchdog powers a machine off
    after ``idle_timeout`` without an SSH client, or ``first_client_timeout`` (default: the
    same) while it waits for its first one: a client that gave up (or died) before it ever
    connected costs that long, not ``idle_timeout`` (see ``first_client_bound``). Or it runs
    ``idle_action`` (a command's path) instead of powering off. ``files`` are more cloud-init
    ``write_files`` entries (a cloud's own scripts, such as its ``BEFORE_POWEROFF_PATH``)."""
    idle = max(1, round(idle_timeout))
    first = idle if first_client_timeout is None else max(1, round(first_client_timeout))
    every = max(1, min(10, idle // 6))  # notice idleness within about a sixth of the bound
    arguments = [WATCHDOG_PATH, str(idle), str(ssh_port), str(every), str(first)]
    watchdog = shlex.join([*arguments, *([idle_action] if idle_action else [])])
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
            *(dict(entry) for entry in files),
        ],
        "runcmd": [
            # The drop-in may land after sshd started; a reload reads it (no systemd: no-op).
            ["sh", "-c", "systemctl reload ssh || systemctl reload sshd || true"],
            ["sh", "-c", f"setsid {watchdog} </dev/null >/dev/null 2>&1 &"],
        ],
    }
    return "#cloud-config\n" + json.dumps(config, indent=1) + "\n"


# Past the client's own boot_timeout: the client starts counting when the cloud says the
# machine runs, the watchdog only once cloud-init runs, so this covers the boot between.
FIRST_CLIENT_MARGIN = 120.0


def first_client_bound(boot_timeout: float) -> float:
    """How long a new machine waits for its first SSH client before powering itself off:
    the client's ``boot_timeout`` (it stops trying after that) and a margin."""
    return boot_timeout + FIRST_CLIENT_MARGIN


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

    The clean-up runs on its own thread and is waited for through any number of Ctrl-Cs
    (``_shield.finish``): a second Ctrl-C must not turn a failed start into a running GPU
    bill. It is bounded by the allocation's own waits, not by the start's deadline, which
    may be what just passed.
    """
    try:
        build(allocation)
    except BaseException as exc:
        failure = finish(allocation.terminate)
        if failure is not None:
            exc.add_note(f"and cleaning up failed: {failure}")
        raise
    return allocation


@dataclass(frozen=True)
class LocalKey:
    """A pool key left on this machine (``/tmp/skyward-key-*``) and whose it is, from the
    ``about.json`` its provider wrote beside it (``PoolKey.label``)."""

    directory: Path
    provider: str
    region: str
    pool: str
    key_pair: str
    endpoint: str = ""  # the API endpoint the pool was made through ("" for the cloud's own)
    pid: int = 0  # the client that made it

    @property
    def client_alive(self) -> bool:
        """Whether the client that made it still runs (then the key is in use)."""
        if self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def key_label(
    provider: str, region: str, pool: str, key_pair: str, endpoint: str
) -> dict[str, str]:
    """What a provider writes beside its pool key (``PoolKey.label``)."""
    return {
        "provider": provider,
        "region": region,
        "pool": pool,
        "key_pair": key_pair,
        "endpoint": endpoint,
        "pid": str(os.getpid()),
    }


def local_keys(root: Path | None = None) -> list[LocalKey]:
    """Every labelled pool key under ``root`` (default: the temporary directory). A client
    that ends normally deletes its own; those found belong to running pools or to clients
    that were killed."""
    from skyward.providers.ssh.connection import ABOUT_FILE, KEY_PREFIX

    found: list[LocalKey] = []
    for directory in sorted((root or Path(tempfile.gettempdir())).glob(f"{KEY_PREFIX}*")):
        try:
            about = json.loads((directory / ABOUT_FILE).read_text())
            found.append(
                LocalKey(
                    directory,
                    str(about["provider"]),
                    str(about["region"]),
                    str(about["pool"]),
                    str(about["key_pair"]),
                    str(about.get("endpoint", "")),
                    int(about.get("pid", 0)),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unlabelled (an older client) or being written: not ours to judge
    return found


def remove_local_key(key: LocalKey) -> None:
    shutil.rmtree(key.directory, ignore_errors=True)


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


_MAX_SECONDS = 7 * 24 * 3600.0


class CloudOptions(BaseModel):
    """The options every cloud provider's configuration has, validated alike (``sky.GCP``
    builds on it): who may reach SSH, how the nodes are reached, the watchdog's and the
    waits' bounds, and how workers run on the nodes."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    ssh_cidr: str = "auto"
    connect: Literal["public", "private"] = "public"
    idle_timeout: float = Field(default=1800.0, gt=0, le=_MAX_SECONDS)
    boot_timeout: float = Field(default=600.0, gt=0, le=_MAX_SECONDS)
    release_timeout: float = Field(default=600.0, gt=0, le=_MAX_SECONDS)
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

    def ssh_cidrs(self, private_ranges: Sequence[str]) -> list[str]:
        """Who may reach SSH: ``ssh_cidr``, or for ``"auto"`` this machine's public address
        (``connect="public"``) or the network's own ``private_ranges``."""
        if self.ssh_cidr == "auto" and self.connect == "private":
            return list(private_ranges)
        return [client_cidr(self.ssh_cidr, lookup_url=self.ip_lookup_url)]

    def access(self, key_file: Path) -> Access:
        """How the pool's machines are reached and prepared (the shared SSH-host layer)."""
        return Access(
            key_file=key_file,
            python=self.python,
            workdir=self.workdir,
            boot_timeout=self.boot_timeout,
        )
