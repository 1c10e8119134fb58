"""A real Slurm cluster in network namespaces: the testbed for ``sky.Slurm``.

::

    root namespace (the tests)           one network, UTS and mount namespace per host
    ────────────────────────────────     ───────────────────────────────────────────────────
    bridge skyslT 10.123.T.1/24 ─ veth ─ slurmctl 10.123.T.2   munged, slurmctld
      │                         ─ veth ─ login    10.123.T.3   munged, sshd :22 (user skytest)
      │                         ─ veth ─ node0    10.123.T.11  munged, slurmd (4 CPUs, 2 a100)
      │                         ─ veth ─ node1    10.123.T.12  munged, slurmd
      └ cluster.run("squeue") enters the login host's namespaces as skytest

Hosts have no default route; they reach the root namespace at the bridge address
(``cluster.bridge_address``), where a test may serve what they need (a package index).

Every host's mount namespace binds over the machine's own files:

- ``/etc/hosts`` naming every host of the cluster, and a ``/etc/resolv.conf`` whose name
  server (on loopback) is not there. With the addresses written into ``slurm.conf``
  (``NodeAddr``, ``SlurmctldHost=name(addr)``) Slurm makes no DNS query: the machine's resolver
  lies behind the default route, off the machine.
- ``/etc/slurm``: the cluster's ``slurm.conf`` and ``gres.conf``, where Slurm looks on a real
  cluster. Every process also gets ``SLURM_CONF`` (sshd sets it in every login session with
  ``SetEnv``), so no client goes looking for the controller in DNS.
- ``/home/skytest``: one directory shared by every host, like an NFS home on a real cluster.
  ``cluster.home`` is that directory seen from the root namespace: what a test writes there,
  jobs read at ``/home/skytest``, and a job's working directory on the login host exists on
  the compute hosts. The rest of the filesystem is the machine's own, shared by all hosts as
  namespaces share it (so ``/tmp`` is shared too; per-host state lives in ``root/hosts/NAME``).
- the munge socket's directory: each host runs its own ``munged`` with the cluster's one key
  (made for the run); ``AuthInfo=socket=`` names one path, where each host's mount namespace
  shows that host's own socket.

A keeper process (``sleep infinity``) makes each host's UTS and mount namespaces and holds
them; every daemon is started into them with ``nsenter`` as a child of the test process, so its
PID is known. Compute hosts claim the CPUs and GPUs that ``slurm.conf`` gives them
(``SlurmdParameters=config_overrides``); the GPUs are character devices made for the run
(clones of /dev/null) named in ``gres.conf``. There is no slurmdbd and no cgroup here
(``proctrack/linuxproc``, ``task/none``): a process that leaves its job's process group
survives ``scancel``. Batch jobs are scheduled on the controller's one-second tick
(``batch_sched_delay=0``; Slurm's default waits up to 3 s).

Several test runs share the machine. A cluster takes the subnet ``10.123.T.0/24`` only while it
holds an ``flock`` on ``/run/lock/skyward-net-10.123.T.lock`` and after checking that no
address, route, namespace or link it would make exists already; it tries T = 250..254 first,
which ``support.sshhosts`` (the same locks, from PID % 250 on) never picks. While it is up,
its bridge is one the suite's network guard lets tests reach (``support.netguard``).
``close()`` cancels every job, stops every process in its namespaces by PID (zombies count
as gone), and deletes only the namespaces, links and files it made.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from support import netguard
from support.sshhosts import USER, bridge_mac, ensure_user

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "openssh-server")
CPU_PARTITION = "cpu"  # the default partition
GPU_PARTITION = "gpu"
GPU_TYPE = "a100"

# Subnet tags in the order they are tried: support.sshhosts never picks 250-254.
_TAGS = (*range(250, 255), *range(1, 250))
_DAEMON_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

Role = Literal["controller", "login", "compute"]


@dataclass(frozen=True)
class SlurmHost:
    """One host of the cluster."""

    name: str  # its hostname, and its Slurm node name for a compute host
    address: str
    role: Role
    netns: str
    veth: str  # the root namespace's end of its link, on the bridge


@dataclass(frozen=True)
class LoginEndpoint:
    """How the root namespace reaches the login host over SSH."""

    address: str
    port: int
    user: str
    key: Path  # private key, ed25519, no passphrase
    known_hosts: Path  # the login host's key under its address

    @property
    def target(self) -> str:
        return f"{self.user}@{self.address}"


def ensure_installed() -> float:
    """Install Slurm, munge and sshd if a package is missing; the seconds it took (0.0 when
    all were there). Concurrent runs on the machine install one at a time."""
    if not _missing_packages():
        return 0.0
    fd = os.open("/run/lock/skyward-slurm-install.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not _missing_packages():  # another run installed them while we waited
            return 0.0
        start = time.monotonic()
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        apt = ("apt-get", "-q", "-o", "DPkg::Lock::Timeout=600")
        for command in (
            (*apt, "update"),
            (*apt, "install", "-y", "--no-install-recommends", *PACKAGES),
        ):
            deadline = time.monotonic() + 600
            while True:
                done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
                # DPkg::Lock::Timeout waits for dpkg's lock, not for the package lists' lock.
                if "Could not get lock" not in done.stderr or time.monotonic() > deadline:
                    break
                time.sleep(2)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
        if missing := _missing_packages():
            raise RuntimeError(f"apt-get succeeded but these are not installed: {missing}")
        return time.monotonic() - start
    finally:
        os.close(fd)  # releases the lock


def _missing_packages() -> list[str]:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", *PACKAGES],
        capture_output=True,
        text=True,
        timeout=30,
    )
    installed = {
        line.split()[0] for line in done.stdout.splitlines() if line.endswith(" installed")
    }
    return [p for p in PACKAGES if p not in installed]


class SlurmCluster:
    """A controller, ``nodes`` compute hosts and a login host; a context manager.

    ``start()`` returns once every node is ``idle`` and the login host's sshd accepts
    connections; on failure it removes what it made and raises with the daemons' log tails.
    ``close()`` is idempotent and bounded. ``run`` may be called from any thread.

    Partitions: ``cpu`` (the default) and ``gpu``; every compute host is in both, with
    ``cpus_per_node`` CPUs and ``gpus_per_node`` GPUs of type ``a100``.
    """

    def __init__(
        self,
        nodes: int = 2,
        *,
        cpus_per_node: int = 4,
        gpus_per_node: int = 2,
        memory_mb: int = 4096,
        start_timeout: float = 60.0,
    ) -> None:
        if not 1 <= nodes <= 200:
            raise ValueError("nodes must be between 1 and 200")
        self.node_count = nodes
        self.cpus_per_node = cpus_per_node
        self.gpus_per_node = gpus_per_node
        self.memory_mb = memory_mb
        self.start_timeout = start_timeout
        self.timings: dict[str, float] = {}  # install_s, start_s (bring-up without install)
        self.hosts: list[SlurmHost] = []  # controller, login, then compute hosts
        self.root = Path()  # every file of the cluster, once started
        self.bridge = ""
        self.subnet = ""  # "10.123.T"
        self._lock_fd: int | None = None
        self._keepers: dict[str, subprocess.Popen[bytes]] = {}  # by host name
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}  # "slurmd@node0", ...
        self._namespace_inodes: set[int] = set()
        self._links: list[str] = []  # links in the root namespace that this cluster made
        self._deadline = 0.0  # of the start
        self._started = False
        self._closed = False

    # ── what tests use ────────────────────────────────────────────────────────────────────

    @property
    def controller(self) -> SlurmHost:
        return self.hosts[0]

    @property
    def login_host(self) -> SlurmHost:
        return self.hosts[1]

    @property
    def nodes(self) -> list[SlurmHost]:
        """The compute hosts, ``node0``, ``node1``, ..."""
        return self.hosts[2:]

    @property
    def node_names(self) -> list[str]:
        return [h.name for h in self.nodes]

    @property
    def login(self) -> LoginEndpoint:
        return LoginEndpoint(
            self.login_host.address, 22, USER, self.root / "client_key", self.root / "known_hosts"
        )

    @property
    def home(self) -> Path:
        """skytest's home as the root namespace sees it; every host mounts it at
        ``/home/skytest``."""
        return self.root / "home"

    @property
    def conf(self) -> Path:
        """``slurm.conf``; every host also sees it as ``/etc/slurm/slurm.conf``."""
        return self.root / "etc" / "slurm" / "slurm.conf"

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the cluster's network."""
        return f"{self.subnet}.1"

    def run(
        self,
        *command: str,
        user: str = USER,
        host: str = "login",
        input: str | None = None,
        timeout: float = 60.0,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``host`` (a host name) as ``user``, in the user's home, with
        the environment of a login session; e.g. ``cluster.run("squeue", "-h")``."""
        done = subprocess.run(
            self.command_on(host, command, user=user),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(
                done.returncode, list(command), done.stdout, done.stderr
            )
        return done

    def command_on(self, host: str, command: Sequence[str], *, user: str = USER) -> list[str]:
        """The argv that runs ``command`` on ``host`` as ``user``, for ``Popen``."""
        home = pwd.getpwnam(user).pw_dir
        keeper = self._keepers[host].pid
        argv = ["nsenter", "-t", str(keeper), "--net", "--uts", "--mount", f"--wdns={home}"]
        if user == "root":
            argv += ["env", "-i", f"PATH={_DAEMON_PATH}", "HOME=/root", "USER=root"]
        else:
            # --reset-env: the user's HOME, SHELL, USER, LOGNAME and PATH, as a login gets.
            argv += ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"]
            argv += ["--reset-env", "env"]
        return [*argv, f"SLURM_CONF={self.conf}", *command]

    def ssh_argv(self, *command: str) -> list[str]:
        """The OpenSSH client's argv that runs ``command`` on the login host."""
        login = self.login
        options = {
            "UserKnownHostsFile": str(login.known_hosts),
            "StrictHostKeyChecking": "yes",
            "BatchMode": "yes",
            "ConnectTimeout": "10",
        }
        argv = ["ssh", "-i", str(login.key), "-p", str(login.port)]
        for key, value in options.items():
            argv += ["-o", f"{key}={value}"]
        return [*argv, login.target, *command]

    def job_state(self, job_id: str) -> str | None:
        """The job's state as ``squeue`` shows it (``PENDING``, ``RUNNING``, ...), or None
        once it has left the queue (ended, cancelled or failed; there is no accounting, but
        ``scontrol show job`` still knows it for MinJobAge, 300 s)."""
        out = self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()
        return out or None

    def wait_job_state(
        self, job_id: str, states: set[str | None], timeout: float = 30.0
    ) -> str | None:
        """Poll until the job is in one of ``states`` (None: gone from the queue)."""
        deadline = time.monotonic() + timeout
        while (state := self.job_state(job_id)) not in states:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is {state}, not one of {states}")
            time.sleep(0.05)
        return state

    def link_down(self, host: str) -> None:
        """The host drops off the network: its end of the link goes down."""
        _run("ip", "link", "set", self._host(host).veth, "down")

    def link_up(self, host: str) -> None:
        _run("ip", "link", "set", self._host(host).veth, "up")

    def processes(self, host: str) -> list[int]:
        """PIDs of the live processes on ``host`` (in its network namespace)."""
        netns = self._host(host).netns
        return _pids_in({os.stat(f"/run/netns/{netns}").st_ino})

    def daemon(self, name: str) -> subprocess.Popen[bytes]:
        """A daemon's process: ``slurmctld``, ``slurmd@node0``, ``munged@login``, ``sshd``."""
        return self._daemons[name]

    def logs(self, lines: int = 30) -> str:
        """The last lines of every log (daemons' own and their stderr), for failures."""
        parts = []
        for log in sorted(self.root.glob("log/*")):
            if text := log.read_text(errors="replace").splitlines()[-lines:]:
                parts.append(f"── {log.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def _host(self, name: str) -> SlurmHost:
        return next(h for h in self.hosts if h.name == name)

    # ── start ─────────────────────────────────────────────────────────────────────────────

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> SlurmCluster:
        if self._started:
            raise RuntimeError("a SlurmCluster starts once")
        self._started = True
        self.timings["install_s"] = ensure_installed()
        begin = time.monotonic()
        self._deadline = begin + self.start_timeout
        try:
            ensure_user()
        except subprocess.CalledProcessError:
            pwd.getpwnam(USER)  # another run's useradd won the race; the user is all we need
        for mount_point in ("/run/sshd", "/etc/slurm", f"/home/{USER}"):
            Path(mount_point).mkdir(exist_ok=True)
        try:
            self._claim_subnet()
            self._write_files()
            self._network_up()
            for host in self.hosts:
                self._start_keeper(host)
            self._start_daemons()
            self._wait_ready()
        except BaseException as error:
            logs = self.logs() if self.root != Path() else ""
            self.close()
            if isinstance(error, Exception):
                raise RuntimeError(f"Slurm cluster did not start: {error}\n{logs}") from error
            raise
        self.timings["start_s"] = time.monotonic() - begin
        return self

    def _claim_subnet(self) -> None:
        for tag in _TAGS:
            lock = f"/run/lock/skyward-net-10.123.{tag}.lock"
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            hosts = _plan_hosts(tag, self.node_count)
            links = [f"skysl{tag}", *(h.veth for h in hosts)]
            if _subnet_free(tag) and _names_free(links, [h.netns for h in hosts]):
                self._lock_fd = fd
                self.bridge = f"skysl{tag}"
                self.subnet = f"10.123.{tag}"
                self.hosts = hosts
                return
            os.close(fd)  # held by no one but in use, e.g. left by a killed run: not ours
        raise RuntimeError("no free subnet in 10.123.0.0/16 for a Slurm cluster")

    def _write_files(self) -> None:
        root = self.root = Path(tempfile.mkdtemp(prefix="skyward-slurm-"))
        # munged refuses its socket unless every directory above it is world-executable.
        root.chmod(0o755)
        for directory in ("etc/slurm", "log", "state", "munge", "home"):
            (root / directory).mkdir(mode=0o755, parents=True)
        shutil.chown(self.home, USER, USER)
        # slurmctld runs as SlurmUser=slurm, as Debian's own configuration has it.
        shutil.chown(root / "state", "slurm", "slurm")
        (root / "log" / "slurmctld.log").touch()
        shutil.chown(root / "log" / "slurmctld.log", "slurm", "slurm")
        (root / "etc" / "hosts").write_text(
            "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts)
        )
        (root / "etc" / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        (root / "etc" / "slurm" / "slurm.conf").write_text(self._slurm_conf())
        (root / "etc" / "slurm" / "gres.conf").write_text(self._gres_conf())
        (root / "etc" / "slurm" / "plugstack.conf").write_text("")
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for host in self.hosts:
            (root / "hosts" / host.name / "munge").mkdir(mode=0o755, parents=True)
            (root / "hosts").chmod(0o755)  # mkdir's mode is masked by the umask
            (root / "hosts" / host.name).chmod(0o755)
            (root / "hosts" / host.name / "munge").chmod(0o755)
        for host in self.nodes:
            (root / "hosts" / host.name / "spool").mkdir(mode=0o755)
            (root / "hosts" / host.name / "dev").mkdir(mode=0o755)
            for index in range(self.gpus_per_node):
                # Clones of /dev/null: Slurm stats gres files; a process may open them.
                device = root / "hosts" / host.name / "dev" / f"nvidia{index}"
                os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        login = root / "hosts" / "login"
        keygen = ("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f")
        _run(*keygen, str(self.login.key))
        _run(*keygen, str(login / "ssh_host_ed25519_key"))
        kind, public = (login / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        self.login.known_hosts.write_text(f"{self.login.address} {kind} {public}\n")
        (login / "authorized_keys").write_text(Path(f"{self.login.key}.pub").read_text())
        (login / "sshd_config").write_text(
            f"Port 22\nListenAddress {self.login.address}\n"
            f"HostKey {login}/ssh_host_ed25519_key\nPidFile {login}/sshd.pid\n"
            f"AuthorizedKeysFile {login}/authorized_keys\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\n"
            "StrictModes no\n"  # /tmp, above the key files, is world-writable
            "MaxSessions 100\nMaxStartups 100:30:200\nUseDNS no\nPrintMotd no\n"
            f"SetEnv SLURM_CONF={self.conf}\n"
            "AcceptEnv SKYWARD_*\nSubsystem sftp internal-sftp\n"
        )

    def _slurm_conf(self) -> str:
        root = self.root
        nodes = ",".join(self.node_names)
        gres = f" Gres=gpu:{GPU_TYPE}:{self.gpus_per_node}" if self.gpus_per_node else ""
        node_lines = "".join(
            f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.name} "
            f"CPUs={self.cpus_per_node} Sockets=1 CoresPerSocket={self.cpus_per_node} "
            f"ThreadsPerCore=1 RealMemory={self.memory_mb}{gres} State=UNKNOWN\n"
            for h in self.nodes
        )
        return (
            "ClusterName=skyward\n"
            f"SlurmctldHost={self.controller.name}({self.controller.address})\n"
            "AuthType=auth/munge\nCredType=cred/munge\n"
            f"AuthInfo=socket={root}/munge/munge.socket\n"
            "SlurmUser=slurm\nSlurmdUser=root\n"
            f"StateSaveLocation={root}/state\n"
            f"SlurmdSpoolDir={root}/hosts/%n/spool\n"
            f"SlurmctldPidFile={root}/hosts/{self.controller.name}/slurmctld.pid\n"
            f"SlurmdPidFile={root}/hosts/%n/slurmd.pid\n"
            f"SlurmctldLogFile={root}/log/slurmctld.log\n"
            f"SlurmdLogFile={root}/log/slurmd-%n.log\n"
            # No cgroups on this machine (no systemd): track by process tree, bind nothing.
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SwitchType=switch/none\nMpiDefault=none\n"
            "SchedulerType=sched/backfill\nSchedulerParameters=batch_sched_delay=0\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            # Accounting-free: no slurmdbd.
            "AccountingStorageType=accounting_storage/none\n"
            "JobAcctGatherType=jobacct_gather/none\nJobCompType=jobcomp/none\n"
            "GresTypes=gpu\n"
            # Nodes claim the CPUs, memory and GPUs written here, not what the machine has.
            "SlurmdParameters=config_overrides\n"
            "ReturnToService=2\nKillWait=2\nInactiveLimit=0\nMessageTimeout=10\n"
            "SlurmctldTimeout=30\nSlurmdTimeout=30\nMailProg=/bin/true\n"
            f"{node_lines}"
            f"PartitionName={CPU_PARTITION} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP\n"
            f"PartitionName={GPU_PARTITION} Nodes={nodes} MaxTime=INFINITE State=UP\n"
        )

    def _gres_conf(self) -> str:
        lines = [
            f"NodeName={h.name} Name=gpu Type={GPU_TYPE} "
            f"File={self.root}/hosts/{h.name}/dev/nvidia[0-{self.gpus_per_node - 1}]\n"
            for h in self.nodes
            if self.gpus_per_node
        ]
        return "AutoDetect=off\n" + "".join(lines)

    def _network_up(self) -> None:
        self._links.append(self.bridge)  # before it is made, so that close() removes it
        # Its own MAC: one that followed its ports' would change as a port came or went.
        mac = bridge_mac(int(self.subnet.rsplit(".", 1)[1]))
        _run("ip", "link", "add", self.bridge, "address", mac, "type", "bridge")
        _run("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        netguard.our_bridges.add(self.bridge)
        for host in self.hosts:
            self._links.append(host.veth)
            _run("ip", "netns", "add", host.netns)
            self._namespace_inodes.add(os.stat(f"/run/netns/{host.netns}").st_ino)
            # The peer is made inside the namespace, already named eth0.
            _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
                 "netns", host.netns)  # fmt: skip
            _run("ip", "link", "set", host.veth, "master", self.bridge, "up")
            inside = f"addr add {host.address}/24 dev eth0\nlink set eth0 up\nlink set lo up\n"
            _run("ip", "-n", host.netns, "-batch", "-", input=inside)
            _run("nsenter", f"--net=/run/netns/{host.netns}",
                 "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")  # fmt: skip

    def _start_keeper(self, host: SlurmHost) -> None:
        """A process that makes the host's UTS and mount namespaces and holds them."""
        root = self.root
        binds = [
            (root / "etc" / "hosts", "/etc/hosts"),
            (root / "etc" / "resolv.conf", "/etc/resolv.conf"),
            (root / "etc" / "slurm", "/etc/slurm"),
            (self.home, f"/home/{USER}"),
            (root / "hosts" / host.name / "munge", root / "munge"),
        ]
        script = f"set -e; hostname {host.name}; "
        script += "".join(f"mount --bind {source} {target}; " for source, target in binds)
        script += "echo ready; exec sleep infinity"
        with open(root / "log" / f"keeper-{host.name}.stderr", "wb") as log:
            keeper = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{host.netns}",
                 "unshare", "--uts", "--mount", "--propagation=private", "sh", "-c", script],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )  # fmt: skip
        self._keepers[host.name] = keeper
        assert keeper.stdout is not None
        line = keeper.stdout.readline()  # after the mounts: daemons may enter now
        keeper.stdout.close()
        if line != b"ready\n":
            raise RuntimeError(f"{host.name}: its namespaces were not made")

    def _spawn(self, name: str, host: SlurmHost, *command: str) -> None:
        with open(self.root / "log" / f"{name}.stderr", "ab") as log:
            self._daemons[name] = subprocess.Popen(
                self.command_on(host.name, command, user="root"),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _start_daemons(self) -> None:
        root = self.root
        for host in self.hosts:
            own = root / "hosts" / host.name / "munge"
            self._spawn(
                f"munged@{host.name}",
                host,
                "munged",
                "--foreground",
                "--force",  # as root, which munged warns about
                f"--socket={root}/munge/munge.socket",  # in the host's own munge dir, bound here
                f"--key-file={root}/munge.key",
                f"--pid-file={own}/munged.pid",
                f"--seed-file={own}/munged.seed",
                f"--origin={host.address}",
            )
        sockets = [root / "hosts" / h.name / "munge" / "munge.socket" for h in self.hosts]
        self._wait("munged", lambda: all(path.exists() for path in sockets))
        self._spawn("slurmctld", self.controller, "slurmctld", "-D", "-f", str(self.conf))
        # A slurmd that finds no controller retries its registration a second later.
        ping = ("scontrol", "ping")
        self._wait("slurmctld", lambda: self.run(*ping, user="root", check=False).returncode == 0)
        for host in self.nodes:
            self._spawn(f"slurmd@{host.name}", host, "slurmd", "-D", "-f", str(self.conf))
        sshd_config = root / "hosts" / "login" / "sshd_config"
        self._spawn("sshd", self.login_host, "/usr/sbin/sshd", "-D", "-e", "-f", str(sshd_config))

    def _wait_ready(self) -> None:
        def idle() -> bool:
            sinfo = ("sinfo", "-h", "-N", "-o", "%N %t")
            done = self.run(*sinfo, user="root", check=False, timeout=15)
            idle = {line.split()[0] for line in done.stdout.splitlines() if line.endswith(" idle")}
            return idle >= set(self.node_names)

        self._wait("every node idle", idle)
        self._wait("sshd", lambda: _accepts(self.login.address, self.login.port))

    def _wait(self, what: str, condition: Callable[[], bool]) -> None:
        """Poll ``condition`` until the start's deadline; fail at once if a daemon exits."""
        while not condition():
            if exited := [n for n, p in self._daemons.items() if p.poll() is not None]:
                raise RuntimeError(f"waiting for {what}: {', '.join(exited)} exited")
            if time.monotonic() > self._deadline:
                raise TimeoutError(f"waiting for {what}: not after {self.start_timeout} s")
            time.sleep(0.02)

    # ── stop ──────────────────────────────────────────────────────────────────────────────

    def close(self, grace: float = 0.5) -> None:
        """Cancel every job, stop every process in the hosts' namespaces by PID (SIGTERM to
        the daemons, SIGKILL to what is left after ``grace`` seconds), delete the
        namespaces, links and files this cluster made, release its subnet. Idempotent."""
        if self._closed:
            return
        self._closed = True
        slurmctld = self._daemons.get("slurmctld")
        if slurmctld is not None and slurmctld.poll() is None:
            self._cancel_jobs()
        for process in self._daemons.values():
            _signal(process.pid, signal.SIGTERM)
        # slurmctld takes about 2 s to save state we are about to delete; it is not waited for.
        _until(lambda: all(p.poll() is not None for p in self._daemons.values()), grace)
        # Then everything left in the namespaces: job steps, jobs, sessions, keepers.
        deadline = time.monotonic() + 10.0
        while (pids := _pids_in(self._namespace_inodes)) and time.monotonic() < deadline:
            for pid in pids:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.02)
        for process in [*self._keepers.values(), *self._daemons.values()]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        for host in self.hosts:
            if Path(f"/run/netns/{host.netns}").exists():
                _run("ip", "netns", "del", host.netns, check=False)
        netguard.our_bridges.discard(self.bridge)  # nothing goes to it from here on
        for link in reversed(self._links):  # veths (gone with their namespaces), the bridge
            if Path(f"/sys/class/net/{link}").exists():
                _run("ip", "link", "del", link, check=False)
        if self.root != Path():
            shutil.rmtree(self.root, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the subnet
            self._lock_fd = None

    def _cancel_jobs(self) -> None:
        try:
            jobs = self.run("squeue", "-h", "-o", "%A", user="root", timeout=10, check=False)
            if ids := jobs.stdout.split():
                self.run("scancel", *ids, user="root", timeout=10, check=False)
        except subprocess.TimeoutExpired:
            pass  # their processes are killed next anyway

    def leftovers(self) -> list[str]:
        """What ``close()`` should have removed and did not."""
        named = _named_namespaces()
        ours = {h.netns for h in self.hosts}
        # A deleted namespace's inode number may be reused by a namespace someone else made.
        others = {inode for name, inode in named.items() if name not in ours}
        found = [f"process {pid}" for pid in _pids_in(self._namespace_inodes - others)]
        found += [f"namespace {name}" for name in sorted(ours & named.keys())]
        found += [f"link {x}" for x in self._links if Path(f"/sys/class/net/{x}").exists()]
        if self.root != Path() and self.root.exists():
            found.append(str(self.root))
        return found


def slurm_cluster_fixture(
    nodes: int = 2, *, name: str = "slurm_cluster", scope: Any = "module", **options: Any
) -> Any:
    """A pytest fixture, named ``name``, that yields a started ``SlurmCluster`` and fails if
    closing it leaves anything behind. In a test module::

        slurm_cluster = slurm_cluster_fixture(nodes=2)

    While it lives its hosts' namespaces are in ``support.processes.our_namespaces``, so the
    suite's leak check also finds skyward workers that jobs left running."""

    @pytest.fixture(scope=scope, name=name)
    def fixture() -> Iterator[SlurmCluster]:
        from support.processes import our_namespaces

        with SlurmCluster(nodes, **options) as cluster:
            namespaces = [host.netns for host in cluster.hosts]
            our_namespaces.add(*namespaces)
            try:
                yield cluster
            finally:
                cluster.close()
                our_namespaces.discard(*namespaces)
        assert not cluster.leftovers(), f"the Slurm testbed left behind: {cluster.leftovers()}"

    return fixture


# ── helpers ───────────────────────────────────────────────────────────────────────────────


def _plan_hosts(tag: int, nodes: int) -> list[SlurmHost]:
    def host(name: str, last: int, role: Role, short: str) -> SlurmHost:
        netns = f"skyward-slurm-{tag}-{name}"
        return SlurmHost(name, f"10.123.{tag}.{last}", role, netns, f"skysl{tag}{short}")

    return [
        host("slurmctl", 2, "controller", "c"),
        host("login", 3, "login", "l"),
        *(host(f"node{i}", 11 + i, "compute", f"n{i}") for i in range(nodes)),
    ]


def _subnet_free(tag: int) -> bool:
    """No address or route of the root namespace lies in 10.123.tag.0/24."""
    prefix = f"10.123.{tag}."
    addresses = _run("ip", "-o", "-4", "addr", "show").stdout
    routes = _run("ip", "-4", "route", "show").stdout
    return prefix not in addresses and prefix not in routes


def _names_free(links: list[str], namespaces: list[str]) -> bool:
    taken = [x for x in links if Path(f"/sys/class/net/{x}").exists()]
    return not taken and not _named_namespaces().keys() & set(namespaces)


def _named_namespaces() -> dict[str, int]:
    """Every network namespace that ``ip netns`` names, with its inode."""
    found = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir("/run/netns"):
            with contextlib.suppress(OSError):  # deleted meanwhile
                found[entry.name] = entry.stat().st_ino
    return found


def _pids_in(inodes: set[int]) -> list[int]:
    """Live (not zombie) processes whose network namespace is one of ``inodes``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/net").st_ino not in inodes:
                continue
            with open(f"/proc/{entry.name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or a zombie whose namespaces are already released
        if state != "Z":
            found.append(int(entry.name))
    return found


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _run(
    *args: str, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, input=input, capture_output=True, text=True, check=check, timeout=60
    )


def _until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1.0):
            return True
    except OSError:
        return False
