"""A local fake of the Compute Engine REST API, spoken to by the real ``google-cloud-compute``.

::

    compute_v1 clients (REST transport,               GCPFake: a ThreadingHTTPServer thread in
    AnonymousCredentials, http://127.0.0.1:PORT)      the test process; one lock over its state
    ────────────────────────────────────────────      ─────────────────────────────────────────────
    InstancesClient.insert ─ POST zones/z/instances ─> fault rule matches? ─> JSON error (403 ...)
                                                       else: validate like GCE, PROVISIONING
                                                       instance, Operation RUNNING (due in
                                                       ``operation_delay`` s)
    ZoneOperationsClient.wait ─ POST operations/o/wait > blocks until the operation is due (at most
                                                       ``wait_limit`` s, GCE's is 2 min)
    any later request, or an inspection helper         due operations finish first: the instance
                                                       is RUNNING, or the operation carries the
                                                       error (httpErrorStatusCode and Message) and
                                                       the instance is gone

What it serves, under ``/compute/v1/projects/{p}/``: ``zones/{z}/instances`` (insert, get, list,
delete, stop, start, setLabels), ``aggregated/instances``, ``global/firewalls`` (insert, get,
list, delete), zone and global ``operations`` (get, list, wait), ``zones/{z}/machineTypes`` and
``acceleratorTypes`` (get, list), ``global/images`` (get, list, ``family/{f}``), ``zones``,
``regions`` and ``regions/{r}/zones``. Lists evaluate the ``filter`` they receive (AIP-160
comparisons with AND/OR/NOT and parentheses, or the ``eq``/``ne`` regular-expression form) and
page with ``maxResults``/``pageToken``/``nextPageToken``.

The fake's geography and catalogue (three regions, a few GPU machine types offered in some zones
only, Ubuntu and Deep Learning image families) are invented for tests, shaped like GCE's.
Instances get the addresses a test queues (``queue_addresses``) or a plan returns; by default
10.128.0.N inside and 203.0.113.N outside, which the tests' network guard refuses, so a test
that forgets to plan addresses fails fast instead of sending packets anywhere.

Traps this fake keeps, as GCE has them (see TESTBED.md): ``op.result()`` on what ``insert()``
returns polls the real Google host, not this endpoint (wait with ``ComputeClients.wait``); a
get or list retries a 503 for 10 minutes unless given ``retry=None``.
"""

from __future__ import annotations

import base64
import copy
import fnmatch
import http
import json
import random
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from google.api_core.exceptions import GoogleAPICallError
    from google.api_core.extended_operation import ExtendedOperation
    from google.cloud import compute_v1

Json = dict[str, Any]

# selfLinks name the real API host, as GCE's do: a provider that follows one with its own HTTP
# call instead of the SDK would leave the machine, and the tests' guard refuses that.
BASE = "https://www.googleapis.com/compute/v1/"
API = "/compute/v1/"
USER = "skyward-tests@example.iam.gserviceaccount.com"
_PACIFIC = timezone(timedelta(hours=-7))  # GCE writes its timestamps in this offset
_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}\Z")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}\Z")
_METADATA_KEY = re.compile(r"[a-zA-Z0-9_-]{1,128}\Z")
_MAX_METADATA_VALUE = 256 * 1024
_MAX_METADATA_TOTAL = 512 * 1024
_MAX_RESULTS = 500


# ── the catalogue ───────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class MachineType:
    """A machine type and the zones that offer it (``None``: every zone)."""

    name: str
    guest_cpus: int
    memory_mb: int
    accelerators: tuple[tuple[str, int], ...] = ()
    zones: frozenset[str] | None = None


@dataclass(frozen=True)
class AcceleratorType:
    """A GPU type (a zonal resource, as in GCE): offered where a machine type that has or
    takes it is, and only in ``zones`` where given (GCE offers some GPUs in a few zones)."""

    name: str
    description: str
    maximum_cards_per_instance: int
    zones: frozenset[str] | None = None


@dataclass(frozen=True)
class Image:
    project: str
    name: str
    family: str
    disk_size_gb: int = 10


_A2 = frozenset(
    {
        "us-central1-a",
        "us-central1-b",
        "us-central1-c",
        "us-central1-f",
        "europe-west4-a",
        "europe-west4-b",
    }
)
_A2_ULTRA = frozenset({"us-central1-a", "us-central1-c", "europe-west4-a"})
_A3 = frozenset(
    {
        "us-central1-a",
        "us-central1-c",
        "us-east4-a",
        "us-east4-b",
        "europe-west4-b",
        "europe-west4-c",
    }
)
_G2 = frozenset(
    {
        "us-central1-a",
        "us-central1-b",
        "us-central1-c",
        "us-east4-a",
        "us-east4-c",
        "europe-west4-a",
        "europe-west4-b",
        "europe-west4-c",
    }
)

REGIONS: Mapping[str, tuple[str, ...]] = {
    "us-central1": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"),
    "us-east4": ("us-east4-a", "us-east4-b", "us-east4-c"),
    "europe-west4": ("europe-west4-a", "europe-west4-b", "europe-west4-c"),
}

MACHINE_TYPES: tuple[MachineType, ...] = (
    MachineType("e2-small", 2, 2048),
    MachineType("n1-standard-4", 4, 15360),
    MachineType("n2-standard-4", 4, 16384),
    MachineType("n2-standard-8", 8, 32768),
    MachineType("g2-standard-4", 4, 16384, (("nvidia-l4", 1),), _G2),
    MachineType("a2-highgpu-1g", 12, 87040, (("nvidia-tesla-a100", 1),), _A2),
    MachineType("a2-highgpu-8g", 96, 696320, (("nvidia-tesla-a100", 8),), _A2),
    MachineType("a2-ultragpu-1g", 12, 174080, (("nvidia-a100-80gb", 1),), _A2_ULTRA),
    MachineType("a3-highgpu-8g", 208, 1916928, (("nvidia-h100-80gb", 8),), _A3),
)

ACCELERATOR_TYPES: tuple[AcceleratorType, ...] = (
    AcceleratorType("nvidia-tesla-t4", "NVIDIA T4", 4),
    AcceleratorType("nvidia-l4", "NVIDIA L4", 8),
    AcceleratorType("nvidia-tesla-a100", "NVIDIA A100 40GB", 16),
    AcceleratorType("nvidia-a100-80gb", "NVIDIA A100 80GB", 8),
    AcceleratorType("nvidia-h100-80gb", "NVIDIA H100 80GB", 8),
)
# GPUs one attaches with guestAccelerators, and the machine series that accept them (N1 only).
_ATTACHABLE = {"nvidia-tesla-t4": "n1-"}

IMAGES: tuple[Image, ...] = (
    Image("ubuntu-os-cloud", "ubuntu-2204-jammy-v20250530", "ubuntu-2204-lts"),
    Image("ubuntu-os-cloud", "ubuntu-2404-noble-amd64-v20250530", "ubuntu-2404-lts-amd64"),
    Image(
        "deeplearning-platform-release",
        "common-cu124-v20250325-ubuntu-2204-py310",
        "common-cu124-ubuntu-2204-py310",
        50,
    ),
    Image(
        "deeplearning-platform-release",
        "common-cu128-v20250530-ubuntu-2204-nvidia-570",
        "common-cu128-ubuntu-2204-nvidia-570",
        50,
    ),
)


# ── faults a test injects ───────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Fault:
    """An error GCE answers with: directly as an HTTP error, or in the operation it returns.

    ``reason`` is ``errors[0].reason`` of a direct error (``quotaExceeded``) and
    ``errors[0].code`` of an operation error (``ZONE_RESOURCE_POOL_EXHAUSTED``). The message
    may name ``{project}``, ``{zone}``, ``{region}``, ``{name}`` and ``{machine_type}``.
    """

    status: int
    reason: str
    message: str
    in_operation: bool = False
    domain: str = "global"


QUOTA_EXCEEDED = Fault(
    403,
    "quotaExceeded",
    "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 0.0 in region {region}.",
    domain="usageLimits",
)
QUOTA_EXCEEDED_IN_OPERATION = Fault(
    403,
    "QUOTA_EXCEEDED",
    "Quota 'CPUS' exceeded.  Limit: 24.0 in region {region}.",
    in_operation=True,
)
RESOURCE_POOL_EXHAUSTED = Fault(
    503,
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
    "fulfill the request.  Try a different zone, or try again later.",
    in_operation=True,
)
RESOURCE_POOL_EXHAUSTED_DIRECT = replace(RESOURCE_POOL_EXHAUSTED, status=400, in_operation=False)
UNSUPPORTED_MACHINE_TYPE = Fault(
    400,
    "invalid",
    "Invalid value for field 'resource.machineType': "
    "'zones/{zone}/machineTypes/{machine_type}'. "
    "Machine type with name '{machine_type}' does not exist in zone '{zone}'.",
)
BACKEND_ERROR = Fault(503, "backendError", "Internal error. Please try again or contact Google.")


@dataclass
class _Rule:
    method: str
    path: str  # a glob over the path after /compute/v1/
    fault: Fault
    times: int | None  # None: every matching request


class ApiError(Exception):
    """Raised inside a handler; becomes GCE's JSON error body."""

    def __init__(self, status: int, reason: str, message: str, domain: str = "global") -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.domain = status, reason, message, domain

    def body(self) -> Json:
        error = {"message": self.message, "domain": self.domain, "reason": self.reason}
        return {"error": {"code": self.status, "message": self.message, "errors": [error]}}


def _not_found(path: str) -> ApiError:
    return ApiError(404, "notFound", f"The resource '{path}' was not found")


def _invalid(field_name: str, value: Any, why: str) -> ApiError:
    return ApiError(400, "invalid", f"Invalid value for field '{field_name}': '{value}'. {why}")


# ── list filters ────────────────────────────────────────────────────────────────────────────

_TOKEN = re.compile(
    r"""\s*(?:(?P<paren>[()])|(?P<op>!=|<=|>=|=|<|>|:)|"(?P<dq>(?:[^"\\]|\\.)*)"|'(?P<sq>(?:[^'\\]|\\.)*)'|(?P<word>[^\s()=!<>:"']+))"""
)
Predicate = Callable[[Json], bool]


class _Filter:
    """GCE's list ``filter``: AIP-160 comparisons, or the ``eq``/``ne`` regular-expression form.

    AIP-160 precedence: OR binds tighter than AND; juxtaposed terms are ANDed; NOT or ``-``
    negates. The two forms cannot be mixed in one filter, as in GCE.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        position = 0
        while position < len(text):
            if not text[position:].strip():
                break
            match = _TOKEN.match(text, position)
            if match is None:
                raise self._error()
            kind = match.lastgroup or ""
            value = match.group(kind)
            if kind in ("dq", "sq"):
                kind, value = "str", re.sub(r"\\(.)", r"\1", value)
            self.tokens.append((kind, value))
            position = match.end()
        self.index = 0
        self.operators: set[str] = set()
        self.predicate = self._expression() if self.tokens else (lambda _resource: True)
        if self.index != len(self.tokens):
            raise self._error()
        if self.operators & {"eq", "ne"} and self.operators - {"eq", "ne"}:
            raise self._error()

    def _error(self) -> ApiError:
        return _invalid("filter", self.text, "Invalid list filter expression.")

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _take(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            raise self._error()
        self.index += 1
        return token

    def _expression(self) -> Predicate:
        terms = [self._factor()]
        while (token := self._peek()) is not None and token != ("paren", ")"):
            if token == ("word", "AND"):
                self.index += 1
            terms.append(self._factor())
        return lambda resource: all(term(resource) for term in terms)

    def _factor(self) -> Predicate:
        terms = [self._term()]
        while self._peek() == ("word", "OR"):
            self.index += 1
            terms.append(self._term())
        return lambda resource: any(term(resource) for term in terms)

    def _term(self) -> Predicate:
        kind, value = self._take()
        if (kind, value) == ("word", "NOT"):
            inner = self._term()
            return lambda resource: not inner(resource)
        if (kind, value) == ("paren", "("):
            inner = self._expression()
            if self._take() != ("paren", ")"):
                raise self._error()
            return inner
        if kind != "word":
            raise self._error()
        if value.startswith("-") and len(value) > 1:
            self.index -= 1
            self.tokens[self.index] = ("word", value[1:])
            inner = self._term()
            return lambda resource: not inner(resource)
        return self._comparison(value)

    def _comparison(self, path: str) -> Predicate:
        kind, operator = self._take()
        if kind == "word" and operator in ("eq", "ne"):
            literal_kind, literal = self._take()
            if literal_kind not in ("word", "str"):
                raise self._error()
            self.operators.add(operator)
            try:
                pattern = re.compile(literal)
            except re.error:
                raise self._error() from None
            matches = _regex_matcher(pattern)
            if operator == "eq":
                return lambda resource: any(matches(v) for v in _values(resource, path))
            return lambda resource: not any(matches(v) for v in _values(resource, path))
        if kind != "op":
            raise self._error()
        literal_kind, literal = self._take()
        if literal_kind not in ("word", "str"):
            raise self._error()
        self.operators.add(operator)
        if operator == ":" and literal == "*" and literal_kind == "word":
            return lambda resource: bool(_values(resource, path))
        compare = _comparer(operator, literal)
        if operator == "!=":
            return lambda resource: not any(compare(v) for v in _values(resource, path))
        return lambda resource: any(compare(v) for v in _values(resource, path))


def _values(resource: Any, path: str) -> list[Any]:
    """What a dotted field path names in a resource; lists fan out, maps are keyed."""
    found = [resource]
    for step in path.split("."):
        following: list[Any] = []
        for value in found:
            items = value if isinstance(value, list) else [value]
            following.extend(
                item[step] for item in items if isinstance(item, dict) and step in item
            )
        found = following
    flat: list[Any] = []
    for value in found:
        flat.extend(value if isinstance(value, list) else [value])
    return flat


def _regex_matcher(pattern: re.Pattern[str]) -> Callable[[Any], bool]:
    return lambda value: pattern.fullmatch(_text(value)) is not None


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _comparer(operator: str, literal: str) -> Callable[[Any], bool]:
    wildcard = re.compile(".*".join(re.escape(p) for p in literal.split("*")), re.DOTALL)

    def equal(value: Any) -> bool:
        if isinstance(value, bool | int | float) and not isinstance(value, str):
            number = _number(literal)
            return _text(value) == literal.lower() if number is None else float(value) == number
        return wildcard.fullmatch(str(value)) is not None if "*" in literal else value == literal

    def order(value: Any) -> bool:
        left, right = _number(_text(value)), _number(literal)
        if left is not None and right is not None:
            return _ORDER[operator](left, right)
        return _ORDER[operator](_text(value), literal)

    if operator in ("=", "!="):
        return equal
    if operator == ":":
        return lambda value: literal in value if isinstance(value, str) else equal(value)
    return order


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: bool(a < b),
    ">": lambda a, b: bool(a > b),
    "<=": lambda a, b: bool(a <= b),
    ">=": lambda a, b: bool(a >= b),
}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


# ── the server ──────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Request:
    """One request the fake received; ``path`` is the URL path, ``query`` its parameters."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    body: Json | None = None


@dataclass(frozen=True)
class _Call:
    """What a handler needs of a request besides the names in its path."""

    query: Mapping[str, str]
    body: Json
    fault: Fault | None  # an in-operation fault the call's operation is to finish with


@dataclass
class _Operation:
    project: str
    scope: str  # "zones/<zone>" or "global"
    body: Json
    due: float | None  # None: finishes only when the test calls finish_operations()
    on_success: Callable[[], None]
    on_failure: Callable[[], None]
    fault: Fault | None = None
    names: Mapping[str, str] = field(default_factory=dict)  # for the fault's message

    @property
    def done(self) -> bool:
        return bool(self.body["status"] == "DONE")


AddressPlan = Callable[[str, str, str], tuple[str, str]]  # (project, zone, name) -> (int, ext)
_T = TypeVar("_T")


class GCPFake:
    """A Compute Engine REST endpoint on 127.0.0.1:a free port. Use as a context manager.

    Thread-safe: one lock (``_lock``, with the ``_changed`` condition on it) guards every piece
    of state; the HTTP threads and the test's own calls take it. Operations finish when they are
    due (``operation_delay`` seconds after they start; ``None`` holds them until
    ``finish_operations()``), checked at every request and every inspection.
    """

    def __init__(
        self,
        *,
        operation_delay: float | None = 0.0,
        wait_limit: float = 2.0,
        regions: Mapping[str, Sequence[str]] = REGIONS,
        machine_types: Iterable[MachineType] = MACHINE_TYPES,
        accelerator_types: Iterable[AcceleratorType] = ACCELERATOR_TYPES,
        images: Iterable[Image] = IMAGES,
        networks: Iterable[str] = ("default",),
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host  # where it listens: a test bridge's address lets stand-ins call it
        self.default_operation_delay = operation_delay
        self.operation_delay = operation_delay
        self.default_wait_limit = wait_limit
        self.wait_limit = wait_limit  # how long operations.wait blocks at most (GCE: 2 minutes)
        self.address_plan: AddressPlan | None = None
        self._regions = {region: tuple(zones) for region, zones in regions.items()}
        self._zone_region = {z: r for r, zones in self._regions.items() for z in zones}
        self._machine_types = {m.name: m for m in machine_types}
        self._accelerator_types = {a.name: a for a in accelerator_types}
        self._default_images = tuple(images)
        self._networks = frozenset(networks)
        self._random = random.Random()
        self._ids: dict[str, str] = {}  # stable ids of catalogue entries, by selfLink
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._closing = False
        self._reset_state()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        # A bound port that never listens: connections to it are refused at once, so the
        # Google auth library's metadata probes fail fast instead of waiting for a timeout.
        self._metadata_socket = socket.socket()
        self._metadata_socket.bind(("127.0.0.1", 0))
        self.metadata_host = f"127.0.0.1:{self._metadata_socket.getsockname()[1]}"
        self.url = ""

    def _reset_state(self) -> None:
        self._instances: dict[tuple[str, str, str], Json] = {}
        self._firewalls: dict[tuple[str, str], Json] = {}
        self._operations: dict[tuple[str, str, str], _Operation] = {}
        self._requests: list[Request] = []
        self._rules: list[_Rule] = []
        self._addresses: deque[tuple[str, str]] = deque()
        self._next_address = 0
        self._images = list(self._default_images)

    # ── lifetime ──

    def start(self) -> GCPFake:
        fake = self

        class Handler(_RequestHandler):
            owner = fake

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{self.host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._changed.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._metadata_socket.close()

    def __enter__(self) -> GCPFake:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def environ(self) -> dict[str, str]:
        """Environment for tests: no metadata server (probes refused at once), no GCE check."""
        return {
            "GCE_METADATA_HOST": self.metadata_host,
            "GCE_METADATA_IP": self.metadata_host,
            "NO_GCE_CHECK": "True",
        }

    def reset(self) -> None:
        """Forget every resource, operation, request, fault, queued address and setting."""
        with self._lock:
            self._reset_state()
            self.operation_delay = self.default_operation_delay
            self.wait_limit = self.default_wait_limit
            self.address_plan = None
            self._changed.notify_all()

    # ── what tests control ──

    def queue_addresses(self, *pairs: tuple[str, str]) -> None:
        """(internal, external) addresses for the next instances created, in order."""
        with self._lock:
            self._addresses.extend(pairs)

    def fail_next_insert(self, zone: str, fault: Fault, *, times: int | None = 1) -> None:
        """The next ``times`` instance inserts in ``zone`` fail with ``fault`` (None: all)."""
        self.fail_requests("POST", f"projects/*/zones/{zone}/instances", fault, times=times)

    def fail_requests(self, method: str, path: str, fault: Fault, *, times: int | None = 1) -> None:
        """Requests whose path after /compute/v1/ matches the glob ``path`` fail with ``fault``.

        Faults ``in_operation`` apply to the calls that return an operation (instance insert,
        delete, stop, start; firewall insert, delete): the call succeeds and its operation
        finishes with the error.
        """
        with self._lock:
            self._rules.append(_Rule(method.upper(), path, fault, times))

    def clear_faults(self) -> None:
        """Forget every fault rule that is still waiting for its request."""
        with self._lock:
            self._rules.clear()

    def finish_operations(self) -> None:
        """Finish every running operation now (those held by ``operation_delay=None`` too)."""
        with self._lock:
            for operation in self._operations.values():
                if not operation.done:
                    operation.due = 0.0
            self._advance()
            self._changed.notify_all()

    def stop_instance(self, project: str, zone: str, name: str) -> None:
        """The guest powered itself off (a watchdog's ``poweroff``): TERMINATED, still there."""
        with self._lock:
            self._advance()
            instance = self._instance(project, zone, name)
            self._system_operation(project, zone, instance, "compute.instances.guestTerminate")
            self._terminated(instance)

    def preempt(self, project: str, zone: str, name: str, *, grace: float = 0.0) -> None:
        """GCE reclaims a Spot VM: STOPPING for ``grace`` s, then the instance's termination
        action (DELETE removes it, STOP leaves it TERMINATED)."""
        with self._lock:
            self._advance()
            key = (project, zone, name)
            instance = self._instance(project, zone, name)
            scheduling = instance["scheduling"]
            if scheduling.get("provisioningModel") != "SPOT" and not scheduling.get("preemptible"):
                raise ValueError(f"{name} is not a Spot VM; GCE does not preempt it")
            instance["status"] = "STOPPING"

            def reclaimed() -> None:
                if self._instances.get(key) is not instance:
                    return
                if scheduling.get("instanceTerminationAction") == "DELETE":
                    del self._instances[key]
                else:
                    self._terminated(instance)

            operation = self._start_operation(
                project,
                f"zones/{zone}",
                "compute.instances.preempted",
                instance,
                on_success=reclaimed,
                delay=grace,
                user="system",
            )
            operation.body["statusMessage"] = "Instance was preempted."
            self._advance()

    def delete_instance(self, project: str, zone: str, name: str) -> None:
        """The instance vanished outside the provider (deleted by hand, by another tool)."""
        with self._lock:
            self._advance()
            self._instance(project, zone, name)
            del self._instances[(project, zone, name)]

    def add_image(self, image: Image) -> None:
        with self._lock:
            self._images.append(image)

    # ── what tests inspect (copies, after due operations finished) ──

    def instances(self, project: str) -> list[Json]:
        return self._read(
            lambda: [i for (p, _, _), i in sorted(self._instances.items()) if p == project]
        )

    def instance(self, project: str, zone: str, name: str) -> Json | None:
        return self._read(lambda: self._instances.get((project, zone, name)))

    def firewalls(self, project: str) -> list[Json]:
        return self._read(
            lambda: [f for (p, _), f in sorted(self._firewalls.items()) if p == project]
        )

    def operations(self, project: str) -> list[Json]:
        return self._read(
            lambda: [o.body for (p, _, _), o in self._operations.items() if p == project]
        )

    def requests(self, method: str | None = None, path: str | None = None) -> list[Request]:
        """Requests received, oldest first; ``path`` is a glob over the path after /compute/v1/."""
        with self._lock:
            return [
                r
                for r in self._requests
                if (method is None or r.method == method.upper())
                and (path is None or fnmatch.fnmatchcase(r.path.removeprefix(API), path))
            ]

    def _read(self, read: Callable[[], _T]) -> _T:
        with self._lock:
            self._advance()
            return copy.deepcopy(read())

    # ── plumbing ──

    def _new_id(self) -> str:
        return str(self._random.getrandbits(63) | (1 << 62))

    def _catalogue_id(self, link: str) -> str:
        return self._ids.setdefault(link, self._new_id())

    def _fingerprint(self) -> str:
        return base64.b64encode(self._random.getrandbits(64).to_bytes(8, "big")).decode()

    def _advance(self) -> None:
        """Finish the operations that are due, in the order they fall due. Holds ``_lock``."""
        now = time.monotonic()
        due = [
            o
            for o in self._operations.values()
            if not o.done and o.due is not None and o.due <= now
        ]
        for operation in sorted(due, key=lambda o: o.due or 0.0):
            body = operation.body
            body.update(status="DONE", progress=100, endTime=_timestamp())
            if operation.fault is None:
                operation.on_success()
                continue
            fault = operation.fault
            message = _format(fault.message, operation.names)
            body["error"] = {"errors": [{"code": fault.reason, "message": message}]}
            # Both fields, as GCE sets them: without both, op.result() returns None silently.
            body["httpErrorStatusCode"] = fault.status
            body["httpErrorMessage"] = http.HTTPStatus(fault.status).phrase.upper()
            operation.on_failure()
        if due:
            self._changed.notify_all()

    def _start_operation(
        self,
        project: str,
        scope: str,
        kind: str,
        target: Json,
        *,
        on_success: Callable[[], None] = lambda: None,
        on_failure: Callable[[], None] = lambda: None,
        fault: Fault | None = None,
        names: Mapping[str, str] | None = None,
        delay: float | None,
        user: str = USER,
    ) -> _Operation:
        """An operation on ``target`` that finishes ``delay`` s from now (None: when told)."""
        bits = self._random.getrandbits
        name = f"operation-{int(time.time() * 1000)}-{bits(52):013x}-{bits(32):08x}-{bits(32):08x}"
        body: Json = {
            "kind": "compute#operation",
            "id": self._new_id(),
            "name": name,
            "operationType": kind,
            "targetLink": target["selfLink"],
            "targetId": target["id"],
            "status": "RUNNING",
            "user": user,
            "progress": 0,
            "insertTime": _timestamp(),
            "startTime": _timestamp(),
            "selfLink": _link(project, scope, "operations", name),
        }
        if scope.startswith("zones/"):
            body["zone"] = _link(project, scope)
        operation = _Operation(
            project,
            scope,
            body,
            None if delay is None else time.monotonic() + delay,
            on_success,
            on_failure,
            fault,
            names or {},
        )
        self._operations[(project, scope, name)] = operation
        return operation

    def _system_operation(self, project: str, zone: str, instance: Json, kind: str) -> None:
        self._start_operation(project, f"zones/{zone}", kind, instance, delay=0.0, user="system")
        self._advance()

    def _terminated(self, instance: Json) -> None:
        instance["status"] = "TERMINATED"
        instance["lastStopTimestamp"] = _timestamp()
        for interface in instance.get("networkInterfaces", []):
            for config in interface.get("accessConfigs", []):
                config.pop("natIP", None)  # an ephemeral external address goes with the stop

    def _instance(self, project: str, zone: str, name: str) -> Json:
        self._zone(zone)
        instance = self._instances.get((project, zone, name))
        if instance is None:
            raise _not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return instance

    def _zone(self, zone: str) -> str:
        region = self._zone_region.get(zone)
        if region is None:
            raise _invalid("zone", zone, "Unknown zone.")
        return region

    def _take_fault(self, method: str, path: str) -> Fault | None:
        relative = path.removeprefix(API)
        for rule in self._rules:
            if rule.method == method and fnmatch.fnmatchcase(relative, rule.path):
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times <= 0:
                        self._rules.remove(rule)
                return rule.fault
        return None

    def _handle(
        self, method: str, path: str, query: Mapping[str, str], body: Json | None
    ) -> tuple[int, Json]:
        with self._lock:
            self._requests.append(Request(method, path, dict(query), body))
            self._advance()
            try:
                handler, params = _route(method, path)
                fault = self._take_fault(method, path)
                if fault is not None and not fault.in_operation:
                    names = dict(params, region=self._zone_region.get(params.get("zone", ""), ""))
                    names.setdefault("machine_type", _machine_type_name(body))
                    message = _format(fault.message, names)
                    raise ApiError(fault.status, fault.reason, message, fault.domain)
                if fault is not None and handler not in _OPERATION_FAULTS:
                    raise ApiError(500, "testFault", f"{method} {path} starts no operation to fail")
                return 200, handler(self, _Call(query, body or {}, fault), **params)
            except ApiError as error:
                return error.status, error.body()

    # ── handlers: instances ──

    def _insert_instance(self, call: _Call, project: str, zone: str) -> Json:
        region = self._zone(zone)
        name = call.body.get("name", "")
        if not _NAME.match(name):
            raise _invalid(
                "resource.name", name, f"Must be a match of regex '{_NAME.pattern[:-2]}'"
            )
        key = (project, zone, name)
        if key in self._instances:
            path = f"projects/{project}/zones/{zone}/instances/{name}"
            raise ApiError(409, "alreadyExists", f"The resource '{path}' already exists")
        machine_type = self._requested_machine_type(zone, call.body.get("machineType", ""))
        accelerators = [(t, n) for t, n in machine_type.accelerators]
        accelerators += self._requested_accelerators(zone, machine_type, call.body)
        scheduling = _scheduling(call.body.get("scheduling") or {}, bool(accelerators))
        labels = _labels(call.body.get("labels") or {})
        metadata_items = _metadata_items(call.body.get("metadata") or {})
        disks = self._disks(project, zone, name, call.body.get("disks") or [])
        interfaces, queued = self._interfaces(project, zone, region, name, call.body)
        link = _link(project, "zones", zone, "instances", name)
        instance: Json = {
            "kind": "compute#instance",
            "id": self._new_id(),
            "creationTimestamp": _timestamp(),
            "name": name,
            "tags": {"fingerprint": self._fingerprint()},
            "machineType": _link(project, "zones", zone, "machineTypes", machine_type.name),
            "status": "PROVISIONING",
            "zone": _link(project, "zones", zone),
            "canIpForward": bool(call.body.get("canIpForward", False)),
            "networkInterfaces": interfaces,
            "disks": disks,
            "metadata": {"kind": "compute#metadata", "fingerprint": self._fingerprint()},
            "selfLink": link,
            "scheduling": scheduling,
            "cpuPlatform": "Unknown CPU Platform",
            "labelFingerprint": self._fingerprint(),
            "startRestricted": False,
            "deletionProtection": bool(call.body.get("deletionProtection", False)),
            "fingerprint": self._fingerprint(),
        }
        for key_name in ("description", "hostname", "minCpuPlatform"):
            if call.body.get(key_name):
                instance[key_name] = call.body[key_name]
        if tags := (call.body.get("tags") or {}).get("items"):
            instance["tags"]["items"] = list(tags)
        if metadata_items:
            instance["metadata"]["items"] = metadata_items
        if labels:
            instance["labels"] = labels
        if accounts := call.body.get("serviceAccounts"):
            instance["serviceAccounts"] = accounts
        if accelerators:
            instance["guestAccelerators"] = [
                {
                    "acceleratorType": _link(project, "zones", zone, "acceleratorTypes", t),
                    "acceleratorCount": n,
                }
                for t, n in accelerators
            ]
        self._instances[key] = instance

        def running() -> None:
            if self._instances.get(key) is instance and instance["status"] == "PROVISIONING":
                instance.update(status="RUNNING", cpuPlatform="Intel Cascade Lake")
                instance["lastStartTimestamp"] = _timestamp()

        def failed() -> None:
            if self._instances.get(key) is instance:
                del self._instances[key]
            if queued is not None:  # a failed create frees its addresses for the next one
                self._addresses.appendleft(queued)

        names = {
            "project": project,
            "zone": zone,
            "region": region,
            "name": name,
            "machine_type": machine_type.name,
        }
        operation = self._start_operation(
            project,
            f"zones/{zone}",
            "insert",
            instance,
            on_success=running,
            on_failure=failed,
            fault=call.fault,
            names=names,
            delay=self.operation_delay,
        )
        return copy.deepcopy(operation.body)

    def _requested_machine_type(self, zone: str, url: str) -> MachineType:
        match = re.search(r"(?:\A|/)zones/([^/]+)/machineTypes/([^/]+)\Z", url)
        if match is None or match.group(1) != zone:
            raise _invalid("resource.machineType", url, "Must be a machine type of the zone.")
        machine_type = self._machine_types.get(match.group(2))
        if machine_type is None or (
            machine_type.zones is not None and zone not in machine_type.zones
        ):
            names = {"zone": zone, "machine_type": match.group(2)}
            fault = UNSUPPORTED_MACHINE_TYPE
            raise ApiError(fault.status, fault.reason, _format(fault.message, names))
        return machine_type

    def _requested_accelerators(
        self, zone: str, machine_type: MachineType, body: Json
    ) -> list[tuple[str, int]]:
        wanted = []
        for index, accelerator in enumerate(body.get("guestAccelerators") or []):
            url = accelerator.get("acceleratorType", "")
            name = url.rsplit("/", 1)[-1]
            count = int(accelerator.get("acceleratorCount", 0))
            where = f"resource.guestAccelerators[{index}].acceleratorType"
            if name not in self._accelerator_types or zone not in self._accelerator_zones(name):
                raise _invalid(
                    where, url, f"Accelerator type '{name}' is not available in '{zone}'."
                )
            series = _ATTACHABLE.get(name)
            if (
                machine_type.accelerators
                or series is None
                or not machine_type.name.startswith(series)
            ):
                raise _invalid(
                    where, url, f"Machine type '{machine_type.name}' does not accept '{name}'."
                )
            if not 0 < count <= self._accelerator_types[name].maximum_cards_per_instance:
                raise _invalid(
                    f"resource.guestAccelerators[{index}].acceleratorCount", count, "Bad count."
                )
            wanted.append((name, count))
        return wanted

    def _accelerator_zones(self, name: str) -> set[str]:
        zones: set[str] = set()
        every = set(self._zone_region)
        for machine_type in self._machine_types.values():
            offered = every if machine_type.zones is None else set(machine_type.zones) & every
            if any(a == name for a, _ in machine_type.accelerators):
                zones |= offered
            if _ATTACHABLE.get(name) and machine_type.name.startswith(_ATTACHABLE[name]):
                zones |= offered
        only = self._accelerator_types[name].zones if name in self._accelerator_types else None
        return zones if only is None else zones & only

    def _disks(self, project: str, zone: str, name: str, requested: list[Json]) -> list[Json]:
        if not any(disk.get("boot") for disk in requested):
            raise _invalid("resource.disks", "", "Boot disk must be specified.")
        disks = []
        for index, disk in enumerate(requested):
            params = disk.get("initializeParams") or {}
            where = f"resource.disks[{index}].initializeParams"
            size = int(params.get("diskSizeGb") or 0)
            if source_image := params.get("sourceImage"):
                image = self._resolve_image(project, source_image)
                if size and size < image.disk_size_gb:
                    raise _invalid(
                        f"{where}.diskSizeGb",
                        size,
                        f"Requested disk size cannot be smaller than the image size "
                        f"({image.disk_size_gb} GB)",
                    )
                size = size or image.disk_size_gb
            elif not disk.get("source"):
                raise _invalid(f"{where}.sourceImage", "", "Source image must be specified.")
            device = disk.get("deviceName") or (name if index == 0 else f"persistent-disk-{index}")
            disks.append(
                {
                    "kind": "compute#attachedDisk",
                    "type": disk.get("type") or "PERSISTENT",
                    "mode": disk.get("mode") or "READ_WRITE",
                    "source": disk.get("source") or _link(project, "zones", zone, "disks", device),
                    "deviceName": device,
                    "index": index,
                    "boot": bool(disk.get("boot")),
                    "autoDelete": bool(disk.get("autoDelete", False)),
                    "interface": disk.get("interface") or "SCSI",
                    "diskSizeGb": str(size or 10),
                    "architecture": "X86_64",
                }
            )
        return disks

    def _resolve_image(self, project: str, url: str) -> Image:
        match = re.search(r"(?:projects/([^/]+)/)?global/images/(family/)?([^/]+)\Z", url)
        if match is None:
            raise _invalid("resource.disks[0].initializeParams.sourceImage", url, "Bad image.")
        image_project = match.group(1) or project
        try:
            if match.group(2):
                return self._family_image(image_project, match.group(3))
            return self._named_image(image_project, match.group(3))
        except ApiError:
            raise _not_found(
                f"projects/{image_project}/global/images/{match.group(2) or ''}{match.group(3)}"
            ) from None

    def _interfaces(
        self, project: str, zone: str, region: str, name: str, body: Json
    ) -> tuple[list[Json], tuple[str, str] | None]:
        """The interfaces, with addresses; and the pair taken from the queue, if one was."""
        requested = body.get("networkInterfaces") or []
        if not requested:
            raise _invalid(
                "resource.networkInterfaces", "", "At least one network interface is required."
            )
        networks = [(n.get("network") or "default").rsplit("/", 1)[-1] for n in requested]
        for network in networks:
            if network not in self._networks:
                raise _not_found(f"projects/{project}/global/networks/{network}")
        internal, external, queued = self._plan_addresses(project, zone, name)
        interfaces = []
        for index, (nic, network) in enumerate(zip(requested, networks, strict=True)):
            if index > 0:  # further interfaces (other VPCs) are never planned
                self._next_address += 1
                high, low = divmod(self._next_address, 250)
                internal, external = f"10.{128 + index}.{high}.{low + 2}", f"198.51.100.{low + 2}"
            interface: Json = {
                "kind": "compute#networkInterface",
                "network": _link(project, "global", "networks", network),
                "subnetwork": _link(project, "regions", region, "subnetworks", network),
                "networkIP": nic.get("networkIP") or internal,
                "name": f"nic{index}",
                "fingerprint": self._fingerprint(),
                "stackType": "IPV4_ONLY",
            }
            configs = []
            for config in nic.get("accessConfigs") or []:
                configs.append(
                    {
                        "kind": "compute#accessConfig",
                        "type": config.get("type") or "ONE_TO_ONE_NAT",
                        "name": config.get("name") or "External NAT",
                        "natIP": config.get("natIP") or external,
                        "networkTier": config.get("networkTier") or "PREMIUM",
                    }
                )
            if configs:
                interface["accessConfigs"] = configs
            interfaces.append(interface)
        return interfaces, queued

    def _plan_addresses(
        self, project: str, zone: str, name: str
    ) -> tuple[str, str, tuple[str, str] | None]:
        """(internal, external) for a new instance, and the pair if it came from the queue."""
        if self._addresses:
            queued = self._addresses.popleft()
            return (*queued, queued)
        if self.address_plan is not None:
            return (*self.address_plan(project, zone, name), None)
        # Defaults the tests' network guard refuses: a test that forgot to plan fails fast.
        self._next_address += 1
        high, low = divmod(self._next_address, 250)
        return f"10.128.{high}.{low + 2}", f"203.0.113.{low + 2}", None

    def _get_instance(self, call: _Call, project: str, zone: str, instance: str) -> Json:
        return copy.deepcopy(self._instance(project, zone, instance))

    def _list_instances(self, call: _Call, project: str, zone: str) -> Json:
        self._zone(zone)
        found = [i for (p, z, _), i in self._instances.items() if (p, z) == (project, zone)]
        page, token = _page(found, call.query)
        return _list_body(
            "compute#instanceList", f"projects/{project}/zones/{zone}/instances", page, token
        )

    def _aggregated_instances(self, call: _Call, project: str) -> Json:
        found = [i for (p, _, _), i in self._instances.items() if p == project]
        found.sort(key=lambda i: (i["zone"], i["name"]))
        page, token = _page(found, call.query, order=False)
        items: Json = {}
        for zone in sorted(self._zone_region):
            scope = f"zones/{zone}"
            here = [i for i in page if i["zone"].endswith("/" + scope)]
            if here:
                items[scope] = {"instances": here}
            else:
                items[scope] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope '{scope}' on this page.",
                        "data": [{"key": "scope", "value": scope}],
                    }
                }
        result = _list_body(
            "compute#instanceAggregatedList", f"projects/{project}/aggregated/instances", [], token
        )
        result["items"] = items
        return result

    def _delete_instance(self, call: _Call, project: str, zone: str, instance: str) -> Json:
        target = self._instance(project, zone, instance)
        key = (project, zone, instance)
        before = target["status"]
        target["status"] = "STOPPING"

        def gone() -> None:
            if self._instances.get(key) is target:
                del self._instances[key]

        def kept() -> None:
            target["status"] = before

        return self._instance_operation(project, zone, "delete", target, gone, kept, call.fault)

    def _stop(self, call: _Call, project: str, zone: str, instance: str) -> Json:
        target = self._instance(project, zone, instance)
        before = target["status"]
        if before != "TERMINATED":
            target["status"] = "STOPPING"

        def stopped() -> None:
            if target["status"] == "STOPPING":
                self._terminated(target)

        def kept() -> None:
            target["status"] = before

        return self._instance_operation(project, zone, "stop", target, stopped, kept, call.fault)

    def _start(self, call: _Call, project: str, zone: str, instance: str) -> Json:
        target = self._instance(project, zone, instance)
        if target["status"] != "TERMINATED":
            return self._instance_operation(
                project, zone, "start", target, lambda: None, lambda: None, call.fault
            )
        target["status"] = "STAGING"

        def started() -> None:
            if target["status"] != "STAGING":
                return
            target.update(status="RUNNING", lastStartTimestamp=_timestamp())
            for config in target["networkInterfaces"][0].get("accessConfigs", []):
                if "natIP" not in config:  # a new ephemeral external address, as GCE gives
                    config["natIP"] = self._plan_addresses(project, zone, instance)[1]

        def kept() -> None:
            target["status"] = "TERMINATED"

        return self._instance_operation(project, zone, "start", target, started, kept, call.fault)

    def _set_labels(self, call: _Call, project: str, zone: str, instance: str) -> Json:
        target = self._instance(project, zone, instance)
        if call.body.get("labelFingerprint") != target["labelFingerprint"]:
            raise ApiError(
                412,
                "conditionNotMet",
                "Labels fingerprint either invalid or resource labels have changed",
            )
        labels = _labels(call.body.get("labels") or {})
        target.pop("labels", None)
        if labels:
            target["labels"] = labels
        target["labelFingerprint"] = self._fingerprint()
        return self._instance_operation(
            project, zone, "setLabels", target, lambda: None, lambda: None, None
        )

    def _instance_operation(
        self,
        project: str,
        zone: str,
        kind: str,
        target: Json,
        on_success: Callable[[], None],
        on_failure: Callable[[], None],
        fault: Fault | None,
    ) -> Json:
        names = {
            "project": project,
            "zone": zone,
            "region": self._zone(zone),
            "name": target["name"],
            "machine_type": target["machineType"].rsplit("/", 1)[-1],
        }
        operation = self._start_operation(
            project,
            f"zones/{zone}",
            kind,
            target,
            on_success=on_success,
            on_failure=on_failure,
            fault=fault,
            names=names,
            delay=self.operation_delay,
        )
        return copy.deepcopy(operation.body)

    # ── handlers: firewalls ──

    def _insert_firewall(self, call: _Call, project: str) -> Json:
        name = call.body.get("name", "")
        if not _NAME.match(name):
            raise _invalid(
                "resource.name", name, f"Must be a match of regex '{_NAME.pattern[:-2]}'"
            )
        key = (project, name)
        if key in self._firewalls:
            path = f"projects/{project}/global/firewalls/{name}"
            raise ApiError(409, "alreadyExists", f"The resource '{path}' already exists")
        network = (call.body.get("network") or "global/networks/default").rsplit("/", 1)[-1]
        if network not in self._networks:
            raise _not_found(f"projects/{project}/global/networks/{network}")
        if bool(call.body.get("allowed")) == bool(call.body.get("denied")):
            raise _invalid(
                "resource", "", "Exactly one of 'allowed' or 'denied' must be specified."
            )
        for index, rule in enumerate(call.body.get("allowed") or call.body.get("denied") or []):
            if not rule.get("IPProtocol"):
                raise _invalid(f"resource.allowed[{index}].IPProtocol", "", "Required.")
        firewall: Json = {
            "kind": "compute#firewall",
            "id": self._new_id(),
            "creationTimestamp": _timestamp(),
            "name": name,
            "description": call.body.get("description", ""),
            "network": _link(project, "global", "networks", network),
            "priority": int(call.body.get("priority", 1000)),
            "direction": call.body.get("direction") or "INGRESS",
            "logConfig": {"enable": False},
            "disabled": bool(call.body.get("disabled", False)),
            "selfLink": _link(project, "global", "firewalls", name),
        }
        for key_name in (
            "allowed",
            "denied",
            "sourceRanges",
            "destinationRanges",
            "sourceTags",
            "targetTags",
            "sourceServiceAccounts",
            "targetServiceAccounts",
        ):
            if call.body.get(key_name):
                firewall[key_name] = call.body[key_name]
        if firewall["direction"] == "INGRESS" and not any(
            firewall.get(k) for k in ("sourceRanges", "sourceTags", "sourceServiceAccounts")
        ):
            firewall["sourceRanges"] = ["0.0.0.0/0"]  # GCE's default for an ingress rule
        self._firewalls[key] = firewall

        def failed() -> None:
            if self._firewalls.get(key) is firewall:
                del self._firewalls[key]

        operation = self._start_operation(
            project,
            "global",
            "insert",
            firewall,
            on_failure=failed,
            fault=call.fault,
            names={"project": project, "name": name},
            delay=self.operation_delay,
        )
        return copy.deepcopy(operation.body)

    def _firewall(self, project: str, firewall: str) -> Json:
        found = self._firewalls.get((project, firewall))
        if found is None:
            raise _not_found(f"projects/{project}/global/firewalls/{firewall}")
        return found

    def _get_firewall(self, call: _Call, project: str, firewall: str) -> Json:
        return copy.deepcopy(self._firewall(project, firewall))

    def _list_firewalls(self, call: _Call, project: str) -> Json:
        found = [f for (p, _), f in self._firewalls.items() if p == project]
        page, token = _page(found, call.query)
        return _list_body(
            "compute#firewallList", f"projects/{project}/global/firewalls", page, token
        )

    def _delete_firewall(self, call: _Call, project: str, firewall: str) -> Json:
        target = self._firewall(project, firewall)
        key = (project, firewall)

        def gone() -> None:
            if self._firewalls.get(key) is target:
                del self._firewalls[key]

        operation = self._start_operation(
            project,
            "global",
            "delete",
            target,
            on_success=gone,
            fault=call.fault,
            names={"project": project, "name": firewall},
            delay=self.operation_delay,
        )
        return copy.deepcopy(operation.body)

    # ── handlers: operations ──

    def _operation(self, project: str, scope: str, name: str) -> _Operation:
        found = self._operations.get((project, scope, name))
        if found is None:
            raise _not_found(f"projects/{project}/{scope}/operations/{name}")
        return found

    def _get_zone_operation(self, call: _Call, project: str, zone: str, operation: str) -> Json:
        self._zone(zone)
        return copy.deepcopy(self._operation(project, f"zones/{zone}", operation).body)

    def _get_global_operation(self, call: _Call, project: str, operation: str) -> Json:
        return copy.deepcopy(self._operation(project, "global", operation).body)

    def _wait_zone_operation(self, call: _Call, project: str, zone: str, operation: str) -> Json:
        self._zone(zone)
        return self._wait(project, f"zones/{zone}", operation)

    def _wait_global_operation(self, call: _Call, project: str, operation: str) -> Json:
        return self._wait(project, "global", operation)

    def _wait(self, project: str, scope: str, name: str) -> Json:
        """Block (lock released) until the operation is done or ``wait_limit`` has passed."""
        deadline = time.monotonic() + self.wait_limit
        while True:
            self._advance()
            operation = self._operation(project, scope, name)
            remaining = deadline - time.monotonic()
            if operation.done or remaining <= 0 or self._closing:
                return copy.deepcopy(operation.body)
            if operation.due is not None:
                remaining = min(remaining, max(operation.due - time.monotonic(), 0.001))
            self._changed.wait(remaining)

    def _list_zone_operations(self, call: _Call, project: str, zone: str) -> Json:
        self._zone(zone)
        found = [
            o.body
            for (p, s, _), o in self._operations.items()
            if (p, s) == (project, f"zones/{zone}")
        ]
        page, token = _page(found, call.query, order=False)
        return _list_body(
            "compute#operationList", f"projects/{project}/zones/{zone}/operations", page, token
        )

    def _list_global_operations(self, call: _Call, project: str) -> Json:
        found = [
            o.body for (p, s, _), o in self._operations.items() if (p, s) == (project, "global")
        ]
        page, token = _page(found, call.query, order=False)
        return _list_body(
            "compute#operationList", f"projects/{project}/global/operations", page, token
        )

    # ── handlers: the catalogue ──

    def _machine_type_body(self, project: str, zone: str, machine_type: MachineType) -> Json:
        link = _link(project, "zones", zone, "machineTypes", machine_type.name)
        memory_gb = machine_type.memory_mb / 1024
        body: Json = {
            "kind": "compute#machineType",
            "id": self._catalogue_id(link.replace(f"zones/{zone}/", "")),
            "creationTimestamp": "2015-01-01T00:00:00.000-07:00",
            "name": machine_type.name,
            "description": f"{machine_type.guest_cpus} vCPUs, {memory_gb:g} GB RAM",
            "guestCpus": machine_type.guest_cpus,
            "memoryMb": machine_type.memory_mb,
            "imageSpaceGb": 0,
            "maximumPersistentDisks": 128,
            "maximumPersistentDisksSizeGb": "263168",
            "zone": zone,  # a machine type names its zone, not links it
            "selfLink": link,
            "isSharedCpu": machine_type.name.startswith("e2-small"),
        }
        if machine_type.accelerators:
            body["accelerators"] = [
                {"guestAcceleratorType": t, "guestAcceleratorCount": n}
                for t, n in machine_type.accelerators
            ]
        return body

    def _zone_machine_types(self, zone: str) -> list[MachineType]:
        self._zone(zone)
        return [m for m in self._machine_types.values() if m.zones is None or zone in m.zones]

    def _get_machine_type(self, call: _Call, project: str, zone: str, machine_type: str) -> Json:
        for offered in self._zone_machine_types(zone):
            if offered.name == machine_type:
                return self._machine_type_body(project, zone, offered)
        raise _not_found(f"projects/{project}/zones/{zone}/machineTypes/{machine_type}")

    def _list_machine_types(self, call: _Call, project: str, zone: str) -> Json:
        found = [self._machine_type_body(project, zone, m) for m in self._zone_machine_types(zone)]
        page, token = _page(found, call.query)
        return _list_body(
            "compute#machineTypeList", f"projects/{project}/zones/{zone}/machineTypes", page, token
        )

    def _accelerator_body(self, project: str, zone: str, accelerator: AcceleratorType) -> Json:
        link = _link(project, "zones", zone, "acceleratorTypes", accelerator.name)
        return {
            "kind": "compute#acceleratorType",
            "id": self._catalogue_id(link),
            "creationTimestamp": "2015-01-01T00:00:00.000-07:00",
            "name": accelerator.name,
            "description": accelerator.description,
            "zone": _link(project, "zones", zone),
            "maximumCardsPerInstance": accelerator.maximum_cards_per_instance,
            "selfLink": link,
        }

    def _zone_accelerators(self, zone: str) -> list[AcceleratorType]:
        self._zone(zone)
        return [
            a for a in self._accelerator_types.values() if zone in self._accelerator_zones(a.name)
        ]

    def _get_accelerator_type(
        self, call: _Call, project: str, zone: str, accelerator_type: str
    ) -> Json:
        for offered in self._zone_accelerators(zone):
            if offered.name == accelerator_type:
                return self._accelerator_body(project, zone, offered)
        raise _not_found(f"projects/{project}/zones/{zone}/acceleratorTypes/{accelerator_type}")

    def _list_accelerator_types(self, call: _Call, project: str, zone: str) -> Json:
        found = [self._accelerator_body(project, zone, a) for a in self._zone_accelerators(zone)]
        page, token = _page(found, call.query)
        path = f"projects/{project}/zones/{zone}/acceleratorTypes"
        return _list_body("compute#acceleratorTypeList", path, page, token)

    def _image_body(self, image: Image) -> Json:
        link = _link(image.project, "global", "images", image.name)
        return {
            "kind": "compute#image",
            "id": self._catalogue_id(link),
            "creationTimestamp": "2025-05-30T00:00:00.000-07:00",
            "name": image.name,
            "description": f"{image.family}, built for the tests",
            "family": image.family,
            "sourceType": "RAW",
            "status": "READY",
            "archiveSizeBytes": str(image.disk_size_gb * 200 * 1024 * 1024),
            "diskSizeGb": str(image.disk_size_gb),
            "architecture": "X86_64",
            "guestOsFeatures": [
                {"type": "VIRTIO_SCSI_MULTIQUEUE"},
                {"type": "UEFI_COMPATIBLE"},
                {"type": "GVNIC"},
            ],
            "selfLink": link,
        }

    def _family_image(self, project: str, family: str) -> Image:
        newest = [i for i in self._images if (i.project, i.family) == (project, family)]
        if not newest:
            raise _not_found(f"projects/{project}/global/images/family/{family}")
        return newest[-1]

    def _named_image(self, project: str, name: str) -> Image:
        for image in self._images:
            if (image.project, image.name) == (project, name):
                return image
        raise _not_found(f"projects/{project}/global/images/{name}")

    def _get_image_from_family(self, call: _Call, project: str, family: str) -> Json:
        return self._image_body(self._family_image(project, family))

    def _get_image(self, call: _Call, project: str, image: str) -> Json:
        return self._image_body(self._named_image(project, image))

    def _list_images(self, call: _Call, project: str) -> Json:
        found = [self._image_body(i) for i in self._images if i.project == project]
        page, token = _page(found, call.query)
        return _list_body("compute#imageList", f"projects/{project}/global/images", page, token)

    def _zone_body(self, project: str, zone: str) -> Json:
        link = _link(project, "zones", zone)
        return {
            "kind": "compute#zone",
            "id": self._catalogue_id(link.replace(f"projects/{project}/", "")),
            "creationTimestamp": "2015-01-01T00:00:00.000-07:00",
            "name": zone,
            "description": zone,
            "status": "UP",
            "region": _link(project, "regions", self._zone_region[zone]),
            "selfLink": link,
            "availableCpuPlatforms": ["Intel Cascade Lake", "Intel Ice Lake", "AMD Milan"],
            "supportsPzs": False,
        }

    def _region_body(self, project: str, region: str) -> Json:
        link = _link(project, "regions", region)
        return {
            "kind": "compute#region",
            "id": self._catalogue_id(link.replace(f"projects/{project}/", "")),
            "creationTimestamp": "2015-01-01T00:00:00.000-07:00",
            "name": region,
            "description": region,
            "status": "UP",
            "zones": [_link(project, "zones", z) for z in self._regions[region]],
            "selfLink": link,
            "supportsPzs": False,
        }

    def _get_zone(self, call: _Call, project: str, zone: str) -> Json:
        if zone not in self._zone_region:
            raise _not_found(f"projects/{project}/zones/{zone}")
        return self._zone_body(project, zone)

    def _list_zones(self, call: _Call, project: str) -> Json:
        found = [self._zone_body(project, z) for z in self._zone_region]
        page, token = _page(found, call.query)
        return _list_body("compute#zoneList", f"projects/{project}/zones", page, token)

    def _region(self, project: str, region: str) -> str:
        if region not in self._regions:
            raise _not_found(f"projects/{project}/regions/{region}")
        return region

    def _get_region(self, call: _Call, project: str, region: str) -> Json:
        return self._region_body(project, self._region(project, region))

    def _list_regions(self, call: _Call, project: str) -> Json:
        found = [self._region_body(project, r) for r in self._regions]
        page, token = _page(found, call.query)
        return _list_body("compute#regionList", f"projects/{project}/regions", page, token)

    def _list_region_zones(self, call: _Call, project: str, region: str) -> Json:
        found = [self._zone_body(project, z) for z in self._regions[self._region(project, region)]]
        page, token = _page(found, call.query)
        return _list_body(
            "compute#zoneList", f"projects/{project}/regions/{region}/zones", page, token
        )


# The calls whose operation an ``in_operation`` fault can fail.
_OPERATION_FAULTS = frozenset(
    {
        GCPFake._insert_instance,
        GCPFake._delete_instance,
        GCPFake._stop,
        GCPFake._start,
        GCPFake._insert_firewall,
        GCPFake._delete_firewall,
    }
)

_P = r"/compute/v1/projects/(?P<project>[^/]+)"
_Z = _P + r"/zones/(?P<zone>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], Callable[..., Json]]] = [
    (method, re.compile(pattern + r"\Z"), handler)
    for method, pattern, handler in (
        ("POST", _Z + "/instances", GCPFake._insert_instance),
        ("GET", _Z + "/instances", GCPFake._list_instances),
        ("GET", _Z + "/instances/(?P<instance>[^/]+)", GCPFake._get_instance),
        ("DELETE", _Z + "/instances/(?P<instance>[^/]+)", GCPFake._delete_instance),
        ("POST", _Z + "/instances/(?P<instance>[^/]+)/stop", GCPFake._stop),
        ("POST", _Z + "/instances/(?P<instance>[^/]+)/start", GCPFake._start),
        ("POST", _Z + "/instances/(?P<instance>[^/]+)/setLabels", GCPFake._set_labels),
        ("GET", _P + "/aggregated/instances", GCPFake._aggregated_instances),
        ("POST", _P + "/global/firewalls", GCPFake._insert_firewall),
        ("GET", _P + "/global/firewalls", GCPFake._list_firewalls),
        ("GET", _P + "/global/firewalls/(?P<firewall>[^/]+)", GCPFake._get_firewall),
        ("DELETE", _P + "/global/firewalls/(?P<firewall>[^/]+)", GCPFake._delete_firewall),
        ("GET", _Z + "/operations", GCPFake._list_zone_operations),
        ("GET", _Z + "/operations/(?P<operation>[^/]+)", GCPFake._get_zone_operation),
        ("POST", _Z + "/operations/(?P<operation>[^/]+)/wait", GCPFake._wait_zone_operation),
        ("GET", _P + "/global/operations", GCPFake._list_global_operations),
        ("GET", _P + "/global/operations/(?P<operation>[^/]+)", GCPFake._get_global_operation),
        (
            "POST",
            _P + "/global/operations/(?P<operation>[^/]+)/wait",
            GCPFake._wait_global_operation,
        ),
        ("GET", _Z + "/machineTypes", GCPFake._list_machine_types),
        ("GET", _Z + "/machineTypes/(?P<machine_type>[^/]+)", GCPFake._get_machine_type),
        ("GET", _Z + "/acceleratorTypes", GCPFake._list_accelerator_types),
        (
            "GET",
            _Z + "/acceleratorTypes/(?P<accelerator_type>[^/]+)",
            GCPFake._get_accelerator_type,
        ),
        ("GET", _P + "/global/images", GCPFake._list_images),
        ("GET", _P + "/global/images/family/(?P<family>[^/]+)", GCPFake._get_image_from_family),
        ("GET", _P + "/global/images/(?P<image>[^/]+)", GCPFake._get_image),
        ("GET", _P + "/zones", GCPFake._list_zones),
        ("GET", _Z, GCPFake._get_zone),
        ("GET", _P + "/regions", GCPFake._list_regions),
        ("GET", _P + "/regions/(?P<region>[^/]+)", GCPFake._get_region),
        ("GET", _P + "/regions/(?P<region>[^/]+)/zones", GCPFake._list_region_zones),
    )
]


def _route(method: str, path: str) -> tuple[Callable[..., Json], dict[str, Any]]:
    allowed = False
    for route_method, pattern, handler in _ROUTES:
        match = pattern.match(path)
        if match is None:
            continue
        if route_method == method:
            return handler, dict(match.groupdict())
        allowed = True
    if allowed:
        raise ApiError(
            405, "httpMethodNotAllowed", f"HTTP method {method} is not supported by this URL"
        )
    raise ApiError(404, "notFound", f"The fake does not serve {method} {path}")


class _RequestHandler(BaseHTTPRequestHandler):
    owner: GCPFake
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's requests session expects
    timeout = 60  # an idle keep-alive connection's thread ends after this
    # Headers and body go out in two writes; with Nagle on, the second waits for the client's
    # delayed ACK (40 ms a call).
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw.strip() else None
        except ValueError:
            status, payload = 400, ApiError(400, "parseError", "Parse Error").body()
        else:
            status, payload = self.owner._handle(self.command, parts.path, query, body)
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (a wait past its own timeout)

    do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log is GCPFake.requests()


# ── small pieces ────────────────────────────────────────────────────────────────────────────


def _link(project: str, *parts: str) -> str:
    return BASE + "/".join(("projects", project, *parts))


def _timestamp() -> str:
    return datetime.now(_PACIFIC).isoformat(timespec="milliseconds")


class _Names(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _format(message: str, names: Mapping[str, str]) -> str:
    return message.format_map(_Names(names))


def _machine_type_name(body: Json | None) -> str:
    return str((body or {}).get("machineType", "")).rsplit("/", 1)[-1]


def _labels(labels: Mapping[str, str]) -> dict[str, str]:
    if len(labels) > 64:
        raise _invalid("resource.labels", "", "Too many labels (at most 64).")
    for key, value in labels.items():
        if not _LABEL_KEY.match(key):
            raise _invalid(
                "resource.labels",
                "",
                f"Label key '{key}' violates format constraints. "
                "The key must start with a lowercase character, can only contain lowercase "
                "letters, numeric characters, underscores and dashes.",
            )
        if not _LABEL_VALUE.match(value):
            raise _invalid(
                "resource.labels",
                "",
                f"Label value '{value}' violates format constraints. "
                "The value can only contain lowercase letters, numeric characters, "
                "underscores and dashes. The value can be at most 63 characters long.",
            )
    return dict(labels)


def _metadata_items(metadata: Json) -> list[Json]:
    items = [
        {"key": i.get("key", ""), "value": i.get("value", "")} for i in metadata.get("items") or []
    ]
    keys = [i["key"] for i in items]
    if len(set(keys)) != len(keys):
        raise _invalid("resource.metadata", "", "Duplicate metadata keys.")
    for item in items:
        if not _METADATA_KEY.match(item["key"]):
            raise _invalid("resource.metadata.items.key", item["key"], "Bad metadata key.")
        if len(item["value"].encode()) > _MAX_METADATA_VALUE:
            raise _invalid(
                "resource.metadata", "", f"Metadata value for '{item['key']}' exceeds 256 KB."
            )
    if sum(len(i["key"]) + len(i["value"].encode()) for i in items) > _MAX_METADATA_TOTAL:
        raise _invalid("resource.metadata", "", "Metadata exceeds 512 KB in total.")
    return items


def _scheduling(requested: Json, has_accelerators: bool) -> Json:
    """GCE's scheduling defaults, and the combinations it refuses."""
    spot = requested.get("provisioningModel") == "SPOT" or bool(requested.get("preemptible"))
    scheduling = dict(requested)
    scheduling.setdefault("provisioningModel", "STANDARD")
    scheduling.setdefault("preemptible", False)
    scheduling.setdefault("onHostMaintenance", "TERMINATE" if spot else "MIGRATE")
    scheduling.setdefault("automaticRestart", not spot)
    if spot:
        scheduling.setdefault("instanceTerminationAction", "STOP")
        if scheduling["onHostMaintenance"] != "TERMINATE" or scheduling["automaticRestart"]:
            raise _invalid(
                "resource.scheduling",
                "",
                "Spot VMs require onHostMaintenance TERMINATE and automaticRestart false.",
            )
    if has_accelerators and scheduling["onHostMaintenance"] != "TERMINATE":
        raise _invalid(
            "resource.scheduling.onHostMaintenance",
            scheduling["onHostMaintenance"],
            "Instances with guest accelerators do not support live migration.",
        )
    return scheduling


def _page(
    items: list[Json], query: Mapping[str, str], *, order: bool = True
) -> tuple[list[Json], str]:
    """Filter, order and cut one page; the token names where the next page starts."""
    text = query.get("filter", "")
    predicate = _Filter(text).predicate
    chosen = [i for i in items if predicate(i)]
    order_by = query.get("orderBy", "")
    if order_by in ("creationTimestamp desc", "creationTimestamp"):
        chosen.sort(key=lambda i: i.get("creationTimestamp", ""), reverse=order_by.endswith("desc"))
    elif order_by in ("", "name"):
        if order:
            chosen.sort(key=lambda i: str(i.get("name", "")))
    else:
        raise _invalid("orderBy", order_by, "Sorting by this field is not supported.")
    raw_max = query.get("maxResults", "")
    try:
        size = int(raw_max) if raw_max else _MAX_RESULTS
    except ValueError:
        raise _invalid("maxResults", raw_max, "Must be an integer.") from None
    if not 0 <= size <= _MAX_RESULTS:
        raise _invalid("maxResults", raw_max, f"Must be between 0 and {_MAX_RESULTS}.")
    size = size or _MAX_RESULTS
    start = 0
    if token := query.get("pageToken"):
        try:
            start, bound = json.loads(base64.urlsafe_b64decode(token.encode()))
        except ValueError:
            raise _invalid("pageToken", token, "Invalid page token.") from None
        if bound != text:  # GCE refuses a token used with another filter
            raise _invalid("pageToken", token, "The page token does not match the request.")
    page = chosen[start : start + size]
    following = ""
    if start + size < len(chosen):
        following = base64.urlsafe_b64encode(json.dumps([start + size, text]).encode()).decode()
    return copy.deepcopy(page), following


def _list_body(kind: str, path: str, items: list[Json], token: str) -> Json:
    body: Json = {"kind": kind, "id": path, "selfLink": BASE + path}
    if items:
        body["items"] = items
    if token:
        body["nextPageToken"] = token
    return body


# ── clients of the real SDK, pointed at the fake ────────────────────────────────────────────

_C = TypeVar("_C")


def compute_client(client_class: Callable[..., _C], url: str) -> _C:
    """A ``google.cloud.compute_v1`` client for the endpoint at ``url``.

    Credentials are always passed (without them the client probes the metadata server first),
    and the endpoint keeps its ``http://`` scheme (without one the SDK forces https).
    """
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    return client_class(credentials=credentials, client_options=ClientOptions(api_endpoint=url))


@dataclass(frozen=True)
class ComputeClients:
    """The Compute clients a provider needs, all pointed at one endpoint.

    Operations are waited for with this endpoint's own operations clients (``wait``): the
    ``result()`` of what ``insert()`` returns polls the real Google host instead.
    """

    url: str
    instances: compute_v1.InstancesClient
    firewalls: compute_v1.FirewallsClient
    zone_operations: compute_v1.ZoneOperationsClient
    global_operations: compute_v1.GlobalOperationsClient
    machine_types: compute_v1.MachineTypesClient
    accelerator_types: compute_v1.AcceleratorTypesClient
    images: compute_v1.ImagesClient
    zones: compute_v1.ZonesClient
    regions: compute_v1.RegionsClient
    region_zones: compute_v1.RegionZonesClient

    @classmethod
    def at(cls, url: str) -> ComputeClients:
        from google.cloud import compute_v1

        def make(client_class: Callable[..., _C]) -> _C:
            return compute_client(client_class, url)

        return cls(
            url,
            instances=make(compute_v1.InstancesClient),
            firewalls=make(compute_v1.FirewallsClient),
            zone_operations=make(compute_v1.ZoneOperationsClient),
            global_operations=make(compute_v1.GlobalOperationsClient),
            machine_types=make(compute_v1.MachineTypesClient),
            accelerator_types=make(compute_v1.AcceleratorTypesClient),
            images=make(compute_v1.ImagesClient),
            zones=make(compute_v1.ZonesClient),
            regions=make(compute_v1.RegionsClient),
            region_zones=make(compute_v1.RegionZonesClient),
        )

    def wait(
        self, operation: ExtendedOperation | compute_v1.Operation, *, timeout: float = 30.0
    ) -> compute_v1.Operation:
        """The operation, DONE: waited for with ``operations.wait``, for ``timeout`` s at most.

        ``operation`` is what a call returned (an ``ExtendedOperation`` or an ``Operation``);
        its selfLink says which project and zone to ask. Errors are not raised: read
        ``.error.errors`` or call ``operation_error``. ``TimeoutError`` when it is not done.
        """
        import requests
        from google.cloud import compute_v1

        match = re.search(
            r"projects/([^/]+)/(?:zones/([^/]+)|global)/operations/([^/]+)$", operation.self_link
        )
        if match is None:
            raise ValueError(f"not a zonal or global operation: {operation.self_link}")
        project, zone, name = match.groups()
        deadline = time.monotonic() + timeout
        # What insert() returns wraps the operation; one call at least gets the plain one.
        current = operation if isinstance(operation, compute_v1.Operation) else None
        while current is None or current.status != compute_v1.Operation.Status.DONE:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"operation {name} not done after {timeout} s")
            # GCE's wait returns after 2 minutes at most, whatever the client's deadline: the
            # call's own timeout ends it at ours.
            try:
                if zone:
                    current = self.zone_operations.wait(
                        project=project, zone=zone, operation=name, timeout=remaining
                    )
                else:
                    current = self.global_operations.wait(
                        project=project, operation=name, timeout=remaining
                    )
            except requests.exceptions.Timeout:
                raise TimeoutError(f"operation {name} not done after {timeout} s") from None
        return current


def operation_error(operation: compute_v1.Operation) -> GoogleAPICallError | None:
    """What a finished operation's error is as an ``api_core`` exception (``None``: no error)."""
    from google.api_core import exceptions

    errors = list(operation.error.errors)
    if not errors:
        return None
    return exceptions.from_http_status(  # type: ignore[no-any-return,no-untyped-call]
        operation.http_error_status_code or 500,
        operation.http_error_message or errors[0].message,
        errors=errors,
        response=operation,
    )


__all__ = [
    "ACCELERATOR_TYPES",
    "BACKEND_ERROR",
    "IMAGES",
    "MACHINE_TYPES",
    "QUOTA_EXCEEDED",
    "QUOTA_EXCEEDED_IN_OPERATION",
    "REGIONS",
    "RESOURCE_POOL_EXHAUSTED",
    "RESOURCE_POOL_EXHAUSTED_DIRECT",
    "UNSUPPORTED_MACHINE_TYPE",
    "AcceleratorType",
    "ComputeClients",
    "Fault",
    "GCPFake",
    "Image",
    "MachineType",
    "Request",
    "compute_client",
    "operation_error",
]
