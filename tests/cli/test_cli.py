"""The ``skyward`` console script, run as a user runs it, with a home directory of our own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import skyward as sky

SCRIPT = Path(sys.executable).parent / "skyward"


def _clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment minus every cloud's variables (conftest sets fake AWS ones)."""
    clouds = ("AWS_", "GOOGLE_", "CLOUDSDK_", "AZURE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(clouds)}
    return env | {"HOME": str(home), "NO_COLOR": "1"} | extra


def _skyward(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_version_is_the_package_version(tmp_path: Path) -> None:
    result = _skyward("--version", env=_clean_env(tmp_path))
    assert result.returncode == 0
    assert result.stdout.strip() == f"skyward, version {sky.__version__}"


def test_doctor_on_a_machine_without_credentials_says_what_is_missing(tmp_path: Path) -> None:
    result = _skyward("doctor", env=_clean_env(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Traceback" not in out + result.stderr
    assert f"✔ Python: {sys.version_info[0]}.{sys.version_info[1]}" in out
    assert f"✔ skyward: {sky.__version__}" in out
    assert "✔ extra [jax]: jax " in out  # the dev install has it
    assert "✔ extra [ssh]: paramiko " in out
    assert f"· SSH keys: none of id_ed25519, id_ecdsa, id_rsa in {tmp_path / '.ssh'}" in out
    assert "fix: `ssh-keygen -t ed25519` and `ssh-copy-id user@host`" in out
    assert "· AWS credentials: none found" in out
    assert "fix: run `aws configure`" in out
    # Credentials are checked for the clouds this release has a provider for, and only those.
    assert ("· GCP credentials: none found" in out) == ("GCP" in sky.__all__)
    assert ("fix: run `gcloud auth application-default login`" in out) == ("GCP" in sky.__all__)
    assert ("· Azure credentials: none found" in out) == ("Azure" in sky.__all__)
    assert ("fix: run `az login`" in out) == ("Azure" in sky.__all__)


def test_doctor_finds_credentials_in_config_files_and_never_prints_secrets(
    tmp_path: Path,
) -> None:
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text(
        "[default]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = s3cr3t-value\n"
    )
    (aws / "config").write_text("[default]\nregion = eu-west-1\n")
    gcloud = tmp_path / ".config" / "gcloud"
    (gcloud / "configurations").mkdir(parents=True)
    (gcloud / "application_default_credentials.json").write_text(
        json.dumps({"type": "authorized_user", "refresh_token": "s3cr3t-value"})
    )
    (gcloud / "active_config").write_text("default")
    (gcloud / "configurations" / "config_default").write_text("[core]\nproject = my-project\n")
    (tmp_path / ".azure").mkdir()
    (tmp_path / ".azure" / "msal_token_cache.json").write_text("{}")

    result = _skyward("doctor", env=_clean_env(tmp_path, AZURE_SUBSCRIPTION_ID="sub-1"))
    out = result.stdout
    assert result.returncode == 0, result.stderr
    assert f"✔ AWS credentials: profile 'default' in {aws / 'credentials'}; region eu-west-1" in out
    if "GCP" in sky.__all__:
        assert "✔ GCP credentials: application default credentials in" in out
        assert "project my-project" in out
    if "Azure" in sky.__all__:
        assert "✔ Azure credentials: Azure CLI login in" in out and "subscription sub-1" in out
    assert "s3cr3t" not in out and "AKIDEXAMPLE" not in out


def test_doctor_finds_ssh_keys_known_hosts_and_an_agent_socket(tmp_path: Path) -> None:
    import socket

    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "id_ed25519").write_text("not read, only found\n")
    (ssh / "known_hosts").write_text("# a comment\nhost-a ssh-ed25519 AA\nhost-b ssh-ed25519 AA\n")
    agent = socket.socket(socket.AF_UNIX)  # bound, never connected: doctor only looks at it
    agent.bind(str(tmp_path / "agent.sock"))
    try:
        env = _clean_env(tmp_path, SSH_AUTH_SOCK=str(tmp_path / "agent.sock"))
        out = _skyward("doctor", env=env).stdout
    finally:
        agent.close()
    assert f"✔ SSH keys: {ssh / 'id_ed25519'}; {ssh / 'known_hosts'} has 2 host key(s)" in out
    assert f"✔ SSH agent: socket at {tmp_path / 'agent.sock'}" in out

    stale = _skyward("doctor", env=_clean_env(tmp_path, SSH_AUTH_SOCK="/nonexistent")).stdout
    assert "· SSH agent: SSH_AUTH_SOCK names /nonexistent, which is not a socket" in stale


def test_doctor_reports_a_malformed_config_instead_of_failing(tmp_path: Path) -> None:
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("this is not an ini file\n")
    result = _skyward("doctor", env=_clean_env(tmp_path))
    assert result.returncode == 0
    assert "Traceback" not in result.stdout + result.stderr
    assert "· AWS credentials: could not read its configuration" in result.stdout
    assert "Local pools need nothing more" in result.stdout  # the report carried on


def test_doctor_never_opens_a_socket_or_resolves_a_name(tmp_path: Path) -> None:
    # Python's audit events see every socket connect and name lookup, whichever library
    # makes it.
    probe = (
        "import sys\n"
        "seen = []\n"
        "sys.addaudithook(lambda event, args: seen.append(event)"
        " if event.startswith(('socket.connect', 'socket.getaddrinfo', 'socket.gethostbyname'))"
        " else None)\n"
        "from skyward.cli import main\n"
        "try:\n"
        "    main(['doctor'], prog_name='skyward')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('network events:', seen)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=_clean_env(tmp_path, AWS_PROFILE="someone"),
        timeout=60,
        check=True,
    )
    assert "AWS credentials" in result.stdout
    assert result.stdout.rstrip().endswith("network events: []")
