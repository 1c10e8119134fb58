"""Streaming calls, the client's end: a generator function's values as they are produced,
and iterator arguments sent element by element.

::

    for x in fib(10) >> pool:        fib is a generator function: >> returns a ResultStream
    total(iter(rows)) >> pool        an iterator argument: rows go one by one, on demand

    worker                       channel (reader thread)          user's thread
    Yield(id) + value  ───────>  Streams.on_yield ─> buffer ───>  next(stream)
                       <───────  More(id, n)  <──────────────────  every window/2 values taken
    Result(id)         ───────>  the call's future ends the stream: StopIteration or its error
                       <───────  Cancel(id)   <──────────────────  the stream closed or dropped
    Want(id, arg, n)   ───────>  Streams.on_want ─> a feeder thread pulls n items
                       <───────  Item(id, arg) + element ... ItemsEnd(id, arg, ok)

Back-pressure both ways is by credit: a worker has at most ``WINDOW`` values in flight
beyond what the consumer took, and asks for at most ``WINDOW`` elements beyond what the
function took. The user-facing ``ResultStream`` is referenced by nothing of the pool's, so
dropping it (leaving a ``for`` loop early) cancels the call; the pool and the channel hold
only the ``Streams`` state.
"""

from __future__ import annotations

import collections
import functools
import inspect
import threading
import typing
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Protocol

from skyward._errors import PoolClosed, RemoteError, SerializationError
from skyward.client.compute import PendingCall
from skyward.client.futures import Sleepers
from skyward.client.interrupts import hold_interrupts
from skyward.link import protocol as proto

WINDOW = proto.STREAM_WINDOW


class StreamChannel(Protocol):
    """A worker's channel (``skyward.link.channel.Channel``), as a stream uses it."""

    def send(self, message: object, payload: proto.Parts | None = None) -> None: ...


Send = Callable[[object, "proto.Parts | None"], None]


class Streams:
    """The client's state of one streaming call, shared by the channel's reader thread (which
    feeds it), the consumer's thread and the feeders. Thread-safe.

    ``future`` is the call's own future: it completes when the worker ends the call, or
    when a timeout, a loss or a close ends it for the worker.
    """

    def __init__(
        self, future: Future[Any], name: str, window: int, inputs: list[Iterator[Any]]
    ) -> None:
        self.future = future
        self.name = name
        self.window = window
        self.inputs = len(inputs)
        self._cond = threading.Lock()  # guards: everything below
        self._waiting = Sleepers()  # the consumer, waiting for a value (see next)
        self._values: collections.deque[proto.Parts] = collections.deque()
        self._error: BaseException | None = None  # ends the stream before the call does
        self._send: Send | None = None
        self._channel: StreamChannel | None = None
        self._call_id = 0
        self._taken = 0  # values taken since the last More
        self._feeders = [_Feeder(self, arg, it) for arg, it in enumerate(inputs)]
        future.add_done_callback(self._ended)

    # ── the channel's side ───────────────────────────────────────────────────────────────

    def call(self, channel: StreamChannel, call_id: int) -> proto.Call:
        """The call is being handed to ``channel``'s worker: its ``Call`` message. From now
        on the channel's frames for it come here (``route``)."""
        with _routes_lock:
            _routes.setdefault(channel, {})[call_id] = self
        with self._cond:
            self._send, self._call_id, self._channel = channel.send, call_id, channel
            abandoned = self._error is not None
        if abandoned:  # closed while it was queued, and the pool sent it anyway (the worker
            channel.send(proto.Cancel(call_id), None)  # takes a Cancel ahead of its Call)
        return proto.Call(call_id, self.name, self.window, self.inputs)

    def on_yield(self, parts: proto.Parts) -> None:
        with self._cond:
            if self._error is None:
                self._values.append(parts)
        self._waiting.wake_all()

    def on_want(self, arg: int, count: int) -> None:
        if 0 <= arg < len(self._feeders):
            self._feeders[arg].want(count)

    def _ended(self, _: Future[Any]) -> None:
        with self._cond:
            channel = self._channel
        self._waiting.wake_all()
        for feeder in self._feeders:
            feeder.stop()
        if channel is not None:
            with _routes_lock:
                _routes.get(channel, {}).pop(self._call_id, None)

    # ── the consumer's side ──────────────────────────────────────────────────────────────

    def next(self) -> Any:
        """The next value. Ctrl-C (the consumer on the main thread) lands only in the wait
        for it; one that comes as a value is taken leaves the value for the next call (see
        ``skyward.client.interrupts``)."""
        parts: proto.Parts | None = None
        given = False
        try:
            with hold_interrupts:
                parts = self._take()
                with self._cond:
                    self._taken += 1
                    grant = 0
                    if self._taken >= max(1, self.window // 2) and self._send is not None:
                        grant, self._taken = self._taken, 0
                    send, call_id = self._send, self._call_id
                if grant and send is not None and not self.future.done():
                    send(proto.More(call_id, grant), None)
                given = True  # from here on the value (or its error) is the consumer's
                value = _load(parts)
            return value
        except KeyboardInterrupt:
            if parts is not None and given:
                with self._cond:
                    if self._error is None:
                        self._values.appendleft(parts)
            raise

    def _take(self) -> proto.Parts:
        """Wait for the next value and take it; raise where the stream ends. Interrupts held
        (``next``): a Ctrl-C lands only in the sleep."""
        while True:
            with self._cond:
                if self._error is not None:
                    raise self._error
                if self._values:
                    return self._values.popleft()
                if self.future.done():  # the call ended and every value was taken
                    if self.future.cancelled():
                        error: BaseException | None = PoolClosed("the call was cancelled")
                    else:
                        error = self.future.exception()
                    if error is not None:
                        self._error = error
                        raise error
                    raise StopIteration
                waiter = self._waiting.sleeper()
            self._waiting.sleep(waiter)

    def abandon(self, error: BaseException) -> None:
        """Stop the call: the consumer is gone (``close``) or the pool is closing. Values not
        yet taken are dropped; ``next`` raises ``error`` from now on."""
        with hold_interrupts, self._cond:
            if self._error is not None or self.future.done():
                return
            self._error = error
            self._values.clear()
            send, call_id = self._send, self._call_id
        self._waiting.wake_all()
        for feeder in self._feeders:
            feeder.stop()
        if send is not None:
            send(proto.Cancel(call_id), None)
        else:
            self.future.cancel()  # still queued in the pool: it never runs


class ResultStream(Iterator[Any]):
    """What ``gen(x) >> pool`` returns: the generator's values, as the worker yields them.

    A failure raises where the next value would have come. ``close()``, or dropping the
    stream (a ``for`` loop left early), cancels the call: the worker's generator is closed
    at its next ``yield`` (its ``finally`` blocks run). Closing the pool ends every open
    stream with ``PoolClosed``.
    """

    def __init__(self, streams: Streams, name: str) -> None:
        self._streams = streams
        self.name = name

    def __iter__(self) -> ResultStream:
        return self

    def __next__(self) -> Any:
        return self._streams.next()

    def close(self) -> None:
        self._streams.abandon(PoolClosed(f"the stream of {self.name} was closed"))

    def __enter__(self) -> ResultStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass  # at interpreter exit the channel may be half gone; the pool ends the call

    def __repr__(self) -> str:
        return f"<ResultStream of {self.name}>"


class _Feeder:
    """Pulls one iterator argument on the client as the worker asks, on a thread of its own
    (the user's iterator may be slow; the channel's reader thread must never wait on it)."""

    def __init__(self, streams: Streams, arg: int, iterator: Iterator[Any]) -> None:
        self._streams = streams
        self._arg = arg
        self._iterator = iterator
        self._cond = threading.Condition()  # guards: _wanted, _stopped, _thread
        self._wanted = 0
        self._stopped = False
        self._thread: threading.Thread | None = None

    def want(self, count: int) -> None:
        with self._cond:
            self._wanted += count
            self._cond.notify_all()
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._feed, name=f"skyward-feeder-{self._arg}", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _feed(self) -> None:
        streams, arg = self._streams, self._arg
        send, call_id = streams._send, streams._call_id
        assert send is not None
        while True:
            with self._cond:
                while not self._wanted and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                self._wanted -= 1
            try:
                value = next(self._iterator)
            except StopIteration:
                send(proto.ItemsEnd(call_id, arg, True), None)
                return
            except BaseException as exc:  # raised in the function, where it iterates
                send(proto.ItemsEnd(call_id, arg, False), proto.encode_error(exc))
                return
            try:
                parts = proto.dumps(value)
            except Exception as exc:
                error = SerializationError(
                    f"an element of streamed argument #{arg} ({type(value).__name__}) cannot "
                    f"be pickled: {type(exc).__name__}: {exc}"
                )
                send(proto.ItemsEnd(call_id, arg, False), proto.encode_error(error))
                return
            send(proto.Item(call_id, arg), parts)


# Each channel's streaming calls, by call id, while they run: where its reader thread sends
# their Yield and Want frames. Weak: a channel that is gone takes its entries along.
_routes: weakref.WeakKeyDictionary[StreamChannel, dict[int, Streams]] = weakref.WeakKeyDictionary()
_routes_lock = threading.Lock()  # guards: _routes


def route(channel: StreamChannel, message: proto.Yield | proto.Want, parts: proto.Parts) -> None:
    """A streaming call's value or demand, from ``channel``'s worker (on the thread reading
    that link), to the call's state."""
    with _routes_lock:
        streams = _routes.get(channel, {}).get(message.call_id)
    if streams is None:
        return  # the call ended already (cancelled): a value in flight
    if isinstance(message, proto.Yield):
        streams.on_yield(parts)
    elif isinstance(message, proto.Want):
        streams.on_want(message.arg, message.count)


def is_streaming(call: PendingCall[Any]) -> bool:
    """Whether ``call`` streams: a generator function, an iterator argument, or an iterable
    one for a parameter annotated ``Iterator`` (skyward 0.5 streamed those)."""
    return _streams(call, *_shape(call.fn))


def _streams(call: PendingCall[Any], generator: bool, streamed: frozenset[str]) -> bool:
    """``is_streaming``, given ``call.fn``'s shape (``_shape``)."""
    if generator:
        return True
    if not streamed:  # the common case, kept cheap: map sends thousands of calls
        if not call.args and not call.kwargs:
            return False
        return any(isinstance(v, Iterator) for v in (*call.args, *call.kwargs.values()))
    names = _positional_names(call.fn, len(call.args))
    return any(
        _streamed(value, name, streamed)
        for value, name in (*zip(call.args, names, strict=True), *call.kwargs.items())
    )


def outgoing(
    call: PendingCall[Any], future: Future[Any]
) -> tuple[PendingCall[Any], Streams | None]:
    """The call as it is sent (iterator arguments replaced by placeholders) and its streaming
    state, or ``(call, None)`` for an ordinary call."""
    generator, streamed = shape = _shape(call.fn)
    if not (generator or streamed or call.args or call.kwargs):
        return call, None  # a call without arguments of a plain function: said at once
    if not _streams(call, *shape):
        return call, None
    inputs: list[Iterator[Any]] = []

    def placeholder(value: Any, name: str | None) -> Any:
        if _streamed(value, name, streamed):
            inputs.append(iter(value))
            return proto.InputStream(len(inputs) - 1)
        return value

    names = _positional_names(call.fn, len(call.args))
    args = tuple(placeholder(v, n) for v, n in zip(call.args, names, strict=True))
    kwargs = {k: placeholder(v, k) for k, v in call.kwargs.items()}
    window = WINDOW if generator else 0
    return replace(call, args=args, kwargs=kwargs), Streams(future, call.name, window, inputs)


def _load(parts: proto.Parts) -> Any:
    """A streamed value, unpickled; one that cannot be is a ``RemoteError`` in its place."""
    try:
        return proto.loads(parts)
    except KeyboardInterrupt:
        raise  # a Ctrl-C while unpickling is the user's, not the value's
    except BaseException as exc:  # even a SystemExit from a value's __reduce__
        raise RemoteError(
            type(exc).__name__, f"cannot unpickle a streamed value on the client: {exc}", ""
        ) from exc


def _streamed(value: Any, name: str | None, streamed: frozenset[str]) -> bool:
    return isinstance(value, Iterator) or (name in streamed and isinstance(value, Iterable))


def _shape(fn: Callable[..., Any]) -> tuple[bool, frozenset[str]]:
    """Whether ``fn`` is a generator function, and its ``Iterator``-annotated parameters;
    looked up once per function."""
    try:
        return _shapes(fn)
    except TypeError:  # an unhashable callable
        return _uncached_shape(fn)


def _uncached_shape(fn: Callable[..., Any]) -> tuple[bool, frozenset[str]]:
    return is_generator_function(fn), frozenset(_streamed_parameters(fn))


_shapes = functools.lru_cache(maxsize=256)(_uncached_shape)


def is_generator_function(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` makes a generator: its values then stream. Wrappers made with
    ``functools.wraps`` count when what they wrap is one (``@sky.stdout`` keeps it so)."""
    return inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(inspect.unwrap(fn))


def _streamed_parameters(fn: Callable[..., Any]) -> set[str]:
    """Parameters annotated ``Iterator[...]``: skyward 0.5 streamed whatever they were given,
    lists included."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return set()
    return {
        name
        for name, hint in hints.items()
        if typing.get_origin(hint) in (Iterator, typing.Iterator) or hint in (Iterator,)
    }


def _positional_names(fn: Callable[..., Any], count: int) -> list[str | None]:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [None] * count
    names: list[str | None] = []
    for parameter in parameters:
        if parameter.kind is parameter.VAR_POSITIONAL:
            names.extend([None] * (count - len(names)))
            break
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            names.append(parameter.name)
    return (names + [None] * count)[:count]
