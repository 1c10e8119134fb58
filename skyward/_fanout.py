"""The client's side of relayed broadcasts: when a broadcast crosses the client's link once.

::

    f(big) @ pool      a remote pool, >= 2 ready nodes, a payload of RELAY_MIN_BYTES or more
                       → every node but the first gets Call(relay inbound), no payload
                       → the first gets Call(relay chain = the others) with the payload, and
                         forwards it as it arrives (skyward._relay, on the workers)
    a node is lost     → the nodes after it in the chain get RelayAbort: their calls fail
                         with WorkerLost (the broadcast fails, as when a node is lost today)
                         instead of waiting for a payload that will not come
    a node cannot      → RelayFailed from the node before it: the client sends that node and
    be reached           the ones after it the payload itself (RelayPayload), and the pool
                         stops relaying: its nodes cannot all reach each other

Local pools never relay: their workers get no relay port (every node is one pipe away,
and the client's link is not a bottleneck). Small payloads go direct: a relay adds a hop's
latency, and the client's link only matters for large ones.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

from skyward import _protocol as proto
from skyward._channel import Channel
from skyward._futures import LOSS_GRACE
from skyward._relay import Relay, RelayAbort, RelayFailed, RelayPayload

# Payloads from this size are relayed: below it a broadcast costs little on any link, and
# a relay's extra hop (a TCP connection per node) would be most of it.
RELAY_MIN_BYTES = 1 << 20


class Fanout:
    """Relays in flight, by token. Called with the scheduler's lock (``lock``) held."""

    def __init__(self, lock: AbstractContextManager[Any], min_bytes: int = RELAY_MIN_BYTES) -> None:
        self._lock = lock
        self._min_bytes = min_bytes
        # token -> the channels, in chain order, and the payload (kept for RelayFailed)
        self._active: dict[bytes, tuple[list[Channel], proto.Parts]] = {}
        self.unreachable = ""  # why the nodes cannot all reach each other, once seen

    def worth_it(self, payload: proto.Parts, channels: Sequence[Channel | None]) -> bool:
        """Whether a broadcast of ``payload`` to these nodes' channels is relayed."""
        return (
            not self.unreachable
            and len(channels) >= 2
            and all(c is not None and c.relay_port is not None for c in channels)
            and proto.size(payload) >= self._min_bytes
        )

    @staticmethod
    def token() -> bytes:
        return secrets.token_bytes(16)

    @staticmethod
    def chain(token: bytes, receivers: Sequence[tuple[int, str, Channel]]) -> Relay | None:
        """The first node's relay towards ``receivers`` (rank, address, channel), in order;
        None if no other node took its call (the first then simply gets a direct call)."""
        if not receivers:
            return None
        chain = tuple((rank, address, c.relay_port or 0) for rank, address, c in receivers)
        return Relay(token, chain=chain)

    def started(
        self, token: bytes, channels: list[Channel], payload: proto.Parts, futures: list[Any]
    ) -> None:
        """Remember the relay until every part of the broadcast has finished."""
        self._active[token] = (channels, payload)
        left = [len(futures)]

        def done(_: Future[Any]) -> None:
            with self._lock:
                left[0] -= 1
                if left[0] == 0:
                    self._active.pop(token, None)

        for future in futures:
            future.add_done_callback(done)

    def lost(self, channel: Channel, why: str) -> None:
        """``channel``'s worker is gone: the nodes after it in a relay get nothing from it."""
        for token, (channels, _) in list(self._active.items()):
            if channel in channels:
                for later in channels[channels.index(channel) + 1 :]:
                    later.send(RelayAbort(token, channel.node, why))

    def failed(self, report: RelayFailed) -> None:
        """A node could not relay to the next one: send the payload directly to that node
        and the ones after it. If it could not reach it at all, relay nothing more in this
        pool (its nodes cannot all reach each other). If the connection broke mid-way, the
        next node most likely died, and its own link says so in a moment (then its loss
        fails the broadcast, and sending it the payload over the client's link would only
        hold up what comes next): wait that moment first."""
        if not report.connected:
            self.unreachable = self.unreachable or report.reason
            self._deliver(report)
            return
        timer = threading.Timer(LOSS_GRACE, self._deliver_locked, (report,))
        timer.daemon = True
        timer.start()

    def _deliver_locked(self, report: RelayFailed) -> None:
        with self._lock:
            self._deliver(report)

    def _deliver(self, report: RelayFailed) -> None:
        channels, payload = self._active.get(report.token, ([], []))
        nodes = [c.node for c in channels]
        if report.node not in nodes:
            return  # the broadcast has finished
        rest = channels[nodes.index(report.node) :]
        if rest[0].broken:
            return  # lost: the nodes after it were told (lost()), and the broadcast fails
        for channel in rest:
            if not channel.broken:
                channel.send(RelayPayload(report.token), payload)
