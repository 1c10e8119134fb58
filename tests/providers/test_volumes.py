"""Volumes: buckets of moto's S3 mounted with a real s3fs (FUSE) on every node before the
workers start, and unmounted at close, on local pools (this machine) and on SSH hosts in
network namespaces (each with its own mount namespace, as separate machines have).

s3fs comes from Debian. This machine gets it from apt-get when it lacks it, as the pool's
host preparation installs it on a node that lacks it (``providers/volumes.py``); the test of
that preparation runs on a host whose image hides it, with an apt-get that records its calls.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import pytest
from pydantic import ValidationError
from support.clouds.aws.fake import MotoServer
from support.hostimage import FAKE_SUDO, HostImage, fake_apt_get
from support.pools import ssh_provider
from support.processes import our_namespaces
from support.sshhosts import USER, Hosts, PackageIndex

import skyward as sky

BUCKET = "skyward-data"
_WHEELS = Path.home() / ".cache" / "skyward-tests" / "wheels"


@pytest.fixture(scope="module")
def s3fs() -> str:
    """s3fs on this machine: the local pool's, and (shared file system) the SSH hosts'."""
    if shutil.which("s3fs") is None:
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "s3fs"]
        result = subprocess.run(install, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"apt-get install s3fs failed: {result.stdout[-2000:]}"
    path = shutil.which("s3fs")
    assert path is not None
    return path


@pytest.fixture(scope="module")
def s3(ssh_hosts: Hosts) -> Iterator[MotoServer]:
    """moto on the test bridge, where this process and the hosts' s3fs both reach it."""
    server = MotoServer(host=ssh_hosts.bridge_address, placement_groups=False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def bucket(s3: MotoServer) -> Any:
    """A bucket with a small data set under ``train/``; emptied and made again per test."""
    client = s3.client("s3")
    s3.reset()
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="train/a.txt", Body=b"alpha")
    client.put_object(Bucket=BUCKET, Key="train/sub/b.txt", Body=b"beta")
    client.put_object(Bucket=BUCKET, Key="other/c.txt", Body=b"not under train/")
    return client


def _volume(s3: MotoServer, mount: str | Path, **options: Any) -> sky.Volume:
    settings: dict[str, Any] = {
        "bucket": f"s3://{BUCKET}/train",
        "mount": str(mount),
        "endpoint_url": s3.url,
        "region": "us-east-1",
        "access_key_id": "testing",
        "secret_access_key": "testing",
    }
    return sky.Volume(**{**settings, **options})


@sky.compute
def read_mount(mount: str) -> dict[str, Any]:
    import os

    info = sky.instance_info()
    try:
        with open(os.path.join(mount, "new.txt"), "w") as out:
            out.write("x")
        write = "written"
    except OSError as error:
        write = error.strerror or str(error)
    files = sorted(
        os.path.relpath(os.path.join(root, name), mount)
        for root, _, names in os.walk(mount)
        for name in names
    )
    with open(os.path.join(mount, "a.txt")) as data:
        text = data.read()
    return {"node": info.node, "files": files, "a": text, "write": write}


@sky.compute
def write_file(path: str, text: str) -> None:
    with open(path, "w") as out:
        out.write(text)


def _s3fs_processes() -> list[psutil.Process]:
    """s3fs daemons still alive, after giving unmounted ones a moment to exit (a zombie
    waiting for this container's init to reap it is gone)."""
    deadline = time.monotonic() + 10.0
    while True:
        alive = [
            p
            for p in psutil.process_iter(["name", "status"])
            if p.info["name"] == "s3fs" and p.info["status"] != psutil.STATUS_ZOMBIE
        ]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _fuse_mounts(mounts: str) -> list[str]:
    return [line for line in mounts.splitlines() if "fuse.s3fs" in line]


# ── the local provider: mounted on this machine ─────────────────────────────────────────


@pytest.mark.timeout(120)
def test_a_local_pool_reads_a_read_only_bucket_prefix_and_unmounts_it_at_close(
    s3fs: str, s3: MotoServer, bucket: Any, tmp_path: Path
) -> None:
    mount = tmp_path / "data"
    with sky.ComputePool(nodes=2, volumes=[_volume(s3, mount)], quiet=True) as pool:
        assert _fuse_mounts(Path("/proc/mounts").read_text())
        results = read_mount(str(mount)) @ pool
    for node, result in enumerate(results):
        assert result["node"] == node
        assert result["files"] == ["a.txt", "sub/b.txt"]  # the prefix only
        assert result["a"] == "alpha"
        assert result["write"] == "Read-only file system"
    assert not any(str(mount) in line for line in _fuse_mounts(Path("/proc/mounts").read_text()))
    assert not mount.exists(), "the mount point the pool made is removed"
    assert not _s3fs_processes()


@pytest.mark.timeout(120)
def test_a_writable_volume_puts_what_a_worker_writes_in_the_bucket(
    s3fs: str, s3: MotoServer, bucket: Any, tmp_path: Path
) -> None:
    mount = tmp_path / "out"
    volume = _volume(s3, mount, bucket=f"s3://{BUCKET}/results", read_only=False)
    with sky.ComputePool(volumes=[volume], quiet=True) as pool:
        write_file(str(mount / "loss.txt"), "0.125") >> pool
    body = bucket.get_object(Bucket=BUCKET, Key="results/loss.txt")["Body"].read()
    assert body == b"0.125"


@pytest.mark.timeout(120)
def test_wrong_credentials_fail_the_start_naming_the_bucket_and_leave_no_mount(
    s3fs: str, s3: MotoServer, bucket: Any, tmp_path: Path
) -> None:
    mount = tmp_path / "data"
    # moto checks no signatures; a bucket that is not there is what it refuses.
    volume = _volume(s3, mount, bucket="s3://no-such-bucket/x")
    pool = sky.ComputePool(volumes=[volume], quiet=True)
    with pytest.raises(sky.BootstrapError, match=r"s3://no-such-bucket/x at .* cannot be read"):
        pool.start()
    assert not _fuse_mounts(Path("/proc/mounts").read_text())
    assert not mount.exists()
    assert not _s3fs_processes()


def test_a_local_pool_without_s3fs_is_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without s3fs on its PATH
    volume = sky.Volume(bucket="s3://some-bucket", mount="/data")
    with pytest.raises(ValueError, match="apt-get install s3fs"):
        sky.ComputePool(volumes=[volume])


# ── SSH hosts: mounted in each host's own mount namespace ───────────────────────────────


def _host_mounts(host: Any) -> str:
    """The mount table the host's sshd (and so its workers) sees."""
    assert host.sshd is not None
    children = psutil.Process(host.sshd.pid).children(recursive=True)
    sshd = next((p for p in children if p.name() == "sshd"), psutil.Process(host.sshd.pid))
    return Path(f"/proc/{sshd.pid}/mounts").read_text()


@pytest.mark.timeout(300)
def test_every_ssh_node_mounts_the_bucket_before_its_worker_starts_and_unmounts_it(
    s3fs: str, s3: MotoServer, bucket: Any, ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    mount = f"/home/{USER}/data-{uuid.uuid4().hex[:6]}"
    hosts = ssh_hosts.hosts[:2]
    pool = sky.ComputePool(
        provider=ssh_provider(ssh_hosts, *(h.target for h in hosts)),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        volumes=[_volume(s3, mount)],
        quiet=True,
    )
    with pool:
        for host in hosts:
            assert any(mount in line for line in _fuse_mounts(_host_mounts(host)))
        results = read_mount(mount) @ pool
    assert [r["files"] for r in results] == [["a.txt", "sub/b.txt"]] * 2
    assert all(r["write"] == "Read-only file system" for r in results)
    for host in hosts:
        assert not _fuse_mounts(_host_mounts(host)), f"{host.name} keeps the mount"
        assert not (host.home / mount.rsplit("/", 1)[1]).exists()
        assert not (host.home / ".cache/skyward/volumes" / pool.name).exists()
    assert not _s3fs_processes()


# ── a stock host: the host's preparation installs s3fs ──────────────────────────────────

_APT_LOG = f"/home/{USER}/apt-calls.log"


@pytest.fixture(scope="module")
def stock_host() -> Iterator[tuple[Hosts, PackageIndex]]:
    image = HostImage(
        tools={"sudo": FAKE_SUDO, "apt-get": fake_apt_get(Path(_APT_LOG), busy=0)},
        hidden=("s3fs",),
    )
    hosts = Hosts.start(1, image=image)
    namespaces = [h.netns for h in hosts.hosts]
    our_namespaces.add(*namespaces)
    index = None
    try:
        index = PackageIndex(hosts.root / "index", hosts.bridge_address)
        pins = [f"{n}=={metadata.version(n)}" for n in ("cloudpickle", "pydantic")]
        index.download([*pins, "uv"], _WHEELS)
        yield hosts, index
    finally:
        if index is not None:
            index.close()
        hosts.close()
        our_namespaces.discard(*namespaces)
    assert not hosts.leftovers(), f"test hosts left behind: {hosts.leftovers()}"


@pytest.mark.timeout(300)
def test_a_host_without_s3fs_gets_it_from_apt_before_the_volumes_are_mounted(
    s3fs: str, stock_host: tuple[Hosts, PackageIndex]
) -> None:
    """The host's apt-get only records its calls here, so s3fs stays missing: the start
    fails saying so, after the preparation asked apt for it."""
    hosts, index = stock_host
    volume = sky.Volume(
        bucket=f"s3://{BUCKET}",
        mount=f"/home/{USER}/data",
        access_key_id="k",
        secret_access_key="s",
    )
    pool = sky.ComputePool(
        provider=ssh_provider(hosts),
        image=sky.Image(index_url=index.url),
        volumes=[volume],
        quiet=True,
    )
    with pytest.raises(sky.BootstrapError, match="s3fs is still missing after installing"):
        pool.start()
    calls = (hosts.hosts[0].home / "apt-calls.log").read_text().splitlines()
    assert calls == [
        "-o DPkg::Lock::Timeout=300 update -q",
        "-o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends s3fs",
    ]
    assert not (hosts.hosts[0].home / ".cache/skyward/volumes" / pool.name / "0.passwd").exists()


# ── what is refused when the pool is built ─────────────────────────────────────────────


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bucket": "gs://my-bucket"}, "only S3 buckets"),
        ({"bucket": "s3://A_B"}, "is not an S3 bucket name"),
        ({"mount": "data"}, "absolute path"),
        ({"mount": "/"}, "cannot be a mount point"),
        ({"access_key_id": "k"}, "both access_key_id and secret_access_key"),
        ({"endpoint_url": "minio:9000"}, "endpoint_url"),
    ],
)
def test_a_wrong_volume_is_a_validation_error_naming_it(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        sky.Volume(**{"bucket": "s3://my-bucket", "mount": "/data", **options})


def test_a_bucket_name_with_a_prefix_is_the_s3_url_of_that_prefix() -> None:
    volume = sky.Volume(bucket="my-bucket", prefix="datasets/", mount="/data")
    assert volume.bucket == "s3://my-bucket/datasets"
    assert (volume.bucket_name, volume.prefix) == ("my-bucket", "datasets")


def test_overlapping_mount_points_are_refused() -> None:
    volumes = [
        sky.Volume(bucket="s3://my-bucket", mount="/data"),
        sky.Volume(bucket="s3://other-bucket", mount="/data/other"),
    ]
    with pytest.raises(ValidationError, match="overlap"):
        sky.ComputePool(volumes=volumes)


def test_the_secret_key_is_not_shown_in_the_volume_repr() -> None:
    volume = sky.Volume(
        bucket="s3://my-bucket", mount="/data", access_key_id="AKIA", secret_access_key="hush"
    )
    assert "hush" not in repr(volume)


def test_slurm_refuses_volumes_with_the_reason() -> None:
    volume = sky.Volume(bucket="s3://my-bucket", mount="/data")
    with pytest.raises(ValueError, match="does not mount volumes"):
        sky.ComputePool(provider=sky.Slurm(), volumes=[volume])


def test_aws_refuses_a_volume_without_keys_when_the_nodes_have_no_instance_profile(
    moto: MotoServer,
) -> None:
    from support.clouds.aws.pools import provider

    volume = sky.Volume(bucket="s3://my-bucket", mount="/data")
    with pytest.raises(ValueError, match="iam_instance_profile"):
        sky.ComputePool(provider=provider(moto), volumes=[volume])
    sky.ComputePool(provider=provider(moto, iam_instance_profile="reader"), volumes=[volume])
