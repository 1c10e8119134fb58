"""A local fake of Verda's REST API (``/v1``, formerly DataCrunch's), in its own JSON and error
shapes, spoken to over real HTTP.

::

    sky.Verda(endpoint_url=fake.url)          VerdaFake: a ThreadingHTTPServer thread in the
    ───────────────────────────────────       test process; one lock over its state
    POST /oauth2/token  client credentials ─> {access_token, refresh_token, scope, token_type,
                                              expires_in}; a wrong secret: 401
    any other call, Bearer token ──────────>  an unknown or expired token: 401
                                              {"code": "unauthorized_request", "message"}
    GET  /instance-types, /instance-availability[/{type}], /images, /locations
    POST /instances ─> the new id (text)      ordered ─> provisioning (an address) ─> running,
    GET  /instances[/{id}]                    one step every ``polls`` reads of it
    PUT  /instances {id, action: delete}  ─>  deleting ─> gone (and its OS volume, if named
                                              in volume_ids; else left detached, billed)
    GET/POST/DELETE /sshkeys, /scripts        keys and startup scripts, by id

Errors are Verda's: ``{"code": "...", "message": "..."}`` with the HTTP status, codes from its
list (``invalid_request``, ``unauthorized_request``, ``insufficient_funds``,
``forbidden_action``, ``not_found``, ``server_error``, ``service_unavailable``).

Fault hooks: ``refuse_credentials`` (a revoked key), ``expire_tokens`` (every token given so
far expires now), ``fill`` (no capacity: refused at create with a 503, or accepted and then
ended ``no_capacity``), ``spoil`` / ``break_instance`` (an instance turns ``error`` where it
would run, or at once), ``power_off`` (the guest halted: ``offline``), ``reclaim`` (a spot
instance taken back), ``fail_requests`` (any call, any error). The catalogue and locations
are invented for the tests, shaped like Verda's; instances get addresses from
``address_plan`` (by hostname) or 203.0.113.N, which the tests' network guard refuses.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

Json = Any
CLIENT_ID = "skyward-tests"
CLIENT_SECRET = "verda-test-secret"
LOCATIONS = ("FIN-01", "FIN-02", "FIN-03", "ICE-01")
IMAGES = ("ubuntu-24.04-cuda-12.8-open-docker", "ubuntu-24.04", "ubuntu-22.04")


def _type(
    name: str, model: str, gpus: int, gpu_gb: int, cores: int, ram: int, price: float
) -> Json:
    return {
        "id": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        "instance_type": name,
        "model": model,
        "name": f"{model} {gpu_gb}GB" if gpus else "CPU",
        "description": "Dedicated Virtual Machine",
        "cpu": {"description": f"{cores} CPU", "number_of_cores": cores},
        "gpu": {"description": f"{gpus}x {model}" if gpus else "", "number_of_gpus": gpus},
        "gpu_memory": {
            "description": f"{gpus * gpu_gb}GB GPU RAM",
            "size_in_gigabytes": gpus * gpu_gb,
        },
        "memory": {"description": f"{ram}GB RAM", "size_in_gigabytes": ram},
        "storage": {"description": "dynamic", "size_in_gigabytes": 0},
        "price_per_hour": f"{price:.2f}",
        "spot_price": f"{price / 3:.2f}",
        "currency": "usd",
        "manufacturer": "NVIDIA" if gpus else "AMD",
        "display_name": name,
        "supported_os": list(IMAGES) if gpus else list(IMAGES[1:]),
        "best_for": [],
        "p2p": "",
    }


TYPES = (
    _type("CPU.4V.16G", "CPU", 0, 0, 4, 16, 0.03),
    _type("CPU.8V.32G", "CPU", 0, 0, 8, 32, 0.06),
    _type("1H100.80S.32V", "H100", 1, 80, 32, 185, 2.29),
    _type("8H100.80S.176V", "H100", 8, 80, 176, 1480, 18.32),
    _type("8A100.80S.176V", "A100", 8, 80, 176, 960, 10.32),
    _type("8B200.240V", "B200", 8, 180, 240, 1472, 31.92),
)
ON_DEMAND = {
    "FIN-01": {"CPU.4V.16G", "CPU.8V.32G", "1H100.80S.32V", "8H100.80S.176V"},
    "FIN-02": {"CPU.4V.16G", "8H100.80S.176V", "8A100.80S.176V"},
    "ICE-01": {"8B200.240V", "CPU.4V.16G"},
}
SPOT = {"FIN-03": {"CPU.4V.16G", "1H100.80S.32V", "8H100.80S.176V"}}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"{what} not found")


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # below /v1, e.g. "/instances/ID"
    query: dict[str, str]
    body: Json
    token: str


class VerdaFake:
    """Verda's API for one account. ``polls``: reads of an instance per state it passes."""

    def __init__(self, host: str = "127.0.0.1", *, polls: int = 2) -> None:
        self.host, self.polls = host, polls
        self.token_seconds = 3600.0
        self.address_plan: Callable[[str], str] | None = None
        self._lock = threading.Lock()  # guards: every field _reset_state sets
        self._reset_state()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                fake._serve(self)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer((host, 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://{host}:{self.http.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self._thread.start()

    def _reset_state(self) -> None:
        self.secret = CLIENT_SECRET
        self.tokens: dict[str, float] = {}  # token -> monotonic expiry
        self.types = [copy.deepcopy(t) for t in TYPES]
        self.available = {
            False: {k: set(v) for k, v in ON_DEMAND.items()},
            True: {k: set(v) for k, v in SPOT.items()},
        }
        self.full: dict[tuple[str, str, bool], str] = {}  # (type, location, spot) -> how
        self.instances_: dict[str, Json] = {}
        self.volumes_: dict[str, Json] = {}
        self.keys_: dict[str, Json] = {}
        self.scripts_: dict[str, Json] = {}
        self._reads: dict[str, int] = {}
        self._faults: list[list[Any]] = []  # [method, glob, ApiError, times left]
        self.fates: dict[str, str] = {}  # hostname suffix -> the state it ends in, not running
        self._log: list[Request] = []
        self._addresses = 0

    # ── the test's side ────────────────────────────────────────────────────────────────

    def reset(self) -> None:
        with self._lock:
            self._reset_state()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self._thread.join(5)

    def __enter__(self) -> VerdaFake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refuse_credentials(self) -> None:
        """The API key was revoked: new tokens are refused, and so are those given."""
        with self._lock:
            self.secret, self.tokens = secrets.token_hex(8), {}

    def expire_tokens(self) -> None:
        """Every token given so far expires now (as if its hour were up early)."""
        with self._lock:
            self.tokens = dict.fromkeys(self.tokens, 0.0)

    def fill(
        self, instance_type: str, location: str, *, spot: bool = False, how: str = "refuse"
    ) -> None:
        """No room for ``instance_type`` there, though availability still says there is:
        a create is refused (``"refuse"``: 503) or accepted and ends ``no_capacity``."""
        with self._lock:
            self.full[(instance_type, location, spot)] = how

    def break_instance(self, id: str, status: str = "error") -> None:
        with self._lock:
            self.instances_[id]["status"] = status

    def fail_requests(
        self, method: str, path: str, status: int, code: str, message: str, *, times: int | None = 1
    ) -> None:
        with self._lock:
            self._faults.append([method, path, ApiError(status, code, message), times])

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def spoil(self, hostname_suffix: str, status: str = "error") -> None:
        """Instances whose hostname ends so turn ``status`` where they would run."""
        with self._lock:
            self.fates[hostname_suffix] = status

    def instances(self) -> list[Json]:
        with self._lock:
            return copy.deepcopy(list(self.instances_.values()))

    def volumes(self) -> list[Json]:
        with self._lock:
            return copy.deepcopy(list(self.volumes_.values()))

    def ssh_keys(self) -> list[Json]:
        with self._lock:
            return copy.deepcopy(list(self.keys_.values()))

    def scripts(self) -> list[Json]:
        with self._lock:
            return copy.deepcopy(list(self.scripts_.values()))

    def requests(self, method: str | None = None, path: str | None = None) -> list[Request]:
        with self._lock:
            return [
                r
                for r in self._log
                if (method is None or r.method == method)
                and (path is None or fnmatch.fnmatchcase(r.path, path))
            ]

    # ── HTTP ───────────────────────────────────────────────────────────────────────────

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        split = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        status, body = 200, None
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = None
        path = split.path.removeprefix("/v1")
        token = (handler.headers.get("Authorization") or "").removeprefix("Bearer ")
        with self._lock:
            self._log.append(
                Request(handler.command, path, dict(parse_qsl(split.query)), data, token)
            )
            try:
                status, body = self._route(
                    handler.command, path, dict(parse_qsl(split.query)), data, token
                )
            except ApiError as error:
                status, body = error.status, {"code": error.code, "message": error.message}
        payload = (
            body
            if isinstance(body, bytes)
            else json.dumps(body).encode()
            if body is not None
            else b""
        )
        handler.send_response(status)
        kind = "text/plain" if isinstance(body, bytes) else "application/json"
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _route(
        self, method: str, path: str, query: dict[str, str], body: Json, token: str
    ) -> tuple[int, Json]:
        for fault in self._faults:
            if fault[0] == method and fnmatch.fnmatchcase(path, fault[1]) and fault[3] != 0:
                fault[3] = None if fault[3] is None else fault[3] - 1
                raise fault[2]
        if (method, path) == ("POST", "/oauth2/token"):
            return 200, self._token(body)
        if self.tokens.get(token, 0.0) <= time.monotonic():
            raise ApiError(401, "unauthorized_request", "Invalid or expired access token")
        parts = path.strip("/").split("/")
        head, rest = parts[0], parts[1:]
        if head == "instance-types" and method == "GET":
            return 200, copy.deepcopy(self.types)
        if head == "instance-availability" and method == "GET":
            spot = query.get("isSpot", "false") == "true"
            where = query.get("location_code")
            if rest:
                return 200, any(
                    rest[0] in v for k, v in self.available[spot].items() if where in (None, k)
                )
            return 200, [
                {"location_code": k, "availabilities": sorted(v)}
                for k, v in sorted(self.available[spot].items())
                if where in (None, k)
            ]
        if head == "images" and method == "GET":
            return 200, [
                {
                    "id": str(uuid.uuid5(uuid.NAMESPACE_DNS, i)),
                    "name": i,
                    "image_type": i,
                    "details": [],
                }
                for i in IMAGES
            ]
        if head == "locations" and method == "GET":
            return 200, [{"code": c, "name": c, "country_code": c[:2]} for c in LOCATIONS]
        if head == "instances":
            return self._instances(method, rest, query, body)
        if head in ("sshkeys", "scripts"):
            return self._named(head, method, rest, body)
        if head == "volumes" and method == "GET":
            return 200, copy.deepcopy(list(self.volumes_.values()))
        raise ApiError(404, "not_found", f"Cannot {method} /v1{path}")

    def _token(self, body: Json) -> Json:
        body = body or {}
        if body.get("grant_type") != "client_credentials":
            raise ApiError(400, "invalid_request", "grant_type must be client_credentials")
        if (body.get("client_id"), body.get("client_secret")) != (CLIENT_ID, self.secret):
            raise ApiError(401, "unauthorized_request", "Invalid client credentials")
        token = secrets.token_hex(16)
        self.tokens[token] = time.monotonic() + self.token_seconds
        return {
            "access_token": token,
            "refresh_token": secrets.token_hex(16),
            "scope": "cloud-api-v1",
            "token_type": "Bearer",
            "expires_in": self.token_seconds,
        }

    # ── instances ──────────────────────────────────────────────────────────────────────

    def _instances(
        self, method: str, rest: list[str], query: dict[str, str], body: Json
    ) -> tuple[int, Json]:
        if method == "GET" and not rest:
            listed = [self._read(i) for i in list(self.instances_)]
            wanted = query.get("status")
            return 200, [i for i in listed if i is not None and wanted in (None, i["status"])]
        if method == "GET":
            found = self._read(rest[0])
            if found is None:
                raise _not_found("Instance")
            return 200, found
        if method == "POST":
            return 202, self._create(body or {}).encode()
        if method == "PUT":
            ids = body.get("id") if isinstance(body, dict) else None
            ids = [ids] if isinstance(ids, str) else ids
            if not ids or body.get("action") not in ("delete", "shutdown", "start", "hibernate"):
                raise ApiError(400, "invalid_request", "id and a valid action are required")
            for id in ids:
                if id not in self.instances_:
                    raise _not_found("Instance")
            for id in ids:
                self._act(self.instances_[id], body["action"], body.get("volume_ids") or [])
            return 202, None
        raise ApiError(405, "invalid_request", f"{method} not allowed")

    def _create(self, body: Json) -> str:
        def invalid(message: str) -> ApiError:
            return ApiError(400, "invalid_request", message)

        kind = next(
            (t for t in self.types if t["instance_type"] == body.get("instance_type")), None
        )
        if kind is None:
            raise invalid("Invalid instance type")
        if body.get("image") not in IMAGES:
            raise invalid("Operating system is not valid for this instance type")
        location, spot = body.get("location_code"), body.get("is_spot") is True
        if location not in LOCATIONS:
            raise invalid("Invalid location code")
        if not body.get("hostname") or not isinstance(body.get("description"), str):
            raise invalid("hostname and description are required")
        if not all(k in self.keys_ for k in body.get("ssh_key_ids") or []):
            raise invalid("SSH key not found")
        script = body.get("startup_script_id")
        if script is not None and script not in self.scripts_:
            raise invalid("Startup script not found")
        volume = body.get("os_volume") or {}
        if not isinstance(volume.get("size", 50), int) or volume.get("size", 50) < 50:
            raise invalid("os_volume size must be at least 50 GB")
        how = self.full.get((kind["instance_type"], location, spot))
        if how == "refuse" or kind["instance_type"] not in self.available[spot].get(
            location, set()
        ):
            raise ApiError(
                503, "service_unavailable", "Not enough resources available for this instance type"
            )
        id = str(uuid.uuid4())
        volume_id = str(uuid.uuid4())
        self.volumes_[volume_id] = {
            "id": volume_id,
            "name": volume.get("name", body["hostname"]),
            "size": volume.get("size", 50),
            "status": "attached",
            "instance_id": id,
            "is_os_volume": True,
            "location": location,
            "on_spot_discontinue": volume.get("on_spot_discontinue", "keep_detached"),
        }
        price = kind["spot_price" if spot else "price_per_hour"]
        self.instances_[id] = {
            "id": id,
            "instance_type": kind["instance_type"],
            "price_per_hour": float(price),
            "hostname": body["hostname"],
            "description": body["description"],
            "status": "ordered",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
            "ssh_key_ids": list(body.get("ssh_key_ids") or []),
            "cpu": kind["cpu"],
            "gpu": kind["gpu"],
            "memory": kind["memory"],
            "storage": kind["storage"],
            "gpu_memory": kind["gpu_memory"],
            "ip": None,
            "os_volume_id": volume_id,
            "location": location,
            "image": body["image"],
            "startup_script_id": script,
            "is_spot": spot,
            "contract": "SPOT" if spot else "PAY_AS_YOU_GO",
            "pricing": "DYNAMIC_PRICE",
        }
        self._reads[id] = 0
        if how == "placed":
            self.instances_[id]["_fate"] = "no_capacity"
        return id

    def _read(self, id: str) -> Json | None:
        """The instance as Verda shows it now, advanced by one read."""
        instance = self.instances_.get(id)
        if instance is None:
            return None
        self._reads[id] = self._reads.get(id, 0) + 1
        if self._reads[id] >= self.polls:
            step = {
                "ordered": "provisioning",
                "provisioning": "running",
                "deleting": "gone",
                "discontinued": "gone",
            }
            following = step.get(instance["status"])
            if instance["status"] == "ordered" and instance.get("_fate"):
                following = instance.pop("_fate")
            if following == "running":
                ends = [v for k, v in self.fates.items() if instance["hostname"].endswith(k)]
                following = ends[0] if ends else following
            if following == "gone":
                del self.instances_[id]
                return None
            if following is not None:
                instance["status"] = following
                self._reads[id] = 0
                if following == "provisioning":
                    plan = self.address_plan
                    self._addresses += 1
                    instance["ip"] = (
                        plan(instance["hostname"]) if plan else f"203.0.113.{self._addresses}"
                    )
        return {k: v for k, v in copy.deepcopy(instance).items() if not k.startswith("_")}

    def _act(self, instance: Json, action: str, volume_ids: list[str]) -> None:
        if action == "delete":
            instance["status"], self._reads[instance["id"]] = "deleting", 0
            for volume in self.volumes_.values():
                if volume["instance_id"] == instance["id"]:
                    volume["status"], volume["instance_id"] = "detached", None
            for volume_id in volume_ids:
                self.volumes_.pop(volume_id, None)
        elif action == "shutdown":
            instance["status"] = "offline"
        elif action == "start" and instance["status"] == "offline":
            instance["status"] = "running"

    def reclaim(self, id: str) -> None:
        """Verda takes a spot instance back: ``discontinued``, its OS volume deleted or left
        detached as its ``on_spot_discontinue`` says."""
        with self._lock:
            instance = self.instances_[id]
            instance["status"], self._reads[id] = "discontinued", 0
            volume = self.volumes_.get(instance["os_volume_id"], {})
            if volume.get("on_spot_discontinue") == "delete_permanently":
                self.volumes_.pop(instance["os_volume_id"])
            else:
                volume.update(status="detached", instance_id=None)

    def power_off(self, id: str) -> None:
        """The guest halted itself: Verda keeps the instance, ``offline`` (and billed)."""
        with self._lock:
            if id in self.instances_:
                self.instances_[id]["status"] = "offline"

    # ── SSH keys and startup scripts ───────────────────────────────────────────────────

    def _named(self, head: str, method: str, rest: list[str], body: Json) -> tuple[int, Json]:
        store, field = (self.keys_, "key") if head == "sshkeys" else (self.scripts_, "script")
        if method == "GET" and not rest:
            return 200, copy.deepcopy(list(store.values()))
        if method == "GET":
            if rest[0] not in store:
                raise _not_found("Resource")
            return 200, [copy.deepcopy(store[rest[0]])]
        if method == "POST":
            body = body or {}
            if not body.get("name") or not body.get(field):
                raise ApiError(400, "invalid_request", f"name and {field} are required")
            id = str(uuid.uuid4())
            store[id] = {"id": id, "name": body["name"], field: body[field]}
            return 201, id.encode()
        if method == "DELETE":
            ids = rest[:1] or list(
                (body or {}).get("keys" if head == "sshkeys" else "scripts") or []
            )
            if not ids or any(i not in store for i in ids):
                raise _not_found("Resource")
            for i in ids:
                del store[i]
            return 200, None
        raise ApiError(405, "invalid_request", f"{method} not allowed")
