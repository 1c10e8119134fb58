"""``python -m skyward.worker --node N``: one long-lived worker per node.

::

    fd 0 (pipe/SSH) ──> reader thread ──> call queue ──> executor threads (main thread first)
                                                              │ result frames
    private dup of fd 1 <─────────────── send lock <──────────┘
          ^                                  ^
          │                                  └── stdout forwarder: fd 1 is a pipe it drains
          └─ the protocol stream               into Log frames (through plugins' filters),
                                               so print() and C-level writes never
                                               corrupt the protocol
    fd 2 stays the transport's stderr: the client reads it directly, so the last words of a
    worker that crashes (SIGABRT from a JAX rank, a segfault) are never lost in a buffer.

Life: say ``Hello`` (stdlib only, so a Python mismatch is reported rather than a crash), wait
for ``Start``, enter the plugins' ``around_app`` contexts in order, say ``Ready``, run calls,
and on ``Shutdown`` (or EOF: the client is gone) exit the contexts in reverse and leave.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import queue
import select
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

from skyward import _protocol as proto
from skyward import _worker_hooks as hooks
from skyward._errors import SerializationError  # stdlib-only, like _protocol
from skyward._relay import Relays  # stdlib-only too

# How long a worker whose client vanished may spend leaving its contexts before it quits.
_ORPHAN_EXIT_TIMEOUT = 10.0
_orphaned = threading.Event()  # the client went away without a Shutdown


class _Link:
    """The worker's end of the protocol. ``send`` is thread-safe."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self._in = io.BufferedReader(io.FileIO(in_fd, "rb", closefd=False), 1 << 16)
        self._out_fd = out_fd
        self._send_lock = threading.Lock()  # guards: one whole frame at a time on out_fd
        self.relays: Relays | None = None  # set at Start when the pool relays broadcasts

    def send(self, message: object, payload: proto.Parts | None = None) -> None:
        parts = proto.frame(message, payload)
        with self._send_lock:
            proto.write_parts(self._out_fd, parts)

    def recv(self) -> tuple[Any, proto.Parts]:
        message, lengths = proto.read_message(self._in.readinto)
        relay = getattr(message, "relay", None)
        if relay is not None and relay.chain and self.relays is not None:
            # A broadcast's payload, passed on down the relay chain as it arrives (_relay).
            parts = self.relays.forward_from(relay.token, relay.chain, lengths, self._in.readinto)
            return message, [*parts]
        return message, [proto.read_exact(self._in.readinto, n) for n in lengths]


class _StdoutForwarder:
    """Moves what fd 1 receives into ``Log`` frames, and can drain it on demand.

    ``drain`` runs before every result is sent, so a call's output reaches the client
    before its return value does.
    """

    def __init__(self, link: _Link) -> None:
        self._link = link
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 1)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._fd = read_fd
        self._pending = select.poll()
        self._pending.register(read_fd, select.POLLIN)
        self._lock = threading.Lock()  # guards: reading the pipe and sending what was read
        self._libc: Any = None
        threading.Thread(target=self._run, name="skyward-stdout", daemon=True).start()

    def _run(self) -> None:
        while True:
            select.select([self._fd], [], [])
            with self._lock:
                if not self._forward():
                    return

    def _forward(self) -> bool:
        """Send everything buffered in the pipe now; False once the pipe or link is closed."""
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return True
            if not data:
                return False
            data = hooks.filter_stdout(data)  # plugins' filters (the jax plugin's gloo lines)
            if not data:
                continue
            try:
                self._link.send(proto.Log(data))
            except OSError:
                return False  # the client is gone; the output has nowhere to go

    def drain(self) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        self._flush_c_stdio()
        # The lock first: output the forwarder thread has read must be sent before the
        # result is. Then a poll, cheaper than a read that fails: most calls print nothing.
        with self._lock:
            if self._pending.poll(0):
                self._forward()

    def _flush_c_stdio(self) -> None:
        # printf() from C extensions is block-buffered on a pipe; flush it like Python's.
        if self._libc is None:
            import ctypes

            self._libc = ctypes.CDLL(None)
        self._libc.fflush(None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


# Functions by their pickled bytes: ``map`` sends the same bytes with every item, and a
# function defined in ``__main__`` travels by value, which costs more to unpickle than a no-op
# costs to run. Equal bytes mean an equal function, globals it captured included; a function
# whose captured globals changed on the client pickles differently and is a new entry.
_FUNCTIONS: dict[bytes, Any] = {}
_FUNCTIONS_MAX = 64
_FUNCTION_CACHE_BYTES = 1 << 16  # larger ones (big closures) are not worth keeping
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


def _run_call(
    message: proto.Call, parts: proto.Parts, relays: Relays | None
) -> tuple[bool, proto.Parts]:
    if message.relay is not None and message.relay.inbound and relays is not None:
        try:  # the payload comes from the node before this one in the relay
            parts = [*relays.take(message.relay.token)]
        except BaseException as exc:  # WorkerLost: a node before this one was lost
            return False, proto.encode_error(exc)
    try:
        function, args, kwargs = proto.loads(parts)
        fn = _function(function)
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
    except BaseException as exc:
        return False, proto.encode_error(exc)
    try:
        return True, proto.dumps(value)
    except Exception as exc:
        error = SerializationError(
            f"the return value of {message.name} ({type(value).__name__}) cannot be pickled: "
            f"{type(exc).__name__}: {exc}"
        )
        return False, proto.encode_error(error)


def _describe(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException:
        return "<str() raised>"


class _Worker:
    """Runs calls from a queue on ``concurrency`` threads, the main thread first.

    Only the main thread's work can be interrupted (by SIGINT), so a
    cancelling shutdown stops a running call or a slow ``around_app`` entry there.
    """

    def __init__(self, link: _Link, stdout: _StdoutForwarder, concurrency: int) -> None:
        self.link = link
        self.stdout = stdout
        self.concurrency = concurrency
        self.calls: queue.SimpleQueue[tuple[proto.Call, proto.Parts] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards: stopping, cancelled, _main_busy
        self.stopping = False
        self.cancelled = False
        self._main_busy = False

    def start_reader(self) -> None:
        threading.Thread(target=self._read, name="skyward-reader", daemon=True).start()

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Main-thread work that a cancelling shutdown may interrupt."""
        with self._lock:
            self._main_busy = not self.stopping
        try:
            yield
        finally:
            with self._lock:
                self._main_busy = False

    def serve(self) -> None:
        """Run calls until Shutdown or EOF."""
        executors = [
            threading.Thread(target=self._execute, name=f"skyward-exec-{i}", daemon=True)
            for i in range(1, self.concurrency)
        ]
        for thread in executors:
            thread.start()
        try:
            self._execute(main=True)
            # From here on nothing may interrupt us: the plugins' teardown (such as
            # jax.distributed.shutdown) must run whole. A SIGINT already sent is dropped too.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a cancel that landed between calls
        if not self.cancelled:
            for thread in executors:
                thread.join()
        # When cancelling, calls still running on other threads cannot be interrupted; they
        # are daemon threads and end with the process.

    def _read(self) -> None:
        cancel = True
        try:
            while True:
                message, parts = self.link.recv()
                if isinstance(message, proto.Call):
                    self.calls.put((message, parts))
                elif isinstance(message, proto.StacksRequest):
                    self.link.send(_stacks(message.request_id))
                elif isinstance(message, proto.RelayAbort) and self.link.relays is not None:
                    self.link.relays.abort(message.token, message.node, message.reason)
                elif isinstance(message, proto.RelayPayload) and self.link.relays is not None:
                    self.link.relays.deliver(message.token, parts)
                elif isinstance(message, proto.Shutdown):
                    cancel = message.cancel
                    break
        except BaseException:  # EOF, a broken pipe, or a frame we cannot read: all the same
            # The client is gone; nobody will read results. Leave, but bounded, and take
            # what the calls started along (see _exit).
            _orphaned.set()
            orphan = threading.Timer(_ORPHAN_EXIT_TIMEOUT, _exit_orphaned)
            orphan.daemon = True
            orphan.start()
        with self._lock:
            self.stopping = True
            self.cancelled = cancel
            interrupt = cancel and self._main_busy
        hooks.stopping(interrupt)  # before the interrupt: plugins may quiet what follows
        if cancel:
            _drop_queued(self.calls)
        for _ in range(self.concurrency):
            self.calls.put(None)
        if interrupt:
            # A real signal, not _thread.interrupt_main(): only a signal wakes the main
            # thread from a blocking call such as sleep() or a socket read.
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    def _execute(self, main: bool = False) -> None:
        while (item := self.calls.get()) is not None:
            message, parts = item
            with self.interruptible() if main else contextlib.nullcontext():
                ok, payload = _run_call(message, parts, self.link.relays)
            del parts, item
            if not ok and self.cancelled:
                # Interrupted by a cancelling shutdown: the client fails this call with
                # PoolClosed itself; a KeyboardInterrupt sent back would read as Ctrl-C there.
                continue
            self.stdout.drain()
            try:
                self.link.send(proto.Result(message.call_id, ok), payload)
            except OSError:
                return
            del payload  # not kept alive while the next call waits or runs


# Threads of the worker's own machinery, left out of stack reports: never where user code is.
_OWN_THREADS = ("skyward-reader", "skyward-stdout")


def _stacks(request_id: int) -> proto.StacksReport:
    import linecache
    import time

    names = {t.ident: t.name for t in threading.enumerate()}
    threads = []
    for ident, frame in sys._current_frames().items():
        name = names.get(ident, f"thread {ident}")
        if name in _OWN_THREADS or ident == threading.get_ident():
            continue
        frames: list[proto.Frame] = []
        current: Any = frame
        while current is not None:
            code = current.f_code
            line = current.f_lineno or 0
            text = linecache.getline(code.co_filename, line).strip()
            frames.append((code.co_filename, line, code.co_name, text))
            current = current.f_back
        threads.append((name, tuple(reversed(frames))))
    return proto.StacksReport(request_id, tuple(threads), time.process_time())


def _exit_orphaned() -> None:
    """The client is gone (killed, or its machine lost): end this worker and whatever its
    calls started. The worker leads its process group (a session of its own locally; the
    launch shell's group over SSH), so the group is everything it started."""
    group = os.getpgrp()
    if group in (os.getpid(), os.getppid()):  # never a group that is not ours
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)  # ourselves included
    os._exit(3)


def _drop_queued(calls: queue.SimpleQueue[tuple[proto.Call, proto.Parts] | None]) -> None:
    while True:
        try:
            calls.get_nowait()
        except queue.Empty:
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m skyward.worker")
    parser.add_argument("--node", type=int, required=True)
    args = parser.parse_args(argv)

    # Keep the protocol on private fds, then give user code harmless fd 0 and 1.
    link = _Link(os.dup(0), os.dup(1))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    stdout = _StdoutForwarder(link)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "wb", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )

    link.send(
        proto.Hello(
            python=proto.python_version(),
            pid=os.getpid(),
            hostname=socket.gethostname(),
            head_port=_free_port() if args.node == 0 else None,
        )
    )
    try:
        message, parts = link.recv()
    except EOFError:
        os._exit(0)
    if not isinstance(message, proto.Start):
        os._exit(0)  # the client decided not to start us (version mismatch, cancelled)

    from skyward import _info
    from skyward._plugin import enter_around_app

    for path in message.sys_path:
        if path not in sys.path:
            sys.path.append(path)
    _info._set_current(message.info)
    if message.relay_key:
        info = message.info
        link.relays = Relays(info.node, message.relay_key, info.peers[info.node], link.send)
    worker = _Worker(link, stdout, message.concurrency)
    worker.start_reader()
    with ExitStack() as stack:
        try:
            with worker.interruptible():
                enter_around_app(stack, proto.loads(parts), message.info)
        except BaseException as exc:
            stdout.drain()
            link.send(proto.StartFailed(), proto.encode_error(exc))
            stack.close()
            _exit(stdout, 1)
        del parts
        link.send(proto.Ready(relay_port=link.relays.port if link.relays else None))
        worker.serve()
    with contextlib.suppress(OSError):  # the client may be gone already
        link.send(proto.Bye())
    _exit(stdout, 0)


def _exit(stdout: _StdoutForwarder, code: int) -> None:
    stdout.drain()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    if _orphaned.is_set():
        _exit_orphaned()
    # os._exit: threads that user code or libraries left running must not keep us alive.
    os._exit(code)


if __name__ == "__main__":
    main()
