"""The boot payload's second carrier: ``Boot.start_script()``, for images with no cloud-init (a
marketplace's containers). Run as root in a sandbox (own PID and mount namespaces, poweroff
shimmed), as a container's start command would, it must give what the cloud-init carrier
gives: sshd presenting the host key the client made, the login key and nothing else, and
the idle watchdog, whose last act here ends the container's main process."""

from __future__ import annotations

import base64
import shlex
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from support.sandbox import Sandbox

from skyward.providers.cloud.boot import END_CONTAINER, END_CONTAINER_PATH, Boot, HostKey
from skyward.providers.ssh.connection import PoolKey

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _container(directory: Path, script: str) -> str:
    """A container's life in the sandbox: private copies of what the image owns (/etc/ssh,
    root's ~/.ssh, /usr/local/sbin, /var/log, /run), the start script, then its main
    process."""
    mounts = []
    for target, source in (
        ("/etc/ssh", "etc-ssh"),
        ("/root/.ssh", "root-ssh"),
        ("/usr/local/sbin", "usr-local-sbin"),
        ("/var/log", "var-log"),
        ("/run", "run"),
    ):
        own = directory / source
        own.mkdir(exist_ok=True)
        if target == "/etc/ssh":
            shutil.copytree("/etc/ssh", own, dirs_exist_ok=True, symlinks=True)
        Path(target).mkdir(parents=True, exist_ok=True)
        mounts.append(f"mount --bind {shlex.quote(str(own))} {target}")
    (directory / "start.sh").write_text(script)
    return "\n".join(
        [
            "set -e",
            *mounts,
            f"sh {shlex.quote(str(directory / 'start.sh'))} >{directory}/start.log 2>&1",
            "exec sleep 3600  # the container's main process",
        ]
    )


@pytest.fixture
def container(tmp_path: Path) -> Iterator[tuple[Boot, PoolKey, int, Sandbox]]:
    key, port = PoolKey(), _free_port()
    boot = Boot(
        host_key=HostKey.generate(),
        authorized_key=key.public,
        user="root",
        idle_timeout=4,
        first_client_timeout=30,
        ssh_port=port,
        idle_action=END_CONTAINER_PATH,
        files=(END_CONTAINER,),
    )
    sandbox = Sandbox(tmp_path / "sandbox", _container(tmp_path, boot.start_script()))
    try:
        yield boot, key, port, sandbox
    finally:
        sandbox.stop()
        key.delete()


def _connect(port: int, key: PoolKey, host_key: str) -> paramiko.SSHClient:
    """Connect as the pool's client does: only the host key the client made is trusted."""
    client = paramiko.SSHClient()
    kind, data = host_key.split()[:2]
    known = paramiko.Ed25519Key(data=base64.b64decode(data))
    client.get_host_keys().add(f"[127.0.0.1]:{port}", kind, known)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    end = time.monotonic() + 60
    while True:
        try:
            client.connect(
                "127.0.0.1",
                port=port,
                username="root",
                key_filename=str(key.path),
                look_for_keys=False,
                allow_agent=False,
                timeout=5,
            )
            return client
        except (OSError, paramiko.SSHException):
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_a_start_script_boots_sshd_with_the_clients_host_key_and_login_key(
    container: tuple[Boot, PoolKey, int, Sandbox],
) -> None:
    boot, key, port, sandbox = container
    client = _connect(port, key, boot.host_key.public)
    try:
        _, out, _ = client.exec_command("echo $(id -un) ready")
        assert out.read().decode().strip() == "root ready"
        _, out, _ = client.exec_command("ls /etc/ssh | grep host")
        assert out.read().decode().split() == ["ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"]
    finally:
        client.close()
    assert sandbox.alive


def test_a_containers_watchdog_ends_its_main_process_once_the_client_is_gone(
    container: tuple[Boot, PoolKey, int, Sandbox],
) -> None:
    boot, key, port, sandbox = container
    _connect(port, key, boot.host_key.public).close()  # the first client came, and went
    sandbox.wait(timeout=90)  # idle_timeout=4 s and the watchdog's pace: well within
    assert sandbox.power_state() == "signal-TERM"  # kill -TERM 1: the container ends
    log = (sandbox.directory.parent / "var-log" / "skyward-watchdog.log").read_text()
    assert "no SSH client" in log and END_CONTAINER_PATH in log
