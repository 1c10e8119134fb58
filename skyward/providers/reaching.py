"""Reach a cloud's new machines over SSH, and fail at once when one of them ends meanwhile.

::

    reach(targets, ..., gone=...)     open_hosts (retrying while the machines boot), with
                                      a watcher thread that asks the cloud every ``poll``
                                      seconds whether a machine ended (a spot reclaim, its
                                      watchdog): then the start fails at once, with the
                                      cloud's reason, instead of after ``boot_timeout``
    a start that times out            names the machines SSH never answered on, and what
                                      to check (``hint``), unless the cloud said why

Any cloud whose machines are SSH hosts uses it; the cloud gives ``gone()``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from skyward._errors import HostKeyError, ProvisionError
from skyward._phases import Choice, Phase, Reporter
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud import WatchedDeadline
from skyward.providers.ssh.hosts import Access, HostNode, HostTarget, open_hosts


def reach(
    targets: Sequence[HostTarget],
    access: Access,
    request: ProvisionRequest,
    reporter: Reporter,
    *,
    gone: Callable[[], str | None],
    hint: str,
    poll: float = 2.0,
) -> list[HostNode]:
    """``open_hosts`` for a cloud's machines. ``gone()`` says why one of them ended (or
    ``None``; its errors are ignored: it is a hint, the connections' own bounds still
    hold); ``hint`` is added to a start that failed with machines SSH never answered."""
    reached = _Reached(reporter)
    deadline = WatchedDeadline(request.deadline)
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(poll):
            try:
                why = gone()
            except Exception:
                continue
            if why is not None:
                deadline.fail(why)
                return

    threading.Thread(target=watch, name="skyward-watch-machines", daemon=True).start()
    try:
        return open_hosts(targets, access, dataclasses.replace(request, deadline=deadline), reached)
    except (ProvisionError, TimeoutError) as exc:
        silent = [t.target.host for r, t in enumerate(targets) if r not in reached.reached]
        if silent and deadline.failure is None and not isinstance(exc, HostKeyError):
            exc.add_note(
                f"Machines {', '.join(silent)} are running, but SSH did not answer from here: "
                f"{hint}"
            )
        raise
    finally:
        stop.set()


class _Reached:
    """A reporter that also remembers which nodes got past connecting (SSH answered)."""

    def __init__(self, reporter: Reporter) -> None:
        self._reporter = reporter
        self.reached: set[int] = set()

    def phase(self, node: int, phase: Phase, detail: str = "") -> None:
        if phase not in ("provisioning", "connecting"):
            self.reached.add(node)
        self._reporter.phase(node, phase, detail)

    def log(self, node: int, line: str) -> None:
        self._reporter.log(node, line)

    def status(self, line: str) -> None:
        self._reporter.status(line)

    def chosen(self, choice: Choice) -> None:
        self._reporter.chosen(choice)
