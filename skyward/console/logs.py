"""Logs that stay: every pool writes its nodes' output and its own events to a directory of
its own, so that what a run printed can be read after the terminal that ran it is gone.

::

    ~/.cache/skyward/pools/<pool>/          ($XDG_CACHE_HOME, or $SKYWARD_LOG_DIR/<pool>)
        pool.json      name, provider, nodes, state (starting, running, failed, closed),
                       started/ended times, this client's pid
        events.log     phases, provider lines, status events (losses, restarts, costs)
        node-N.log     node N's stdout and stderr, line by line, timestamped

Each file is bounded (``MAX_BYTES``, then rotated once to ``.1``) and only the newest
``KEEP_POOLS`` pool directories are kept, so a long-lived machine never fills up. Values
that look secret (an image's ``env`` entries named like a token, key, secret or password)
are replaced by ``***`` in every line before it is written; keys and tokens Skyward itself
handles are never given to the console in the first place.

Writing never raises into the pool: a full disk or a read-only home stops the logging (with
one warning on the ``skyward`` logger), not the pool.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

MAX_BYTES = 20 * 1024 * 1024  # per file, before it is rotated to ``.1``
KEEP_POOLS = 50  # pool directories kept; the oldest go first
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")

_logger = logging.getLogger("skyward")


def logs_root(env: Mapping[str, str] | None = None) -> Path:
    """Where pools keep their logs: ``$SKYWARD_LOG_DIR``, else the user's cache directory."""
    env = os.environ if env is None else env
    if env.get("SKYWARD_LOG_DIR"):
        return Path(env["SKYWARD_LOG_DIR"]).expanduser()
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "skyward" / "pools"


def secrets_of(env: Mapping[str, str]) -> list[str]:
    """The values of ``env`` whose names say they are secret (at least 4 characters: a
    shorter value would be redacted out of ordinary text)."""
    return [v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= 4]


class PoolLog:
    """The log directory of one pool. Thread-safe: reader threads of every node write here."""

    def __init__(
        self,
        directory: Path,
        *,
        meta: Mapping[str, Any],
        secrets: Iterable[str] = (),
    ) -> None:
        self.directory = directory
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._lock = threading.Lock()  # guards: _files, _meta, _broken, the files themselves
        self._files: dict[str, Any] = {}
        self._meta: dict[str, Any] = dict(meta)
        self._broken = False

    @classmethod
    def open(
        cls,
        pool: str,
        *,
        meta: Mapping[str, Any],
        secrets: Iterable[str] = (),
        root: Path | None = None,
    ) -> PoolLog | None:
        """A fresh directory for ``pool`` (a previous pool of the same name is moved
        aside), or None when no directory can be made here (logging is then off).
        ``root``: where (``sky.App``'s directory); by default ``logs_root()``."""
        root = logs_root() if root is None else root
        directory = root / _SAFE_NAME.sub("_", pool)
        try:
            root.mkdir(parents=True, exist_ok=True)
            if directory.exists():
                directory.rename(directory.with_name(f"{directory.name}.{time.time_ns()}"))
            directory.mkdir(mode=0o700)
            _prune(root, keep=KEEP_POOLS)
        except OSError as exc:
            _logger.warning("skyward: pool logs are off: cannot write under %s (%s)", root, exc)
            return None
        log = cls(directory, meta={"name": pool, "pid": os.getpid(), **meta}, secrets=secrets)
        log.state("starting")
        return log

    # ── what the console writes ──────────────────────────────────────────────────────────

    def event(self, text: str) -> None:
        self._append("events.log", [text])

    def output(self, node: int, stream: str, lines: Iterable[bytes]) -> None:
        prefix = "err| " if stream == "stderr" else "out| "
        self._append(
            f"node-{node}.log",
            [prefix + line.decode("utf-8", "backslashreplace") for line in lines],
        )

    def state(self, state: str, **extra: Any) -> None:
        """The pool's state in ``pool.json``, with the time it was reached."""
        now = time.time()
        with self._lock:
            self._meta["state"] = state
            self._meta.setdefault("started", now)
            if state in ("closed", "failed"):
                self._meta["ended"] = now
            self._meta.update(extra)
            text = json.dumps(self._meta, indent=2, default=str)
            self._guarded(lambda: _write_atomic(self.directory / "pool.json", text))
        self._append("events.log", [f"pool {state}"])

    def close(self) -> None:
        with self._lock:
            for handle in self._files.values():
                handle.close()
            self._files.clear()

    # ── inside ───────────────────────────────────────────────────────────────────────────

    def _append(self, name: str, lines: Iterable[str]) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        text = "".join(f"{stamp} {self._redact(line)}\n" for line in lines)
        if not text:
            return
        with self._lock:
            self._guarded(lambda: self._write(name, text))

    def _write(self, name: str, text: str) -> None:
        """Lock held."""
        handle = self._files.get(name)
        path = self.directory / name
        if handle is None:
            handle = self._files[name] = open(path, "a", encoding="utf-8")  # noqa: SIM115
        handle.write(text)
        handle.flush()
        if handle.tell() > MAX_BYTES:
            handle.close()
            os.replace(path, path.with_name(name + ".1"))
            self._files[name] = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def _guarded(self, write: Any) -> None:
        """Lock held. A failed write turns logging off, once, with a warning."""
        if self._broken:
            return
        try:
            write()
        except OSError as exc:
            self._broken = True
            _logger.warning("skyward: pool logs stopped: %s (%s)", self.directory, exc)

    def _redact(self, line: str) -> str:
        for secret in self._secrets:
            line = line.replace(secret, "***")
        return line


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".part")
    partial.write_text(text)
    os.replace(partial, path)


def _prune(root: Path, *, keep: int) -> None:
    """Remove the oldest pool directories beyond ``keep``."""
    pools = sorted(
        (p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for old in pools[keep:]:
        shutil.rmtree(old, ignore_errors=True)


# ── reading them back (skyward logs, skyward ls) ─────────────────────────────────────────


def recent_pools(root: Path | None = None) -> list[dict[str, Any]]:
    """Every pool with logs here, newest first: its ``pool.json`` and its directory."""
    root = logs_root() if root is None else root
    found: list[dict[str, Any]] = []
    if not root.is_dir():
        return found
    directories = list(root.iterdir())
    for directory in directories:
        try:
            meta = json.loads((directory / "pool.json").read_text())
        except (OSError, ValueError):
            if directory.is_dir() and directory.name.startswith("app-"):
                directories.extend(directory.iterdir())  # a sky.App's pools
            continue
        meta["directory"] = str(directory)
        if meta.get("state") in ("starting", "running") and not _alive(meta.get("pid")):
            meta["state"] = "gone"  # its client ended without closing it (killed, crashed)
        found.append(meta)
    found.sort(key=lambda m: float(m.get("started") or 0), reverse=True)
    return found


def follow(path: Path, *, poll: float = 0.5, stop: threading.Event | None = None) -> Iterator[str]:
    """The lines of ``path`` from its start, then new ones as they are written (until
    ``stop`` is set)."""
    position = 0
    while True:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                handle.seek(position)
                for line in handle:
                    yield line.rstrip("\n")
                position = handle.tell()
        except FileNotFoundError:
            pass
        if stop is not None and stop.wait(poll):
            return
        if stop is None:
            time.sleep(poll)


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
