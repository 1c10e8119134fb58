"""A local fake of RunPod's APIs: the GraphQL subset and the REST (v1) pods calls Skyward uses.

::

    RunPod provider (urllib)                 RunPodFake: a ThreadingHTTPServer thread in the
                                             test process; one lock over its state
    ─────────────────────────────────        ──────────────────────────────────────────────
    POST /graphql  {query, variables}  ───>  myself, gpuTypes { lowestPrice(input) },
                                             podFindAndDeployOnDemand(input),
                                             podRentInterruptable(input): {"data": ...} or
                                             {"errors": [{"message", "path"}]} as RunPod
                                             answers them; a variable's unknown field: 400
    GET /v1/pods, GET|DELETE /v1/pods/{id} > the pods as REST v1 shows them (desiredStatus,
                                             publicIp, portMappings, env as an object,
                                             interruptible, lastStatusChange); 404
                                             {"error": "pod not found", "status": 404}
    Authorization: Bearer <key>              anything else: 401 (GraphQL: its errors array)

A pod rented is ``RUNNING`` at once with no ports (its image pulling, its container
starting); after ``start_reads`` reads of it, it has its address and port 22's public
mapping (``address_plan(pod)``, by default 203.0.113.N, which the tests' guard refuses).

Fault hooks: ``no_capacity`` (GPU ids RunPod has none of when rented: the offer is gone;
``no_spot``: none interruptible),
``balance`` (out of credit below the pod's price), ``lose_answers`` (the pod is made, the
answer is a 502), ``interrupt(id)`` (a spot pod outbid, later), ``stop(id)`` (its container
ended). The GPU types, their prices and stock are invented for tests, shaped like RunPod's.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Json = dict[str, Any]
KEY = "rpa_TESTKEY0123456789"
NO_CAPACITY = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)
NO_FUNDS = "You do not have enough funds to rent this pod. Please add funds to your account."
BID_TOO_LOW = "Your bid price is below the current minimum bid for this GPU type."


@dataclass(frozen=True)
class GpuType:
    id: str
    memory: int
    secure: float | None  # on demand, per GPU per hour; None: not sold there
    community: float | None
    bid: float  # the current minimum bid per GPU
    stock: str | None = "High"  # None: none in stock


GPU_TYPES = [
    GpuType("NVIDIA GeForce RTX 4090", 24, 0.69, 0.34, 0.20),
    GpuType("NVIDIA GeForce RTX 3090", 24, 0.43, 0.22, 0.11),
    GpuType("NVIDIA A100 80GB PCIe", 80, 1.64, 1.19, 0.82),
    GpuType("NVIDIA A100-SXM4-80GB", 80, 1.89, 1.39, 0.95),
    GpuType("NVIDIA H100 80GB HBM3", 80, 2.99, 2.69, 1.75),
    GpuType("NVIDIA H100 PCIe", 80, 2.39, 1.99, 1.25, stock=None),
    GpuType("NVIDIA L40S", 48, 0.86, 0.79, 0.40),
    GpuType("AMD Instinct MI300X OAM", 192, 2.49, None, 1.50),
]
# What each mutation's input may carry (RunPod's input types have more; Skyward sends these).
_DEPLOY_FIELDS = {
    "cloudType", "gpuCount", "gpuTypeId", "name", "imageName", "containerDiskInGb",
    "volumeInGb", "volumeMountPath", "ports", "supportPublicIp", "startSsh", "dockerArgs",
    "env", "dataCenterId", "networkVolumeId", "minVcpuCount", "minMemoryInGb",
}  # fmt: skip
_RENT_FIELDS = _DEPLOY_FIELDS | {"bidPerGpu"}


class RunPodFake:
    """The fake's state and server. Use as a context manager."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._lock = threading.Lock()  # guards: every field below
        self.reset()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                fake._serve(self)

            def do_GET(self) -> None:
                fake._serve(self)

            def do_DELETE(self) -> None:
                fake._serve(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        with self._lock:
            self.key = KEY
            self.gpu_types = list(GPU_TYPES)
            self.pods: dict[str, Json] = {}
            self.log: list[tuple[str, str, Any]] = []  # (method, path or operation, body)
            self.no_capacity: set[str] = set()
            self.no_spot: set[str] = set()
            self.balance = 1000.0
            self.lose_answers = 0
            self.start_reads = 2
            self.address_plan: Callable[[Json], tuple[str, int]] | None = None
            self.on_rent: Callable[[Json], None] | None = None
            self._count = 0

    def __enter__(self) -> RunPodFake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    # ── for the tests ────────────────────────────────────────────────────────────────────

    def requests(self, operation: str) -> list[Any]:
        """The bodies (GraphQL: variables) of every request for ``operation``."""
        with self._lock:
            return [body for op, _, body in self.log if op == operation]

    def live(self, prefix: str = "skyward-") -> list[Json]:
        with self._lock:
            return [dict(p) for p in self.pods.values() if p["name"].startswith(prefix)]

    def interrupt(self, id: str) -> None:
        """Another user outbid this spot pod: RunPod stops it (its volume kept)."""
        self._stop(id, "Outbid: stopped by RunPod to serve a higher bid")

    def stop(self, id: str, why: str = "Exited by container") -> None:
        self._stop(id, why)

    def _stop(self, id: str, why: str) -> None:
        with self._lock:
            pod = self.pods[id]
            pod.update(desiredStatus="EXITED", lastStatusChange=why, publicIp=None)
            pod["portMappings"] = {}

    # ── the server ───────────────────────────────────────────────────────────────────────

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        authorized = handler.headers.get("Authorization") == f"Bearer {self.key}"
        if handler.path.startswith("/graphql"):
            if not authorized:
                status, body = 401, {"errors": [{"message": "Unauthorized"}]}
            else:
                status, body = self._graphql(json.loads(raw or b"{}"))
        elif handler.path.startswith("/v1/pods"):
            if not authorized:
                status, body = 401, {"error": "Unauthorized", "status": 401}
            else:
                status, body = self._rest(handler.command, handler.path)
        else:
            status, body = 404, {"error": "not found", "status": 404}
        data = b"" if body is None else json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _graphql(self, request: Json) -> tuple[int, Json]:
        query, variables = str(request.get("query", "")), dict(request.get("variables") or {})
        found = re.search(r"\{\s*(\w+)", query)
        operation = found[1] if found else ""
        with self._lock:
            self.log.append((operation, "/graphql", variables))
        if operation == "myself":
            return 200, {"data": {"myself": {"id": "user_2TEST"}}}
        if operation == "gpuTypes":
            return 200, {"data": {"gpuTypes": [self._gpu(t, variables) for t in self.gpu_types]}}
        if operation in ("podFindAndDeployOnDemand", "podRentInterruptable"):
            spot = operation == "podRentInterruptable"
            given = dict(variables.get("input") or {})
            unknown = set(given) - (_RENT_FIELDS if spot else _DEPLOY_FIELDS)
            if unknown:
                kind = "PodRentInterruptableInput" if spot else "PodFindAndDeployOnDemandInput"
                message = f'Field "{sorted(unknown)[0]}" is not defined by type "{kind}".'
                return 400, {
                    "errors": [{"message": f'Variable "$input" got invalid value; {message}'}]
                }
            return self._rent(operation, given, spot)
        return 400, {"errors": [{"message": f"Cannot query field on type Query: {operation}"}]}

    def _gpu(self, kind: GpuType, variables: Json) -> Json:
        lowest = dict(variables.get("lowest") or {})
        secure = lowest.get("secureCloud")
        prices = [p for p, s in ((kind.secure, True), (kind.community, False)) if p is not None]
        if secure is not None:
            prices = [kind.secure if secure else kind.community] if prices else []
            prices = [p for p in prices if p is not None]
        in_stock = kind.stock is not None and bool(prices)
        return {
            "id": kind.id,
            "displayName": kind.id.split()[-1],
            "memoryInGb": kind.memory,
            "secureCloud": kind.secure is not None,
            "communityCloud": kind.community is not None,
            "lowestPrice": {
                "minimumBidPrice": kind.bid if in_stock else None,
                "uninterruptablePrice": min(prices) if in_stock else None,
                "stockStatus": kind.stock if in_stock else None,
            },
        }

    def _rent(self, operation: str, given: Json, spot: bool) -> tuple[int, Json]:
        def error(message: str) -> tuple[int, Json]:
            return 200, {
                "data": {operation: None},
                "errors": [{"message": message, "path": [operation]}],
            }

        for required in ("gpuTypeId", "gpuCount", "imageName", "name", "cloudType"):
            if required not in given:
                return error(f"{required} is required")
        if given["cloudType"] not in ("SECURE", "COMMUNITY", "ALL"):
            return 400, {
                "errors": [{"message": f"Enum CloudType has no value {given['cloudType']}"}]
            }
        kind = next((t for t in self.gpu_types if t.id == given["gpuTypeId"]), None)
        with self._lock:
            if kind is None or kind.id in self.no_capacity or kind.stock is None:
                return error(NO_CAPACITY)
            per_gpu = (
                kind.secure if given["cloudType"] == "SECURE" else (kind.community or kind.secure)
            )
            if spot and kind.id in self.no_spot:
                return error(NO_CAPACITY)
            if spot:
                if float(given.get("bidPerGpu") or 0) < kind.bid:
                    return error(BID_TOO_LOW)
                per_gpu = float(given["bidPerGpu"])
            cost = round(float(per_gpu or 0) * int(given["gpuCount"]), 4)
            if cost > self.balance:
                return error(NO_FUNDS)
            self._count += 1
            id = secrets.token_hex(7)
            pod = {
                "id": id,
                "name": given["name"],
                "image": given["imageName"],
                "gpuTypeId": kind.id,
                "gpuCount": given["gpuCount"],
                "desiredStatus": "RUNNING",
                "interruptible": spot,
                "costPerHr": cost,
                "env": {e["key"]: e["value"] for e in given.get("env") or []},
                "dockerArgs": given.get("dockerArgs", ""),
                "containerDiskInGb": given.get("containerDiskInGb"),
                "volumeInGb": given.get("volumeInGb"),
                "ports": given.get("ports", ""),
                "publicIp": None,
                "portMappings": {},
                "lastStatusChange": "Rented by User",
                "machineId": f"m{self._count}",
                "reads": 0,
                "number": self._count,
            }
            self.pods[id] = pod
            lose = self.lose_answers > 0
            self.lose_answers -= lose
            hook = self.on_rent
        if hook is not None:
            hook(dict(pod))
        if lose:
            return 502, {"errors": [{"message": "upstream connect error"}]}
        return 200, {
            "data": {operation: {"id": id, "costPerHr": cost, "machineId": pod["machineId"]}}
        }

    def _rest(self, method: str, path: str) -> tuple[int, Any]:
        id = path.split("?")[0].removeprefix("/v1/pods").strip("/")
        with self._lock:
            self.log.append((f"{method} /pods" + ("/{id}" if id else ""), path, None))
            if not id and method == "GET":
                return 200, [self._shown(p) for p in self.pods.values()]
            pod = self.pods.get(id)
            if pod is None:
                return 404, {"error": "pod not found", "status": 404}
            if method == "DELETE":
                del self.pods[id]
                return 200, None
            pod["reads"] += 1
            starting = pod["desiredStatus"] == "RUNNING" and not pod["portMappings"]
            if starting and pod["reads"] >= self.start_reads:
                plan, n = self.address_plan, pod["number"]
                ip, port = plan(pod) if plan else (f"203.0.113.{n}", 40000 + n)
                pod.update(publicIp=ip, portMappings={"22": port})
            return 200, self._shown(pod)

    @staticmethod
    def _shown(pod: Json) -> Json:
        return {k: v for k, v in pod.items() if k not in ("reads", "number")}
