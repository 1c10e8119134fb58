"""Waiting on a marker instead of sleeping for a guess.

A remote function says it has got somewhere (a call is running, a plugin is inside
``around_app``) by creating a file in a directory both sides see (the ``tmp_path`` fixture:
local workers and the SSH and stand-in hosts share this machine's filesystem). The test
waits for that file, then acts: as fast as the machine allows, and never too early on a
loaded one. The remote side needs nothing of this module: ``Path(marker).touch()``.
"""

from __future__ import annotations

import time
from pathlib import Path


def wait_for_markers(*markers: Path, timeout: float = 60.0) -> None:
    """Return once every marker exists; fail, naming the missing ones, after ``timeout``."""
    deadline = time.monotonic() + timeout
    while missing := [str(m) for m in markers if not m.exists()]:
        if time.monotonic() > deadline:
            raise AssertionError(f"markers not made within {timeout:g} s: {missing}")
        time.sleep(0.01)


def per_node(marker: Path, nodes: int) -> list[Path]:
    """The markers ``f"{marker}-{node}"`` that each of ``nodes`` nodes makes."""
    return [Path(f"{marker}-{node}") for node in range(nodes)]
