"""Relayed payloads, the worker's side: a large broadcast crosses the client's link once.

::

    client ══SSH══> node a ──TCP──> node b ──TCP──> node c ...
            Call + payload, relay chain [b, c]        (b and c get their Call from the
                          a forwards as it reads       client, without the payload)

The client sends the payload to one node in its ``Call`` frame and every other node a
``Call`` without it. As that node's reader thread reads the payload off the client's link,
a forwarder thread sends whatever has arrived to the next node's relay port; that node
forwards to the one after as it receives, and so on: the hops overlap, so the last node has
the payload moments after the first, and the client's link carries it once. Every node's
payload lands in buffers of its own, one per part of the frame, so numpy arrays are
unpickled without a copy, as from a frame.

The relay port is plain TCP on the pool's own network (like jax's collectives); a peer
presents the pool's secret (``Start.relay_key``) before anything else, or is dropped. After
a header (token, part lengths, the rest of the chain, who sends), the bytes come in chunks
of ``!q`` length + data; a negative length is followed by a pickled ``WorkerLost`` instead:
a node before the sender was lost, and the sender passes that on before it stops. A node
whose upstream stops mid-payload (the connection ends early), or that the client tells a
node before it was lost (``RelayAbort``), fails its call with ``WorkerLost`` naming the
lost node. A node that cannot reach the next one says so to the client (``RelayFailed``),
which sends the payload itself to the rest of the chain (``RelayPayload``). Standard
library only (and ``_protocol``, ``_errors``): the worker imports it.
"""

from __future__ import annotations

import collections
import hmac
import pickle
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

from skyward._errors import WorkerLost
from skyward._info import worker_label
from skyward.link.protocol import RelayFailed

# Bytes read at a time; each read is published to the forwarder at once.
_CHUNK = 1 << 20
_HEADER = struct.Struct("!I")
_CHUNK_HEAD = struct.Struct("!q")  # bytes of data that follow; negative: an error follows
_MAX_HEADER = 1 << 20
# A peer must present the key and the header within this; a downstream node that takes
# nothing for _SEND_TIMEOUT is gone (its own loss reaches the client over its link).
_HANDSHAKE_TIMEOUT = 10.0
_SEND_TIMEOUT = 60.0
_TOKENS_KEPT = 256  # tokens aborted before their payload was asked for, or taken, remembered

Chain = tuple[tuple[int, str, int], ...]  # (rank, address, port) of the nodes still to reach


class Payload:
    """One relayed payload on this node: its parts as they fill, and who waits for them."""

    def __init__(self) -> None:
        self._cond = threading.Condition()  # guards: everything below
        self.lengths: tuple[int, ...] = ()
        self.parts: list[bytearray] = []
        self.received = 0
        self.total = 0
        self.started = False
        self.complete = False
        self.error: BaseException | None = None
        self._source: socket.socket | None = None  # shut down by fail(), to end its read

    def begin(self, lengths: tuple[int, ...], source: socket.socket | None = None) -> bool:
        """Make the buffers; False if it already began or failed (a stray connection)."""
        with self._cond:
            if self.started or self.error is not None:
                return False
            self.started = True
            self.lengths = tuple(lengths)
            self.parts = [bytearray(n) for n in lengths]
            self.total = sum(lengths)
            self._source = source
            self.complete = self.total == 0
            self._cond.notify_all()
            return True

    def fill(self, readinto: Callable[[memoryview], int | None]) -> None:
        """Read every part from ``readinto`` in order; ``EOFError`` if the stream ends."""
        for part in self.parts:
            view = memoryview(part)
            got = 0
            while got < len(part):
                n = readinto(view[got : got + _CHUNK])
                if not n:
                    raise EOFError(f"the stream ended after {self.received} of {self.total} bytes")
                got += n
                with self._cond:
                    self.received += n
                    self._cond.notify_all()
        with self._cond:
            self.complete = True
            self._cond.notify_all()

    def complete_with(self, parts: list[Any]) -> None:
        """These parts are the payload (from the client, when the relay could not reach
        this node), unless it already arrived; a relayed stream still coming is ended."""
        with self._cond:
            if self.complete:
                return
            self.started = self.complete = True
            self.error = None
            # The same bytes: a forwarder of this node sends the rest from these.
            self.parts = parts
            self.lengths = tuple(memoryview(part).nbytes for part in parts)
            self.total = self.received = sum(self.lengths)
            source, self._source = self._source, None
            self._cond.notify_all()
        if source is not None:
            try:
                source.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def fail(self, error: BaseException) -> None:
        """Unless it is complete: waiters get ``error``, and a read in progress ends."""
        with self._cond:
            if self.complete or self.error is not None:
                return
            self.error = error
            source = self._source
            self._cond.notify_all()
        if source is not None:
            try:
                source.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def wait(self) -> list[bytearray]:
        """The parts once all have arrived; the error if it failed."""
        with self._cond:
            while not self.complete and self.error is None:
                self._cond.wait()
            if self.error is not None:
                raise self.error
            return self.parts

    def progress(self, sent: int) -> int:
        """Bytes received, once more than ``sent`` have been (or all of them)."""
        with self._cond:
            while self.received <= sent and not self.complete and self.error is None:
                self._cond.wait()
            if self.error is not None:
                raise self.error
            return self.received

    def slices(self, start: int, end: int) -> Iterator[memoryview]:
        """Bytes ``start:end`` of the parts laid end to end."""
        offset = 0
        for part in self.parts:
            lo, hi = max(start, offset), min(end, offset + len(part))
            if lo < hi:
                yield memoryview(part)[lo - offset : hi - offset]
            offset += len(part)


class Relays:
    """This worker's relay port and the payloads relayed to it, by token. Thread-safe."""

    def __init__(
        self,
        node: int,
        key: bytes,
        address: str,
        report: Callable[[object], None],
        per_node: int = 1,
    ) -> None:
        self._node = node  # this worker's rank over the pool
        self._per_node = per_node
        self._key = key
        self._report = report  # a message to the client, over this node's own link
        self._lock = threading.Lock()  # guards: _payloads, _aborted, _taken
        self._payloads: dict[bytes, Payload] = {}
        self._aborted: collections.OrderedDict[bytes, WorkerLost] = collections.OrderedDict()
        # Tokens whose payload a call has taken: a late RelayPayload for one is dropped.
        self._taken: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # Only where peers reach this node, when that is an address of this machine.
            self._listener.bind((address, 0))
        except OSError:
            self._listener.bind(("", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="skyward-relay", daemon=True).start()

    def _who(self, rank: int | None = None) -> str:
        """How messages name worker ``rank`` (this one by default), as the client's
        ``Layout.label`` does: ``node 2``, or ``node 2 worker 1`` with several per node."""
        rank = self._node if rank is None else rank
        per = self._per_node
        return worker_label(rank // per, rank % per, per)

    # ── the node that gets the payload from the client ───────────────────────────────────

    def forward_from(
        self, token: bytes, chain: Chain, lengths: tuple[int, ...], readinto: Any
    ) -> list[bytearray]:
        """Read a payload off the client's link into new buffers, forwarding it down
        ``chain`` as it arrives; return the parts."""
        payload = Payload()
        payload.begin(lengths)
        self._start_forwarder(payload, token, chain)
        try:
            payload.fill(readinto)
        except BaseException as exc:
            payload.fail(exc)  # ends the forwarder; the next node sees the stream end
            raise
        return payload.parts

    # ── the nodes it is relayed to ───────────────────────────────────────────────────────

    def take(self, token: bytes) -> list[bytearray]:
        """Wait for the payload of ``token``; ``WorkerLost`` if a node before this one in
        the relay was lost first."""
        payload = self._payload(token)
        try:
            return payload.wait()
        finally:
            with self._lock:
                self._payloads.pop(token, None)
                _remember(self._taken, token, None)

    def deliver(self, token: bytes, parts: list[Any]) -> None:
        """The payload of ``token`` as the client sent it, the relay having failed to
        reach this node."""
        self._payload(token).complete_with(parts)

    def abort(self, token: bytes, node: int, reason: str) -> None:
        error = WorkerLost(
            f"{self._who()}: the payload of this broadcast was being relayed through "
            f"{self._who(node)}, which was lost ({reason})",
            node=node,
        )
        with self._lock:
            payload = self._payloads.get(token)
            if payload is None:  # its Call or its connection has not come yet
                if token not in self._taken:
                    _remember(self._aborted, token, error)
                return
        payload.fail(error)

    def _payload(self, token: bytes) -> Payload:
        with self._lock:
            if token in self._taken:  # its call has run: a late delivery goes nowhere
                gone = Payload()
                gone.fail(EOFError("this payload's call has run"))
                return gone
            payload = self._payloads.get(token)
            if payload is None:
                payload = self._payloads[token] = Payload()
                aborted = self._aborted.pop(token, None)
                if aborted is not None:
                    payload.fail(aborted)
            return payload

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._receive, args=(connection,), name="skyward-relay-in", daemon=True
            ).start()

    def _receive(self, connection: socket.socket) -> None:
        with connection:
            try:
                connection.settimeout(_HANDSHAKE_TIMEOUT)
                if not hmac.compare_digest(_recv_exact(connection, len(self._key)), self._key):
                    return  # not a peer of this pool
                (size,) = _HEADER.unpack(_recv_exact(connection, _HEADER.size))
                if size > _MAX_HEADER:
                    return
                token, lengths, chain, upstream = pickle.loads(_recv_exact(connection, size))
                connection.settimeout(None)  # the client's link may be slow: no bound here
            except (OSError, EOFError, ValueError, pickle.PickleError):
                return
            payload = self._payload(token)
            if not payload.begin(lengths, connection):
                return
            self._start_forwarder(payload, token, chain)
            try:
                payload.fill(_chunks(connection))
            except WorkerLost as lost:  # a node before the sender, as the sender says
                payload.fail(lost)
            except (OSError, EOFError, ValueError, pickle.PickleError) as exc:
                payload.fail(
                    WorkerLost(
                        f"{self._who()}: the payload of this broadcast stopped arriving "
                        f"from {self._who(upstream)}, which relayed it ({exc}): "
                        f"{self._who(upstream)} was lost",
                        node=upstream,
                    )
                )

    def _start_forwarder(self, payload: Payload, token: bytes, chain: Chain) -> None:
        if chain:
            threading.Thread(
                target=self._forward,
                args=(payload, token, chain),
                name="skyward-relay-out",
                daemon=True,
            ).start()

    def _forward(self, payload: Payload, token: bytes, chain: Chain) -> None:
        _, address, port = chain[0]
        header = pickle.dumps((token, payload.lengths, chain[1:], self._node), protocol=5)
        try:
            out = socket.create_connection((address, port), timeout=_HANDSHAKE_TIMEOUT)
            out.settimeout(_SEND_TIMEOUT)
            out.sendall(self._key + _HEADER.pack(len(header)) + header)
        except OSError as exc:
            # The nodes cannot reach each other there (a firewall, an address the pool's
            # machines do not route): the client sends the rest of the chain the payload.
            reason = f"{self._who()} cannot reach {address}:{port}: {exc}"
            self._failed(RelayFailed(token, chain[0][0], reason))
            return
        with out:
            try:
                sent = 0
                while sent < payload.total:
                    received = payload.progress(sent)
                    for view in payload.slices(sent, received):
                        out.sendall(_CHUNK_HEAD.pack(view.nbytes))
                        out.sendall(view)
                    sent = received
            except OSError as exc:
                # The next node is gone (the client hears of that over its own link) or the
                # network between stalled: the client sends the rest of the chain the payload.
                reason = f"{self._who()} to {address}:{port}: broke after {sent} bytes: {exc}"
                self._failed(RelayFailed(token, chain[0][0], reason, connected=True))
                return
            except BaseException as exc:  # this node's own payload failed: say why, downstream
                lost = (
                    exc
                    if isinstance(exc, WorkerLost)
                    else WorkerLost(
                        f"{self._who()} could not relay the payload of this broadcast: "
                        f"{type(exc).__name__}: {exc}",
                        node=self._node,
                    )
                )
                blob = pickle.dumps(lost, protocol=5)
                try:
                    out.sendall(_CHUNK_HEAD.pack(-len(blob)) + blob)
                except OSError:
                    pass

    def _failed(self, report: RelayFailed) -> None:
        try:
            self._report(report)
        except OSError:
            pass  # the client is gone


def _chunks(connection: socket.socket) -> Callable[[memoryview], int]:
    """``readinto`` over the chunked relay stream: data goes into the view; an error chunk
    raises the ``WorkerLost`` it carries."""
    left = 0

    def readinto(view: memoryview) -> int:
        nonlocal left
        while left == 0:
            (left,) = _CHUNK_HEAD.unpack(_recv_exact(connection, _CHUNK_HEAD.size))
            if left < 0:
                error = pickle.loads(_recv_exact(connection, -left))
                raise error if isinstance(error, WorkerLost) else EOFError(repr(error))
        n = connection.recv_into(view[:left])
        left -= n
        return n

    return readinto


def _remember(tokens: collections.OrderedDict[bytes, Any], token: bytes, value: Any) -> None:
    tokens[token] = value
    while len(tokens) > _TOKENS_KEPT:
        tokens.popitem(last=False)


def _recv_exact(connection: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise EOFError("the peer closed the connection")
        data += chunk
    return bytes(data)
