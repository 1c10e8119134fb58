"""Shared fixtures: a network guard, fake cloud credentials, and a leaked-worker check.

The guard refuses any connection or name lookup that is not loopback or the test
namespaces' range, so a mistake fails fast instead of leaving the machine. The leak check
runs after every test: a test that leaves a ``skyward.worker`` process alive fails, by name.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from sshhosts import USER, Hosts, PackageIndex

import skyward as sky

# Addresses tests may reach: loopback, and the bridge range of network namespaces that tests
# create themselves (see TESTBED.md).
_ALLOWED = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128", "10.123.0.0/16")]
_ALLOWED_NAMES = {"localhost", "localhost.localdomain", "", None}

os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_GCE_CHECK": "True",
    }
)


def _allowed_host(host: Any) -> bool:
    if host in _ALLOWED_NAMES or host == socket.gethostname():
        return True
    try:
        address = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False
    return any(address in network for network in _ALLOWED)


def _guard(address: Any) -> None:
    if isinstance(address, tuple) and not _allowed_host(address[0]):
        raise ConnectionRefusedError(f"test network guard: refusing to connect to {address!r}")


_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex
_getaddrinfo = socket.getaddrinfo


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _guard(address)
    _connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _guard(address)
    return _connect_ex(self, address)


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(host, bytes):
        host = host.decode()
    if not _allowed_host(host):
        raise socket.gaierror(f"test network guard: refusing to look up {host!r}")
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
socket.getaddrinfo = _guarded_getaddrinfo


# Workers of pools that a module-scoped fixture keeps open across tests on purpose.
_shared_pool_workers: set[int] = set()


@contextmanager
def shared_pool(
    make: Callable[..., sky.ComputePool] | None = None, **options: Any
) -> Iterator[sky.ComputePool]:
    """A pool for a module-scoped fixture: its workers are not leaks until it closes."""
    make = make or (lambda **o: sky.ComputePool(**{"quiet": True, **o}))
    with make(**options) as pool:
        pids = set(pool.broadcast(os.getpid))
        pids |= {_launcher(pid) for pid in pids} - {None}  # type: ignore[arg-type]
        _shared_pool_workers.update(pids)
        try:
            yield pool
        finally:
            _shared_pool_workers.difference_update(pids)
    assert not worker_processes(), "a shared pool left workers behind"


# Network namespaces (by inode) of this session's SSH hosts: the test user's processes in
# them are ours, even once orphaned; another test run on the machine has its own.
_our_namespaces: set[int] = set()


def worker_processes() -> list[psutil.Process]:
    """``skyward.worker`` processes still alive: our descendants (local pools) and the SSH
    test user's on our hosts (remote ones). Zombies count as gone."""
    alive = []
    remote = [
        p
        for p in psutil.process_iter()
        if _username(p) == USER and _namespace(p.pid) in _our_namespaces
    ]
    for child in psutil.Process().children(recursive=True) + remote:
        try:
            if child.status() == psutil.STATUS_ZOMBIE or child.pid in _shared_pool_workers:
                continue
            if "skyward.worker" in " ".join(child.cmdline()):
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


def _launcher(pid: int) -> int | None:
    """The shell an SSH worker runs under (its parent), which names the worker too."""
    try:
        parent = psutil.Process(pid).parent()
        if parent is not None and "skyward.worker" in " ".join(parent.cmdline()):
            return int(parent.pid)
    except psutil.Error:
        pass
    return None


def _namespace(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _username(process: psutil.Process) -> str:
    try:
        return str(process.username())
    except (psutil.Error, KeyError):
        return ""


@pytest.fixture(autouse=True)
def no_leaked_workers(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    deadline = time.monotonic() + 5.0
    while (leaked := worker_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    found = [_describe(p) for p in leaked]  # as they were, before they are killed below
    for process in leaked:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    assert not leaked, f"{request.node.name} left worker processes alive: {found}"


def _describe(process: psutil.Process) -> str:
    try:
        with process.oneshot():
            return (
                f"pid {process.pid} ({process.status()}, user {_username(process)}, parent "
                f"{process.ppid()}, started {time.time() - process.create_time():.1f} s ago): "
                f"{' '.join(process.cmdline())[:160]}"
            )
    except psutil.Error as error:
        return f"pid {process.pid} ({error})"


# ── SSH hosts in network namespaces, and the package index they install from ─────────────

_WHEEL_CACHE = Path.home() / ".cache" / "skyward-tests" / "wheels"


@pytest.fixture(scope="session")
def ssh_hosts() -> Iterator[Hosts]:
    hosts = Hosts.start(4)
    namespaces = {os.stat(f"/run/netns/{h.netns}").st_ino for h in hosts.hosts}
    _our_namespaces.update(namespaces)
    try:
        yield hosts
    finally:
        hosts.close()
        _our_namespaces.difference_update(namespaces)
    assert not hosts.leftovers(), f"SSH test hosts left behind: {hosts.leftovers()}"


@pytest.fixture(scope="session")
def package_index(ssh_hosts: Hosts) -> Iterator[PackageIndex]:
    """What the hosts may install: the worker's own needs, uv, jax, and test packages."""
    from importlib import metadata

    index = PackageIndex(ssh_hosts.root / "index", ssh_hosts.bridge_address)
    try:
        pins = [f"{n}=={metadata.version(n)}" for n in ("cloudpickle", "pydantic", "jax", "jaxlib")]
        index.download([*pins, "uv"], _WHEEL_CACHE)
        yield index
    finally:
        index.close()


def ssh_provider(hosts: Hosts, *targets: str, **options: Any) -> sky.SSH:
    """SSH to ``targets`` (every test host by default) with this run's key and known_hosts,
    unless ``options`` name others."""
    options = {"key": hosts.client_key, "known_hosts": hosts.known_hosts, **options}
    return sky.SSH(hosts=list(targets) or [h.target for h in hosts.hosts], **options)


PoolFactory = Callable[..., sky.ComputePool]


def _pool_factory(kind: str, request: pytest.FixtureRequest) -> PoolFactory:
    if kind == "local":
        return lambda **options: sky.ComputePool(**{"quiet": True, **options})
    hosts: Hosts = request.getfixturevalue("ssh_hosts")
    index: PackageIndex = request.getfixturevalue("package_index")

    def make(**options: Any) -> sky.ComputePool:
        image = options.pop("image", None) or sky.Image()
        return sky.ComputePool(
            provider=ssh_provider(hosts),
            image=image.model_copy(update={"index_url": index.url}),
            **{"quiet": True, **options},
        )

    return make


@pytest.fixture(params=["local", "ssh"])
def make_pool(request: pytest.FixtureRequest) -> PoolFactory:
    """Build pools on either transport: the core behaviour suite runs over both."""
    return _pool_factory(request.param, request)


@pytest.fixture(scope="module", params=["local", "ssh"])
def make_module_pool(request: pytest.FixtureRequest) -> PoolFactory:
    return _pool_factory(request.param, request)


@pytest.fixture(scope="session")
def _shared_tmp() -> Iterator[Path]:
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="skyward-tests-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tmp_path(_shared_tmp: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh directory that SSH workers, who run as another user, can use too.

    Tests hand paths to workers (gates, logs); pytest's own ``tmp_path`` is private to root.
    Like pytest's, it outlives its test (a worker may still be looking at it while the
    pool's fixture closes), and goes at the end of the session.
    """
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=request.node.name[:40] + "-", dir=_shared_tmp))
    path.chmod(0o777)
    return path
