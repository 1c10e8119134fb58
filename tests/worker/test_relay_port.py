"""The worker's relay port on its own: real sockets on loopback, several nodes' ``Relays``
in this process, each as a worker holds it (``skyward.worker.relay``)."""

from __future__ import annotations

import io
import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from skyward._errors import WorkerLost
from skyward.link.protocol import RelayFailed
from skyward.worker.relay import Chain, Relays

KEY = os.urandom(32)


@pytest.fixture
def nodes() -> Iterator[Callable[[int], tuple[list[list[Any]], list[Relays]]]]:
    made: list[Relays] = []
    reports: list[list[Any]] = []

    def make(count: int) -> tuple[list[list[Any]], list[Relays]]:
        for rank in range(count):
            sent: list[Any] = []
            reports.append(sent)
            made.append(Relays(rank, KEY, "127.0.0.1", sent.append))
        return reports, made

    yield make
    for relays in made:
        relays._listener.close()


def chain(relays: list[Relays]) -> Chain:
    return tuple((rank, "127.0.0.1", r.port) for rank, r in enumerate(relays))


def take_later(relays: Relays, token: bytes) -> dict[str, Any]:
    """Take ``token``'s payload on a thread, as a worker's executor would."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["parts"] = relays.take(token)
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out["thread"] = thread
    return out


def test_a_payload_relayed_down_a_chain_arrives_whole_on_every_node(nodes: Any) -> None:
    _, relays = nodes(4)
    parts = [os.urandom(300_000), os.urandom(3_000_000), b""]
    token = os.urandom(16)
    waiting = [take_later(r, token) for r in relays[1:]]
    stream = io.BytesIO(b"".join(parts))
    got = relays[0].forward_from(token, chain(relays)[1:], tuple(map(len, parts)), stream.readinto)
    assert [bytes(p) for p in got] == parts
    for out in waiting:
        out["thread"].join(10)
        assert [bytes(p) for p in out["parts"]] == parts


def test_a_node_that_stops_mid_way_fails_the_nodes_after_it_with_worker_lost_naming_it(
    nodes: Any,
) -> None:
    _, relays = nodes(3)
    token = os.urandom(16)
    waiting = [take_later(r, token) for r in relays[1:]]
    stream = io.BytesIO(os.urandom(1_000_000))  # half of what the frame said would come
    with pytest.raises(EOFError):
        relays[0].forward_from(token, chain(relays)[1:], (2_000_000,), stream.readinto)
    for out in waiting:
        out["thread"].join(10)
        assert isinstance(out["error"], WorkerLost) and out["error"].node == 0, out


def test_a_peer_without_the_pools_secret_is_dropped(nodes: Any) -> None:
    _, [relays] = nodes(1)
    with socket.create_connection(("127.0.0.1", relays.port), timeout=5) as peer:
        peer.sendall(os.urandom(32) + b"anything")
        peer.settimeout(5)
        try:
            answer = peer.recv(1)
        except ConnectionResetError:  # closed with our bytes unread
            answer = b""
        assert answer == b""


def test_the_clients_copy_completes_a_payload_the_relay_could_not_bring(nodes: Any) -> None:
    reports, relays = nodes(2)
    token = os.urandom(16)
    with socket.socket() as closed:  # where node 1 is not: nothing listens there
        closed.bind(("127.0.0.1", 0))
        nowhere = closed.getsockname()[1]
    waiting = take_later(relays[1], token)
    parts = [os.urandom(1000), os.urandom(50_000)]
    stream = io.BytesIO(b"".join(parts))
    relays[0].forward_from(
        token, ((1, "127.0.0.1", nowhere),), tuple(map(len, parts)), stream.readinto
    )
    for _ in range(100):  # the forwarder thread reports to the client
        if reports[0]:
            break
        threading.Event().wait(0.05)
    [report] = reports[0]
    assert isinstance(report, RelayFailed) and report.node == 1 and not report.connected
    relays[1].deliver(token, [bytearray(p) for p in parts])  # what the client then sends
    waiting["thread"].join(10)
    assert [bytes(p) for p in waiting["parts"]] == parts
