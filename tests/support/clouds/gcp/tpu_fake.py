"""A local fake of the Cloud TPU v2 REST API, spoken to by the real ``google-cloud-tpu``
(``tpu_v2.TpuClient``, REST transport, ``AnonymousCredentials``, ``client_options``'s
``api_endpoint``).

::

    TpuClient (REST, http://HOST:PORT)             TPUFake: a ThreadingHTTPServer thread; one
    ───────────────────────────────────            lock over its state
    create_queued_resource ─ POST .../queuedResources?queuedResourceId=
                                                   validate like Google (id, accelerator type
                                                   and runtime offered in the zone, spot), a
                                                   QueuedResource CREATING and an Operation
                                                   that is done after ``operation_polls`` gets
    get_operation ─ GET .../operations/o           one poll closer to done
    get_queued_resource ─ GET .../queuedResources/q
                                                   each get moves the queue one state on:
                                                   ACCEPTED -> WAITING_FOR_RESOURCES (for
                                                   ``queue_polls`` gets) -> PROVISIONING ->
                                                   ACTIVE, its nodes READY with one
                                                   networkEndpoint per host in ``subnet``; or
                                                   FAILED with Google's stockout error
                                                   (``stockout(zone)``)
    delete_queued_resource ─ DELETE ...?force=true refused without force while it has nodes
                                                   (FAILED_PRECONDITION); its operation's end
                                                   removes it and its nodes
    get_node / list_nodes, list_queued_resources, list_accelerator_types,
    list_runtime_versions, delete_node

Errors have Google's JSON shape (``{"error": {"code", "message", "status", "details"}}``);
an operation or a queue that failed carries a ``google.rpc.Status`` (``code``, ``message``).
``preempt(zone, node)`` is Google reclaiming a spot slice: the node PREEMPTED, its queued
resource SUSPENDED. The zones are Google's for the types the tests use (v4 in us-central2-b only).
"""

from __future__ import annotations

import copy
import fnmatch
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Json = dict[str, Any]

_V5E = ("v5litepod-1", "v5litepod-4", "v5litepod-8", "v5litepod-16")
# Google's zones for the types the tests use (cloud.google.com/tpu/docs/regions-zones).
ZONES: dict[str, tuple[str, ...]] = {
    "us-central2-b": ("v4-8", "v4-16", "v4-32", "v4-64"),
    "us-central1-a": (*_V5E, "v5p-8"),
    "us-south1-a": _V5E,
    "us-west1-c": _V5E,
    "us-west4-a": _V5E,
    "europe-west4-b": (*_V5E, "v5p-8"),
    "asia-southeast1-b": _V5E,
    "us-east5-a": ("v5p-8", "v6e-8"),
    "us-central1-b": ("v6e-8",),
}
RUNTIMES = ("tpu-ubuntu2204-base", "v2-alpha-tpuv5", "v2-alpha-tpuv5-lite", "v2-alpha-tpuv6e")
# Hosts per type, as Google lays them out (chips per host: 4; v5e up to 8 on one host).
HOSTS = {"v4-8": 1, "v4-16": 2, "v4-32": 4, "v4-64": 8, "v5litepod-1": 1, "v5litepod-4": 1}
HOSTS |= {"v5litepod-8": 1}
HOSTS |= {"v5litepod-16": 4, "v5p-8": 1, "v6e-8": 1}
STOCKOUT = (
    'There is no more capacity in the zone "{zone}"; you can try in another zone where '
    "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) "
    "[EID: 0x1f2e3d4c5b6a7988]"
)
_ID = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}
_STATUS |= {409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED", 412: "FAILED_PRECONDITION"}
_GRPC = {"RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9, "PERMISSION_DENIED": 7}


class ApiError(Exception):
    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason

    def body(self) -> Json:
        error: Json = {
            "code": self.status,
            "message": self.message,
            "status": _STATUS.get(self.status, "UNKNOWN"),
        }
        if self.reason:
            error["details"] = [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": self.reason,
                    "domain": "googleapis.com",
                }
            ]
        return {"error": error}


@dataclass
class Fault:
    """A request refused with ``status`` and ``message`` (Google's JSON), ``times`` times."""

    method: str
    path: str  # glob over the path after /v2/
    status: int
    message: str
    reason: str = ""
    times: int = 1


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    body: Json | None = None
    at: float = field(default_factory=time.monotonic)  # when it came


@dataclass
class _Operation:
    body: Json
    polls_left: int
    finish: Callable[[], Json | None]  # the error (a google.rpc.Status), or None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TPUFake:
    """A Cloud TPU v2 endpoint on ``host``:a free port. Use as a context manager.

    Thread-safe: ``_lock`` guards every piece of state, taken by the HTTP threads and the
    test's own calls."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        subnet: str = "10.130.0",
        zones: Mapping[str, Sequence[str]] = ZONES,
        operation_polls: int = 2,
        queue_polls: int = 1,
    ) -> None:
        self.host = host
        self.subnet = subnet  # hosts get <subnet>.<first_host>, .+1, ...
        self.first_host = 100  # clear of the GCE stand-ins (.200 up) and moto's (.132 up)
        self.zones = {z: tuple(t) for z, t in zones.items()}
        self.default_operation_polls = self.operation_polls = operation_polls
        self.default_queue_polls = self.queue_polls = queue_polls
        self._lock = threading.Lock()
        self._reset_state()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    def _reset_state(self) -> None:
        self._queued: dict[tuple[str, str, str], Json] = {}
        self._progress: dict[tuple[str, str, str], list[str]] = {}  # states still to come
        self._nodes: dict[tuple[str, str, str], Json] = {}
        self._operations: dict[str, _Operation] = {}
        self._requests: list[Request] = []
        self._faults: list[Fault] = []
        self._stockouts: set[str] = set()
        self._held: set[str] = set()  # zones whose queues wait until released
        self._addresses = itertools.count(self.first_host)
        self._ids = itertools.count(1)
        self.active_at: dict[str, float] = {}  # queued resource id -> when it became ACTIVE

    # ── lifetime ──

    def start(self) -> TPUFake:
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{self.host}:{self._server.server_address[1]}"
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> TPUFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        with self._lock:
            self._reset_state()
            self.operation_polls = self.default_operation_polls
            self.queue_polls = self.default_queue_polls

    # ── what tests control ──

    def stockout(self, zone: str) -> None:
        """Queued resources in ``zone`` fail for want of capacity (Google's message)."""
        with self._lock:
            self._stockouts.add(zone)

    def hold(self, zone: str) -> None:
        """Queued resources in ``zone`` wait for resources until ``release(zone)``."""
        with self._lock:
            self._held.add(zone)

    def release(self, zone: str) -> None:
        with self._lock:
            self._held.discard(zone)

    def fail_requests(
        self, method: str, path: str, status: int, message: str, *, reason: str = "", times: int = 1
    ) -> None:
        """Requests matching (``path``: a glob after /v2/) are refused in Google's shape."""
        with self._lock:
            self._faults.append(Fault(method.upper(), path, status, message, reason, times))

    def preempt(self, project: str, zone: str, node: str) -> None:
        """Google reclaims a spot slice: the node PREEMPTED, its queued resource SUSPENDED."""
        with self._lock:
            found = self._nodes[(project, zone, node)]
            if not found.get("schedulingConfig", {}).get("spot"):
                raise ValueError(f"{node} is not spot; Google does not preempt it")
            found["state"] = "PREEMPTED"
            queued = self._queued.get((project, zone, found["queuedResource"].rsplit("/", 1)[-1]))
            if queued is not None:
                queued["state"] = {"state": "SUSPENDED", "suspendedData": {}}

    # ── what tests inspect (copies) ──

    def queued_resources(self, project: str) -> list[Json]:
        with self._lock:
            return copy.deepcopy([q for (p, _, _), q in self._queued.items() if p == project])

    def nodes(self, project: str) -> list[Json]:
        with self._lock:
            return copy.deepcopy([n for (p, _, _), n in self._nodes.items() if p == project])

    def requests(self, method: str | None = None, path: str | None = None) -> list[Request]:
        with self._lock:
            return [
                r
                for r in self._requests
                if (method is None or r.method == method.upper())
                and (path is None or fnmatch.fnmatchcase(r.path.removeprefix("/v2/"), path))
            ]

    # ── the server's side ──

    def handle(
        self, method: str, path: str, query: Mapping[str, str], body: Json | None
    ) -> tuple[int, Json]:
        with self._lock:
            self._requests.append(Request(method, path, dict(query), body))
            try:
                for fault in self._faults:
                    relative = path.removeprefix("/v2/")
                    if fault.method == method and fnmatch.fnmatchcase(relative, fault.path):
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                        raise ApiError(fault.status, fault.message, fault.reason)
                handler, params = _route(method, path)
                return 200, handler(self, query, body or {}, **params)
            except ApiError as error:
                return error.status, error.body()

    def _zone(self, zone: str) -> tuple[str, ...]:
        if zone not in self.zones:
            raise ApiError(400, f'Invalid location "{zone}".')
        return self.zones[zone]

    def _operation(self, project: str, zone: str, finish: Callable[[], Json | None]) -> Json:
        name = f"projects/{project}/locations/{zone}/operations/operation-{next(self._ids)}"
        body: Json = {"name": name, "done": False}
        self._operations[name] = _Operation(body, self.operation_polls, finish)
        if self.operation_polls <= 0:
            self._finish(self._operations[name])
        return copy.deepcopy(body)

    def _finish(self, operation: _Operation) -> None:
        error = operation.finish()
        operation.body["done"] = True
        if error is not None:
            operation.body["error"] = error

    def _get_operation(self, query: Any, body: Json, project: str, zone: str, op: str) -> Json:
        name = f"projects/{project}/locations/{zone}/operations/{op}"
        operation = self._operations.get(name)
        if operation is None:
            raise ApiError(404, f'Resource "{name}" was not found')
        if not operation.body["done"]:
            operation.polls_left -= 1
            if operation.polls_left <= 0:
                self._finish(operation)
        return copy.deepcopy(operation.body)

    # queued resources

    def _create_queued(self, query: Mapping[str, str], body: Json, project: str, zone: str) -> Json:
        offered = self._zone(zone)
        qid = query.get("queuedResourceId", "")
        if not _ID.match(qid):
            raise ApiError(400, f'Invalid queued resource id "{qid}".')
        if (project, zone, qid) in self._queued:
            raise ApiError(409, f"Resource '{_path(project, zone, 'queuedResources', qid)}' exists")
        specs = body.get("tpu", {}).get("nodeSpec", [])
        if len(specs) != 1:
            raise ApiError(400, "Exactly one node spec is supported.")
        spec = specs[0]
        node = spec.get("node", {})
        kind = node.get("acceleratorType", "")
        if kind not in offered:
            raise ApiError(400, f'Accelerator type "{kind}" is not available in zone "{zone}".')
        runtime = node.get("runtimeVersion", "")
        if runtime not in RUNTIMES:
            raise ApiError(400, f'Invalid runtime version "{runtime}": not found in {zone}.')
        multislice = spec.get("multisliceParams")
        if multislice is not None:
            count = int(multislice.get("nodeCount", 0))
            if count < 2 or not _ID.match(multislice.get("nodeIdPrefix", "")):
                raise ApiError(400, "multisliceParams needs nodeCount >= 2 and a nodeIdPrefix.")
        elif not _ID.match(spec.get("nodeId", "")):
            raise ApiError(400, f'Invalid node id "{spec.get("nodeId", "")}".')
        spot = "spot" in body
        if spot != bool(node.get("schedulingConfig", {}).get("spot")):
            raise ApiError(400, "A spot queued resource's node must have schedulingConfig.spot.")
        name = f"projects/{project}/locations/{zone}/queuedResources/{qid}"
        queued = copy.deepcopy(body) | {"name": name, "createTime": _now()}
        queued["state"] = {"state": "CREATING"}
        key = (project, zone, qid)
        self._queued[key] = queued

        def accepted() -> None:
            if key in self._queued:
                queued["state"] = {"state": "ACCEPTED", "acceptedData": {}}
                waits = ["WAITING_FOR_RESOURCES"] * self.queue_polls
                self._progress[key] = [*waits, "PROVISIONING", "ACTIVE"]
            return None

        return self._operation(project, zone, accepted)

    def _advance(self, key: tuple[str, str, str]) -> None:
        """One get of a queued resource moves it one state on."""
        queued, steps = self._queued[key], self._progress.get(key)
        _, zone, _ = key
        if not steps:
            return
        if zone in self._stockouts:
            message = STOCKOUT.format(zone=zone)
            queued["state"] = {
                "state": "FAILED",
                "failedData": {"error": {"code": 8, "message": message}},
            }
            self._progress.pop(key)
            return
        if steps[0] == "PROVISIONING" and zone in self._held:
            queued["state"] = {"state": "WAITING_FOR_RESOURCES"}
            return
        state = steps.pop(0)
        queued["state"] = {"state": state}
        if state == "ACTIVE":
            self._make_nodes(key)
            self.active_at[key[2]] = time.monotonic()

    def _make_nodes(self, key: tuple[str, str, str]) -> None:
        project, zone, _ = key
        queued = self._queued[key]
        spec = queued["tpu"]["nodeSpec"][0]
        multislice = spec.get("multisliceParams")
        if multislice is None:
            ids = [spec["nodeId"]]
        else:
            ids = [f"{multislice['nodeIdPrefix']}-{i}" for i in range(int(multislice["nodeCount"]))]
        template = spec["node"]
        hosts = HOSTS[template["acceleratorType"]]
        for node_id in ids:
            node = copy.deepcopy(template)
            node.update(
                name=f"projects/{project}/locations/{zone}/nodes/{node_id}",
                id=str(next(self._ids) + 10**15),
                state="READY",
                health="HEALTHY",
                createTime=_now(),
                apiVersion="V2",
                queuedResource=queued["name"],
                multisliceNode=multislice is not None,
                networkEndpoints=[
                    {
                        "ipAddress": f"{self.subnet}.{next(self._addresses)}",
                        "port": 8470,
                        "accessConfig": {},
                    }
                    for _ in range(hosts)
                ],
            )
            self._nodes[(project, zone, node_id)] = node

    def _get_queued(self, query: Any, body: Json, project: str, zone: str, queued: str) -> Json:
        key = (project, zone, queued)
        if key not in self._queued:
            raise _missing(project, zone, "queuedResources", queued)
        self._advance(key)
        return copy.deepcopy(self._queued[key])

    def _list_queued(self, query: Any, body: Json, project: str, zone: str) -> Json:
        self._zone(zone)
        found = [q for (p, z, _), q in self._queued.items() if (p, z) == (project, zone)]
        return {"queuedResources": copy.deepcopy(found)} if found else {}

    def _delete_queued(
        self, query: Mapping[str, str], body: Json, project: str, zone: str, queued: str
    ) -> Json:
        key = (project, zone, queued)
        if key not in self._queued:
            raise _missing(project, zone, "queuedResources", queued)
        record = self._queued[key]
        mine = [k for k, n in self._nodes.items() if n.get("queuedResource") == record["name"]]
        if mine and query.get("force") != "true":
            raise ApiError(
                412,
                f"Queued resource {queued} has nodes; delete them first or pass force=true.",
            )
        record["state"] = {"state": "DELETING"}
        self._progress.pop(key, None)

        def gone() -> None:
            self._queued.pop(key, None)
            for node_key in mine:
                self._nodes.pop(node_key, None)
            return None

        return self._operation(project, zone, gone)

    # nodes

    def _get_node(self, query: Any, body: Json, project: str, zone: str, node: str) -> Json:
        found = self._nodes.get((project, zone, node))
        if found is None:
            raise _missing(project, zone, "nodes", node)
        return copy.deepcopy(found)

    def _list_nodes(self, query: Any, body: Json, project: str, zone: str) -> Json:
        self._zone(zone)
        found = [n for (p, z, _), n in self._nodes.items() if (p, z) == (project, zone)]
        return {"nodes": copy.deepcopy(found)} if found else {}

    def _delete_node(self, query: Any, body: Json, project: str, zone: str, node: str) -> Json:
        key = (project, zone, node)
        if key not in self._nodes:
            raise _missing(project, zone, "nodes", node)
        if self._nodes[key].get("queuedResource"):
            raise ApiError(
                412, f"Node {node} belongs to a queued resource; delete the queued resource."
            )
        self._nodes[key]["state"] = "DELETING"
        return self._operation(project, zone, lambda: self._nodes.pop(key, None) and None)

    # catalogue

    def _accelerator_types(self, query: Any, body: Json, project: str, zone: str) -> Json:
        types = self._zone(zone)
        parent = f"projects/{project}/locations/{zone}"
        return {
            "acceleratorTypes": [
                {"name": f"{parent}/acceleratorTypes/{t}", "type": t} for t in types
            ]
        }

    def _runtime_versions(self, query: Any, body: Json, project: str, zone: str) -> Json:
        self._zone(zone)
        parent = f"projects/{project}/locations/{zone}"
        return {
            "runtimeVersions": [
                {"name": f"{parent}/runtimeVersions/{v}", "version": v} for v in RUNTIMES
            ]
        }


def _path(project: str, zone: str, kind: str, name: str) -> str:
    return f"projects/{project}/locations/{zone}/{kind}/{name}"


def _missing(project: str, zone: str, kind: str, name: str) -> ApiError:
    return ApiError(404, f'Resource "{_path(project, zone, kind, name)}" was not found')


_L = r"/v2/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], Callable[..., Json]]] = [
    (method, re.compile(pattern + r"\Z"), handler)
    for method, pattern, handler in (
        ("POST", _L + "/queuedResources", TPUFake._create_queued),
        ("GET", _L + "/queuedResources", TPUFake._list_queued),
        ("GET", _L + "/queuedResources/(?P<queued>[^/]+)", TPUFake._get_queued),
        ("DELETE", _L + "/queuedResources/(?P<queued>[^/]+)", TPUFake._delete_queued),
        ("GET", _L + "/nodes", TPUFake._list_nodes),
        ("GET", _L + "/nodes/(?P<node>[^/]+)", TPUFake._get_node),
        ("DELETE", _L + "/nodes/(?P<node>[^/]+)", TPUFake._delete_node),
        ("GET", _L + "/operations/(?P<op>[^/]+)", TPUFake._get_operation),
        ("GET", _L + "/acceleratorTypes", TPUFake._accelerator_types),
        ("GET", _L + "/runtimeVersions", TPUFake._runtime_versions),
    )
]


def _route(method: str, path: str) -> tuple[Callable[..., Json], dict[str, str]]:
    for route_method, pattern, handler in _ROUTES:
        match = pattern.match(path)
        if match is not None and route_method == method:
            return handler, dict(match.groupdict())
    raise ApiError(404, f"The fake does not serve {method} {path}")


class _Handler(BaseHTTPRequestHandler):
    owner: TPUFake
    protocol_version = "HTTP/1.1"
    timeout = 60
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw.strip() else None
        except ValueError:
            status, payload = 400, ApiError(400, "Invalid JSON payload received.").body()
        else:
            status, payload = self.owner.handle(self.command, parts.path, query, body)
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_POST = do_DELETE = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


def tpu_client(url: str) -> Any:
    """A ``tpu_v2.TpuClient`` for the fake at ``url``, as a provider builds one."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2

    return tpu_v2.TpuClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        client_options=ClientOptions(api_endpoint=url),
        transport="rest",
    )
