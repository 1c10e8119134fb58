"""``Slurm(...)``: a pool is one Slurm job, and each node's worker a job step in it.

::

    provision   reach the login host (SSH, host key checked; or this machine) → a job kept
                by a pool like this one, adopted (``warm``), or sbatch the holder script
                (``job``) → wait until it runs, the queue's reason on the progress
                display → probe the nodes (``steps``: their addresses, GPUs, and which
                share a filesystem) → bootstrap once per filesystem, as steps (nothing to
                do where the image's environment is there) → SlurmNodes
    workers     srun --jobid=J --overlap ... python -m skyward.worker, one step per node;
                its stdin/stdout the worker's link (over the login host's SSH channel)
    terminate   scancel the job, wait until it has left the queue; or, with keep_warm,
                leave it to its holder and the next pool like this one (``warm``)
    inventory   this user's skyward-* jobs (``skyward ls --slurm`` / ``down``)

Skyward never works around the scheduler: no SSH into compute nodes, no process outside the
job. The commands and their formats live in ``api``, where they run in ``login``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from collections.abc import Mapping

from pydantic import Field, field_validator

from skyward._errors import SkywardError
from skyward.client.extras import check
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.base import (
    TAG_OWNER,
    Allocation,
    Inventory,
    ProvisionRequest,
    owner,
    refuse_spot,
)
from skyward.providers.cloud.warm import spec_digest
from skyward.providers.shell import AccessOptions
from skyward.providers.slurm import api, warm
from skyward.providers.slurm.inventory import SlurmInventory
from skyward.providers.slurm.job import SlurmAllocation, job_mark, submit, wait_running
from skyward.providers.slurm.login import Login, open_login
from skyward.providers.slurm.steps import open_nodes
from skyward.providers.ssh.bootstrap import Plan
from skyward.providers.ssh.connection import Target
from skyward.providers.ssh.hosts import HostTarget, bootstrap_plan

_MAX_SECONDS = 365 * 24 * 3600.0
# Slurm's --time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; or unlimited.
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^(UNLIMITED|unlimited|INFINITE|infinite)$")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")  # a partition, account, QOS, reservation name
# Options Skyward sets itself: asking for them through sbatch_options would undo the pool.
_OWN_OPTIONS = {
    "job-name": "the pool's name",
    "nodes": "nodes=",
    "ntasks": "one task per node",
    "ntasks-per-node": "one task per node",
    "output": "the holder's output",
    "error": "the holder's output",
    "comment": "the pool's owner and creation time",
    "chdir": "the workers' workdir",
    "parsable": "reading the job id",
    "wrap": "the holder script",
    "array": "one job per pool",
    "wait": "the pool waits itself",
    "test-only": "a real job",
    "requeue": "--no-requeue (a lost node ends the pool's job)",
    "partition": "partition=",
    "account": "account=",
    "qos": "qos=",
    "time": "time_limit=",
    "constraint": "constraint=",
    "reservation": "reservation=",
    "gres": "gres= or the pool's accelerator",
    "cpus-per-task": "the pool's vcpus=",
    "mem": "the pool's memory_gb=",
}
_ACCELERATOR = re.compile(
    r"^(?P<name>[A-Za-z][A-Za-z0-9_.]*?)(?P<memory>-\d+GB)?(?::(?P<count>\d+))?$"
)


class Slurm(AccessOptions):
    """Run the pool as one Slurm job: a holder script on its nodes, a worker per node as a
    job step.

    - ``login``: ``"[user@]host[:port]"`` of a login node, reached over SSH (host key checked
      against ``known_hosts``, as ``sky.SSH`` does); ``None``: this machine is one (its
      ``sbatch``, ``srun``, ``squeue`` are used directly).
    - ``partition``, ``account``, ``qos``, ``constraint``, ``reservation``: passed to sbatch.
    - ``time_limit``: the job's time limit, seconds or Slurm's own format (``"1-12:00:00"``);
      ``None``: the partition's default.
    - ``gres``: per node, as Slurm writes it (``"gpu:a100:4"``); by default the pool's
      ``accelerator`` (``"A100:4"`` is ``gpu:a100:4``, ``"GPU:2"`` any type).
    - ``modules``: ``module load``-ed before the bootstrap and in every worker.
    - ``python``: the interpreter the environment is made from (after the modules), by
      default ``python3.X`` of the client's minor version on the node's ``PATH``.
    - ``workdir``: Skyward's directory on the cluster (environments, the uploaded package);
      the only thing a pool leaves there. Bootstrapped once per filesystem it lives on.
    - ``sbatch_options``: more sbatch options, ``{"exclusive": True, "mem-per-gpu": "40G"}``.
    - ``idle_timeout``: the job ends itself once no step of the pool has run for this long
      (the client is gone). ``cancel_timeout``: how long teardown waits for the job to
      leave the queue after ``scancel``.
    - ``key``, ``known_hosts``, ``accept_new_hosts``, ``connect_timeout``, ``keepalive``,
      ``link_timeout``: the SSH link to the login host, as for ``sky.SSH``.
    """

    login: str | None = None
    partition: str | None = Field(default=None, pattern=_NAME.pattern)
    account: str | None = Field(default=None, pattern=_NAME.pattern)
    qos: str | None = Field(default=None, pattern=_NAME.pattern)
    time_limit: float | str | None = None
    constraint: str | None = Field(default=None, min_length=1)
    reservation: str | None = Field(default=None, pattern=_NAME.pattern)
    gres: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_:.,/-]+$")
    modules: tuple[str, ...] = ()
    sbatch_options: Mapping[str, str | int | bool] = Field(default_factory=dict)
    idle_timeout: float = Field(default=300.0, ge=1, le=_MAX_SECONDS)
    cancel_timeout: float = Field(default=120.0, gt=0, le=_MAX_SECONDS)

    @field_validator("login")
    @classmethod
    def _login(cls, login: str | None) -> str | None:
        if login is not None:
            Target.parse(login)
        return login

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, limit: float | str | None) -> float | str | None:
        if isinstance(limit, str) and not _TIME.match(limit.strip()):
            raise ValueError(
                f"time_limit={limit!r} is not Slurm's format: give seconds, or 'MM', "
                f"'HH:MM:SS', 'D-HH:MM:SS' (or 'UNLIMITED')"
            )
        if isinstance(limit, int | float) and not 0 < limit <= _MAX_SECONDS:
            raise ValueError("time_limit in seconds must be positive and under a year")
        return limit.strip() if isinstance(limit, str) else limit

    @field_validator("modules")
    @classmethod
    def _modules(cls, modules: tuple[str, ...]) -> tuple[str, ...]:
        for module in modules:
            if not module or any(c.isspace() for c in module):
                raise ValueError(f"modules: {module!r} is not a module name")
        return modules

    @field_validator("sbatch_options")
    @classmethod
    def _sbatch_options(
        cls, options: Mapping[str, str | int | bool]
    ) -> Mapping[str, str | int | bool]:
        for key in options:
            name = key.removeprefix("--")
            if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
                raise ValueError(f"sbatch_options: {key!r} is not a long sbatch option name")
            if name in _OWN_OPTIONS:
                raise ValueError(
                    f"sbatch_options: {key!r} is set by Skyward ({_OWN_OPTIONS[name]}); "
                    f"leave it out"
                )
        return {key.removeprefix("--"): value for key, value in options.items()}

    @property
    def kind(self) -> str:
        return "slurm"

    @property
    def target(self) -> HostTarget | None:
        return None if self.login is None else HostTarget(Target.parse(self.login))

    def open_login(self, deadline: Deadline | None = None) -> Login:
        """Reach the login host (or this machine); for ``skyward ls`` and the provider."""
        bound = deadline or Deadline(self.connect_timeout + 30, "reaching the login host")
        return open_login(self.target, self.access, bound)

    def sbatch_arguments(self, request: ProvisionRequest) -> list[str]:
        """The resource options of the pool's job (``ValueError`` for an accelerator that
        cannot be one)."""
        options = []
        for flag, value in (
            ("partition", self.partition),
            ("account", self.account),
            ("qos", self.qos),
            ("constraint", self.constraint),
            ("reservation", self.reservation),
        ):
            if value is not None:
                options.append(f"--{flag}={shlex.quote(value)}")
        if self.time_limit is not None:
            options.append(f"--time={_slurm_time(self.time_limit)}")
        gres = self.gres or gres_for(request.accelerator)
        if gres:
            options.append(f"--gres={shlex.quote(gres)}")
        if request.vcpus is not None:
            options.append(f"--cpus-per-task={math.ceil(request.vcpus)}")
        if request.memory_gb is not None:
            options.append(f"--mem={math.ceil(request.memory_gb * 1e9 / 2**20)}M")
        for key, setting in self.sbatch_options.items():
            if setting is True:
                options.append(f"--{key}")
            elif setting is not False:
                options.append(f"--{key}={shlex.quote(str(setting))}")
        return options

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is touched."""
        if self.login is not None:
            check("paramiko", feature="sky.Slurm(login=...)")
        refuse_spot(request, "Slurm runs the cluster's own nodes")
        if request.volumes:
            raise ValueError(
                "sky.Slurm does not mount volumes: a cluster's nodes share its own file "
                "systems. Put the data there (or mount the bucket on the nodes yourself) and "
                "leave volumes= out"
            )
        self.sbatch_arguments(request)

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        self.check(request)
        ranks = range(request.nodes)
        if self.login is not None:
            for rank in ranks:
                reporter.phase(rank, "connecting", f"login host {self.login}")
        login = self.open_login(request.deadline)
        job: str | None = None
        mark = job_mark()
        plan = bootstrap_plan(request.image, self.access)
        spec = spec_digest(self, request)
        keeping = warm.Keeping(
            where=self.login or "local",
            spec=spec,
            image=plan.digest,
            pool=request.pool,
            owner=request.tags.get(TAG_OWNER) or owner(),
            mark=mark,
        )
        try:
            adopted = warm.adopt(
                login,
                spec=spec,
                nodes=request.nodes,
                pool=request.pool,
                reporter=reporter,
                cancel_timeout=self.cancel_timeout,
            )
            if adopted is not None:
                job = adopted.job
                try:
                    return self._open(
                        login, job, adopted.nodes, request, reporter, plan,
                        dataclasses.replace(keeping, mark=adopted.mark),
                    )  # fmt: skip
                except SkywardError as exc:
                    now = api.job_state(login, job)
                    if now is not None and now.state == "RUNNING":
                        raise  # not the kept job's doing: the start fails, as a new one would
                    reporter.status(f"the kept Slurm job {job} ended as it was adopted ({exc})")
                    api.cancel(login, jobs=[job], timeout=self.cancel_timeout)
                    job = None
            for rank in ranks:
                reporter.phase(rank, "provisioning", "submitting the Slurm job")
            job = submit(
                login,
                pool=request.pool,
                mark=mark,
                nodes=request.nodes,
                tags=dict(request.tags),
                options=self.sbatch_arguments(request),
                idle_timeout=self.idle_timeout,
                hint=lambda said: _hint(login, self, request, said),
            )
            state = wait_running(
                login,
                job,
                nodes=request.nodes,
                deadline=request.deadline,
                reporter=reporter,
                never=lambda state: _never(login, job or "", state, self, request),
            )
            return self._open(login, job, state.nodes, request, reporter, plan, keeping)
        except BaseException as error:
            try:
                api.cancel(
                    login, jobs=[job] if job else [], marked=mark, timeout=self.cancel_timeout
                )
            except Exception as cleanup_error:
                error.add_note(
                    f"skyward: the pool's Slurm job may be left ({cleanup_error}); "
                    f"`skyward down --slurm {self.login or 'local'} --pool {request.pool}` "
                    f"cancels it"
                )
            finally:
                login.close()
            raise

    def _open(
        self,
        login: Login,
        job: str,
        nodelist: str,
        request: ProvisionRequest,
        reporter: Reporter,
        plan: Plan,
        keeping: warm.Keeping,
    ) -> SlurmAllocation:
        """The running job's nodes, probed and bootstrapped, as the pool's allocation."""
        for rank in range(request.nodes):
            reporter.phase(rank, "provisioning", f"Slurm job {job} runs on {nodelist}")
        made = open_nodes(
            login,
            job,
            api.nodes_of(login, nodelist),
            plan=plan,
            image=request.image,
            modules=self.modules,
            reporter=reporter,
            deadline=request.deadline,
        )
        return SlurmAllocation(
            made,
            login=login,
            job=job,
            cancel_timeout=self.cancel_timeout,
            reopen=self.open_login,
            keeping=keeping,
        )

    def inventory(self) -> Inventory | None:
        return SlurmInventory(
            self.login or "local", self.open_login, cancel_timeout=self.cancel_timeout
        )


def gres_for(accelerator: str | None) -> str | None:
    """``"A100:4"`` → ``"gpu:a100:4"`` (per node); ``"GPU:2"`` → ``"gpu:2"``."""
    if accelerator is None:
        return None
    match = _ACCELERATOR.match(accelerator.strip())
    if match is None:
        raise ValueError(
            f"accelerator={accelerator!r} cannot be a Slurm gres; write it as TYPE[:COUNT] "
            f"('A100:4'), or give sky.Slurm(gres='gpu:<type>:<count>') as `sinfo -o %G` lists"
        )
    if match["memory"]:
        raise ValueError(
            f"accelerator={accelerator!r}: Slurm clusters name GPU memory sizes their own "
            f"way; give sky.Slurm(gres='gpu:<type>:<count>') with the type `sinfo -o %G` lists "
            f"(for example gres='gpu:a100_80gb:4')"
        )
    count = match["count"] or "1"
    name = match["name"].lower()
    return f"gpu:{count}" if name == "gpu" else f"gpu:{name}:{count}"


def _slurm_time(limit: float | str) -> str:
    if isinstance(limit, str):
        return limit
    minutes = math.ceil(limit / 60)  # Slurm counts whole minutes
    days, minutes = divmod(minutes, 24 * 60)
    return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def _hint(login: Login, slurm: Slurm, request: ProvisionRequest, said: str) -> str:
    """What to do about sbatch's refusal ``said``, with what the cluster has."""
    partition = slurm.partition
    if "Invalid partition" in said or "invalid partition" in said:
        _, out = login.run("sinfo -h -o %P")
        names = ", ".join(sorted({p.strip() for p in out.split() if p.strip()}))
        return f"The partitions here: {names} (the one marked * is the default)."
    if "node configuration is not available" in said or "Invalid generic resource" in said:
        where = f" -p {shlex.quote(partition)}" if partition else ""
        _, out = login.run(f"sinfo -h{where} -o '%P %G %c %m'")
        listing = "\n".join(f"  {line}" for line in out.strip().splitlines())
        gres = slurm.gres or gres_for(request.accelerator)
        asked = f"--gres={gres}, " if gres else ""
        return (
            f"No node of {f'partition {partition}' if partition else 'the default partition'} "
            f"has what the pool asked per node ({asked}{request.vcpus or 1:g} CPUs"
            f"{f', {request.memory_gb:g} GB' if request.memory_gb else ''}). What it has "
            f"(partition, gres, CPUs, memory in MB):\n{listing}\nName the gres as the "
            f"cluster does with sky.Slurm(gres=...), or pick another partition."
        )
    if "Invalid account" in said:
        return (
            "`sacctmgr show assoc user=$USER format=account,partition,qos` lists the accounts "
            "you may use; give one with sky.Slurm(account=...)."
        )
    if "Invalid qos" in said:
        return "`sacctmgr show assoc user=$USER format=account,qos` lists the QOS you may use."
    if "Invalid feature" in said:
        _, out = login.run("sinfo -h -o '%P %f'")
        return f"The features nodes offer (partition, features):\n{out.strip()}"
    if "reservation is invalid" in said:
        return "`scontrol show reservation` lists the reservations you may use."
    if "time limit" in said.lower():
        _, out = login.run("sinfo -h -o '%P %l'")
        return f"The partitions' time limits:\n{out.strip()}"
    if "policy" in said or "Limit" in said:
        return (
            "A policy of the cluster refused the job (too many jobs, or a limit of your QOS "
            "or account); `sacctmgr show qos` and your cluster's documentation say which."
        )
    return ""


def _never(
    login: Login, job: str, state: api.JobState, slurm: Slurm, request: ProvisionRequest
) -> str:
    record = api.job_record(login, job)
    partition = record.get("Partition") or slurm.partition or ""
    _, out = login.run(f"scontrol -o show partition {shlex.quote(partition)}")
    limits = [
        part
        for part in out.split()
        if part.split("=")[0]
        in ("MaxTime", "MaxNodes", "TotalNodes", "MaxCPUsPerNode", "MaxMemPerNode", "DefaultTime")
    ]
    asked = [f"nodes={request.nodes}"]
    if record.get("TimeLimit"):
        asked.append(f"time limit {record['TimeLimit']}")
    if gres := slurm.gres or gres_for(request.accelerator):
        asked.append(f"gres {gres} per node")
    if request.vcpus:
        asked.append(f"{math.ceil(request.vcpus)} CPUs per node")
    return (
        f"Slurm will never start job {job} as asked: {state.reason} "
        f"({state.never_starts()}). The pool asked for {', '.join(asked)}; partition "
        f"{partition} allows {' '.join(limits) or '(scontrol show partition says nothing)'}. "
        f"Ask for less, or choose another partition (`sinfo -s` lists them)."
    )
