"""``Local()``: nodes are worker processes on this machine, on the client's own interpreter.

It is the default provider and the cheapest real double of the remote ones: the workers speak
the same protocol over subprocess pipes that remote workers speak over SSH. It installs
nothing: the image's requirements are checked against the interpreter, and a missing package
is a ``BootstrapError`` that says how to install it.

Volumes are mounted on this machine, as on a remote node (the same script,
``providers/volumes.py``), so code that reads ``/data`` runs here unchanged; this machine must
have s3fs already (the pool is refused when it is built otherwise: the local provider never
installs anything), and the mount point must be one the user may make and mount on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict

from skyward._errors import BootstrapError, ProvisionError
from skyward.link import protocol as proto
from skyward.link.turns import PipeReader
from skyward.providers.base import (
    Allocation,
    Inventory,
    Node,
    ProvisionRequest,
    refuse_keep_warm,
    refuse_spot,
)
from skyward.providers.volumes import Mounts, mount_failed, mount_script, unmount_script

if TYPE_CHECKING:
    from skyward.client.futures import Deadline
    from skyward.client.phases import Reporter

# The directory that holds the skyward package, so workers import this very copy even when
# the client runs it from a source checkout rather than an installed distribution.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class Local(BaseModel):
    """Run the pool's nodes as worker processes on this machine.

    ``python``: the interpreter for workers; default the client's own (``sys.executable``).
    It must be the same Python minor version as the client.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Its allocations add and release nodes (processes) while the pool runs: autoscaling.
    grows: ClassVar[bool] = True

    python: str | None = None

    @property
    def kind(self) -> str:
        return "local"

    @property
    def interpreter(self) -> str:
        return self.python or sys.executable

    def check(self, request: ProvisionRequest) -> None:
        """Refuse what this machine cannot be. An accelerator: the local pool's workers are
        processes on this machine's CPUs, and a pool that said "A100" here would install or
        expect GPU packages and report devices that are not there. A spot machine, or one
        with fewer cores or less memory than each node asks for (the nodes share them).
        (What the interpreter lacks is found by ``provision``.)"""
        if request.accelerator is not None:
            raise ValueError(
                f"the local pool has no {request.accelerator}: its nodes are processes on "
                f"this machine's CPUs. Leave accelerator=None to try the code here (the jax "
                f"plugin then uses CPU jax; cpu_devices= gives each node several devices), "
                f"and give the accelerator to a provider that has it. "
                f"{_who_offers(request.accelerator)}"
            )
        refuse_spot(request, "the local provider runs on this machine")
        refuse_keep_warm(
            request, "the local pool's nodes are processes on this machine, which start in a second"
        )
        cores = os.cpu_count() or 1
        if request.vcpus is not None and request.vcpus > cores:
            raise ValueError(
                f"vcpus={request.vcpus:g} per node, but this machine has {cores} CPU(s), "
                f"which the local pool's nodes share"
            )
        if request.volumes and shutil.which("s3fs") is None:
            raise ValueError(
                "the local pool mounts its volumes on this machine with s3fs, and this machine "
                "has none: install it (Debian and Ubuntu: apt-get install s3fs; macOS: brew "
                "install gromgit/fuse/s3fs-mac, with macFUSE), or leave volumes= out"
            )
        memory = _memory_gb()
        if request.memory_gb is not None and memory and request.memory_gb > memory:
            raise ValueError(
                f"memory_gb={request.memory_gb:g} per node, but this machine has "
                f"{memory:.1f} GB, which the local pool's nodes share"
            )

    def inventory(self) -> Inventory | None:
        return None  # processes die with their pool; nothing outlives it

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        missing = missing_requirements(request.image.pip, self.interpreter)
        if missing:
            listed = "\n".join(f"  - {line}" for line in missing)
            install = " ".join(shlex.quote(r) for r in request.image.pip)
            raise BootstrapError(
                f"the local pool's image needs packages that {self.interpreter} lacks:\n"
                f"{listed}\n"
                f"The local provider runs workers on this interpreter and never installs "
                f"anything itself. Install them with:\n"
                f"  {shlex.quote(self.interpreter)} -m pip install {install}"
            )
        if not Path(self.interpreter).exists():
            raise ProvisionError(f"Local(python={self.interpreter!r}): no such interpreter")
        nodes = [LocalNode(self.interpreter) for _ in range(request.nodes)]
        if not request.volumes:
            return LocalAllocation(nodes, self.interpreter)
        # One mount for every node: they are processes on this one machine.
        directory = tempfile.mkdtemp(prefix=f"skyward-volumes-{request.pool}-")
        mounts = Mounts(request.volumes, shlex.quote(directory))
        script = mount_script(mounts.volumes, mounts.directory, instance_profile=False)
        for rank in range(request.nodes):
            reporter.phase(rank, "bootstrapping", "mounting the pool's volumes")
        status, output = _sh(script)
        for line in output.splitlines():
            reporter.log(0, line)
        if status != 0:
            _sh(unmount_script(mounts.volumes, mounts.directory))
            raise mount_failed("this machine", status, output)
        return LocalAllocation(nodes, self.interpreter, mounts)


class LocalAllocation(Allocation):
    """Local nodes: more of them are only more processes, so the pool may grow and shrink.
    Volumes, when the pool has any, are one mount that every node shares, unmounted once
    its workers are gone."""

    def __init__(
        self, nodes: Sequence[LocalNode], python: str, mounts: Mounts | None = None
    ) -> None:
        super().__init__(nodes)
        self._python = python
        self._mounts = mounts

    def grow(self, ranks: Sequence[int], reporter: Reporter, deadline: Deadline) -> list[Node]:
        made: list[Node] = []
        for rank in ranks:
            deadline.check("adding a local node")  # cancelled: the pool is closing
            node = LocalNode(self._python)
            self.adopt(node)
            reporter.phase(rank, "connecting", "a process on this machine")
            made.append(node)
        return made

    def shrink(self, rank: int) -> None:
        node = self.drop(rank)
        if node is not None:
            node.close()

    def release(self) -> None:
        if self._mounts is None:
            return
        status, output = _sh(unmount_script(self._mounts.volumes, self._mounts.directory))
        if status != 0 or "could not unmount" in output:
            raise ProvisionError(f"this machine: unmounting the pool's volumes: {output.strip()}")


def _sh(script: str) -> tuple[int, str]:
    """Run a script with ``sh``; its exit status and what it printed (stdout and stderr)."""
    result = subprocess.run(
        ["sh", "-s"],
        input=script,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )
    return result.returncode, result.stdout


class LocalNode:
    """A slot on this machine; each ``spawn_worker`` starts one process."""

    address = "127.0.0.1"
    accelerators = 0
    shares_files = True

    def __init__(self, python: str) -> None:
        self._python = python
        self._lock = threading.Lock()  # guards: _processes, _closed
        self._processes: list[subprocess.Popen[bytes]] = []
        self._closed = False

    def spawn_worker(self, rank: int, env: Mapping[str, str]) -> PipeTransport:
        path = os.environ.get("PYTHONPATH")
        full_env = {
            **os.environ,
            **env,
            "PYTHONPATH": os.pathsep.join(p for p in (_PACKAGE_ROOT, path) if p),
        }
        with self._lock:
            if self._closed:  # a replacement racing the pool's teardown
                raise ProvisionError("local node: the pool is closing")
        process = subprocess.Popen(
            [self._python, "-m", "skyward.worker", "--node", str(rank)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            bufsize=0,
            # A session of its own: Ctrl-C in the terminal reaches the client, which then
            # shuts the workers down in order, instead of killing them mid-call.
            start_new_session=True,
        )
        with self._lock:
            # Kept after they exit: close() still kills what their children left behind.
            self._processes.append(process)
            closed = self._closed
        if closed:  # closed while this one started
            _kill_group(process)
            process.wait()
            raise ProvisionError("local node: the pool is closing")
        return PipeTransport(process)

    def close(self) -> None:
        """Kill every worker this node started, and what they left behind. Idempotent;
        ``spawn_worker`` refuses from now on."""
        with self._lock:
            self._closed = True
            processes, self._processes = self._processes, []
        for process in processes:
            _kill_group(process)
            process.wait()


class PipeTransport:
    """A worker's stdin/stdout (the protocol) and stderr, as subprocess pipes."""

    # A caller waiting for its result reads the pipe itself (see skyward.link.turns): a
    # PipeReader can say whether a read would wait, and nothing else reads the pipe.
    caller_reads = True

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdin and process.stdout and process.stderr
        self.process = process
        self._stdin = process.stdin
        # Buffered: a frame is several small reads (count, lengths, parts); large parts
        # still go straight into their destination buffer.
        self._stdout = process.stdout
        self._pipe = PipeReader(process.stdout.fileno(), nonblocking=True)
        # Bound once: asked on every round trip (see Transport).
        self.ready = self._pipe.ready
        self.read_frame = self._pipe.read_frame
        self.readinto = self._pipe.readinto
        self.unblock = self._pipe.unblock
        self.read_ahead = self._pipe.read_ahead
        self._stderr = process.stderr
        for stream in (process.stdin, process.stdout):
            _widen_pipe(stream.fileno())
        # A small frame a caller writes itself (write_now) goes through a non-blocking open
        # of the same pipe: one write that says "it would wait", not a poll and a write.
        self._stdin_now = _nonblocking_twin(process.stdin.fileno())
        self._writable = select.poll()  # where there is no such twin: a poll first
        self._writable.register(process.stdin.fileno(), select.POLLOUT)

    def write(self, parts: Sequence[proto.Part]) -> None:
        try:
            fd = self._stdin.fileno()
        except ValueError:  # closed after the worker was lost
            raise BrokenPipeError("the worker's stdin is closed") from None
        proto.write_parts(fd, parts)

    def read_stderr(self) -> bytes:
        data = os.read(self._stderr.fileno(), 1 << 16)
        if not data:
            # Closed here, by the only thread that reads it, never under a blocked read.
            self._stderr.close()
        return data

    def write_now(self, frame: bytes) -> bool:
        # A write of up to PIPE_BUF bytes (4 KiB on Linux) to a pipe goes in whole or not
        # at all; on a non-blocking description "not at all" is EAGAIN, at once. A stopped
        # worker's full pipe does not take it.
        fd = self._stdin_now
        if fd >= 0:
            try:
                os.write(fd, frame)
            except BlockingIOError:
                return False
            return True
        # A pipe that polls writable has a free page. poll, not select: select refuses
        # descriptors past 1023, and a client with many open files must not take that for
        # "writable" and block the pool's lock on a full pipe.
        if not self._stdin.closed:  # closed: write() raises at once, as the caller expects
            try:
                events = self._writable.poll(0)
            except OSError:
                return False  # unknown: let the sender thread write it
            room = select.POLLOUT | select.POLLERR | select.POLLHUP
            if not any(mask & room for _, mask in events):
                return False
        self.write([frame])
        return True

    def link_lost(self) -> None:
        return None  # a pipe breaks only when the process ends

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        _kill_group(self.process)

    def close(self) -> None:
        """Close the pipes to the worker and the reader's wake-up pipe. Once nothing polls
        the protocol pipe (``Transport.close``). The stderr pipe is its reader's to close,
        at its end (``read_stderr``)."""
        self._pipe.close()
        twin, self._stdin_now = self._stdin_now, -1
        if twin >= 0:
            with contextlib.suppress(OSError):
                os.close(twin)
        for stream in (self._stdin, self._stdout):
            try:
                stream.close()
            except OSError:
                pass


def _nonblocking_twin(fd: int) -> int:
    """A second, non-blocking open of the pipe ``fd`` writes to (Linux: through /proc), so
    that a write through it never waits while ``fd`` stays blocking for the sender thread;
    -1 where the system cannot reopen a pipe so."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return -1


def _memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return None  # not a POSIX system that says; nothing to check against


# Linux's default pipe holds 64 KiB, so a 100 MB argument takes ~1,500 writer/reader
# switches; 1 MiB (the unprivileged maximum) cuts that sixteenfold.
_F_SETPIPE_SZ = 1031
_PIPE_SIZE = 1 << 20


def _widen_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)
    except OSError:
        pass  # not Linux, or over /proc/sys/fs/pipe-max-size: the default still works


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker and whatever it started: it leads its own process group.

    Children the user's code left behind would otherwise outlive the pool, and hold the
    worker's stderr open so that its reader never sees the end.
    """
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def missing_requirements(requirements: Sequence[str], python: str) -> list[str]:
    """Which requirements ``python`` does not satisfy, each with what it has instead."""
    if not requirements:
        return []
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return _unsatisfied(list(requirements))
    script = (
        "import json, sys\n"
        "from skyward.providers.local import _unsatisfied\n"
        "print(json.dumps(_unsatisfied(json.loads(sys.argv[1]))))\n"
    )
    result = subprocess.run(
        [python, "-c", script, json.dumps(list(requirements))],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": _PACKAGE_ROOT},
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise BootstrapError(
            f"could not check requirements with {python}: {result.stderr.strip()[-2000:]}"
        )
    return list(json.loads(result.stdout))


def _unsatisfied(requirements: list[str]) -> list[str]:
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    missing: list[str] = []
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            missing.append(f"{text} (not a valid requirement: {exc})")
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{text} (not installed)")
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{text} (installed: {version})")
    return missing


def _who_offers(accelerator: str) -> str:
    """Which providers have ``accelerator``, for the refusal above."""
    from skyward.providers.cloud import catalog  # the tables load only for this message

    try:
        return catalog.who_offers(accelerator)
    except ValueError:  # a name outside the clouds' catalog
        return (
            f"No cloud's catalog has {accelerator!r}; sky.SSH and sky.Slurm run on machines "
            f"that have it, under their own name."
        )
