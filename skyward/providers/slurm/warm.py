"""``keep_warm`` on Slurm: a closed pool's job kept for the next pool like it, in the records
and under the locks the clouds' kept machines use (``providers/cloud/warm.py``).

::

    pool A closes, keep_warm=600                pool B starts: same Slurm options, request
    ──────────────────────────────────          and node count
    keep(): the job's comment gets              ─────────────────────────────────────────────
      keep=600 until=T (scontrol update); the   adopt(): claim(slurm, spec, nodes): the
      holder script (job.py) reads it and ends    record, locked → squeue: the job still runs,
      the job 600 s after the pool's last step    is this user's, with its name and mark;
    the record saved: login, job, its nodes,      else it is dropped (cancelled if ours) and
      spec digest, node count                     the next record tried → the comment's keep
    workers stopped (their steps end); the        lifted and the job renamed skyward-<B>
      job runs on, holding the nodes              (the holder sees a client again) → the
                                                  record forgotten → the provider probes,
                                                  bootstraps (the environment on the shared
                                                  filesystem is there) and starts workers

The keep is bounded on the cluster itself: a client that never returns leaves a job its
holder ends ``keep_warm`` seconds later, or the job's time limit, whichever comes first.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from skyward._errors import ProvisionError
from skyward.client.phases import Reporter
from skyward.providers.cloud import warm
from skyward.providers.slurm import api
from skyward.providers.slurm.login import Login
from skyward.providers.slurm.steps import SlurmNode

_log = logging.getLogger(__name__)
CLOUD = "slurm"  # the records' ``cloud``
_KEEP_TOKENS = re.compile(r"\s*\b(keep|until)=\S*")


@dataclass(frozen=True)
class Keeping:
    """What a pool's allocation needs to keep its job: where, and what may adopt it."""

    where: str  # the login host, or "local"
    spec: str  # warm.spec_digest of the Slurm options and the request
    image: str  # the bootstrap plan's digest
    pool: str
    owner: str
    mark: str  # the job's ``id=...`` token, in its comment

    @property
    def down(self) -> str:
        return f"skyward down --slurm {self.where} --pool {self.pool}"


@dataclass(frozen=True)
class Adopted:
    job: str
    mark: str
    nodes: str  # Slurm's node list


def keep(
    login: Login, job: str, nodes: Sequence[SlurmNode], keeping: Keeping, seconds: float
) -> warm.WarmSet | None:
    """Tell the job's holder to hold the nodes ``seconds`` with no step, and write the
    record; None, having changed nothing, when the job no longer runs."""
    found = api.own_job(login, job)
    if found is None or found.state != "RUNNING":
        return None
    kept_for = seconds
    if found.time_left is not None and found.time_left < seconds:
        kept_for = found.time_left
        _log.warning(
            "pool %s: Slurm job %s reaches its time limit in %.0f s, before keep_warm=%g s "
            "ends: it is kept that long",
            keeping.pool,
            job,
            found.time_left,
            seconds,
        )
    now = time.time()
    until = now + kept_for
    bare = _KEEP_TOKENS.sub("", found.comment)
    api.update_job(login, job, comment=f"{bare} keep={max(1, round(seconds))} until={round(until)}")
    kept = warm.WarmSet(
        id=warm.new_id(),
        cloud=CLOUD,
        spec=keeping.spec,
        image=keeping.image,
        pool=keeping.pool,
        owner=keeping.owner,
        kept_at=now,
        until=until,
        hourly_cost=None,
        describe=f"Slurm job {job} on {found.nodes} via {keeping.where}",
        host_key="",
        label="",
        key_dir="",
        gpus=None,
        machine_type="",
        instance_profile=False,
        down=keeping.down,
        machines=tuple(
            warm.WarmMachine(rank, node.name, 0, "", node.address, keeping.where, node.name)
            for rank, node in enumerate(nodes)
        ),
        record={"job": job, "name": found.name, "mark": keeping.mark, "login": keeping.where},
    )
    warm.save(kept)
    return kept


def adopt(
    login: Login,
    *,
    spec: str,
    nodes: int,
    pool: str,
    reporter: Reporter,
    cancel_timeout: float,
) -> Adopted | None:
    """A kept job for this pool (same Slurm options, request and node count), made the
    pool's (renamed ``skyward-<pool>``, its keep lifted) and its record forgotten; None when
    there is none. A kept job that no longer runs, or is not the one recorded, is dropped
    (cancelled, if it is ours) and the next record tried."""
    tried: list[str] = []
    while (held := warm.claim(CLOUD, spec, nodes, exclude=tried)) is not None:
        with held:  # the lock goes on every path; the record once the job is used up
            kept = held.warm
            tried.append(kept.id)
            job, mark = str(kept.record["job"]), str(kept.record["mark"])
            found = api.own_job(login, job)
            ours = (
                found is not None
                and found.name == kept.record["name"]
                and mark in found.comment.split()
            )
            if found is None or not ours or found.state != "RUNNING":
                state = "gone" if not ours or found is None else found.state.lower()
                reporter.status(f"the kept Slurm job {job} of pool {kept.pool} is {state}")
                if ours:
                    api.cancel(login, jobs=[job], timeout=cancel_timeout)
                held.forget()
                continue
            comment = _KEEP_TOKENS.sub("", found.comment)
            comment = re.sub(r"\bpool=\S+", f"pool={pool}", comment)
            try:
                api.update_job(login, job, comment=comment, name=f"{api.JOB_PREFIX}{pool}")
            except ProvisionError as exc:
                reporter.status(f"the kept Slurm job {job} cannot be adopted: {exc}")
                api.cancel(login, jobs=[job], timeout=cancel_timeout)
                held.forget()
                continue
            held.forget()  # the job is this pool's now
            left = "" if found.time_left is None else f", {found.time_left:.0f} s to its limit"
            reporter.status(f"adopting Slurm job {job} of pool {kept.pool} ({found.nodes}{left})")
            return Adopted(job, mark, found.nodes)
    return None
