"""Slurm's commands as Skyward uses them: the command lines, the output read back, and the
errors translated into ones that say what to do. The only module that knows their formats.

::

    submit       sbatch --parsable ... < holder script     -> job id, or sbatch's own error
    job_state    squeue -j J -o state|reason|nodes|start   -> JobState, None once it left
    job_record   scontrol -o show job J                    -> its fields (state, reason, ...)
    nodes_of     scontrol -o show node LIST                -> (name, address) in Slurm's order
    cancel       scancel J (and any job whose comment has the pool's mark), then squeue
                 until they have left the queue
    our_jobs     squeue --me                               -> every skyward-* job (ls / down)
    own_job      squeue --me -j J                          -> OwnJob: state, name, comment,
                                                              time left (keep_warm)
    update_job   scontrol update JobId=J Comment=...;      the holder reads the comment,
                 scancel --batch --signal=USR1 J           woken

Every command runs through a ``Login``, on the login host or this machine. Output is read
by a field separator no job name or comment holds (``\\x1f``), and lines without it (a
login shell's chatter) are ignored.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.slurm.login import Login

JOB_PREFIX = "skyward-"  # every pool's job is named skyward-<pool>
_SEP = "\x1f"
_CANCEL_POLL = 0.1  # seconds between looks at the queue after scancel

# Why a pending job will never start as asked: Slurm keeps such a job in the queue (unless
# the cluster enforces partition limits at submission), so waiting for it would be forever.
_NEVER = {
    "PartitionConfig": "the request does not fit the partition (too many nodes, CPUs, GPUs "
    "or memory per node, or a time limit above its MaxTime)",
    "PartitionNodeLimit": "more nodes than the partition allows a job",
    "PartitionTimeLimit": "a time limit above the partition's MaxTime",
    "BadConstraints": "no node of the partition has the features or resources asked for",
    "AccountNotAllowed": "the account may not use this partition",
    "QOSNotAllowed": "the QOS may not be used with this partition or account",
    "InvalidAccount": "the account does not exist or you are not in it",
    "InvalidQOS": "the QOS does not exist or you may not use it",
    "DependencyNeverSatisfied": "a dependency that can never be met",
}
# Per-job limits of a QOS or association (``QOSMaxNodePerJobLimit``, ``AssocMaxWall...``):
# this job alone is above them, so it never starts. Per-user limits wait for other jobs.
_PER_JOB_LIMIT = re.compile(r"^(QOS|Assoc)(Grp)?(Max|Min)\w*PerJob\w*$")

# What the usual reasons for waiting mean, for the progress display.
_WAITING = {
    "Priority": "jobs with higher priority are ahead of it",
    "Resources": "waiting for nodes to become free",
    "None": "about to be scheduled",
    "BeginTime": "its start time has not come yet",
    "Dependency": "waiting for another job",
    "ReqNodeNotAvail": "nodes it needs are down, drained or reserved",
    "JobHeldUser": "held (scontrol release JOBID lets it go)",
    "JobHeldAdmin": "held by an administrator",
    "QOSMaxGRESPerUser": "you use all the GPUs your QOS allows; it starts as your jobs end",
    "QOSMaxJobsPerUserLimit": "you run as many jobs as your QOS allows",
    "AssocGrpGRES": "your account's group uses as many GPUs as it may",
    "Reservation": "waiting for its reservation to start",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
}


@dataclass(frozen=True)
class JobState:
    """One look at a job in the queue."""

    state: str  # PENDING, RUNNING, COMPLETING, ...
    reason: str  # Priority, Resources, None, ...
    nodes: str  # Slurm's node list ("node[0-1]"), once it runs
    start: str  # the estimated start, when Slurm has one

    def never_starts(self) -> str | None:
        """Why this pending job can never start, or None."""
        if self.state != "PENDING":
            return None
        if self.reason in _NEVER:
            return _NEVER[self.reason]
        if _PER_JOB_LIMIT.match(self.reason):
            return "above a per-job limit of your QOS or account"
        return None

    def describe(self) -> str:
        """``pending (Priority: jobs with higher priority are ahead of it; est. start ...)``"""
        words = _WAITING.get(self.reason.split(",")[0])
        reason = f"{self.reason}: {words}" if words else self.reason
        start = (
            f"; estimated start {self.start}" if self.start not in ("", "N/A", "Unknown") else ""
        )
        return f"{self.state.lower()} ({reason}{start})"


def submit(login: Login, options: Sequence[str], script: str, hint: Callable[[str], str]) -> str:
    """``sbatch`` the script with ``options``; the job id. sbatch's refusal (an unknown
    partition, a gres no node has) is a ``ProvisionError`` with sbatch's own words and
    ``hint(words)``."""
    command = "sbatch --parsable " + " ".join(options)
    status, output = login.run(command, stdin=script.encode())
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    ids = [line.split(";")[0] for line in lines if re.fullmatch(r"\d+(;\S+)?", line)]
    if status == 0 and ids:
        return ids[-1]
    said = "\n".join(line for line in lines if not re.fullmatch(r"\d+(;\S+)?", line))
    said = said or f"sbatch exited with {status} and said nothing"
    extra = hint(said)
    raise ProvisionError(
        f"{login.target}: Slurm refused the pool's job:\n{said}" + (f"\n{extra}" if extra else "")
    )


def job_state(login: Login, job: str) -> JobState | None:
    """The job as ``squeue`` sees it; None once it has left the queue."""
    fields = _SEP.join(["skyward", "%T", "%r", "%N", "%S"])
    status, output = login.run(f"squeue -h -j {job} -o {shlex.quote(fields)}")
    for line in output.splitlines():
        parts = line.split(_SEP)
        if len(parts) == 5 and parts[0] == "skyward":
            return JobState(*parts[1:])
    if status != 0 and "Invalid job id" not in output:
        raise ProvisionError(f"{login.target}: squeue failed for job {job}: {output.strip()}")
    return None


def job_record(login: Login, job: str) -> dict[str, str]:
    """``scontrol -o show job``'s fields; empty when Slurm has forgotten the job."""
    _, output = login.run(f"scontrol -o show job {job}")
    line = next((x for x in output.splitlines() if x.startswith(f"JobId={job} ")), "")
    return _fields(line)


def nodes_of(login: Login, nodelist: str) -> list[tuple[str, str]]:
    """Each node of ``nodelist`` (``node[0-1]``) as (name, address Slurm reaches it at), in
    Slurm's order."""
    quoted = shlex.quote(nodelist)
    status, output = login.run(
        f"scontrol show hostnames {quoted} && scontrol -o show node {quoted}"
    )
    names: list[str] = []
    addresses: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith("NodeName="):
            fields = _fields(line)
            addresses[fields["NodeName"]] = fields.get("NodeAddr", fields["NodeName"])
        elif line.strip() and "=" not in line and " " not in line.strip():
            names.append(line.strip())
    if status != 0 or not names:
        raise ProvisionError(f"{login.target}: cannot list the nodes {nodelist}: {output.strip()}")
    return [(name, addresses.get(name, name)) for name in names]


def node_record(login: Login, node: str) -> dict[str, str]:
    _, output = login.run(f"scontrol -o show node {shlex.quote(node)}")
    line = next((x for x in output.splitlines() if x.startswith(f"NodeName={node} ")), "")
    return _fields(line)


def cancel(
    login: Login,
    *,
    jobs: Sequence[str] = (),
    marked: str | None = None,
    timeout: float,
) -> None:
    """``scancel`` the jobs, and every job of this user whose comment carries ``marked``
    (one whose id was never read: a Ctrl-C during sbatch), then wait until they have left
    the queue. ``ProvisionError`` naming what is still there after ``timeout`` seconds."""
    deadline = Deadline(timeout, f"{timeout:g} s")
    cancelled: set[str] = set()
    while True:
        present = [
            job.id
            for job in _mine(login)
            if job.id in jobs or (marked is not None and marked in job.comment.split())
        ]
        if not present:
            return
        if fresh := [job for job in present if job not in cancelled]:
            status, output = login.run(f"scancel {' '.join(fresh)}")
            if status != 0 and "Invalid job id" not in output:
                raise ProvisionError(
                    f"{login.target}: scancel {' '.join(fresh)} failed: {output.strip()}; "
                    f"run it again, or `skyward down`"
                )
            cancelled.update(fresh)
        elif deadline.expired:
            raise ProvisionError(
                f"{login.target}: Slurm job(s) {', '.join(present)} still in the queue "
                f"{timeout:g} s after scancel; `squeue -j {','.join(present)}` shows them, "
                f"`scancel {' '.join(present)}` cancels them again"
            )
        time.sleep(_CANCEL_POLL)


@dataclass(frozen=True)
class _Mine:
    id: str
    comment: str


def _mine(login: Login) -> list[_Mine]:
    """This user's jobs in the queue, by id, with their comments."""
    status, output = login.run(f"squeue --me -h -o skyward{_SEP}%i{_SEP}%k")
    if status != 0:
        raise ProvisionError(f"{login.target}: squeue failed: {output.strip()}")
    rows = [line.split(_SEP) for line in output.splitlines()]
    return [_Mine(row[1], row[2]) for row in rows if len(row) == 3 and row[0] == "skyward"]


@dataclass(frozen=True)
class QueuedJob:
    """One of this user's Skyward jobs, as ``squeue`` lists it."""

    id: str
    state: str
    reason: str
    submitted: str  # as the controller prints it, its local time
    partition: str
    nodes: int
    comment: str
    name: str


def our_jobs(login: Login) -> list[QueuedJob]:
    """Every job of this user whose name starts with ``skyward-``."""
    fields = _SEP.join(["skyward", "%i", "%T", "%r", "%V", "%P", "%D", "%k", "%j"])
    status, output = login.run(f"squeue --me -h -o {shlex.quote(fields)}")
    if status != 0:
        raise ProvisionError(f"{login.target}: squeue failed: {output.strip()}")
    found = []
    for line in output.splitlines():
        parts = line.split(_SEP)
        if len(parts) == 9 and parts[0] == "skyward" and parts[8].startswith(JOB_PREFIX):
            job_id, state, reason, submitted, partition, count, comment, name = parts[1:]
            nodes = int(count) if count.isdigit() else 0
            found.append(
                QueuedJob(job_id, state, reason, submitted, partition, nodes, comment, name)
            )
    return found


@dataclass(frozen=True)
class OwnJob:
    """One job of this user, looked at by id (``keep_warm``: keeping it, adopting it)."""

    state: str
    name: str
    comment: str
    nodes: str  # Slurm's node list
    time_left: float | None  # seconds until its time limit; None: none


def own_job(login: Login, job: str) -> OwnJob | None:
    """The job, if it is in the queue and this user's; None otherwise."""
    fields = _SEP.join(["skyward", "%T", "%j", "%k", "%N", "%L"])
    status, output = login.run(f"squeue --me -h -j {shlex.quote(job)} -o {shlex.quote(fields)}")
    for line in output.splitlines():
        parts = line.split(_SEP)
        if len(parts) == 6 and parts[0] == "skyward":
            state, name, comment, nodes, left = parts[1:]
            return OwnJob(state, name, comment, nodes, _seconds(left))
    if status != 0 and "Invalid job id" not in output:
        raise ProvisionError(f"{login.target}: squeue failed for job {job}: {output.strip()}")
    return None


def update_job(login: Login, job: str, *, comment: str, name: str | None = None) -> None:
    """Set the job's comment (and name), and wake its holder script (USR1, to the batch
    shell only) to read it now rather than after its pause. A job's owner may do both."""
    named = f" JobName={shlex.quote(name)}" if name else ""
    status, output = login.run(
        f"scontrol update JobId={shlex.quote(job)}{named} Comment={shlex.quote(comment)} "
        f"&& scancel --batch --signal=USR1 {shlex.quote(job)}"
    )
    if status != 0:
        raise ProvisionError(
            f"{login.target}: scontrol update of job {job} failed: {output.strip()}"
        )


def _seconds(left: str) -> float | None:
    """squeue's ``%L`` (``[D-]HH:MM:SS``, ``MM:SS``) in seconds; None for no limit."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", left.strip())
    if match is None:
        return None  # UNLIMITED, NOT_SET, INVALID
    days, hours, minutes, seconds = (int(x or 0) for x in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _fields(line: str) -> dict[str, str]:
    """``Key=value Key2=value with spaces ...`` (scontrol -o) as a dict: a value runs to the
    next `` Key=``, so a node's ``Reason=Not responding [slurm@...]`` stays whole."""
    found: dict[str, str] = {}
    keys = list(re.finditer(r"(?:^| )([A-Z][A-Za-z0-9_:/]*)=", line))
    for this, after in zip(keys, [*keys[1:], None], strict=True):
        end = after.start() if after is not None else len(line)
        found[this.group(1)] = line[this.end() : end].strip()
    return found
