"""``python -m skyward.worker --node N``: one long-lived worker per node.

::

    fd 0 (pipe/SSH) ──> main thread, idle: reads its next call itself ──┐ runs it
                    └─> reader thread, while a call runs: the frames    │ result frames
                        that call waits for, Shutdown, stack requests   │
                        (who reads when: skyward.link.turns)             │
    private dup of fd 1 <─────────────── send lock <───────────────────┘
          ^                                  ^
          │                                  └── stdout forwarder: fd 1 is a pipe it forwards
          └─ the protocol stream               into Log frames (through plugins' filters),
                                               so print() and C-level writes never
                                               corrupt the protocol
    With concurrency > 1, the reader thread reads everything and queues calls for the
    executor threads (the main thread first).
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
import signal
import socket
import sys
import threading
import time
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from skyward.collections.proxies import LinkRequester, use_link
from skyward.link import protocol as proto
from skyward.link.protocol import RelayAbort, RelayPayload
from skyward.link.turns import Turns
from skyward.worker import hooks
from skyward.worker.calls import CallIO, decorating, feed_streaming_call, run_call
from skyward.worker.link import StdoutForwarder, WorkerLink
from skyward.worker.relay import Relays

if TYPE_CHECKING:
    from skyward.worker.processes import Processes

# How long a worker whose client vanished may spend leaving its contexts before it quits.
_ORPHAN_EXIT_TIMEOUT = 10.0
_orphaned = threading.Event()  # the client went away without a Shutdown


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class _Worker:
    """Runs calls on ``concurrency`` threads, the main thread first.

    Threads take turns reading the link (``turns``, the client's waiting callers' too). With
    one thread for calls (the default), the main thread reads its next call itself whenever
    it is idle, so a call and its result cross no thread on the way; the reader thread reads
    while a call runs: at once when the call waits for frames (a shared collection's reply,
    a stream's elements, a relayed payload: ``wake_reader``), else once the call has run
    ``LINGER`` seconds (a cancelling ``Shutdown``, a stack request). With more threads, the
    reader thread reads everything and queues the calls.

    Only the main thread's work can be interrupted (by SIGINT), so a cancelling shutdown
    stops a running call or a slow ``around_app`` entry there.
    """

    def __init__(self, link: WorkerLink, stdout: StdoutForwarder, concurrency: int) -> None:
        self.link = link
        self.stdout = stdout
        self.concurrency = concurrency
        self.processes: Processes | None = None  # executor="process": where calls run
        # sky.dict(...) and the rest, via the pool
        self.shared = LinkRequester(link.send, self.wake_reader)
        use_link(self.shared)
        self.calls: queue.SimpleQueue[tuple[proto.Call, proto.Parts] | None] = queue.SimpleQueue()
        self.turns = Turns(
            ready=link.pipe.ready,
            read=self._recv,
            dispatch=self._handle,
            unblock=link.pipe.unblock,  # a Shutdown read ahead with a call is read at once
        )
        if concurrency > 1:
            self.turns.want_reader()  # the reader thread reads everything
        self._lock = threading.Lock()  # guards: the fields below
        self.stopping = False
        self.cancelled = False
        self._main_busy = False
        # The main thread runs a call (not a plugin's start): what a stop handler is told,
        # so a stop during JAX's start is not reported as one in the middle of a call.
        self._main_call = False
        self._io: dict[int, CallIO] = {}  # streaming calls, by id, until their Result
        self._last_call = 0  # the highest call id received
        self._early_cancels: set[int] = set()  # Cancel frames that overtook their Call
        self._interruptible = _Interruptible(self)

    def start_reader(self) -> None:
        threading.Thread(target=self._read, name="skyward-reader", daemon=True).start()

    def interruptible(self) -> _Interruptible:
        """Main-thread work that a cancelling shutdown may interrupt (``with``)."""
        return self._interruptible

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
        """The reader thread (see ``turns``): ends once the Shutdown or EOF is read."""
        with contextlib.suppress(BaseException):  # the end was handled where it was read
            self.turns.run_reader()

    def wake_reader(self) -> None:
        """A call on the main thread waits for a frame (a shared collection's reply, a
        stream's elements, a relayed payload): have the reader thread read for it now."""
        self.turns.want_reader()

    def _next(self, main: bool) -> tuple[proto.Call, proto.Parts] | None:
        """The next call to run, or None: stop."""
        calls = self.calls
        if not main or self.concurrency > 1 or self.processes is not None:
            return calls.get()
        if not calls.empty():  # the reader thread read it while a call ran
            try:
                return calls.get_nowait()
            except queue.Empty:  # dropped by a cancelling shutdown meanwhile
                pass
        # Until a call is queued (a count, not 0), or the end: Nones from _stop. ``qsize``
        # is the queue's own C method: asked after every frame, it costs no Python frame.
        self.turns.wait_for(calls.qsize, None)
        return calls.get()

    def _recv(self) -> tuple[Any, proto.Parts]:
        """Read one frame (whoever's turn it is). At EOF, a broken pipe or a frame we cannot
        read (all the same: the client is gone), stop, then raise what happened."""
        try:
            return self.link.recv()
        except BaseException:
            self.shared.fail_all("the pool's client is gone")
            # Nobody will read results. Leave, but bounded, and take what the calls
            # started along (see _exit).
            _orphaned.set()
            orphan = threading.Timer(_ORPHAN_EXIT_TIMEOUT, _exit_orphaned)
            orphan.daemon = True
            orphan.start()
            self._stop(cancel=True)
            raise

    def _handle(self, message: object, parts: proto.Parts) -> None:
        if type(message) is proto.Call:
            if message.call_id > self._last_call:
                self._last_call = message.call_id
            if message.window or message.inputs:
                self._register(message)
            self.calls.put((message, parts))
        elif isinstance(message, proto.Cancel) and message.call_id > self._last_call:
            # The client may cancel a streaming call it is still sending.
            self._early_cancels.add(message.call_id)
        elif feed_streaming_call(self._io, message, parts):
            pass
        elif isinstance(message, RelayAbort) and self.link.relays is not None:
            self.link.relays.abort(message.token, message.node, message.reason)
        elif isinstance(message, RelayPayload) and self.link.relays is not None:
            self.link.relays.deliver(message.token, parts)
        elif isinstance(message, proto.SharedReply):
            self.shared.deliver(message, parts)
        elif isinstance(message, proto.StacksRequest):
            self.link.send(_stacks(message.request_id))
        elif isinstance(message, proto.Shutdown):
            self._stop(message.cancel, replaced=message.replaced)

    def _stop(self, cancel: bool, *, replaced: bool = False) -> None:
        """Shutdown or EOF: no more frames will be read. By the thread reading."""
        if replaced:
            hooks.replacing()  # before the contexts are left: plugins keep the node's state
        self.turns.end()
        with self._lock:
            self.stopping = True
            self.cancelled = cancel
            interrupt = cancel and self._main_busy
            in_call = interrupt and self._main_call
            streaming = list(self._io.values()) if cancel else []
        for call in streaming:  # wake calls waiting for the client's credit or elements
            call.cancel()
        hooks.stopping(in_call)  # before the interrupt: plugins may quiet what follows
        if cancel:
            _drop_queued(self.calls)
        for _ in range(self.concurrency):
            self.calls.put(None)
        if interrupt:
            # A real signal, not _thread.interrupt_main(): only a signal wakes the main
            # thread from a blocking call such as sleep() or a socket read.
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    def _register(self, message: proto.Call) -> None:
        """Give a streaming call its IO before any of its frames can arrive (reader)."""
        call = CallIO(self.link.send, message)
        with self._lock:
            self._io[message.call_id] = call
        if message.call_id in self._early_cancels:
            self._early_cancels.discard(message.call_id)
            call.cancel()

    def _execute(self, main: bool = False) -> None:
        lock, flush = self._lock, self.stdout.flush
        while (item := self._next(main)) is not None:
            message, parts = item
            call = None
            if message.window or message.inputs:  # a streaming call: _register gave it IO
                with lock:
                    call = self._io.get(message.call_id)
            relayed = message.relay is not None
            if call is not None or relayed:
                self.wake_reader()  # it waits for frames: credit, elements, a payload
            if main:  # _Interruptible's steps, written out: every call comes here
                with lock:
                    self._main_busy = self._main_call = not self.stopping
                try:
                    if relayed or self.processes is not None:
                        ok, payload = self._run(message, parts, call)
                    else:
                        ok, payload = run_call(message, parts, call, flush)  # the usual call
                finally:
                    with lock:
                        self._main_busy = self._main_call = False
            else:
                ok, payload = self._run(message, parts, call)
            if call is not None:
                with self._lock:
                    self._io.pop(message.call_id, None)
            del parts, item
            if not ok and self.cancelled:
                # Interrupted by a cancelling shutdown: the client fails this call with
                # PoolClosed itself; a KeyboardInterrupt sent back would read as Ctrl-C there.
                continue
            flush()
            try:
                self.link.send_result(message.call_id, ok, payload)
            except OSError:
                return
            del payload  # not kept alive while the next call waits or runs

    def _run(
        self, message: proto.Call, parts: proto.Parts, call: CallIO | None
    ) -> tuple[bool, proto.Parts]:
        relay, relays = message.relay, self.link.relays
        if relay is not None and relay.inbound and relays is not None:
            try:  # the payload comes from the node before this one in the relay
                parts = [*relays.take(relay.token)]
            except BaseException as exc:  # WorkerLost: a node before this one was lost
                return False, proto.encode_error(exc)
        if self.processes is not None and call is None:
            return self.processes.run(message, parts)
        return run_call(message, parts, call, self.stdout.flush)


class _Interruptible:
    """``with worker.interruptible():`` main-thread work that a cancelling shutdown may
    interrupt. A class, not a generator context manager: it wraps every call."""

    __slots__ = ("_worker",)

    def __init__(self, worker: _Worker) -> None:
        self._worker = worker

    def __enter__(self) -> None:
        worker = self._worker
        with worker._lock:
            worker._main_busy = not worker.stopping

    def __exit__(self, *exc: object) -> None:
        worker = self._worker
        with worker._lock:
            worker._main_busy = False


# Threads of the worker's own machinery, left out of stack reports: never where user code is.
_OWN_THREADS = (
    "skyward-reader",
    "skyward-stdout",
    "skyward-relay",
    "skyward-relay-in",
    "skyward-relay-out",
    "skyward-metrics",
)


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
    # A cancelling shutdown interrupts the running call with SIGINT. A client started in the
    # background (`nohup ... &`, a scheduler's job) ignores SIGINT, and we inherited that:
    # the call would run on, and teardown be skipped when the close kills us at its bound.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    # Keep the protocol on private fds, then give user code harmless fd 0 and 1.
    link = WorkerLink(os.dup(0), os.dup(1))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    stdout = StdoutForwarder(link)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "wb", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    # Line buffering holds a progress bar drawn with "\r", or dots printed one by one,
    # until a newline or 8 KiB: push what waits out a few times a second, as a terminal
    # shows it.
    threading.Thread(target=_flush_forever, name="skyward-flush", daemon=True).start()

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

    for path in message.sys_path:
        if path not in sys.path:
            sys.path.append(path)
    _info._set_current(message.info)
    _own_devices(message.info)
    if message.relay_key:
        info = message.info
        link.relays = Relays(
            info.global_worker_index,
            message.relay_key,
            info.peers[info.node],
            link.send,
            per_node=info.workers_per_node,
        )
    worker = _Worker(link, stdout, message.concurrency)
    sampler = None
    if message.metrics and message.info.worker == 0:  # one sampler per node
        from skyward.worker.metrics import Sampler

        sampler = Sampler(link.send, message.metrics)
        sampler.start()
    if message.executor == "process":
        from skyward.worker.processes import Processes

        worker.processes = Processes(message.concurrency, message.info, message.sys_path, parts)
        worker.wake_reader()  # the main thread only waits for the processes' results
    worker.start_reader()
    with ExitStack() as stack:
        try:
            plugins = proto.loads(parts)
            if plugins:  # without plugins, a worker loads no Plugin (and no pydantic)
                from skyward._plugin import enter_around_app

                decorating.extend(p for p in plugins if p.decorate is not None)
                with worker.interruptible():
                    enter_around_app(stack, plugins, message.info)
        except BaseException as exc:
            stdout.flush()
            link.send(proto.StartFailed(), proto.encode_error(exc))
            stack.close()
            _exit(stdout, 1)
        del parts
        link.send(proto.Ready(relay_port=link.relays.port if link.relays else None))
        worker.serve()
        if worker.processes is not None:
            worker.processes.close(kill=worker.cancelled)
    if sampler is not None:
        sampler.stop()  # no Sample after Bye
    with contextlib.suppress(OSError):  # the client may be gone already
        link.send(proto.Bye())
    _exit(stdout, 0)


def _own_devices(info: Any) -> None:
    """With several workers per node, each sees only the GPUs it owns (``info.devices``):
    ``CUDA_VISIBLE_DEVICES`` is set before any plugin or call can start CUDA. The indices
    are among the GPUs this process was given, so a list a scheduler set (Slurm's) is
    narrowed, not replaced. The node's own list is kept in
    ``SKYWARD_NODE_CUDA_VISIBLE_DEVICES`` (empty: every GPU), for what serves the whole node
    (the mps plugin's daemon)."""
    if info.workers_per_node == 1 or not info.devices:
        return
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["SKYWARD_NODE_CUDA_VISIBLE_DEVICES"] = given or ""
    visible = given.split(",") if given else [str(i) for i in range(info.accelerators)]
    owned = [visible[i] for i in info.devices if i < len(visible)]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(owned)


def _flush_forever(every: float = 0.2) -> None:
    while True:
        time.sleep(every)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a stream a user replaced or closed
                stream.flush()


def _exit(stdout: StdoutForwarder, code: int) -> None:
    stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    if _orphaned.is_set():
        _exit_orphaned()
    # os._exit: threads that user code or libraries left running must not keep us alive.
    os._exit(code)


if __name__ == "__main__":
    main()
