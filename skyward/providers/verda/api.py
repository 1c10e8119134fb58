"""Verda's REST API (``/v1``, formerly DataCrunch's) over plain HTTP, and its errors in our words.

::

    Api.call(method, path, doing)    one JSON call with the account's bearer token; a refusal
                                     ({"code", "message"}) becomes a ProvisionError
    Api.token()                      POST /oauth2/token (client credentials), cached, fetched
                                     again a minute before it expires and once after a 401

No SDK: the official one (``verda``, formerly ``datacrunch``) sends requests without
timeouts, authenticates in its constructor and gives up on a token that expired early; the
dozen calls below are JSON over the standard library. The account's credentials stay in this
process: no call here ever sends them to a machine.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from functools import partial
from typing import Any

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.cloud.api import Refusals
from skyward.providers.cloud.start import delete_each

ENDPOINT = "https://api.verda.com/v1"
_EARLY = 60.0  # seconds before its expiry a token is fetched again
_TIMEOUT = 30.0

REFUSALS = Refusals(
    cloud="Verda",
    renew="create new credentials at console.verda.com (Account, API keys) and set "
    "VERDA_CLIENT_ID and VERDA_CLIENT_SECRET",
    grant="ask the account's owner to allow {action}",
    roles="Verda's API keys carry the account's rights",
)


class VerdaError(ProvisionError):
    """A refusal from Verda, ``{"code": ..., "message": ...}`` with an HTTP ``status``."""

    def __init__(self, doing: str, status: int, code: str, message: str) -> None:
        funds = ". Add funds at console.verda.com" if code == "insufficient_funds" else ""
        super().__init__(f"{doing}: Verda said {code}: {message}{funds}")
        self.status, self.code, self.said = status, code, f"{code}: {message}"

    @property
    def capacity(self) -> bool:
        """No room for the instance now: another location, type or market may have some.
        Verda answers a deploy it cannot place with 503 ``service_unavailable`` (or says so
        in the message of a 400)."""
        words = ("capacity", "not available", "out of stock")
        return self.status == 503 or any(w in self.said.lower() for w in words)


class Api:
    """One account's API. Thread-safe: the token is shared, behind a lock."""

    def __init__(self, client_id: str, client_secret: str, endpoint: str | None = None) -> None:
        self.endpoint = (endpoint or ENDPOINT).rstrip("/")
        self._credentials = {"client_id": client_id, "client_secret": client_secret}
        self._lock = threading.Lock()  # guards: _token, _expires
        self._token = ""
        self._expires = 0.0

    def token(self) -> str:
        """The bearer token, fetched when there is none or it is about to expire; a refusal
        is a ``ProvisionError`` saying how to renew the credentials."""
        with self._lock:
            if self._token and time.monotonic() < self._expires - _EARLY:
                return self._token
            body = {"grant_type": "client_credentials", **self._credentials}
            try:
                answer = self._send("POST", "/oauth2/token", "fetching a token", body)
            except VerdaError as exc:
                if exc.status in (400, 401, 403):
                    raise REFUSALS.credentials_refused("fetching a Verda token", exc.said) from exc
                raise
            self._token = str(answer["access_token"])
            self._expires = time.monotonic() + float(answer.get("expires_in", 3600))
            return self._token

    def call(
        self,
        method: str,
        path: str,
        doing: str,
        body: Any = None,
        query: dict[str, str] | None = None,
    ) -> Any:
        """One call; JSON back (or the text Verda answers creates with: the new id). A 401
        fetches a new token and asks once more."""
        for attempt in (1, 2):
            token = self.token()
            try:
                return self._send(method, path, doing, body, query, token)
            except VerdaError as exc:
                if exc.status != 401:
                    raise
                if attempt == 2:
                    raise REFUSALS.credentials_refused(doing, exc.said) from exc
                with self._lock:  # refused before its time (revoked, clock): once more
                    if self._token == token:
                        self._token = ""
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _send(
        self, method: str, path: str, doing: str, body: Any, query: Any = None, token: str = ""
    ) -> Any:
        url = self.endpoint + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            try:
                said = json.loads(exc.read().decode() or "{}")
            except ValueError:
                said = {}
            said = said if isinstance(said, dict) else {}
            code, message = said.get("code") or exc.code, said.get("message") or exc.reason
            raise VerdaError(doing, exc.code, str(code), str(message)) from None
        except OSError as exc:
            raise REFUSALS.unreachable(
                doing, str(exc), check="the network and endpoint_url"
            ) from exc
        try:
            return json.loads(text) if text else None
        except ValueError:
            return text.strip()  # POST /instances, /sshkeys, /scripts answer the new id


def is_gone(exc: BaseException) -> bool:
    return isinstance(exc, VerdaError) and (exc.status == 404 or exc.code == "not_found")


# ── what a pool makes: instances, an SSH key, a startup script ─────────────────────────

# Verda's resources carry no tags: an instance's description and a script's last line carry
# the pool's (``identity_tags``), after these words; an SSH key is found by its name.
DESCRIPTION = "Skyward pool "
TAGS_LINE = "# skyward-tags: "


def instances(api: Api, doing: str = "listing instances") -> dict[str, dict[str, Any]]:
    """Every instance Verda still has (deleted ones are not listed), by id."""
    return {str(i["id"]): i for i in api.call("GET", "/instances", doing)}


def tags_of(text: str, mark: str = DESCRIPTION) -> dict[str, str] | None:
    """The pool's tags in an instance's description (or a script's last line, ``mark``
    ``TAGS_LINE``), or ``None``: not one of ours."""
    if not text.startswith(mark):
        return None
    try:
        found = json.loads(text[len(mark) :])
    except ValueError:
        return None
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else None


def delete_instances(
    api: Api, ids: list[str], listed: dict[str, dict[str, Any]], deadline: Deadline
) -> list[str]:
    """Delete each instance with its OS volume (permanently: not to the trash, where it is
    still billed), and wait within ``deadline`` until Verda no longer lists it. What could
    not be deleted, as ``"instance ID (why)"``."""

    def one(id: str) -> None:
        volume = (listed.get(id) or {}).get("os_volume_id")
        body: dict[str, Any] = {"id": [id], "action": "delete", "delete_permanently": True}
        body["volume_ids"] = [volume] if volume else None
        api.call("PUT", "/instances", f"deleting instance {id}", body)
        waits = deadline.remaining() > 0  # Deadline(0): a lost machine let go, not waited for
        status = "deleting"
        while deadline.remaining() > 0:
            try:
                status = api.call("GET", f"/instances/{id}", f"waiting for {id} to go")["status"]
            except VerdaError as exc:
                if is_gone(exc):
                    return
                raise
            if status == "discontinued":
                return
            deadline.sleep(1.0)
        if waits:
            raise ProvisionError(f"still {status} after {deadline.what}")

    return delete_each([(f"instance {id}", partial(one, id)) for id in ids], gone=is_gone)


def named(api: Api, path: str, prefix: str) -> list[dict[str, Any]]:
    """The SSH keys (``/sshkeys``) or startup scripts (``/scripts``) whose name starts so."""
    found = api.call("GET", path, f"listing {path.strip('/')}")
    return [x for x in found if str(x.get("name", "")).startswith(prefix)]


def delete_named(api: Api, path: str, kind: str, ids: list[str]) -> list[str]:
    def one(id: str) -> object:
        return api.call("DELETE", f"{path}/{id}", f"deleting {kind} {id}")

    return delete_each([(f"{kind} {id}", partial(one, id)) for id in ids], gone=is_gone)
