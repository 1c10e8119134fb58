"""Helpers for the GCP tests: a provider pointed at the Compute Engine fake, what the fake holds
for a pool, and stand-in VMs for the fake's instances.

::

    GCPFake on the test bridge        GCPStandIns (a thread in the test process, reading the fake)
    ──────────────────────────        ─────────────────────────────────────────────────────────
    instances get addresses from      a RUNNING instance at one of them, not yet booted ─> boot
      the plan: 10.123.N.200, ...       a stand-in (the AWS stand-in's machine side) from its
                                        ``user-data`` metadata, with the keys of ``ssh-keys``
                                        for the login user, as GCE's guest agent gives them
    Metadata server on the bridge     metadata.google.internal in each stand-in's /etc/hosts:
      port 80                           the instance's name, zone, project and a token, found by
                                        the caller's address (what the watchdog's hook reads)
                                      a stand-in that powered itself off ─> the fake's guest
                                        poweroff (TERMINATED), unless its hook deleted it first
                                      an instance stopped or gone in the fake ─> stop its stand-in
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

from google.auth.credentials import AnonymousCredentials

import skyward as sky
from skyward.providers.gcp.api import label_value
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.standins import StandIn, StandInCloud
from support.clouds.gcp.fake import ApiError, GCPFake
from support.sshhosts import USER, Hosts

PROJECT = "skyward-tests"
ZONE = "us-central1-a"
FIRST_STANDIN = 200  # stand-ins take .200 and up of the hosts' subnet


def provider(fake: GCPFake, **options: Any) -> sky.GCP:
    """``sky.GCP`` against the fake, with a fixed SSH range (no public-address lookup)."""
    settings: dict[str, Any] = {
        "project": PROJECT,
        "zone": ZONE,
        "endpoint": fake.url,
        "credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
        "ssh_cidr": "10.123.0.0/16",
        "release_timeout": 30.0,
        **options,
    }
    return sky.GCP(**settings)


def standin_provider(cloud: GCPStandIns, **options: Any) -> sky.GCP:
    """``sky.GCP`` for the stand-ins: reached at private addresses, as the hosts' user."""
    return provider(cloud.fake, connect="private", username=USER, **options)


def held(fake: GCPFake, pool: str) -> dict[str, list[str]]:
    """What the fake still holds for ``pool``: instances, firewall rules."""
    instances = [
        i["name"]
        for i in fake.instances(PROJECT)
        if i.get("labels", {}).get("skyward-pool") == label_value(pool)
    ]
    rules = [
        f["name"]
        for f in fake.firewalls(PROJECT)
        if f.get("description", "").startswith("Skyward pool ")
        and json.loads(f["description"][len("Skyward pool ") :]).get("skyward-pool") == pool
    ]
    return {"instances": instances, "firewall rules": rules}


def nothing(holdings: dict[str, list[str]]) -> bool:
    return not any(holdings.values())


def metadata_of(instance: dict[str, Any], key: str) -> str:
    for item in instance.get("metadata", {}).get("items", []):
        if item["key"] == key:
            return str(item["value"])
    return ""


class MetadataServer:
    """GCE's metadata server for the stand-ins, on the bridge's port 80: it answers each
    instance, found by the caller's address, as GCE answers a VM."""

    def __init__(self, fake: GCPFake, address: str, project: str = PROJECT) -> None:
        self.fake, self.project = fake, project
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = server.answer(self.client_address[0], self.path, self.headers)
                data = body.encode()
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer((address, 80), Handler)
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, caller: str, path: str, headers: Any) -> tuple[int, str]:
        if headers.get("Metadata-Flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header."
        found = [
            i
            for i in self.fake.instances(self.project)
            if i["networkInterfaces"][0]["networkIP"] == caller
        ]
        if not found:
            return 404, "not an instance"
        instance = found[0]
        zone = instance["zone"].rsplit("/", 1)[-1]
        answers = {
            "project/project-id": self.project,
            "instance/name": instance["name"],
            "instance/zone": f"projects/123456789012/zones/{zone}",
        }
        if instance.get("serviceAccounts"):
            token = {"access_token": "ya29.test", "expires_in": 3599, "token_type": "Bearer"}
            answers["instance/service-accounts/default/token"] = json.dumps(token)
        value = answers.get(path.removeprefix("/computeMetadata/v1/"))
        return (404, "not found") if value is None else (200, value)

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(5)


@dataclass
class GCPStandIns(StandInCloud):
    """The fake plus stand-ins for its instances: ``standin.StandInCloud``'s machine side,
    with GCE in place of moto. Use as a context manager."""

    fake: GCPFake = None  # type: ignore[assignment]  # given by start()
    metadata: MetadataServer | None = None
    project: str = PROJECT
    planned: dict[str, str] = field(default_factory=dict)  # instance name -> address

    def __post_init__(self) -> None:  # no moto here: the fake is the cloud
        self.fake.address_plan = self._plan
        self._next = FIRST_STANDIN  # and planned: guarded by _lock
        self._start("gcp")

    @classmethod
    def start(cls, fake: GCPFake, hosts: Hosts, **options: Any) -> GCPStandIns:
        return cls(moto=cast(MotoServer, None), hosts=hosts, fake=fake, **options)

    def _plan(self, project: str, zone: str, name: str) -> tuple[str, str]:
        with self._lock:
            address = f"{self.hosts.subnet}.{self._next}"
            self._next += 1
            self.planned[name] = address
        return address, address

    def _mine(self, instance: dict[str, Any]) -> bool:
        return self.planned.get(instance["name"]) == (
            instance["networkInterfaces"][0].get("networkIP")
        )

    # ── the cloud's side ───────────────────────────────────────────────────────────────

    def _step(self) -> None:
        instances = {i["name"]: i for i in self.fake.instances(self.project) if self._mine(i)}
        for name, instance in instances.items():
            with self._lock:
                standin = self.standins.get(name)
            status = instance["status"]
            if status == "RUNNING" and standin is None and self.boot:
                standin = self._claim(instance)
                threading.Thread(target=self._boot, args=(standin, instance), daemon=True).start()
            elif status in ("STOPPING", "TERMINATED", "SUSPENDED") and (
                standin is not None and not standin.ended
            ):
                self._ended_by_cloud(standin, "stopped-by-cloud")
        with self._lock:
            vanished = [s for n, s in self.standins.items() if n not in instances and not s.ended]
        for standin in vanished:
            self._ended_by_cloud(standin, "deleted-by-cloud")
        self._reap(self._power_off)

    def _ended_by_cloud(self, standin: StandIn, what: str) -> None:
        standin.ended = "terminated"
        self._remove(standin)
        self._event(what, standin.instance)

    def _power_off(self, standin: StandIn) -> None:
        """What GCE does when a guest halts: the instance is kept, TERMINATED."""
        zone = self._zone_of(standin.instance)
        try:
            if zone is None:
                raise ApiError(404, "notFound", "gone")
            self.fake.stop_instance(self.project, zone, standin.instance)
            self._event("powered-off-kept", standin.instance)
        except ApiError:
            self._event("powered-off-deleted", standin.instance)  # its hook deleted it

    def _zone_of(self, name: str) -> str | None:
        for instance in self.fake.instances(self.project):
            if instance["name"] == name:
                return str(instance["zone"]).rsplit("/", 1)[-1]
        return None

    # ── a machine's side ───────────────────────────────────────────────────────────────

    def _claim(self, instance: dict[str, Any]) -> StandIn:
        return self._new_standin(
            instance["name"], instance["networkInterfaces"][0]["networkIP"], "g"
        )

    def _user_data(self, instance: str) -> dict[str, Any]:
        """cloud-init's config from the ``user-data`` metadata; the login user's keys are
        those of ``ssh-keys`` (GCE's guest agent installs them; cloud-init's own
        ``ssh_authorized_keys`` go to the image's default user, not to this one)."""
        import yaml

        found = [i for i in self.fake.instances(self.project) if i["name"] == instance]
        if not found:
            raise RuntimeError(f"{instance} is gone")
        text = metadata_of(found[0], "user-data")
        config = dict(yaml.safe_load(text) or {}) if text.startswith("#cloud-config") else {}
        keys = []
        for line in metadata_of(found[0], "ssh-keys").splitlines():
            user, _, key = line.partition(":")  # "user:ssh-ed25519 AAAA... comment"
            if user == USER and key.strip():
                keys.append(key.strip())
        config["ssh_authorized_keys"] = keys
        return config

    def _prepare(self, standin: StandIn, config: dict[str, Any], keys: list[str]) -> str:
        main = super()._prepare(standin, config, keys)
        with open(standin.directory / "etc-hosts", "a") as hosts:
            hosts.write(f"{self.hosts.bridge_address} metadata.google.internal\n")
        return main

    def close(self) -> None:
        super().close()
        self.fake.address_plan = None


class TokenServer:
    """Google's OAuth token endpoint, for service-account credentials made by the tests: a
    client outside the test process (``skyward ls``) authenticates the real way, here."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                token = {"access_token": "ya29.cli", "expires_in": 3600, "token_type": "Bearer"}
                data = json.dumps(token).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/token"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def key_file(self, directory: Path, project: str = PROJECT) -> Path:
        """A service account key file whose tokens come from this server."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        path = directory / "service-account.json"
        path.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": project,
                    "private_key_id": "0" * 40,
                    "private_key": pem,
                    "client_email": f"skyward@{project}.iam.gserviceaccount.com",
                    "client_id": "1" * 21,
                    "token_uri": self.url,
                }
            )
        )
        return path

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(5)
