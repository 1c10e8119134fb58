"""A fake Azure Resource Manager: an HTTPS server in the test process that the real
azure-mgmt-resource, -network and -compute SDKs talk to.

::

    SDK client (base_url=fake.url,              AzureFake (a ThreadingHTTPServer thread, TLS
      connection_verify=fake.ca_path,           from a trustme CA made at start)
      credential=FakeCredential())              ───────────────────────────────────────────────
    ─────────────────────────────────           one lock guards the store, the operations, the
    PUT  .../virtualMachines/vm  ─────────────> faults and the request log
                                 <── 201 body   store: lower-cased ARM id -> _Record (the JSON
                                 Azure-AsyncOperation: https://127.0.0.1:P/.../operations/<id>
    GET  .../operations/<id>     <── InProgress   operation: answers InProgress `operation_polls`
    GET  .../operations/<id>     <── Succeeded      times (or until `operation_seconds` pass),
    GET  .../virtualMachines/vm  <── final body     then applies its result to the store

Why no emulator: none installable here speaks Compute and Network to SDKs this new (see
TESTBED.md). What it keeps real, because a provider gets these wrong against real Azure:

- long-running operations through ``Azure-AsyncOperation`` (and ``Location`` for POST and
  DELETE, plain ``Location`` for a resource group's DELETE), with URLs on the fake itself;
- a failed VM create reported through the operation (``status: Failed``, ``error.code``), the
  VM left behind in ``provisioningState: Failed`` as real Compute leaves it, to be deleted;
- write-only ``osProfile.customData`` (base64, checked, never returned by GET; read it with
  ``custom_data()``), reserved admin user names, the fixed SSH key path;
- an OS disk created with every VM and left behind on delete unless its
  ``deleteOption`` is ``Delete``; NICs and public IPs likewise (``deleteOption``);
- in-use checks on delete (``NicInUse``, ``PublicIPAddressCannotBeDeleted``, ...), references
  checked on create (``InvalidResourceReference``), ids that Compute writes with the resource
  group upper-cased (compare ids case-insensitively);
- a dynamic public IP has no address until its VM runs, and loses it when deallocated;
- quotas counted in vCPUs per family (``lowPriorityCores`` for Spot) and SKU restrictions,
  both refused at PUT with 409 as real ARM does.

Paths are matched case-insensitively and api-versions are not enforced. Every reply is built
under the lock, so the SDK's parallel calls (a pool creating nodes at once) are serialized.
"""

from __future__ import annotations

import base64
import binascii
import copy
import ipaddress
import itertools
import json
import re
import socket
import ssl
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import trustme
from azure.core.credentials import AccessToken

SUBSCRIPTION = "00000000-0000-0000-0000-00000000a2e0"
TOKEN = "fake-azure-token"

Json = dict[str, Any]
# (kind, resource id) -> the address to give, or None for the fake's own choice.
# kind is "private" (a NIC's ip configuration) or "public" (a public IP address).
AddressSource = Callable[[str, str], "str | None"]
ClientT = TypeVar("ClientT")


# ── the credential and the SKU table ────────────────────────────────────────────────────


class FakeCredential:
    """A ``TokenCredential`` that hands out a fixed token and asks no one for it.

    ``scopes`` records what each ``get_token`` asked for, so a test can check that a client
    asked for the management scope.
    """

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.scopes: list[tuple[str, ...]] = []

    def get_token(
        self,
        *scopes: str,
        claims: str | None = None,
        tenant_id: str | None = None,
        enable_cae: bool = False,
        **kwargs: Any,
    ) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken(self.token, int(time.time()) + 3600)


@dataclass(frozen=True)
class VmSku:
    """One VM size as Compute's resource SKU list describes it."""

    name: str
    family: str
    vcpus: int
    memory_gb: int
    gpus: int = 0
    zones: tuple[str, ...] = ("1", "2", "3")
    accelerated_networking: bool = True
    hyper_v: str = "V1,V2"

    def capabilities(self) -> list[Json]:
        pairs = [
            ("vCPUs", self.vcpus),
            ("vCPUsAvailable", self.vcpus),
            ("MemoryGB", self.memory_gb),
            *([("GPUs", self.gpus)] if self.gpus else []),
            ("MaxDataDiskCount", 32),
            ("HyperVGenerations", self.hyper_v),
            ("CpuArchitectureType", "x64"),
            ("LowPriorityCapable", "True"),
            ("PremiumIO", "True"),
            ("AcceleratedNetworkingEnabled", str(self.accelerated_networking)),
        ]
        return [{"name": n, "value": str(v)} for n, v in pairs]


# Real sizes and families (vCPUs, memory and GPUs as Azure lists them).
DEFAULT_SKUS: tuple[VmSku, ...] = (
    VmSku("Standard_D4s_v5", "standardDSv5Family", 4, 16),
    VmSku("Standard_NC24ads_A100_v4", "StandardNCADSA100v4Family", 24, 220, 1, hyper_v="V2"),
    VmSku("Standard_ND96asr_v4", "standardNDASv4_A100Family", 96, 900, 8, hyper_v="V1,V2"),
    VmSku("Standard_ND96amsr_A100_v4", "StandardNDAMSv4_A100Family", 96, 1900, 8, hyper_v="V2"),
    VmSku("Standard_NC40ads_H100_v5", "StandardNCadsH100v5Family", 40, 320, 1, hyper_v="V2"),
    VmSku("Standard_ND96isr_H100_v5", "standardNDSH100v5Family", 96, 1900, 8, hyper_v="V2"),
    VmSku("Standard_NV36ads_A10_v5", "StandardNVADSA10v5Family", 36, 440, 1, hyper_v="V2"),
)

# Linux admin names Compute refuses ("The Admin Username specified is not allowed").
_RESERVED_USERS = frozenset(
    {
        *("administrator", "admin", "user", "user1", "user2", "user3", "user4", "user5"),
        *("test", "test1", "test2", "test3", "admin1", "admin2", "1", "123", "a", "actuser"),
        *("adm", "aspnet", "backup", "console", "david", "guest", "john", "owner", "root"),
        *("server", "sql", "support", "support_388945a0", "sys"),
    }
)
_CUSTOM_DATA_LIMIT = 87380  # base64 characters; 64 KiB decoded

# Messages as Azure words them, so a test's log reads like a real failure.
_FAULT_MESSAGES = {
    "SkuNotAvailable": (
        "The requested VM size for resource 'Following SKUs have failed for Capacity "
        "Restrictions: {size}' is currently not available in location '{location}'. Please try "
        "another size or deploy to a different location or different zone. See "
        "https://aka.ms/azureskunotavailable for details."
    ),
    "OperationNotAllowed": (
        "Operation could not be completed as it results in exceeding approved {family} Cores "
        "quota. Additional details - Deployment Model: Resource Manager, Location: {location}, "
        "Current Limit: {limit}, Current Usage: {usage}, Additional Required: {need}, (Minimum) "
        "New Limit Required: {required}. Setup Alerts when Quota reaches threshold."
    ),
    "AllocationFailed": (
        "Allocation failed. We do not have sufficient capacity for the requested VM size in "
        "this region. Read more about improving likelihood of allocation success at "
        "http://aka.ms/allocation-guidance"
    ),
    "ZonalAllocationFailed": (
        "Allocation failed. We do not have sufficient capacity for the requested VM size in "
        "this zone. Read more about improving likelihood of allocation success at "
        "http://aka.ms/allocation-guidance"
    ),
    "OverconstrainedAllocationRequest": (
        "Create or update VM failed. Allocation failed. VM(s) with the following constraints "
        "cannot be allocated, because the condition is too restrictive. Please remove some "
        "constraints and try again. Constraints applied are: - Priority (Spot) - VM Size"
    ),
    "AuthorizationFailed": (
        "The client 'skyward-tests' with object id '00000000-0000-0000-0000-000000000000' does "
        "not have authorization to perform action '{action}' over scope '{scope}' or the scope "
        "is invalid. If access was recently granted, please refresh your credentials."
    ),
}


# ── errors, records, operations, faults ─────────────────────────────────────────────────


class ArmError(Exception):
    """An ARM error reply: ``{"error": {"code", "message", "target"}}`` with an HTTP status."""

    def __init__(self, status: int, code: str, message: str, target: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.target = status, code, message, target

    def body(self) -> Json:
        error: Json = {"code": self.code, "message": self.message}
        if self.target:
            error["target"] = self.target
        return {"error": error}


@dataclass
class _Record:
    """One resource: its JSON as ARM returns it (plus write-only parts) and, for a VM, its
    power state, which ARM shows only in the instance view."""

    body: Json
    power: str | None = None
    failure: Json | None = None  # a VM whose create failed: the error


@dataclass
class _Operation:
    id: str
    finish: Callable[[], None]  # applies the result to the store; runs under the lock
    error: Json | None  # None: it succeeds
    polls_left: int
    deadline: float | None
    started: str
    status: str = "InProgress"
    ended: str | None = None


@dataclass
class _Fault:
    status: int | None  # None: through the async operation
    code: str
    message: str | None
    method: str | None = None
    path: str | None = None
    location: str | None = None
    size: str | None = None
    times: int | None = 1  # None: every time

    def take(self) -> None:
        if self.times is not None:
            self.times -= 1


@dataclass
class Reply:
    status: int
    body: Json | None = None
    headers: dict[str, str] = field(default_factory=dict)


class AddressQueue:
    """Addresses handed out in order: the n-th NIC gets ``pairs[n][0]`` as its private
    address, the n-th public IP ``pairs[n][1]``; past the end the fake chooses.

    For stand-in hosts: give addresses on the test bridge (10.123.x.y) so a namespace host
    can take the address the provider will dial.
    """

    def __init__(self, pairs: list[tuple[str | None, str | None]]) -> None:
        self._private = iter([p for p, _ in pairs])
        self._public = iter([p for _, p in pairs])
        self._lock = threading.Lock()  # guards both iterators: NICs may be made in parallel

    def __call__(self, kind: str, resource_id: str) -> str | None:
        with self._lock:
            return next(self._private if kind == "private" else self._public, None)


# ── the TLS server ──────────────────────────────────────────────────────────────────────


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one TLS handshake per SDK connection
    timeout = 30  # an idle keep-alive connection ends its thread eventually
    # Headers and body leave in two writes; with Nagle on, the second waits for the client's
    # delayed ACK (~40 ms a request).
    disable_nagle_algorithm = True
    server: _TlsServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        reply = self.server.fake.handle(self.command, self.path, dict(self.headers), raw)
        data = b"" if reply.body is None else json.dumps(reply.body).encode()
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("x-ms-request-id", str(uuid.uuid4()))
        if data:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _serve


class _TlsServer(ThreadingHTTPServer):
    """TLS per connection in the connection's own thread, so a slow handshake never stalls
    the accept loop."""

    daemon_threads = True

    def __init__(self, fake: AzureFake, context: ssl.SSLContext, host: str) -> None:
        self.fake = fake
        self.context = context
        self.open: set[socket.socket] = set()
        self.open_lock = threading.Lock()  # guards `open`, added to by connection threads
        super().__init__((host, 0), _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(10)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except OSError:
            return
        with self.open_lock:
            self.open.add(tls)
        try:
            _Handler(tls, client_address, self)
        except OSError:
            pass
        finally:
            with self.open_lock:
                self.open.discard(tls)
            tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-reply is not the test's business

    def drop_connections(self) -> None:
        with self.open_lock:
            for connection in self.open:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


# ── the fake ────────────────────────────────────────────────────────────────────────────

_TYPES = {
    t.lower(): t
    for t in (
        "Microsoft.Network/virtualNetworks",
        "Microsoft.Network/networkSecurityGroups",
        "Microsoft.Network/publicIPAddresses",
        "Microsoft.Network/networkInterfaces",
        "Microsoft.Compute/virtualMachines",
        "Microsoft.Compute/disks",
        "Microsoft.ManagedIdentity/userAssignedIdentities",
        "Microsoft.Authorization/roleAssignments",
    )
}
VM_TYPE = "Microsoft.Compute/virtualMachines"
IDENTITY_TYPE = "Microsoft.ManagedIdentity/userAssignedIdentities"
ROLE_TYPE = "Microsoft.Authorization/roleAssignments"
_ROLE_DEFINITION = re.compile(
    r"/subscriptions/[^/]+/providers/Microsoft\.Authorization/roleDefinitions/[0-9a-f-]{36}", re.I
)
_GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
RG_TYPE = "Microsoft.Resources/resourceGroups"
# Child collections kept inline in their parent, as ARM returns them.
_CHILDREN = {
    "microsoft.network/virtualnetworks": ("subnets", "Microsoft.Network/virtualNetworks/subnets"),
    "microsoft.network/networksecuritygroups": (
        "securityRules",
        "Microsoft.Network/networkSecurityGroups/securityRules",
    ),
}
_VM_ACTIONS = {
    # action: (power while it runs, power after)
    "deallocate": ("deallocating", "deallocated"),
    "poweroff": ("stopping", "stopped"),
    "start": ("starting", "running"),
    "restart": ("starting", "running"),
}
# Fields that point back at a user of a resource; they do not make the resource in use.
_BACKREFS = frozenset({"virtualMachine", "managedBy"})
_IN_USE = {
    "Microsoft.Network/networkInterfaces": (
        "NicInUse",
        "Network Interface {id} is used by existing resource {ref}. In order to delete the "
        "network interface, it must be dissociated from the resource. To learn more, see "
        "aka.ms/deletenic.",
    ),
    "Microsoft.Network/publicIPAddresses": (
        "PublicIPAddressCannotBeDeleted",
        "Public IP address {id} can not be deleted since it is still allocated to resource "
        "{ref}. In order to delete the public IP, disassociate/detach the Public IP address "
        "from the resource. To learn how to do this, see aka.ms/deletepublicip.",
    ),
    "Microsoft.Network/networkSecurityGroups": (
        "InUseNetworkSecurityGroupCannotBeDeleted",
        "Network security group {id} cannot be deleted because it is in use by the following "
        "resources: {ref}. In order to delete the Network security group, remove the "
        "association with the resource(s). To learn how to do this, see aka.ms/deletensg.",
    ),
    "Microsoft.Network/virtualNetworks": (
        "InUseSubnetCannotBeDeleted",
        "Subnet in {id} is in use by {ref} and cannot be deleted. In order to delete the "
        "subnet, delete all the resources within the subnet. See aka.ms/deletesubnet.",
    ),
    "Microsoft.Network/virtualNetworks/subnets": (
        "InUseSubnetCannotBeDeleted",
        "Subnet {id} is in use by {ref} and cannot be deleted. In order to delete the subnet, "
        "delete all the resources within the subnet. See aka.ms/deletesubnet.",
    ),
    "Microsoft.Compute/disks": (
        "OperationNotAllowed",
        "Disk {id} is attached to VM {ref}.",
    ),
}
_BAD_TAG_CHARS = re.compile(r"[<>%&\\?/\x00-\x1f]")
_FILTER_CLAUSE = re.compile(r"\s*(\w+)\s+eq\s+'((?:[^']|'')*)'\s*(?:and\b|$)", re.IGNORECASE)
_DEFAULT_PUBLIC = ipaddress.ip_network("192.0.2.0/24")  # TEST-NET-1: the netguard refuses it


class _Blanks(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "?"


def _message(code: str, **values: Any) -> str:
    """Azure's wording for ``code`` with ``values`` filled in (the code itself if unknown)."""
    return _FAULT_MESSAGES.get(code, code).format_map(_Blanks(values))


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _normal_location(location: str) -> str:
    return location.replace(" ", "").lower()


def _upper_rg(resource_id: str) -> str:
    """The id as Compute writes it in references: the resource group upper-cased."""
    return re.sub(
        r"(/resourceGroups/)([^/]+)", lambda m: m[1] + m[2].upper(), resource_id, flags=re.I
    )


def _ids_in(value: Any) -> Iterator[str]:
    """Every ``{"id": ...}`` reference inside a JSON value, back-references left out."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "id" and isinstance(item, str):
                yield item
            elif key not in _BACKREFS:
                yield from _ids_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _ids_in(item)


def _parse_filter(text: str) -> list[tuple[str, str]]:
    """``tagName eq 'k' and tagValue eq 'v'`` -> [("tagname", "k"), ("tagvalue", "v")]."""
    clauses, position = [], 0
    while position < len(text):
        match = _FILTER_CLAUSE.match(text, position)
        if not match:
            raise ArmError(400, "InvalidFilterInQueryString", f"Invalid $filter '{text}'.")
        clauses.append((match[1].lower(), match[2].replace("''", "'")))
        position = match.end()
    return clauses


def _matches(resource: Json, clauses: list[tuple[str, str]]) -> bool:
    tags = {k.lower(): v for k, v in (resource.get("tags") or {}).items()}
    wanted = dict(clauses)
    for name, value in clauses:
        if name == "tagname":
            # Tag names compare case-insensitively, values exactly (as ARM does).
            if value.lower() not in tags:
                return False
            if "tagvalue" in wanted and tags[value.lower()] != wanted["tagvalue"]:
                return False
        elif name == "resourcetype":
            if str(resource.get("type", "")).lower() != value.lower():
                return False
        elif name == "name":
            if str(resource.get("name", "")).lower() != value.lower():
                return False
        elif name == "location":
            if _normal_location(str(resource.get("location", ""))) != _normal_location(value):
                return False
        elif name != "tagvalue":
            raise ArmError(400, "InvalidFilterInQueryString", f"Unsupported $filter field {name}.")
    return True


def _check_tags(tags: Any) -> Json:
    if tags is None:
        return {}
    if not isinstance(tags, dict):
        raise ArmError(400, "InvalidRequestContent", "The tags must be an object.")
    bad = [name for name in tags if _BAD_TAG_CHARS.search(name)]
    if bad:
        raise ArmError(
            400,
            "InvalidTagNameCharacters",
            f"The tag names '{','.join(bad)}' have reserved characters '<,>,%,&,\\,?,/' or "
            "control characters.",
        )
    return dict(tags)


class AzureFake:
    """Azure Resource Manager on ``https://127.0.0.1:<free port>``; ``start()`` it, give
    SDK clients ``client_kwargs()`` (or use ``client(cls)``), ``close()`` it.

    Knobs (attributes, safe to change between requests):

    - ``operation_polls``: InProgress answers an operation gives before it finishes (1);
    - ``operation_seconds``: an operation nobody polls finishes this long after it started
      (1.0; None: only polling finishes it), so a fire-and-forget ``begin_delete`` lands;
    - ``page_size``: items per page of every list, with ``nextLink`` beyond (100);
    - ``addresses``: an ``AddressSource`` choosing NIC and public IP addresses.

    ``host`` is the address it listens on (loopback by default; a test bridge's address
    when stand-in VMs must call it from their own network namespaces, as a VM calls ARM).

    What a test has besides the SDK (all thread-safe; inspection returns deep copies):

    - ``url``, ``ca_path``, ``client_kwargs()``, ``client(cls)``; ``sdk_clients(fake)`` below;
    - ``request_log`` [(method, path)], ``requests(method, contains)``; ``errors`` (requests
      the fake itself failed on: a test can assert it stays empty);
    - ``resource_groups()``, ``resources(rg)``, ``vms(rg)``, ``vm(rg, name)``,
      ``custom_data(rg, name)``, ``power_state(rg, name)``, ``vm_addresses(rg, name)``,
      ``nsg_rules(rg, nsg)``;
    - ``fail_vm_create(code, ...)``, ``fail_requests(status, code, ...)``,
      ``restrict_sku(size, location, zones=)``, ``set_quota(location, family, vcpus)``;
    - ``stop_from_inside(rg, name)``, ``evict(rg, name)``, ``settle()``, ``reset()``.
    """

    def __init__(
        self,
        *,
        locations: tuple[str, ...] = ("eastus", "westus2"),
        skus: tuple[VmSku, ...] = DEFAULT_SKUS,
        operation_polls: int = 1,
        operation_seconds: float | None = 1.0,
        page_size: int = 100,
        addresses: AddressSource | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.locations = tuple(_normal_location(loc) for loc in locations)
        self.skus = {s.name.lower(): s for s in skus}
        self.operation_polls = operation_polls
        self.operation_seconds = operation_seconds
        self.page_size = page_size
        self.addresses = addresses
        self._lock = threading.RLock()  # guards everything below, and every reply's making
        self._server: _TlsServer | None = None
        self._thread: threading.Thread | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.url = ""
        self.ca_path = ""
        self._clear()

    def _clear(self) -> None:
        self._resources: dict[str, _Record] = {}
        self._operations: dict[str, _Operation] = {}
        self._faults: list[_Fault] = []
        self._restrictions: list[tuple[str, str, tuple[str, ...] | None, str]] = []
        self._quotas: dict[tuple[str, str], int] = {}
        self._cursors: dict[str, list[Json]] = {}
        self._log: list[tuple[str, str]] = []
        self.errors: list[str] = []  # tracebacks of requests the fake itself failed on
        self._public_counter = itertools.count(10)

    # ── lifecycle ──

    def start(self) -> AzureFake:
        ca = trustme.CA()
        self._dir = tempfile.TemporaryDirectory(prefix="azure-fake-")
        ca_path = Path(self._dir.name) / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_path))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(*dict.fromkeys((self.host, "127.0.0.1", "localhost"))).configure_cert(context)
        self._server = _TlsServer(self, context, self.host)
        self.url = f"https://{self.host}:{self._server.server_address[1]}"
        self.ca_path = str(ca_path)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="azure-fake",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and drop open connections; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.drop_connections()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> AzureFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Forget every resource, operation, fault, quota, restriction and logged request."""
        with self._lock:
            self._clear()

    # ── SDK clients ──

    def client_kwargs(self, *, retries: int = 0) -> Json:
        """What an azure-mgmt client needs to use this fake quickly: its URL and CA, no
        waiting between polls, and no retries (the default 10, with backoff, would turn an
        injected 5xx into a long test)."""
        return {
            "base_url": self.url,
            "connection_verify": self.ca_path,
            "polling_interval": 0,
            "retry_total": retries,
        }

    def client(
        self,
        cls: Callable[..., ClientT],
        subscription_id: str = SUBSCRIPTION,
        *,
        credential: Any = None,
        retries: int = 0,
    ) -> ClientT:
        """``cls(FakeCredential(), subscription_id, **client_kwargs())``, for any of
        ``ResourceManagementClient``, ``NetworkManagementClient``, ``ComputeManagementClient``."""
        return cls(
            credential or FakeCredential(), subscription_id, **self.client_kwargs(retries=retries)
        )

    # ── the request log and inspection ──

    @property
    def request_log(self) -> list[tuple[str, str]]:
        """(method, path) of every request, in arrival order; the path as sent, no query."""
        with self._lock:
            return list(self._log)

    def requests(self, method: str | None = None, contains: str = "") -> list[tuple[str, str]]:
        """The logged requests with this method whose path contains ``contains`` (any case)."""
        return [
            (m, p)
            for m, p in self.request_log
            if (method is None or m == method) and contains.lower() in p.lower()
        ]

    def resource_groups(self) -> list[Json]:
        with self._lock:
            self._advance()
            return [copy.deepcopy(r.body) for r in self._resources.values() if self._is_rg(r)]

    def resources(self, rg: str) -> list[Json]:
        """Every top-level resource in the resource group (any subscription), stored form."""
        with self._lock:
            self._advance()
            return [copy.deepcopy(r.body) for r in self._in_rg(rg)]

    def vms(self, rg: str | None = None) -> list[Json]:
        """VMs in ``rg`` (or everywhere), stored form: ``customData`` included, and
        ``powerState`` added at the top level (``running``, ``stopped``, ``deallocated``...)."""
        with self._lock:
            self._advance()
            found = []
            for record in self._all_vms(rg):
                body = copy.deepcopy(record.body)
                body["powerState"] = record.power
                found.append(body)
            return found

    def vm(self, rg: str, name: str) -> Json:
        for body in self.vms(rg):
            if body["name"].lower() == name.lower():
                return body
        raise KeyError(f"no VM {name} in {rg}")

    def custom_data(self, rg: str, name: str) -> bytes | None:
        """The VM's decoded ``customData`` (GET never returns it)."""
        encoded = self.vm(rg, name)["properties"].get("osProfile", {}).get("customData")
        return None if encoded is None else base64.b64decode(encoded)

    def power_state(self, rg: str, name: str) -> str | None:
        power: str | None = self.vm(rg, name)["powerState"]
        return power

    def vm_addresses(self, rg: str, name: str) -> tuple[str | None, str | None]:
        """(private, public) address of the VM's primary NIC's primary ip configuration."""
        with self._lock:
            self._advance()
            nics = self.vm(rg, name)["properties"]["networkProfile"]["networkInterfaces"]
            primary = next((n for n in nics if (n.get("properties") or {}).get("primary")), nics[0])
            nic = self._resources[primary["id"].lower()].body
            configs = nic["properties"]["ipConfigurations"]
            config = next((c for c in configs if c["properties"].get("primary")), configs[0])
            private = config["properties"].get("privateIPAddress")
            public = None
            if reference := config["properties"].get("publicIPAddress"):
                pip = self._resources.get(reference["id"].lower())
                public = pip.body["properties"].get("ipAddress") if pip else None
            return private, public

    def nsg_rules(self, rg: str, nsg: str) -> list[Json]:
        """The security rules of a network security group (not the default ones)."""
        for body in self.resources(rg):
            if body["type"] == "Microsoft.Network/networkSecurityGroups" and (
                body["name"].lower() == nsg.lower()
            ):
                return list(body["properties"].get("securityRules", []))
        raise KeyError(f"no network security group {nsg} in {rg}")

    # ── fault injection ──

    def fail_vm_create(
        self,
        code: str,
        *,
        message: str | None = None,
        location: str | None = None,
        size: str | None = None,
        http_status: int | None = None,
        times: int | None = 1,
    ) -> None:
        """Make the next ``times`` VM creates (in ``location``, of ``size``, if given) fail
        with ``code``: through the async operation (``status: Failed``; the VM is left in
        ``provisioningState: Failed``), or with ``http_status`` (409...) straight at the PUT.

        Codes seen for real: SkuNotAvailable, OperationNotAllowed (quota), AllocationFailed,
        ZonalAllocationFailed, OverconstrainedAllocationRequest (Spot)."""
        with self._lock:
            self._faults.append(
                _Fault(
                    http_status,
                    code,
                    message,
                    method="vm-create",
                    location=None if location is None else _normal_location(location),
                    size=None if size is None else size.lower(),
                    times=times,
                )
            )

    def fail_requests(
        self,
        status: int,
        code: str,
        *,
        message: str | None = None,
        method: str | None = None,
        path: str | None = None,
        times: int | None = 1,
    ) -> None:
        """Answer the next ``times`` requests (of ``method``, whose path contains ``path``,
        any case) with ``status`` and ``code``, e.g. 403 AuthorizationFailed, 429, 500."""
        with self._lock:
            self._faults.append(_Fault(status, code, message, method, path, times=times))

    def restrict_sku(
        self,
        size: str,
        location: str,
        *,
        zones: tuple[str, ...] | None = None,
        reason: str = "NotAvailableForSubscription",
    ) -> None:
        """Mark ``size`` restricted in ``location`` (or only in ``zones`` there): the SKU list
        shows the restriction and a VM create there gets 409 SkuNotAvailable."""
        with self._lock:
            self._restrictions.append((size.lower(), _normal_location(location), zones, reason))

    def set_quota(self, location: str, family: str, vcpus: int) -> None:
        """Limit vCPUs of ``family`` (e.g. ``standardNDASv4_A100Family``; ``lowPriorityCores``
        for Spot, ``cores`` for the regional total) in ``location``; a create beyond it gets
        409 OperationNotAllowed."""
        with self._lock:
            self._quotas[(_normal_location(location), family.lower())] = vcpus

    # ── things that happen to VMs from outside the API ──

    def stop_from_inside(self, rg: str, name: str) -> None:
        """The guest powered itself off: ``PowerState/stopped``, still allocated (and billed)."""
        with self._lock:
            self._vm_record(rg, name).power = "stopped"

    def evict(self, rg: str, name: str) -> None:
        """Spot eviction: with ``evictionPolicy: Delete`` the VM and its disks go (its NICs and
        public IPs follow their ``deleteOption``); with ``Deallocate`` it is deallocated."""
        with self._lock:
            record = self._vm_record(rg, name)
            props = record.body["properties"]
            if str(props.get("priority", "")).lower() != "spot":
                raise ValueError(f"VM {name} is not a Spot VM")
            if str(props.get("evictionPolicy", "Deallocate")).lower() == "delete":
                self._remove_vm(record, evicted=True)
            else:
                record.power = "deallocated"
                self._release_dynamic_addresses(record)

    def settle(self) -> None:
        """Finish every operation still in progress now."""
        with self._lock:
            for operation in list(self._operations.values()):
                if operation.status == "InProgress":
                    self._finish(operation)

    # ── HTTP entry point ──

    def handle(self, method: str, target: str, headers: dict[str, str], raw: bytes) -> Reply:
        parts = urlsplit(target)
        path = unquote(parts.path)
        query = {k.lower(): v for k, v in parse_qsl(parts.query, keep_blank_values=True)}
        with self._lock:
            self._log.append((method, path))
            self._advance()
            try:
                self._authenticate(headers)
                self._injected(method, path)
                body = json.loads(raw) if raw else {}
                if not isinstance(body, dict):
                    raise ArmError(400, "InvalidRequestContent", "The body must be an object.")
                return self._route(method, path, query, body)
            except json.JSONDecodeError as exc:
                return self._error(ArmError(400, "InvalidRequestContent", str(exc)))
            except ArmError as exc:
                return self._error(exc)
            except Exception as exc:
                # A bug in the fake, or a request it does not understand: answer, and keep it
                # for the test to see (`errors`), rather than drop the connection.
                self.errors.append(f"{method} {target}: {traceback.format_exc()}")
                return self._error(ArmError(500, "InternalServerError", repr(exc)))

    def _error(self, exc: ArmError) -> Reply:
        return Reply(exc.status, exc.body(), {"x-ms-failure-cause": "service"})

    def _authenticate(self, headers: dict[str, str]) -> None:
        value = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        if not value.startswith("Bearer ") or not value[len("Bearer ") :].strip():
            raise ArmError(
                401,
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing.",
            )

    def _injected(self, method: str, path: str) -> None:
        for fault in self._faults:
            if fault.method == "vm-create" or fault.times == 0:
                continue
            if fault.method is not None and fault.method.upper() != method:
                continue
            if fault.path is not None and fault.path.lower() not in path.lower():
                continue
            fault.take()
            message = fault.message or _message(
                fault.code, action=self._action(method, path), scope=path
            )
            raise ArmError(fault.status or 500, fault.code, message)

    @staticmethod
    def _action(method: str, path: str) -> str:
        segments = [s for s in path.split("/") if s]
        lowered = [s.lower() for s in segments]
        if "providers" in lowered:
            at = len(lowered) - 1 - lowered[::-1].index("providers")
            kind = "/".join(segments[at + 1 : at + 3])
        else:
            kind = RG_TYPE
        verb = {"GET": "read", "HEAD": "read", "DELETE": "delete", "POST": "action"}
        return f"{kind}/{verb.get(method, 'write')}"

    # ── routing ──

    def _route(self, method: str, path: str, query: dict[str, str], body: Json) -> Reply:
        segments = [s for s in path.split("/") if s]
        low = [s.lower() for s in segments]
        if len(segments) < 2 or low[0] != "subscriptions":
            raise ArmError(404, "NotFound", f"No route for {method} {path}.")
        sub, rest, lrest = segments[1], segments[2:], low[2:]
        n = len(rest)

        if lrest[:1] == ["operationresults"] and n == 2 and method == "GET":
            return self._poll_location(rest[1])
        if lrest[:1] == ["providers"]:
            if n == 6 and lrest[2] == "locations" and lrest[4] == "operations":
                if query.get("monitor", "").lower() == "true":
                    return self._poll_location(rest[5])
                return self._poll_async(rest[5])
            if lrest[1:3] == ["microsoft.compute", "skus"] and n == 3:
                return self._list_skus(sub, path, query)
            if lrest[1:3] == ["microsoft.compute", "locations"] and n == 5:
                if lrest[4] == "vmsizes":
                    return self._list_vm_sizes(rest[3])
                if lrest[4] == "usages":
                    return self._list_usages(rest[3])
                if lrest[4] == "virtualmachines" and method == "GET":
                    location = self._check_location(rest[3])
                    found = [
                        r
                        for r in self._all_vms(None)
                        if self._sub_of(r) == sub.lower() and r.body["location"] == location
                    ]
                    return self._page(path, query, [self._view(r, query) for r in found])
            if n == 3 and method == "GET":
                kind = self._type(rest[1], rest[2])
                found = [
                    r
                    for r in self._resources.values()
                    if r.body["type"] == kind and self._sub_of(r) == sub.lower()
                ]
                return self._page(path, query, [self._view(r, query) for r in found])
        if lrest == ["resources"] and method == "GET":
            return self._list_resources(sub, None, path, query)
        if lrest == ["resourcegroups"] and method == "GET":
            return self._list_rgs(sub, path, query)
        if lrest[:1] == ["resourcegroups"] and n >= 2:
            rg = rest[1]
            if n == 2:
                return self._rg_request(method, sub, rg, body)
            rg_record = self._rg(sub, rg)
            if lrest[2] == "resources" and n == 3 and method == "GET":
                return self._list_resources(sub, rg_record, path, query)
            if lrest[2] == "providers" and n >= 5:
                return self._resource_request(method, rg_record, rest[3:], path, query, body)
        raise ArmError(404, "NotFound", f"No route for {method} {path}.")

    def _type(self, namespace: str, kind: str) -> str:
        found = _TYPES.get(f"{namespace}/{kind}".lower())
        if found is None:
            raise ArmError(
                400,
                "InvalidResourceType",
                f"The resource type '{kind}' could not be found in the namespace '{namespace}'.",
            )
        return found

    def _resource_request(
        self,
        method: str,
        rg_record: _Record,
        tail: list[str],  # namespace, type[, name[, action or child collection[, child]]]
        path: str,
        query: dict[str, str],
        body: Json,
    ) -> Reply:
        kind = self._type(tail[0], tail[1])
        base = f"{rg_record.body['id']}/providers/{kind}"
        if len(tail) == 2:
            if method != "GET":
                raise ArmError(405, "MethodNotAllowed", f"{method} on a collection.")
            found = [r for r in self._in_rg_record(rg_record) if r.body["type"] == kind]
            return self._page(path, query, [self._view(r, query) for r in found])
        resource_id = f"{base}/{tail[2]}"
        if len(tail) == 3:
            if method == "PUT":
                return self._put(rg_record, kind, resource_id, tail[2], body)
            if method == "GET":
                return Reply(200, self._view(self._get(resource_id), query))
            if method == "DELETE":
                return self._delete(resource_id)
            if method == "PATCH":
                return self._patch(resource_id, body, query)
            raise ArmError(405, "MethodNotAllowed", f"{method} on a resource.")
        verb = tail[3].lower()
        if kind == VM_TYPE and len(tail) == 4:
            if verb == "instanceview" and method == "GET":
                return Reply(200, self._instance_view(self._get(resource_id)))
            if verb in _VM_ACTIONS and method == "POST":
                return self._vm_action(self._get(resource_id), verb)
        child = _CHILDREN.get(kind.lower())
        if child and verb == child[0].lower():
            parent = self._get(resource_id)
            if len(tail) == 4 and method == "GET":
                return self._page(path, query, copy.deepcopy(self._children(parent, child[0])))
            if len(tail) == 5:
                return self._child_request(method, parent, child, tail[4], body)
        raise ArmError(404, "NotFound", f"No route for {method} {path}.")

    # ── resource groups ──

    @staticmethod
    def _is_rg(record: _Record) -> bool:
        return bool(record.body["type"] == RG_TYPE)

    @staticmethod
    def _sub_of(record: _Record) -> str:
        return str(record.body["id"]).split("/")[2].lower()

    def _rg(self, sub: str, rg: str) -> _Record:
        record = self._resources.get(f"/subscriptions/{sub}/resourcegroups/{rg}".lower())
        if record is None:
            raise ArmError(
                404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found."
            )
        return record

    def _in_rg_record(self, rg_record: _Record) -> list[_Record]:
        prefix = rg_record.body["id"].lower() + "/providers/"
        return [r for k, r in self._resources.items() if k.startswith(prefix)]

    def _in_rg(self, rg: str) -> list[_Record]:
        found = []
        for record in self._resources.values():
            if self._is_rg(record) and record.body["name"].lower() == rg.lower():
                found.extend(self._in_rg_record(record))
        return found

    def _rg_request(self, method: str, sub: str, rg: str, body: Json) -> Reply:
        key = f"/subscriptions/{sub}/resourcegroups/{rg}".lower()
        record = self._resources.get(key)
        if method == "HEAD":
            return Reply(204 if record else 404)
        if method == "PUT":
            location = body.get("location")
            if not location:
                raise ArmError(400, "LocationRequired", "The location property is required.")
            tags = _check_tags(body.get("tags"))
            if record is not None:
                if record.body["properties"]["provisioningState"] == "Deleting":
                    raise ArmError(
                        409,
                        "ResourceGroupBeingDeleted",
                        f"The resource group '{rg}' is in deprovisioning state and cannot "
                        "perform this operation.",
                    )
                if _normal_location(location) != record.body["location"]:
                    raise ArmError(
                        409,
                        "InvalidResourceGroupLocation",
                        f"Invalid resource group location '{location}'. The Resource group "
                        f"already exists in location '{record.body['location']}'.",
                    )
                record.body["tags"] = tags
                return Reply(200, copy.deepcopy(record.body))
            record = _Record(
                {
                    "id": f"/subscriptions/{sub}/resourceGroups/{rg}",
                    "name": rg,
                    "type": RG_TYPE,
                    "location": _normal_location(location),
                    "tags": tags,
                    "properties": {"provisioningState": "Succeeded"},
                }
            )
            self._resources[key] = record
            return Reply(201, copy.deepcopy(record.body))
        if record is None:
            raise ArmError(
                404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found."
            )
        if method == "GET":
            return Reply(200, copy.deepcopy(record.body))
        if method == "PATCH":
            if "tags" in body:
                record.body["tags"] = _check_tags(body["tags"])
            return Reply(200, copy.deepcopy(record.body))
        if method == "DELETE":
            return self._delete_rg(record)
        raise ArmError(405, "MethodNotAllowed", f"{method} on a resource group.")

    def _delete_rg(self, record: _Record) -> Reply:
        record.body["properties"]["provisioningState"] = "Deleting"
        key = record.body["id"].lower()

        def finish() -> None:
            if self._resources.get(key) is not record:
                return
            for inner in list(self._resources):
                if inner.startswith(key + "/"):
                    del self._resources[inner]
            del self._resources[key]

        operation = self._start(finish)
        sub = record.body["id"].split("/")[2]
        # ARM answers a resource group's DELETE with Location only; it polls 202, then 200.
        location = f"{self.url}/subscriptions/{sub}/operationresults/{operation.id}"
        return Reply(202, None, {"Location": location + "?api-version=2022-09-01"})

    def _list_rgs(self, sub: str, path: str, query: dict[str, str]) -> Reply:
        clauses = _parse_filter(query.get("$filter", ""))
        found = [
            copy.deepcopy(r.body)
            for r in self._resources.values()
            if self._is_rg(r) and self._sub_of(r) == sub.lower() and _matches(r.body, clauses)
        ]
        return self._page(path, query, found)

    def _list_resources(
        self, sub: str, rg_record: _Record | None, path: str, query: dict[str, str]
    ) -> Reply:
        clauses = _parse_filter(query.get("$filter", ""))
        if rg_record is not None:
            records = self._in_rg_record(rg_record)
        else:
            records = [
                r
                for r in self._resources.values()
                if not self._is_rg(r) and self._sub_of(r) == sub.lower()
            ]
        found = []
        for record in records:
            body = record.body
            if body["type"] == ROLE_TYPE:
                continue  # not a tracked resource: ARM lists role assignments elsewhere
            if not _matches(body, clauses):
                continue
            generic: Json = {k: body[k] for k in ("id", "name", "type", "location") if k in body}
            for optional in ("tags", "zones", "sku", "managedBy"):
                if body.get(optional):
                    generic[optional] = copy.deepcopy(body[optional])
            found.append(generic)
        return self._page(path, query, found)

    # ── lists and paging ──

    def _page(self, path: str, query: dict[str, str], items: list[Json]) -> Reply:
        token = query.get("$skiptoken")
        if token is not None:
            remaining = self._cursors.pop(token, None)
            if remaining is None:
                raise ArmError(400, "InvalidSkipToken", f"The skip token '{token}' is invalid.")
        else:
            remaining = items
            if "$top" in query:
                remaining = remaining[: int(query["$top"])]
        page, rest = remaining[: self.page_size], remaining[self.page_size :]
        result: Json = {"value": page}
        if rest:
            token = uuid.uuid4().hex
            self._cursors[token] = rest
            version = quote(query.get("api-version", "2024-01-01"))
            result["nextLink"] = f"{self.url}{quote(path)}?api-version={version}&$skiptoken={token}"
        return Reply(200, result)

    # ── operations ──

    def _start(self, finish: Callable[[], None], error: Json | None = None) -> _Operation:
        deadline = None
        if self.operation_seconds is not None:
            deadline = time.monotonic() + self.operation_seconds
        operation = _Operation(
            uuid.uuid4().hex, finish, error, self.operation_polls, deadline, _now()
        )
        self._operations[operation.id] = operation
        return operation

    def _async_headers(
        self, sub: str, namespace: str, location: str, op: _Operation
    ) -> dict[str, str]:
        url = (
            f"{self.url}/subscriptions/{sub}/providers/{namespace}/locations/{location}"
            f"/operations/{op.id}?api-version=2024-07-01"
        )
        return {"Azure-AsyncOperation": url, "Location": url + "&monitor=true"}

    def _advance(self) -> None:
        now = time.monotonic()
        for operation in list(self._operations.values()):
            deadline = operation.deadline
            if operation.status == "InProgress" and deadline is not None and now >= deadline:
                self._finish(operation)

    def _finish(self, operation: _Operation) -> None:
        operation.status = "Failed" if operation.error else "Succeeded"
        operation.ended = _now()
        operation.finish()

    def _polled(self, op_id: str) -> _Operation:
        operation = self._operations.get(op_id)
        if operation is None:
            raise ArmError(404, "NotFound", f"Operation {op_id} not found.")
        if operation.status == "InProgress":
            if operation.polls_left > 0:
                operation.polls_left -= 1
            else:
                self._finish(operation)
        return operation

    def _poll_async(self, op_id: str) -> Reply:
        operation = self._polled(op_id)
        body: Json = {"name": op_id, "status": operation.status, "startTime": operation.started}
        if operation.ended:
            body["endTime"] = operation.ended
        if operation.status == "Failed":
            body["error"] = operation.error
        return Reply(200, body)

    def _poll_location(self, op_id: str) -> Reply:
        operation = self._polled(op_id)
        if operation.status == "InProgress":
            return Reply(202)
        if operation.status == "Failed":
            assert operation.error is not None
            raise ArmError(409, operation.error["code"], operation.error["message"])
        return Reply(200)

    # ── generic resources ──

    def _get(self, resource_id: str) -> _Record:
        record = self._resources.get(resource_id.lower())
        if record is None:
            parts = resource_id.split("/")
            raise ArmError(
                404,
                "ResourceNotFound",
                f"The Resource '{parts[6]}/{parts[7]}/{parts[8]}' under resource group "
                f"'{parts[4]}' was not found. For more details please go to "
                "https://aka.ms/ARMResourceNotFoundFix",
            )
        return record

    def _view(self, record: _Record, query: dict[str, str]) -> Json:
        body = copy.deepcopy(record.body)
        if body["type"] == VM_TYPE:
            os_profile = body["properties"].get("osProfile", {})
            os_profile.pop("customData", None)  # write-only in ARM
            os_profile.pop("adminPassword", None)
            expand = query.get("$expand", "").lower()
            if expand == "instanceview" or query.get("statusonly", "").lower() == "true":
                body["properties"]["instanceView"] = self._instance_view(record)
        return body

    def _check_references(self, resource_id: str, value: Any) -> None:
        for reference in _ids_in(value):
            target = reference.lower()
            if target == resource_id.lower() or target.startswith(resource_id.lower() + "/"):
                continue  # itself, or its own children
            if not self._exists(target):
                raise ArmError(
                    400,
                    "InvalidResourceReference",
                    f"Resource {reference} referenced by resource {resource_id} was not found. "
                    "Please make sure that the referenced resource exists, and that both "
                    "resources are in the same region.",
                )

    def _exists(self, lowered_id: str) -> bool:
        if lowered_id in self._resources:
            return True
        for kind, (collection, _) in _CHILDREN.items():
            marker = f"/{collection.lower()}/"
            if f"/providers/{kind}/" in lowered_id and marker in lowered_id:
                parent_id, _, name = lowered_id.rpartition(marker)
                parent = self._resources.get(parent_id)
                if parent is not None:
                    children = self._children(parent, collection)
                    return any(c["name"].lower() == name for c in children)
        return False

    def _referrers(self, resource_id: str) -> list[str]:
        """Ids of resources that point at ``resource_id`` or inside it."""
        target = resource_id.lower()
        found = []
        for key, record in self._resources.items():
            if key == target or key.startswith(target + "/"):
                continue
            if any(
                r.lower() == target or r.lower().startswith(target + "/")
                for r in _ids_in(record.body)
                if not (r.lower() == key or r.lower().startswith(key + "/"))
            ):
                found.append(record.body["id"])
        return found

    def _put(self, rg_record: _Record, kind: str, resource_id: str, name: str, body: Json) -> Reply:
        if rg_record.body["properties"]["provisioningState"] == "Deleting":
            raise ArmError(
                409,
                "ResourceGroupBeingDeleted",
                f"The resource group '{rg_record.body['name']}' is in deprovisioning state and "
                "cannot perform this operation.",
            )
        if kind == ROLE_TYPE:  # an extension resource: no location, made at once
            return self._put_role_assignment(rg_record, resource_id, name, body)
        location = body.get("location")
        if not location:
            raise ArmError(400, "LocationRequired", "The location property is required.")
        location = _normal_location(location)
        if location not in self.locations:
            raise ArmError(
                400,
                "LocationNotAvailableForResourceType",
                f"The provided location '{location}' is not available for resource type "
                f"'{kind}'. List of available regions for the resource type is "
                f"'{','.join(self.locations)}'.",
            )
        existing = self._resources.get(resource_id.lower())
        if existing is not None:
            state = existing.body["properties"].get("provisioningState")
            if state == "Deleting":
                raise ArmError(
                    409,
                    "AnotherOperationInProgress",
                    f"Another operation on this or dependent resource is in progress. "
                    f"Resource {resource_id} is being deleted.",
                )
            if existing.body["location"] != location:
                raise ArmError(
                    400,
                    "InvalidResourceLocation",
                    f"The resource '{name}' already exists in location "
                    f"'{existing.body['location']}'. A resource with the same name cannot be "
                    f"created in location '{location}'.",
                )
        stored: Json = {
            "id": existing.body["id"] if existing else resource_id,
            "name": existing.body["name"] if existing else name,
            "type": kind,
            "location": location,
            "tags": _check_tags(body.get("tags")),
            "properties": copy.deepcopy(body.get("properties") or {}),
        }
        for extra in ("zones", "sku", "plan", "identity", "extendedLocation"):
            if extra in body:
                stored[extra] = copy.deepcopy(body[extra])
        if kind == VM_TYPE:
            return self._put_vm(stored, existing)
        if kind == IDENTITY_TYPE:
            old = existing.body["properties"] if existing else {}
            stored["properties"] = {
                "tenantId": old.get("tenantId", str(uuid.uuid4())),
                "principalId": old.get("principalId", str(uuid.uuid4())),
                "clientId": old.get("clientId", str(uuid.uuid4())),
            }
        if kind.startswith("Microsoft.Network/"):
            stored["etag"] = f'W/"{uuid.uuid4()}"'
            shape = {
                "Microsoft.Network/virtualNetworks": self._shape_vnet,
                "Microsoft.Network/networkSecurityGroups": self._shape_nsg,
                "Microsoft.Network/publicIPAddresses": self._shape_public_ip,
                "Microsoft.Network/networkInterfaces": self._shape_nic,
            }[kind]
            shape(stored, existing)
        return self._store_with_operation(stored, existing)

    def _put_role_assignment(
        self, rg_record: _Record, resource_id: str, name: str, body: Json
    ) -> Reply:
        """A role assignment at the resource group's scope. Like ARM: its name is a GUID, the
        role a role definition's id, the principal one the directory knows (here: a managed
        identity of the fake); answered at once, no operation."""
        if not _GUID.fullmatch(name):
            raise ArmError(
                400,
                "InvalidRoleAssignmentId",
                f"The role assignment ID '{name}' is not valid. The role assignment ID must be "
                "a GUID.",
            )
        props = body.get("properties") or {}
        role = str(props.get("roleDefinitionId", ""))
        if not _ROLE_DEFINITION.fullmatch(role):
            raise ArmError(
                400, "InvalidRoleDefinitionId", f"The role definition ID '{role}' is not valid."
            )
        principal = str(props.get("principalId", ""))
        principals = {
            r.body["properties"].get("principalId")
            for r in self._resources.values()
            if r.body["type"] == IDENTITY_TYPE
        }
        if principal not in principals:
            raise ArmError(
                400,
                "PrincipalNotFound",
                f"Principal {principal.replace('-', '')} does not exist in the directory "
                f"{uuid.UUID(int=0)}. Check that you have the correct principal ID.",
            )
        if resource_id.lower() in self._resources:
            raise ArmError(409, "RoleAssignmentExists", "The role assignment already exists.")
        stored: Json = {
            "id": resource_id,
            "name": name,
            "type": ROLE_TYPE,
            "properties": {
                "roleDefinitionId": role,
                "principalId": principal,
                "principalType": props.get("principalType", "ServicePrincipal"),
                "scope": rg_record.body["id"],
                "createdOn": _now(),
            },
        }
        self._resources[resource_id.lower()] = _Record(stored)
        return Reply(201, copy.deepcopy(stored))

    def _store_with_operation(self, stored: Json, existing: _Record | None) -> Reply:
        """Store a (non-VM) resource as Updating and finish it through an operation."""
        stored["properties"]["provisioningState"] = "Updating"
        record = existing or _Record(stored)
        record.body = stored
        self._resources[stored["id"].lower()] = record

        def finish() -> None:
            if self._resources.get(stored["id"].lower()) is record:
                record.body["properties"]["provisioningState"] = "Succeeded"
                for collection, _ in _CHILDREN.values():
                    for child in record.body["properties"].get(collection, []):
                        child["properties"]["provisioningState"] = "Succeeded"

        operation = self._start(finish)
        namespace = stored["type"].split("/")[0]
        headers = self._async_headers(
            self._sub_of(record), namespace, stored["location"], operation
        )
        del headers["Location"]  # a PUT's final state is the resource itself
        return Reply(200 if existing else 201, self._view(record, {}), headers)

    def _patch(self, resource_id: str, body: Json, query: dict[str, str]) -> Reply:
        record = self._get(resource_id)
        if "tags" in body:
            record.body["tags"] = _check_tags(body["tags"])
        return Reply(200, self._view(record, query))

    def _delete(self, resource_id: str) -> Reply:
        record = self._resources.get(resource_id.lower())
        if record is None:
            return Reply(204)  # ARM: deleting what is not there succeeds
        kind = record.body["type"]
        if kind == ROLE_TYPE:  # deleted at once, its last state in the answer
            del self._resources[resource_id.lower()]
            return Reply(200, copy.deepcopy(record.body))
        if kind in _IN_USE:
            users = self._referrers(record.body["id"])
            if kind == "Microsoft.Compute/disks" and record.body.get("managedBy"):
                users.append(record.body["managedBy"])
            if users:
                code, text = _IN_USE[kind]
                status = 409 if kind == "Microsoft.Compute/disks" else 400
                raise ArmError(status, code, text.format(id=record.body["id"], ref=users[0]))
        record.body["properties"]["provisioningState"] = "Deleting"

        def finish() -> None:
            if self._resources.get(resource_id.lower()) is not record:
                return
            if kind == VM_TYPE:
                self._remove_vm(record, evicted=False)
            else:
                del self._resources[resource_id.lower()]

        operation = self._start(finish)
        namespace = kind.split("/")[0]
        headers = self._async_headers(
            self._sub_of(record), namespace, record.body["location"], operation
        )
        return Reply(202, None, headers)

    # ── child resources (subnets, security rules) ──

    @staticmethod
    def _children(parent: _Record, collection: str) -> list[Json]:
        children: list[Json] = parent.body["properties"].setdefault(collection, [])
        return children

    def _child_request(
        self,
        method: str,
        parent: _Record,
        child: tuple[str, str],
        name: str,
        body: Json,
    ) -> Reply:
        collection, child_type = child
        children = self._children(parent, collection)
        index = next((i for i, c in enumerate(children) if c["name"].lower() == name.lower()), None)
        child_id = f"{parent.body['id']}/{collection}/{name}"
        if method == "GET":
            if index is None:
                raise ArmError(404, "NotFound", f"Resource {child_id} not found.")
            return Reply(200, copy.deepcopy(children[index]))
        if method == "DELETE":
            if index is None:
                return Reply(204)
            users = self._referrers(children[index]["id"])
            if users and child_type in _IN_USE:
                code, text = _IN_USE[child_type]
                raise ArmError(400, code, text.format(id=children[index]["id"], ref=users[0]))
            doomed = children[index]
            doomed["properties"]["provisioningState"] = "Deleting"

            def remove() -> None:
                if doomed in children:
                    children.remove(doomed)

            deletion = self._start(remove)
            return Reply(
                202,
                None,
                self._async_headers(
                    self._sub_of(parent), "Microsoft.Network", parent.body["location"], deletion
                ),
            )
        if method != "PUT":
            raise ArmError(405, "MethodNotAllowed", f"{method} on {child_type}.")
        shaped = self._shape_child(parent, collection, child_type, {**body, "name": name})
        if index is None:
            children.append(shaped)
        else:
            children[index] = shaped
        parent.body["etag"] = f'W/"{uuid.uuid4()}"'

        def finish() -> None:
            shaped["properties"]["provisioningState"] = "Succeeded"

        operation = self._start(finish)
        headers = self._async_headers(
            self._sub_of(parent), "Microsoft.Network", parent.body["location"], operation
        )
        del headers["Location"]
        return Reply(201 if index is None else 200, copy.deepcopy(shaped), headers)

    def _shape_child(
        self, parent: _Record | Json, collection: str, child_type: str, body: Json
    ) -> Json:
        parent_body = parent.body if isinstance(parent, _Record) else parent
        name = body.get("name")
        if not name:
            raise ArmError(400, "InvalidRequestFormat", f"A {collection} entry has no name.")
        child_id = f"{parent_body['id']}/{collection}/{name}"
        props = copy.deepcopy(body.get("properties") or {})
        if child_type.endswith("/subnets"):
            self._check_subnet(parent_body, child_id, props)
        self._check_references(child_id, props)
        props["provisioningState"] = "Updating"
        return {
            "id": child_id,
            "name": name,
            "type": child_type,
            "etag": f'W/"{uuid.uuid4()}"',
            "properties": props,
        }

    # ── network shapes ──

    def _check_subnet(self, vnet: Json, subnet_id: str, props: Json) -> None:
        prefix = props.get("addressPrefix") or (props.get("addressPrefixes") or [None])[0]
        spaces = vnet["properties"].get("addressSpace", {}).get("addressPrefixes", [])
        try:
            network = ipaddress.ip_network(prefix)
            inside = any(network.subnet_of(ipaddress.ip_network(s)) for s in spaces)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise ArmError(
                400, "InvalidAddressPrefixFormat", f"Subnet {subnet_id}: bad prefix {prefix!r}."
            ) from exc
        if not inside:
            raise ArmError(
                400,
                "NetcfgSubnetRangeOutsideVnet",
                f"Subnet '{subnet_id.rpartition('/')[2]}' is not valid because its IP address "
                f"range is outside the IP address range of virtual network "
                f"'{vnet['name']}'.",
            )

    def _shape_vnet(self, stored: Json, existing: _Record | None) -> None:
        props = stored["properties"]
        for prefix in props.get("addressSpace", {}).get("addressPrefixes", []):
            try:
                ipaddress.ip_network(prefix)
            except ValueError as exc:
                raise ArmError(400, "InvalidAddressPrefixFormat", str(exc)) from exc
        kept = {
            c["name"].lower(): c
            for c in (existing.body["properties"].get("subnets", []) if existing else [])
        }
        subnets = [
            self._shape_child(
                stored, "subnets", _CHILDREN["microsoft.network/virtualnetworks"][1], s
            )
            for s in props.get("subnets") or []
        ]
        # A PUT that leaves out a subnet deletes it, which a subnet in use refuses.
        for name, old in kept.items():
            if name not in {s["name"].lower() for s in subnets} and (
                users := self._referrers(old["id"])
            ):
                code, text = _IN_USE["Microsoft.Network/virtualNetworks/subnets"]
                raise ArmError(400, code, text.format(id=old["id"], ref=users[0]))
        props["subnets"] = subnets

    def _shape_nsg(self, stored: Json, existing: _Record | None) -> None:
        props = stored["properties"]
        rule_type = _CHILDREN["microsoft.network/networksecuritygroups"][1]
        props["securityRules"] = [
            self._shape_child(stored, "securityRules", rule_type, rule)
            for rule in props.get("securityRules") or []
        ]
        defaults = [
            ("AllowVnetInBound", 65000, "Inbound", "Allow", "VirtualNetwork", "VirtualNetwork"),
            ("AllowAzureLoadBalancerInBound", 65001, "Inbound", "Allow", "AzureLoadBalancer", "*"),
            ("DenyAllInBound", 65500, "Inbound", "Deny", "*", "*"),
            ("AllowVnetOutBound", 65000, "Outbound", "Allow", "VirtualNetwork", "VirtualNetwork"),
            ("AllowInternetOutBound", 65001, "Outbound", "Allow", "*", "Internet"),
            ("DenyAllOutBound", 65500, "Outbound", "Deny", "*", "*"),
        ]
        props["defaultSecurityRules"] = [
            {
                "id": f"{stored['id']}/defaultSecurityRules/{name}",
                "name": name,
                "type": "Microsoft.Network/networkSecurityGroups/defaultSecurityRules",
                "properties": {
                    "protocol": "*",
                    "sourcePortRange": "*",
                    "destinationPortRange": "*",
                    "sourceAddressPrefix": source,
                    "destinationAddressPrefix": destination,
                    "access": access,
                    "priority": priority,
                    "direction": direction,
                    "provisioningState": "Succeeded",
                },
            }
            for name, priority, direction, access, source, destination in defaults
        ]

    def _shape_public_ip(self, stored: Json, existing: _Record | None) -> None:
        props = stored["properties"]
        props.setdefault("publicIPAllocationMethod", "Dynamic")
        props.setdefault("publicIPAddressVersion", "IPv4")
        props.setdefault("idleTimeoutInMinutes", 4)
        old = existing.body["properties"].get("ipAddress") if existing else None
        if old:
            props["ipAddress"] = old
        elif props["publicIPAllocationMethod"].lower() == "static":
            props["ipAddress"] = self._public_address(stored["id"])
        else:
            props.pop("ipAddress", None)  # a dynamic address comes with a running VM

    def _public_address(self, pip_id: str) -> str:
        chosen = self.addresses("public", pip_id) if self.addresses else None
        return chosen or str(_DEFAULT_PUBLIC[next(self._public_counter)])

    def _shape_nic(self, stored: Json, existing: _Record | None) -> None:
        props = stored["properties"]
        configs = props.get("ipConfigurations") or []
        if not configs:
            raise ArmError(
                400,
                "NetworkInterfaceMustHaveAtLeastOneIpConfiguration",
                f"Network interface {stored['id']} must have at least one IP configuration.",
            )
        self._check_references(stored["id"], props)
        old_configs = {
            c["name"].lower(): c
            for c in (existing.body["properties"]["ipConfigurations"] if existing else [])
        }
        shaped = []
        for position, config in enumerate(configs):
            name = config.get("name") or f"ipconfig{position + 1}"
            config_id = f"{stored['id']}/ipConfigurations/{name}"
            cprops = copy.deepcopy(config.get("properties") or {})
            old = old_configs.get(name.lower())
            cprops.setdefault("privateIPAllocationMethod", "Dynamic")
            cprops.setdefault("privateIPAddressVersion", "IPv4")
            cprops.setdefault("primary", position == 0)
            if cprops["privateIPAllocationMethod"].lower() != "static" or not cprops.get(
                "privateIPAddress"
            ):
                if old and old["properties"].get("privateIPAddress"):
                    cprops["privateIPAddress"] = old["properties"]["privateIPAddress"]
                else:
                    cprops["privateIPAddress"] = self._private_address(config_id, cprops)
            cprops["provisioningState"] = "Succeeded"
            shaped.append(
                {
                    "id": config_id,
                    "name": name,
                    "type": "Microsoft.Network/networkInterfaces/ipConfigurations",
                    "etag": stored["etag"],
                    "properties": cprops,
                }
            )
        props["ipConfigurations"] = shaped
        props.setdefault("enableAcceleratedNetworking", False)
        props.setdefault("enableIPForwarding", False)
        if existing:
            for kept in ("virtualMachine", "macAddress"):
                if kept in existing.body["properties"]:
                    props[kept] = existing.body["properties"][kept]

    def _private_address(self, config_id: str, props: Json) -> str:
        chosen = self.addresses("private", config_id) if self.addresses else None
        if chosen:
            return chosen
        subnet_id = (props.get("subnet") or {}).get("id", "")
        vnet_id, _, name = subnet_id.lower().rpartition("/subnets/")
        vnet = self._resources.get(vnet_id)
        prefix = "10.0.0.0/24"
        if vnet is not None:
            for subnet in vnet.body["properties"].get("subnets", []):
                if subnet["name"].lower() == name:
                    sprops = subnet["properties"]
                    prefix = sprops.get("addressPrefix") or sprops["addressPrefixes"][0]
        used = {
            c["properties"].get("privateIPAddress")
            for r in self._resources.values()
            if r.body["type"] == "Microsoft.Network/networkInterfaces"
            for c in r.body["properties"]["ipConfigurations"]
        }
        # Azure keeps the first four addresses of a subnet (and the last) for itself.
        for host in itertools.islice(ipaddress.ip_network(prefix).hosts(), 3, None):
            if str(host) not in used:
                return str(host)
        raise ArmError(
            400,
            "SubnetIsFull",
            f"Subnet {subnet_id} with address prefix {prefix} does not have enough capacity.",
        )

    # ── virtual machines ──

    def _vm_record(self, rg: str, name: str) -> _Record:
        for record in self._all_vms(rg):
            if record.body["name"].lower() == name.lower():
                return record
        raise KeyError(f"no VM {name} in {rg}")

    def _all_vms(self, rg: str | None) -> list[_Record]:
        records = self._in_rg(rg) if rg is not None else list(self._resources.values())
        return [r for r in records if r.body["type"] == VM_TYPE]

    def _validate_vm(self, vm: Json) -> VmSku:
        props = vm["properties"]
        size = (props.get("hardwareProfile") or {}).get("vmSize")
        if not size:
            raise ArmError(
                400, "InvalidParameter", "The value of parameter vmSize is invalid.", "vmSize"
            )
        location = vm["location"]
        sku = self.skus.get(size.lower())
        zones = tuple(vm.get("zones") or ())
        if sku is None or self._restricted(size, location, zones):
            raise ArmError(
                409,
                "SkuNotAvailable",
                _FAULT_MESSAGES["SkuNotAvailable"].format(size=size, location=location),
            )
        os_profile = props.get("osProfile") or {}
        user = os_profile.get("adminUsername")
        if not user or user.lower() in _RESERVED_USERS:
            raise ArmError(
                400,
                "InvalidParameter",
                "The Admin Username specified is not allowed.",
                "adminUsername",
            )
        custom = os_profile.get("customData")
        if custom is not None:
            try:
                valid = len(custom) <= _CUSTOM_DATA_LIMIT
                base64.b64decode(custom, validate=True)
            except (binascii.Error, ValueError, TypeError):
                valid = False
            if not valid:
                raise ArmError(
                    400,
                    "InvalidParameter",
                    "Custom data in OSProfile must be in Base64 encoding and with a maximum "
                    f"length of {_CUSTOM_DATA_LIMIT} characters.",
                    "customData",
                )
        keys = ((os_profile.get("linuxConfiguration") or {}).get("ssh") or {}).get("publicKeys")
        expected = f"/home/{user}/.ssh/authorized_keys"
        for key in keys or []:
            if key.get("path") != expected:
                raise ArmError(
                    400,
                    "InvalidParameter",
                    "Destination path for SSH public keys is currently limited to its default "
                    f"value {expected} due to a known issue in Linux provisioning agent.",
                    "linuxConfiguration.ssh.publicKeys.path",
                )
        identities = (vm.get("identity") or {}).get("userAssignedIdentities") or {}
        for reference in identities:
            record = self._resources.get(reference.lower())
            if record is None or record.body["type"] != IDENTITY_TYPE:
                raise ArmError(
                    400,
                    "FailedIdentityOperation",
                    f"Identity operation for resource '{vm['id']}' failed with error 'Failed to "
                    f"perform resource identity operation. Status: 'NotFound'. Response: "
                    f"'Resource '{reference}' was not found.''.",
                )
            identities[reference] = {
                "principalId": record.body["properties"]["principalId"],
                "clientId": record.body["properties"]["clientId"],
            }
        nics = (props.get("networkProfile") or {}).get("networkInterfaces") or []
        if not nics:
            raise ArmError(
                400,
                "InvalidParameter",
                "At least one network interface is required.",
                "networkProfile",
            )
        for nic in nics:
            record = self._resources.get(str(nic.get("id", "")).lower())
            if record is None:
                raise ArmError(404, "NotFound", f"Resource {nic.get('id')} not found.")
            owner = record.body["properties"].get("virtualMachine")
            if owner and owner["id"].lower() != vm["id"].lower():
                raise ArmError(
                    400,
                    "NicInUse",
                    f"Network Interface {record.body['id']} is used by existing resource "
                    f"{owner['id']}.",
                )
            if record.body["properties"].get("enableAcceleratedNetworking") and not (
                sku.accelerated_networking
            ):
                raise ArmError(
                    400,
                    "VMSizeIsNotPermittedToEnableAcceleratedNetworking",
                    f"VM size {size} is not compatible with enabling Accelerated Networking on "
                    f"network interface {record.body['id']}.",
                )
        return sku

    def _restricted(self, size: str, location: str, zones: tuple[str, ...]) -> bool:
        for r_size, r_location, r_zones, _ in self._restrictions:
            if r_size != size.lower() or r_location != location:
                continue
            if r_zones is None or set(r_zones) & set(zones):
                return True
        return False

    def _quota_key(self, vm: Json, sku: VmSku) -> str:
        spot = str(vm["properties"].get("priority", "")).lower() in ("spot", "low")
        return "lowprioritycores" if spot else sku.family.lower()

    def _usage(self, location: str, key: str, leaving_out: str | None = None) -> int:
        total = 0
        for record in self._all_vms(None):
            body = record.body
            if body["location"] != location or body["id"].lower() == leaving_out:
                continue
            if record.power in ("deallocated", "deallocating") or record.failure:
                continue
            sku = self.skus.get(body["properties"]["hardwareProfile"]["vmSize"].lower())
            if sku is None:
                continue
            vm_key = self._quota_key(body, sku)
            if key == vm_key or (key == "cores" and vm_key != "lowprioritycores"):
                total += sku.vcpus
        return total

    def _check_quota(self, vm: Json, sku: VmSku) -> None:
        location = vm["location"]
        key = self._quota_key(vm, sku)
        for quota_key in (key, "cores") if key != "lowprioritycores" else (key,):
            limit = self._quotas.get((location, quota_key))
            if limit is None:
                continue
            usage = self._usage(location, quota_key, leaving_out=vm["id"].lower())
            if usage + sku.vcpus > limit:
                family = {"lowprioritycores": "Low Priority", "cores": "Total Regional"}.get(
                    quota_key, sku.family
                )
                raise ArmError(
                    409,
                    "OperationNotAllowed",
                    _FAULT_MESSAGES["OperationNotAllowed"].format(
                        family=family,
                        location=location,
                        limit=limit,
                        usage=usage,
                        need=sku.vcpus,
                        required=usage + sku.vcpus,
                    ),
                )

    def _vm_fault(self, vm: Json) -> _Fault | None:
        size = vm["properties"]["hardwareProfile"]["vmSize"].lower()
        for fault in self._faults:
            if fault.method != "vm-create" or fault.times == 0:
                continue
            if fault.location not in (None, vm["location"]) or fault.size not in (None, size):
                continue
            fault.take()
            return fault
        return None

    def _put_vm(self, vm: Json, existing: _Record | None) -> Reply:
        if existing is not None and existing.failure is None:
            return self._update_vm(vm, existing)
        sku = self._validate_vm(vm)
        self._check_quota(vm, sku)
        fault = self._vm_fault(vm)
        error = None
        if fault is not None:
            size = vm["properties"]["hardwareProfile"]["vmSize"]
            message = fault.message or _message(
                fault.code,
                size=size,
                location=vm["location"],
                family=sku.family,
                limit=0,
                usage=0,
                need=sku.vcpus,
                required=sku.vcpus,
                action="Microsoft.Compute/virtualMachines/write",
                scope=vm["id"],
            )
            if fault.status is not None:
                raise ArmError(fault.status, fault.code, message)
            error = {"code": fault.code, "message": message}

        props = vm["properties"]
        props["vmId"] = str(uuid.uuid4())
        props["timeCreated"] = _now()
        props["provisioningState"] = "Creating"
        if str(props.get("priority", "")).lower() == "spot":
            props.setdefault("evictionPolicy", "Deallocate")
        os_profile = props.setdefault("osProfile", {})
        os_profile.setdefault("computerName", vm["name"])
        os_profile.setdefault("allowExtensionOperations", True)
        storage = props.setdefault("storageProfile", {})
        disk = storage.setdefault("osDisk", {})
        disk.setdefault("osType", "Linux")
        disk.setdefault("name", f"{vm['name']}_OsDisk_1_{uuid.uuid4().hex}")
        disk.setdefault("createOption", "FromImage")
        disk.setdefault("caching", "ReadWrite")
        disk.setdefault("deleteOption", "Detach")
        disk.setdefault("diskSizeGB", 30)
        managed = disk.setdefault("managedDisk", {})
        managed.setdefault("storageAccountType", "Premium_LRS")
        rg_id = vm["id"].split("/providers/")[0]
        managed["id"] = _upper_rg(f"{rg_id}/providers/Microsoft.Compute/disks/{disk['name']}")

        record = _Record(vm)
        self._resources[vm["id"].lower()] = record
        for nic in props["networkProfile"]["networkInterfaces"]:
            nic_body = self._resources[nic["id"].lower()].body
            nic_body["properties"]["virtualMachine"] = {"id": _upper_rg(vm["id"])}

        def finish() -> None:
            if self._resources.get(vm["id"].lower()) is not record:
                return
            if error is not None:
                props["provisioningState"] = "Failed"
                record.failure = error
                record.power = None
                return
            props["provisioningState"] = "Succeeded"
            record.power = "running"
            self._create_os_disk(record)
            self._attach_dynamic_addresses(record)

        operation = self._start(finish, error)
        headers = self._async_headers(
            self._sub_of(record), "Microsoft.Compute", vm["location"], operation
        )
        del headers["Location"]
        return Reply(201, self._view(record, {}), headers)

    def _update_vm(self, vm: Json, record: _Record) -> Reply:
        old = record.body["properties"]
        new = vm["properties"]
        for kept in ("vmId", "timeCreated", "storageProfile", "osProfile"):
            if kept in old:
                new[kept] = old[kept]
        new["provisioningState"] = "Updating"
        record.body = vm

        def finish() -> None:
            new["provisioningState"] = "Succeeded"

        operation = self._start(finish)
        headers = self._async_headers(
            self._sub_of(record), "Microsoft.Compute", vm["location"], operation
        )
        del headers["Location"]
        return Reply(200, self._view(record, {}), headers)

    def _create_os_disk(self, record: _Record) -> None:
        vm = record.body
        disk = vm["properties"]["storageProfile"]["osDisk"]
        disk_id = disk["managedDisk"]["id"]
        self._resources[disk_id.lower()] = _Record(
            {
                "id": disk_id,
                "name": disk["name"],
                "type": "Microsoft.Compute/disks",
                "location": vm["location"],
                **({"zones": vm["zones"]} if vm.get("zones") else {}),
                "tags": {},
                "managedBy": _upper_rg(vm["id"]),
                "sku": {"name": disk["managedDisk"]["storageAccountType"], "tier": "Premium"},
                "properties": {
                    "osType": "Linux",
                    "diskSizeGB": disk["diskSizeGB"],
                    "diskState": "Attached",
                    "provisioningState": "Succeeded",
                    "timeCreated": _now(),
                },
            }
        )

    def _nic_records(self, vm: _Record) -> list[tuple[Json, _Record]]:
        found = []
        for reference in vm.body["properties"]["networkProfile"]["networkInterfaces"]:
            nic = self._resources.get(reference["id"].lower())
            if nic is not None:
                found.append((reference, nic))
        return found

    def _public_ips(self, nic: _Record) -> list[tuple[Json, _Record]]:
        found = []
        for config in nic.body["properties"]["ipConfigurations"]:
            reference = config["properties"].get("publicIPAddress")
            if reference and (pip := self._resources.get(reference["id"].lower())):
                found.append((reference, pip))
        return found

    def _attach_dynamic_addresses(self, vm: _Record) -> None:
        for _, nic in self._nic_records(vm):
            nic.body["properties"].setdefault(
                "macAddress", "00-0D-3A-" + "-".join(f"{b:02X}" for b in uuid.uuid4().bytes[:3])
            )
            for _, pip in self._public_ips(nic):
                if not pip.body["properties"].get("ipAddress"):
                    pip.body["properties"]["ipAddress"] = self._public_address(pip.body["id"])

    def _release_dynamic_addresses(self, vm: _Record) -> None:
        for _, nic in self._nic_records(vm):
            for _, pip in self._public_ips(nic):
                props = pip.body["properties"]
                if props.get("publicIPAllocationMethod", "").lower() != "static":
                    props.pop("ipAddress", None)

    def _remove_vm(self, record: _Record, *, evicted: bool) -> None:
        """Delete a VM and what goes with it: its OS disk when its deleteOption says so (or on
        eviction), its NICs and their public IPs likewise; the rest is detached and kept."""
        vm = record.body
        self._release_dynamic_addresses(record)
        disk = vm["properties"]["storageProfile"]["osDisk"]
        disk_record = self._resources.get(disk["managedDisk"]["id"].lower())
        if disk_record is not None:
            if evicted or str(disk.get("deleteOption", "")).lower() == "delete":
                del self._resources[disk["managedDisk"]["id"].lower()]
            else:
                disk_record.body.pop("managedBy", None)
                disk_record.body["properties"]["diskState"] = "Unattached"
        for reference, nic in self._nic_records(record):
            nic.body["properties"].pop("virtualMachine", None)
            nic.body["properties"].pop("macAddress", None)
            if str((reference.get("properties") or {}).get("deleteOption", "")).lower() != "delete":
                continue
            for pip_reference, pip in self._public_ips(nic):
                option = (pip_reference.get("properties") or {}).get("deleteOption") or pip.body[
                    "properties"
                ].get("deleteOption")
                if str(option).lower() == "delete":
                    del self._resources[pip.body["id"].lower()]
            del self._resources[nic.body["id"].lower()]
        del self._resources[vm["id"].lower()]

    def _vm_action(self, record: _Record, action: str) -> Reply:
        during, after = _VM_ACTIONS[action]
        if action == "start" and record.power in ("deallocated", None):
            sku = self.skus[record.body["properties"]["hardwareProfile"]["vmSize"].lower()]
            self._check_quota(record.body, sku)
        record.power = during

        def finish() -> None:
            if self._resources.get(record.body["id"].lower()) is not record:
                return
            record.power = after
            if after == "deallocated":
                self._release_dynamic_addresses(record)
            elif after == "running":
                self._attach_dynamic_addresses(record)

        operation = self._start(finish)
        headers = self._async_headers(
            self._sub_of(record), "Microsoft.Compute", record.body["location"], operation
        )
        return Reply(202, None, headers)

    def _instance_view(self, record: _Record) -> Json:
        state = record.body["properties"]["provisioningState"]
        statuses: list[Json] = []
        if record.failure is not None:
            statuses.append(
                {
                    "code": f"ProvisioningState/failed/{record.failure['code']}",
                    "level": "Error",
                    "displayStatus": "Provisioning failed",
                    "message": record.failure["message"],
                }
            )
        else:
            display = "Provisioning succeeded" if state == "Succeeded" else state
            statuses.append(
                {
                    "code": f"ProvisioningState/{state.lower()}",
                    "level": "Info",
                    "displayStatus": display,
                }
            )
        if record.power is not None:
            statuses.append(
                {
                    "code": f"PowerState/{record.power}",
                    "level": "Info",
                    "displayStatus": f"VM {record.power}",
                }
            )
        return {
            "computerName": record.body["properties"].get("osProfile", {}).get("computerName"),
            "osName": "ubuntu",
            "statuses": statuses,
        }

    # ── SKUs, sizes, usages ──

    def _check_location(self, location: str) -> str:
        location = _normal_location(location)
        if location not in self.locations:
            raise ArmError(
                400,
                "LocationNotAvailableForResourceType",
                f"The provided location '{location}' is not available for resource type "
                "'Microsoft.Compute/locations'.",
            )
        return location

    def _list_skus(self, sub: str, path: str, query: dict[str, str]) -> Reply:
        clauses = _parse_filter(query.get("$filter", ""))
        wanted = {_normal_location(v) for k, v in clauses if k == "location"}
        entries = []
        for location in self.locations:
            if wanted and location not in wanted:
                continue
            for sku in self.skus.values():
                restrictions = []
                for r_size, r_location, r_zones, reason in self._restrictions:
                    if r_size != sku.name.lower() or r_location != location:
                        continue
                    info: Json = {"locations": [location]}
                    if r_zones is not None:
                        info["zones"] = list(r_zones)
                    restrictions.append(
                        {
                            "type": "Location" if r_zones is None else "Zone",
                            "values": [location],
                            "restrictionInfo": info,
                            "reasonCode": reason,
                        }
                    )
                entries.append(
                    {
                        "resourceType": "virtualMachines",
                        "name": sku.name,
                        "tier": "Standard",
                        "size": sku.name.removeprefix("Standard_"),
                        "family": sku.family,
                        "locations": [location],
                        "locationInfo": [
                            {"location": location, "zones": list(sku.zones), "zoneDetails": []}
                        ],
                        "capabilities": sku.capabilities(),
                        "restrictions": restrictions,
                    }
                )
        return self._page(path, query, entries)

    def _list_vm_sizes(self, location: str) -> Reply:
        self._check_location(location)
        sizes = [
            {
                "name": sku.name,
                "numberOfCores": sku.vcpus,
                "osDiskSizeInMB": 1047552,
                "resourceDiskSizeInMB": 65536 * max(1, sku.vcpus // 4),
                "memoryInMB": sku.memory_gb * 1024,
                "maxDataDiskCount": 32,
            }
            for sku in self.skus.values()
        ]
        return Reply(200, {"value": sizes})

    def _list_usages(self, location: str) -> Reply:
        location = self._check_location(location)
        keys = {
            "cores": "Total Regional vCPUs",
            "lowprioritycores": "Total Regional Low-priority vCPUs",
        }
        keys.update({s.family.lower(): f"{s.family} vCPUs" for s in self.skus.values()})
        names = {s.family.lower(): s.family for s in self.skus.values()}
        names.update({"cores": "cores", "lowprioritycores": "lowPriorityCores"})
        value = [
            {
                "unit": "Count",
                "currentValue": self._usage(location, key),
                "limit": self._quotas.get((location, key), 10000),
                "name": {"value": names[key], "localizedValue": label},
            }
            for key, label in keys.items()
        ]
        return Reply(200, {"value": value})


@dataclass(frozen=True)
class AzureClients:
    """The three management clients a provider uses, all pointed at one fake."""

    resource: Any  # azure.mgmt.resource.resources.ResourceManagementClient
    network: Any  # azure.mgmt.network.NetworkManagementClient
    compute: Any  # azure.mgmt.compute.ComputeManagementClient
    credential: FakeCredential

    def close(self) -> None:
        for client in (self.resource, self.network, self.compute):
            client.close()


def sdk_clients(
    fake: AzureFake, subscription_id: str = SUBSCRIPTION, *, retries: int = 0
) -> AzureClients:
    """Real SDK clients for ``fake``, sharing one ``FakeCredential``.

    Imported here, not at the top: the compute SDK takes a moment to import and tests that
    only want the server need not pay for it. ``ResourceManagementClient`` comes from
    ``azure.mgmt.resource.resources``; ``azure.mgmt.resource`` no longer exports it (26).
    """
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.network import NetworkManagementClient
    from azure.mgmt.resource.resources import ResourceManagementClient

    credential = FakeCredential()
    options: Json = {"credential": credential, "retries": retries}
    return AzureClients(
        resource=fake.client(ResourceManagementClient, subscription_id, **options),
        network=fake.client(NetworkManagementClient, subscription_id, **options),
        compute=fake.client(ComputeManagementClient, subscription_id, **options),
        credential=credential,
    )
