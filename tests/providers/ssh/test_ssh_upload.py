"""Uploading to a host whose sshd has no SFTP subsystem (hardened hosts, some appliances): the
bytes go through the shell instead, or the error says what failed and where.

The host is a real OpenSSH server in a network namespace (``support/sshhosts.py``) started
without its ``Subsystem sftp`` line."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Iterator

import pytest
from support.hostimage import HostImage
from support.processes import our_namespaces
from support.sshhosts import Hosts

from skyward._errors import ProvisionError
from skyward.providers.ssh.connection import Connection, HostKeyPolicy, Target


@pytest.fixture(scope="module")
def no_sftp_host() -> Iterator[Hosts]:
    hosts = Hosts.start(1, image=HostImage(sftp=False))
    namespaces = [h.netns for h in hosts.hosts]
    our_namespaces.add(*namespaces)
    try:
        yield hosts
    finally:
        hosts.close()
        our_namespaces.discard(*namespaces)
    assert not hosts.leftovers(), f"SSH test hosts left behind: {hosts.leftovers()}"


@pytest.fixture
def connection(no_sftp_host: Hosts) -> Iterator[Connection]:
    host = no_sftp_host.hosts[0]
    opened = Connection.open(
        Target.parse(host.target),
        policy=HostKeyPolicy(no_sftp_host.known_hosts),
        key_file=no_sftp_host.client_key,
    )
    try:
        yield opened
    finally:
        opened.close()


def test_the_host_really_refuses_sftp(connection: Connection) -> None:
    import paramiko

    with pytest.raises(paramiko.SSHException):
        paramiko.SFTPClient.from_transport(connection.transport)


def test_upload_without_sftp_writes_the_bytes_through_the_shell(connection: Connection) -> None:
    data = os.urandom(3 << 20) + b"\n\x00 end"  # binary, several channel windows
    status, _ = connection.run("mkdir -p uploads")
    assert status == 0
    connection.upload(data, "uploads/payload.zip", mode=0o600)

    status, output = connection.run("sha256sum uploads/payload.zip; stat -c %a uploads/payload.zip")
    digest, mode = output.split("\n")[0].split()[0], output.split("\n")[1]
    assert (status, digest, mode) == (0, hashlib.sha256(data).hexdigest(), "600")
    status, listing = connection.run("ls -a uploads")
    assert listing.split() == [".", "..", "payload.zip"]  # no temporary file left


def test_upload_without_sftp_replaces_an_existing_file(connection: Connection) -> None:
    connection.upload(b"first", "again.txt")
    connection.upload(b"second", "again.txt")
    assert connection.run("cat again.txt") == (0, "second")


def test_a_failed_upload_without_sftp_says_why(connection: Connection) -> None:
    with pytest.raises(ProvisionError) as caught:
        connection.upload(b"x", "no/such/directory/file.zip")
    message = str(caught.value)
    assert "could not upload no/such/directory/file.zip" in message
    assert "no SFTP subsystem" in message and "Directory nonexistent" in message


def test_the_uploaded_package_carries_the_catalogs_data() -> None:
    # A worker that names an accelerator reads the catalog, whose rows and prices are data
    # files in each cloud's folder: a package of sources alone fails there.
    from skyward.providers.cloud.catalog import CLOUDS
    from skyward.providers.ssh.hosts import package_archive

    _, data = package_archive()
    names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
    for cloud in CLOUDS:
        assert f"skyward/providers/{cloud}/machines.json" in names
        assert f"skyward/providers/{cloud}/prices.json" in names
