"""Pool factories: the same behaviour suite builds pools on every provider it is given."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import skyward as sky
from support.sshhosts import Hosts, PackageIndex


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
