"""The pool's one Slurm job: submitted, waited for, and cancelled on every path.

::

    sbatch --parsable --job-name=skyward-<pool> --comment="skyward pool=... owner=... created=..."
           --nodes=N --ntasks-per-node=1 --no-requeue --output=/dev/null [--partition ...]
           < the holder script
    wait       squeue until RUNNING; each new pending reason goes to the progress display;
               a reason that never clears (PartitionTimeLimit, ...) fails at once
    terminate  scancel, then squeue until the job has left the queue

Why a batch job holding the nodes rather than ``salloc --no-shell``: an allocation made by
``salloc --no-shell`` has no process of its own, so once the client is gone nothing on the
cluster could end it before its time limit. The holder script is the job's own process, on
its first node: it ends the job when no Skyward step has run in it for ``idle_timeout``
seconds (the client crashed, was killed, or lost its link), the same promise the clouds'
watchdog keeps, and the time limit bounds it regardless. The price is a scheduler pass
before the job runs (about a second here, where salloc answers in milliseconds).

``--no-requeue``: a job whose node fails must end (its workers are lost, and the pool says
so) rather than wait in the queue again with nobody to use it.
"""

from __future__ import annotations

import logging
import re
import secrets
import shlex
import time
from collections.abc import Callable, Sequence

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.base import TAG_CREATED, TAG_OWNER, Allocation, Resource
from skyward.providers.cloud import warm as records
from skyward.providers.slurm import api, warm
from skyward.providers.slurm.login import Login
from skyward.providers.slurm.steps import SlurmNode

# A waiting client looks at the queue often at first (an idle queue starts a job within a
# second), then every few seconds (a job may wait hours; the controller is shared).
_FIRST_POLL = 0.05
_BRISK = 30.0  # seconds of brisk polling
_BRISK_POLL = 0.5
_SLOW_POLL = 5.0

_log = logging.getLogger(__name__)


def job_name(pool: str) -> str:
    return f"{api.JOB_PREFIX}{pool}"


def job_mark() -> str:
    """A token for one pool's job comment (``id=...``)."""
    return f"id={secrets.token_hex(6)}"


def holder_script(pool: str, idle_timeout: float) -> str:
    """The batch script: it holds the nodes while Skyward's steps come and go, and ends the
    job once none has run for ``idle_timeout`` seconds, or for ``N`` while the job's comment
    carries ``keep=N`` (a pool closed with ``keep_warm``; ``warm.py``). A change of the
    comment counts as a step: the client that wrote it is there. POSIX sh."""
    idle = max(1, round(idle_timeout))
    return "\n".join(
        [
            "#!/bin/sh",
            f"# Skyward pool {_printable(pool)}: holds the nodes while the pool's steps run, and",
            f"# ends the job once none has run for {idle} s (the client is gone), or for N s",
            "# while the job's comment says keep=N (kept warm for the next pool).",
            "if ! command -v squeue >/dev/null 2>&1; then",
            "  echo 'skyward: no squeue on this node; the time limit ends the job'",
            "  exec sleep infinity",
            "fi",
            f"last=$(date +%s) bound={idle} said=",
            "trap : USR1  # a client changed the comment: look now (api.update_job)",
            "while :; do",
            '  if steps=$(squeue -h -s -j "$SLURM_JOB_ID" -o %j 2>/dev/null); then',
            f'    case "$steps" in *{api.JOB_PREFIX}*) last=$(date +%s) ;; esac',
            "  else",
            "    last=$(date +%s)  # the controller did not answer: that is not idleness",
            "  fi",
            '  if comment=$(squeue -h -j "$SLURM_JOB_ID" -o %k 2>/dev/null); then',
            '    if [ "$comment" != "$said" ]; then said=$comment; last=$(date +%s); fi',
            '    case "$comment" in',
            '      *" keep="*) bound=${comment##* keep=}; bound=${bound%% *} ;;',
            f"      *) bound={idle} ;;",
            "    esac",
            f"    case \"$bound\" in ''|*[!0-9]*) bound={idle} ;; esac",
            "  fi",
            '  if [ $(( $(date +%s) - last )) -ge "$bound" ]; then',
            '    echo "skyward: no step of the pool for $bound s; ending the job"',
            "    exit 0",
            "  fi",
            "  every=$(( bound / 5 )); [ $every -ge 1 ] || every=1; [ $every -le 30 ] || every=30",
            '  sleep "$every" & wait $!; kill $! 2>/dev/null',
            "done",
            "",
        ]
    )


def submit(
    login: Login,
    *,
    pool: str,
    mark: str,
    nodes: int,
    tags: dict[str, str],
    options: Sequence[str],
    idle_timeout: float,
    hint: Callable[[str], str],
) -> str:
    """Submit the pool's job; its id. ``mark`` (``id=<token>``, in the comment) finds it if
    the id is never read, and only it: another client may run a pool of the same name."""
    comment = f"skyward pool={pool} owner={tags[TAG_OWNER]} created={tags[TAG_CREATED]} {mark}"
    line = [
        f"--job-name={shlex.quote(job_name(pool))}",
        f"--comment={shlex.quote(comment)}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        "--no-requeue",
        "--output=/dev/null",
        '--chdir="$HOME"',
        *options,
    ]
    return api.submit(login, line, holder_script(pool, idle_timeout), hint)


def wait_running(
    login: Login,
    job: str,
    *,
    nodes: int,
    deadline: Deadline,
    reporter: Reporter,
    never: Callable[[api.JobState], str],
) -> api.JobState:
    """Poll the queue until the job runs; the progress display shows each new reason it
    waits for. A job that left the queue, or waits for something that never comes
    (``never`` words the error), is a ``ProvisionError``."""
    said = ""
    started = time.monotonic()
    pause = _FIRST_POLL
    while True:
        state = api.job_state(login, job)
        if state is None:
            record = api.job_record(login, job)
            raise ProvisionError(
                f"Slurm job {job} ended before the pool could use it: "
                f"{record.get('JobState', 'gone')} ({record.get('Reason', 'no reason given')}"
                f"); `scontrol show job {job}` may say more"
            )
        if state.state == "RUNNING":
            return state
        if state.never_starts():
            raise ProvisionError(never(state))
        if state.state not in ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING"):
            raise ProvisionError(
                f"Slurm job {job} is {state.state} ({state.reason}) instead of running; "
                f"`scontrol show job {job}` may say more"
            )
        text = f"Slurm job {job} {state.describe()}"
        if text != said:
            said = text
            for rank in range(nodes):
                reporter.phase(rank, "provisioning", text)
            reporter.status(text)
        deadline.check(f"waiting for {text}")
        deadline.sleep(pause)
        slow = time.monotonic() - started > _BRISK
        pause = _SLOW_POLL if slow else min(_BRISK_POLL, pause * 2)


def _printable(text: str) -> str:
    """``text`` as one word of printable characters, for a comment or a script's comment."""
    return re.sub(r"[^\w.@+:/-]", "_", text) or "_"


class SlurmAllocation(Allocation):
    """The pool's job and its nodes. ``terminate`` cancels the job and waits until it has
    left the queue (Slurm has then ended every step), then closes the login link; a link
    that dropped meanwhile is made again (``reopen``) to do so. ``keep`` (``keep_warm``)
    leaves the job to its holder and the next pool like this one instead (``warm.py``)."""

    def __init__(
        self,
        nodes: Sequence[SlurmNode],
        *,
        login: Login,
        job: str,
        cancel_timeout: float,
        reopen: Callable[[], Login],
        keeping: warm.Keeping,
    ) -> None:
        super().__init__(nodes, [Resource("Slurm job", job)])
        self.login = login
        self.job = job
        self._cancel_timeout = cancel_timeout
        self._reopen = reopen
        self._names = [node.name for node in nodes]
        self._keeping = keeping

    @property
    def down_command(self) -> str:
        return self._keeping.down

    def keep(self, seconds: float) -> bool:
        """The job's holder told to hold the nodes ``seconds`` with no step (the job's time
        limit may cap it: the log says so), the record written, the workers' sruns stopped;
        the job is not cancelled. False when the job no longer runs whole."""
        with self._lock:
            if self._terminated or len(self.nodes) != len(self._names) or not self.login.alive:
                return False
            nodes = [node for node in self.nodes if isinstance(node, SlurmNode)]
        kept = warm.keep(self.login, self.job, nodes, self._keeping, seconds)
        if kept is None:
            return False
        with self._lock:
            if self._terminated:  # terminated meanwhile: the job is cancelled
                records.forget(kept.id)
                return False
            self._terminated = True
        for node in nodes:
            try:
                node.close()  # its worker's srun ended; the job stays
            except Exception as exc:
                _log.warning("%s: stopping its workers: %s", node.name, exc)
        self.login.close()
        return True

    def loss_reason(self, rank: int) -> str | None:
        """What Slurm says of the job and of node ``rank``'s machine."""
        return why_lost(self.login, self.job, self._names[rank])

    def release(self) -> None:
        login = self.login
        try:
            if not login.alive:
                login = self._reopen()
            api.cancel(login, jobs=[self.job], timeout=self._cancel_timeout)
        except ProvisionError as error:
            raise ProvisionError(
                f"{error} (the pool's job {self.job}; without a client it ends itself once "
                f"idle, and `skyward down --slurm ...` cancels it)"
            ) from error
        finally:
            login.close()
            self.login.close()


def why_lost(login: Login, job: str, node: str) -> str | None:
    """``Slurm: job 12 is NODE_FAIL (NodeDown); node node1 is DOWN (Not responding)``."""
    if not login.alive:
        return None
    record = api.job_record(login, job)
    parts = []
    if record:
        state, reason = record.get("JobState", "?"), record.get("Reason", "None")
        parts.append(f"job {job} is {state}" + (f" ({reason})" if reason != "None" else ""))
    if node:
        info = api.node_record(login, node)
        if info:
            reason = info.get("Reason", "")
            parts.append(
                f"node {node} is {info.get('State', '?')}" + (f" ({reason})" if reason else "")
            )
    return f"Slurm: {'; '.join(parts)}" if parts else None
