"""``pool.map``, ``pool.imap`` and ``pool.imap_unordered``: a function over many items, in
chunks, lazily, with a bounded number of chunks in flight.

::

    items ──(read as room frees up)──> chunks of `size` items
        size 1: an ordinary call fn(x); larger: partial(run_chunk, fn) over the chunk
        (skyward.worker.chunks), the function pickled once for the whole map
    at most `window` chunks in flight ──> the pool's scheduler (least busy node; a map's
        calls may wait on a node behind another: ``prefetch``)
    a chunk finishes ──(done-callback, on the reader thread)──> the driver's queue
    the driver (the caller's thread, inside the iterator): reorders (imap, map) or not
        (imap_unordered), refills the window, advances the progress bar

Chunk size. ``chunksize=N`` sends N items per call. ``chunksize=None`` measures: the first
chunk of each slot carries one item, and every batch of results that arrives updates the
time one item costs a slot (the slots times the time since the previous batch, over the
items in it: the round trip and every overhead counted against the items, as throughput
sees them); the next chunks carry as many items as take about ``TARGET_CHUNK_SECONDS``, never so
many that a node gets fewer than ``BALANCE`` chunks of a map whose length is known (so the
last chunks do not leave nodes idle), and never more than ``MAX_CHUNK``.

The window is ``slots x WINDOW_PER_SLOT`` chunks (a slot: one call a node runs at once), so
a node always finds its next chunk queued, and an endless iterable is read only as results
come back. Results are kept only until they are yielded.

Failures: ``imap`` and ``map`` raise the first failure in input order, when the iteration
reaches it (results before it were yielded); ``imap_unordered`` raises a failure when it
arrives. Either way, and when the caller stops iterating (``break``, an exception), the
chunks still queued are cancelled; those already on a worker finish and are dropped.
"""

from __future__ import annotations

import functools
import itertools
import queue
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from skyward.client.compute import PendingCall, pending_call
from skyward.worker.chunks import run_chunk

if TYPE_CHECKING:
    from skyward.console.mapbar import MapBar

R = TypeVar("R")
# How chunks reach the pool: pending calls, and their function pickled already (or None);
# their futures, in order. (The pool's ``_submit``, as a map's calls: ``prefetch``.)
Submit = Callable[[list[PendingCall[Any]], bytes | None], list[Future[Any]]]

TARGET_CHUNK_SECONDS = 0.02  # a chunk's send-to-result time the automatic size aims at
MAX_CHUNK = 4096  # items in one chunk at most, chosen automatically
BALANCE = 4  # chunks per slot at least, for a map of known length (the tail stays balanced)
WINDOW_PER_SLOT = 10  # chunks in flight per slot: the scheduler may queue up to 8 behind one


@dataclass(eq=False)
class _Chunk:
    first: int  # the index of its first item
    items: list[Any]
    sent: float  # time.monotonic() when it was submitted
    future: Future[Any] | None = None


class ChunkSize:
    """The chunk size of one map: fixed, or measured as chunks finish (see the module
    docstring). Used by the driver's thread only.

    The measure is the map's throughput, not a chunk's send-to-result time: that time
    includes the wait behind the other chunks in flight (and, on a loaded machine, for the
    threads to be scheduled), so it overstates an item's cost by the depth of the window and
    would keep chunks at one item exactly where chunking matters most."""

    def __init__(self, fixed: int | None, *, slots: int, total: int | None) -> None:
        self.fixed = fixed
        self._slots = max(1, slots)
        self._cap = MAX_CHUNK
        if total is not None:
            self._cap = max(1, min(MAX_CHUNK, -(-total // (self._slots * BALANCE))))
        self._per_item: float | None = None  # seconds of one slot per item, a moving average
        self._probes = self._slots  # one-item chunks first, one per slot
        self._since: float | None = None  # when the last arrivals were counted

    def next(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if self._per_item is None or self._probes > 0:
            self._probes -= 1
            return 1
        wanted = int(TARGET_CHUNK_SECONDS / max(self._per_item, 1e-7))
        return max(1, min(self._cap, wanted))

    def started(self, now: float) -> None:
        """The first chunks were sent at ``now``."""
        if self._since is None:
            self._since = now

    def finished(self, items: int, now: float) -> None:
        """``items`` results arrived at ``now`` since the last call: every slot worked for
        the time between, so one item cost about ``slots x elapsed / items``."""
        if self.fixed is not None or items <= 0 or self._since is None:
            return
        elapsed, self._since = max(now - self._since, 1e-7), now
        per_item = self._slots * elapsed / items
        self._per_item = (
            per_item if self._per_item is None else 0.5 * self._per_item + 0.5 * per_item
        )


def check_chunksize(chunksize: int | None) -> int | None:
    if chunksize is None:
        return None
    if isinstance(chunksize, bool) or not isinstance(chunksize, int):
        raise TypeError(f"chunksize must be an int or None, not {type(chunksize).__name__}")
    if chunksize < 1:
        raise ValueError(f"chunksize must be at least 1 (or None to choose it), not {chunksize}")
    return chunksize


def results(
    submit: Submit,
    fn: Callable[..., R],
    iterable: Iterable[Any],
    *,
    slots: int,
    chunksize: int | None,
    ordered: bool,
    bar: MapBar | None,
) -> Iterator[R]:
    """The map's results, lazily: in input order when ``ordered``, else as they finish."""
    fixed = check_chunksize(chunksize)
    # A Compute's options (its timeout), and the TypeErrors for what is not a function.
    call = pending_call(fn, (None,), {})
    total = len(iterable) if hasattr(iterable, "__len__") else None  # type: ignore[arg-type]
    size = ChunkSize(fixed, slots=slots, total=total)
    chunked = _Runner(submit, call)
    source = iter(iterable)
    done: queue.SimpleQueue[_Chunk] = queue.SimpleQueue()
    in_flight: dict[int, _Chunk] = {}  # by first index
    finished: dict[int, _Chunk] = {}  # ordered: waiting for an earlier chunk
    window = max(2, slots * WINDOW_PER_SLOT)
    position = 0  # the next item index to read
    expected = 0  # ordered: the first index of the next chunk to yield
    exhausted = False
    try:
        while True:
            # Fill the window, one submission for every chunk that fits.
            batch: list[_Chunk] = []
            # Chunks waiting to be yielded in order count against the window too: a slow
            # chunk holds back what is read, not only what is sent.
            while not exhausted and len(in_flight) + len(finished) + len(batch) < window:
                items = list(itertools.islice(source, size.next()))
                if not items:
                    exhausted = True
                    break
                batch.append(_Chunk(position, items, 0.0))
                position += len(items)
            if batch:
                size.started(time.monotonic())
                chunked.submit(batch, done)
                for chunk in batch:
                    in_flight[chunk.first] = chunk
            if not in_flight:
                return
            # Everything that finished meanwhile, at least one.
            arrived = [done.get()]
            while True:
                try:
                    arrived.append(done.get_nowait())
                except queue.Empty:
                    break
            size.finished(sum(len(c.items) for c in arrived), time.monotonic())
            for chunk in arrived:
                del in_flight[chunk.first]
                if ordered:
                    finished[chunk.first] = chunk
                else:
                    yield from _values(chunk, bar)
            while ordered and expected in finished:
                chunk = finished.pop(expected)
                expected += len(chunk.items)
                yield from _values(chunk, bar)
    finally:
        for chunk in in_flight.values():
            if chunk.future is not None:
                chunk.future.cancel()
        if bar is not None:
            bar.close()


def _values(chunk: _Chunk, bar: MapBar | None) -> Iterator[Any]:
    assert chunk.future is not None
    value = chunk.future.result()  # settled: raises the chunk's failure as itself
    values = value if len(chunk.items) > 1 else [value]
    if bar is not None:
        bar.advance(len(chunk.items))
    chunk.items = []  # yielded: not kept
    yield from values


def _arrived(done: queue.SimpleQueue[_Chunk], chunk: _Chunk, _: Future[Any]) -> None:
    done.put(chunk)


class _Runner:
    """Sends a map's chunks: a one-item chunk as the call itself, larger ones through
    ``run_chunk`` with the function pickled once for the map."""

    def __init__(self, submit: Submit, call: PendingCall[Any]) -> None:
        self._submit = submit
        self._call = call
        self._chunked: PendingCall[Any] | None = None
        self._function: bytes | None = None  # partial(run_chunk, fn), pickled once

    def submit(self, chunks: list[_Chunk], done: queue.SimpleQueue[_Chunk]) -> None:
        single = [c for c in chunks if len(c.items) == 1]
        many = [c for c in chunks if len(c.items) > 1]
        if single:
            calls = [self._one(c.items[0]) for c in single]
            self._send(single, calls, None, done)
        if many:
            if self._chunked is None:
                runner = functools.partial(run_chunk, self._call.fn)
                self._chunked = PendingCall(
                    runner, (), {}, timeout=self._call.timeout, name=self._call.name
                )
                self._function = self._chunked.serialize_function()
            calls = [self._many(c.items) for c in many]
            self._send(many, calls, self._function, done)

    def _one(self, item: Any) -> PendingCall[Any]:
        c = self._call
        return PendingCall(c.fn, (item,), {}, timeout=c.timeout, name=c.name)

    def _many(self, items: list[Any]) -> PendingCall[Any]:
        assert self._chunked is not None
        c = self._chunked
        return PendingCall(c.fn, (items,), {}, timeout=c.timeout, name=c.name)

    def _send(
        self,
        chunks: list[_Chunk],
        calls: list[PendingCall[Any]],
        function: bytes | None,
        done: queue.SimpleQueue[_Chunk],
    ) -> None:
        now = time.monotonic()
        futures = self._submit(calls, function)
        for chunk, future in zip(chunks, futures, strict=True):
            chunk.sent, chunk.future = now, future
            # On the thread that settles it (a reader): only a put, which never waits.
            future.add_done_callback(functools.partial(_arrived, done, chunk))
