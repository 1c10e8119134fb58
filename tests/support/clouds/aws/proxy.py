"""A small HTTP proxy of the tests' own in front of moto: the AWS provider's ``endpoint_url``
points here, every call is logged, and a test can make EC2 refuse, withhold or drop a call
(what moto never does), without touching boto3.

::

    boto3 ──POST Action=RunInstances&...──> Ec2Proxy ──forward──> moto
                                             │ log: (action, params)
                                             │ refuse(rule)   answer with EC2's XML error
                                             │ hold(action)   forward, then keep the answer
                                             │                until release() (an answer lost
                                             │                in flight: the thing exists)
                                             │ close(action)  drop the connection unanswered
                                             │ placement groups: answered here (moto has
                                             │ none), Create/Describe/Delete, with tags and
                                             │ Describe's filters as EC2 evaluates them

``MotoServer`` keeps one in front of moto for every test, for the placement groups; a test
puts its own in front of that one to refuse, hold or drop calls.

EC2's query API is a form-encoded POST whose ``Action`` names the call; its errors are
``<Response><Errors><Error><Code>..`` documents (capacity errors are server errors, 500).
"""

from __future__ import annotations

import http.client
import http.server
import re
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

Params = dict[str, str]

_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
    "<Message>{message}</Message></Error></Errors><RequestID>{request}</RequestID></Response>"
)


@dataclass
class Refusal:
    action: str
    when: Callable[[Params], bool]
    code: str
    message: str
    status: int
    seen: int = 0
    page: str | None = None  # answered instead of EC2's XML: a broken endpoint's HTML page


@dataclass
class Ec2Proxy:
    """Use as a context manager; ``url`` goes to ``sky.AWS(endpoint_url=...)``."""

    upstream: str
    log: list[tuple[str, Params]] = field(default_factory=list)
    host: str = "127.0.0.1"  # where it listens (a test bridge's address: stand-ins reach it)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # guards: log, _refusals, _held, _closing
        self._refusals: list[Refusal] = []
        self._held: set[str] = set()
        self._closing: set[str] = set()
        # moto implements no placement groups: (region, name) -> (strategy, tags), answered
        # here (a group lives in one region, as in EC2).
        self.placement_groups: dict[tuple[str, str], tuple[str, dict[str, str]]] = {}
        self.reached = threading.Event()  # a held call is being held
        self._release = threading.Event()
        target = urllib.parse.urlsplit(self.upstream)
        self._host, self._port = target.hostname or "127.0.0.1", target.port or 80
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                proxy._handle(self)

            def do_GET(self) -> None:
                proxy._handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{self.host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> Ec2Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_proxy()

    # ── what a test asks for ───────────────────────────────────────────────────────────

    def refuse(
        self,
        action: str,
        code: str,
        message: str = "",
        *,
        when: Callable[[Params], bool] = lambda params: True,
        status: int = 400,
        page: str | None = None,
    ) -> Refusal:
        said = message or f"refused by the test ({code})"
        refusal = Refusal(action, when, code, said, status, page=page)
        with self._lock:
            self._refusals.append(refusal)
        return refusal

    def hold(self, action: str) -> None:
        """Forward ``action``, then keep its answer until ``release()``."""
        with self._lock:
            self._held.add(action)

    def drop(self, action: str) -> None:
        """Close the connection of every ``action`` call without answering."""
        with self._lock:
            self._closing.add(action)

    def release(self) -> None:
        with self._lock:
            self._held.clear()
        self._release.set()

    def actions(self) -> list[str]:
        with self._lock:
            return [action for action, _ in self.log]

    def calls(self, action: str) -> list[Params]:
        with self._lock:
            return [params for name, params in self.log if name == action]

    def forget(self) -> None:
        """Forget the log and the placement groups (moto's reset does not reach them)."""
        with self._lock:
            self.log.clear()
            self.placement_groups.clear()

    def close_proxy(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    # ── the proxy ──────────────────────────────────────────────────────────────────────

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        query = urllib.parse.urlsplit(handler.path).query
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace") + "&" + query)
        params = {k: v[0] for k, v in form.items()}
        action = params.get("Action", "")
        with self._lock:
            self.log.append((action, params))
            refusal = next(
                (r for r in self._refusals if r.action == action and r.when(params)), None
            )
            if refusal is not None:
                refusal.seen += 1
            held = action in self._held
            dropped = action in self._closing
        if dropped:
            handler.close_connection = True
            handler.connection.close()
            return
        if refusal is None and action in _PLACEMENT:
            status, text = self._placement(action, params, _region(handler))
            self._answer(handler, status, {"Content-Type": "text/xml"}, text.encode())
            return
        if refusal is not None and refusal.page is not None:
            page = refusal.page.encode()
            self._answer(handler, refusal.status, {"Content-Type": "text/html"}, page)
            return
        if refusal is not None:
            text = _ERROR.format(
                code=escape(refusal.code), message=escape(refusal.message), request="test"
            )
            self._answer(handler, refusal.status, {"Content-Type": "text/xml"}, text.encode())
            return
        status, headers, answer = self._forward(handler, body)
        if held:
            self.reached.set()
            self._release.wait(120)
        self._answer(handler, status, headers, answer)

    def _placement(self, action: str, params: Params, region: str) -> tuple[int, str]:
        """EC2's placement-group calls in ``region``, answered from ``placement_groups``."""
        namespace = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'
        name = params.get("GroupName", "")
        with self._lock:
            if action == "CreatePlacementGroup":
                tags = {
                    params[key]: params.get(key.replace(".Key", ".Value"), "")
                    for key in params
                    if key.startswith("TagSpecification.1.Tag.") and key.endswith(".Key")
                }
                if (region, name) in self.placement_groups:
                    code, message = "InvalidPlacementGroup.Duplicate", f"{name} already exists"
                    return 400, _ERROR.format(code=code, message=message, request="t")
                self.placement_groups[region, name] = (params.get("Strategy", ""), tags)
                body = f"<placementGroup>{_group_xml(name, *self.placement_groups[region, name])}"
                return 200, (
                    f"<CreatePlacementGroupResponse {namespace}><requestId>t</requestId>"
                    f"{body}</placementGroup></CreatePlacementGroupResponse>"
                )
            if action == "DeletePlacementGroup":
                if self.placement_groups.pop((region, name), None) is None:
                    code = "InvalidPlacementGroup.Unknown"
                    return 400, _ERROR.format(code=code, message=name, request="t")
                return 200, (
                    f"<DeletePlacementGroupResponse {namespace}><requestId>t</requestId>"
                    f"<return>true</return></DeletePlacementGroupResponse>"
                )
            wanted = _filters(params)
            unknown = set(wanted) - {"group-name", "strategy", "state", "tag-key"}
            unknown = {f for f in unknown if not f.startswith("tag:")}
            if unknown:
                code, message = "InvalidParameterValue", f"The filter '{min(unknown)}' is invalid"
                return 400, _ERROR.format(code=code, message=message, request="t")
            items = "".join(
                f"<item>{_group_xml(n, strategy, tags)}</item>"
                for (r, n), (strategy, tags) in self.placement_groups.items()
                if r == region and _group_matches(wanted, n, strategy, tags)
            )
            return 200, (
                f"<DescribePlacementGroupsResponse {namespace}><requestId>t</requestId>"
                f"<placementGroupSet>{items}</placementGroupSet>"
                f"</DescribePlacementGroupsResponse>"
            )

    def _forward(
        self, handler: http.server.BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=60)
        try:
            # Host as the client signed it: moto checks SigV4 signatures when IAM is enforced.
            headers = dict(handler.headers.items())
            connection.request(handler.command, handler.path, body=body, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            kept = {
                k: v
                for k, v in response.getheaders()
                if k.lower() not in ("transfer-encoding", "connection", "content-length")
            }
            return response.status, kept, answer
        finally:
            connection.close()

    def _answer(
        self,
        handler: http.server.BaseHTTPRequestHandler,
        status: int,
        headers: dict[str, str],
        body: bytes,
    ) -> None:
        try:
            handler.send_response(status)
            for key, value in headers.items():
                handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
        except OSError:
            pass  # the client gave up on this call (interrupted): nobody to answer


_PLACEMENT = ("CreatePlacementGroup", "DeletePlacementGroup", "DescribePlacementGroups")

CREATES = (
    "RunInstances",
    "ImportKeyPair",
    "CreateKeyPair",
    "CreateSecurityGroup",
    "AuthorizeSecurityGroupIngress",
    "CreateTags",
)


def in_subnet(subnet: str) -> Callable[[Params], bool]:
    """RunInstances asked for ``subnet`` (the provider names it in its network interface)."""
    return lambda params: params.get("NetworkInterface.1.SubnetId") == subnet


def spot(params: Params) -> bool:
    return params.get("InstanceMarketOptions.MarketType") == "spot"


def of_type(instance_type: str) -> Callable[[Params], bool]:
    return lambda params: params.get("InstanceType") == instance_type


def _group_xml(name: str, strategy: str, tags: dict[str, str]) -> str:
    tag_items = "".join(
        f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in tags.items()
    )
    return (
        f"<groupName>{escape(name)}</groupName><strategy>{escape(strategy)}</strategy>"
        f"<state>available</state><groupId>pg-{abs(hash(name)) % 10**12:012d}</groupId>"
        f"<tagSet>{tag_items}</tagSet>"
    )


def _region(handler: http.server.BaseHTTPRequestHandler) -> str:
    """The region a call was signed for (SigV4: ``Credential=KEY/DATE/REGION/ec2/...``)."""
    found = re.search(r"Credential=[^/]+/[^/]+/([^/]+)/", handler.headers.get("Authorization", ""))
    return found.group(1) if found else "us-east-1"


def _filters(params: Params) -> dict[str, list[str]]:
    """``Filter.N.Name=NAME`` / ``Filter.N.Value.M=V`` as ``{NAME: [V, ...]}``."""
    found: dict[str, list[str]] = {}
    for key, value in params.items():
        if key.startswith("Filter.") and key.endswith(".Name"):
            prefix = key[: -len("Name")]
            found[value] = [v for k, v in params.items() if k.startswith(prefix + "Value.")]
    return found


def _group_matches(
    filters: dict[str, list[str]], name: str, strategy: str, tags: dict[str, str]
) -> bool:
    """DescribePlacementGroups' filters, as EC2 evaluates them: every filter holds, each
    with any of its values (``tag:K`` a tag's value, ``tag-key`` a tag's key)."""
    facts = {"group-name": [name], "strategy": [strategy], "state": ["available"]}
    for filter_name, values in filters.items():
        if filter_name.startswith("tag:"):
            have = [tags[filter_name[4:]]] if filter_name[4:] in tags else []
        elif filter_name == "tag-key":
            have = list(tags)
        else:
            have = facts[filter_name]
        if not set(have) & set(values):
            return False
    return True
