"""Skyward's jobs on a Slurm cluster, for ``skyward ls --slurm`` and ``skyward down``: this
user's jobs named ``skyward-<pool>``, whoever's client made them (a killed one included); a
job kept warm (``warm.py``) is listed as such, with the time it has left."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from skyward.client.phases import Reporter
from skyward.providers.base import Leftover
from skyward.providers.slurm import api
from skyward.providers.slurm.login import Login


class SlurmInventory:
    """``Inventory`` of one cluster (``where``: its login host, or ``local``); each call
    reaches it anew with ``open_login``."""

    def __init__(
        self, where: str, open_login: Callable[[], Login], *, cancel_timeout: float
    ) -> None:
        self.where = where
        self._open_login = open_login
        self._cancel_timeout = cancel_timeout

    def leftovers(self, *, pool: str | None = None) -> list[Leftover]:
        login = self._open_login()
        try:
            jobs = api.our_jobs(login)
        finally:
            login.close()
        found = []
        for job in jobs:
            name = job.name[len(api.JOB_PREFIX) :]
            if pool is not None and name != pool:
                continue
            owner = re.search(r"\bowner=(\S+)", job.comment)
            created = re.search(r"\bcreated=(\S+)", job.comment)
            state = job.state.lower() + (f" ({job.reason})" if job.reason != "None" else "")
            if (until := re.search(r"\buntil=(\d+)", job.comment)) and " keep=" in job.comment:
                left = int(until.group(1)) - time.time()  # kept warm (warm.py)
                state = f"warm, {left / 60:.1f} min left" if left > 0 else "warm, time up: ending"
            found.append(
                Leftover(
                    provider="slurm",
                    kind=f"job ({job.nodes} node{'s' if job.nodes != 1 else ''}, {job.partition})",
                    id=job.id,
                    pool=name,
                    owner=owner.group(1) if owner else "",
                    created=_when(created.group(1) if created else job.submitted),
                    state=state,
                    region=self.where,
                )
            )
        return found

    def delete(self, leftovers: Sequence[Leftover], reporter: Reporter) -> None:
        jobs = [x.id for x in leftovers if x.provider == "slurm"]
        if not jobs:
            return
        login = self._open_login()
        try:
            reporter.status(f"slurm {self.where}: scancel {' '.join(jobs)}")
            api.cancel(login, jobs=jobs, timeout=self._cancel_timeout)
        finally:
            login.close()


def _when(text: str) -> datetime | None:
    """The comment's UTC time (``...Z``), or squeue's submit time (the controller's local
    time, taken as this machine's)."""
    try:
        if text.endswith("Z"):
            return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        return datetime.fromisoformat(text).astimezone(UTC)
    except ValueError:
        return None
