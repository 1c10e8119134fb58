"""Work inside the pool's job: every process Skyward starts on a compute node is a job step,
so Slurm's accounting, limits and cleanup cover all of it.

::

    srun --jobid=J --overlap --nodes=1 --ntasks=1 --nodelist=NODE --unbuffered
         --job-name=skyward-<what> sh -c '<module load ...> <the command>'

    probe          two steps on every node: each writes a marker file in the workdir, then
                   each looks for every node's marker (by name: NFS caches directory
                   listings, not lookups of names never seen). Nodes that see each other's
                   markers share a filesystem: one bootstrap each group, not one per node.
                   Also each node's GPUs (Slurm's CUDA_VISIBLE_DEVICES) and, when
                   ``NodeAddr`` is a name, where another node of the job resolves it.
    StepShell      ``ssh.hosts``' bootstrap and uploads, run as steps on one node
    SlurmNode      ``spawn_worker``: a step running ``python -m skyward.worker``; the step's
                   stdin and stdout are the worker's link (``-u``: srun would otherwise
                   hold output until a newline)
    SlurmTransport that step's streams; ``kill`` is ``scancel`` of the step; a step Slurm
                   ended (cancelled, node failure, time limit) is said in Slurm's words

``--overlap`` lets steps share the job's CPUs and GPUs with the holder script and with each
other; without it a second step on a node waits for the first to end.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skyward._errors import ProvisionError
from skyward._image import Image
from skyward.client.futures import Deadline, parallel
from skyward.client.phases import Reporter
from skyward.link import protocol as proto
from skyward.link.channel import Transport
from skyward.providers.shell import WorkerFiles, shell_path
from skyward.providers.slurm.login import Login
from skyward.providers.ssh.bootstrap import Plan
from skyward.providers.ssh.hosts import bootstrap, upload_includes, upload_package

_KILL_TIMEOUT = 10.0  # seconds a step's scancel may take before the srun is killed anyway
_TAIL_BYTES = 8192  # of a step's stderr, kept to find Slurm's own words in

# What slurmstepd and srun print when Slurm, not the worker, ended a step.
_ENDED_BY_SLURM = re.compile(
    r"^.*(?:\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT .*"
    r"|srun: error: .*(?:[Nn]ode failure|Job step aborted|[Tt]imed out|step .* cancelled).*)$",
    re.MULTILINE,
)


def srun(job: str, nodes: Sequence[str], name: str, script: str) -> str:
    """The shell line that runs ``script`` (POSIX sh) once on each of ``nodes``, as a step
    of ``job`` named ``name``."""
    count = len(nodes)
    return (
        f"srun --jobid={job} --overlap --nodes={count} --ntasks={count} --ntasks-per-node=1 "
        f"--nodelist={','.join(nodes)} --unbuffered --mpi=none --job-name={shlex.quote(name)} "
        f'--chdir="$HOME" sh -c {shlex.quote(script)}'
    )


def module_prelude(modules: Sequence[str]) -> str:
    """Shell lines that ``module load`` each of ``modules`` (Lmod or Environment Modules),
    first finding the ``module`` function when the step's shell lacks it."""
    if not modules:
        return ""
    names = " ".join(shlex.quote(m) for m in modules)
    inits = " ".join(
        [
            '"${MODULESHOME:-/nonexistent}/init/sh"',
            "/etc/profile.d/lmod.sh",
            "/etc/profile.d/modules.sh",
            "/usr/share/lmod/lmod/init/sh",
            "/usr/share/Modules/init/sh",
        ]
    )
    return (
        "if ! command -v module >/dev/null 2>&1; then\n"
        f'  for init in {inits}; do if [ -r "$init" ]; then . "$init"; break; fi; done\n'
        "fi\n"
        f"module load {names} || {{ echo "
        f'{shlex.quote(f"skyward: `module load {names}` failed on")} "$(hostname)" >&2; '
        "exit 1; }\n"
    )


# ── the probe ─────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Probed:
    """One node of the job as the probe saw it."""

    name: str  # the Slurm node name
    address: str  # where the other nodes reach it
    accelerators: int  # GPUs Slurm gives its steps
    group: int  # nodes with the same group share the workdir's filesystem


def probe(
    login: Login, job: str, nodes: Sequence[tuple[str, str]], workdir: str
) -> tuple[list[Probed], str]:
    """``nodes`` (name, Slurm's ``NodeAddr``) as the job's own steps see them, and the shell
    line that removes the probe's marker files (run by each group's first step)."""
    names = [name for name, _ in nodes]
    home = shell_path(workdir)
    marker = f"{home}/.skyward-fs-{secrets.token_hex(6)}-"
    several = len(nodes) > 1
    first = [
        f"mkdir -p {home} || exit 1",
        f': > {marker}"$SLURMD_NODENAME" || exit 1' if several else ":",
        'echo "skyward-gpus $SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES:-}"',
    ]
    gpus: dict[str, int] = {}
    for said in _say(login, job, names, first):
        if said[0] == "skyward-gpus" and len(said) >= 2:
            gpus[said[1]] = _count_devices(said[2] if len(said) > 2 else "")
    by_name = [address for _, address in nodes if not _is_ip(address)]
    sees: dict[str, set[str]] = {name: {name} for name in names}
    resolved: dict[str, dict[str, str]] = {}  # node -> {name it resolved: address}
    if several:
        # Only after every marker is written, and by name, not by listing the directory.
        second = [
            f'for n in {" ".join(names)}; do if [ -e {marker}"$n" ]; then '
            'echo "skyward-sees $SLURMD_NODENAME $n"; fi; done',
            *(
                f'echo "skyward-addr $SLURMD_NODENAME {a} '
                f"$(getent ahostsv4 {shlex.quote(a)} | awk 'NR==1{{print $1}}')\""
                for a in by_name
            ),
        ]
        for said in _say(login, job, names, second):
            if said[0] == "skyward-sees" and len(said) == 3:
                sees.setdefault(said[1], set()).add(said[2])
            elif said[0] == "skyward-addr" and len(said) == 4:
                resolved.setdefault(said[1], {})[said[2]] = said[3]
    groups: dict[frozenset[str], int] = {}  # the nodes that see each other: a filesystem
    probed = []
    for name, address in nodes:
        if address in by_name:
            # As another node of the job resolves it: a host's own name may be loopback on
            # itself (Debian's 127.0.1.1), which the others cannot reach.
            others = [resolved.get(n, {}).get(address) for n in names if n != name]
            address = next((a for a in others if a), address)
        group = groups.setdefault(frozenset(sees.get(name, {name})), len(groups))
        probed.append(Probed(name, address, gpus.get(name, 0), group))
    return probed, f"rm -f {marker}*" if several else ""


def _say(login: Login, job: str, names: Sequence[str], lines: Sequence[str]) -> list[list[str]]:
    """Run ``lines`` once on each node; the words of every output line they mark."""
    status, output = login.run(srun(job, names, "skyward-probe", "\n".join(lines)))
    if status != 0:
        raise ProvisionError(
            f"Slurm job {job}: the probe step failed ({status}); its output:\n{output.strip()}"
        )
    return [line.split() for line in output.splitlines() if line.startswith("skyward-")]


def _count_devices(visible: str) -> int:
    # Slurm sets "NoDevFiles" when the gres has no device files: no usable GPU.
    entries = [e for e in visible.split(",") if e]
    return len(entries) if all(e.isdigit() or e.startswith("GPU-") for e in entries) else 0


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# ── bootstrap, as steps ───────────────────────────────────────────────────────────────────


class StepShell:
    """One compute node of the job as a ``shell.Shell``: each command a step there."""

    def __init__(self, login: Login, job: str, node: str, prelude: str) -> None:
        self._login = login
        self._job = job
        self._node = node
        self._prelude = prelude

    @property
    def target(self) -> str:
        return f"{self._node} (Slurm job {self._job} via {self._login.target})"

    @property
    def alive(self) -> bool:
        return self._login.alive

    def run(
        self,
        command: str,
        *,
        on_line: Callable[[str], None] | None = None,
        stdin: bytes = b"",
        timeout: float | None = None,
    ) -> tuple[int, str]:
        line = srun(self._job, [self._node], "skyward-bootstrap", self._prelude + command)
        return self._login.run(line, on_line=on_line, stdin=stdin, timeout=timeout)

    def upload(self, data: bytes, path: str, *, mode: int = 0o644) -> None:
        # Relative paths are from the home directory, as SFTP has them.
        part = f"{path}.part-{secrets.token_hex(4)}"
        status, output = self.run(
            f'cd "$HOME" && cat > {shlex.quote(part)} && chmod {mode:o} {shlex.quote(part)} '
            f"&& mv -f {shlex.quote(part)} {shlex.quote(path)}",
            stdin=data,
        )
        if status != 0:
            raise ProvisionError(f"{self.target}: could not upload {path}: {output.strip()}")


def open_nodes(
    login: Login,
    job: str,
    nodes: Sequence[tuple[str, str]],
    *,
    plan: Plan,
    image: Image,
    modules: Sequence[str],
    reporter: Reporter,
    deadline: Deadline,
) -> list[SlurmNode]:
    """The running job's ``nodes`` (name, ``NodeAddr``), probed and prepared, by rank."""
    probed, cleanup = probe(login, job, nodes, plan.workdir)
    files = bootstrap_groups(
        login,
        job,
        probed,
        plan=plan,
        image=image,
        modules=modules,
        reporter=reporter,
        deadline=deadline,
        cleanup=cleanup,
    )
    return [
        SlurmNode(login, job, node, files=files[node.group], modules=modules) for node in probed
    ]


def bootstrap_groups(
    login: Login,
    job: str,
    probed: Sequence[Probed],
    *,
    plan: Plan,
    image: Image,
    modules: Sequence[str],
    reporter: Reporter,
    deadline: Deadline,
    cleanup: str,
) -> dict[int, WorkerFiles]:
    """Bootstrap and upload once per filesystem group, on its first node, in parallel;
    what each group's workers run, by group."""
    leaders: dict[int, int] = {}
    for rank, node in enumerate(probed):
        leaders.setdefault(node.group, rank)
    for rank, node in enumerate(probed):
        leader = leaders[node.group]
        detail = f"image {plan.digest}"
        if leader != rank:
            detail += f", on node {leader}'s filesystem ({probed[leader].name})"
        reporter.phase(rank, "bootstrapping", detail)

    def one(group: int) -> tuple[int, WorkerFiles]:
        rank = leaders[group]
        shell = StepShell(login, job, probed[rank].name, module_prelude(modules) + cleanup + "\n")

        def log(line: str) -> None:
            reporter.log(rank, line)

        bootstrap(shell, plan, log)
        package = upload_package(shell, plan, log)
        included = upload_includes(shell, plan, image, log)
        return group, WorkerFiles(plan.workdir, plan.env_dir, package, included)

    done = parallel(one, list(leaders), deadline, "bootstrapping the nodes")
    return dict(done)


# ── workers ───────────────────────────────────────────────────────────────────────────────


class SlurmNode:
    """One compute node of the pool's job; each ``spawn_worker`` is a job step there."""

    shares_files = False

    def __init__(
        self,
        login: Login,
        job: str,
        probed: Probed,
        *,
        files: WorkerFiles,
        modules: Sequence[str],
    ) -> None:
        self._login = login
        self._job = job
        self.name = probed.name
        self.address = probed.address
        self.accelerators = probed.accelerators
        self._files = files
        self._prelude = module_prelude(modules)
        self._lock = threading.Lock()  # guards: _transports, _closed
        self._transports: list[SlurmTransport] = []
        self._closed = False

    def spawn_worker(self, rank: int, env: Mapping[str, str]) -> SlurmTransport:
        marker = f"skyward-step-{secrets.token_hex(6)}"
        announce = f'"{marker} $SLURM_JOB_ID.$SLURM_STEP_ID"'
        script = self._prelude + self._files.command(rank, env, announce=announce, wait=False)
        command = srun(self._job, [self.name], f"skyward-worker-{rank}", script)
        with self._lock:
            if self._closed:
                raise ProvisionError(f"{self.name} (Slurm job {self._job}): the pool is closing")
            transport = SlurmTransport(
                self._login.spawn(command), login=self._login, node=self.name, marker=marker
            )
            self._transports.append(transport)
        return transport

    def close(self) -> None:
        """Stop this node's sruns; the job's ``scancel``, which follows, ends the steps.
        Idempotent; ``spawn_worker`` refuses from now on."""
        with self._lock:
            self._closed = True
            transports, self._transports = self._transports, []
        for transport in transports:
            transport.kill_srun()


class SlurmTransport:
    """A worker's step: the protocol over srun's stdin and stdout, its stderr as itself but
    for one line (the step's id, which ``kill`` cancels), read by the step before the
    worker starts."""

    def __init__(self, inner: Transport, *, login: Login, node: str, marker: str) -> None:
        self._inner = inner
        self._login = login
        self._node = node
        self._marker = marker.encode() + b" "
        self._step: str | None = None
        self._partial = b""  # stderr before the step's line, not yet a whole line
        self._tail = b""  # the last of the stderr, where Slurm's own words are looked for
        self._killed = False

    @property
    def step(self) -> str | None:
        """``JOB.STEP`` once the step has said it."""
        return self._step

    def write(self, parts: Sequence[proto.Part]) -> None:
        self._inner.write(parts)

    def readinto(self, buffer: memoryview) -> int | None:
        return self._inner.readinto(buffer)

    def read_frame(self) -> tuple[Any, proto.Parts]:
        return self._inner.read_frame()

    @property
    def caller_reads(self) -> bool:
        # The wire is the inner transport's (srun's stdio over its SSH channel): so is
        # whether a waiting caller may read it (see Transport.caller_reads).
        return self._inner.caller_reads

    def ready(self, timeout: float | None) -> bool:
        return self._inner.ready(timeout)

    def unblock(self) -> None:
        self._inner.unblock()

    def read_ahead(self) -> bool:
        return self._inner.read_ahead()

    def write_now(self, frame: bytes) -> bool:
        return self._inner.write_now(frame)

    def read_stderr(self) -> bytes:
        while True:
            data = self._inner.read_stderr()
            if not data:
                rest, self._partial = self._partial, b""
                return rest
            self._tail = (self._tail + data)[-_TAIL_BYTES:]
            if self._step is not None:
                return data
            self._partial += data
            out = b""
            while self._step is None and b"\n" in self._partial:
                line, self._partial = self._partial.split(b"\n", 1)
                if line.startswith(self._marker):
                    self._step = line[len(self._marker) :].decode(errors="replace").strip()
                else:
                    out += line + b"\n"
            if self._step is not None:
                out, self._partial = out + self._partial, b""
            if out:
                return out

    def wait(self, timeout: float) -> int | None:
        status = self._inner.wait(timeout)
        # srun reports a task killed by signal N as 128 + N; the contract says -N.
        if status is not None and 128 < status < 160:
            return -(status - 128)
        return status

    def kill(self) -> None:
        """``scancel`` the step (Slurm kills what it started), then the srun."""
        if not self._killed and self._step is not None and self._login.alive:
            self._killed = True
            try:
                self._login.run(f"scancel {shlex.quote(self._step)}", timeout=_KILL_TIMEOUT)
            except (ProvisionError, OSError):
                pass  # the srun's death below ends the step too, a few seconds later
        self.kill_srun()

    def kill_srun(self) -> None:
        self._inner.kill()

    def link_lost(self) -> str | None:
        lost = self._inner.link_lost()
        if lost is not None:
            return lost
        said = _ENDED_BY_SLURM.findall(self._tail.decode("utf-8", "replace"))
        if not said:
            return None
        step = f" {self._step}" if self._step else ""
        return f"Slurm ended the worker's job step{step} on {self._node} ({said[-1].strip()})"

    def close(self) -> None:
        self._inner.close()
