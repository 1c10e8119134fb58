"""``pool.profile(directory)``: a ``jax.profiler`` trace of every node, brought to the client.

::

    with pool.profile("traces/"):        enter: broadcast start_trace  -> each node traces into
        train(100) @ pool                       a temporary directory of its own
                                          exit:  broadcast stop_trace   -> each node stops, sends
    traces/node-0/plugins/profile/<run>/       its files back, and deletes its directory;
        <host>.xplane.pb                          the client writes them under node-N/
        <host>.trace.json.gz
        perfetto_trace.json.gz

Each ``node-N`` (``node-N-worker-W`` with several workers per node) is a log directory
TensorBoard's profile plugin and XProf read
(``tensorboard --logdir traces/``); ``perfetto_trace.json.gz`` opens in ui.perfetto.dev. On
GPU nodes the same trace holds the device's kernels (jax's profiler uses CUPTI there).

The two broadcasts are ordinary calls: they queue behind calls already running, and every
call between them is traced. The worker side runs ``start_trace`` and ``stop_trace`` from
``skyward.worker.profile``, which travels with skyward itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from skyward.worker.profile import start_trace, stop_trace


class _Pool(Protocol):
    """What a profile needs of a pool (a ``ComputePool``; no import of it, no circle)."""

    def broadcast(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]: ...


class Profile:
    """A context manager: trace every node of ``pool`` for the block, then fetch the traces.

    After the block, ``files`` lists what was written on the client, by node. If the block
    raises, the traces are still fetched when the pool can; if that fails too, the block's
    exception is the one raised, with a note saying why the traces are missing.
    """

    def __init__(
        self,
        pool: _Pool,
        directory: str | os.PathLike[str],
        label: Callable[[int], str] = lambda rank: f"node {rank}",
    ) -> None:
        self.pool = pool
        self.directory = Path(directory)
        self._label = label  # how the pool names worker ``rank``: its directory's name
        self.files: dict[int, list[Path]] = {}

    def __enter__(self) -> Profile:
        try:
            self.pool.broadcast(start_trace)
        except BaseException:
            with contextlib.suppress(Exception):  # the nodes that did start stop again
                self.pool.broadcast(stop_trace)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            traces = self.pool.broadcast(stop_trace)
        except Exception as error:
            if exc is None:
                raise
            exc.add_note(f"pool.profile: the traces could not be fetched: {error!r}")
            return
        for node, files in enumerate(traces):
            written = self.files.setdefault(node, [])
            for relative, data in sorted(files.items()):
                path = self.directory / self._label(node).replace(" ", "-") / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                written.append(path)


def profile(pool: _Pool, directory: str | os.PathLike[str], label: Callable[[int], str]) -> Profile:
    """``with profile(pool, "traces/"):`` traces every node; see ``Profile``."""
    return Profile(pool, directory, label)
