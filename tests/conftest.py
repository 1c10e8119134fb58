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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import pytest

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
def shared_pool(**options: Any) -> Iterator[sky.ComputePool]:
    """A pool for a module-scoped fixture: its workers are not leaks until it closes."""
    with sky.ComputePool(quiet=True, **options) as pool:
        pids = set(pool.broadcast(os.getpid))
        _shared_pool_workers.update(pids)
        try:
            yield pool
        finally:
            _shared_pool_workers.difference_update(pids)
    assert not worker_processes(), "a shared pool left workers behind"


def worker_processes() -> list[psutil.Process]:
    """Our ``skyward.worker`` descendants that are still alive (zombies count as gone)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE or child.pid in _shared_pool_workers:
                continue
            if "skyward.worker" in " ".join(child.cmdline()):
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.fixture(autouse=True)
def no_leaked_workers(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    deadline = time.monotonic() + 5.0
    while (leaked := worker_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for process in leaked:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    assert not leaked, f"{request.node.name} left worker processes alive: {leaked}"
