"""The wire between the client and a worker: messages and framing. Imported by both sides.

A frame is ``!I`` part count, ``!Q`` length of each part, then the parts::

    [n][len0 .. lenN-1][control][payload main][payload buffer 1] ...

Part 0 is a small message (a dataclass below): a plain pickle, except the two that every call
sends, a ``Call`` that neither streams nor relays and a ``Result``, which are packed (a tag
byte and their fields: ``_pack``), several times cheaper both ways. A pickle starts with
its protocol byte (0x80), so the first byte tells them apart. The optional payload is user data
pickled once with cloudpickle protocol 5: its out-of-band buffers (numpy arrays and the like)
are separate parts, written with ``writev`` straight from the array's memory and read into
buffers that the unpickled arrays then own, so large arrays are never copied into a bigger
bytes object. A broadcast pickles its payload once and writes the same parts to every worker.

This module needs only the standard library (and ``_errors``) until a payload is
(de)serialized, so a worker can say ``Hello`` before importing anything else: a Python
mismatch is reported, not a crash.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from skyward._errors import RemoteError, RemoteTraceback  # stdlib-only too

Part = bytes | bytearray | memoryview
Parts = list[Part]

_COUNT = struct.Struct("!I")
_MAX_PARTS = 1 << 16

# Values (or elements) one side of a streaming call may send beyond what the other side has
# taken. A count, not bytes: a stream's values tend to be alike, and "8 arrays in flight" is
# a bound a user can see coming.
STREAM_WINDOW = 8


# ── messages, client → worker ────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Start:
    """Everything a worker needs before its first call; payload: the plugins, in order.

    ``relay_key``: when not empty, the worker listens for relayed payloads from its peers
    (``skyward.worker.relay``), which present this pool's secret first; its port is in ``Ready``.
    """

    info: Any  # InstanceInfo; typed loosely so this module stays import-light
    sys_path: list[str]
    concurrency: int
    # or "process": calls run in child processes (skyward.worker.processes)
    executor: str = "thread"
    relay_key: bytes = b""
    # What this worker samples and sends as ``Sample`` frames (sky.metrics, as plain
    # (name, kind, interval, arg) tuples); empty: nothing. Only a node's first worker.
    metrics: tuple[tuple[str, str, float, str], ...] = ()


@dataclass(frozen=True)
class Call:
    """Run a function; payload: ``(fn, args, kwargs)``, or none when ``relay.inbound``.

    ``window`` > 0: the function is a generator; send its values as ``Yield`` frames, at
    most ``window`` ahead of what the client has taken (``More`` grants more). ``inputs``:
    how many arguments are ``InputStream`` placeholders, fed by ``Item`` frames on demand.
    """

    call_id: int
    name: str
    window: int = 0
    inputs: int = 0
    relay: Relay | None = None  # part of a relayed broadcast (skyward.worker.relay)


@dataclass(frozen=True)
class More:
    """The client took ``count`` values of a streaming call: the worker may send as many."""

    call_id: int
    count: int


@dataclass(frozen=True)
class Cancel:
    """The client stopped reading a streaming call: close the generator, end the call."""

    call_id: int


@dataclass(frozen=True)
class Item:
    """The next element of a streamed argument; payload: the element."""

    call_id: int
    arg: int


@dataclass(frozen=True)
class ItemsEnd:
    """A streamed argument has no more elements; if not ``ok``, payload: the encoded error
    its iterator raised on the client, raised where the function iterates it."""

    call_id: int
    arg: int
    ok: bool


@dataclass(frozen=True)
class SharedReply:
    """The answer to ``Shared``; payload: the value if ``ok``, else the encoded error."""

    request_id: int
    ok: bool


@dataclass(frozen=True)
class InputStream:
    """Stands in, inside a call's arguments, for an iterator the client streams: the
    worker puts an iterator over ``Item`` frames in its place."""

    arg: int


@dataclass(frozen=True)
class Shutdown:
    """Leave the plugins' contexts in reverse and exit, after the queued calls.

    ``cancel``: drop queued calls and interrupt the running one (or a slow ``around_app``
    entry) with ``KeyboardInterrupt``, as Ctrl-C would; used when the client leaves on an
    error. ``replaced``: the pool is about to kill this worker and start another in its
    place (a gang restart), so what a plugin keeps for the node's workers (the MPS daemon)
    must outlive it rather than be stopped by it.
    """

    cancel: bool = False
    replaced: bool = False


@dataclass(frozen=True)
class StacksRequest:
    """Report every thread's Python stack now; answered by the worker's reader thread, so
    it works while calls run (or hang)."""

    request_id: int


# ── messages, worker → client ────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Hello:
    python: tuple[int, int, int]
    pid: int
    hostname: str
    head_port: int | None  # a free port, offered by node 0 only


@dataclass(frozen=True)
class Ready:
    """Every plugin's ``around_app`` has been entered; calls may come. ``relay_port``: where
    peers send this worker relayed payloads (when ``Start.relay_key`` asked for it)."""

    relay_port: int | None = None


@dataclass(frozen=True)
class StartFailed:
    """A plugin's ``around_app`` raised; payload: the encoded error."""


@dataclass(frozen=True)
class Result:
    """A call ended; payload: the value if ``ok``, else the encoded error."""

    call_id: int
    ok: bool


# (file, line number, function, source line)
Frame = tuple[str, int, str, str]


@dataclass(frozen=True)
class StacksReport:
    """Every thread's stack (name, frames outermost first) and the process's CPU seconds."""

    request_id: int
    threads: tuple[tuple[str, tuple[Frame, ...]], ...]
    cpu_seconds: float


@dataclass(frozen=True)
class Shared:
    """An operation on a distributed collection (``skyward.collections``); payload: its arguments.
    The client answers with ``SharedReply``, at once or when the operation can proceed."""

    request_id: int
    kind: str  # "dict", "set", "counter", "queue", "barrier", "lock"
    name: str
    op: str


@dataclass(frozen=True)
class Yield:
    """One value of a streaming call, in order; payload: the value. ``Result`` ends it."""

    call_id: int


@dataclass(frozen=True)
class Want:
    """The function may take ``count`` more elements of streamed argument ``arg``."""

    call_id: int
    arg: int
    count: int


@dataclass(frozen=True)
class Log:
    """Bytes the user's code wrote to stdout."""

    data: bytes = field(repr=False)


@dataclass(frozen=True)
class Sample:
    """Live metrics of the worker's node (``skyward.worker.metrics``): the values read at
    ``time`` (the node's clock, seconds since the epoch), by name."""

    time: float
    values: dict[str, float]


@dataclass(frozen=True)
class Bye:
    """The worker is about to exit normally."""


# ── payloads ─────────────────────────────────────────────────────────────────────────────


# Values the standard library pickles exactly as cloudpickle does, and several times
# faster (no pickler object to build): a no-op's None, a call's empty arguments.
_PLAIN = frozenset({type(None), bool, int, float, str, bytes})
_NONE = pickle.dumps(None, protocol=5)


def dumps(obj: object) -> Parts:
    """Pickle ``obj`` with cloudpickle protocol 5, large buffers out of band."""
    if obj is None:
        return [_NONE]  # what most calls return
    if type(obj) in _PLAIN or (type(obj) is tuple and all(map(_plain, obj))):
        return [pickle.dumps(obj, protocol=5)]
    from skyward.link.pickling import pickle_value  # cloudpickle's, with tracebacks' lines

    buffers: list[pickle.PickleBuffer] = []
    main = pickle_value(obj, buffers.append)
    return [main, *(b.raw() for b in buffers)]


def dumps_call(function: bytes, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Parts:
    """A call's payload, ``dumps((function, args, kwargs))``, with the common case (no
    arguments, or plain ones) found in fewer steps."""
    if (not args or _plain(args)) and (not kwargs or _plain(kwargs)):
        return [pickle.dumps((function, args, kwargs), protocol=5)]
    return dumps((function, args, kwargs))


def _plain(obj: object) -> bool:
    """A plain value, or an empty or plain-valued tuple or dict (a call's arguments)."""
    kind = type(obj)
    if kind in _PLAIN:
        return True
    if kind is tuple:
        return all(type(item) in _PLAIN for item in obj)  # type: ignore[attr-defined]
    if kind is dict:
        return all(type(v) in _PLAIN and type(k) is str for k, v in obj.items())  # type: ignore[attr-defined]
    return False


def loads(parts: Sequence[Part]) -> Any:
    return pickle.loads(parts[0], buffers=parts[1:])


@dataclass(frozen=True)
class ErrorInfo:
    """A remote exception, made to survive a client that cannot unpickle it.

    ``blob`` is the exception pickled on its own, or ``None`` when it could not be; the type
    name, message and traceback text always arrive.
    """

    type_name: str
    message: str
    traceback: str
    blob: bytes | None


def encode_error(exc: BaseException) -> Parts:
    import traceback

    import cloudpickle

    kind = type(exc)
    type_name = f"{kind.__module__}.{kind.__qualname__}"
    if kind.__module__ == "builtins":
        type_name = kind.__qualname__
    # A hostile exception may raise from __str__, from pickling or from unpickling (even
    # SystemExit): each is caught here, so the worker lives and the call fails with what
    # could be kept.
    message = _safely(lambda: str(exc), f"<{type_name}: str() raised>")
    tb = _safely(
        lambda: "".join(traceback.format_exception(exc)),
        f"{type_name}: {message}\n(the traceback could not be formatted)\n",
    )
    blob: bytes | None
    try:
        blob = cloudpickle.dumps(exc, protocol=5)
        # Exceptions with custom __init__ signatures pickle but fail to unpickle; catch that
        # here, where the traceback is, rather than as a puzzling error on the client.
        pickle.loads(blob)
    except BaseException:
        blob = None
    return dumps(ErrorInfo(type_name, message, tb, blob))


def decode_error(parts: Parts) -> BaseException:
    """Rebuild a remote exception as its own type, remote traceback as ``__cause__``."""
    info: ErrorInfo = loads(parts)
    exc: BaseException | None = None
    if info.blob is not None:
        try:
            exc = loads([info.blob])
        except BaseException:  # a missing module, or an unpickler that raises SystemExit
            exc = None  # fall back to RemoteError
    if not isinstance(exc, Exception):
        # A remote SystemExit or KeyboardInterrupt raised here would exit the client or look
        # like Ctrl-C to it; only ordinary exceptions come back as themselves.
        exc = RemoteError(info.type_name, info.message, info.traceback)
    exc.__cause__ = RemoteTraceback(info.traceback)
    return exc


def _safely(make: Callable[[], str], fallback: str) -> str:
    try:
        return make()
    except BaseException:
        return fallback


# ── framing ──────────────────────────────────────────────────────────────────────────────


def frame(message: object, payload: Parts | None = None) -> Parts:
    """The parts to write for one frame. A small frame (payload of at most ``_JOIN_BYTES``)
    is one ``bytes``, so its size is its ``len`` and it goes out in one ``write``; a larger
    one is the header and message, then the payload's parts as they are (never copied)."""
    return _frame(_pack(message), payload)


def frame_call(call_id: int, name: str, payload: Parts) -> Parts:
    """``frame(Call(call_id, name), payload)`` without making the ``Call``: a plain call's
    frame, on every call's path."""
    label = name.encode()
    if len(payload) == 1:
        part = payload[0]
        if type(part) is bytes and len(part) <= _JOIN_BYTES:  # the usual: _frame's first case
            size = _CALL.size + len(label)
            return [_CALL_FRAME.pack(2, size, len(part), _CALL_TAG, call_id) + label + part]
    return _frame(_CALL.pack(_CALL_TAG, call_id) + label, payload)


def frame_result(call_id: int, ok: bool, payload: Parts) -> Parts:
    """``frame(Result(call_id, ok), payload)`` without making the ``Result``."""
    if len(payload) == 1:
        part = payload[0]
        if type(part) is bytes and len(part) <= _JOIN_BYTES:  # the usual: _frame's first case
            return [_RESULT_FRAME.pack(2, _RESULT.size, len(part), _RESULT_TAG, call_id, ok) + part]
    return _frame(_RESULT.pack(_RESULT_TAG, call_id, ok), payload)


def _frame(head: bytes, payload: Parts | None) -> Parts:
    if not payload:
        return [_HEADER_1.pack(1, len(head)) + head]
    if len(payload) == 1:  # the usual payload: one pickle, no out-of-band buffers
        (part,) = payload
        size = _nbytes(part)
        if size <= _JOIN_BYTES:
            return [b"".join((_HEADER_2.pack(2, len(head), size), head, part))]
        return [_HEADER_2.pack(2, len(head), size) + head, part]
    count = len(payload) + 1
    lengths = [_nbytes(p) for p in payload]
    header = _header(count).pack(count, len(head), *lengths)
    if sum(lengths) <= _JOIN_BYTES:
        return [b"".join((header, head, *payload))]
    return [header + head, *payload]


# A frame whose payload is this small is joined into one bytes object: copying it costs
# less than a part of its own costs in every layer below, and the frame stays within what
# a pipe takes whole (PIPE_BUF, 4 KiB on Linux), so a caller may write it itself.
_JOIN_BYTES = 3584
_HEADER_1 = struct.Struct("!IQ")
_HEADER_2 = struct.Struct("!IQQ")
_HEADERS: dict[int, struct.Struct] = {}  # by part count: the frame header's layout
_LENGTHS: dict[int, struct.Struct] = {}  # by part count: the lengths alone


def _header(count: int) -> struct.Struct:
    layout = _HEADERS.get(count)
    if layout is None:
        layout = struct.Struct(f"!I{count}Q")
        if count <= _CACHED_COUNTS:
            _HEADERS[count] = layout
    return layout


def _lengths(count: int) -> struct.Struct:
    layout = _LENGTHS.get(count)
    if layout is None:
        layout = struct.Struct(f"!{count}Q")
        if count <= _CACHED_COUNTS:
            _LENGTHS[count] = layout
    return layout


_CACHED_COUNTS = 64  # frames of more parts (many arrays) are rare, and large anyway


# Part 0 of the two frames of every call, packed instead of pickled (see the module
# docstring): tag, call id, and the call's name (the rest of the part) or the result's ok.
_PICKLED = 0x80  # pickle's PROTO opcode: the first byte of any pickle of protocol 2 or more
_CALL_TAG = 1
_RESULT_TAG = 2
_CALL = struct.Struct("!BQ")
_RESULT = struct.Struct("!BQ?")
# A call's and a result's frame up to the name or the payload, each in one pack: the header
# (2 parts), then the Call or the Result packed.
_CALL_FRAME = struct.Struct("!IQQBQ")
_RESULT_FRAME = struct.Struct("!IQQBQ?")


def _pack(message: object) -> bytes:
    kind = type(message)
    if kind is Result:
        return _RESULT.pack(_RESULT_TAG, message.call_id, message.ok)  # type: ignore[attr-defined]
    if kind is Call:
        call: Call = message  # type: ignore[assignment]
        if not call.window and not call.inputs and call.relay is None:
            return _CALL.pack(_CALL_TAG, call.call_id) + call.name.encode()
    return pickle.dumps(message, protocol=5)


# A packed Call or Result is rebuilt by storing its fields in a fresh instance's __dict__:
# the frozen dataclass's __init__ sets each field through object.__setattr__, several
# times slower, on both ends of every call.
_new = object.__new__


def _unpack(data: Part) -> Any:
    tag = data[0]
    if tag == _PICKLED:
        return pickle.loads(data)
    return _packed(data, 0, len(data), tag)


def _packed(buffer: Part, start: int, stop: int, tag: int) -> Any:
    """The packed ``Call`` or ``Result`` in ``buffer[start:stop]``, whose first byte is
    ``tag``."""
    if tag == _RESULT_TAG:
        _, call_id, ok = _RESULT.unpack_from(buffer, start)
        result = _new(Result)
        fields = result.__dict__
        fields["call_id"] = call_id
        fields["ok"] = ok
        return result
    if tag == _CALL_TAG:
        _, call_id = _CALL.unpack_from(buffer, start)
        call = _new(Call)  # window, inputs and relay: the class's defaults
        fields = call.__dict__
        fields["call_id"] = call_id
        fields["name"] = str(buffer[start + _CALL.size : stop], "utf-8")
        return call
    raise ValueError(f"unknown message tag {tag} in a frame")


def _nbytes(part: Part) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


def size(parts: Sequence[Part]) -> int:
    """Bytes in ``parts``, as written."""
    return sum(map(_nbytes, parts))


_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def write_parts(fd: int, parts: Sequence[Part]) -> None:
    """Write every part to ``fd`` with as few syscalls as the kernel allows."""
    if len(parts) == 1:  # a small frame (see frame): one write mostly takes it all
        part = parts[0]
        written = os.write(fd, part)
        if written == (len(part) if type(part) is bytes else _nbytes(part)):
            return
    elif len(parts) <= _IOV_MAX:
        written = os.writev(fd, parts)
        if written == size(parts):
            return
    else:
        written = 0
    views = [memoryview(p).cast("B") for p in parts if _nbytes(p)]
    while views and written >= views[0].nbytes:
        written -= views[0].nbytes
        views.pop(0)
    if written:
        views[0] = views[0][written:]
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        while views and written >= views[0].nbytes:
            written -= views[0].nbytes
            views.pop(0)
        if written:
            views[0] = views[0][written:]


def read_exact(readinto: Callable[[memoryview], int | None], size: int) -> bytearray:
    """Read exactly ``size`` bytes; ``EOFError`` if the stream ends first."""
    buf = bytearray(size)
    got = readinto(buf)  # type: ignore[arg-type]  # mostly all of it, at once
    if got == size:
        return buf
    got = got or 0
    if not got and size:
        raise EOFError(f"stream ended after 0 of {size} bytes")
    view = memoryview(buf)
    while got < size:
        n = readinto(view[got:])
        if not n:
            raise EOFError(f"stream ended after {got} of {size} bytes")
        got += n
    return buf


def read_frame(readinto: Callable[[memoryview], int | None]) -> tuple[Any, Parts]:
    """Read one frame; return the message and its payload parts (maybe empty)."""
    message, lengths = read_message(readinto)
    return message, [read_exact(readinto, n) for n in lengths]


def read_message(readinto: Callable[[memoryview], int | None]) -> tuple[Any, tuple[int, ...]]:
    """Read a frame's header and message; return the message and the lengths of its payload
    parts, which the caller reads next (all of them, in order)."""
    (count,) = _COUNT.unpack(read_exact(readinto, _COUNT.size))
    _check_count(count)
    lengths = _lengths(count).unpack(read_exact(readinto, 8 * count))
    return _unpack(read_exact(readinto, lengths[0])), lengths[1:]


def parse_message(
    buffer: bytearray, start: int, end: int
) -> tuple[Any, tuple[int, ...], int] | None:
    """``read_message`` from bytes already read: the message, the lengths of its payload
    parts and where the payload starts, if ``buffer[start:end]`` holds the whole header and
    message; else None (nothing consumed)."""
    if end - start < 4:
        return None
    (count,) = _COUNT.unpack_from(buffer, start)
    _check_count(count)
    body = start + 4 + 8 * count
    if body > end:
        return None
    lengths = _lengths(count).unpack_from(buffer, start + 4)
    stop = body + lengths[0]
    if stop > end:
        return None
    return _unpack(buffer[body:stop]), lengths[1:], stop


def parse_frame(buffer: bytearray, start: int, end: int) -> tuple[Any, Parts, int] | None:
    """A whole frame from bytes already read, if ``buffer[start:end]`` begins with one of
    the two every call sends (a plain ``Call`` or a ``Result``, packed, and one payload
    part): the message, its payload, and where the next frame starts. Else None (nothing
    consumed): ``parse_message`` and the reads after it take every other frame."""
    if end - start < _HEADER_2.size + _CALL.size:
        return None
    count, head, size = _HEADER_2.unpack_from(buffer, start)
    body = start + _HEADER_2.size
    split = body + head
    stop = split + size
    tag = buffer[body]
    if count != 2 or stop > end or (tag != _RESULT_TAG and tag != _CALL_TAG):
        return None
    return _packed(buffer, body, split, tag), [buffer[split:stop]], stop


def _check_count(count: int) -> None:
    if not 0 < count <= _MAX_PARTS:
        raise EOFError(f"corrupt frame header ({count} parts); something else wrote here")


def python_version() -> tuple[int, int, int]:
    return (sys.version_info.major, sys.version_info.minor, sys.version_info.micro)


# ── a relayed broadcast (skyward.worker.relay forwards the payload between nodes) ────────


@dataclass(frozen=True)
class Relay:
    """A broadcast's payload that crosses the client's link once and is relayed between the
    pool's nodes (``skyward.worker.relay``).

    ``token`` names the broadcast. The node whose ``Call`` frame carries the payload sends it
    on, as it arrives, to the first of ``chain`` (rank, address, port), which sends it to
    the next, and so on. A node with ``inbound`` gets a frame without payload: its payload
    arrives on its relay port from the node before it.
    """

    token: bytes
    chain: tuple[tuple[int, str, int], ...] = ()
    inbound: bool = False


@dataclass(frozen=True)
class RelayPayload:
    """The payload of relay ``token``, sent by the client itself (payload: its parts): the
    node before this one could not reach it (``RelayFailed``)."""

    token: bytes


@dataclass(frozen=True)
class RelayAbort:
    """A node of relay ``token`` was lost: a node whose payload has not fully arrived fails
    its call with ``WorkerLost`` naming ``node``, instead of waiting for it forever."""

    token: bytes
    node: int
    reason: str


@dataclass(frozen=True)
class RelayFailed:
    """This node could not relay ``token``'s payload to node ``node``: the client sends that
    node, and the ones after it, the payload itself (``RelayPayload``). ``connected``: the
    connection was made and broke mid-way (else the node could not be reached at all)."""

    token: bytes
    node: int
    reason: str
    connected: bool = False
