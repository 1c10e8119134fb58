"""A fake of Vast.ai's REST API v0: the calls ``sky.VastAI`` makes, in Vast's own JSON and
error shapes (its OpenAPI descriptions and CLI), on a real HTTP server.

::

    GET    /api/v0/users/current/       the account (id, email, credit, balance)
    POST   /api/v0/bundles/             the offer search: every condition of the query
                                        ({"field": {"eq"|"neq"|"gt"|"gte"|"lt"|"lte"|"in"|
                                        "notin": v}}) evaluated on the asks, "type" (on-demand
                                        or bid), "order", "limit"; {"offers": [...]}
    PUT    /api/v0/asks/{id}/           rent: {"success": true, "new_contract": id}; an ask
                                        already rented: 404 no_such_ask
    GET    /api/v0/instances/           {"instances": [...]}; /instances/{id}/ one or null
    DELETE /api/v0/instances/{id}/      {"success": true}; 404 not_found
    GET/POST /api/v0/ssh/, DELETE /api/v0/ssh/{id}/    the account's SSH keys

Errors are ``{"success": false, "error": code, "msg": text}`` with Vast's statuses; a wrong
key is 401 ``auth_error``. Instances move through Vast's states over several reads of the
instance list: ``actual_status`` null ("created") -> "loading" -> "running" (then
``public_ipaddr`` and ``ports`` {"22/tcp": [{"HostIp", "HostPort"}]}). Fault hooks:
``no_offers`` (an empty market), ``take(ask)`` (rented by someone else), ``credit = 0``
(every rent refused: insufficient credit), ``interrupt(id)`` (an interruptible instance
outbid: stopped), ``exit(id)`` (its main process ended), ``fail(method, path, status,
error, msg)`` (the next matching call refused), ``rent_delay`` (a rent answered late).
``placement(instance)`` decides where an instance's port 22 is mapped (the stand-ins'
forwarders), else an invented address.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEY = "vast-test-key-0123456789abcdef"
READS_TO_LOAD = 1  # reads of the instance list an instance stays "created"
READS_TO_RUN = 2  # then "loading"


def ask(id: int, gpu: str = "RTX 4090", **fields: Any) -> dict[str, Any]:
    """One offer as Vast lists it (the fields the search reads and a few more)."""
    offer = {
        "id": id,
        "ask_contract_id": id,
        "machine_id": 1000 + id,
        "host_id": 500 + id,
        "gpu_name": gpu,
        "num_gpus": 1,
        "gpu_ram": 24564,
        "gpu_total_ram": 24564,
        "cpu_cores_effective": 16.0,
        "cpu_ram": 64000,
        "disk_space": 500.0,
        "cuda_max_good": 12.8,
        "direct_port_count": 100,
        "dph_total": 0.40,
        "min_bid": 0.20,
        "reliability": 0.99,
        "reliability2": 0.99,
        "verified": True,
        "verification": "verified",
        "rentable": True,
        "rented": False,
        "external": False,
        "geolocation": "Texas, US",
        "public_ipaddr": f"203.0.113.{id % 250}",
        "is_bid": False,
    }
    offer.update(fields)
    offer["gpu_total_ram"] = offer["gpu_ram"] * offer["num_gpus"]
    return offer


@dataclass
class Request:
    method: str
    path: str
    body: Any
    authorization: str


@dataclass
class Failure:
    method: str
    path: str  # an fnmatch pattern of the path after /api/v0
    status: int
    error: str
    msg: str
    after: bool = False  # the call is carried out, and its answer lost to this error


@dataclass
class VastFake:
    """The fake. Use as a context manager; ``url`` is the endpoint to give ``sky.VastAI``."""

    host: str = "127.0.0.1"
    asks: list[dict[str, Any]] = field(default_factory=list)
    credit: float = 25.0
    no_offers: bool = False
    rent_delay: float = 0.0  # seconds a rent takes to be answered (carried out first)
    placement: Callable[[dict[str, Any]], tuple[str, int] | None] | None = None

    def __post_init__(self) -> None:
        self.instances: dict[int, dict[str, Any]] = {}
        self.ssh_keys: list[dict[str, Any]] = []
        self.log: list[Request] = []
        self.failures: list[Failure] = []
        self._ids = itertools.count(31_000_000)
        self._reads: dict[int, int] = {}
        self.lock = threading.RLock()  # guards: every field the handlers touch
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                auth = self.headers.get("Authorization", "")
                status, answer = fake.answer(self.command, self.path, body, auth)
                if self.command == "PUT" and fake.rent_delay:
                    time.sleep(fake.rent_delay)  # an answer still on the wire
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer((self.host, 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://{self.host}:{self.http.server_address[1]}"
        self._thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> VastFake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self._thread.join(5)

    def reset(self, asks: list[dict[str, Any]] | None = None) -> None:
        with self.lock:
            self.asks = (
                asks if asks is not None else [ask(i, dph_total=0.3 + i / 100) for i in range(1, 9)]
            )
            self.instances.clear()
            self.ssh_keys.clear()
            self.log.clear()
            self.failures.clear()
            self._reads.clear()
            self.credit, self.no_offers, self.placement = 25.0, False, None
            self.rent_delay = 0.0

    # ── fault hooks ────────────────────────────────────────────────────────────────────

    def take(self, ask_id: int) -> None:
        """Someone else rents ``ask_id``: it stays in a search already answered, and a rent
        of it is refused."""
        with self.lock:
            for offer in self.asks:
                if offer["id"] == ask_id:
                    offer["rented"] = True

    def interrupt(self, id: int) -> None:
        """An interruptible instance outbid: Vast stops it (its disk kept, still billed)."""
        with self.lock:
            instance = self.instances[id]
            instance.update(actual_status="stopped", intended_status="stopped", cur_state="stopped")
            instance["status_msg"] = "Instance stopped: outbid by a higher bid"

    def exit(self, id: int) -> None:
        """The container's main process ended."""
        with self.lock:
            self.instances[id].update(actual_status="exited", status_msg="container exited (0)")

    def fail(
        self, method: str, path: str, status: int, error: str, msg: str, *, after: bool = False
    ) -> None:
        with self.lock:
            self.failures.append(Failure(method, path, status, error, msg, after))

    def requests(self, method: str | None = None, path: str = "*") -> list[Request]:
        with self.lock:
            return [
                r
                for r in self.log
                if (method is None or r.method == method) and fnmatch.fnmatch(r.path, path)
            ]

    def live(self, label_prefix: str = "") -> list[dict[str, Any]]:
        with self.lock:
            return [
                dict(i) for i in self.instances.values() if str(i["label"]).startswith(label_prefix)
            ]

    # ── the API ────────────────────────────────────────────────────────────────────────

    def answer(self, method: str, full: str, body: Any, auth: str) -> tuple[int, Any]:
        path = full.split("?", 1)[0].removeprefix("/api/v0")
        with self.lock:
            self.log.append(Request(method, path, body, auth))
            if auth != f"Bearer {KEY}":
                return _error(401, "auth_error", "Invalid user key")
            for failure in self.failures:
                if failure.method == method and fnmatch.fnmatch(path, failure.path):
                    self.failures.remove(failure)
                    if failure.after:
                        self._route(method, path, body)
                    return _error(failure.status, failure.error, failure.msg)
            return self._route(method, path, body)

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        with self.lock:
            parts = [p for p in path.split("/") if p]
            if method == "GET" and parts == ["users", "current"]:
                return 200, {
                    "id": 4242,
                    "email": "tests@example.com",
                    "credit": self.credit,
                    "balance": 0.0,
                    "username": "tests",
                }
            if method == "POST" and parts == ["bundles"]:
                return self._search(body or {})
            if method == "PUT" and len(parts) == 2 and parts[0] == "asks":
                return self._rent(int(parts[1]), body or {})
            if parts[:1] == ["instances"]:
                return self._instances(method, parts[1:])
            if parts[:1] == ["ssh"]:
                return self._ssh(method, parts[1:], body or {})
            return _error(404, "not_found", f"no route {method} {path}")

    def _search(self, query: dict[str, Any]) -> tuple[int, Any]:
        if not isinstance(query, dict):
            return _error(400, "invalid_request", "Invalid json body")
        kind = query.get("type", "on-demand")
        found = [
            dict(o, is_bid=kind == "bid")
            for o in self.asks
            if not self.no_offers
            and not o["rented"]
            and _matches(o, query)
            and (kind != "bid" or o.get("min_bid") is not None)
        ]
        for column, direction in reversed(query.get("order") or []):
            found.sort(key=lambda o: o.get(column) or 0, reverse=direction == "desc")
        return 200, {"offers": found[: int(query.get("limit") or 64)]}

    def _rent(self, ask_id: int, body: dict[str, Any]) -> tuple[int, Any]:
        offer = next((o for o in self.asks if o["id"] == ask_id), None)
        if offer is None or offer["rented"]:
            msg = f"error 404/3603: no_such_ask Instance type by id {ask_id} is not available."
            return 404, {"success": False, "error": "invalid_args", "msg": msg, "ask_id": ask_id}
        if not body.get("image"):
            return _error(400, "invalid_args", "error 400/3467: Invalid args: 'image' is required")
        if self.credit <= 0:
            return _error(400, "insufficient_credit", "Insufficient credit: add funds to rent.")
        bid = body.get("price")
        if bid is not None and float(bid) < float(offer["min_bid"]):
            return _error(400, "invalid_price", f"bid {bid} below the minimum {offer['min_bid']}")
        offer["rented"] = True
        id = next(self._ids)
        env = body.get("env") or {}
        self.instances[id] = {
            "id": id,
            "machine_id": offer["machine_id"],
            "host_id": offer["host_id"],
            "actual_status": None,
            "intended_status": "running",
            "cur_state": "running",
            "next_state": "running",
            "label": body.get("label"),
            "image_uuid": body["image"],
            "image_runtype": body.get("runtype"),
            "image_args": body.get("args"),
            "onstart": body.get("onstart"),
            "extra_env": [[k, v] for k, v in env.items()],
            "disk_space": body.get("disk"),
            "num_gpus": offer["num_gpus"],
            "gpu_name": offer["gpu_name"],
            "gpu_ram": offer["gpu_ram"],
            "cpu_cores_effective": offer["cpu_cores_effective"],
            "cpu_ram": offer["cpu_ram"],
            "is_bid": bid is not None,
            "dph_total": float(bid) if bid is not None else offer["dph_total"],
            "geolocation": offer["geolocation"],
            "public_ipaddr": None,
            "ports": {},
            "ssh_host": f"ssh{id % 9}.vast.ai",
            "ssh_port": 10000 + id % 50000,
            "start_date": time.time(),
            "status_msg": None,
            "ask_id": ask_id,
        }
        self._reads[id] = 0
        return 200, {"success": True, "new_contract": id}

    def _instances(self, method: str, rest: list[str]) -> tuple[int, Any]:
        if method == "GET" and not rest:
            for instance in self.instances.values():
                self._advance(instance)
            return 200, {"instances": [dict(i) for i in self.instances.values()]}
        if len(rest) != 1 or not rest[0].isdigit():
            return _error(400, "invalid_args", "invalid instance_id")
        id = int(rest[0])
        if method == "GET":
            found = self.instances.get(id)
            if found is not None:
                self._advance(found)
            return 200, {"instances": None if found is None else dict(found)}
        if method == "DELETE":
            if self.instances.pop(id, None) is None:
                return _error(404, "not_found", "Instance not found")
            return 200, {"success": True, "msg": "Instance destroyed successfully"}
        return _error(405, "invalid_request", f"{method} not allowed")

    def _advance(self, instance: dict[str, Any]) -> None:
        """Vast's states, one read at a time: created, loading, running (ports mapped)."""
        id = instance["id"]
        if instance["actual_status"] not in (None, "loading"):
            return
        self._reads[id] = reads = self._reads.get(id, 0) + 1
        if reads > READS_TO_LOAD + READS_TO_RUN:
            placed = self.placement(instance) if self.placement else None
            address, port = placed or (f"198.51.100.{id % 250}", 40000 + id % 20000)
            instance.update(actual_status="running", public_ipaddr=f"{address}\n")
            instance["ports"] = {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(port)}]}
        elif reads > READS_TO_LOAD:
            instance["actual_status"] = "loading"
            instance["status_msg"] = "Pulling image"

    def _ssh(self, method: str, rest: list[str], body: dict[str, Any]) -> tuple[int, Any]:
        if method == "GET" and not rest:
            return 200, list(self.ssh_keys)
        if method == "POST" and not rest:
            key = {"id": len(self.ssh_keys) + 1, "public_key": body.get("ssh_key", "")}
            self.ssh_keys.append(key)
            return 200, {"success": True, "key": key}
        if method == "DELETE" and len(rest) == 1:
            self.ssh_keys = [k for k in self.ssh_keys if str(k["id"]) != rest[0]]
            return 200, {"success": True}
        return _error(400, "invalid_args", "bad ssh key request")


def _error(status: int, error: str, msg: str) -> tuple[int, Any]:
    return status, {"success": False, "error": error, "msg": msg}


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: a == b,
    "neq": lambda a, b: a != b,
    "gt": lambda a, b: a is not None and a > b,
    "gte": lambda a, b: a is not None and a >= b,
    "lt": lambda a, b: a is not None and a < b,
    "lte": lambda a, b: a is not None and a <= b,
    "in": lambda a, b: a in b,
    "notin": lambda a, b: a not in b,
}


def _matches(offer: dict[str, Any], query: dict[str, Any]) -> bool:
    """Every condition of a Vast query; geolocation compares the country code it ends with."""
    for column, condition in query.items():
        if not isinstance(condition, dict):
            continue  # order, type, limit, allocated_storage
        value = offer.get(column)
        if column == "geolocation" and isinstance(value, str):
            value = value.rsplit(",", 1)[-1].strip()
        for op, operand in condition.items():
            if op not in _OPS:
                raise ValueError(f"unknown operator {op!r} in the query")
            if not _OPS[op](value, operand):
                return False
    return True
