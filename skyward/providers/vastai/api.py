"""Vast.ai's REST API (v0) over plain HTTP: the key, the calls a pool makes, and Vast's
errors in our words.

No SDK: the ``vastai`` package's old 0.2.x line (which some Pythons still resolve) calls
Vast's servers when it is imported and fails in its constructor, and the current line
brings ``requests`` and a CLI for the six JSON calls below. ``urllib`` sends them as the
docs show them, with nothing to install and nothing done at import::

    GET    /api/v0/users/current/       the key checked and the balance read, before any rent
    POST   /api/v0/bundles/             offers: a query ({"gpu_name": {"in": [...]}, ...})
    PUT    /api/v0/asks/{id}/           rent an offer (an instance): image, disk, label, the
                                        start command, a bid price for an interruptible one
    GET    /api/v0/instances/?owner=me  the account's instances: actual_status, ports, label
    DELETE /api/v0/instances/{id}/      destroy one (its disk with it)

Errors are ``{"success": false, "error": "<code>", "msg": "..."}``: a refused key (401, or
``auth_error``), an offer rented by someone else meanwhile (``no_such_ask``, 404 or 410:
``OfferGone``, the next offer is tried), a balance too low (no other offer changes it).
The account's key is sent to Vast only, in the ``Authorization`` header; never to a machine.
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
from skyward.providers.cloud.capacity import CapacityError

ENDPOINT = "https://console.vast.ai"
KEYS_PAGE = "https://cloud.vast.ai/manage-keys/"
BILLING_PAGE = "https://cloud.vast.ai/billing/"
_TRANSIENT = {429, 502, 503, 504}


class OfferGone(CapacityError):
    """The offer was rented by someone else (or withdrawn) since it was listed."""


def key_files(env: Mapping[str, str], home: Path) -> list[Path]:
    """Where the ``vastai`` CLI keeps the key (``vastai set api-key``): its config
    directory, then the older ``~/.vast_api_key``."""
    config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    return [config / "vastai" / "vast_api_key", home / ".vast_api_key"]


def find_key(env: Mapping[str, str], home: Path) -> tuple[str, str] | None:
    """(the key, where it was found): ``VAST_API_KEY``, else the CLI's files."""
    if env.get("VAST_API_KEY", "").strip():
        return env["VAST_API_KEY"].strip(), "VAST_API_KEY"
    for path in key_files(env, home):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text:
            return text, str(path)
    return None


def api_key(given: str | None) -> str:
    """The key to use: ``given``, else ``find_key``'s; a ``ProvisionError`` saying where to
    put one when there is none."""
    if given:
        return given
    found = find_key(os.environ, Path.home())
    if found is None:
        saved = key_files(os.environ, Path.home())[0]
        raise ProvisionError(
            f"no Vast.ai API key: set VAST_API_KEY, run `vastai set api-key KEY` (it writes "
            f"{saved}), or pass sky.VastAI(api_key=...); make one at {KEYS_PAGE}"
        )
    return found[0]


@dataclass(frozen=True)
class Api:
    """Vast.ai's REST API with one key, at one endpoint. Thread-safe (no state)."""

    key: str
    endpoint: str = ENDPOINT
    timeout: float = 30.0

    def call(self, method: str, path: str, doing: str, body: object = None) -> Any:
        """One call, its JSON answer; a refusal translated. Reads are retried on 429/5xx
        a few times; a rent (PUT) never is: it may have happened."""
        data = None if body is None else json.dumps(body).encode()
        url = f"{self.endpoint.rstrip('/')}/api/v0{path}"
        headers = {"Authorization": f"Bearer {self.key}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        tries = 3 if method in ("GET", "DELETE", "POST") else 1
        for attempt in range(tries):
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                    return json.loads(answer.read() or b"null")
            except urllib.error.HTTPError as exc:
                if exc.code in _TRANSIENT and attempt + 1 < tries:
                    time.sleep(0.5 * (attempt + 1))
                    continue
                raise refusal(doing, exc.code, _body(exc)) from exc
            except (OSError, ValueError) as exc:  # URLError, a timeout, a reset, bad JSON
                raise ProvisionError(
                    f"{doing}: cannot reach Vast.ai at {self.endpoint} ({exc}); check the "
                    f"network (or sky.VastAI(endpoint_url=...))"
                ) from exc
        raise AssertionError("unreachable")

    def user(self) -> dict[str, Any]:
        found = self.call("GET", "/users/current/", "checking the Vast.ai API key")
        return dict(found or {})

    def offers(self, query: Mapping[str, Any]) -> list[dict[str, Any]]:
        found = self.call("POST", "/bundles/", "searching Vast.ai's offers", dict(query))
        return list((found or {}).get("offers") or [])

    def rent(self, ask: int, body: Mapping[str, Any]) -> int:
        """Rent offer ``ask``: the new instance's id."""
        answer = self.call("PUT", f"/asks/{ask}/", f"renting Vast.ai offer {ask}", dict(body))
        if not isinstance(answer, dict) or not answer.get("new_contract"):
            raise ProvisionError(f"renting Vast.ai offer {ask}: Vast.ai answered {answer!r}")
        return int(answer["new_contract"])

    def instances(self) -> list[dict[str, Any]]:
        found = self.call("GET", "/instances/?owner=me", "listing Vast.ai instances")
        return list((found or {}).get("instances") or [])

    def destroy(self, id: str) -> None:
        """Destroy instance ``id``; one Vast.ai no longer has counts as destroyed."""
        try:
            self.call("DELETE", f"/instances/{id}/", f"destroying Vast.ai instance {id}")
        except VastRefusal as exc:
            if exc.status != 404:
                raise


class VastRefusal(ProvisionError):
    """Vast.ai answered an error: its HTTP ``status``, ``code`` (``error``) and ``msg``."""

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code

    def __reduce__(self) -> tuple[object, ...]:
        return (VastRefusal, (str(self),), self.__dict__)


def _body(exc: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        found = json.loads(exc.read() or b"{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def refusal(doing: str, status: int, body: Mapping[str, Any]) -> ProvisionError:
    """The error for Vast.ai's answer ``status`` with its JSON ``body``."""
    code, msg = str(body.get("error") or ""), str(body.get("msg") or body.get("error") or "")
    said = f"{status} {code}: {msg}".strip()
    if status == 401 or code == "auth_error":
        return ProvisionError(
            f"{doing}: Vast.ai refused the API key ({said}). Check VAST_API_KEY or the key "
            f"`vastai set api-key` saved, or make a new one at {KEYS_PAGE}"
        )
    if "no_such_ask" in (code + msg) or status == 410:
        return OfferGone(f"{doing}: the offer is gone ({msg or code})")
    if "credit" in (code + msg).lower() or "balance" in msg.lower():
        return ProvisionError(
            f"{doing}: your Vast.ai balance is too low ({said}). Add credit at {BILLING_PAGE}"
        )
    return VastRefusal(f"{doing}: Vast.ai said {said}", status=status, code=code)
