"""Running one call on the worker (``run_call``), and streaming calls, the worker's end (see
``skyward.pool.streams`` for the client's, and the picture).

A streaming call has a ``CallIO``: the credit its generator's values may use, and a
``StreamedArgument`` per streamed argument. The worker's reader thread feeds them (``More``,
``Cancel``, ``Item``, ``ItemsEnd``); the executor thread running the call waits on them.
Standard library and ``skyward.link.protocol`` only, like the rest of the worker's start.
"""

from __future__ import annotations

import collections
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

from skyward._errors import SerializationError  # stdlib-only, like the protocol
from skyward.link import protocol as proto
from skyward.link import sources

SendFrame = Callable[[object, "proto.Parts | None"], None]


class StreamCancelled(Exception):
    """The client stopped reading a streaming call (or the pool is closing); raised where
    the function waits on the call's IO, a streamed argument's next element."""


class CallIO:
    """One streaming call's flow control. Thread-safe."""

    def __init__(self, send: SendFrame, message: proto.Call) -> None:
        self._send = send
        self.call_id = message.call_id
        self._cond = threading.Condition()  # guards: _credit, cancelled
        self._credit = message.window
        self.cancelled = False
        self.arguments = [StreamedArgument(self, arg) for arg in range(message.inputs)]

    def more(self, count: int) -> None:
        with self._cond:
            self._credit += count
            self._cond.notify_all()

    def cancel(self) -> None:
        with self._cond:
            self.cancelled = True
            self._cond.notify_all()
        for argument in self.arguments:
            argument.wake()

    def send_value(self, parts: proto.Parts) -> bool:
        """Send one value once the client has room for it; False if it cancelled instead."""
        with self._cond:
            while not self._credit and not self.cancelled:
                self._cond.wait()
            if self.cancelled:
                return False
            self._credit -= 1
        self._send(proto.Yield(self.call_id), parts)
        return True

    def stream(self, values: Iterator[Any], flush: Callable[[], None]) -> None:
        """Send every value of ``values`` (a generator) as the client takes them; close it
        when the client cancels. Its exceptions propagate, to end the call with them."""
        try:
            for value in values:
                try:
                    parts = proto.dumps(value)
                except Exception as exc:
                    raise SerializationError(
                        f"a value it yielded ({type(value).__name__}) cannot be pickled: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                flush()  # what it printed before the yield arrives before the value
                if not self.send_value(parts):
                    return
        finally:
            close = getattr(values, "close", None)
            if close is not None:
                close()  # runs the generator's finally blocks, now rather than at GC


class StreamedArgument(Iterator[Any]):
    """A streamed argument, as the function sees it: asks the client for elements as it is
    iterated, ``STREAM_WINDOW`` ahead at most."""

    def __init__(self, io: CallIO, arg: int) -> None:
        self._io = io
        self._arg = arg
        self._cond = threading.Condition()  # guards: everything below
        self._items: collections.deque[proto.Parts] = collections.deque()
        self._ended = False
        self._error: proto.Parts | None = None
        self._asked = False
        self._taken = 0

    def __iter__(self) -> StreamedArgument:
        return self

    def __next__(self) -> Any:
        ask = 0
        with self._cond:
            if not self._asked:
                self._asked, ask = True, proto.STREAM_WINDOW
        if ask:
            self._io._send(proto.Want(self._io.call_id, self._arg, ask), None)
        with self._cond:
            while not self._items and not self._ended and not self._io.cancelled:
                self._cond.wait()
            if self._io.cancelled:
                raise StreamCancelled
            if not self._items:
                if self._error is not None:
                    raise decoded(self._error)
                raise StopIteration
            parts = self._items.popleft()
            self._taken += 1
            grant = 0
            if self._taken >= max(1, proto.STREAM_WINDOW // 2) and not self._ended:
                grant, self._taken = self._taken, 0
        if grant:
            self._io._send(proto.Want(self._io.call_id, self._arg, grant), None)
        return proto.loads(parts)

    def put(self, parts: proto.Parts) -> None:
        with self._cond:
            self._items.append(parts)
            self._cond.notify_all()

    def end(self, error: proto.Parts | None) -> None:
        with self._cond:
            self._ended, self._error = True, error
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


def decoded(parts: proto.Parts) -> BaseException:
    """An exception the client sent (a streamed argument's iterator raised it, a shared
    collection refused an operation), as itself when it unpickles here."""
    info: proto.ErrorInfo = proto.loads(parts)
    if info.blob is not None:
        try:
            error = proto.loads([info.blob])
            if isinstance(error, BaseException):
                return error
        except Exception:
            pass
    return RuntimeError(f"the client raised {info.type_name}: {info.message}")


def with_arguments(value: Any, io: CallIO | None) -> Any:
    """``value`` with an ``InputStream`` placeholder replaced by its streamed argument."""
    if io is not None and isinstance(value, proto.InputStream):
        return io.arguments[value.arg]
    return value


def feed_streaming_call(calls: dict[int, CallIO], message: object, parts: proto.Parts) -> bool:
    """Hand a streaming frame to its call (the reader thread); False if it is none."""
    if isinstance(message, proto.More):
        if (io := calls.get(message.call_id)) is not None:
            io.more(message.count)
    elif isinstance(message, proto.Cancel):
        if (io := calls.get(message.call_id)) is not None:
            io.cancel()
    elif isinstance(message, proto.Item | proto.ItemsEnd):
        io = calls.get(message.call_id)
        if io is not None and 0 <= message.arg < len(io.arguments):
            argument = io.arguments[message.arg]
            if isinstance(message, proto.Item):
                argument.put(parts)
            else:
                argument.end(None if message.ok else parts)
    else:
        return False
    return True


# Functions by their pickled bytes: ``map`` sends the same bytes with every item, and a
# function defined in ``__main__`` travels by value, which costs more to unpickle than a no-op
# costs to run. Equal bytes mean an equal function, globals it captured included; a function
# whose captured globals changed on the client pickles differently and is a new entry.
# Unpickling one also gives its code objects their file names back and puts its source lines
# in linecache for tracebacks (skyward.link.sources), so that happens once per function.
_FUNCTIONS: dict[bytes, Any] = {}
_FUNCTIONS_MAX = 64
# Larger ones (big closures) are not worth keeping; the source lines a pickle may carry count
# on top, like the client's bound (skyward.link.pickling).
_FUNCTION_CACHE_BYTES = (1 << 16) + sources.BUDGET
_FUNCTIONS_LOCK = threading.Lock()  # guards: inserting into and evicting from _FUNCTIONS


def _function(data: bytes) -> Any:
    if len(data) > _FUNCTION_CACHE_BYTES:
        return proto.loads([data])  # not cached, so not worth hashing either
    fn = _FUNCTIONS.get(data)
    if fn is None:
        fn = proto.loads([data])
        with _FUNCTIONS_LOCK:
            if len(_FUNCTIONS) >= _FUNCTIONS_MAX:
                del _FUNCTIONS[next(iter(_FUNCTIONS))]  # the oldest
            _FUNCTIONS[data] = fn
    return fn


# Plugins whose ``decorate`` wraps every call's function, in list order; set at Start.
decorating: list[Any] = []


def run_call(
    message: proto.Call, parts: proto.Parts, io: CallIO | None, flush: Callable[[], None]
) -> tuple[bool, proto.Parts]:
    """Run one call; its result frame's ``ok`` and payload. A streaming call (``io``) gets
    its streamed arguments in place of the placeholders, and a generator's values go out as
    it runs."""
    try:
        function, args, kwargs = proto.loads(parts)
        fn = _FUNCTIONS.get(function)  # _function's first step, written out: every call
        if fn is None:
            fn = _function(function)
        if decorating:
            from skyward._plugin import decorated

            fn = decorated(fn, decorating)
        if io is not None:
            args = tuple(with_arguments(a, io) for a in args)
            kwargs = {k: with_arguments(v, io) for k, v in kwargs.items()}
    except BaseException as exc:
        # Not the function's own error: say so, or it reads as one (a ValueError from a
        # class's __setstate__, a module the worker lacks).
        error = SerializationError(
            f"the function or arguments of {message.name} could not be rebuilt on the "
            f"worker: {type(exc).__name__}: {_describe(exc)}"
        )
        error.__cause__ = exc
        return False, proto.encode_error(error)
    try:
        value = fn(*args, **kwargs)
        if io is not None and message.window:
            io.stream(value, flush)
            value = None
    except BaseException as exc:
        return False, proto.encode_error(exc)
    try:
        return True, proto.dumps(value)
    except Exception as exc:
        hint = ""
        if inspect.isgenerator(value):
            hint = " (a generator's values stream only when the function itself is one)"
        error = SerializationError(
            f"the return value of {message.name} ({type(value).__name__}) cannot be pickled: "
            f"{type(exc).__name__}: {exc}{hint}"
        )
        return False, proto.encode_error(error)


def _describe(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException:
        return "<str() raised>"
