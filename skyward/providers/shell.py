"""The shell layer SSH hosts and Slurm nodes share: POSIX shell lines run somewhere else.

::

    AccessOptions   what a user says about reaching and preparing machines (``sky.SSH``,
                    ``sky.Slurm``'s login host and nodes) → ``Access``, the same for every
                    machine of a pool (the clouds make theirs from their own options)
    Runner          runs a shell line to its end: an SSH ``Connection``, a Slurm login
                    (``slurm.login``), a job step on a compute node (``slurm.steps``)
    Shell           a runner that also writes files: a machine being made ready for workers
                    (``ssh.hosts``' bootstrap and uploads)
    WorkerFiles     what a ready machine has for its workers, and the shell line that starts
                    one there (``ssh.hosts.HostNode``, ``slurm.steps.SlurmNode``)

Both ``ssh/`` and ``slurm/`` import this module, and it imports neither.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_WORKDIR = "~/.cache/skyward"


@dataclass(frozen=True)
class Access:
    """How to reach and prepare the machines; the same for every machine of a pool.

    ``boot_timeout``: how long refused, reset or silent connections are retried, for a
    machine that is still booting (0 for hosts that are up already). ``gpus``: how many GPUs
    each machine must show once prepared (the machine type's count, ``machine_type`` naming
    it in the error); None: whatever it has.
    """

    key_file: Path | None = None
    known_hosts: Path | None = None
    accept_new_hosts: bool = False
    python: str | None = None
    workdir: str = DEFAULT_WORKDIR
    connect_timeout: float = 15.0
    keepalive: float = 5.0
    link_timeout: float = 20.0
    boot_timeout: float = 0.0
    gpus: int | None = None
    machine_type: str = ""
    # Accelerators each machine has that nvidia-smi does not list (a TPU host's chips): the
    # node's count, as the cloud says it; None: the GPUs nvidia-smi lists.
    chips: int | None = None
    # The machines run as an instance profile (EC2): volumes without keys use it.
    instance_profile: bool = False


class AccessOptions(BaseModel):
    """The options ``sky.SSH`` and ``sky.Slurm`` share, as ``SSH``'s docstring describes
    them: the SSH link (``key``, ``known_hosts``, ``accept_new_hosts``, ``connect_timeout``,
    ``keepalive``, ``link_timeout``) and the machines' environment (``python``, ``workdir``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: Path | None = None
    known_hosts: Path | None = None
    accept_new_hosts: bool = False
    python: str | None = Field(default=None, min_length=1)
    workdir: str = Field(default=DEFAULT_WORKDIR, min_length=1)
    connect_timeout: float = Field(default=15.0, gt=0)
    keepalive: float = Field(default=5.0, ge=1)
    link_timeout: float = Field(default=20.0, ge=2)

    @field_validator("key")
    @classmethod
    def _key(cls, key: Path | None) -> Path | None:
        if key is None:
            return None
        path = _expand(key)
        if not path.is_file():
            raise ValueError(f"no private key file at {key}")
        return path

    @field_validator("known_hosts")
    @classmethod
    def _known_hosts(cls, known_hosts: Path | None) -> Path | None:
        return None if known_hosts is None else _expand(known_hosts)

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, workdir: str) -> str:
        if not (workdir.startswith("/") or workdir == "~" or workdir.startswith("~/")):
            raise ValueError(f"workdir must be absolute or start with ~/, not {workdir!r}")
        return workdir.rstrip("/") or "/"

    @property
    def access(self) -> Access:
        return Access(
            key_file=self.key,
            known_hosts=self.known_hosts,
            accept_new_hosts=self.accept_new_hosts,
            python=self.python,
            workdir=self.workdir,
            connect_timeout=self.connect_timeout,
            keepalive=self.keepalive,
            link_timeout=self.link_timeout,
        )


def _expand(path: Path) -> Path:
    """``~`` and ``~user`` expanded; a user that does not exist is a ``ValueError``."""
    try:
        return path.expanduser()
    except RuntimeError as exc:  # "~nobody-here/..."
        raise ValueError(f"cannot expand {str(path)!r}: {exc}") from exc


class Runner(Protocol):
    """Runs POSIX shell lines on one machine. Thread-safe."""

    @property
    def target(self) -> object:
        """The machine, as messages name it."""
        ...

    @property
    def alive(self) -> bool:
        """False once the link to the machine has ended."""
        ...

    def run(
        self,
        command: str,
        *,
        on_line: Callable[[str], None] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
    ) -> tuple[int, str]:
        """Run ``command`` to its end, ``stdin`` on its stdin: its exit status (-1 if the
        link ended first) and its output, stdout and stderr merged, also streamed line by
        line to ``on_line``. ``ProvisionError`` when it outlasts ``timeout`` (unbounded by
        default; a Slurm login bounds its commands)."""
        ...


class Shell(Runner, Protocol):
    """A machine being made ready for workers: run commands, write files."""

    def upload(self, data: bytes, path: str, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` (relative: from the home directory), atomically."""
        ...


def shell_path(path: str) -> str:
    """``path`` for a POSIX shell: ``~/x`` becomes ``"$HOME"/x``, the rest quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


@dataclass(frozen=True)
class WorkerFiles:
    """What a ready machine has for its workers: Skyward's directory there (``workdir``,
    the workers' working directory), the image's environment (``env_dir``), this skyward
    package and the image's includes (``included``, when it has some)."""

    workdir: str
    env_dir: str
    package: str
    included: str | None = None

    def command(self, rank: int, env: Mapping[str, str], *, announce: str, wait: bool) -> str:
        """The shell line that starts worker ``rank`` with ``env``, first echoing
        ``announce`` (shell words: the transport's marker line) to stderr.

        ``wait``: the shell waits for the worker and exits with its status (over SSH: the
        shell turns death by signal N into status 128 + N, which paramiko reports, while it
        ignores SSH's exit-signal); otherwise the shell becomes the worker (a Slurm step).
        """
        # The workers import skyward from the package, then the image's includes.
        python_path = ":".join(shell_path(p) for p in (self.package, self.included) if p)
        assignments = " ".join(
            [f"{name}={shlex.quote(value)}" for name, value in sorted(env.items())]
            + [f"PYTHONPATH={python_path}"]
        )
        worker = (
            f"env {assignments} {shell_path(self.env_dir)}/bin/python -m skyward.worker "
            f"--node {rank}"
        )
        last = f"{worker}; exit $?" if wait else f"exec {worker}"
        return f"cd {shell_path(self.workdir)} || exit 1; echo {announce} >&2; {last}"
