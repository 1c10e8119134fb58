"""Stand-in hosts for the instances the Vast.ai fake rents: the fake plays the API, these
play the marketplace's hosts.

::

    VastFake on the test bridge       VastStandIns (a thread in the test process, reading the fake)
    ───────────────────────────       ─────────────────────────────────────────────────────────
    an instance turns "running"  ──>  placement: its container gets a namespace address
                                        (10.123.N.160, ...); its port 22 is published on the
                                        bridge's address at a random port by a forwarder in
                                        this process (what docker-proxy is on a Vast host),
                                        so ``public_ipaddr`` is shared and the port is not 22
                                      boot: run the rent's start command the way Vast runs
                                        it, ``<onstart> <args...>`` (``sh -c SCRIPT``) as the
                                        container's main process, as root, in a sandbox (own
                                        PID, mount, UTS namespaces; poweroff shimmed) with
                                        the image's own /etc/ssh, /usr/local/sbin, /var/log,
                                        /run/sshd and the login user's home
    stopped (outbid), gone       <──  the container killed, its port unpublished
    exited                       <──  its main process ended (the watchdog's ``kill -TERM 1``)

The container's files are per stand-in directories bind-mounted inside the sandbox only;
the start command writes the host key, the login key, the watchdog and sshd's drop-in
there and starts sshd itself, with the image's sshd_config (this machine's sshd, with the
settings a test host needs: no PAM, its pid file in /run/sshd).
"""

from __future__ import annotations

import shlex
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import skyward as sky
from support.clouds.aws.standins import StandIn, StandInCloud
from support.clouds.vastai.fake import KEY, VastFake
from support.hostimage import HostImage
from support.sandbox import guard_again
from support.sshhosts import USER, Hosts

FIRST_STANDIN = 160  # stand-ins take .160 and up of the hosts' subnet
_ENDED = ("stopped", "exited", "offline")
# The container's directories the start command writes, and their per stand-in names.
_MOUNTED = {
    "/etc/ssh": "etc-ssh",
    "/usr/local/sbin": "usr-local-sbin",
    "/var/log": "var-log",
    "/run/sshd": "run-sshd",
    f"/home/{USER}": "home",
}


def provider(fake: VastFake, **options: Any) -> sky.VastAI:
    """``sky.VastAI`` for the stand-ins: logging in as the test hosts' user (a root login
    would run this machine's root shell start-up)."""
    settings: dict[str, Any] = {"api_key": KEY, "release_timeout": 30.0, "username": USER}
    return sky.VastAI(endpoint_url=fake.url, **{**settings, **options})


class Forwarder:
    """A published port: connections to ``listen``:port relayed to ``target``, as Docker's
    userland proxy relays a host port to a container's. ``close`` unpublishes it and drops
    what it relays."""

    def __init__(self, listen: str, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server((listen, 0))
        self.port = int(self.server.getsockname()[1])
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()  # guards: _open
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()  # nothing listens in the container yet: docker-proxy does the same
            return
        upstream.settimeout(None)
        with self._lock:
            self._open += [client, upstream]
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        try:  # wakes the accept() in flight, which a close alone leaves listening
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()
        with self._lock:
            for connection in self._open:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                connection.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    for end in (source, sink):
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class VastStandIns(StandInCloud):
    """The fake plus stand-in hosts for its instances. Use as a context manager."""

    def __init__(self, fake: VastFake, hosts: Hosts, image: HostImage | None = None) -> None:
        self.fake, self.hosts, self.image = fake, hosts, image or HostImage()
        self.boot, self.boot_delay, self.second_zone = True, 0.0, None
        self.standins, self.events, self.booted_at = {}, [], {}
        self.forwarders: dict[str, Forwarder] = {}  # instance id -> its published port
        self.addresses: dict[str, str] = {}  # instance id -> its container's address
        Path("/run/sshd").mkdir(exist_ok=True)  # where each container's own is mounted
        self._next = FIRST_STANDIN  # and forwarders, addresses: guarded by _lock
        fake.placement = self._place
        self._start("vast")

    def _place(self, instance: dict[str, Any]) -> tuple[str, int]:
        """Where an instance's port 22 is published, when Vast says it runs."""
        id = str(instance["id"])
        with self._lock:
            address = f"{self.hosts.subnet}.{self._next}"
            self._next += 1
            self.addresses[id] = address
            forwarder = Forwarder(self.hosts.bridge_address, (address, 22))
            self.forwarders[id] = forwarder
        return self.hosts.bridge_address, forwarder.port

    # ── the marketplace's side ─────────────────────────────────────────────────────────

    def _step(self) -> None:
        instances = {str(i["id"]): i for i in self.fake.live()}
        for id, instance in instances.items():
            with self._lock:
                standin, placed = self.standins.get(id), id in self.addresses
            status = instance["actual_status"]
            if status == "running" and placed and standin is None:
                standin = self._claim(instance)
                threading.Thread(target=self._boot, args=(standin, instance), daemon=True).start()
            elif status in _ENDED and standin is not None and not standin.ended:
                standin.ended = "terminated"
                self._remove(standin)
                self._event(f"{status}-by-vast", id)
        with self._lock:
            vanished = [s for i, s in self.standins.items() if i not in instances and not s.ended]
        for standin in vanished:
            standin.ended = "terminated"
            self._remove(standin)
            self._event("destroyed", standin.instance)
        with self._lock:
            booted = [s for s in self.standins.values() if s.sandbox and not s.ended]
        for standin in booted:
            assert standin.sandbox is not None
            if not standin.sandbox.alive:  # its main process ended: Vast says "exited"
                if standin.instance in instances:
                    self.fake.exit(int(standin.instance))
                standin.ended = standin.sandbox.power_state() or "exited"
                self._remove(standin)
                self._event("exited", standin.instance)

    def _claim(self, instance: dict[str, Any]) -> StandIn:
        id = str(instance["id"])
        with self._lock:
            address = self.addresses[id]
        return self._new_standin(id, address, "a")

    def _user_data(self, instance: str) -> dict[str, Any]:
        """The rent's start command: the entrypoint (``onstart`` in args mode) and args."""
        found = [i for i in self.fake.live() if str(i["id"]) == instance]
        if not found:
            raise RuntimeError(f"instance {instance} is gone")
        return {"command": [found[0]["onstart"], *found[0]["image_args"]]}

    def _prepare(self, standin: StandIn, config: dict[str, Any], keys: list[str]) -> str:
        """The container's files, and the sandbox's main script: Vast's ``docker run``."""
        directory = standin.directory
        directory.mkdir(parents=True)
        for name in _MOUNTED.values():
            (directory / name).mkdir()
        shutil.chown(directory / "home", USER, USER)
        (directory / "etc-ssh" / "sshd_config").write_text(
            "Include /etc/ssh/sshd_config.d/*.conf\n"
            "PidFile /run/sshd/sshd.pid\nPubkeyAuthentication yes\nUsePAM no\n"
            "StrictModes no\nMaxSessions 100\nMaxStartups 100:30:200\nUseDNS no\n"
            "PrintMotd no\nAcceptEnv SKYWARD_*\nSubsystem sftp internal-sftp\n"
        )
        hostname = "c-" + standin.address.replace(".", "-")
        hosts_file = directory / "etc-hosts"
        hosts_file.write_text(f"127.0.0.1 localhost\n{standin.address} {hostname}\n")
        mounts = [(directory / name, target) for target, name in _MOUNTED.items()]
        mounts.append((hosts_file, "/etc/hosts"))
        directory.chmod(0o755)
        q = shlex.quote
        lines = [f"hostname {q(hostname)}"]
        lines += [f"mount --bind {q(str(src))} {q(dst)} || exit 1" for src, dst in mounts]
        image = self.image.prepare(directory / "image")
        if image:
            lines += [image, guard_again(directory / "shim")]
        lines.append(
            f"exec {shlex.join(config['command'])} > {q(str(directory / 'main.log'))} 2>&1"
        )
        return "\n".join(lines) + "\n"

    def _remove(self, standin: StandIn) -> None:
        with self._lock:
            forwarder = self.forwarders.pop(standin.instance, None)
        if forwarder is not None:
            forwarder.close()
        super()._remove(standin)

    def close(self) -> None:
        super().close()
        self.fake.placement = None
        with self._lock:
            forwarders = list(self.forwarders.values())
            self.forwarders.clear()
        for forwarder in forwarders:
            forwarder.close()
