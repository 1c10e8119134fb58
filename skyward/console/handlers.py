"""``sky.LogConfig``: where the ``skyward`` logger's records go while a pool is open.

Skyward logs through the standard ``logging`` module only, to the logger named ``skyward``:
phases, provider lines, losses, restarts and costs at ``INFO``, each node's bootstrap lines
at ``DEBUG``. With no ``logging=`` a pool adds nothing, and the records go wherever the
program's own logging configuration sends them. ``ComputePool(logging=LogConfig(...))``
adds, from ``start()`` until the pool is closed (on every path, a failed start included)::

    logger "skyward"  ── level: LogConfig.level (never above what it was: nothing the
     │                   program showed before is hidden)
     ├─ file handler   LogConfig.file, rotated by size or time, ``retention`` old files
     ├─ stderr handler LogConfig.console; the stream is looked up at each record, so a
     │                 live progress table (rich) or a notebook's stream receives it
     └─ records below the program's own level stay out of the program's handlers (they
        reach only these), so ``level="DEBUG"`` does not flood a ``basicConfig`` terminal

The logger's own state is kept here, for every pool open at once: each install and removal
recomputes it from the state before the first pool and the configs still open, so pools
closed in any order leave the logger as they found it. Records are not split by pool: two
pools open at once with ``logging=`` both see each other's records.
"""

from __future__ import annotations

import logging
import logging.handlers
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

LogLevel = Literal["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
# skyward 0.5's level below DEBUG: the wire's frames and each sample of live metrics. Named on
# the logging module once, when this module is imported, so "%(levelname)s" prints it.
TRACE = 5
logging.addLevelName(TRACE, "TRACE")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB)\s*$", re.IGNORECASE)
_TIME = re.compile(r"^\s*(\d+)\s*(minute|hour|day|week)s?\s*$", re.IGNORECASE)
_BYTES = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}
_WHEN = {"minute": "M", "hour": "H", "day": "D", "week": "D"}


class LogConfig(BaseModel):
    """Where the ``skyward`` logger's records go while the pool is open.

    - ``level``: the least severe record kept (``"DEBUG"`` adds each node's bootstrap lines;
      ``"TRACE"``, below it, each live metrics sample as it arrives).
    - ``file``: a file to append them to (made absolute now, its directory made at start);
      ``None``: none. Every pool also keeps its own logs (``skyward logs``), whatever this
      says.
    - ``console``: also write them to stderr. A program that already shows the ``skyward``
      logger there (``logging.basicConfig``) sees them twice: leave it ``False`` then.
    - ``rotation``: when the file starts afresh: a size (``"50 MB"``) or a period
      (``"1 day"``); ``retention``: how many old files are kept.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", title="sky.LogConfig")

    level: LogLevel = "INFO"
    file: Path | None = None
    console: bool = True
    rotation: str = "50 MB"
    retention: int = Field(default=10, ge=0, le=1000)

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, level: Any) -> Any:
        if isinstance(level, int) and not isinstance(level, bool):
            return logging.getLevelName(level)  # logging.DEBUG works too
        return level.upper() if isinstance(level, str) else level

    @field_validator("file")
    @classmethod
    def _absolute(cls, file: Path | None) -> Path | None:
        return None if file is None else file.expanduser().absolute()

    @field_validator("rotation")
    @classmethod
    def _rotation(cls, rotation: str) -> str:
        if not (_SIZE.match(rotation) or _TIME.match(rotation)):
            raise ValueError(
                f"rotation is a size such as '50 MB' or a period such as '1 day', not {rotation!r}"
            )
        return rotation

    def handlers(self) -> list[logging.Handler]:
        """New handlers for this config (the file is opened here, its directory made)."""
        made: list[logging.Handler] = []
        formatter = logging.Formatter(FORMAT)
        if self.file is not None:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            made.append(_file_handler(self.file, self.rotation, self.retention))
        if self.console:
            made.append(_Stderr())
        for handler in made:
            handler.setLevel(self.level)
            handler.setFormatter(formatter)
        return made


def _file_handler(path: Path, rotation: str, retention: int) -> logging.Handler:
    size = _SIZE.match(rotation)
    if size is not None:
        limit = int(float(size[1]) * _BYTES[size[2].upper()])
        return logging.handlers.RotatingFileHandler(
            path, maxBytes=limit, backupCount=retention, encoding="utf-8"
        )
    period = _TIME.match(rotation)
    assert period is not None  # validated
    unit = period[2].lower()
    interval = int(period[1]) * (7 if unit == "week" else 1)
    return logging.handlers.TimedRotatingFileHandler(
        path, when=_WHEN[unit], interval=interval, backupCount=retention, encoding="utf-8"
    )


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on whatever ``sys.stderr`` is at each record (a live rich table or a
    notebook replaces it), not on the stream there was when the pool started."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always the current sys.stderr


class _Parents(logging.Handler):
    """What ``propagate`` did for the records the program saw before: hands them to the
    ancestors' handlers (the last-resort one when there are none), as ``logging`` would."""

    def __init__(self, logger: logging.Logger, level: int) -> None:
        super().__init__(level)
        self._logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        found = 0
        parent = self._logger.parent
        while parent is not None:
            for handler in parent.handlers:
                found += 1
                if record.levelno >= handler.level:
                    handler.handle(record)
            if not parent.propagate:
                break
            parent = parent.parent
        last = logging.lastResort
        if found == 0 and last is not None and record.levelno >= last.level:
            last.handle(record)


@dataclass(eq=False)
class Installed:
    """One pool's handlers on the ``skyward`` logger, from ``install`` to ``remove``."""

    config: LogConfig
    handlers: list[logging.Handler] = field(default_factory=list)


_lock = threading.Lock()  # guards: _open, _before, _parents, and the logger's state
_open: list[Installed] = []
_before: tuple[int, bool] | None = None  # the logger's (level, propagate) before the first
_parents: _Parents | None = None


def install(config: LogConfig | None, name: str = "skyward") -> Installed | None:
    """Add ``config``'s handlers to the logger; ``None`` adds nothing. ``OSError`` when its
    file cannot be opened (nothing is then added)."""
    if config is None:
        return None
    installed = Installed(config, config.handlers())
    logger = logging.getLogger(name)
    with _lock:
        global _before
        if not _open:
            _before = (logger.level, logger.propagate)
        _open.append(installed)
        for handler in installed.handlers:
            logger.addHandler(handler)
        _settle(logger)
    return installed


def remove(installed: Installed | None, name: str = "skyward") -> None:
    """Take ``installed``'s handlers off again, and close them. Idempotent."""
    if installed is None:
        return
    logger = logging.getLogger(name)
    with _lock:
        if installed not in _open:
            return
        _open.remove(installed)
        for handler in installed.handlers:
            logger.removeHandler(handler)
        _settle(logger)
    for handler in installed.handlers:
        handler.close()


def _settle(logger: logging.Logger) -> None:
    """Lock held. The logger's level and propagation for the configs open now."""
    global _parents
    if _parents is not None:
        logger.removeHandler(_parents)
        _parents = None
    assert _before is not None
    level, propagate = _before
    logger.setLevel(level)
    logger.propagate = propagate
    if not _open:
        return
    shown = logger.getEffectiveLevel()  # what the program's configuration lets through
    wanted = min(logging.getLevelNamesMapping()[i.config.level] for i in _open)
    if wanted >= shown:
        return  # the program shows as much already; the handlers filter by their level
    logger.setLevel(wanted)
    if propagate:
        # Records between ``wanted`` and ``shown`` were never made before: they go to these
        # handlers only; the rest reach the program's handlers as they always did.
        logger.propagate = False
        _parents = _Parents(logger, shown)
        logger.addHandler(_parents)
