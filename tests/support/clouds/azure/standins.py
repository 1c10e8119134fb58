"""Stand-in VMs for the Azure VMs the fake ARM server runs: the fake plays the API, these play
the machines, booting from the VM's ``customData`` as cloud-init would.

::

    AzureFake (on the test bridge)   AzureStandIns (a thread in the test process, watching it)
    ──────────────────────────────   ─────────────────────────────────────────────────────────
    NIC private address from          a running VM at one of our addresses ─> boot it: a
      ``addresses`` (.200 and up)       namespace host at that address (``clouds/aws/standins.py``'s
    VM running                          machine side), the VM's SSH key and cloud-init's host
                                        key, files, sshd, runcmd (the idle watchdog); and,
                                        in its namespace only, an instance metadata service
                                        at 169.254.169.254 that hands out a token for the
                                        VM's managed identity and says which VM it is
    DELETE / evict / deallocate  ─>   the VM gone or deallocated: stop its stand-in
    stop_from_inside             <─   a stand-in that powered itself off: Azure keeps such a
                                        VM allocated (and billed): "stopped", not deleted

The watchdog's ``skyward-release`` thus runs for real: it asks the namespace's IMDS for a
token and the VM's id, and calls the fake over HTTPS (trusting its CA) to delete the VM.
"""

from __future__ import annotations

import shlex
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.clouds.aws.standins import StandIn, StandInCloud
from support.clouds.azure.fake import TOKEN, AzureFake
from support.sandbox import Sandbox

IMDS_ADDRESS = "169.254.169.254"
FIRST_HOST = 200  # stand-ins take .200 and up on the bridge, clear of the other hosts

_IMDS_SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

resource_id, log = sys.argv[1], sys.argv[2]

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        parts = urlsplit(self.path)
        with open(log, "a") as out:
            out.write(self.path + "\n")
        if self.headers.get("Metadata") != "true":
            return self.answer(400, {"error": "bad_request"})
        if parts.path == "/metadata/identity/oauth2/token":
            query = parse_qs(parts.query)
            return self.answer(200, {
                "access_token": TOKEN,
                "client_id": query.get("client_id", [""])[0],
                "expires_in": "3599",
                "resource": query.get("resource", [""])[0],
                "token_type": "Bearer",
            })
        if parts.path == "/metadata/instance/compute/resourceId":
            return self.answer(200, resource_id, text=True)
        return self.answer(404, {"error": "not_found"})

    def answer(self, status, body, text=False):
        data = (body if text else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

HTTPServer(("IMDS", 80), Handler).serve_forever()
"""


@dataclass
class AddressRange:
    """Private addresses for the fake's NICs: ``prefix.200``, ``.201``, ... (wrapping)."""

    prefix: str
    next: int = FIRST_HOST
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards: next

    def __call__(self, kind: str, resource_id: str) -> str | None:
        if kind != "private":
            return None  # public addresses: the fake's own (never dialled)
        with self.lock:
            address = f"{self.prefix}.{self.next}"
            self.next = FIRST_HOST if self.next >= 250 else self.next + 1
            return address

    def holds(self, address: str | None) -> bool:
        if not address or not address.startswith(self.prefix + "."):
            return False
        return FIRST_HOST <= int(address.rsplit(".", 1)[1]) <= 250


@dataclass
class AzureStandIns(StandInCloud):
    """The fake ARM server plus stand-ins for the VMs it runs at our addresses. Construct
    with ``moto=None``; use as a context manager. ``standins`` is keyed by the VM's id."""

    fake: AzureFake | None = None

    def __post_init__(self) -> None:
        # Not the parent's: that one makes moto's VPC. The rest is the same machinery.
        assert self.fake is not None
        self.range = AddressRange(self.hosts.subnet)
        self.fake.addresses = self.range
        self.vm_ids: dict[str, tuple[str, str]] = {}  # VM id -> (resource group, name)
        self._start("azure")

    # ── the cloud's side ───────────────────────────────────────────────────────────────

    def _step(self) -> None:
        assert self.fake is not None
        seen: set[str] = set()
        for vm in self.fake.vms():
            ident = vm["id"].lower()
            group, name = vm["id"].split("/")[4], vm["name"]
            try:
                private, _ = self.fake.vm_addresses(group, name)
            except KeyError:
                continue  # deleted meanwhile
            if not self.range.holds(private):
                continue
            seen.add(ident)
            with self._lock:
                standin = self.standins.get(ident)
            power = vm["powerState"]
            if power == "running" and standin is None and self.boot:
                self.vm_ids[ident] = (group, name)
                standin = self._claim({"InstanceId": ident, "PrivateIpAddress": private})
                threading.Thread(target=self._boot, args=(standin, vm), daemon=True).start()
            elif power in ("deallocated", "deallocating") and standin and not standin.ended:
                standin.ended = "deallocated"
                self._remove(standin)
                self._event("deallocated-by-cloud", ident)
        with self._lock:
            gone = [s for i, s in self.standins.items() if i not in seen and not s.ended]
        for standin in gone:
            standin.ended = "deleted"
            self._remove(standin)
            self._event("deleted-by-cloud", standin.instance)
        self._reap(self._power_off)

    def _power_off(self, standin: StandIn) -> None:
        """Azure keeps a VM that powered itself off allocated: stopped, and billed."""
        assert self.fake is not None
        group, name = self.vm_ids[standin.instance]
        self.fake.stop_from_inside(group, name)
        self._event("powered-off-still-allocated", standin.instance)

    # ── a machine's side ───────────────────────────────────────────────────────────────

    def _claim(self, instance: dict[str, Any]) -> StandIn:
        return self._new_standin(instance["InstanceId"], instance["PrivateIpAddress"], "z")

    def _boot(self, standin: StandIn, vm: dict[str, Any]) -> None:  # type: ignore[override]
        assert self.fake is not None
        try:
            group, name = self.vm_ids[standin.instance]
            data = self.fake.custom_data(group, name) or b""
            text = data.decode()
            config = dict(yaml.safe_load(text) or {}) if text.startswith("#cloud-config") else {}
            linux = vm["properties"]["osProfile"].get("linuxConfiguration") or {}
            keys = [k["keyData"] for k in (linux.get("ssh") or {}).get("publicKeys") or []]
            keys += config.get("ssh_authorized_keys", [])
            self._network(standin)
            main = self._with_imds(standin, self._prepare(standin, config, keys), vm["id"])
            if standin.ended:  # deleted while it booted
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

    def _with_imds(self, standin: StandIn, main: str, resource_id: str) -> str:
        """``main`` with the instance metadata service started first, in the namespace."""
        server = standin.directory / "imds.py"
        server.write_text(
            _IMDS_SERVER.replace('"IMDS"', repr(IMDS_ADDRESS)).replace("TOKEN", repr(TOKEN))
        )
        q = shlex.quote
        start = [
            f"ip addr add {IMDS_ADDRESS}/32 dev lo",
            f"{q(sys.executable)} {q(str(server))} {q(resource_id)} "
            f"{q(str(standin.directory / 'imds.log'))} "
            f"> {q(str(standin.directory / 'imds.err'))} 2>&1 &",
        ]
        lines = main.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("sleep "))
        return "\n".join([*lines[:at], *start, *lines[at:]]) + "\n"

    def close(self) -> None:
        super().close()
        if self.fake is not None and self.fake.addresses is self.range:
            self.fake.addresses = None

    # ── for the tests ──────────────────────────────────────────────────────────────────

    def imds_log(self, standin: StandIn) -> str:
        path = Path(standin.directory) / "imds.log"
        return path.read_text() if path.exists() else ""
