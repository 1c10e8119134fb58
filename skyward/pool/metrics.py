"""The client's end of ``sky.metrics``: each node's samples, kept, written down and shown.

::

    worker's Sampler ⇢ Sample frame ⇢ Channel (reader thread) ⇢ pool._frame
        ⇢ PoolMetrics.record(node, sample) ─┬─ rows, in memory (pool.metrics())
                                            ├─ metrics.jsonl in the pool's log directory
                                            │   (skyward logs --plot POOL, after the run)
                                            └─ on_sample(node, values): the console's line

A row is one node's sample: ``{"node": 0, "time": <epoch seconds>, "cpu": 12.5, ...}``; a
value a node did not read that tick is absent. Rows are kept up to ``MAX_ROWS`` (the oldest
go first: a week-long run at 2 s on 64 nodes would otherwise hold millions); the file keeps
them all, bounded by the log directory's own limit. From ``close()`` on nothing more is
recorded, so samples still in flight when the workers stop are dropped.
"""

from __future__ import annotations

import collections
import importlib
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from skyward.console.metrics_plot import columns
from skyward.link import protocol as proto

MAX_ROWS = 200_000
FILE_NAME = "metrics.jsonl"
_log = logging.getLogger("skyward")
_TRACE = 5  # console.handlers.TRACE, without importing the handlers here


class PoolMetrics:
    """Thread-safe: every node's reader thread records here; the user reads."""

    def __init__(self, on_sample: Callable[[int, dict[str, float]], None] | None = None) -> None:
        self._on_sample = on_sample
        self._lock = threading.Lock()  # guards: _rows, _file, _closed
        self._rows: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_ROWS)
        self._file: IO[str] | None = None
        self._closed = False

    def open(self, directory: Path | None) -> None:
        """Append rows to ``metrics.jsonl`` in ``directory`` from now on (None: no file)."""
        if directory is None:
            return
        try:
            handle = (directory / FILE_NAME).open("a", encoding="utf-8")
        except OSError as exc:
            _log.warning("skyward: metrics are not written to %s: %s", directory, exc)
            return
        with self._lock:
            self._file = handle

    def record(self, node: int, sample: proto.Sample) -> None:
        row: dict[str, Any] = {"node": node, "time": sample.time, **sample.values}
        with self._lock:
            if self._closed:
                return
            self._rows.append(row)
            if self._file is not None:
                try:
                    self._file.write(json.dumps(row) + "\n")
                    self._file.flush()
                except (OSError, ValueError) as exc:  # a full disk: stop writing, not the pool
                    _log.warning("skyward: metrics are no longer written: %s", exc)
                    self._file = None
        _log.log(_TRACE, "node %d metrics %s", node, sample.values)
        if self._on_sample is not None:
            self._on_sample(node, sample.values)

    def close(self) -> None:
        """Record nothing more. Idempotent."""
        with self._lock:
            self._closed = True
            handle, self._file = self._file, None
        if handle is not None:
            handle.close()

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._rows)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (a line cut short by a crash is skipped)."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def as_table(rows: list[dict[str, Any]]) -> Any:
    """A pandas DataFrame (columns ``node``, ``time`` as a timestamp, one per metric) when
    pandas is installed, else the rows themselves."""
    try:
        pd = importlib.import_module("pandas")  # optional: no stubs, and not a dependency
    except ImportError:
        return rows
    frame = pd.DataFrame(rows, columns=columns(rows))
    frame["time"] = pd.to_datetime(frame["time"], unit="s")
    return frame
