"""Stand-in VMs for the EC2 instances moto reports: moto plays the API, these play the machines.

::

    moto (loopback)        StandInCloud (a thread in the test process, polling moto)
    ────────────────       ───────────────────────────────────────────────────────────────
    VPC 10.123.N.0/24      a running instance in our subnet, not yet booted ─> boot it:
    subnet .128/25           namespace + veth on the test bridge at its PrivateIpAddress;
    (and .64/26, .68, ...    with second_zone: the same, in another availability zone)
    instances .132, ...      in a sandbox (own PID, mount, UTS namespaces; poweroff shimmed):
                             cloud-init's parts the provider uses, read from moto: the
                             host key (ssh_keys), the key pair's public key and
                             ssh_authorized_keys for the login user, write_files, then
                             sshd, then runcmd (which starts the idle watchdog)
                           a stand-in that powered itself off ─> terminate its instance in
                             moto (InstanceInitiatedShutdownBehavior=terminate)
                           an instance moto says is terminated ─> stop its stand-in

The bridge, the login user (``skytest``) and the package index are the SSH test hosts'
(``sshhosts.Hosts``); stand-ins take addresses from .132 up, clear of those hosts (.11...),
and names under the hosts' tag and lock (``skyward-N-vI``, ``skvNvI``, each index used once),
made and removed through the hosts, so nothing is removed that this run did not make.
Files cloud-init writes land in per-stand-in directories bind-mounted, inside the sandbox
only, over the few directories the provider writes to; any other path fails the boot.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.clouds.aws.fake import MotoServer
from support.hostimage import HostImage
from support.processes import our_namespaces
from support.sandbox import Sandbox, guard_again
from support.sshhosts import USER, Hosts, ensure_user

# Directories the provider's write_files may target, and the name of the per-stand-in
# directory mounted over each.
_WRITABLE = {
    "/usr/local/sbin": "usr-local-sbin",
    "/etc/ssh/sshd_config.d": "sshd-config-d",
    "/var/log": "var-log",  # each machine's own: the watchdog's log
}
_POLL = 0.1


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=60)


@dataclass
class StandIn:
    instance: str
    address: str
    netns: str
    veth: str
    directory: Path
    sandbox: Sandbox | None = None
    inode: int | None = None  # the network namespace's, for the worker leak check
    ended: str = ""  # "poweroff" (it stopped itself), "terminated" (moto ended it), "failed"
    error: str = ""

    def log(self) -> str:
        parts = []
        for name in ("sandbox.log", "runcmd.log", "var-log/skyward-watchdog.log"):
            path = self.directory / name
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text()[-3000:]}")
        return "\n".join(parts)


def _undo_netns(standin: StandIn) -> tuple[str, ...]:
    return ("ip", "netns", "del", standin.netns)


def _undo_veth(standin: StandIn) -> tuple[str, ...]:
    return ("ip", "link", "del", standin.veth)


@dataclass
class StandInCloud:
    """moto plus stand-ins for the instances it runs in ``subnet``. Use as a context manager."""

    moto: MotoServer
    hosts: Hosts
    boot_delay: float = 0.0  # seconds between a stand-in's network and its sshd
    boot: bool = True  # False: instances run but no machine ever answers (unreachable)
    image: HostImage = field(default_factory=HostImage)  # what the machines' system has
    # A second subnet (.64/26) in this zone, for tests of a pool moving between zones; the
    # first subnet is then in "us-east-1a".
    second_zone: str | None = None
    standins: dict[str, StandIn] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)  # (what, instance)
    booted_at: dict[str, float] = field(default_factory=dict)  # instance -> monotonic time

    def __post_init__(self) -> None:
        self.ec2 = self.moto.client("ec2")
        self.vpc = self.ec2.create_vpc(CidrBlock=f"{self.hosts.subnet}.0/24")["Vpc"]["VpcId"]
        zone = {"AvailabilityZone": "us-east-1a"} if self.second_zone else {}
        self.subnet = self.ec2.create_subnet(
            VpcId=self.vpc, CidrBlock=f"{self.hosts.subnet}.128/25", **zone
        )["Subnet"]["SubnetId"]
        self.subnets = [self.subnet]
        if self.second_zone is not None:
            self.subnets.append(
                self.ec2.create_subnet(
                    VpcId=self.vpc,
                    CidrBlock=f"{self.hosts.subnet}.64/26",
                    AvailabilityZone=self.second_zone,
                )["Subnet"]["SubnetId"]
            )
        self._start("ec2")

    def _start(self, name: str, under: str | None = None) -> None:
        """Start the machinery: the login user, a directory for the stand-ins' files (in
        ``under``, default the temporary directory), the lock, the thread watching the cloud.
        A cloud played by a fake, not moto, calls it from its ``__post_init__`` once its own
        state is set."""
        ensure_user()
        self.root = Path(tempfile.mkdtemp(prefix=f"skyward-{name}-standins-", dir=under))
        self.root.chmod(0o755)
        self._lock = threading.Lock()  # guards: standins, events, and each cloud's own state
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"{name}-standins", daemon=True)
        self._thread.start()

    def __enter__(self) -> StandInCloud:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ── the cloud's side ───────────────────────────────────────────────────────────────

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as exc:
                with self._lock:
                    self.events.append(("watch-error", repr(exc)))
            self._stop.wait(_POLL)

    def _step(self) -> None:
        mine = [{"Name": "subnet-id", "Values": self.subnets}]
        answer = self.ec2.describe_instances(Filters=mine)
        for instance in (i for r in answer["Reservations"] for i in r["Instances"]):
            state, ident = instance["State"]["Name"], instance["InstanceId"]
            with self._lock:
                standin = self.standins.get(ident)
            if state == "running" and standin is None and self.boot:
                standin = self._claim(instance)
                threading.Thread(target=self._boot, args=(standin, instance), daemon=True).start()
            elif state in ("shutting-down", "terminated", "stopped") and (
                standin is not None and not standin.ended
            ):
                standin.ended = "terminated"
                self._remove(standin)
                self._event("stopped-by-cloud", ident)
        self._reap(self._power_off)

    def _reap(self, powered_off: Callable[[StandIn], None]) -> None:
        """The stand-ins whose machine ended by itself: one that powered itself off is told
        to the cloud (``powered_off``, what the cloud does when a guest halts) before
        ``ended`` says how it ended, as tests read the cloud once they see it."""
        with self._lock:
            booted = [s for s in self.standins.values() if s.sandbox and not s.ended]
        for standin in booted:
            assert standin.sandbox is not None
            if not standin.sandbox.alive:
                state = standin.sandbox.power_state() or "failed"
                if state in ("poweroff", "signal-INT"):
                    powered_off(standin)
                standin.ended = state
                self._remove(standin)

    def _power_off(self, standin: StandIn) -> None:
        """What EC2 does when a machine halts: stop it, or (as our provider asks) end it."""
        behaviour = self.ec2.describe_instance_attribute(
            InstanceId=standin.instance, Attribute="instanceInitiatedShutdownBehavior"
        )["InstanceInitiatedShutdownBehavior"]["Value"]
        if behaviour == "terminate":
            self.ec2.terminate_instances(InstanceIds=[standin.instance])
        else:
            self.ec2.stop_instances(InstanceIds=[standin.instance])
        self._event(f"powered-off-{behaviour}", standin.instance)

    def _event(self, what: str, instance: str) -> None:
        with self._lock:
            self.events.append((what, instance))

    # ── a machine's side ───────────────────────────────────────────────────────────────

    def _claim(self, instance: dict[str, Any]) -> StandIn:
        return self._new_standin(instance["InstanceId"], instance["PrivateIpAddress"], "v")

    def _new_standin(self, instance: str, address: str, kind: str) -> StandIn:
        """The stand-in for ``instance`` at ``address``, named under the hosts' tag with an
        index used once (``kind``, a letter, says which cloud's it is)."""
        index, tag = self.hosts.join_index(), self.hosts.tag
        with self._lock:
            standin = StandIn(
                instance=instance,
                address=address,
                netns=f"skyward-{tag}-{kind}{index}",
                veth=f"skv{tag}{kind}{index}",
                directory=self.root / f"{kind}{index}",
            )
            self.standins[instance] = standin
        return standin

    def _boot(self, standin: StandIn, instance: dict[str, Any]) -> None:
        try:
            config = self._user_data(standin.instance)
            keys = [self._key_pair(instance["KeyName"])] if instance.get("KeyName") else []
            keys += config.get("ssh_authorized_keys", [])
            self._network(standin)
            main = self._prepare(standin, config, keys)
            if standin.ended:  # terminated while it booted
                self._remove(standin)
                return
            standin.sandbox = Sandbox(standin.directory, main, netns=standin.netns)
            self.booted_at[standin.instance] = time.monotonic()
            self._event("booted", standin.instance)
        except Exception as exc:
            if standin.ended:  # the cloud ended it while it booted: that is why
                self._remove(standin)
                return
            standin.ended, standin.error = "failed", repr(exc)
            self._event("boot-failed", f"{standin.instance}: {exc!r}")
            self._remove(standin)

    def _user_data(self, instance: str) -> dict[str, Any]:
        value = self.ec2.describe_instance_attribute(InstanceId=instance, Attribute="userData")[
            "UserData"
        ].get("Value", "")
        text = base64.b64decode(value).decode() if value else ""
        if not text.startswith("#cloud-config"):
            return {}  # a cloud image ignores user data it does not understand this way too
        loaded = yaml.safe_load(text) or {}
        return dict(loaded)

    def _key_pair(self, name: str) -> str:
        (key,) = self.ec2.describe_key_pairs(KeyNames=[name], IncludePublicKey=True)["KeyPairs"]
        return str(key["PublicKey"]).strip()

    def _network(self, standin: StandIn) -> None:
        netns, veth = standin.netns, standin.veth
        # moto hands out the same addresses again after a reset: a neighbour entry left by an
        # earlier stand-in at this address (another MAC) would send the client's packets
        # nowhere until it went stale, tens of seconds.
        _run("ip", "neigh", "flush", "to", standin.address, check=False)
        self.hosts.make(("ip", "netns", "add", netns), _undo_netns(standin))
        standin.inode = os.stat(f"/run/netns/{netns}").st_ino
        our_namespaces.add(netns)
        pair = ("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        self.hosts.make(pair, _undo_veth(standin))
        _run("ip", "link", "set", f"{veth}p", "netns", netns)
        _run("ip", "link", "set", veth, "master", self.hosts.bridge, "up")
        inside = ("ip", "netns", "exec", netns)
        _run(*inside, "ip", "link", "set", f"{veth}p", "name", "eth0")
        _run(*inside, "ip", "addr", "add", f"{standin.address}/24", "dev", "eth0")
        _run(*inside, "ip", "link", "set", "eth0", "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        _run(*inside, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")

    def _prepare(self, standin: StandIn, config: dict[str, Any], keys: list[str]) -> str:
        """Lay out the stand-in's files as cloud-init would; the sandbox's main script."""
        directory = standin.directory
        home = directory / "home"
        home.mkdir(parents=True)
        shutil.chown(home, USER, USER)
        host_key = directory / "ssh_host_ed25519_key"
        private = config.get("ssh_keys", {}).get("ed25519_private")
        if private:
            host_key.write_text(private)
            host_key.chmod(0o600)
        else:  # an image without our ssh_keys makes its own key, as cloud-init would
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        authorized = directory / "authorized_keys"
        authorized.write_text("".join(f"{k}\n" for k in keys))
        authorized.chmod(0o644)
        mounts = [(home, f"/home/{USER}")]
        for target, name in _WRITABLE.items():
            (directory / name).mkdir()
            mounts.append((directory / name, target))
        for entry in config.get("write_files", []):
            self._write(directory, entry)
        hostname = "ip-" + standin.address.replace(".", "-")
        hosts_file = directory / "etc-hosts"
        hosts_file.write_text(f"127.0.0.1 localhost\n{standin.address} {hostname}\n")
        hosts_file.chmod(0o644)
        mounts.append((hosts_file, "/etc/hosts"))
        (directory / "sshd_config").write_text(
            "Include /etc/ssh/sshd_config.d/*.conf\n"
            f"Port 22\nListenAddress {standin.address}\nHostKey {host_key}\n"
            f"PidFile {directory}/sshd.pid\nAuthorizedKeysFile {authorized}\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "MaxSessions 100\nMaxStartups 100:30:200\nUseDNS no\nPrintMotd no\n"
            "AcceptEnv SKYWARD_*\nSubsystem sftp internal-sftp\n"
        )
        commands = []
        for command in config.get("runcmd", []):
            commands.append(command if isinstance(command, str) else shlex.join(command))
        (directory / "runcmd.sh").write_text("\n".join(commands) + "\n")
        directory.chmod(0o755)
        q = shlex.quote
        lines = [f"hostname {q(hostname)}"]
        lines += [f"mount --bind {q(str(src))} {q(dst)} || exit 1" for src, dst in mounts]
        image = self.image.prepare(directory / "image")
        if image:
            lines += [image, guard_again(directory / "shim")]
        lines += [
            f"sleep {self.boot_delay}",
            f"/usr/sbin/sshd -D -e -f {q(str(directory / 'sshd_config'))} &",
            "sshd=$!",
            f"sh {q(str(directory / 'runcmd.sh'))} > {q(str(directory / 'runcmd.log'))} 2>&1",
            "wait $sshd",
        ]
        return "\n".join(lines) + "\n"

    def _write(self, directory: Path, entry: dict[str, Any]) -> None:
        path = Path(entry["path"])
        name = _WRITABLE.get(str(path.parent))
        if name is None:
            raise ValueError(
                f"write_files targets {path}: the stand-ins only give "
                f"{', '.join(_WRITABLE)} their own directories; add it to _WRITABLE"
            )
        local = directory / name / path.name
        content = entry.get("content", "")
        if entry.get("encoding") in ("b64", "base64"):
            local.write_bytes(base64.b64decode(content))
        else:
            local.write_text(content)
        local.chmod(int(str(entry.get("permissions", "0644")), 8))

    def _remove(self, standin: StandIn) -> None:
        if standin.sandbox is not None:
            standin.sandbox.stop()
        if standin.inode is not None:  # its namespace is one we made: what runs there is ours
            out = _run("ip", "netns", "pids", standin.netns, check=False).stdout
            for pid in out.split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
        our_namespaces.discard(standin.netns)
        self.hosts.remove(_undo_veth(standin))
        self.hosts.remove(_undo_netns(standin))

    # ── for the tests ──────────────────────────────────────────────────────────────────

    def wait_for(self, condition: Any, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > end:
                raise AssertionError(f"{what}: not within {timeout:g} s; events {self.events}")
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            standins = list(self.standins.values())
        for standin in standins:
            self._remove(standin)
        shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[str]:
        listed = _run("ip", "netns", "list").stdout
        return [s.netns for s in self.standins.values() if s.netns in listed]
