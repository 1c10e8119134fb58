"""Helpers for the Verda tests: a provider pointed at the fake, what the fake holds for a pool,
and stand-in VMs for the fake's instances, booted from the pool's startup script.

::

    VerdaFake on the test bridge           VerdaStandIns (a thread in the test process)
    ──────────────────────────────         ───────────────────────────────────────────────────
    instances get addresses from the       a running instance at one of them, not yet booted
      plan: 10.123.N.170, ...                ─> boot a stand-in: a namespace host on the bridge,
                                             in a sandbox (own PID, mount, UTS namespaces;
                                             poweroff shimmed) with a Verda image's own files
                                             (/etc/ssh, /root, /run, /var/log, ...): its startup
                                             script (GET /scripts/{id}) runs as root, as Verda
                                             runs it at first boot, and starts sshd itself
                                           a stand-in that powered itself off ─> the instance
                                             goes offline in the fake (Verda keeps it, billed)
                                           an instance deleted or offline ─> stop its stand-in
"""

from __future__ import annotations

import shlex
import shutil
import threading
from dataclasses import dataclass, field
from typing import Any, cast

import skyward as sky
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.standins import StandIn, StandInCloud
from support.clouds.verda.fake import CLIENT_ID, CLIENT_SECRET, VerdaFake
from support.sshhosts import USER, Hosts

FIRST_STANDIN = 170  # stand-ins take .170 and up of the hosts' subnet
# A Verda image's directories the boot writes to, each the stand-in's own.
_OWN = ("/etc/ssh", "/root", "/usr/local/sbin", "/var/log", "/run")


def provider(fake: VerdaFake, **options: Any) -> sky.Verda:
    """``sky.Verda`` against the fake, with the fake's credentials."""
    settings: dict[str, Any] = {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "endpoint_url": fake.url,
        "release_timeout": 30.0,
        **options,
    }
    return sky.Verda(**settings)


def standin_provider(cloud: VerdaStandIns, **options: Any) -> sky.Verda:
    """``sky.Verda`` for the stand-ins, logging in as the test hosts' user."""
    return provider(cloud.fake, username=USER, **options)


def held(fake: VerdaFake, pool: str) -> dict[str, list[str]]:
    """What the fake still holds (and bills) for ``pool``: instances, OS volumes left
    detached, SSH keys and startup scripts named after it."""
    base = "skyward-" + "".join(c if c.isalnum() or c == "-" else "-" for c in pool)[:30].strip("-")
    mine = [i for i in fake.instances() if i["hostname"].startswith(base + "-")]
    return {
        "instances": [i["hostname"] for i in mine],
        "volumes": [v["name"] for v in fake.volumes() if v["name"].startswith(base + "-")],
        "ssh keys": [k["name"] for k in fake.ssh_keys() if k["name"].startswith(base + "-")],
        "startup scripts": [s["name"] for s in fake.scripts() if s["name"].startswith(base + "-")],
    }


def nothing(holdings: dict[str, list[str]]) -> bool:
    return not any(holdings.values())


@dataclass
class VerdaStandIns(StandInCloud):
    """The fake plus stand-ins for its instances: ``StandInCloud``'s machine side, with
    Verda in place of moto and a startup script in place of cloud-init. A context manager."""

    fake: VerdaFake = None  # type: ignore[assignment]  # given by start()
    planned: dict[str, str] = field(default_factory=dict)  # hostname -> address

    def __post_init__(self) -> None:  # no moto here: the fake is the cloud
        self.fake.address_plan = self._plan
        self._next = FIRST_STANDIN  # and planned: guarded by _lock
        self._start("verda")

    @classmethod
    def start(cls, fake: VerdaFake, hosts: Hosts, **options: Any) -> VerdaStandIns:
        return cls(moto=cast(MotoServer, None), hosts=hosts, fake=fake, **options)

    def _plan(self, hostname: str) -> str:
        with self._lock:
            address = f"{self.hosts.subnet}.{self._next}"
            self._next += 1
            self.planned[hostname] = address
        return address

    # ── the cloud's side ───────────────────────────────────────────────────────────────

    def _step(self) -> None:
        listed = {
            i["id"]: i for i in self.fake.instances() if self.planned.get(i["hostname"]) == i["ip"]
        }
        for id, instance in listed.items():
            with self._lock:
                standin = self.standins.get(id)
            if instance["status"] == "running" and standin is None and self.boot:
                standin = self._claim(instance)
                threading.Thread(target=self._boot, args=(standin, instance), daemon=True).start()
            elif instance["status"] in ("offline", "deleting", "discontinued", "error") and (
                standin is not None and not standin.ended
            ):
                self._gone(standin, "stopped-by-cloud")
        with self._lock:
            vanished = [s for i, s in self.standins.items() if i not in listed and not s.ended]
        for standin in vanished:
            self._gone(standin, "deleted-by-cloud")
        self._reap(self._power_off)

    def _power_off(self, standin: StandIn) -> None:
        """What Verda does when a guest halts: the instance is kept, offline."""
        self.fake.power_off(standin.instance)
        self._event("powered-off-kept", standin.instance)

    def _gone(self, standin: StandIn, what: str) -> None:
        standin.ended = "terminated"
        self._remove(standin)
        self._event(what, standin.instance)

    # ── a machine's side ───────────────────────────────────────────────────────────────

    def _claim(self, instance: dict[str, Any]) -> StandIn:
        return self._new_standin(instance["id"], instance["ip"], "d")

    def _user_data(self, instance: str) -> dict[str, Any]:
        """The startup script the instance names, as Verda holds it."""
        found = [i for i in self.fake.instances() if i["id"] == instance]
        if not found:
            raise RuntimeError(f"{instance} is gone")
        scripts = {s["id"]: s["script"] for s in self.fake.scripts()}
        return {"script": scripts.get(found[0]["startup_script_id"], "")}

    def _prepare(self, standin: StandIn, config: dict[str, Any], keys: list[str]) -> str:
        """A Verda image's first boot: its own copies of what the boot writes, an sshd
        configuration for the test user, then the startup script as root."""
        directory, q = standin.directory, shlex.quote
        directory.mkdir(parents=True)
        mounts = []
        for target in _OWN:
            own = directory / target.strip("/").replace("/", "-")
            if target == "/etc/ssh":
                shutil.copytree("/etc/ssh", own, symlinks=True)
                for key in own.glob("ssh_host_*"):
                    key.unlink()  # the image's own keys: the script replaces them
            else:
                own.mkdir(parents=True)
            mounts.append((own, target))
        (directory / "etc-ssh" / "sshd_config").write_text(
            "Include /etc/ssh/sshd_config.d/*.conf\n"
            f"ListenAddress {standin.address}\nPidFile /run/sshd.pid\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "MaxSessions 100\nMaxStartups 100:30:200\nUseDNS no\nPrintMotd no\n"
            "AcceptEnv SKYWARD_*\nSubsystem sftp internal-sftp\n"
        )
        home = directory / "home"
        home.mkdir()
        shutil.chown(home, USER, USER)
        mounts.append((home, f"/home/{USER}"))
        hostname = "ip-" + standin.address.replace(".", "-")
        hosts_file = directory / "etc-hosts"
        hosts_file.write_text(f"127.0.0.1 localhost\n{standin.address} {hostname}\n")
        mounts.append((hosts_file, "/etc/hosts"))
        (directory / "startup.sh").write_text(config["script"])
        directory.chmod(0o755)
        lines = [f"hostname {q(hostname)}"]
        lines += [f"mount --bind {q(str(src))} {q(dst)} || exit 1" for src, dst in mounts]
        lines += [
            f"sleep {self.boot_delay}",
            f"sh {q(str(directory / 'startup.sh'))} >{q(str(directory / 'startup.log'))} 2>&1",
            "while :; do sleep 3600; done  # the machine runs on",
        ]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        super().close()
        self.fake.address_plan = None
