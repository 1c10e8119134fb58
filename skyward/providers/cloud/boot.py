"""What a cloud VM boots with: the SSH host key the client made for it, the login key, and the
idle watchdog, as cloud-init user data.

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

A pool closed with ``keep_warm`` leaves its machines for the next pool like it: before it
lets go it writes ``KEEP_FILE`` in the login user's home (``keep_command``), an uptime until
which the watchdog keeps the machine with no client, and ends it when that passes, whether
or not a client came back; the pool that adopts the machine removes it (``unkeep_command``)
and the idle bound holds again.

Where a machine powered off from inside is still billed (GCP keeps its disk, Azure its
compute), the watchdog also runs ``release_script``: the machine deletes itself through the
cloud's API with a token from the metadata server. This module writes that script's frame
(token, the API calls asked in turn, what is said); each cloud gives its metadata server,
how the machine finds its own name, and the calls (``gcp/api.py``,
``azure/watchdog.py``).
"""

from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

WATCHDOG_PATH = "/usr/local/sbin/skyward-watchdog"
# What the watchdog (and a release it runs) said, kept on the machine: why it powered off or
# deleted itself, for whoever reads its disk or console later (syslog has it too).
WATCHDOG_LOG = "/var/log/skyward-watchdog.log"
# Run by the watchdog, when present, just before it powers the machine off: a cloud whose
# powered-off machines are kept (and bill their disks) deletes the machine there (GCP).
BEFORE_POWEROFF_PATH = "/usr/local/sbin/skyward-before-poweroff"
# sshd drops a client that answers none of 4 probes 15 s apart: a vanished client's
# connection ends within a minute, and the watchdog's idle time starts counting.
SSHD_DROPIN_PATH = "/etc/ssh/sshd_config.d/60-skyward.conf"
SSHD_DROPIN = "ClientAliveInterval 15\nClientAliveCountMax 4\n"
# In the login user's home: the uptime (whole seconds) until which the machine is kept warm
# with no client (a pool closed with keep_warm). The user writes it; the watchdog, root,
# only reads a number from it.
KEEP_FILE = ".skyward-keep-until"


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
    is gone. What it does is said on stderr, to syslog, and in ``WATCHDOG_LOG`` (or
    ``$SKYWARD_WATCHDOG_LOG``), with what a release it runs says.

    ``$SKYWARD_WATCHDOG_KEEP`` names a file (``KEEP_FILE``) that may hold an uptime: until
    then the machine is kept with no client (``keep_warm``), and once it passes the machine
    ends at once, whatever the idle bound says.
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

log=${SKYWARD_WATCHDOG_LOG:-/var/log/skyward-watchdog.log}  # WATCHDOG_LOG
export SKYWARD_WATCHDOG_LOG="$log"  # the release it runs writes there too
keep=${SKYWARD_WATCHDOG_KEEP:-}  # KEEP_FILE: kept warm until this uptime, with no client

say() {
    echo "skyward-watchdog: $*" >&2
    logger -t skyward-watchdog "$*" 2>/dev/null || true
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) skyward-watchdog: $*" >>"$log" 2>/dev/null || true
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

# The uptime until which a pool that closed asked to keep this machine (0: none asked).
kept_until() {
    kept=0
    if [ -n "$keep" ] && [ -r "$keep" ]; then
        read -r kept _ < "$keep" 2>/dev/null || kept=0
    fi
    case $kept in ''|*[!0-9]*) kept=0 ;; esac
    echo "$kept"
}

# The machine's last act: the cloud's own (ACTION), or power off.
end_machine() {
    if [ -n "$action" ]; then
        say "$1: running $action"
        "$action" || say "$action failed; trying again in a minute"
    else
        say "$1: powering off"
        hook=/usr/local/sbin/skyward-before-poweroff  # BEFORE_POWEROFF_PATH
        [ -x "$hook" ] && "$hook"
        poweroff || shutdown -h now || halt -p
    fi
}

say "powering off after ${idle}s without an SSH client on port $port (${bound}s for the first)"
last=$(uptime_s)
held=0
while :; do
    now=$(uptime_s)
    kept=$(kept_until)
    if attached; then
        last=$now
        bound=$idle
    elif [ "$kept" -gt 0 ]; then
        if [ "$kept" != "$held" ]; then
            held=$kept
            say "kept warm for $((kept - now))s with no client (until ${kept}s of uptime)"
        fi
        if [ "$now" -lt "$kept" ]; then
            last=$now  # kept: not idle
        else
            end_machine "kept warm until ${kept}s of uptime and no pool came for it"
            sleep 60
        fi
    elif [ $((now - last)) -ge "$bound" ]; then
        end_machine "no SSH client for $((now - last))s"
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
    user: str | None = None,
) -> str:
    """The ``#cloud-config`` a pool's machines boot with. The watchdog powers a machine off
    after ``idle_timeout`` without an SSH client, or ``first_client_timeout`` (default: the
    same) while it waits for its first one: a client that gave up (or died) before it ever
    connected costs that long, not ``idle_timeout`` (see ``first_client_bound``). Or it runs
    ``idle_action`` (a command's path) instead of powering off. ``files`` are more cloud-init
    ``write_files`` entries (a cloud's own scripts, such as its ``BEFORE_POWEROFF_PATH``).
    ``user``: the login user, whose ``KEEP_FILE`` the watchdog reads (``keep_warm``)."""
    watchdog = watchdog_command(
        idle_timeout=idle_timeout,
        first_client_timeout=first_client_timeout,
        ssh_port=ssh_port,
        idle_action=idle_action,
        user=user,
    )
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


@dataclass(frozen=True)
class Boot:
    """What every machine of a pool boots with, made once by the start: the host key the
    client made, the login key, the idle watchdog and its last act. Two carriers, one
    payload: ``cloud_config()`` for images that run cloud-init (the clouds' VMs),
    ``start_script()`` for images that do not (a marketplace's containers, which run a start
    command). ``idle_action``: a command the watchdog runs instead of powering off (Azure's
    self-delete; a container's ``END_CONTAINER``); ``files``: more files to write
    (``{"path", "content", "permissions"}``), such as a cloud's ``BEFORE_POWEROFF_PATH``."""

    host_key: HostKey
    authorized_key: str
    user: str
    idle_timeout: float
    first_client_timeout: float | None = None
    ssh_port: int = 22
    idle_action: str | None = None
    files: tuple[Mapping[str, str], ...] = ()

    def with_last_act(
        self, *, idle_action: str | None = None, files: Sequence[Mapping[str, str]] = ()
    ) -> Boot:
        """The same payload with the cloud's own last act (a self-delete, a hook)."""
        return replace(self, idle_action=idle_action, files=(*self.files, *files))

    def cloud_config(self) -> str:
        """The payload as cloud-init user data (``#cloud-config``)."""
        return user_data(
            host_key=self.host_key,
            authorized_key=self.authorized_key,
            idle_timeout=self.idle_timeout,
            first_client_timeout=self.first_client_timeout,
            ssh_port=self.ssh_port,
            idle_action=self.idle_action,
            files=self.files,
            user=self.user,
        )

    def start_script(self) -> str:
        """The payload as a POSIX sh script, run as root by an image with no cloud-init
        before (or as) its main process: the same files, host key, login key, sshd
        settings and watchdog that ``cloud_config`` gives, and sshd started (installed
        from the image's apt when it lacks one)."""
        q = shlex.quote
        files = [
            {"path": WATCHDOG_PATH, "permissions": "0755", "content": watchdog_script()},
            {"path": SSHD_DROPIN_PATH, "permissions": "0644", "content": SSHD_DROPIN},
            *self.files,
        ]
        written = "\n".join(
            f"write {q(entry['path'])} {q(entry.get('permissions', '0644'))} "
            f"{q(base64.b64encode(entry['content'].encode()).decode())}"
            for entry in files
        )
        key = "/etc/ssh/ssh_host_ed25519_key"
        return f"""#!/bin/sh
# Skyward: boot this machine for its pool (the payload cloud-init carries elsewhere).
set -eu
umask 022
write() {{  # PATH MODE BASE64
    mkdir -p "$(dirname "$1")"
    printf '%s' "$3" | base64 -d >"$1"
    chmod "$2" "$1"
}}
{written}
# Only the host key the client made: the client checks it on its first connection.
mkdir -p /etc/ssh /run/sshd
rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub
write {key} 0600 {q(base64.b64encode(self.host_key.private.encode()).decode())}
printf '%s\n' {q(self.host_key.public)} >{key}.pub
user={q(self.user)}
if ! id "$user" >/dev/null 2>&1; then
    useradd -m -s /bin/sh "$user" 2>/dev/null || adduser -D "$user"
    usermod -p '*' "$user" 2>/dev/null || true  # no password, not locked: sshd takes the key
fi
home=$(getent passwd "$user" | cut -d: -f6)
mkdir -p "$home/.ssh"
printf '%s\n' {q(self.authorized_key)} >>"$home/.ssh/authorized_keys"
chmod 700 "$home/.ssh"
chmod 600 "$home/.ssh/authorized_keys"
chown -R "$user" "$home/.ssh"
if ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends openssh-server >/dev/null
fi
/usr/sbin/sshd -p {self.ssh_port} -o HostKey={key} -o PasswordAuthentication=no ||
    echo "skyward: sshd did not start" >&2
setsid {self._watchdog()} </dev/null >/dev/null 2>&1 &
"""

    def _watchdog(self) -> str:
        return watchdog_command(
            idle_timeout=self.idle_timeout,
            first_client_timeout=self.first_client_timeout,
            ssh_port=self.ssh_port,
            idle_action=self.idle_action,
            user=self.user,
        )


def watchdog_command(
    *,
    idle_timeout: float,
    first_client_timeout: float | None,
    ssh_port: int,
    idle_action: str | None,
    user: str | None = None,
) -> str:
    """The watchdog's command line: its bounds in whole seconds, and its last act; with
    ``user``, the ``KEEP_FILE`` in that user's home (found when the watchdog starts, after
    the user exists)."""
    idle = max(1, round(idle_timeout))
    first = idle if first_client_timeout is None else max(1, round(first_client_timeout))
    every = max(1, min(10, idle // 6))  # notice idleness within about a sixth of the bound
    arguments = [WATCHDOG_PATH, str(idle), str(ssh_port), str(every), str(first)]
    command = shlex.join([*arguments, *([idle_action] if idle_action else [])])
    if user is None:
        return command
    home = f"$(getent passwd {shlex.quote(user)} | cut -d: -f6)"
    return f'env SKYWARD_WATCHDOG_KEEP="{home}/{KEEP_FILE}" {command}'


def keep_command(seconds: float) -> str:
    """What the login user runs to keep its machine warm for ``seconds`` with no client
    (written whole, then renamed: the watchdog never reads half a number)."""
    keep = max(1, round(seconds))
    return (
        f"read -r up _ < /proc/uptime && "
        f"echo $((${{up%.*}} + {keep})) > ~/{KEEP_FILE}.tmp && "
        f"mv -f ~/{KEEP_FILE}.tmp ~/{KEEP_FILE}"
    )


def unkeep_command() -> str:
    """What the pool that adopts a warm machine runs: the idle bound holds again."""
    return f"rm -f ~/{KEEP_FILE}"


# A container has nothing to power off: its watchdog ends the container's main process.
END_CONTAINER_PATH = "/usr/local/sbin/skyward-end-container"
END_CONTAINER = {
    "path": END_CONTAINER_PATH,
    "permissions": "0755",
    "content": "#!/bin/sh\n# Skyward: the client is gone; end this container.\nkill -TERM 1\n",
}


# A release whose calls went unanswered is tried this many times in all, this far apart.
RELEASE_TRIES = 3
RELEASE_PAUSE = 10


def release_script(
    *,
    metadata: str,
    header: str,
    token: str,
    find: str,
    steps: Sequence[tuple[str, str, str]],
    trust: str = "",
    tries: int = RELEASE_TRIES,
    pause: float = RELEASE_PAUSE,
) -> str:
    """What a machine runs to end its own billing through its cloud's API, once its client is
    gone (GCP: before it powers off; Azure: instead). The token comes from the cloud's
    metadata server, as the machine's own identity: no secret travels to the machine.

    ``metadata``: the metadata server's base URL, ``header`` the header it wants, ``token``
    the token's path there; ``find``: sh that sets what the steps name (this machine's name
    or id), run in each round (``return 2`` there: worth another round); ``steps``:
    (method, URL, what it does) asked in turn until one is accepted (a 2xx); ``trust``: sh
    that sets ``cacert`` to a CA bundle for a private endpoint.

    A round that went unanswered (no token, a timeout, HTTP 408, 429 or 5xx) is tried
    again, ``tries`` rounds in all, ``pause`` seconds apart: a machine that gave up on a
    passing hiccup would stay stopped, and billed, until ``skyward down``. A plain refusal
    (403: no permission) is not tried again. Exits 1 when no call was accepted: the caller
    powers off, or tries again later. Needs sh, sed and curl, which every Ubuntu image has.
    """
    q = shlex.quote
    # Said before it is asked: once the cloud deletes the machine, nothing more is written.
    asks = "\n".join(
        f'    say "{doing}"\n'
        f'    status=$(api {method} "{url}")\n'
        "    case $status in\n"
        '        2??) say "accepted (HTTP $status)"; exit 0 ;;\n'
        "        000 | 408 | 429 | 5??) again=2 ;;\n"
        "    esac\n"
        '    say "refused (HTTP $status)"'
        for method, url, doing in steps
    )
    found = "\n".join(f"    {line}" for line in find.strip().splitlines())
    return f"""#!/bin/sh
# Skyward: end this machine's billing through the cloud's API; its client is gone.
{trust or "cacert="}
say() {{
    echo "skyward-release: $*" >&2
    logger -t skyward-release "$*" 2>/dev/null || true
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) skyward-release: $*" \\
        >>"${{SKYWARD_WATCHDOG_LOG:-{WATCHDOG_LOG}}}" 2>/dev/null || true
}}
metadata() {{
    curl -sS --max-time 20 --noproxy '*' -H {q(header)} {q(metadata.rstrip("/"))}/"$1"
}}
api() {{  # METHOD URL: prints the HTTP status
    curl -sS --max-time 60 ${{cacert:+--cacert "$cacert"}} -o /dev/null -w '%{{http_code}}' \\
        -X "$1" -H "Authorization: Bearer $token" -H 'Content-Length: 0' "$2"
}}
# One round: exits 0 once a call is accepted; returns 2 where another round may fare better.
round() {{
    again=1
    token=$(metadata {q(token)} | sed -n 's/.*"access_token" *: *"\\([^"]*\\)".*/\\1/p')
    [ -n "$token" ] || {{ say "no token from the metadata server"; return 2; }}
{found}
{asks}
    return $again
}}
tries={max(1, tries)}
while :; do
    round
    [ $? -eq 2 ] && [ $((tries -= 1)) -gt 0 ] || exit 1
    say "trying again in {pause:g}s"
    sleep {pause:g}
done
"""


# Past the client's own boot_timeout: the client starts counting when the cloud says the
# machine runs, the watchdog only once cloud-init runs, so this covers the boot between.
FIRST_CLIENT_MARGIN = 120.0


def first_client_bound(boot_timeout: float) -> float:
    """How long a new machine waits for its first SSH client before powering itself off:
    the client's ``boot_timeout`` (it stops trying after that) and a margin."""
    return boot_timeout + FIRST_CLIENT_MARGIN
