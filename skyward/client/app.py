"""``sky.App``: one console setting and one log directory for the pools a program opens.

::

    with sky.App(console=False):                 # no progress display for any pool inside
        with sky.ComputePool(nodes=2) as a, sky.ComputePool(nodes=4) as b:
            ...                                  # logs: <logs root>/app-<hex>/<pool>/

skyward 0.5's ``App`` owned the console its pools drew on. Here each pool keeps its own
console and log directory (``console/``), and an ``App`` is a scope of defaults only: a pool
made inside it that gives no ``console=`` (nor ``quiet=``) takes the app's, and every pool
started inside it makes its log directory under the app's ``log_dir`` (by default a
directory of its own under the logs root, so ``skyward logs`` lists the app; a pool's own
directory is ``pool.log_dir``). It starts nothing and holds no machine: pools still close at
the end of their own ``with`` blocks. Apps nest (the innermost decides) and are process-wide,
as 0.5's was: a pool made by another thread inside the block takes the app's defaults too.
"""

from __future__ import annotations

import secrets
import threading
from pathlib import Path
from types import TracebackType

from skyward.console import ConsoleMode

_lock = threading.Lock()  # guards: _open
_open: list[App] = []  # entered apps, outermost first


class App:
    """Defaults for the pools made inside the block: ``console`` (``True``: ``"auto"``,
    ``False``: ``"off"``, or a mode: ``"rich"``, ``"plain"``) and ``log_dir`` (where their log
    directories go; ``None``: ``<logs root>/app-<6 hex digits>``)."""

    def __init__(
        self, console: bool | ConsoleMode = True, *, log_dir: str | Path | None = None
    ) -> None:
        if console is True:
            mode: ConsoleMode = "auto"
        elif console is False:
            mode = "off"
        elif console in ("auto", "rich", "plain", "off"):
            mode = console
        else:
            raise ValueError(
                f"App(console=...) is True, False, 'auto', 'rich', 'plain' or 'off', "
                f"not {console!r}"
            )
        self.console: ConsoleMode = mode
        self._log_dir = None if log_dir is None else Path(log_dir).expanduser().absolute()
        self.name = f"app-{secrets.token_hex(3)}"

    @property
    def log_dir(self) -> Path:
        """The directory the pools' log directories are made in."""
        if self._log_dir is not None:
            return self._log_dir
        from skyward.console.logs import logs_root

        return logs_root() / self.name

    def __enter__(self) -> App:
        with _lock:
            _open.append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with _lock:
            if self in _open:
                _open.remove(self)

    def __repr__(self) -> str:
        return f"<App console={self.console!r} log_dir={str(self.log_dir)!r}>"


def current() -> App | None:
    """The innermost app entered, or None."""
    with _lock:
        return _open[-1] if _open else None
