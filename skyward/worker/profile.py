"""``pool.profile``, the node's side: start ``jax.profiler`` into a temporary directory, and
later stop it and hand its files back (``skyward.pool.profile`` is the client's side, which
broadcasts these two functions; they reach the worker by reference, so a worker loads this
module and nothing of the pool)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

# On a worker: where this process's trace is being written, between the two broadcasts.
_trace_dir: str | None = None


def start_trace() -> str:
    """On a worker: start ``jax.profiler`` into a new temporary directory; its hostname."""
    global _trace_dir
    import jax

    if _trace_dir is not None:
        raise RuntimeError("a profile is already running on this node; profiles do not nest")
    directory = tempfile.mkdtemp(prefix="skyward-profile-")
    try:
        jax.profiler.start_trace(directory, create_perfetto_trace=True)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    _trace_dir = directory
    return socket.gethostname()


def stop_trace() -> dict[str, bytes]:
    """On a worker: stop the trace, and return its files by relative path (then delete them).

    Nothing running (the start failed on this node) is an empty result, not an error, so
    that the other nodes' traces still come back.
    """
    global _trace_dir
    directory, _trace_dir = _trace_dir, None
    if directory is None:
        return {}
    import jax

    try:
        jax.profiler.stop_trace()  # type: ignore[no-untyped-call]
        files: dict[str, bytes] = {}
        for root, _, names in os.walk(directory):
            for name in names:
                path = os.path.join(root, name)
                files[os.path.relpath(path, directory)] = Path(path).read_bytes()
        return files
    finally:
        shutil.rmtree(directory, ignore_errors=True)
