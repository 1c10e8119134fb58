"""Real OpenSSH hosts in network namespaces, and a package index they can reach.

::

    root namespace                         host namespaces (one per host)
    ───────────────────────────────        ─────────────────────────────────────────────
    bridge 10.123.N.1/24 ─── veth ──────── eth0 10.123.N.11  sshd -D :22, hostname h0
      │                 └─── veth ──────── eth0 10.123.N.12  sshd -D :22, hostname h1
      └ http index :8700 (PEP 503)          own mount namespace: /home/skytest is the
                                            host's own directory; no default route

N is a subnet no one else uses: from the test process's PID on, the first N whose lock
(``/run/lock/skyward-net-10.123.N.lock``, flock) this run can take and whose names and subnet
are free (no bridge ``skybrN``, no namespace ``skyward-N-*``, no veth ``skvN*``, no route
into 10.123.N.0/24). The lock is held until ``close()``, so two runs on one machine (a
suite, a benchmark, a helper's branch) never share or tear down each other's network; what
another run left (or still uses) is skipped, never deleted. Hosts log in a user
``skytest`` whose shell is ``/bin/sh`` (root's shell start-up here runs pyenv and costs
~100 ms per exec). Every key is made for the run. Hosts have no route to the
package index, as behind a company firewall: ``PackageIndex`` serves what they need from
the bridge address, filled from the root namespace.

Everything is stopped by PID; ``close()`` removes exactly what this set of hosts made (each
namespace, veth and the bridge is noted as it is made), and a stop treats zombies as gone.

The bridge has a MAC address of its own (``bridge_mac``): without one, Linux gives a bridge
the lowest of its ports' addresses and changes it when that port leaves or a lower one joins
(a stand-in VM removed or booted). Every namespace's ARP entry for the bridge address then
names a MAC nobody has, and what it sends there (the fake clouds' APIs, their metadata
server, the package index) is lost for about 30 s, until the entry is resolved again.
"""

from __future__ import annotations

import fcntl
import html
import ipaddress
import itertools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from support import netguard
from support.hostimage import HostImage

USER = "skytest"

# How a host's /etc/hosts names the hosts. "cluster": every host resolves every host's name
# to its address, as a cluster's DNS would. "debian-default": what Debian and Ubuntu install,
# the host's own name on 127.0.1.1 and no other host, as on most workstations and many
# bare-metal servers (software that advertises the address its hostname resolves to, as
# gloo did, advertises loopback there).
EtcHosts = Literal["cluster", "debian-default"]

_LOCKS = Path("/run/lock")
_TAGS = 250  # 10.123.0-249; other testbeds on this machine take 250 and up, with the same locks


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=120)


def ensure_user() -> None:
    if _run("id", USER, check=False).returncode != 0:
        _run("useradd", "--create-home", "--shell", "/bin/sh", USER)
    _run("usermod", "-p", "*", USER)  # unlocked, no password: sshd refuses locked users


@dataclass
class Host:
    name: str
    netns: str
    address: str
    home: Path
    host_key: Path
    veth: str
    sshd: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"{USER}@{self.address}"

    def public_host_key(self) -> str:
        return Path(f"{self.host_key}.pub").read_text().split()[1]

    def link_down(self) -> None:
        """The host drops off the network: its end of the link goes down."""
        _run("ip", "link", "set", self.veth, "down")

    def link_up(self) -> None:
        _run("ip", "link", "set", self.veth, "up")

    def processes(self) -> list[int]:
        """PIDs running in this host's network namespace."""
        out = _run("ip", "netns", "pids", self.netns, check=False).stdout
        return [int(p) for p in out.split()]


@dataclass
class Hosts:
    """Some hosts on one bridge; ``close()`` removes every trace of them."""

    root: Path
    tag: int  # N: the bridge skybrN, the subnet 10.123.N, the names skyward-N-*, skvN*
    client_key: Path
    known_hosts: Path
    hosts: list[Host] = field(default_factory=list)
    # The lock on the tag (an open file descriptor), held from start() to close().
    _lock: int = -1
    # How to remove what was made, in the order it was made; close() runs it backwards.
    _made: list[tuple[str, ...]] = field(default_factory=list)
    _made_lock: threading.Lock = field(default_factory=threading.Lock)  # guards: _made
    _left: list[str] | None = None  # what close() could not remove, seen while still locked
    # Indexes for the stand-ins that join this bridge (clouds/*/standins.py): never one name
    # twice.
    _joined: Iterator[int] = field(default_factory=itertools.count)

    @property
    def bridge(self) -> str:
        return f"skybr{self.tag}"

    @property
    def subnet(self) -> str:
        """``"10.123.N"``."""
        return f"10.123.{self.tag}"

    @property
    def bridge_address(self) -> str:
        return f"{self.subnet}.1"

    @classmethod
    def start(
        cls,
        count: int,
        *,
        etc_hosts: EtcHosts = "cluster",
        image: HostImage | Sequence[HostImage] | None = None,
    ) -> Hosts:
        """``count`` hosts named ``h0``, ``h1``, ...; ``etc_hosts`` says what their
        ``/etc/hosts`` holds (see ``EtcHosts``), ``image`` what their system has (this
        machine's by default; see ``hostimage``), one for all or one per host."""
        images = [image or HostImage()] * count if not isinstance(image, Sequence) else image
        if len(images) != count:
            raise ValueError(f"{len(images)} images for {count} hosts")
        ensure_user()
        Path("/run/sshd").mkdir(exist_ok=True)
        tag, lock = _claim_tag()
        root = Path(tempfile.mkdtemp(prefix="skyward-hosts-"))
        os.chmod(root, 0o755)
        client_key = root / "client_ed25519"
        hosts = cls(root, tag, client_key, root / "known_hosts", _lock=lock)
        try:
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(client_key))
            for index in range(count):
                (root / f"etc-hosts-h{index}").write_text(
                    _etc_hosts(etc_hosts, f"h{index}", hosts.subnet, count)
                )
                os.chmod(root / f"etc-hosts-h{index}", 0o644)
            hosts._bridge_up()
            for index in range(count):
                hosts._add_host(index, images[index])
            hosts.known_hosts.write_text(
                "".join(f"{h.address} ssh-ed25519 {h.public_host_key()}\n" for h in hosts.hosts)
            )
            for host in hosts.hosts:
                _wait_port(host.address, 22)
        except BaseException:
            hosts.close()
            raise
        return hosts

    def make(self, create: tuple[str, ...], undo: tuple[str, ...]) -> None:
        """Run ``create``; once it has succeeded, ``close()`` runs ``undo``. For what joins
        this bridge from outside (stand-ins), ``undo`` may run earlier through ``remove``."""
        _run(*create)
        with self._made_lock:
            self._made.append(undo)

    def remove(self, undo: tuple[str, ...]) -> None:
        """Run ``undo`` now if this set of hosts made its object and has not removed it."""
        with self._made_lock:
            if undo not in self._made:
                return
            self._made.remove(undo)
        _run(*undo, check=False)

    def join_index(self) -> int:
        """A fresh index for a stand-in's names (``skyward-N-vI``, ``skvNvI``)."""
        return next(self._joined)

    def _bridge_up(self) -> None:
        bridge = self.bridge
        create = ("ip", "link", "add", bridge, "address", bridge_mac(self.tag), "type", "bridge")
        self.make(create, ("ip", "link", "del", bridge))
        _run("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        netguard.our_bridges.add(self.bridge)

    def _add_host(self, index: int, image: HostImage) -> Host:
        name = f"h{index}"
        netns = f"skyward-{self.tag}-{name}"
        veth = f"skv{self.tag}h{index}"
        address = f"{self.subnet}.{11 + index}"
        directory = self.root / name
        host = Host(
            name, netns, address, directory / "home", directory / "ssh_host_ed25519_key", veth
        )
        self.hosts.append(host)  # its sshd is stopped by close() whatever happens next
        self.make(("ip", "netns", "add", netns), ("ip", "netns", "del", netns))
        pair = ("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        self.make(pair, ("ip", "link", "del", veth))
        _run("ip", "link", "set", f"{veth}p", "netns", netns)
        _run("ip", "link", "set", veth, "master", self.bridge, "up")
        inside = ("ip", "netns", "exec", netns)
        _run(*inside, "ip", "link", "set", f"{veth}p", "name", "eth0")
        _run(*inside, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
        _run(*inside, "ip", "link", "set", "eth0", "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        _run(*inside, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")

        home = host.home
        home.mkdir(parents=True)
        shutil.chown(home, USER, USER)
        host_key = host.host_key
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        authorized = directory / "authorized_keys"
        authorized.write_text(Path(f"{self.client_key}.pub").read_text())
        os.chmod(directory, 0o755)
        os.chmod(authorized, 0o644)
        config = directory / "sshd_config"
        config.write_text(
            f"Port 22\nListenAddress {address}\nHostKey {host_key}\n"
            f"PidFile {directory}/sshd.pid\nAuthorizedKeysFile {authorized}\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "MaxSessions 100\nMaxStartups 100:30:200\nUseDNS no\nPrintMotd no\n"
            "AcceptEnv SKYWARD_*\n"
            "PermitUserEnvironment yes\n"  # ~/.ssh/environment: see set_environment
            + ("Subsystem sftp internal-sftp\n" if image.sftp else "")
        )
        # Its own UTS and mount namespaces: its own hostname, and its own /home/skytest, so
        # each host keeps its own Skyward cache as separate machines do.
        script = (
            f"hostname {name} && mount --make-rprivate / && "
            f"mount --bind {home} /home/{USER} && "
            f"mount --bind {self.root}/etc-hosts-{name} /etc/hosts || exit 1\n"
            f"{_stock_fuse(directory)}"
            f"{image.prepare(directory / 'image')}"
            f"exec /usr/sbin/sshd -D -e -f {config}"
        )
        log = open(directory / "sshd.log", "wb")  # noqa: SIM115 - sshd owns it until it exits
        host.sshd = subprocess.Popen(
            [
                "nsenter",
                f"--net=/run/netns/{netns}",
                "unshare",
                "--uts",
                "--mount",
                "sh",
                "-c",
                script,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return host

    def set_environment(self, variables: dict[str, str]) -> None:
        """Variables every later SSH session on every host gets (the user's
        ``~/.ssh/environment``), as a user sets up a host's own settings: a mirror for the
        downloads a real host would make from the internet, say."""
        for host in self.hosts:
            ssh = host.home / ".ssh"
            ssh.mkdir(exist_ok=True)
            (ssh / "environment").write_text("".join(f"{k}={v}\n" for k, v in variables.items()))
            shutil.chown(ssh, USER, USER)
            shutil.chown(ssh / "environment", USER, USER)

    def forget_known_host(self, host: Host) -> None:
        lines = self.known_hosts.read_text().splitlines(keepends=True)
        self.known_hosts.write_text("".join(x for x in lines if not x.startswith(host.address)))

    def close(self) -> None:
        """Stop the hosts and remove what they made, then give up the tag. Idempotent."""
        with self._made_lock:
            made = list(self._made)
        made_namespaces = {undo[-1] for undo in made if undo[:3] == ("ip", "netns", "del")}
        for host in self.hosts:
            if host.netns in made_namespaces:
                for pid in host.processes():
                    _kill(pid)
            if host.sshd is not None:
                _kill(host.sshd.pid)
                host.sshd.wait(10)
        netguard.our_bridges.discard(self.bridge)  # nothing goes to it from here on
        for undo in reversed(made):
            self.remove(undo)
        shutil.rmtree(self.root, ignore_errors=True)
        if self._lock >= 0:
            self._left = self._leftovers()  # while the names are still ours alone
            os.close(self._lock)  # and with it the lock
            self._lock = -1

    def leftovers(self) -> list[str]:
        """What ``close()`` should have removed and did not."""
        return self._left if self._left is not None else self._leftovers()

    def _leftovers(self) -> list[str]:
        found = []
        netns = _run("ip", "netns", "list").stdout.split()
        for host in self.hosts:
            if host.netns in netns:
                found.append(f"namespace {host.netns}")
            if host.sshd is not None and host.sshd.poll() is None:
                found.append(f"sshd {host.sshd.pid}")
        if Path(f"/sys/class/net/{self.bridge}").exists():
            found.append(f"bridge {self.bridge}")
        if self.root.exists():
            found.append(str(self.root))
        return found


def bridge_mac(tag: int) -> str:
    """The MAC address of the bridge of subnet 10.123.``tag``: fixed (the kernel then never
    changes it as ports come and go; see the module's docstring), locally administered, and
    one per tag, as the subnet is."""
    return f"02:53:4b:7b:00:{tag:02x}"


def _claim_tag() -> tuple[int, int]:
    """A tag no one else uses, and the lock (an open file descriptor) that keeps it ours.

    The process's own tag (PID mod 250) first, then the next ones. A tag is taken when
    another run holds its lock, or when anything of its names or subnet exists: a run
    without the lock (older code) or one that was killed left it, and it is not ours to
    remove.
    """
    first = os.getpid() % _TAGS
    for step in range(_TAGS):
        tag = (first + step) % _TAGS
        lock = os.open(_LOCKS / f"skyward-net-10.123.{tag}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            continue
        if not _in_use(tag):
            return tag, lock
        os.close(lock)
    raise RuntimeError(
        "no free subnet 10.123.N.0/24 for test hosts: every N is locked by a run or holds "
        "what a killed run left (ip netns list; ip link show type bridge)"
    )


def _in_use(tag: int) -> list[str]:
    """What exists of ``tag``'s names and subnet."""
    links = os.listdir("/sys/class/net")
    found = [link for link in links if link == f"skybr{tag}" or link.startswith(f"skv{tag}h")]
    found += [link for link in links if link.startswith(f"skv{tag}v")]
    netns = Path("/run/netns")
    if netns.is_dir():
        found += [n for n in os.listdir(netns) if n.startswith(f"skyward-{tag}-")]
    subnet = ipaddress.IPv4Network(f"10.123.{tag}.0/24")
    found += [
        f"route {network} dev {interface}"
        for network, interface, _ in netguard.routes()
        if network.prefixlen > 0 and network.overlaps(subnet)
    ]
    return found


def _etc_hosts(kind: EtcHosts, name: str, subnet: str, count: int) -> str:
    if kind == "cluster":
        return "127.0.0.1 localhost\n" + "".join(f"{subnet}.{11 + i} h{i}\n" for i in range(count))
    # Debian's own file, as its installer writes it.
    return (
        f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n\n"
        "::1     localhost ip6-localhost ip6-loopback\n"
        "ff02::1 ip6-allnodes\nff02::2 ip6-allrouters\n"
    )


def _stock_fuse(directory: Path) -> str:
    """Shell lines that give the host ``/dev/fuse`` as Debian and Ubuntu have it, readable and
    writable by everyone (udev's rule), so that a user's FUSE mount (s3fs) goes through the
    setuid ``fusermount``; this container's is root's only. A node of the host's own,
    bind-mounted in its mount namespace: the machine's stays as it is."""
    if not Path("/dev/fuse").exists():
        return ""
    node = shlex.quote(str(directory / "fuse"))
    return f"mknod {node} c 10 229 && chmod 666 {node} && mount --bind {node} /dev/fuse || exit 1\n"


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_port(address: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class PackageIndex:
    """A PEP 503 index over plain http on the bridge, served by ``http.server``.

    ``add`` takes wheel files; ``download`` fetches requirements (and their dependencies)
    into it from the root namespace, which can reach the real index. Downloads are cached
    across runs in ``cache``.
    """

    def __init__(self, root: Path, bind: str, port: int = 8700) -> None:
        self.root = root
        self.simple = root / "simple"
        self.simple.mkdir(parents=True, exist_ok=True)
        self.url = f"http://{bind}:{port}/simple/"
        self._server = subprocess.Popen(
            ["python3", "-m", "http.server", "--bind", bind, "--directory", str(root), str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_port(bind, port)
        except BaseException:
            self.close()
            raise

    def add(self, wheels: Iterable[Path]) -> None:
        for wheel in wheels:
            name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
            project = self.simple / name
            project.mkdir(exist_ok=True)
            shutil.copy(wheel, project / wheel.name)
            links = "".join(
                f'<a href="{html.escape(f.name)}">{html.escape(f.name)}</a><br>\n'
                for f in sorted(project.glob("*.whl"))
            )
            (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")

    def download(self, requirements: Iterable[str], cache: Path) -> None:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--only-binary=:all:",
                # The hosts' workers run the client's own minor version (the bootstrap
                # matches it), so their wheels are for this interpreter, not a fixed one.
                "--python-version",
                f"{sys.version_info.major}.{sys.version_info.minor}",
                "-d",
                str(cache),
                *requirements,
            ],
            check=True,
            timeout=600,
        )
        self.add(cache.glob("*.whl"))

    def close(self) -> None:
        self._server.kill()
        self._server.wait(10)


def build_wheel(
    directory: Path, name: str, version: str, body: str, requires: Iterable[str] = ()
) -> Path:
    """A one-module pure-Python wheel, written by hand (no build backend needed)."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": body.encode(),
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires)
        ).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: skyward-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()
    )
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel
