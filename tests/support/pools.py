"""Pool factories: the same behaviour suite builds pools on every provider it is given."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import pytest

import skyward as sky
from support.sshhosts import Hosts, PackageIndex

R = TypeVar("R")


def ssh_provider(hosts: Hosts, *targets: str, **options: Any) -> sky.SSH:
    """SSH to ``targets`` (every test host by default) with this run's key and known_hosts,
    unless ``options`` name others."""
    options = {"key": hosts.client_key, "known_hosts": hosts.known_hosts, **options}
    return sky.SSH(hosts=list(targets) or [h.target for h in hosts.hosts], **options)


PoolFactory = Callable[..., sky.ComputePool]


def pool_factory(kind: str, request: pytest.FixtureRequest) -> PoolFactory:
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


def start_in_thread(pool: sky.ComputePool) -> tuple[threading.Thread, list[BaseException]]:
    """``pool.start()`` on a thread of its own (a test closes the pool meanwhile); what it
    raised is collected in the list."""
    errors: list[BaseException] = []

    def start() -> None:
        try:
            pool.start()
        except BaseException as exc:
            errors.append(exc)

    starter = threading.Thread(target=start)
    starter.start()
    return starter, errors


def broadcast_in_background(
    pool: sky.ComputePool, fn: Callable[..., R], /, *args: Any
) -> Future[list[R]]:
    """``pool.broadcast(fn, *args)`` on a thread of its own, its outcome in a Future: a
    broadcast the test acts on while it runs, through the public API."""
    outcome: Future[list[R]] = Future()

    def run() -> None:
        try:
            outcome.set_result(pool.broadcast(fn, *args))
        except BaseException as exc:
            outcome.set_exception(exc)

    threading.Thread(target=run, name="broadcast-in-background", daemon=True).start()
    return outcome
