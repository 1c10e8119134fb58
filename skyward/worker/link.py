"""The worker's end of its link: the protocol on private descriptors, and fd 1 turned into
``Log`` frames."""

from __future__ import annotations

import os
import select
import sys
import threading
from typing import Any

from skyward.link import protocol as proto
from skyward.link.turns import PipeReader
from skyward.worker import hooks
from skyward.worker.relay import Relays


class WorkerLink:
    """The worker's end of the protocol. ``send`` is thread-safe; ``recv`` is called by one
    thread at a time, whichever's turn it is to read (``skyward.link.turns``)."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.pipe = PipeReader(in_fd)
        self._out_fd = out_fd
        self._send_lock = threading.Lock()  # guards: one whole frame at a time on out_fd
        self.relays: Relays | None = None  # set at Start when the pool relays broadcasts

    def send(self, message: object, payload: proto.Parts | None = None) -> None:
        parts = proto.frame(message, payload)
        with self._send_lock:
            proto.write_parts(self._out_fd, parts)

    def send_result(self, call_id: int, ok: bool, payload: proto.Parts) -> None:
        """``send(proto.Result(call_id, ok), payload)``, framed without making the message:
        every call ends here."""
        parts = proto.frame_result(call_id, ok, payload)
        with self._send_lock:
            proto.write_parts(self._out_fd, parts)

    def recv(self) -> tuple[Any, proto.Parts]:
        pipe = self.pipe
        frame = pipe.read_packed()  # a plain call, whole: every call's frame (never relayed)
        if frame is not None:
            return frame
        message, lengths = pipe.read_message()
        relay = getattr(message, "relay", None)
        if relay is not None and relay.chain and self.relays is not None:
            # A broadcast's payload, passed on down the relay chain as it arrives (relay).
            parts = self.relays.forward_from(relay.token, relay.chain, lengths, pipe.readinto)
            return message, [*parts]
        if len(lengths) == 1:  # the usual frame: one pickle
            return message, [pipe.read_exact(lengths[0])]
        return message, [pipe.read_exact(n) for n in lengths]


class StdoutForwarder:
    """Moves what fd 1 receives into ``Log`` frames, and can flush it on demand.

    ``flush`` runs before every result is sent, so a call's output reaches the client
    before its return value does.
    """

    def __init__(self, link: WorkerLink) -> None:
        self._link = link
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 1)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._fd = read_fd
        pending = select.poll()
        pending.register(read_fd, select.POLLIN)
        self._poll = pending.poll  # bound once: asked before every result
        self._lock = threading.Lock()  # guards: reading the pipe and sending what was read
        self._fflush: Any = None  # libc's fflush, found by the first flush
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

    def flush(self) -> None:
        try:
            sys.stdout.flush()
        except Exception:  # a stream the user replaced or closed
            pass
        # printf() from C extensions is block-buffered on a pipe; flush it like Python's.
        fflush = self._fflush
        if fflush is None:
            import ctypes

            fflush = self._fflush = ctypes.CDLL(None).fflush
        fflush(None)
        # Output still in the pipe, or read by the forwarder thread and being sent (it
        # reads and sends holding the lock): both must go before the result. A poll is
        # cheaper than a read that fails, and most calls print nothing: then neither holds,
        # and the lock is not taken.
        pending: object
        try:
            pending = self._poll(0)  # events, if any: a list, true when not empty
        except RuntimeError:  # another thread polls it now (concurrency > 1): look under the lock
            pending = True
        if pending or self._lock.locked():
            with self._lock:
                self._forward()
