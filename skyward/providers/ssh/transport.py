"""A worker over an SSH exec channel: the ``Transport`` the channel reads and writes.

The protocol goes over the channel's stdin and stdout; its stderr is the worker's stderr,
after the launch shell's one line naming the process group to kill. Shared by every provider
that reaches its machines over SSH (``hosts``).
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from skyward._errors import ProvisionError
from skyward.link import protocol as proto
from skyward.providers.ssh.connection import Connection

if TYPE_CHECKING:
    import paramiko

_PID_WAIT = 5.0  # seconds kill() waits for a just-spawned worker's PID line
_CHUNK = 1 << 18  # large buffers go out in slices: paramiko copies each send into a packet


class _ChannelReader(io.RawIOBase):
    """A paramiko channel's stdout as a raw stream, for ``io.BufferedReader``."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._channel.recv(len(view))
        view[: len(data)] = data
        return len(data)


class SSHTransport:
    """A worker over an SSH exec channel: the protocol on stdin/stdout, stderr as itself."""

    # paramiko's own thread reads the socket and wakes whoever waits on the channel: a
    # caller reading its own result would save no hand-off, so the channel's reader thread
    # reads every frame (see Transport.caller_reads).
    caller_reads = False

    def __init__(self, connection: Connection, channel: paramiko.Channel, marker: str) -> None:
        self._connection = connection
        self._channel = channel
        self._stdout = io.BufferedReader(_ChannelReader(channel), 1 << 16)
        self._marker = marker.encode() + b" "
        self._pid: int | None = None
        self._pid_known = threading.Event()  # set once the PID line is read, or never comes
        self._stderr_partial = b""
        self._killed = False
        self.finished = False

    def write(self, parts: Sequence[proto.Part]) -> None:
        if self._channel.closed:
            raise BrokenPipeError("the worker's SSH channel is closed")
        # SSH wraps every send in its own packet: small parts (a frame, a batch of frames)
        # are gathered into one send; large buffers go in slices of _CHUNK, since paramiko
        # copies each send. (Handing it memoryviews instead measured no faster: the cipher
        # is the cost.)
        pending = bytearray()
        try:
            for part in parts:
                view = memoryview(part).cast("B")
                if len(view) < _CHUNK:
                    pending += view
                    if len(pending) < _CHUNK:
                        continue
                if pending:
                    self._channel.sendall(bytes(pending))
                    pending.clear()
                if len(view) >= _CHUNK:
                    for start in range(0, len(view), _CHUNK):
                        self._channel.sendall(bytes(view[start : start + _CHUNK]))
            if pending:
                self._channel.sendall(bytes(pending))
        except Exception as exc:
            import paramiko  # loaded already; imported here to keep it off the hot path

            if isinstance(exc, paramiko.SSHException):  # a stalled key exchange, a dead link
                raise BrokenPipeError(f"the worker's SSH channel failed: {exc}") from exc
            raise

    def readinto(self, buffer: memoryview) -> int | None:
        return self._stdout.readinto(buffer)

    def read_frame(self) -> tuple[Any, proto.Parts]:
        return proto.read_frame(self._stdout.readinto)

    def ready(self, timeout: float | None) -> bool:
        raise NotImplementedError("never called: caller_reads is False")

    def unblock(self) -> None:
        raise NotImplementedError("never called: caller_reads is False")

    def read_ahead(self) -> bool:
        raise NotImplementedError("never called: caller_reads is False")

    def read_stderr(self) -> bytes:
        while True:
            data: bytes = self._channel.recv_stderr(1 << 16)
            if not data:
                self.finished = True
                self._pid_known.set()
                rest, self._stderr_partial = self._stderr_partial, b""
                return rest  # b"" once nothing is left: the end of the stream
            if self._pid_known.is_set():
                return data
            # Until the launch command's PID line: pass whole lines on (a login shell's own
            # messages), and keep that one line off the output.
            self._stderr_partial += data
            out = b""
            while not self._pid_known.is_set() and b"\n" in self._stderr_partial:
                line, self._stderr_partial = self._stderr_partial.split(b"\n", 1)
                if line.startswith(self._marker):
                    self._pid = int(line[len(self._marker) :].split()[0])
                    self._pid_known.set()
                else:
                    out += line + b"\n"
            if self._pid_known.is_set():
                out, self._stderr_partial = out + self._stderr_partial, b""
            if out:
                return out

    def write_now(self, frame: bytes) -> bool:
        # The peer's receive window has room, so sendall() will not wait for the remote side
        # to reopen it (it still encrypts and writes to the socket in this thread). Closed:
        # write() raises at once, which is what the caller handles.
        if not self._channel.closed and self._channel.out_window_size < len(frame):
            return False
        self.write([frame])
        return True

    def _exited(self) -> bool:
        # The host reported an exit status. (paramiko's exit_status_ready() and status_event
        # also fire for a channel closed because its connection died, which is no exit;
        # exit_status stays -1 until the host sends one.)
        return int(self._channel.exit_status) >= 0

    def link_lost(self) -> str | None:
        if self._exited() or self._connection.alive:
            return None
        return (
            f"the SSH connection to {self._connection.target} dropped (the host stopped "
            f"answering, or the network between went down)"
        )

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while not self._channel.exit_status_ready():
            if self._channel.closed or not self._connection.alive:
                return None  # the link ended: the status is unknown
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        status = self._channel.recv_exit_status()
        return None if status < 0 else _signed_status(status)

    @property
    def pid(self) -> int | None:
        """The worker's launch shell on the host, which leads its process group."""
        return self._pid

    @property
    def stranded(self) -> bool:
        """Started, not yet killed, and its link is gone: only a new connection can stop it."""
        return (
            self._pid is not None
            and not self._killed
            and not self._exited()
            and not self._connection.alive
        )

    def kill(self, connection: Connection | None = None) -> None:
        """Kill the worker's process group on the host; harmless once it is gone.

        ``connection`` replaces a dropped one (the node reconnected to stop its workers).
        """
        connection = connection or self._connection
        # A worker closed right after it was spawned: its PID line may still be in flight.
        self._pid_known.wait(_PID_WAIT)
        if self._killed or self._pid is None or not connection.alive:
            return
        self._killed = True
        try:
            # The POSIX spelling: dash, /bin/sh on Debian and Ubuntu, rejects `kill -KILL --`.
            connection.run(
                f"kill -s KILL -- -{self._pid} 2>/dev/null; "
                f"kill -s KILL {self._pid} 2>/dev/null; true",
                timeout=10.0,
            )
        except (ProvisionError, OSError):
            pass  # the link went down meanwhile: the host's sshd ends the session

    def close(self) -> None:
        self._channel.close()


def _signed_status(status: int) -> int:
    # A shell reports death by signal N as 128 + N; the Transport contract says -N.
    return -(status - 128) if 128 < status < 160 else status
