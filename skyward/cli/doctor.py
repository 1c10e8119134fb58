"""``skyward doctor``: check this machine without changing it or touching the network.

Every check reads only the interpreter, installed distribution metadata, ``PATH``,
environment variables and files under the home directory. Cloud credentials are reported by
where they were found, never by value, and never verified against the cloud: that would need
the network, and a slow or failing call is not what a first look should cost.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Callable, Mapping
from configparser import ConfigParser
from configparser import Error as ConfigError
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

import click

import skyward

Status = Literal["ok", "missing", "error"]
_SYMBOLS: dict[Status, tuple[str, str]] = {
    "ok": ("✔", "green"),
    "missing": ("·", "yellow"),  # fine for a local pool; needed for something else
    "error": ("✘", "red"),  # Skyward itself will not work
}

# extra -> the distributions it installs (pyproject.toml's optional-dependencies)
EXTRAS: dict[str, tuple[str, ...]] = {
    "jax": ("jax",),
    "keras": ("keras", "jax"),
    "ssh": ("paramiko",),
    "aws": ("boto3", "paramiko"),
    "gcp": ("google-cloud-compute", "paramiko"),
    "azure": (
        "azure-identity",
        "azure-mgmt-compute",
        "azure-mgmt-network",
        "azure-mgmt-resource",
        "paramiko",
    ),
}


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


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
    clouds = _clouds()
    checks: list[Check] = [check_python(), check_skyward()]
    # An extra for a cloud this release has no provider for would send users to install an
    # SDK that nothing imports.
    checks += [check_extra(name) for name in EXTRAS if name in _PLAIN_EXTRAS or name in clouds]
    checks += [check_ssh_client(env), check_ssh_agent(env)]
    checks.append(_guarded("SSH keys", check_ssh_keys, env, home))
    for extra, (name, cloud) in _CLOUD_CHECKS.items():
        if extra in clouds:
            checks.append(_guarded(f"{name} credentials", cloud, env, home))
    return checks


def _clouds() -> set[str]:
    """The extras of the cloud providers this release exports."""
    return {extra for extra, (name, _) in _CLOUD_CHECKS.items() if name in skyward.__all__}


def _guarded(
    name: str,
    check: Callable[[Mapping[str, str], Path], Check],
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
    return sum(1 for line in _read(path).splitlines() if line.strip() and not line.startswith("#"))


def check_aws(env: Mapping[str, str], home: Path) -> Check:
    fix = (
        "run `aws configure` (or `aws sso login`), "
        "or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    )
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    credentials = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    config = Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    config_section = "default" if profile == "default" else f"profile {profile}"
    parsed_config = _ini(config)
    if not region:
        region = parsed_config.get(config_section, "region", fallback=None)
    where = f"region {region}" if region else "no region set (AWS_DEFAULT_REGION)"
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return Check("AWS credentials", "ok", f"from environment variables; {where}")
    if _ini(credentials).has_section(profile):
        return Check("AWS credentials", "ok", f"profile {profile!r} in {credentials}; {where}")
    section = parsed_config
    keys = ("aws_access_key_id", "sso_session", "sso_start_url", "credential_process", "role_arn")
    if section.has_section(config_section) and any(
        section.has_option(config_section, k) for k in keys
    ):
        return Check("AWS credentials", "ok", f"profile {profile!r} in {config}; {where}")
    return Check(
        "AWS credentials",
        "missing",
        f"none found for profile {profile!r} (environment, {credentials}, {config})",
        fix,
    )


def check_gcp(env: Mapping[str, str], home: Path) -> Check:
    fix = "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS"
    gcloud = Path(env.get("CLOUDSDK_CONFIG") or home / ".config" / "gcloud")
    project = env.get("GOOGLE_CLOUD_PROJECT") or env.get("CLOUDSDK_CORE_PROJECT")
    if not project:
        active = _read(gcloud / "active_config").strip() or "default"
        project = _ini(gcloud / "configurations" / f"config_{active}").get(
            "core", "project", fallback=None
        )
    where = f"project {project}" if project else "no project set (GOOGLE_CLOUD_PROJECT)"
    named = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    if named:
        if Path(named).is_file():
            detail = f"GOOGLE_APPLICATION_CREDENTIALS={named}; {where}"
            return Check("GCP credentials", "ok", detail)
        return Check(
            "GCP credentials",
            "missing",
            f"GOOGLE_APPLICATION_CREDENTIALS names {named}, which does not exist",
            fix,
        )
    adc = gcloud / "application_default_credentials.json"
    if adc.is_file():
        return Check("GCP credentials", "ok", f"application default credentials in {adc}; {where}")
    return Check("GCP credentials", "missing", f"none found (environment, {adc})", fix)


def check_azure(env: Mapping[str, str], home: Path) -> Check:
    fix = "run `az login`, or set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET"
    subscription = env.get("AZURE_SUBSCRIPTION_ID")
    where = f"subscription {subscription}" if subscription else "no AZURE_SUBSCRIPTION_ID set"
    secret = ("AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_FEDERATED_TOKEN_FILE")
    principal = env.get("AZURE_CLIENT_ID") and env.get("AZURE_TENANT_ID")
    if principal and any(env.get(s) for s in secret):
        return Check("Azure credentials", "ok", f"service principal from environment; {where}")
    cli = Path(env.get("AZURE_CONFIG_DIR") or home / ".azure")
    if (cli / "msal_token_cache.json").is_file() or (cli / "msal_token_cache.bin").is_file():
        return Check("Azure credentials", "ok", f"Azure CLI login in {cli}; {where}")
    return Check("Azure credentials", "missing", f"none found (environment, {cli})", fix)


# cloud extra -> (the provider's public name, its credentials check)
_CLOUD_CHECKS: dict[str, tuple[str, Callable[[Mapping[str, str], Path], Check]]] = {
    "aws": ("AWS", check_aws),
    "gcp": ("GCP", check_gcp),
    "azure": ("Azure", check_azure),
}
_PLAIN_EXTRAS = ("jax", "keras", "ssh")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _ini(path: Path) -> ConfigParser:
    parser = ConfigParser(interpolation=None)
    parser.read_string(_read(path), source=str(path))
    return parser
