"""Jupyter awareness: is this a kernel, which cell is running, and writing to a given cell.

A kernel tags every message it publishes with a *parent*: the header of the request (the
cell) it answers, and the frontend files the output under that cell. Worker output reaches
the client on reader threads, which belong to no cell, so the pool records the running cell
when a call is submitted and the console writes that call's output under it (ipykernel 7
lets a thread choose its parent with ``set_thread_parent``). On older kernels, or outside
Jupyter, these functions do nothing and output goes where ``sys.stdout`` points.

Nothing here imports IPython unless it is already imported: a kernel always has it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
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
    ip = shell() if parent is not None else None
    if ip is None:
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
