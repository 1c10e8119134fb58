"""The environment cache (``Image(cache=...)``) against real local object stores.

::

    root namespace                                    SSH hosts h0..h3 (the session's)
    ───────────────────────────────────────────       ─────────────────────────────────
    moto's server (S3), gcp-storage-emulator (GCS), <─
      Azurite (Azure Blob, installed by npm if missing) the bootstrap's store client, with
      on the bridge                                    the store's test credentials in the
    CountingIndex on the bridge: the package index     host's own ~/.ssh/environment
      again, every request counted                   each pool in a fresh workdir: no uv,
                                                       no environment, as a new machine

The first pool to need an environment builds it on one node and uploads it; the pool's
other nodes wait and download it; a later pool downloads it on every node and asks the
package index nothing. A damaged entry (truncated, or a digest that does not match) is
rebuilt, never used; a cache that cannot be written leaves every node to build.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.objectstores import AzuriteServer, CountingIndex, GCSServer, S3Server
from support.pools import ssh_provider
from support.reporter import Recorder
from support.sshhosts import USER, Hosts, PackageIndex, build_wheel

import skyward as sky
from skyward.pool.spec import PoolSpec

Store = S3Server | GCSServer | AzuriteServer
_STORES = {"s3": S3Server, "gcs": GCSServer, "azure": AzuriteServer}

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", params=sorted(_STORES))
def store(request: pytest.FixtureRequest, ssh_hosts: Hosts) -> Iterator[Store]:
    """One store on the bridge, and its test credentials in every host's own environment."""
    served = _STORES[request.param](ssh_hosts.bridge_address)
    saved = {h.name: _environment(h.home) for h in ssh_hosts.hosts}
    try:
        for host in ssh_hosts.hosts:
            _set_environment(host.home, {**saved[host.name], **served.env})
        yield served
    finally:
        for host in ssh_hosts.hosts:
            _set_environment(host.home, saved[host.name])
        served.close()


def _environment(home: Path) -> dict[str, str]:
    path = home / ".ssh" / "environment"
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _set_environment(home: Path, variables: dict[str, str]) -> None:
    import shutil

    ssh = home / ".ssh"
    ssh.mkdir(exist_ok=True)
    (ssh / "environment").write_text("".join(f"{k}={v}\n" for k, v in variables.items()))
    shutil.chown(ssh, USER, USER)
    shutil.chown(ssh / "environment", USER, USER)


@pytest.fixture(scope="module")
def index(
    ssh_hosts: Hosts, package_index: PackageIndex, tmp_path_factory: Any
) -> Iterator[CountingIndex]:
    """The session's index with ``skycache`` (which only it has) added, served again with
    every request counted."""
    wheels = tmp_path_factory.mktemp("skycache-wheels")
    package_index.add([build_wheel(wheels, "skycache", "1.0", "VERSION = '1.0'\n")])
    counting = CountingIndex(package_index.root, ssh_hosts.bridge_address)
    try:
        yield counting
    finally:
        counting.close()


def _image(store: Store, index: CountingIndex, prefix: str, **options: Any) -> sky.Image:
    return sky.Image(
        pip=["skycache"],
        index_url=index.url,
        cache=store.cache_url(prefix),
        cache_endpoint=store.url,
        **options,
    )


def _provider(hosts: Hosts, nodes: int) -> sky.SSH:
    """The first ``nodes`` hosts, in a workdir no pool has used: each starts from nothing."""
    targets = [h.target for h in hosts.hosts[:nodes]]
    return ssh_provider(hosts, *targets, workdir=f"~/.cache/skyward-{uuid.uuid4().hex[:8]}")


def _provision(hosts: Hosts, image: sky.Image, nodes: int) -> Recorder:
    """Bring ``nodes`` hosts up and down again, as a pool's start does; what was said."""
    recorder = Recorder()
    provider = _provider(hosts, nodes)
    spec = PoolSpec(provider=provider, nodes=nodes, image=image, quiet=True)
    provider.provision(spec.request(image), recorder).terminate()
    return recorder


def _entry(store: Store, prefix: str) -> str:
    keys = store.keys(prefix)
    assert len(keys) == 1 and keys[0].endswith(".tar.zst"), keys
    return keys[0]


def _skycache() -> str:
    import skycache  # type: ignore[import-not-found]  # only on the workers

    return str(skycache.VERSION)


def _built(text: str) -> bool:
    return "uv pip install" in text


def test_one_node_builds_and_uploads_the_others_wait_and_a_later_pool_downloads_it(
    ssh_hosts: Hosts, store: Store, index: CountingIndex
) -> None:
    prefix = uuid.uuid4().hex[:8]
    image = _image(store, index, prefix)

    first = _provision(ssh_hosts, image, nodes=2)

    texts = [first.text(0), first.text(1)]
    assert sum(_built(t) for t in texts) == 1, texts  # one node built; the other did not
    builder = texts[0] if _built(texts[0]) else texts[1]
    waiter = texts[1] if builder is texts[0] else texts[0]
    assert "skyward: cache: building this environment, then uploading it" in builder
    assert re.search(r"skyward: cache: uploaded \S+ \([\d.]+ MB", builder), builder
    assert "waiting for the node that builds this environment" in waiter
    assert "the pool's builder uploaded the environment; downloading it" in waiter
    assert "installed from the cache" in waiter
    key = _entry(store, prefix)  # one entry, and the builder's marker gone
    data, metadata = store.read(key)
    assert hashlib.sha256(data).hexdigest() == metadata["skyward_sha256"]
    assert "skyward-pool" in store.tags(key)

    index.reset()
    with sky.ComputePool(
        provider=_provider(ssh_hosts, 4), nodes=4, image=image, quiet=True
    ) as pool:
        assert index.count() == 0, index.requests  # a warm cache: the index was not asked
        assert pool.broadcast(_skycache) == ["1.0"] * 4
        timings = pool.timings()
    for node in timings.nodes:
        assert node["cache"] > 0 and node["packages"] == 0 and node["uv"] == 0, str(timings)


@pytest.mark.parametrize("damage", ["truncated", "wrong digest"])
def test_a_damaged_entry_is_ignored_rebuilt_and_replaced(
    ssh_hosts: Hosts, store: Store, index: CountingIndex, damage: str
) -> None:
    prefix = uuid.uuid4().hex[:8]
    image = _image(store, index, prefix)
    _provision(ssh_hosts, image, nodes=1)
    key = _entry(store, prefix)
    data, metadata = store.read(key)
    if damage == "truncated":
        store.write(key, data[: len(data) // 2], metadata)
    else:
        store.write(key, data, {**metadata, "skyward_sha256": "0" * 64})

    again = _provision(ssh_hosts, image, nodes=1)

    text = again.text(0)
    assert re.search(rf"skyward: cache: ignoring {re.escape(key)}: its SHA-256", text), text
    assert _built(text) and "installed from the cache" not in text, text
    data, metadata = store.read(_entry(store, prefix))  # rebuilt, and whole again
    assert hashlib.sha256(data).hexdigest() == metadata["skyward_sha256"]
    with sky.ComputePool(provider=_provider(ssh_hosts, 1), image=image, quiet=True) as pool:
        assert pool.run(_skycache) == "1.0"


def test_a_pool_starts_when_the_cache_cannot_be_written_and_every_node_builds(
    ssh_hosts: Hosts, store: Store, index: CountingIndex
) -> None:
    # A bucket that does not exist: reads miss, and the builder's check that it may write
    # fails, so no node waits for an upload that cannot happen.
    image = _image(store, index, "x").model_copy(
        update={"cache": store.cache_url("x").replace(store.bucket, "skyward-no-bucket")}
    )
    with sky.ComputePool(
        provider=_provider(ssh_hosts, 2), nodes=2, image=image, quiet=True
    ) as pool:
        assert pool.broadcast(_skycache) == ["1.0"] * 2
    recorder = _provision(ssh_hosts, image, nodes=2)
    texts = [recorder.text(0), recorder.text(1)]
    assert all(_built(t) for t in texts), texts
    assert any("building this environment (the cache cannot be written)" in t for t in texts)
    assert any("this node builds the environment itself" in t for t in texts), texts


def test_skyward_cache_lists_and_prunes_the_entries(
    ssh_hosts: Hosts, store: Store, index: CountingIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from skyward.cli import main

    for name, value in store.env.items():  # this machine's credentials for the store
        monkeypatch.setenv(name, value)
    prefix = uuid.uuid4().hex[:8]
    _provision(ssh_hosts, _image(store, index, prefix), nodes=1)
    key = _entry(store, prefix)
    url, endpoint = store.cache_url(prefix), ["--endpoint", store.url]
    runner = CliRunner()

    listed = runner.invoke(main, ["cache", "ls", url, *endpoint])
    assert listed.exit_code == 0 and key in listed.output, listed.output
    kept = runner.invoke(main, ["cache", "prune", url, "--older-than", "1d", "--yes", *endpoint])
    assert kept.exit_code == 0 and "nothing under" in kept.output, kept.output
    assert store.keys(prefix) == [key]
    pruned = runner.invoke(main, ["cache", "prune", url, "--older-than", "0s", "--yes", *endpoint])
    assert pruned.exit_code == 0 and "deleted 1 entries" in pruned.output, pruned.output
    assert store.keys(prefix) == []


def test_the_bootstrap_with_a_cache_is_valid_posix_shell_and_carries_no_credential(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import subprocess

    from skyward.providers.ssh.bootstrap import Plan, render

    secret = f"secret-{uuid.uuid4().hex}"
    for name in ("AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_KEY", "CLOUDSDK_AUTH_ACCESS_TOKEN"):
        monkeypatch.setenv(name, secret)
    plan = Plan(
        image=sky.Image(cache="s3://bucket/envs", cache_endpoint="http://10.0.0.1:9000"),
        python_version="3.11",
        python=None,
        workdir="~/.cache/skyward",
        runtime=("cloudpickle==3.1.1",),
    )
    script = render(plan)
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)
    assert secret not in script  # this client's credentials never travel in the script
    # The cache's place is not what the environment is: the same digest without it.
    plain = Plan(**{**plan.__dict__, "image": sky.Image()})
    assert plan.digest == plain.digest


def test_an_entry_is_read_in_contiguous_ranges_that_start_small_and_grow_to_the_chunk() -> None:
    from itertools import pairwise

    from skyward.providers.envcache.store import CHUNK, FIRST_CHUNK, _ranges

    size = 5 * CHUNK + 12345
    ranges = list(_ranges(size))
    assert ranges[0] == (0, FIRST_CHUNK)
    assert all(end == start for (_, end), (start, _) in pairwise(ranges))
    assert ranges[-1][1] == size
    lengths = [end - start for start, end in ranges]
    assert lengths[:-1] == sorted(lengths[:-1]) and max(lengths) == CHUNK
    assert list(_ranges(100)) == [(0, 100)] and list(_ranges(0)) == []


def test_the_key_for_the_running_interpreter_is_the_one_a_new_process_of_it_gives() -> None:
    import sys
    from unittest import mock

    from skyward.providers.envcache import store

    python = sys.executable
    asked = store.entry_key("p", "d", python, "3.11")
    # Told it runs under another path, this process cannot answer for ``python``: a new
    # process of it does, as for any host Python that is not the one running the client.
    with mock.patch.object(store.sys, "executable", "/nonexistent/python"):
        started = store.entry_key("p", "d", python, "3.11")
    assert asked == started
