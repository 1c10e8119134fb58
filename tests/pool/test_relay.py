"""A large broadcast to a remote pool crosses the client's link once and is relayed between
the nodes; what every node gets, and what a node lost mid-relay does to the broadcast.

Real SSH hosts in network namespaces on one bridge (``support/sshhosts.py``). What the
client sends is read from the bridge's own transmit counter: the root namespace's side of
every host's link, so host-to-host traffic, which the bridge forwards, is not in it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from support.pools import ssh_provider
from support.processes import shared_pool
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.pool.scheduler import RELAY_MIN_BYTES


@sky.compute
def digests(text: bytes, blob: Any) -> tuple[str, str, int]:
    """What this node got: the digest of each part, and its node rank."""
    return (
        hashlib.sha256(text).hexdigest(),
        hashlib.sha256(memoryview(blob)).hexdigest(),
        sky.instance_info().node,
    )


def payload(size: int) -> tuple[bytes, pickle.PickleBuffer]:
    """Bytes inside the pickle, and a buffer that travels out of band (as numpy arrays do)."""
    data = os.urandom(size)
    return data[: size // 4], pickle.PickleBuffer(bytearray(data[size // 4 :]))


def expected(text: bytes, blob: pickle.PickleBuffer) -> tuple[str, str]:
    return hashlib.sha256(text).hexdigest(), hashlib.sha256(blob.raw()).hexdigest()


def sent_by_client(hosts: Hosts) -> int:
    return int(Path(f"/sys/class/net/{hosts.bridge}/statistics/tx_bytes").read_text())


@contextlib.contextmanager
def slow_uplink(hosts: Hosts, mbit: int) -> Iterator[None]:
    """The client's side of every host's link at ``mbit`` Mbit/s; hosts unshaped between."""
    shape = ["tbf", "rate", f"{mbit}mbit", "burst", "256kb", "latency", "50ms"]
    subprocess.run(
        ["tc", "qdisc", "add", "dev", hosts.bridge, "root", *shape], check=True, capture_output=True
    )
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", hosts.bridge, "root"], capture_output=True)


def every_host(hosts: Hosts, index: PackageIndex) -> sky.ComputePool:
    return sky.ComputePool(
        provider=ssh_provider(hosts),
        nodes=len(hosts.hosts),
        image=sky.Image(index_url=index.url),
        quiet=True,
    )


@pytest.fixture(scope="module")
def pool(ssh_hosts: Hosts, package_index: PackageIndex) -> Iterator[sky.ComputePool]:
    with shared_pool(lambda: every_host(ssh_hosts, package_index)) as pool:
        yield pool


@pytest.mark.timeout(120)
def test_a_large_broadcast_gives_every_node_identical_bytes_and_crosses_the_link_once(
    pool: sky.ComputePool, ssh_hosts: Hosts
) -> None:
    text, blob = payload(8 * 2**20)
    before = sent_by_client(ssh_hosts)
    results = digests(text, blob) @ pool
    sent = sent_by_client(ssh_hosts) - before
    assert [r[:2] for r in results] == [expected(text, blob)] * 4
    assert [r[2] for r in results] == [0, 1, 2, 3]
    assert sent < 1.5 * 8 * 2**20, f"the client sent {sent} bytes for an 8 MiB broadcast"


@pytest.mark.timeout(120)
def test_a_small_broadcast_still_goes_to_every_node_directly(
    pool: sky.ComputePool, ssh_hosts: Hosts
) -> None:
    size = RELAY_MIN_BYTES // 2
    text, blob = payload(size)
    before = sent_by_client(ssh_hosts)
    results = digests(text, blob) @ pool
    sent = sent_by_client(ssh_hosts) - before
    assert [r[:2] for r in results] == [expected(text, blob)] * 4
    assert sent >= 4 * size, f"the client sent {sent} bytes for four copies of {size}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim", [1, 0], ids=["a relaying node", "the first node"])
def test_a_node_lost_mid_relay_fails_the_broadcast_with_worker_lost_and_the_pool_recovers(
    ssh_hosts: Hosts, package_index: PackageIndex, victim: int
) -> None:
    with every_host(ssh_hosts, package_index) as pool:
        lose_a_node_mid_relay(pool, ssh_hosts, victim)


def lose_a_node_mid_relay(pool: sky.ComputePool, ssh_hosts: Hosts, victim: int) -> None:
    size = 24 * 2**20
    text, blob = payload(size)
    replaced = pool.statistics().workers_replaced
    pid = pool.broadcast(os.getpid)[victim]  # the worker's own: calls run on its threads
    outcome: Future[Any] = Future()

    def broadcast() -> None:
        try:
            outcome.set_result(digests(text, blob) @ pool)
        except BaseException as exc:
            outcome.set_exception(exc)

    with slow_uplink(ssh_hosts, mbit=80):  # about 2.5 s for the payload to cross once
        before = sent_by_client(ssh_hosts)
        threading.Thread(target=broadcast, daemon=True).start()
        deadline = time.monotonic() + 30
        while sent_by_client(ssh_hosts) - before < size // 4:  # a quarter of it is across
            assert time.monotonic() < deadline, "the broadcast did not start"
            assert not outcome.done(), f"the broadcast ended early: {outcome}"
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(sky.WorkerLost) as lost:
            outcome.result(timeout=60)
    assert lost.value.node == victim, lost.value

    deadline = time.monotonic() + 60
    while pool.statistics().workers_replaced == replaced or pool.statistics().ready_nodes < 4:
        assert time.monotonic() < deadline, f"node {victim} was not replaced"
        time.sleep(0.1)
    text, blob = payload(4 * 2**20)
    assert [r[:2] for r in digests(text, blob) @ pool] == [expected(text, blob)] * 4


@pytest.mark.timeout(120)
def test_nodes_that_cannot_reach_each_other_get_the_payload_from_the_client(
    ssh_hosts: Hosts, package_index: PackageIndex
) -> None:
    # Host 1 has no route to host 2 (a firewall between nodes, a peer address they do not
    # route): the relay stops there, and the client sends nodes 2 and 3 the payload itself.
    h1, h2 = ssh_hosts.hosts[1], ssh_hosts.hosts[2]
    route = ["ip", "netns", "exec", h1.netns, "ip", "route"]
    subprocess.run([*route, "add", "unreachable", f"{h2.address}/32"], check=True)
    try:
        with every_host(ssh_hosts, package_index) as pool:
            text, blob = payload(8 * 2**20)
            before = sent_by_client(ssh_hosts)
            assert [r[:2] for r in digests(text, blob) @ pool] == [expected(text, blob)] * 4
            # Once to node 0 (which relayed it to node 1), then to nodes 2 and 3.
            assert 2.5 * 8 * 2**20 < sent_by_client(ssh_hosts) - before < 3.5 * 8 * 2**20
            # The pool relays no more: the next large broadcast goes to every node direct.
            text, blob = payload(4 * 2**20)
            before = sent_by_client(ssh_hosts)
            assert [r[:2] for r in digests(text, blob) @ pool] == [expected(text, blob)] * 4
            assert sent_by_client(ssh_hosts) - before >= 4 * 4 * 2**20
    finally:
        subprocess.run([*route, "del", "unreachable", f"{h2.address}/32"], check=True)


@pytest.mark.parametrize(
    ("per_node", "said"),
    [
        (1, "node 3: the payload of this broadcast was being relayed through node 1, "),
        (
            2,
            "node 1 worker 1: the payload of this broadcast was being relayed through "
            "node 0 worker 1, ",
        ),
    ],
)
def test_a_relay_abort_names_workers_by_rank_and_node(per_node: int, said: str) -> None:
    from skyward.worker.relay import Relays

    relays = Relays(3, b"k" * 32, "127.0.0.1", lambda message: None, per_node=per_node)
    relays.abort(b"token", 1, "its link broke")
    with pytest.raises(sky.WorkerLost, match=re.escape(said)):
        relays.take(b"token")
