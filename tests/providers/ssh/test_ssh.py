"""What only the SSH provider does: bootstrap from the image, host keys, dropped links.

The core behaviour suite runs over SSH too (``make_pool``); these are the rest. Hosts are
real OpenSSH servers in network namespaces (``support/sshhosts.py``); they install from the local
package index only.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.markers import wait_for_markers
from support.pools import ssh_provider
from support.processes import worker_processes
from support.reporter import Recorder
from support.sshhosts import Hosts, PackageIndex, build_wheel

import skyward as sky
from skyward.pool.spec import PoolSpec
from skyward.providers.ssh.bootstrap import Plan, render

SNAPSHOTS = Path(__file__).parent / "snapshots"


def fresh_workdir() -> str:
    """A cache directory no pool has used: the bootstrap starts from nothing."""
    return f"~/.cache/skyward-{uuid.uuid4().hex[:8]}"


def provision(provider: sky.SSH, image: sky.Image, nodes: int = 1) -> tuple[Recorder, float]:
    """Bring nodes up and down again, as a pool's start does; what was reported, and how long."""
    recorder = Recorder()
    spec = PoolSpec(provider=provider, nodes=nodes, image=image, quiet=True)
    started = time.perf_counter()
    made = provider.provision(spec.request(image), recorder)
    elapsed = time.perf_counter() - started
    made.terminate()
    return recorder, elapsed


# ── the bootstrap script ─────────────────────────────────────────────────────────────────


SNAPSHOT_PLANS = {
    "minimal": Plan(
        image=sky.Image(),
        python_version="3.11",
        python=None,
        workdir="~/.cache/skyward",
        runtime=("cloudpickle==3.1.1", "pydantic==2.11.7"),
    ),
    "everything": Plan(
        image=sky.Image(
            pip=["numpy>=2", "jax[cuda12]==0.6.2", "skytiny"],
            pip_indexes=[
                sky.PipIndex(
                    url="https://mirror.example/jax/",
                    packages=["jax-cuda12-plugin"],
                    find_links=True,
                ),
                sky.PipIndex(url="http://10.0.0.5:8700/simple/", packages=["skytiny"]),
            ],
            index_url="https://pypi.mirror.example/simple/",
            apt=["libgl1", "git"],
            env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "A": "it's"},
            setup=["echo ready > /tmp/marker", "git --version"],
        ),
        python_version="3.12",
        python="/opt/python/bin/python3.12",
        workdir="/srv/skyward",
        runtime=("cloudpickle==3.1.1", "pydantic==2.11.7"),
    ),
}


@pytest.mark.parametrize("name", sorted(SNAPSHOT_PLANS))
def test_bootstrap_script_matches_its_snapshot(name: str) -> None:
    """The script is a pure function of the plan. Set SKYWARD_UPDATE_SNAPSHOTS=1 to accept a
    deliberate change, and read the diff."""
    script = render(SNAPSHOT_PLANS[name])
    path = SNAPSHOTS / f"bootstrap-{name}.sh"
    if os.environ.get("SKYWARD_UPDATE_SNAPSHOTS"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(script)
    assert script == path.read_text()
    assert render(SNAPSHOT_PLANS[name]) == script


@pytest.mark.parametrize("name", sorted(SNAPSHOT_PLANS))
def test_bootstrap_script_is_valid_posix_shell(name: str) -> None:
    subprocess.run(["sh", "-n"], input=render(SNAPSHOT_PLANS[name]), text=True, check=True)


def test_env_changes_do_not_rebuild_the_environment_unless_setup_sees_them() -> None:
    base = SNAPSHOT_PLANS["minimal"]
    with_env = Plan(**{**base.__dict__, "image": sky.Image(env={"A": "1"})})
    assert with_env.digest == base.digest
    with_setup = Plan(**{**base.__dict__, "image": sky.Image(env={"A": "1"}, setup=["true"])})
    other_setup = Plan(**{**base.__dict__, "image": sky.Image(env={"A": "2"}, setup=["true"])})
    assert with_setup.digest != other_setup.digest


def test_setup_commands_see_env_values_byte_for_byte() -> None:
    # Values with characters str.splitlines() splits on (\r, \f) must reach setup whole.
    value = "a\r\nb\x0cc 'd' $e"
    base = SNAPSHOT_PLANS["minimal"]
    plan = Plan(**{**base.__dict__, "image": sky.Image(env={"A": value}, setup=["true"])})
    start = render(plan).index("export A=")
    export = render(plan)[start:].split("\nrun sh -c")[0]
    shown = subprocess.run(
        ["sh", "-c", f'{export}\nprintf %s "$A"'], capture_output=True, check=True
    )
    assert shown.stdout == value.encode()  # bytes: text mode would turn \r\n into \n


# ── bootstrap on real hosts ───────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def skytiny_indexes(
    ssh_hosts: Hosts, package_index: PackageIndex, tmp_path_factory: Any
) -> Iterator[tuple[str, str]]:
    """``skytiny`` 1.0 and 3.0 on the main index; 2.0 alone on a second one.

    A PipIndex scoped to skytiny must give 2.0, though the main index has a newer version,
    also when skytiny is only a dependency (of ``skydep``, as jaxlib is of jax). ``skyother``
    1.0 is on the main index and 9.0 on the second, which is not scoped to it: it stays 1.0.
    """
    wheels = tmp_path_factory.mktemp("wheels")
    package_index.add(
        [
            build_wheel(wheels, "skytiny", "1.0", "VERSION = '1.0'\n"),
            build_wheel(wheels, "skytiny", "3.0", "VERSION = '3.0'\n"),
            build_wheel(wheels, "skyother", "1.0", "VERSION = '1.0'\n"),
            build_wheel(wheels, "skydep", "1.0", "VERSION = '1.0'\n", requires=["skytiny"]),
        ]
    )
    extra_wheels = tmp_path_factory.mktemp("extra-wheels")
    extra = PackageIndex(tmp_path_factory.mktemp("extra"), ssh_hosts.bridge_address, port=8701)
    try:
        extra.add(
            [
                build_wheel(extra_wheels, "skytiny", "2.0", "VERSION = '2.0'\n"),
                build_wheel(extra_wheels, "skyother", "9.0", "VERSION = '9.0'\n"),
            ]
        )
        yield package_index.url, extra.url
    finally:
        extra.close()


def _versions() -> tuple[str, str, str]:
    import skyother  # type: ignore[import-not-found]
    import skytiny  # type: ignore[import-not-found]

    return skytiny.VERSION, skyother.VERSION, os.environ.get("VIRTUAL_ENV", "")


@pytest.mark.timeout(300)
def test_bootstrap_installs_with_scoped_index_and_a_second_pool_installs_nothing(
    ssh_hosts: Hosts, skytiny_indexes: tuple[str, str]
) -> None:
    main, extra = skytiny_indexes
    image = sky.Image(
        pip=["skydep", "skyother"],
        pip_indexes=[sky.PipIndex(url=extra, packages=["skytiny"])],
        index_url=main,
    )
    provider = ssh_provider(ssh_hosts, workdir=fresh_workdir())

    first, first_time = provision(provider, image, nodes=2)
    second, second_time = provision(provider, image, nodes=2)

    for node in (0, 1):
        assert "uv pip install" in first.text(node), first.text(node)
        assert re.search(r"^skyward: image \w+ installed$", first.text(node), re.M)
        assert "skyward: uploading this skyward" in first.text(node)
        assert "is already installed" in second.text(node)
        assert "pip install" not in second.text(node)
        assert [p for n, p, _ in second.phases if n == node] == ["connecting", "bootstrapping"]
    print(f"bootstrap: first pool {first_time:.2f} s, second {second_time:.2f} s")

    with sky.ComputePool(provider=provider, nodes=2, image=image, quiet=True) as pool:
        assert pool.broadcast(_versions) == [("2.0", "1.0", "")] * 2


@pytest.mark.timeout(300)
def test_a_find_links_page_serves_only_the_packages_it_names(
    ssh_hosts: Hosts, package_index: PackageIndex, tmp_path_factory: Any
) -> None:
    """A find-links page (a directory listing) scoped to skytiny: skytiny 2.0 comes from it,
    skyother stays the main index's 1.0 though the page has 9.0."""
    links_dir = tmp_path_factory.mktemp("links")
    links = PackageIndex(links_dir, ssh_hosts.bridge_address, port=8703)
    try:
        build_wheel(links_dir, "skytiny", "2.0", "VERSION = '2.0'\n")
        build_wheel(links_dir, "skyother", "9.0", "VERSION = '9.0'\n")
        wheels = tmp_path_factory.mktemp("main-wheels")
        package_index.add([build_wheel(wheels, "skyother", "1.0", "VERSION = '1.0'\n")])
        # http.server lists a directory's files as links: a find-links page.
        page = links.url.replace("/simple/", "/")
        image = sky.Image(
            pip=["skytiny", "skyother"],
            pip_indexes=[sky.PipIndex(url=page, packages=["skytiny"], find_links=True)],
            index_url=package_index.url,
        )
        provider = ssh_provider(ssh_hosts, workdir=fresh_workdir())
        with sky.ComputePool(provider=provider, nodes=1, image=image, quiet=True) as pool:
            assert pool.run(_versions)[:2] == ("2.0", "1.0")
    finally:
        links.close()


@pytest.mark.timeout(120)
def test_an_index_without_uv_is_a_bootstrap_error_naming_the_page_and_the_setting(
    ssh_hosts: Hosts, package_index: PackageIndex, tmp_path_factory: Any
) -> None:
    """uv comes from the image's index: without it there, the bootstrap stops at once and
    says where it looked and what to set (there is no pip fallback to fail later)."""
    no_uv = PackageIndex(tmp_path_factory.mktemp("no-uv"), ssh_hosts.bridge_address, port=8702)
    try:
        no_uv.add(w for w in package_index.simple.glob("*/*.whl") if not w.name.startswith("uv-"))
        image = sky.Image(index_url=no_uv.url)
        provider = ssh_provider(ssh_hosts, ssh_hosts.hosts[0].target, workdir=fresh_workdir())
        with pytest.raises(sky.BootstrapError) as caught:
            with sky.ComputePool(provider=provider, nodes=1, image=image, quiet=True):
                pass
        error = caught.value
        assert error.exit_status == 69
        assert error.command is not None and error.command.startswith("install uv into")
        first = str(error).splitlines()[0]
        assert f"cannot read {no_uv.url}uv/" in first, first
        assert "Image(index_url=...)" in first and "uv 0.8.0 or newer" in first
        assert "404" in error.log_tail  # curl's own line
    finally:
        no_uv.close()


@pytest.mark.timeout(120)
def test_a_failing_setup_command_is_a_bootstrap_error_naming_it(
    ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    image = sky.Image(
        index_url=package_index.url,
        setup=["echo preparing the dataset", "echo no space left >&2; exit 7"],
    )
    provider = ssh_provider(ssh_hosts, workdir=fresh_workdir())
    with pytest.raises(sky.BootstrapError) as caught:
        with sky.ComputePool(provider=provider, nodes=1, image=image, quiet=True):
            pass
    error = caught.value
    assert error.exit_status == 7
    assert error.command == "sh -c echo no space left >&2; exit 7"
    assert "no space left" in error.log_tail and "preparing the dataset" in error.log_tail
    assert ssh_hosts.hosts[0].address in str(error)
    assert not worker_processes()


# ── host keys ─────────────────────────────────────────────────────────────────────────────


def _one_host(hosts: Hosts, known_hosts: Path, **options: Any) -> sky.SSH:
    return ssh_provider(hosts, hosts.hosts[0].target, known_hosts=known_hosts, **options)


def _pool(provider: sky.SSH, index: PackageIndex, nodes: int = 1) -> sky.ComputePool:
    return sky.ComputePool(
        provider=provider, nodes=nodes, image=sky.Image(index_url=index.url), quiet=True
    )


@pytest.mark.timeout(120)
def test_an_unknown_host_key_is_refused_unless_new_hosts_are_accepted(
    ssh_hosts: Hosts, package_index: PackageIndex, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    host = ssh_hosts.hosts[0]

    with pytest.raises(sky.HostKeyError) as caught:
        with _pool(_one_host(ssh_hosts, known_hosts), package_index):
            pass
    message = str(caught.value)
    assert host.address in message and "accept_new_hosts=True" in message
    assert known_hosts.read_text() == ""

    with _pool(_one_host(ssh_hosts, known_hosts, accept_new_hosts=True), package_index) as pool:
        assert pool.run(os.uname).nodename == "h0"
    assert known_hosts.read_text().split() == [host.address, "ssh-ed25519", host.public_host_key()]
    # Now it is known: accepted without the opt-in.
    with _pool(_one_host(ssh_hosts, known_hosts), package_index) as pool:
        assert pool.run(os.uname).nodename == "h0"


@pytest.mark.timeout(120)
def test_a_changed_host_key_is_always_refused(
    ssh_hosts: Hosts, package_index: PackageIndex, tmp_path: Path
) -> None:
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    host = ssh_hosts.hosts[0]
    known_hosts = tmp_path / "known_hosts"
    impostor_key = Path(f"{impostor}.pub").read_text().split()[1]
    known_hosts.write_text(f"{host.address} ssh-ed25519 {impostor_key}\n")
    before = known_hosts.read_text()

    for accept in (False, True):
        with pytest.raises(sky.HostKeyError) as caught:
            with _pool(_one_host(ssh_hosts, known_hosts, accept_new_hosts=accept), package_index):
                pass
        message = str(caught.value)
        assert "CHANGED" in message and f"-R {host.address}" in message
    assert known_hosts.read_text() == before


# ── a dropped link ────────────────────────────────────────────────────────────────────────


def _sleep_then_answer(seconds: float, started: str) -> str:
    Path(started).touch()
    time.sleep(seconds)
    return os.uname().nodename


@pytest.mark.timeout(180)
def test_a_link_that_goes_down_during_a_call_ends_it_with_worker_lost(
    ssh_hosts: Hosts, package_index: PackageIndex, tmp_path: Path
) -> None:
    host = ssh_hosts.hosts[1]
    provider = ssh_provider(ssh_hosts, host.target, keepalive=1, link_timeout=5, connect_timeout=3)
    try:
        with _pool(provider, package_index) as pool:
            started = tmp_path / "started"
            future = pool.submit(_sleep_then_answer, 600, str(started))
            wait_for_markers(started)  # the call is running on the host
            host.link_down()
            down = time.monotonic()
            with pytest.raises(sky.WorkerLost) as caught:
                future.result(timeout=120)  # longer than the bound below, so that it can fail
            lost_after = time.monotonic() - down
            print(f"link down → WorkerLost in {lost_after:.1f} s")
            assert lost_after < 60
            assert f"node 0: the SSH connection to {host.target} dropped" in str(caught.value)
            # The host comes back before the pool closes: close reaches it again and stops
            # the worker that the dropped link stranded there.
            host.link_up()
    finally:
        host.link_up()
    assert not worker_processes()


# ── JAX across hosts ──────────────────────────────────────────────────────────────────────


def _jax_toy() -> tuple[float, int, str]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 2), ("i", "j"))
    array = jax.device_put(np.arange(32).reshape((4, 8)), NamedSharding(mesh, P("i", "j")))
    return float(jnp.sum(jnp.sin(array))), jax.device_count(), os.uname().nodename


@pytest.mark.timeout(300)
def test_jax_multi_controller_across_two_hosts(
    ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    """Two hosts in their own namespaces, 2 CPU devices each, one distributed runtime whose
    coordinator is on host 0's namespace address."""
    with sky.ComputePool(
        provider=ssh_provider(ssh_hosts),
        nodes=2,
        image=sky.Image(index_url=package_index.url),
        plugins=[sky.plugins.jax(cpu_devices=2)],
        quiet=True,
    ) as pool:
        assert pool.broadcast(sky.instance_info)[1].head_addr == ssh_hosts.hosts[0].address
        results = pool.broadcast(_jax_toy)
    assert results == [(-0.12398731708526611, 4, "h0"), (-0.12398731708526611, 4, "h1")]


# ── connection failures, keys, and what a pool leaves on a host ───────────────────────────


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("refused", "connection refused; is sshd running and listening on port 2222?"),
        ("timeout", "connecting timed out after 1 s"),
    ],
)
@pytest.mark.timeout(60)
def test_a_host_that_cannot_be_reached_is_a_provision_error_naming_it(
    ssh_hosts: Hosts, where: str, expected: str
) -> None:
    # Port 2222 on a live host has nothing listening; .99 on the bridge is no host at all.
    target = (
        f"skytest@{ssh_hosts.hosts[0].address}:2222"
        if where == "refused"
        else f"skytest@{ssh_hosts.subnet}.99"
    )
    with pytest.raises(sky.ProvisionError) as caught:
        with sky.ComputePool(
            provider=ssh_provider(ssh_hosts, target, connect_timeout=1), quiet=True
        ):
            pass
    assert str(caught.value).startswith(f"{target}: {expected}")


@pytest.mark.timeout(60)
def test_a_key_the_host_does_not_accept_is_an_authentication_error(
    ssh_hosts: Hosts, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    target = ssh_hosts.hosts[0].target
    with pytest.raises(sky.ProvisionError) as caught:
        with sky.ComputePool(provider=ssh_provider(ssh_hosts, target, key=stranger), quiet=True):
            pass
    assert str(caught.value).startswith(f"{target}: authentication failed")


def test_more_nodes_than_hosts_is_refused_before_connecting() -> None:
    provider = sky.SSH(hosts=["alice@gpu1", "alice@gpu2:2222"])
    with pytest.raises(ValueError, match="asks for 3 nodes but SSH has 2 host"):
        sky.ComputePool(provider=provider, nodes=3)


@pytest.mark.timeout(120)
def test_a_pool_key_is_private_works_and_is_deleted(
    ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    """The key cloud providers will put on the machines they create."""
    from skyward.providers.ssh.connection import PoolKey

    key = PoolKey()
    host = ssh_hosts.hosts[2]
    authorized = host.home.parent / "authorized_keys"
    before = authorized.read_text()
    try:
        assert key.path.stat().st_mode & 0o777 == 0o600
        assert key.public.startswith("ssh-ed25519 ")
        authorized.write_text(before + key.public + "\n")
        provider = ssh_provider(ssh_hosts, host.target, key=key.path)
        with _pool(provider, package_index) as pool:
            assert pool.run(os.uname).nodename == "h2"
    finally:
        authorized.write_text(before)
        key.delete()
    assert not key.path.exists() and not key.path.parent.exists()


@pytest.mark.timeout(120)
def test_a_closed_pool_leaves_only_its_cache_directory(
    ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    host = ssh_hosts.hosts[3]
    with _pool(ssh_provider(ssh_hosts, host.target), package_index) as pool:
        worker = pool.run(os.getpid)
    assert [p.name for p in host.home.iterdir()] == [".cache"]
    assert worker not in host.processes()


def _sessions(host: Any) -> list[str]:
    """The host's sshd processes serving a login: one set per open connection."""
    import psutil

    found = []
    for pid in host.processes():
        try:
            command = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        if command.startswith("sshd: skytest"):
            found.append(command)
    return found


@pytest.mark.timeout(120)
def test_a_failing_host_cancels_the_others_and_closes_their_connections(
    ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    """Host 1 refuses at once while host 0 is still connecting or bootstrapping (a fresh
    cache directory): the pool fails naming host 1, and host 0 is not left connected."""
    good = ssh_hosts.hosts[0]
    bad = f"skytest@{ssh_hosts.hosts[1].address}:2222"
    provider = ssh_provider(ssh_hosts, good.target, bad, workdir=fresh_workdir())
    with pytest.raises(sky.ProvisionError, match=f"^{re.escape(bad)}: connection refused"):
        with _pool(provider, package_index, nodes=2):
            pass
    deadline = time.monotonic() + 10
    while _sessions(good) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _sessions(good)
