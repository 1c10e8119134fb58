"""Which of the client's modules a remote worker cannot import, and so gets by value.

cloudpickle pickles a function by reference (module and name) when its module is
importable, so a function from the user's own ``helpers.py`` arrives on a remote worker as
"import helpers", which fails there. Workers can import the standard library, what the image
installs, and skyward; any other module the client has imported, from a file outside the
interpreter's own directories (the script's neighbours, a notebook's helpers, a package
installed in editable mode), is registered with ``cloudpickle.register_pickle_by_value``
before a call to a remote pool is pickled. Local workers see the client's files, so local
pools never need this.
"""

from __future__ import annotations

import functools
import site
import sys
import sysconfig
import threading
from collections.abc import Iterable
from pathlib import Path

_lock = threading.Lock()  # guards: _seen, _looked_at
_seen = 0  # len(sys.modules) at the last scan: new imports are what needs a look
_looked_at: set[str] = set()  # names already classified; a module's file does not move


@functools.cache
def _system_roots() -> tuple[str, ...]:
    roots: set[str] = set()
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            path = sysconfig.get_path(key, vars={"base": prefix, "platbase": prefix})
            if path:
                roots.add(str(Path(path).resolve()))
    for path in [*site.getsitepackages(), site.getusersitepackages()]:
        roots.add(str(Path(path).resolve()))
    return tuple(sorted(roots))


def client_only_modules(names: Iterable[str] | None = None) -> list[str]:
    """Top-level modules imported here (of ``names``, default all) whose files are not
    where installed code lives."""
    roots = _system_roots()
    found = []
    for name in list(sys.modules) if names is None else names:
        module = sys.modules.get(name)
        if "." in name or name in ("__main__", "skyward") or module is None:
            continue
        file = getattr(module, "__file__", None)
        if not file:
            continue  # built in, frozen, or a namespace package
        path = str(Path(file).resolve())
        if not path.startswith(roots):
            found.append(name)
    return found


def ship_client_modules() -> None:
    """Register every client-only module for pickling by value; cheap when none is new.

    Runs before every call to a remote pool is pickled: a glance at ``len(sys.modules)``
    when nothing was imported, and only the new names when something was.
    """
    global _seen
    with _lock:
        if len(sys.modules) == _seen:
            return
        _seen = len(sys.modules)
        new = [name for name in list(sys.modules) if name not in _looked_at]
        _looked_at.update(new)
        import cloudpickle

        for name in client_only_modules(new):
            cloudpickle.register_pickle_by_value(sys.modules[name])
