"""``Channel``: the client's end of one worker link.

::

    pool ── submit(Call + payload) ──> outbox ──> sender thread ──> transport.write ──> worker
    reader thread <── frames ── transport.readinto  (Result → done, Log → console,
                                                      Hello/Ready/StartFailed → control queue)
      (or the caller waiting for its own call, which reads every frame meanwhile, where
       the transport says a caller may: ``Transport.caller_reads``, ``turns``)
    stderr thread <── lines ─── transport.read_stderr (→ console, and a tail kept for
                                                       WorkerLost)

The transport is whatever byte streams reach a ``python -m skyward.worker``: a subprocess's
pipes (local) or an SSH exec channel. Callers (holding the pool's lock, or about to be
interrupted by Ctrl-C) must not wait on a slow worker nor leave half a frame on the wire, so
the sender thread writes; except that a frame of at most ``PIPE_BUF`` bytes, which a pipe
takes whole or not at all, is written by the caller itself when nothing is queued before it
and nobody else is writing, and the transport says the write cannot wait (the pipe has a
free page, the SSH window has room): a worker that stopped reading never blocks a caller.
That saves a thread switch on every small call, a good part of a no-op's round trip. When
the protocol stream ends, every call in flight fails with ``WorkerLost`` naming the node,
the exit status (or the dropped link) and the last lines of stderr.

Ctrl-C: what a caller's thread does here (registering a call and sending its frame, reading
and dispatching frames while it waits) runs inside ``hold_interrupts`` (the scheduler's, for
a call's registration and frame; ``CallFuture.result``'s, while it reads), so a
``KeyboardInterrupt`` never splits a call's registration from its frame, nor a frame from
its dispatch; it lands where the caller waits (see ``client.interrupts``).
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import select
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from skyward._errors import (
    ChannelError,
    PoolClosed,
    RemoteError,
    StartError,
    WorkerLost,
    describe_status,
)
from skyward.client.futures import Deadline, delivering, fail, resolve
from skyward.client.interrupts import allow_interrupts, hold_interrupts
from skyward.link import protocol as proto
from skyward.link.protocol import Relay, RelayFailed
from skyward.link.turns import CHECK, Turns

if TYPE_CHECKING:  # a streaming call's state; its frames come back through on_frame
    from skyward.pool.streams import Streams

_STDERR_TAIL_LINES = 40
_STDERR_LINE_BYTES = 2048  # of each line in the tail, its end is kept
# At most this many parts (frames are a header and one to a few parts) per write.
_BATCH_PARTS = 256
# Frames up to this size may be written by the caller (see the module docstring): pipes
# write them atomically, and they fit in one SSH packet.
_INLINE_BYTES = select.PIPE_BUF
# After EOF on the protocol stream: how long to wait for the process's exit status and the
# rest of its stderr before reporting the loss. Both normally arrive within milliseconds.
_EXIT_STATUS_TIMEOUT = 2.0


OutputSink = Callable[[int, str, bytes], None]  # (node, "stdout" | "stderr", data)
# How a call ends: (error, value), once, on the reader thread. Not a second Future per call
# (the pool settles its books, then the caller's future): that lengthened every round trip.
Done = Callable[[BaseException | None, Any], None]


# ----------------------------------------------------------------------------------------------
# ``Transport``: the byte streams a channel has to one worker process.


class Transport(Protocol):
    """Byte streams to one worker process, called by the channel's threads, and by a
    caller's thread for a small frame through ``write_now``, which never blocks.

    ``caller_reads`` declares whether a caller waiting for its result may read the stream
    itself (see ``turns``): True when ``ready`` can tell that a read would not wait and
    reading on the caller's thread saves a hand-off (a pipe read through ``PipeReader``).
    False where something else reads the wire anyway (paramiko's own thread for SSH): the
    channel's reader thread then reads every frame, and ``ready`` is never called.
    """

    @property
    def caller_reads(self) -> bool: ...

    def write(self, parts: Sequence[proto.Part]) -> None: ...
    def readinto(self, buffer: memoryview) -> int | None: ...
    def read_frame(self) -> tuple[Any, proto.Parts]:
        """The next frame (``proto.read_frame`` over ``readinto``, or a faster way to the
        same); ``EOFError`` at the end of the stream."""
        ...

    def read_stderr(self) -> bytes:
        """The next chunk of the worker's stderr; ``b""`` at end of stream."""
        ...

    def wait(self, timeout: float) -> int | None:
        """The exit status (negative: killed by that signal), or None if still running."""
        ...

    def kill(self) -> None:
        """Kill the worker and anything it started; harmless once they are gone."""
        ...

    def ready(self, timeout: float | None) -> bool:
        """Whether ``readinto`` would return without waiting (data, or the end of the
        stream), waiting up to ``timeout`` seconds (None: until it would, or ``unblock``).
        Called only when ``caller_reads``; a Ctrl-C may land in it, so it keeps nothing half
        changed."""
        ...

    def unblock(self) -> None:
        """Make a ``ready`` waiting on another thread return if bytes are buffered (read
        ahead by a caller that has stopped reading). Called only when ``caller_reads``."""
        ...

    def read_ahead(self) -> bool:
        """Whether ``readinto`` would return without waiting, found without waiting (what
        the stream holds now may be read into a buffer). Called only when
        ``caller_reads``, by the thread whose turn it is to read, with interrupts held."""
        ...

    def write_now(self, frame: bytes) -> bool:
        """Write ``frame`` (one frame of at most ``PIPE_BUF`` bytes) if that cannot wait;
        False, with nothing written, if it could. The caller's own thread writes small
        frames only so: it may hold the pool's lock. Raises as ``write`` does."""
        ...

    def link_lost(self) -> str | None:
        """Why the stream ended if the link to the worker broke rather than the worker ending
        (a dropped SSH connection), else None."""
        ...

    def close(self) -> None:
        """Close every descriptor the transport opened on the client. Called once, after
        the stream has ended, when nothing reads or polls it any more (``Turns.close``)."""
        ...


def _settle(done: Done, error: BaseException | None, value: Any) -> None:
    try:
        done(error, value)
    except Exception:  # a bug in the pool's books must not end the reader thread
        logging.getLogger("skyward").exception("skyward: settling a call failed")
    except BaseException:
        _callback_left()


def _callback_left() -> None:
    """A done-callback raised what ``Future`` lets through (``SystemExit``); called from the
    ``except`` block, so a bare ``raise`` passes it on. On the main thread, reading its
    caller's own result, it reaches that caller, as ``set_result`` would let it; on a reader
    thread it would end the thread and leave every later call of the worker waiting for
    good, so it is logged there."""
    if threading.current_thread() is threading.main_thread():
        raise
    logging.getLogger("skyward").exception("skyward: a done-callback raised past Future")


def _tail_line(line: bytes) -> str:
    text = line[-_STDERR_LINE_BYTES:].decode("utf-8", "backslashreplace")
    return text if len(line) <= _STDERR_LINE_BYTES else "…" + text


class Channel:
    """One worker link. ``submit`` and ``send_*`` are thread-safe.

    States: handshaking (Hello, then Start, then Ready) → serving → broken → lost. The
    moment the protocol stream ends, ``broken`` is set and ``on_broken`` is called, so the
    pool stops choosing this worker; then, once the exit status and last stderr lines are in,
    ``lost`` is set, every call in flight fails with it, and ``on_lost`` is called. Both
    hooks run once, on the reader thread.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        node: int,
        rank: int | None = None,
        label: str | None = None,
        output: OutputSink,
        on_lost: Callable[[Channel, WorkerLost], None] | None = None,
        on_broken: Callable[[Channel], None] | None = None,
        on_frame: Callable[[Channel, Any, proto.Parts], None] = lambda *_: None,
        on_result: Callable[[int], None] | None = None,
        diagnose: Callable[[int], str | None] | None = None,
    ) -> None:
        self.node = node  # the node (machine) the worker runs on
        # The worker's rank in the pool: the node's, unless nodes run several workers.
        # Slots, output and relays go by it.
        self.rank = node if rank is None else rank
        self.label = label or f"node {node}"  # how messages name it
        self.pid: int | None = None
        self.relay_port: int | None = None  # where peers relay broadcasts to it (Ready)
        self._transport = transport
        self._output = output
        self._on_lost = on_lost
        self._on_broken = on_broken
        self._on_frame = on_frame  # Shared, Yield, Want, RelayFailed: for the pool
        self._flush_output = on_result  # before a result is handed over: flush partial output
        self._diagnose = diagnose  # why a node's link dropped, if its provider can tell
        # Frames to write, in order; None stops the sender. Unbounded: the payloads are the
        # caller's own objects, referenced, not copied.
        self._outbox: queue.SimpleQueue[proto.Parts | None] = queue.SimpleQueue()
        self._write_lock = threading.Lock()  # guards: writing to the transport
        self._queued_lock = threading.Lock()  # guards: _queued
        self._queued = 0  # frames put in the outbox and not yet written
        # guards: _pending, _stack_requests, _ids, broken, lost, _closing
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[str, Done]] = {}
        self._stack_requests: dict[int, Future[proto.StacksReport]] = {}
        self._ids = itertools.count(1)
        self._control: queue.Queue[object] = queue.Queue()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._closing = False
        self._kill_reason = ""
        self._ready = False  # set once the worker said Ready; only for messages
        self.broken = False
        self.lost: WorkerLost | None = None
        self._turns: Turns | None = None  # callers read their own results (see turns)
        if transport.caller_reads:
            self._turns = Turns(
                ready=transport.ready,
                read=transport.read_frame,
                dispatch=self._dispatch,
                needs_reader=lambda: bool(self._pending),
                torn=self.kill,
                recheck=CHECK,  # a call can also end by a timeout or a close
                unblock=transport.unblock,
                read_ahead=transport.read_ahead,
                interruptible=allow_interrupts,
                delivering=delivering,
            )
        self._stderr_thread = threading.Thread(
            target=self._read_stderr, name=f"skyward-stderr-{self.rank}", daemon=True
        )
        # Set as the reader thread ends: wait_closed waits on it, never on Thread.join (on
        # Python 3.11 a join a Ctrl-C interrupts may mark a running thread stopped).
        self._read_done = threading.Event()
        self._reader_thread = threading.Thread(
            target=self._read, name=f"skyward-reader-{self.rank}", daemon=True
        )
        self._sender_thread = threading.Thread(
            target=self._write, name=f"skyward-sender-{self.rank}", daemon=True
        )
        self._stderr_thread.start()
        self._reader_thread.start()
        self._sender_thread.start()

    # ── handshake ────────────────────────────────────────────────────────────────────────

    def wait_hello(self, deadline: Deadline) -> proto.Hello:
        message = self._next_control(deadline, "say hello")
        if not isinstance(message, proto.Hello):
            raise ChannelError(f"{self.label}: expected Hello, got {message!r}")
        self.pid = message.pid
        return message

    def send_start(self, message: proto.Start, plugins: proto.Parts) -> None:
        self._send(message, plugins)

    def wait_ready(self, deadline: Deadline) -> None:
        """Wait for ``Ready``; ``StartError`` if a plugin's ``around_app`` raised."""
        message = self._next_control(deadline, "enter its plugins")
        if not isinstance(message, proto.Ready):
            raise ChannelError(f"{self.label}: expected Ready, got {message!r}")
        self.relay_port = message.relay_port
        self._ready = True

    def _next_control(self, deadline: Deadline, doing: str) -> object:
        try:
            message = self._control.get(timeout=deadline.remaining())
        except queue.Empty:
            raise TimeoutError(
                f"{self.label}: the worker did not {doing} within {deadline.what}"
            ) from None
        if isinstance(message, BaseException):
            raise message
        return message

    # ── calls ────────────────────────────────────────────────────────────────────────────

    def submit(
        self,
        name: str,
        payload: proto.Parts,
        done: Done,
        streams: Streams | None = None,
        relay: Relay | None = None,
        waited: bool = False,
    ) -> bool:
        """Queue one call; ``done`` gets its result, its exception, or ``WorkerLost``.

        Returns at once. False if the link is already broken: the call was not taken, and
        ``done`` will not be called, so the caller can send it elsewhere. With ``relay``,
        the call is part of a relayed broadcast; ``payload`` is not sent if ``inbound``.
        ``waited``: the caller will wait for it with ``wait_for`` (the reader may sleep on).
        Its caller holds interrupts (the scheduler, whose books change with it, does), so
        a Ctrl-C waits until the call is both registered and sent.
        """
        with self._lock:
            if self.broken:
                return False
            call_id = next(self._ids)
            self._pending[call_id] = (name, done)
        if streams is not None:
            parts = proto.frame(streams.call(self, call_id), payload)
        elif relay is None:
            parts = proto.frame_call(call_id, name, payload)  # the usual call
        else:
            payload = [] if relay.inbound else payload
            parts = proto.frame(proto.Call(call_id, name, relay=relay), payload)
        if self._turns is not None and not waited:
            self._turns.want_reader()  # nobody reads for it: the reader must
        self._send_parts(parts)
        return True

    def wait_for(self, future: Future[Any], timeout: float | None) -> float | None:
        """Read this link until ``future`` (a call sent here) is settled, the link ends, or
        ``timeout`` passes; the time left of ``timeout``. See ``turns``. On the main thread,
        called inside ``hold_interrupts`` (``CallFuture.result`` holds)."""
        if self._turns is None:
            return timeout
        return self._turns.wait_for(future.done, timeout)

    def send(self, message: object, payload: proto.Parts | None = None) -> None:
        """Send one frame to the worker (a reply); never waits on a slow worker."""
        self._send(message, payload)

    def request_stacks(self) -> Future[proto.StacksReport]:
        """Ask the worker for every thread's stack; answered even while calls run."""
        future: Future[proto.StacksReport] = Future()
        with hold_interrupts:
            with self._lock:
                if self.lost is not None or self.broken:
                    error = self.lost or ChannelError(f"{self.label}: the link is broken")
                    fail(future, error)
                    return future
                request_id = next(self._ids)
                self._stack_requests[request_id] = future
            self._send(proto.StacksRequest(request_id))
            return future

    def shutdown(self, *, cancel: bool) -> None:
        """Ask the worker to exit; returns at once. See ``proto.Shutdown`` for ``cancel``."""
        with hold_interrupts:
            with self._lock:
                self._closing = True
            self._send(proto.Shutdown(cancel=cancel))

    def interrupt(self) -> None:
        """Tell the worker it is being stopped to be replaced (a cancelling ``Shutdown`` that
        says so), without this channel counting as closed by the pool: its calls still fail
        with ``WorkerLost``."""
        self._send(proto.Shutdown(cancel=True, replaced=True))

    def wait_closed(self, timeout: float) -> bool:
        """Wait for the worker to exit and the reader to finish; True if it did in time.
        A Ctrl-C may end the wait (inside ``allow_interrupts``): nothing is left half done."""
        return self._read_done.wait(timeout)

    def kill(self, reason: str) -> None:
        """Kill the worker; ``reason`` goes into the ``WorkerLost`` of its calls."""
        with self._lock:
            self._kill_reason = self._kill_reason or reason
        self._transport.kill()

    def _send(self, message: object, payload: proto.Parts | None = None) -> None:
        with hold_interrupts:  # a frame goes out whole, and _queued stays true
            self._send_held(message, payload)

    def _send_held(self, message: object, payload: proto.Parts | None) -> None:
        self._send_parts(proto.frame(message, payload))

    def _send_parts(self, parts: proto.Parts) -> None:
        """Write one frame now if it can go at once, else queue it for the sender thread.
        Interrupts held by the caller."""
        # Cheap checks first: while the sender is busy the frame is queued without a write.
        # A small frame is one bytes object (proto.frame).
        if (
            len(parts) == 1
            and len(parts[0]) <= _INLINE_BYTES
            and self._queued == 0
            and self._write_lock.acquire(False)  # not blocking
        ):
            try:
                # Nothing queued may be overtaken: frames keep the order they were sent in.
                if self._queued == 0:
                    try:
                        if self._transport.write_now(parts[0]):  # type: ignore[arg-type]
                            return
                    except (OSError, ValueError):
                        return  # the worker is gone; the reader thread sees EOF and reports it
            finally:
                self._write_lock.release()
        with self._queued_lock:
            self._queued += 1
        self._outbox.put(parts)

    def _write(self) -> None:
        while (parts := self._outbox.get()) is not None:
            # Frames queued meanwhile (a map's calls, a burst of submits) go out with this
            # one in a single write: one system call, one SSH packet, instead of one each.
            stop = False
            frames = 1
            while len(parts) < _BATCH_PARTS:
                try:
                    more = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                parts.extend(more)  # a fresh list from proto.frame, held by nobody else
                frames += 1
            with self._write_lock:
                try:
                    self._transport.write(parts)
                except (OSError, ValueError):
                    # The worker is gone; the reader thread sees EOF and reports it. Stop
                    # writing, and let queued frames go: nobody will read them.
                    return
                finally:
                    with self._queued_lock:
                        self._queued -= frames
            del parts
            if stop:
                return

    # ── reader threads ───────────────────────────────────────────────────────────────────

    def _read(self) -> None:
        try:
            self._read_until_lost()
        finally:
            self._read_done.set()

    def _read_until_lost(self) -> None:
        delivering.active = True  # done-callbacks run here: see CallFuture
        try:
            if self._turns is not None:
                self._turns.run_reader()  # raises when the stream ends, as read_frame does
            else:
                while True:
                    message, parts = self._transport.read_frame()
                    self._dispatch(message, parts)
        except (EOFError, OSError, ValueError):
            pass
        except Exception as exc:  # a frame we cannot decode: the link is unusable
            self._output(self.rank, "stderr", f"skyward: bad frame: {exc!r}\n".encode())
            self._transport.kill()
        with self._lock:
            self.broken = True
        if self._on_broken is not None:
            self._on_broken(self)
        self._lose()

    def _dispatch(self, message: object, parts: proto.Parts) -> None:
        # A table, not a chain of isinstance: a result, the usual frame, costs one lookup.
        _HANDLERS.get(type(message), Channel._on_control)(self, message, parts)

    def _on_result(self, message: proto.Result, parts: proto.Parts) -> None:
        with self._lock:
            entry = self._pending.pop(message.call_id, None)
        if entry is None:
            return
        if self._flush_output is not None:
            self._flush_output(self.rank)
        if not message.ok:
            _settle(entry[1], proto.decode_error(parts), None)
            return
        try:
            value = proto.loads(parts)
        except BaseException as exc:  # even SystemExit: it must not end this thread
            text = f"cannot unpickle the result of {entry[0]} on the client: {exc}"
            _settle(entry[1], RemoteError(type(exc).__name__, text, ""), None)
            return
        try:  # _settle, written out: every call's result comes here
            entry[1](None, value)
        except Exception:  # a bug in the pool's books must not end the reader thread
            logging.getLogger("skyward").exception("skyward: settling a call failed")
        except BaseException:
            _callback_left()

    def _on_log(self, message: proto.Log, parts: proto.Parts) -> None:
        self._output(self.rank, "stdout", message.data)

    def _on_pool_frame(self, message: object, parts: proto.Parts) -> None:
        self._on_frame(self, message, parts)  # Shared, Yield, Want, RelayFailed, Sample

    def _on_start_failed(self, message: proto.StartFailed, parts: proto.Parts) -> None:
        error = proto.decode_error(parts)
        failure = StartError(
            f"{self.label}: a plugin's around_app failed: {type(error).__name__}: {error}"
        )
        failure.__cause__ = error
        self._control.put(failure)

    def _on_stacks(self, message: proto.StacksReport, parts: proto.Parts) -> None:
        with self._lock:
            request = self._stack_requests.pop(message.request_id, None)
        if request is not None:
            resolve(request, message)

    def _on_bye(self, message: proto.Bye, parts: proto.Parts) -> None:
        pass

    def _on_control(self, message: object, parts: proto.Parts) -> None:
        self._control.put(message)  # Hello, Ready: the handshake waits for them

    def _read_stderr(self) -> None:
        partial = b""
        while True:
            try:
                data = self._transport.read_stderr()
            except OSError:
                data = b""
            if not data:
                break
            self._output(self.rank, "stderr", data)
            # Only the end of a long line is kept (a progress bar without newlines, a huge
            # dump): the tail is for WorkerLost, whose message must stay readable, and its
            # last line (the fatal error) must survive whatever came before it.
            lines = (partial + data).split(b"\n")
            partial = lines.pop()[-_STDERR_LINE_BYTES:]
            for line in lines[-_STDERR_TAIL_LINES:]:
                self._stderr_tail.append(_tail_line(line))
        if partial:
            self._stderr_tail.append(_tail_line(partial))

    def _lose(self) -> None:
        status = self._transport.wait(_EXIT_STATUS_TIMEOUT)
        # Whatever the worker started and left behind dies with it (and stops holding its
        # stderr open, so the last lines arrive now).
        self._transport.kill()
        self._stderr_thread.join(_EXIT_STATUS_TIMEOUT)
        tail = "\n".join(self._stderr_tail)
        link = self._transport.link_lost()
        # A dropped link: the provider may know why (a reclaimed spot VM); asked unlocked.
        why = self._diagnose(self.node) if link is not None and self._diagnose else None
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
            requests = list(self._stack_requests.values())
            self._stack_requests.clear()
            closing = self._closing
            running = ", ".join(name for name, _ in pending) or "no calls"
            doing = f"running {running}" if self._ready else "starting (before Ready)"
            if link is not None:
                message = f"{self.label}: {link}; lost the worker (pid {self.pid}) while {doing}"
                if why:
                    message += f"; {why}"
            else:
                message = (
                    f"{self.label}: the worker (pid {self.pid}) ended with "
                    f"{describe_status(status)} while {doing}"
                )
            if self._kill_reason:
                message += f"; it was killed because {self._kill_reason}"
            if tail:
                message += f"\n--- last lines of its stderr ---\n{tail}"
            self.lost = WorkerLost(message, node=self.node, exit_status=status, stderr_tail=tail)
        error: BaseException = self.lost
        if closing:
            error = PoolClosed(f"the pool was closed while {running} ran on {self.label}")
        for _, done in pending:
            _settle(done, error, None)
        for request in requests:
            fail(request, self.lost)
        self._control.put(self.lost)
        self._outbox.put(None)
        self._sender_thread.join(_EXIT_STATUS_TIMEOUT)
        # Closed now, not when a reference cycle is collected: a pool that fails to start or
        # replaces its workers again and again would run out of descriptors first. A caller
        # may still be polling the pipe (a leader): the turns wait until none can.
        if self._turns is None:
            self._transport.close()
        else:
            self._turns.close(self._transport.close, _EXIT_STATUS_TIMEOUT)
        if self._on_lost is not None and not closing:
            self._on_lost(self, self.lost)


# How the channel handles each frame it reads, by the frame's type (see Channel._dispatch).
_HANDLERS: dict[type, Callable[[Channel, Any, proto.Parts], None]] = {
    proto.Result: Channel._on_result,
    proto.Log: Channel._on_log,
    proto.Shared: Channel._on_pool_frame,
    proto.Yield: Channel._on_pool_frame,
    proto.Want: Channel._on_pool_frame,
    proto.Sample: Channel._on_pool_frame,
    RelayFailed: Channel._on_pool_frame,
    proto.StartFailed: Channel._on_start_failed,
    proto.StacksReport: Channel._on_stacks,
    proto.Bye: Channel._on_bye,
}
