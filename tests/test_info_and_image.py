"""``InstanceInfo`` and ``Image`` fields that skyward 0.5's docs and examples use:
``total_accelerators``, ``job_id``, the worker fields; ``includes``, ``excludes``,
``skyward_source``, ``bootstrap_timeout``."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pydantic
import pytest
from support.pools import ssh_provider
from support.sshhosts import Hosts, PackageIndex

import skyward as sky


@sky.compute
def get_cluster_info() -> dict[str, object]:
    """skyward 0.5's cluster-coordination example, as written there."""
    pool = sky.instance_info()
    return {
        "node": pool.node,
        "total_nodes": pool.total_nodes,
        "is_head": pool.is_head,
        "accelerators": pool.accelerators,
        "total_accelerators": pool.total_accelerators,
        "head_addr": pool.head_addr,
        "head_port": pool.head_port,
        "job_id": pool.job_id,
    }


@pytest.mark.timeout(120)
def test_the_cluster_coordination_example_reads_every_field() -> None:
    with sky.ComputePool(nodes=3, quiet=True) as pool:
        infos = get_cluster_info() @ pool
        job_ids = {info["job_id"] for info in infos}
        assert [info["node"] for info in infos] == [0, 1, 2]
        assert [info["is_head"] for info in infos] == [True, False, False]
        assert {info["total_accelerators"] for info in infos} == {0}  # CPU-only local nodes
        assert len(job_ids) == 1 and str(next(iter(job_ids))).startswith(pool.name)

        with pytest.raises(sky.WorkerLost):  # a replaced worker keeps the pool's job_id
            pool.run(os._exit, 1)
        deadline = time.monotonic() + 30
        while pool.statistics().workers_replaced < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {info["job_id"] for info in get_cluster_info() @ pool} == job_ids

    with sky.ComputePool(nodes=1, quiet=True) as other:
        assert (get_cluster_info() >> other)["job_id"] not in job_ids


def test_worker_fields_describe_one_worker_per_node() -> None:
    info = sky.InstanceInfo(
        node=2,
        total_nodes=4,
        head_addr="10.0.0.1",
        head_port=1,
        peers=("a", "b", "c", "d"),
        accelerators=8,
        hostname="h",
    )
    assert (info.worker, info.workers_per_node) == (0, 1)
    assert (info.global_worker_index, info.total_workers) == (2, 4)
    assert info.total_accelerators == 32  # not given: every node like this one
    assert info.model_copy(update={"total_accelerators": 9}).total_accelerators == 9


def test_a_wrong_instance_info_is_a_validation_error_naming_the_field() -> None:
    fields: dict[str, Any] = {
        "node": 1,
        "total_nodes": 2,
        "head_addr": "a",
        "head_port": 1,
        "peers": ["a", "b"],
        "hostname": "h",
    }
    with pytest.raises(pydantic.ValidationError, match=r"head_port\n.*less than or equal"):
        sky.InstanceInfo(**{**fields, "head_port": 70000})
    with pytest.raises(pydantic.ValidationError, match=r"node\n.*valid integer"):
        sky.InstanceInfo(**{**fields, "node": "one"})
    with pytest.raises(pydantic.ValidationError, match="node 2 is out of range for 2 nodes"):
        sky.InstanceInfo(**{**fields, "node": 2})
    info = sky.InstanceInfo(**fields)
    assert info.peers == ("a", "b")  # a list is taken as the tuple it stands for
    moved = info.model_copy(update={"peers": ("a", "c")})  # checked and shaped like a new one
    assert moved.peers[1]["private_ip"] == "c" and moved.peers[1].node == 1


def test_outside_a_worker_the_job_is_local() -> None:
    assert sky.instance_info().job_id == "local"


# ── Image ────────────────────────────────────────────────────────────────────────────────


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory like skyward 0.5's simple-cluster example: ``lib/`` beside the
    script, and a loose module."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("from lib.transform import double\n")
    (tmp_path / "lib" / "transform.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "lib" / "secret.txt").write_text("do not ship\n")
    (tmp_path / "lib" / "__pycache__").mkdir()
    (tmp_path / "helpers.py").write_text("GREETING = 'hi'\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def use_includes() -> tuple[int, str, bool]:
    import helpers  # type: ignore[import-not-found]
    import lib  # type: ignore[import-not-found]

    shipped = os.path.dirname(lib.__file__)
    return lib.double(21), helpers.GREETING, os.path.exists(os.path.join(shipped, "secret.txt"))


def test_includes_are_made_absolute_and_must_exist(project: Path) -> None:
    image = sky.Image(includes=["lib", "helpers.py"], excludes=["*.txt"])
    assert image.includes == (str(project / "lib"), str(project / "helpers.py"))
    assert image.include_roots() == [str(project)]
    shipped = [name for _, name in image.included_files()]
    assert shipped == ["helpers.py", "lib/__init__.py", "lib/transform.py"]
    with pytest.raises(pydantic.ValidationError, match="does not exist"):
        sky.Image(includes=["nowhere"])


@pytest.mark.timeout(60)
def test_includes_are_importable_on_local_workers(project: Path, tmp_path: Path) -> None:
    image = sky.Image(includes=["lib", "helpers.py"])
    os.chdir(tmp_path.parent)  # the pool is used from elsewhere: the paths still hold
    with sky.ComputePool(image=image, quiet=True) as pool:
        assert pool.run(use_includes)[:2] == (42, "hi")


def test_skyward_source_other_than_the_clients_own_is_refused() -> None:
    assert sky.Image(skyward_source="local").skyward_source == "local"
    with pytest.raises(pydantic.ValidationError, match="another project"):
        sky.Image(skyward_source="pypi")  # type: ignore[arg-type]


def test_bootstrap_timeout_is_validated() -> None:
    assert sky.Image(bootstrap_timeout=600).bootstrap_timeout == 600
    with pytest.raises(pydantic.ValidationError):
        sky.Image(bootstrap_timeout=0)


def test_new_image_fields_leave_the_bootstrap_digest_alone(project: Path) -> None:
    from skyward.providers.ssh.bootstrap import Plan

    def digest(image: sky.Image) -> str:
        return Plan(image, "3.11", None, "~/.cache/skyward", ()).digest

    plain = sky.Image(pip=["numpy"])
    assert digest(plain) == digest(
        plain.model_copy(update={"includes": ("/x",), "bootstrap_timeout": 5.0})
    )


@pytest.mark.timeout(180)
def test_includes_are_shipped_to_ssh_hosts_without_the_excluded(
    project: Path, ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    image = sky.Image(
        includes=["lib", "helpers.py"], excludes=["*.txt"], index_url=package_index.url
    )
    provider = ssh_provider(ssh_hosts, ssh_hosts.hosts[0].target)
    with sky.ComputePool(provider=provider, image=image, quiet=True) as pool:
        assert pool.run(use_includes) == (42, "hi", False)


@pytest.mark.timeout(120)  # well before the setup command's own end
def test_a_bootstrap_past_bootstrap_timeout_is_a_bootstrap_error(
    ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    image = sky.Image(
        setup=["echo warming the cache", "sleep 1000"],
        bootstrap_timeout=5,
        index_url=package_index.url,
    )
    provider = ssh_provider(ssh_hosts, ssh_hosts.hosts[0].target)
    with pytest.raises(sky.BootstrapError, match=r"bootstrap_timeout \(5 s\)") as caught:
        with sky.ComputePool(provider=provider, image=image, quiet=True):
            pass
    assert caught.value.command  # whichever step was running when the bound passed
    assert caught.value.exit_status is None


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        ("s3://my-bucket/envs/team", ("s3", "my-bucket", "", "envs/team")),
        ("gs://my.bucket", ("gs", "my.bucket", "", "")),
        ("az://account1/envs/a/b/", ("az", "account1", "envs", "a/b")),
    ],
)
def test_an_environment_cache_url_names_its_store(url: str, parts: tuple[str, ...]) -> None:
    from skyward._image import cache_location

    assert cache_location(sky.Image(cache=url).cache or "") == parts


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://bucket/x", "an environment cache is 's3://bucket/prefix'"),
        ("s3:/bucket", "an environment cache is"),
        ("s3://", "(no bucket)"),
        ("s3://Bucket/x", "'Bucket' is not a bucket name"),
        ("gs://bucket/../x", "'.', '..' or spaces"),
        ("az://account", "(the account and the container)"),
        ("az://Account/c/x", "'Account' is not a storage account name"),
        ("az://account/c/x", "'c' is not a container name"),
    ],
)
def test_a_wrong_environment_cache_url_is_refused_at_construction(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        sky.Image(cache=url)


def test_a_cache_endpoint_is_an_http_address() -> None:
    assert (
        sky.Image(cache_endpoint="http://10.0.0.1:9000/").cache_endpoint == "http://10.0.0.1:9000"
    )
    with pytest.raises(ValueError, match="not an http:// or https:// host"):
        sky.Image(cache_endpoint="10.0.0.1:9000")
