"""Jupyter awareness: is this a kernel, which cell is running, and writing to a given cell.

A kernel tags every message it publishes with a *parent*: the header of the request (the
cell) it answers, and the frontend files the output under that cell. Worker output reaches
the client on reader threads, which belong to no cell, so the pool records the running cell
when a call is submitted and the console writes that call's output under it (ipykernel 7
lets a thread choose its parent with ``set_thread_parent``). On older kernels, or outside
Jupyter, these functions do nothing and output goes where ``sys.stdout`` points.

It also decides which of the notebook's own modules travel to workers by value.

Nothing here imports IPython unless it is already imported: a kernel always has it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import ModuleType
from typing import Any


def shell() -> Any | None:
    """The running IPython kernel's shell, or None (plain Python, or terminal IPython)."""
    if "IPython" not in sys.modules or "ipykernel" not in sys.modules:
        return None
    from IPython import get_ipython

    ip = get_ipython()
    if ip is None or getattr(ip, "kernel", None) is None:
        return None
    return ip


def in_jupyter() -> bool:
    return shell() is not None


def current_parent() -> dict[str, Any] | None:
    """The header of the cell running in this thread, or None outside a kernel."""
    if shell() is None:
        return None
    header = getattr(sys.stdout, "parent_header", None)
    return dict(header) if isinstance(header, dict) and header else None


@contextmanager
def as_parent(parent: dict[str, Any] | None) -> Iterator[None]:
    """Within this block, what this thread prints or displays belongs to ``parent``'s cell."""
    ip = shell()
    if parent is None or ip is None:
        yield
        return
    targets: list[Any] = [sys.stdout, sys.stderr, getattr(ip, "display_pub", None)]
    with ExitStack() as stack:
        for target in targets:
            setter = getattr(target, "set_thread_parent", None)
            if setter is None:
                continue  # an older ipykernel: output follows the kernel's current cell
            token = setter(parent)
            stack.callback(target.reset_thread_parent, token)
        yield


_examined: set[str] = set()  # modules already looked at, so each submit checks only new ones
_examined_lock = threading.Lock()  # guards: _examined


def ship_notebook_modules() -> None:
    """In a kernel, have modules imported from the notebook's directory pickled by value.

    A helper module next to the notebook (``from helpers import clean``) is importable by the
    kernel but usually not by remote workers, so functions from it would fail to unpickle
    there. The rule: a module whose file is under the kernel's working directory (where
    Jupyter starts a notebook's kernel) and that no installed distribution provides
    (editable installs included) travels by value with every call, as ``__main__`` does.
    """
    if shell() is None:
        return
    with _examined_lock:
        fresh = [name for name in list(sys.modules) if name not in _examined]
        _examined.update(fresh)
    root = os.path.realpath(os.getcwd())
    local = [name for name in fresh if _loaded_under(sys.modules.get(name), root)]
    if not local:
        return
    from importlib.metadata import packages_distributions

    import cloudpickle

    # skyward itself may sit under the notebook's directory as a source checkout: workers
    # always have it.
    installed = {"skyward", *packages_distributions()}
    for name in local:
        module = sys.modules.get(name)
        if module is not None and name.partition(".")[0] not in installed:
            cloudpickle.register_pickle_by_value(module)


def _loaded_under(module: ModuleType | None, root: str) -> bool:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return False
    path = os.path.realpath(path)
    if not path.startswith(root + os.sep):
        return False
    parts = path.split(os.sep)
    # A virtualenv inside the notebook's directory holds installed packages, not helpers.
    return "site-packages" not in parts and "dist-packages" not in parts
