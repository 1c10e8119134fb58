"""``skyward doctor``: check this machine without changing it or touching the network.

Every check reads only the interpreter, installed distribution metadata, ``PATH``,
environment variables and files under the home directory. Cloud credentials are reported by
where they were found, never by value, and never verified against the cloud: that would need
the network, and a slow or failing call is not what a first look should cost. The providers'
extras and credentials checks come from the registry (``providers/registry.py``), in its
order; each check lives in its provider's package (``providers/credentials.py``).
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Mapping
from configparser import Error as ConfigError
from importlib import metadata
from pathlib import Path

import click

import skyward
from skyward.providers.credentials import Check, CredentialsCheck, Status, read_text
from skyward.providers.registry import PROVIDERS

_SYMBOLS: dict[Status, tuple[str, str]] = {
    "ok": ("✔", "green"),
    "missing": ("·", "yellow"),  # fine for a local pool; needed for something else
    "error": ("✘", "red"),  # Skyward itself will not work
}

# extra -> the distributions it installs (pyproject.toml's optional-dependencies): the
# plugins' here, then each provider's from the registry
EXTRAS: dict[str, tuple[str, ...]] = {
    "jax": ("jax",),
    "keras": ("keras", "jax"),
    **{e.extra: e.distributions for e in PROVIDERS if e.extra},
}


@click.command()
def doctor() -> None:
    """Check Python, extras, SSH and cloud credentials; say how to fix what is missing."""
    checks = run_checks(os.environ, Path.home())
    for check in checks:
        symbol, colour = _SYMBOLS[check.status]
        click.echo(f"{click.style(symbol, fg=colour)} {check.name}: {check.detail}")
        if check.fix:
            click.echo(f"    fix: {check.fix}")
    if any(c.status == "error" for c in checks):
        raise SystemExit(1)
    click.echo("Local pools need nothing more; lines marked · matter only for what they name.")


def run_checks(env: Mapping[str, str], home: Path) -> list[Check]:
    checks: list[Check] = [check_python(), check_skyward()]
    checks += [check_extra(name) for name in EXTRAS]
    checks += [check_ssh_client(env), check_ssh_agent(env)]
    checks.append(_guarded("SSH keys", check_ssh_keys, env, home))
    for entry in PROVIDERS:
        credentials = entry.credentials_check()
        if credentials is not None:
            checks.append(_guarded(f"{entry.public} credentials", credentials, env, home))
    return checks


def _guarded(
    name: str,
    check: CredentialsCheck,
    env: Mapping[str, str],
    home: Path,
) -> Check:
    # A malformed config file must not stop the report, nor end in a traceback.
    try:
        return check(env, home)
    except (OSError, ValueError, ConfigError) as exc:
        return Check(name, "missing", f"could not read its configuration: {exc}")


def check_python() -> Check:
    # (Older Pythons cannot install skyward at all: requires-python says so.)
    major, minor, micro = sys.version_info[:3]
    detail = f"{major}.{minor}.{micro} at {sys.executable}; workers must run {major}.{minor} too"
    return Check("Python", "ok", detail)


def check_skyward() -> Check:
    required = ("click", "cloudpickle", "packaging", "pydantic", "rich")  # pyproject's dependencies
    missing = [d for d in required if not _version(d)]
    where = Path(skyward.__file__).parent
    if missing:
        return Check(
            "skyward",
            "error",
            f"{skyward.__version__} at {where}, but {', '.join(missing)} is not installed",
            f"{sys.executable} -m pip install --force-reinstall skyward",
        )
    return Check("skyward", "ok", f"{skyward.__version__} at {where}")


def check_extra(extra: str) -> Check:
    needed = EXTRAS[extra]
    absent = [d for d in needed if not _version(d)]
    if absent:
        return Check(
            f"extra [{extra}]",
            "missing",
            f"not installed (no {', '.join(absent)})",
            f"pip install 'skyward[{extra}]'",
        )
    found = ", ".join(f"{d} {_version(d)}" for d in needed)
    return Check(f"extra [{extra}]", "ok", found)


def check_ssh_client(env: Mapping[str, str]) -> Check:
    # Skyward itself talks SSH through paramiko (the [ssh] extra); the OpenSSH client is
    # only the quickest way to try a host by hand.
    ssh = shutil.which("ssh", path=env.get("PATH"))
    if ssh:
        return Check("SSH client", "ok", f"OpenSSH client at {ssh}")
    return Check(
        "SSH client",
        "missing",
        "no `ssh` on PATH; Skyward does not need it, but it is how to test a host by hand",
        "install OpenSSH's client (apt-get install openssh-client), then `ssh user@host true`",
    )


def check_ssh_agent(env: Mapping[str, str]) -> Check:
    # Only the socket's presence: talking to the agent would open a connection.
    socket_path = env.get("SSH_AUTH_SOCK")
    if not socket_path:
        return Check(
            "SSH agent",
            "missing",
            "SSH_AUTH_SOCK is not set; keys come from ~/.ssh or SSH(key=...) only",
            "start one with `eval $(ssh-agent)` and `ssh-add`, if your keys have passphrases",
        )
    try:
        is_socket = stat.S_ISSOCK(os.stat(socket_path).st_mode)
    except OSError:
        is_socket = False
    if not is_socket:
        return Check(
            "SSH agent",
            "missing",
            f"SSH_AUTH_SOCK names {socket_path}, which is not a socket (a stale agent?)",
            "start a new agent with `eval $(ssh-agent)` and `ssh-add`",
        )
    return Check("SSH agent", "ok", f"socket at {socket_path}")


def check_ssh_keys(env: Mapping[str, str], home: Path) -> Check:
    from skyward.providers.ssh.connection import default_key_files

    keys = default_key_files(home)
    known = home / ".ssh" / "known_hosts"
    hosts = (
        f"{known} has {_entries(known)} host key(s)"
        if known.is_file()
        else f"no {known}: a first connection needs SSH(accept_new_hosts=True) or `ssh` once"
    )
    if keys:
        return Check("SSH keys", "ok", f"{', '.join(str(k) for k in keys)}; {hosts}")
    agent = " (the agent's keys are tried too)" if env.get("SSH_AUTH_SOCK") else ""
    return Check(
        "SSH keys",
        "missing",
        f"none of id_ed25519, id_ecdsa, id_rsa in {home / '.ssh'}{agent}; {hosts}",
        "`ssh-keygen -t ed25519` and `ssh-copy-id user@host`, or pass SSH(key='path/to/key')",
    )


def _entries(path: Path) -> int:
    lines = read_text(path).splitlines()
    return sum(1 for line in lines if line.strip() and not line.startswith("#"))


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
