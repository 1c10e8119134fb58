"""Stand-in pods for the RunPod fake's pods: the fake plays RunPod's APIs, these play the
containers, and a port forwarder plays RunPod's public port mapping.

::

    RunPodFake (loopback)            RunPodStandIns (threads in the test process)
    ─────────────────────            ─────────────────────────────────────────────────────
    a pod rented, its ports asked    address_plan: claim a stand-in at 10.123.N.2xx, and a
      for once it starts      ─────>   forwarder on the bridge, bridge:PORT -> stand-in:22;
                                       the pod's publicIp is the bridge, portMappings
                                       {"22": PORT}: SSH on a non-22 port, as on RunPod
                                     boot: a namespace on the bridge, a sandbox (own PID,
                                       mount, UTS namespaces) with private /etc/ssh, home,
                                       /usr/local/sbin, /var/log, /run and /tmp, the pod's
                                       environment, and its ``dockerArgs`` run as RunPod
                                       runs a container's command: no cloud-init
    pod EXITED (interrupted) or gone ─> the stand-in stops, its forwarder closes
                                     a container that ended itself (the watchdog) -> its
                                       pod EXITED in the fake, as RunPod keeps it
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, cast

import skyward as sky
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.standins import StandIn, StandInCloud
from support.clouds.runpod.fake import KEY, RunPodFake
from support.hostimage import HostImage, fake_nvidia_smi
from support.sandbox import Sandbox, guard_again
from support.sshhosts import USER, Hosts

FIRST_STANDIN = 210  # stand-ins take .210 and up of the hosts' subnet
# The container's own copies of what the image owns; the start script writes there.
_PRIVATE = ("/etc/ssh", "/usr/local/sbin", "/var/log", "/run", "/tmp")


def standin_provider(cloud: RunPodStandIns, **options: Any) -> sky.RunPod:
    """``sky.RunPod`` against the fake, logging in as the test hosts' user."""
    settings: dict[str, Any] = {
        "api_key": KEY,
        "endpoint_url": cloud.fake.url,
        "username": USER,
        "release_timeout": 30.0,
        **options,
    }
    return sky.RunPod(**settings)


class Forwarder:
    """RunPod's public port for a pod's 22: ``host:port`` here -> ``target:22``."""

    def __init__(self, host: str, target: str) -> None:
        self.server = socket.create_server((host, 0))
        self.port = int(self.server.getsockname()[1])
        self.target = target
        self._open: list[socket.socket] = [self.server]
        self._lock = threading.Lock()  # guards: _open
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection((self.target, 22), timeout=5)
            except OSError:
                client.close()  # nothing listens yet: refused, as while a pod boots
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            for sock in self._open:
                sock.close()


@dataclass
class RunPodStandIns(StandInCloud):
    """The fake plus stand-in containers for its pods. Use as a context manager."""

    fake: RunPodFake = None  # type: ignore[assignment]  # given by start()
    pods: dict[str, str] = field(default_factory=dict)  # stand-in name -> pod id
    forwarders: dict[str, Forwarder] = field(default_factory=dict)

    def __post_init__(self) -> None:  # no moto here: the fake is the cloud
        self.fake.address_plan = self._plan
        self._tag = os.getpid() % 250
        self._count = 0  # and pods, forwarders: guarded by _lock
        # Outside /tmp, which each container has its own of: its image's tools stay in sight.
        self._start("runpod", under="/var/tmp")

    @classmethod
    def start(cls, fake: RunPodFake, hosts: Hosts, **options: Any) -> RunPodStandIns:
        """Stand-ins whose image lists one GPU (``nvidia-smi -L``), unless told otherwise."""
        gpu = fake_nvidia_smi(1, "NVIDIA GeForce RTX 4090")
        options.setdefault("image", HostImage(tools={"nvidia-smi": gpu}))
        return cls(moto=cast(MotoServer, None), hosts=hosts, fake=fake, **options)

    # ── the cloud's side ─────────────────────────────────────────────────────────────────

    def _plan(self, pod: dict[str, Any]) -> tuple[str, int]:
        """Called by the fake when the pod's container starts: a stand-in boots for it."""
        with self._lock:
            index = self._count
            self._count += 1
            name = f"pod-{pod['id']}"
            standin = StandIn(
                instance=name,
                address=f"{self.hosts.subnet}.{FIRST_STANDIN + index}",
                netns=f"skyward-{self._tag}-r{index}",
                veth=f"skv{self._tag}r{index}",
                directory=self.root / f"r{index}",
            )
            self.standins[name] = standin
            self.pods[name] = pod["id"]
            forwarder = Forwarder(self.hosts.bridge_address, standin.address)
            self.forwarders[name] = forwarder
        if self.boot:
            threading.Thread(target=self._boot, args=(standin, pod), daemon=True).start()
        return self.hosts.bridge_address, forwarder.port

    def _step(self) -> None:
        live = {p["id"]: p for p in self.fake.live("")}
        with self._lock:
            standins = [(s, self.pods[n]) for n, s in self.standins.items() if not s.ended]
        for standin, pod_id in standins:
            pod = live.get(pod_id)
            if pod is None or pod["desiredStatus"] != "RUNNING":
                standin.ended = "terminated"
                self._remove(standin)
                self._event("stopped-by-cloud" if pod else "deleted-by-cloud", standin.instance)
            elif standin.sandbox is not None and not standin.sandbox.alive:
                state = standin.sandbox.power_state() or "failed"
                self.fake.stop(pod_id, "Exited by container")  # RunPod keeps it, EXITED
                standin.ended = state
                self._remove(standin)
                self._event("container-ended", standin.instance)

    # ── a container's side ───────────────────────────────────────────────────────────────

    def _boot(self, standin: StandIn, pod: dict[str, Any]) -> None:
        try:
            self._network(standin)
            main = self._container(standin, pod)
            if standin.ended:
                self._remove(standin)
                return
            env = {"PATH": os.environ["PATH"], **pod["env"]}
            standin.sandbox = Sandbox(standin.directory, main, netns=standin.netns, env=env)
            self.booted_at[standin.instance] = time.monotonic()
            self._event("booted", standin.instance)
        except Exception as exc:
            if not standin.ended:
                standin.ended, standin.error = "failed", repr(exc)
                self._event("boot-failed", f"{standin.instance}: {exc!r}")
            self._remove(standin)

    def _container(self, standin: StandIn, pod: dict[str, Any]) -> str:
        """The sandbox's main script: the image's own directories made private, then the
        pod's command, as the container's main process."""
        directory, q = standin.directory, shlex.quote
        home = directory / "home"
        home.mkdir(parents=True)
        shutil.chown(home, USER, USER)
        mounts = [(home, f"/home/{USER}")]
        for target in _PRIVATE:
            own = directory / target.strip("/").replace("/", "-")
            if target == "/etc/ssh":
                shutil.copytree(target, own, symlinks=True)
            else:
                own.mkdir()
            own.chmod(0o1777 if target == "/tmp" else 0o755)
            mounts.append((own, target))
        lines = [f"hostname {q(standin.instance)}"]
        image = self.image.prepare(directory / "image")  # a fake nvidia-smi, for one
        if image:
            lines += [image, guard_again(directory / "shim")]
        lines += [f"mount --bind {q(str(src))} {q(dst)} || exit 1" for src, dst in mounts]
        lines.append(f"exec {pod['dockerArgs']}")  # RunPod's dockerArgs: the container's command
        return "\n".join(lines) + "\n"

    def _remove(self, standin: StandIn) -> None:
        with self._lock:
            forwarder = self.forwarders.pop(standin.instance, None)
        if forwarder is not None:
            forwarder.close()
        super()._remove(standin)

    def pod_of(self, nodename: str) -> str:
        return self.pods[nodename]

    def close(self) -> None:
        super().close()
        self.fake.address_plan = None
        with self._lock:
            forwarders = list(self.forwarders.values())
        for forwarder in forwarders:
            forwarder.close()
