"""Lambda Cloud's REST API (``/api/v1``), spoken with the standard library, and its refusals in
our words.

Lambda publishes no Python SDK for its cloud API, only the REST reference and its OpenAPI
document: the handful of calls a pool makes are plain JSON over HTTPS (``urllib``), which
adds no dependency. Every answer is ``{"data": ...}`` or ``{"error": {"code", "message",
"suggestion"}}``; the ``code`` decides, never the message (which Lambda may reword)::

    global/invalid-api-key                        the key is refused: say how to make one
    instance-operations/launch/insufficient-capacity   CapacityError: the next region or type
    global/quota-exceeded, global/account-inactive     what Lambda suggests
    global/object-does-not-exist, global/not-found     gone (a deletion counts it as done)
    firewall-rulesets/firewall-ruleset-in-use     its instances are still ending: asked again
    HTTP 429, 5xx, no answer                      asked again, a few times (reads, deletes)

The key comes from ``sky.Lambda(api_key=...)``, ``LAMBDA_API_KEY``, or the ``api_key = ...``
line of ``~/.lambda_cloud/lambda_keys`` (the file SkyPilot's Lambda support reads), and is
sent as a bearer token; it never leaves this machine otherwise.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.cloud.api import Refusals
from skyward.providers.cloud.capacity import CapacityError

ENDPOINT = "https://cloud.lambda.ai"
KEY_FILE = Path("~/.lambda_cloud/lambda_keys")
KEYS_PAGE = "https://cloud.lambda.ai/api-keys"
NO_CAPACITY = "instance-operations/launch/insufficient-capacity"
GONE = ("global/object-does-not-exist", "global/not-found")
IN_USE = "firewall-rulesets/firewall-ruleset-in-use"
REFUSALS = Refusals(
    cloud="Lambda Cloud",
    renew=f"make a new key at {KEYS_PAGE} and set LAMBDA_API_KEY",
    grant="Ask the account's owner for {action}",
    roles="see docs/providers.md (Lambda)",
    capacity=frozenset({NO_CAPACITY}),
)
_TRIES = 4  # a read or a deletion asked again after a 429, a 5xx or no answer


class LambdaError(ProvisionError):
    """A refusal of Lambda's API: its HTTP ``status`` and its error ``code``."""

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code

    def __reduce__(self) -> tuple[object, ...]:
        return (LambdaError, (str(self),), self.__dict__)

    @property
    def gone(self) -> bool:
        return self.code in GONE or self.status == 404


def api_key(given: str | None, env: Mapping[str, str], home: Path) -> tuple[str, str] | None:
    """(the key, where it was found), or ``None``: the option, ``LAMBDA_API_KEY``, the
    ``api_key = ...`` line of ``~/.lambda_cloud/lambda_keys``."""
    if given:
        return given, "sky.Lambda(api_key=...)"
    if env.get("LAMBDA_API_KEY"):
        return env["LAMBDA_API_KEY"], "LAMBDA_API_KEY"
    path = home / KEY_FILE.relative_to("~")
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition("=")
        if name.strip() == "api_key" and value.strip():
            return value.strip(), str(path)
    return None


def find_key(given: str | None) -> str:
    """The API key, or a ``ProvisionError`` saying where to put one."""
    found = api_key(given, os.environ, Path.home())
    if found is None:
        raise ProvisionError(
            f"no Lambda Cloud API key: make one at {KEYS_PAGE} and set LAMBDA_API_KEY, "
            f"or pass sky.Lambda(api_key=...)"
        )
    return found[0]


@dataclass(frozen=True)
class Api:
    """Lambda's API at one endpoint with one key. Thread-safe (each call its own request)."""

    key: str
    endpoint: str = ENDPOINT

    def get(self, path: str, doing: str, *, tries: int = _TRIES) -> Any:
        return self.call("GET", path, doing, tries=tries)

    def call(
        self,
        method: str,
        path: str,
        doing: str,
        body: Mapping[str, Any] | None = None,
        *,
        tries: int = _TRIES,
        deadline: Deadline | None = None,
    ) -> Any:
        """``data`` of the answer to ``method path``; a refusal as a ``ProvisionError``
        (``LambdaError``, ``CapacityError``) about ``doing``. A 429 (Lambda allows one
        launch per 12 s) is asked again, ``tries`` times in all; so are a 5xx and no answer
        where asking twice does no harm (reads, deletions, terminations), never a create."""
        again = method in ("GET", "DELETE") or path == "instance-operations/terminate"
        pause = 1.0
        for attempt in range(1, tries + 1):
            try:
                return self._once(method, path, doing, body)
            except LambdaError as exc:
                if attempt == tries or not (exc.status == 429 or (again and exc.status >= 500)):
                    raise
            except OSError as exc:  # refused, reset, timed out: no answer at all
                if attempt == tries or not again:
                    raise REFUSALS.unreachable(doing, str(exc), check="the network") from exc
            if deadline is not None:
                deadline.sleep(pause)
            else:
                time.sleep(pause)
            pause = min(pause * 2, 12.0)
        raise AssertionError("unreachable")

    def _once(self, method: str, path: str, doing: str, body: Mapping[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.endpoint.rstrip('/')}/api/v1/{path.lstrip('/')}",
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.key}",
                "Content-Type": "application/json",
                "Accept": "application/json",
                "User-Agent": "skyward",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:
            raise refusal(doing, exc.code, exc.read()) from None
        try:
            return json.loads(text or b"{}")["data"]
        except (ValueError, KeyError, TypeError):
            raise ProvisionError(
                f"{doing}: {self.endpoint} did not answer as Lambda's API does "
                f"({text[:120].decode(errors='replace')!r}); check endpoint_url"
            ) from None


def refusal(doing: str, status: int, body: bytes) -> ProvisionError:
    """Lambda's error answer as the error that says what to do."""
    try:
        error = json.loads(body)["error"]
        code, message = str(error["code"]), str(error["message"])
        suggestion = str(error.get("suggestion") or "")
    except (ValueError, KeyError, TypeError):
        code, message, suggestion = f"HTTP {status}", body[:200].decode(errors="replace"), ""
    said = f"{message} {suggestion}".strip()
    if code == "global/invalid-api-key" or status == 401:
        return REFUSALS.credentials_refused(doing, said)
    if REFUSALS.refusal(code, spot=False):
        return CapacityError(f"{doing}: no capacity there right now ({message})")
    if code == "global/quota-exceeded":
        return LambdaError(
            f"{doing}: your Lambda Cloud quota is reached ({said}); ask for fewer nodes, or "
            f"ask Lambda's support for more",
            status=status,
            code=code,
        )
    return LambdaError(f"{doing}: Lambda Cloud said {code}: {said}", status=status, code=code)
