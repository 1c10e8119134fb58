"""What the jax plugin keeps off the user's terminal, on the worker.

::

    fd 1 ── gloo: "[Gloo] Rank N is connected to ..." ──> GlooFilter ──> Log frames
    fd 2 ── JAX's logs ──> the client, until the pool stops the rank mid-call:
                           then a file on the node (quiet_when_stopped), and one line

Both are off with ``sky.plugins.jax(verbose=True)``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from skyward._info import InstanceInfo
from skyward.worker import hooks

# gloo prints one line per rank and per communicator when it connects ("[Gloo] Rank 3 is
# connected to 7 peer ranks. Expected number of connected peer ranks is : 7") on
# std::cout, piece by piece, from one thread per local device at once. The pieces of two
# lines get mixed ("[Gloo] Rank 4[Gloo] Rank  is connected to 57 is connected to ..."), and
# a flush by another thread can write part of a line, even in front of the user's own
# output. So the filter works on pieces, not lines.
_WORD = (
    rb"(?:\[Gloo\] Rank | is connected to | peer ranks\. "
    rb"|Expected number of connected peer ranks is : )"
)
# A line made only of pieces (and the empty lines a split message leaves after it).
_LINE = re.compile(rb"(?m)^(?:" + _WORD + rb"|\d+)*" + _WORD + rb"(?:" + _WORD + rb"|\d+)*\n+")
# A piece inside someone else's line, with the number it announces. "[Gloo] Rank 0 is NOT
# connected to: [2]", gloo's line for a missing peer, is kept whole.
_PIECE = re.compile(_WORD + rb"\d*+(?! is NOT)")
_ANY_WORD = re.compile(_WORD)
_ENDS_IN_PIECE = re.compile(_WORD + rb"\d*\Z")
_LEADING_DIGITS = re.compile(rb"\A\d+")
_LEADING_NEWLINES = re.compile(rb"\A\n+")


class GlooFilter:
    """A stdout filter that drops gloo's connection lines, whole or in pieces.

    Pieces often come one per chunk ("[Gloo] Rank ", then "5", then " is connected to ",
    ...), so it remembers how the last chunk ended: right after a piece, the next chunk's
    leading digits are that piece's number and its leading newlines end that message;
    right after a dropped line, the next chunk's leading newlines are that line's. Called
    from the worker's one forwarder thread only.
    """

    def __init__(self) -> None:
        self._after_piece = False
        self._after_line = False

    def __call__(self, data: bytes) -> bytes:
        if self._after_piece:
            data = _LEADING_DIGITS.sub(b"", data)
        if self._after_line or self._after_piece:
            data = _LEADING_NEWLINES.sub(b"", data)
        if not data:
            return data
        if not _ANY_WORD.search(data):
            self._after_piece = self._after_line = False  # something else: the message is over
            return data
        lines = list(_LINE.finditer(data))
        self._after_line = bool(lines) and lines[-1].end() == len(data)
        self._after_piece = bool(_ENDS_IN_PIECE.search(data))
        return _PIECE.sub(b"", _LINE.sub(b"", data))


KEEP_LOGS = 32


def log_dir() -> str:
    """Where what JAX logs while the pool stops it goes, on each node, newest kept: the
    node's cache (``$XDG_CACHE_HOME``, else ``~/.cache``), beside the pools' logs."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "skyward", "jax-logs")


def stop_log_path(info: InstanceInfo, node: int | str | None = None) -> str:
    """Where a node's JAX log goes once the pool stops it (``node``: another's)."""
    pool = re.sub(r"[^A-Za-z0-9_.-]", "_", info.pool or "pool")
    rank = info.node if node is None else node
    # Several workers on a node each have their own file.
    worker = f"-worker{info.worker}" if info.workers_per_node > 1 and node is None else ""
    return os.path.join(log_dir(), f"{pool}-node{rank}{worker}.log")


@contextmanager
def quiet_when_stopped(info: InstanceInfo) -> Iterator[None]:
    """When the pool stops this worker, send JAX's stderr to a file on this node.

    Ranks stopped mid-collective leave it at different moments; the ones still inside wait
    for the others, and jax's coordination service ends them with about 40 lines of fatal
    errors and C++ stack traces each, which say nothing the user does not already know: the
    pool stopped them. The same happens to a rank that had finished when the pool restarts
    a gang whose other ranks hung (its shutdown barrier fails). So from the moment the pool
    asks a worker to stop, fd 2 is a file (``stop_log_path``, under ``log_dir()``, with the
    newest ``KEEP_LOGS`` kept) and node 0 says so in one line when it was stopped mid-call.
    An empty file is removed when the worker leaves; a rank that jax aborts leaves its file
    behind, for whoever wants the details.
    """
    path = stop_log_path(info)
    diverted = False

    def divert(running: bool) -> None:
        nonlocal diverted
        if diverted:
            return
        if running and info.is_head:
            os.write(
                2,
                f"skyward: stopping JAX in the middle of a call; what JAX logs while it "
                f"stops goes to {stop_log_path(info, '<N>')} on node N "
                f"(sky.plugins.jax(verbose=True) shows it here)\n".encode(),
            )
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _prune(os.path.dirname(path), keep=KEEP_LOGS - 1)
            log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        except OSError:
            return  # nowhere to put it: JAX's logs reach the client as they are
        os.dup2(log, 2)
        os.close(log)
        diverted = True

    with hooks.on_stop(divert):
        yield
    if diverted and os.path.exists(path) and os.path.getsize(path) == 0:
        os.remove(path)


def _prune(directory: str, *, keep: int) -> None:
    """Remove all but the ``keep`` newest logs in ``directory``."""
    try:
        entries = [os.path.join(directory, name) for name in os.listdir(directory)]
        logs = sorted(
            (e for e in entries if e.endswith(".log")), key=os.path.getmtime, reverse=True
        )
    except OSError:
        return
    for old in logs[keep:]:
        try:
            os.remove(old)
        except OSError:
            pass
