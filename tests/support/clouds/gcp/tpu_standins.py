"""Stand-in TPU hosts for the Cloud TPU fake: one namespace host per TPU host (each
``networkEndpoint`` of a READY node), booted the way a TPU VM boots: the node's
``startup-script`` metadata, run as root (TPU VM images take no cloud-init user data).

::

    TPUFake on the test bridge          TPUStandIns (a thread in the test process)
    ──────────────────────────          ──────────────────────────────────────────────────
    a READY node, its endpoints in      one stand-in per endpoint not yet booted: a network
      the hosts' subnet (.100 up)         namespace at that address, a sandbox (own PID,
                                          mount, UTS namespaces; poweroff shimmed) with its
                                          own /etc/ssh, /run, /var/log, /usr/local/sbin and
                                          home; the startup-script runs, then the host idles
    a node PREEMPTED, deleted or gone   its stand-ins stopped, as Google stops the slice

The machinery (namespaces, veths, the image, the sandbox) is the GCE stand-ins'
(``standins.GCPStandIns``, itself the AWS stand-ins'); only where the machines come from and
how they boot differ.
"""

from __future__ import annotations

import shlex
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

from skyward.providers.gcp.api import label_value
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.standins import StandIn
from support.clouds.gcp.standins import PROJECT, GCPStandIns
from support.clouds.gcp.tpu_fake import TPUFake
from support.sandbox import Sandbox, guard_again
from support.sshhosts import USER, Hosts

_OWN = {  # what a host's boot writes, each its own directory inside the sandbox
    "/etc/ssh": "etc-ssh",
    "/usr/local/sbin": "usr-local-sbin",
    "/var/log": "var-log",
    "/run": "run",
}


@dataclass
class TPUStandIns(GCPStandIns):
    """The TPU fake plus stand-ins for its nodes' hosts. Use as a context manager."""

    tpu: TPUFake = None  # type: ignore[assignment]  # given by start()

    def __post_init__(self) -> None:
        self.tpu.subnet = self.hosts.subnet
        self._start("tpu")

    @classmethod
    def start_tpu(cls, tpu: TPUFake, hosts: Hosts, **options: Any) -> TPUStandIns:
        """``options``: the dataclass's fields (``fake``: the Compute Engine fake)."""
        return cls(moto=cast(MotoServer, None), hosts=hosts, tpu=tpu, **options)

    # ── the cloud's side ───────────────────────────────────────────────────────────────

    def _step(self) -> None:
        try:
            self._step_tpu()
        except Exception:
            raise

    def _step_tpu(self) -> None:
        hosts: dict[str, tuple[dict[str, Any], str]] = {}
        for node in self.tpu.nodes(self.project):
            for worker, endpoint in enumerate(node.get("networkEndpoints", [])):
                address = endpoint["ipAddress"]
                if address.startswith(self.hosts.subnet + "."):
                    hosts[f"{node['name'].rsplit('/', 1)[-1]}/{worker}"] = (node, address)
        for name, (node, address) in hosts.items():
            with self._lock:
                standin = self.standins.get(name)
            if node["state"] == "READY" and standin is None and self.boot:
                standin = self._claim_host(name, address)
                threading.Thread(target=self._boot_host, args=(standin, node), daemon=True).start()
            elif node["state"] != "READY" and standin is not None and not standin.ended:
                self._ended_by_cloud(standin, f"{node['state'].lower()}-by-cloud")
        with self._lock:
            vanished = [s for n, s in self.standins.items() if n not in hosts and not s.ended]
        for standin in vanished:
            self._ended_by_cloud(standin, "deleted-by-cloud")
        with self._lock:
            booted = [s for s in self.standins.values() if s.sandbox and not s.ended]
        for standin in booted:
            assert standin.sandbox is not None
            if not standin.sandbox.alive:
                standin.ended = standin.sandbox.power_state() or "failed"
                self._event(f"powered-off-{standin.ended}", standin.instance)
                self._remove(standin)

    # ── a host's side ──────────────────────────────────────────────────────────────────

    def _claim_host(self, name: str, address: str) -> StandIn:
        return self._new_standin(name, address, "t")

    def _boot_host(self, standin: StandIn, node: dict[str, Any]) -> None:
        try:
            script = str(node.get("metadata", {}).get("startup-script", ""))  # a map on TPU
            if not script:
                raise RuntimeError(f"{standin.instance}: no startup-script metadata")
            self._network(standin)
            main = self._host_main(standin, script)
            if standin.ended:
                self._remove(standin)
                return
            standin.sandbox = Sandbox(standin.directory, main, netns=standin.netns)
            self.booted_at[standin.instance] = time.monotonic()
            self._event("booted", standin.instance)
        except Exception as exc:
            if standin.ended:
                self._remove(standin)
                return
            standin.ended, standin.error = "failed", repr(exc)
            self._event("boot-failed", f"{standin.instance}: {exc!r}")
            self._remove(standin)

    def _host_main(self, standin: StandIn, script: str) -> str:
        """The sandbox's main script: the host's own directories mounted, the
        startup-script run as root (its log kept), then the host idles."""
        directory, q = standin.directory, shlex.quote
        directory.mkdir(parents=True)
        home = directory / "home"
        home.mkdir()
        shutil.chown(home, USER, USER)
        mounts = [(home, f"/home/{USER}")]
        for target, name in _OWN.items():
            own = directory / name
            if target == "/etc/ssh":
                shutil.copytree("/etc/ssh", own, symlinks=True)
                for key in own.glob("ssh_host_*"):
                    key.unlink()  # this machine's host keys never reach a stand-in
            else:
                own.mkdir()
            mounts.append((own, target))
        hostname = "t1v-" + standin.address.replace(".", "-")
        hosts_file = directory / "etc-hosts"
        hosts_file.write_text(f"127.0.0.1 localhost\n{standin.address} {hostname}\n")
        hosts_file.chmod(0o644)
        mounts.append((hosts_file, "/etc/hosts"))
        (directory / "startup-script.sh").write_text(script)
        directory.chmod(0o755)
        lines = [f"hostname {q(hostname)}"]
        lines += [f"mount --bind {q(str(s))} {q(t)} || exit 1" for s, t in mounts]
        image = self.image.prepare(directory / "image")
        if image:
            lines += [image, guard_again(directory / "shim")]
        log = directory / "var-log" / "startup-script.log"
        lines += [
            f"sh {q(str(directory / 'startup-script.sh'))} >{q(str(log))} 2>&1 || exit 1",
            "while :; do sleep 3600; done",
        ]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            standins = list(self.standins.values())
        for standin in standins:
            self._remove(standin)
        shutil.rmtree(self.root, ignore_errors=True)

    def host_log(self, name: str) -> str:
        standin = self.standins[name]
        parts = []
        for path in (standin.directory / "sandbox.log", standin.directory / "var-log"):
            files = [path] if path.is_file() else sorted(path.glob("*")) if path.exists() else []
            parts += [f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}" for f in files]
        return "\n".join(parts)


def held_tpu(tpu: TPUFake, pool: str) -> dict[str, list[str]]:
    """The queued resources and nodes the TPU fake holds for ``pool`` (by its label)."""
    mine = label_value(pool)

    def of_pool(node: dict[str, Any]) -> bool:
        return bool(node.get("labels", {}).get("skyward-pool") == mine)

    queued = [
        q["name"].rsplit("/", 1)[-1]
        for q in tpu.queued_resources(PROJECT)
        if any(of_pool(spec.get("node", {})) for spec in q["tpu"]["nodeSpec"])
    ]
    nodes = [n["name"].rsplit("/", 1)[-1] for n in tpu.nodes(PROJECT) if of_pool(n)]
    return {"queued resources": queued, "nodes": nodes}
