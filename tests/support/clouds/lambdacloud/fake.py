"""A local fake of Lambda Cloud's REST API (``/api/v1``), in its own JSON and error shapes.

::

    sky.Lambda (urllib, Bearer key)      LambdaFake: a ThreadingHTTPServer thread in the test
    ───────────────────────────────      process; one lock over its state
    GET  instance-types               -> every type with its regions_with_capacity_available
    POST instance-operations/launch   -> validated as Lambda documents it; no capacity in the
                                         region: 400 .../launch/insufficient-capacity; else
                                         ``quantity`` instances, "booting"
    GET  instances, instances/{id}    -> each read of an instance moves it on: "booting" for
                                         ``boot_reads`` reads, then "active" (addresses set);
                                         "terminating" for ``end_reads`` reads, then
                                         "terminated" as long, then no longer listed
    POST instance-operations/terminate -> "terminating"; an unknown id: 404
                                         global/object-does-not-exist
    ssh-keys, firewall-rulesets       -> list, add, delete; a ruleset in use by an instance
                                         not yet terminated: 400 .../firewall-ruleset-in-use

Errors are ``{"error": {"code", "message", "suggestion"}}`` with Lambda's codes and HTTP
statuses (401 global/invalid-api-key for a key other than ``KEY``). Fault hooks: ``fail``
(the next matching request answers an error, or is carried out and then answers one: an
answer lost), ``capacity`` (the regions with capacity, per type), ``make_unhealthy``,
``power_off`` (what a stand-in's watchdog does: the instance is kept, and billed). Addresses
come from ``address_plan`` or else 198.51.100.N / 10.19.0.N, which the tests' network guard
refuses, so a test that forgets to plan them fails fast.
"""

from __future__ import annotations

import fnmatch
import json
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Json = dict[str, Any]
KEY = "secret_test-key.0123456789abcdef"
REGIONS = {
    "us-east-1": "Virginia, USA",
    "us-west-1": "California, USA",
    "us-south-1": "Texas, USA",
    "europe-central-1": "Germany",
}
# name -> (description, gpu description, cents per hour, vcpus, GiB, GPUs, regions with capacity)
TYPES: dict[str, tuple[str, str, int, int, int, int, list[str]]] = {
    "gpu_1x_h100_pcie": (
        "1x H100 (80 GB PCIe)",
        "H100 (80 GB PCIe)",
        249,
        26,
        200,
        1,
        ["us-east-1", "us-west-1"],
    ),
    "gpu_1x_h100_sxm5": (
        "1x H100 (80 GB SXM5)",
        "H100 (80 GB SXM5)",
        329,
        26,
        225,
        1,
        ["us-west-1"],
    ),
    "gpu_8x_h100_sxm5": (
        "8x H100 (80 GB SXM5)",
        "H100 (80 GB SXM5)",
        2392,
        208,
        1800,
        8,
        ["us-east-1"],
    ),
    # Outside the catalog: a pool that names it gets no GPU checks (the stand-ins have none).
    "gpu_1x_a10": ("1x A10 (24 GB PCIe)", "A10 (24 GB PCIe)", 75, 30, 200, 1, ["us-east-1"]),
    "gpu_1x_a100_sxm4": (
        "1x A100 (40 GB SXM4)",
        "A100 (40 GB SXM4)",
        129,
        30,
        200,
        1,
        ["us-east-1"],
    ),
    "gpu_8x_a100": ("8x A100 (40 GB SXM4)", "A100 (40 GB SXM4)", 1032, 124, 1800, 8, ["us-east-1"]),
    "gpu_8x_a100_80gb_sxm4": (
        "8x A100 (80 GB SXM4)",
        "A100 (80 GB SXM4)",
        1432,
        240,
        1800,
        8,
        ["us-west-1"],
    ),
    "gpu_1x_gh200": ("1x GH200 (96 GB)", "GH200 (96 GB)", 149, 64, 432, 1, ["us-east-1"]),
    "gpu_8x_b200_sxm6": ("8x B200 (180 GB SXM6)", "B200 (180 GB SXM6)", 3992, 208, 2900, 8, []),
}
NO_RULESET = "Firewall ruleset does not exist or you do not have permission to access it."
_TAG_KEY = re.compile(r"^[a-z][a-z0-9-:]+$")
_HOSTNAME = re.compile(r"^[a-z0-9][0-9a-z-]{0,62}$")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, suggestion: str = "") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.suggestion = status, code, message, suggestion

    def body(self) -> Json:
        error = {"code": self.code, "message": self.message}
        if self.suggestion:
            error["suggestion"] = self.suggestion
        return {"error": error}


def no_capacity() -> ApiError:
    return ApiError(
        400,
        "instance-operations/launch/insufficient-capacity",
        "Not enough capacity to fulfill launch request.",
    )


def invalid(message: str) -> ApiError:
    return ApiError(400, "global/invalid-parameters", message)


def missing(what: str = "Specified instance does not exist.") -> ApiError:
    return ApiError(404, "global/object-does-not-exist", what)


REFUSED_KEY = ApiError(
    401,
    "global/invalid-api-key",
    "API key was invalid, expired, or deleted.",
    "Check your API key or create a new one, then try again.",
)
QUOTA = ApiError(
    400, "global/quota-exceeded", "Quota exceeded.", "Contact Support to increase your quota."
)
RATE_LIMITED = ApiError(429, "global/too-many-requests", "Too many requests.")
INTERNAL = ApiError(
    500, "global/internal-error", "An internal server error occurred.", "Try again later."
)


@dataclass
class Fault:
    method: str
    path: str  # a glob over the path after /api/v1/
    error: ApiError
    times: int | None  # None: every time
    after: bool = False  # carry the request out, then answer the error (an answer lost)


@dataclass
class Request:
    method: str
    path: str
    body: Any
    status: int = 0


@dataclass
class Instance:
    record: Json
    user_data: str = ""
    reads: int = 0  # reads while in its current state
    powered_off: bool = False


@dataclass
class LambdaFake:
    """The fake on ``host`` (loopback by default); use as a context manager."""

    host: str = "127.0.0.1"
    boot_reads: int = 2
    end_reads: int = 2
    address_plan: Callable[[str, int], tuple[str, str]] | None = None
    capacity: dict[str, list[str]] = field(default_factory=dict)
    log: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()  # guards: every field of the state below, and log
        self.reset()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake._serve(self, "GET")

            def do_POST(self) -> None:
                fake._serve(self, "POST")

            def do_DELETE(self) -> None:
                fake._serve(self, "DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer((self.host, 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://{self.host}:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def __enter__(self) -> LambdaFake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(5)

    def reset(self) -> None:
        with self._lock:
            self.instances: dict[str, Instance] = {}
            self.keys: dict[str, Json] = {}
            self.rulesets: dict[str, Json] = {}
            self.faults: list[Fault] = []
            self.capacity = {name: list(t[6]) for name, t in TYPES.items()}
            self.log.clear()
            self._count = 0
            self.boot_reads = self.end_reads = 2

    # ── hooks for the tests ────────────────────────────────────────────────────────────

    def fail(
        self, method: str, path: str, error: ApiError, *, times: int | None = 1, after: bool = False
    ) -> None:
        with self._lock:
            self.faults.append(Fault(method, path, error, times, after))

    def make_unhealthy(self, id: str) -> None:
        with self._lock:
            self._move(self.instances[id], "unhealthy")

    def power_off(self, id: str) -> None:
        """A guest that halted: Lambda keeps the instance (and bills it) until terminated."""
        with self._lock:
            if id in self.instances:
                self.instances[id].powered_off = True

    def requests(self, method: str | None = None, path: str = "*") -> list[Request]:
        with self._lock:
            return [
                r for r in self.log if method in (None, r.method) and fnmatch.fnmatch(r.path, path)
            ]

    def listed(self) -> list[Json]:
        """Every instance the API lists now, as it would (no read counted)."""
        with self._lock:
            return [self._public(i) for i in self.instances.values() if self._listed(i)]

    def user_data(self, id: str) -> str:
        with self._lock:
            return self.instances[id].user_data

    # ── the server ─────────────────────────────────────────────────────────────────────

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        path = handler.path.split("?", 1)[0]
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        request = Request(method, path.removeprefix("/api/v1/"), None)
        try:
            request.body = json.loads(raw) if raw else None
            with self._lock:
                self.log.append(request)
                auth = handler.headers.get("Authorization", "")
                if auth != f"Bearer {KEY}":
                    raise REFUSED_KEY
                if not path.startswith("/api/v1/"):
                    raise ApiError(404, "global/not-found", "The requested resource was not found.")
                fault = self._fault(method, request.path)
                if fault is not None and not fault.after:
                    raise fault.error
                status, answer = 200, {"data": self._route(method, request.path, request.body)}
                if fault is not None:
                    raise fault.error
        except ApiError as error:
            status, answer = error.status, error.body()
        except ValueError:
            status, answer = 400, invalid("Invalid request data.").body()
        request.status = status
        data = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _fault(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.method == method and fnmatch.fnmatch(path, fault.path):
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                return fault
        return None

    def _route(self, method: str, path: str, body: Any) -> Any:
        parts = path.strip("/").split("/")
        match method, parts:
            case "GET", ["instance-types"]:
                return self._types()
            case "GET", ["instances"]:
                return [self._read(i) for i in list(self.instances.values()) if self._listed(i)]
            case "GET", ["instances", id]:
                if id not in self.instances or not self._listed(self.instances[id]):
                    raise missing()
                return self._read(self.instances[id])
            case "POST", ["instance-operations", "launch"]:
                return {"instance_ids": self._launch(body)}
            case "POST", ["instance-operations", "terminate"]:
                return {"terminated_instances": self._terminate(body)}
            case "GET", ["ssh-keys"]:
                return list(self.keys.values())
            case "POST", ["ssh-keys"]:
                return self._add_key(body)
            case "DELETE", ["ssh-keys", id]:
                if self.keys.pop(id, None) is None:
                    raise ApiError(404, "global/not-found", "The requested resource was not found.")
                return {}
            case "GET", ["firewall-rulesets"]:
                return list(self.rulesets.values())
            case "POST", ["firewall-rulesets"]:
                return self._add_ruleset(body)
            case "GET", ["firewall-rulesets", id]:
                if id not in self.rulesets:
                    raise missing(NO_RULESET)
                return self.rulesets[id]
            case "DELETE", ["firewall-rulesets", id]:
                return self._delete_ruleset(id)
        raise ApiError(404, "global/not-found", "The requested resource was not found.")

    def _types(self) -> Json:
        return {
            name: {
                "instance_type": _type(name),
                "regions_with_capacity_available": [
                    {"name": r, "description": REGIONS[r]} for r in self.capacity.get(name, [])
                ],
            }
            for name in TYPES
        }

    def _launch(self, body: Any) -> list[str]:
        if not isinstance(body, dict):
            raise invalid("Invalid request data.")
        for required in ("region_name", "instance_type_name", "ssh_key_names"):
            if required not in body:
                raise invalid(f"Missing required field: {required}")
        allowed = {
            "region_name",
            "instance_type_name",
            "ssh_key_names",
            "file_system_names",
            "file_system_mounts",
            "hostname",
            "name",
            "image",
            "user_data",
            "tags",
            "firewall_rulesets",
            "quantity",
        }
        if set(body) - allowed:
            raise invalid(f"Unknown fields: {', '.join(sorted(set(body) - allowed))}")
        region, kind = body["region_name"], body["instance_type_name"]
        if region not in REGIONS:
            raise missing(f"Region {region} does not exist.")
        if kind not in TYPES:
            raise missing(f"Instance type {kind} does not exist.")
        names = body["ssh_key_names"]
        if not isinstance(names, list) or len(names) != 1:
            raise invalid("Exactly one SSH key must be specified.")
        if names[0] not in {k["name"] for k in self.keys.values()}:
            raise missing(f"SSH key {names[0]} does not exist.")
        name = body.get("name", "")
        if not isinstance(name, str) or len(name) > 64:
            raise invalid("The name must be 64 characters or fewer.")
        if "hostname" in body and not _HOSTNAME.match(str(body["hostname"])):
            raise invalid("Invalid hostname.")
        user_data = body.get("user_data", "")
        if not isinstance(user_data, str) or len(user_data.encode()) > 1024 * 1024:
            raise invalid("user_data must be plain text of 1 MB at most.")
        tags = body.get("tags", [])
        for tag in tags:
            if (
                set(tag) != {"key", "value"}
                or not _TAG_KEY.match(tag["key"])
                or len(tag["key"]) > 55
                or len(str(tag["value"])) > 128
            ):
                raise invalid(f"Invalid tag: {tag}")
        rulesets = body.get("firewall_rulesets", [])
        for ruleset in rulesets:
            found = self.rulesets.get(ruleset.get("id", ""))
            if found is None:
                raise missing(
                    "Firewall ruleset does not exist or you do not have permission to access it."
                )
            if found["region"]["name"] != region:
                raise invalid(
                    "The firewall rulesets must exist in the same region as the instance."
                )
        quantity = body.get("quantity", 1)
        if not isinstance(quantity, int) or quantity < 1:
            raise invalid("quantity must be a positive integer.")
        if region not in self.capacity.get(kind, []):
            raise no_capacity()
        ids = []
        for _ in range(quantity):
            id = secrets.token_hex(16)
            self._count += 1
            self.instances[id] = Instance(
                {
                    "id": id,
                    "name": name,
                    "status": "booting",
                    "ssh_key_names": list(names),
                    "file_system_names": list(body.get("file_system_names", [])),
                    "region": {"name": region, "description": REGIONS[region]},
                    "instance_type": _type(kind),
                    "actions": {
                        a: {"available": True}
                        for a in ("migrate", "rebuild", "restart", "cold_reboot", "terminate")
                    },
                    "tags": [dict(t) for t in tags],
                    "firewall_rulesets": [{"id": r["id"]} for r in rulesets],
                    "is_reserved": False,
                },
                user_data=user_data,
            )
            self._address(self.instances[id], region, self._count)
            ids.append(id)
        return ids

    def _address(self, instance: Instance, region: str, index: int) -> None:
        plan = self.address_plan or (lambda region, n: (f"198.51.100.{n}", f"10.19.0.{n}"))
        public, private = plan(region, index)
        instance.record["_planned"] = (public, private)

    def _terminate(self, body: Any) -> list[Json]:
        ids = body.get("instance_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids:
            raise invalid("instance_ids is required.")
        for id in ids:
            if id not in self.instances or not self._listed(self.instances[id]):
                raise missing()
        for id in ids:
            instance = self.instances[id]
            if instance.record["status"] not in ("terminating", "terminated"):
                self._move(instance, "terminating")
        return [self._public(self.instances[id]) for id in ids]

    def _add_key(self, body: Any) -> Json:
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not 1 <= len(name) <= 64:
            raise invalid("name must be 1 to 64 characters.")
        if any(k["name"] == name for k in self.keys.values()):
            raise invalid(f"An SSH key named {name} already exists.")
        public = body.get("public_key")
        if not isinstance(public, str) or not public.startswith("ssh-") or len(public) > 4096:
            raise invalid("public_key is not a valid SSH public key.")
        key = {"id": secrets.token_hex(16), "name": name, "public_key": public}
        self.keys[key["id"]] = key
        return key

    def _add_ruleset(self, body: Any) -> Json:
        if not isinstance(body, dict) or not {"name", "region", "rules"} <= set(body):
            raise invalid("name, region and rules are required.")
        if len(body["name"]) > 64:
            raise invalid("The name must be 64 characters or fewer.")
        if body["region"] not in REGIONS:
            raise missing(f"Region {body['region']} does not exist.")
        for rule in body["rules"]:
            protocol = rule.get("protocol")
            if (
                protocol not in ("tcp", "udp", "icmp", "all")
                or "source_network" not in rule
                or "description" not in rule
            ):
                raise invalid(f"Invalid firewall rule: {rule}")
            ports = rule.get("port_range")
            if protocol == "icmp" and ports is not None:
                raise invalid("port_range is not allowed for the icmp protocol.")
            if protocol in ("tcp", "udp") and (
                not isinstance(ports, list)
                or len(ports) != 2
                or not 1 <= ports[0] <= ports[1] <= 65535
            ):
                raise invalid("port_range must be [min, max].")
        ruleset = {
            "id": secrets.token_hex(16),
            "name": body["name"],
            "region": {"name": body["region"], "description": REGIONS[body["region"]]},
            "rules": body["rules"],
            "created": datetime.now(UTC).isoformat(),
            "instance_ids": [],
        }
        self.rulesets[ruleset["id"]] = ruleset
        return ruleset

    def _delete_ruleset(self, id: str) -> Json:
        if id not in self.rulesets:
            raise missing(
                "Firewall ruleset does not exist or you do not have permission to access it."
            )
        using = [
            i
            for i in self.instances.values()
            if {"id": id} in i.record["firewall_rulesets"]
            and i.record["status"] != "terminated"
            and self._listed(i)
        ]
        if using:
            raise ApiError(
                400,
                "firewall-rulesets/firewall-ruleset-in-use",
                "Firewall ruleset is in use by one or more instances.",
                "Terminate all instances that are using the ruleset before deleting it.",
            )
        del self.rulesets[id]
        return {}

    # ── instances through their states ─────────────────────────────────────────────────

    def _move(self, instance: Instance, status: str) -> None:
        instance.record["status"], instance.reads = status, 0

    def _listed(self, instance: Instance) -> bool:
        return not instance.record.get("_gone")

    def _read(self, instance: Instance) -> Json:
        """The instance as one read sees it; the read moves it on."""
        record, status = instance.record, instance.record["status"]
        instance.reads += 1
        if status == "booting" and instance.reads > self.boot_reads:
            self._move(instance, "active")
            public, private = record["_planned"]
            record.update(ip=public, private_ip=private, hostname=public.replace(".", "-"))
        elif status == "terminating" and instance.reads > self.end_reads:
            self._move(instance, "terminated")
        elif status == "terminated" and instance.reads > self.end_reads:
            record["_gone"] = True
        return self._public(instance)

    def _public(self, instance: Instance) -> Json:
        return {k: v for k, v in instance.record.items() if not k.startswith("_")}


def _type(name: str) -> Json:
    description, gpu, cents, vcpus, memory, gpus, _ = TYPES[name]
    return {
        "name": name,
        "description": description,
        "gpu_description": gpu,
        "price_cents_per_hour": cents,
        "specs": {"vcpus": vcpus, "memory_gib": memory, "storage_gib": 1024, "gpus": gpus},
    }
