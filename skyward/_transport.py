"""``Transport``: the byte streams a channel (``_channel``) has to one worker process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from skyward import _protocol as proto


class Transport(Protocol):
    """Byte streams to one worker process, called by the channel's threads, and by a
    caller's thread for a small frame when ``can_write_now`` says it will not block."""

    def write(self, parts: Sequence[proto.Part]) -> None: ...
    def readinto(self, buffer: memoryview) -> int | None: ...
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
        stream), waiting up to ``timeout`` seconds (None: until it would). A transport
        that cannot tell raises ``NotImplementedError``: its channel's reader thread then
        reads every frame (see ``_turns``)."""
        ...

    def can_write_now(self, nbytes: int) -> bool:
        """Whether ``write`` of ``nbytes`` (≤ 4 KiB) would return without waiting. The
        caller's own thread writes small frames only then: it may hold the pool's lock."""
        ...

    def link_lost(self) -> str | None:
        """Why the stream ended if the link to the worker broke rather than the worker ending
        (a dropped SSH connection), else None."""
        ...

    def close(self) -> None: ...
