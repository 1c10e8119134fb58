"""Which ``skyward.worker`` processes are alive: the leak check after every test, and pools
that module-scoped fixtures keep open on purpose."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psutil

import skyward as sky
from support.sshhosts import USER

# Pools that a module-scoped fixture keeps open across tests on purpose, and their workers.
_shared_pools: weakref.WeakSet[sky.ComputePool] = weakref.WeakSet()
_shared_pool_workers: set[int] = set()


@contextmanager
def shared_pool(
    make: Callable[..., sky.ComputePool] | None = None, **options: Any
) -> Iterator[sky.ComputePool]:
    """A pool for a module-scoped fixture: its workers are not leaks until it closes."""
    make = make or (lambda **o: sky.ComputePool(**{"quiet": True, **o}))
    with make(**options) as pool:
        _shared_pools.add(pool)
        pids = set(pool.broadcast(os.getpid))
        pids |= {_launcher(pid) for pid in pids} - {None}  # type: ignore[arg-type]
        _shared_pool_workers.update(pids)
        try:
            yield pool
        finally:
            _shared_pool_workers.difference_update(pids)
            _shared_pools.discard(pool)
    assert not worker_processes(), "a shared pool left workers behind"


def is_shared(pool: sky.ComputePool) -> bool:
    """Whether a module-scoped fixture keeps ``pool`` open across tests on purpose."""
    return pool in _shared_pools


class Namespaces:
    """The network namespaces of this process's hosts and stand-ins, by name: the test
    user's processes in them are ours, even once orphaned; other test processes on the
    machine (another xdist worker, another run) have their own.

    A name counts while ``/run/netns/NAME`` is still the namespace it was when added. Its
    inode alone would not do: a deleted namespace's number goes to the next namespace anyone
    makes, and an entry left after its namespace went (a fixture's close that raised before
    its discard, a machine set up after its cloud closed) would claim another process's
    workers for this one's leak check, which then kills them."""

    def __init__(self) -> None:
        self._inodes: dict[str, int] = {}

    def add(self, *names: str) -> None:
        for name in names:
            self._inodes[name] = os.stat(f"/run/netns/{name}").st_ino

    def discard(self, *names: str) -> None:
        for name in names:
            self._inodes.pop(name, None)

    def live(self) -> dict[str, int]:
        """Name to inode, for those still mounted under their name as they were added."""
        found = {}
        for name, inode in list(self._inodes.items()):
            try:
                if os.stat(f"/run/netns/{name}").st_ino == inode:
                    found[name] = inode
            except OSError:
                continue  # deleted
        return found


our_namespaces = Namespaces()


def worker_processes() -> list[psutil.Process]:
    """``skyward.worker`` processes still alive: our descendants (local pools) and the SSH
    test user's on our hosts (remote ones). Zombies count as gone."""
    alive = []
    ours = set(our_namespaces.live().values())
    remote = [
        p for p in psutil.process_iter() if _username(p) == USER and _namespace(p.pid) in ours
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


def describe(process: psutil.Process) -> str:
    try:
        with process.oneshot():
            return (
                f"pid {process.pid} ({process.status()}, user {_username(process)}, parent "
                f"{process.ppid()} {_command_of(process.ppid())!r}{_ssh_client_of(process)}, "
                f"network namespace "
                f"{_namespace(process.pid)}, started "
                f"{time.time() - process.create_time():.1f} s ago): "
                f"{' '.join(process.cmdline())[:160]}"
            )
    except psutil.Error as error:
        return f"pid {process.pid} ({error})"


def _command_of(pid: int) -> str:
    """A process's command line, short (whose a leaked worker is: an sshd session, a
    stand-in's init, a pytest)."""
    try:
        return " ".join(psutil.Process(pid).cmdline())[:60]
    except psutil.Error:
        return "?"


def _ssh_client_of(process: psutil.Process) -> str:
    """For a worker an sshd session started: the local process whose connection that session
    serves (the client that spawned it), found by the session's TCP peer."""
    try:
        session = psutil.Process(process.ppid())
        if "sshd" not in " ".join(session.cmdline()):
            session = psutil.Process(session.ppid())
        peers = {
            (c.raddr.ip, c.raddr.port, c.laddr.ip, c.laddr.port)
            for c in session.net_connections("tcp")
            if c.raddr and c.status == psutil.CONN_ESTABLISHED
        }
        for conn in psutil.net_connections("tcp"):
            if conn.raddr and conn.pid and (*conn.laddr, *conn.raddr) in peers:
                return f", its SSH client pid {conn.pid} {_command_of(conn.pid)!r}"
    except (psutil.Error, OSError):
        pass
    return ""
