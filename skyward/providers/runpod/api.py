"""RunPod's HTTP APIs, called with the standard library: its GraphQL API for what only it has
(GPU types with their lowest prices and stock, renting a pod on demand or with a bid), its
REST API (v1) for a pod's life (read, list, terminate); every refusal in our words.

::

    api_key(given)             the key: given, RUNPOD_API_KEY, or runpodctl's / the runpod
                               SDK's ~/.runpod/config.toml; never sent to a machine
    Api.graphql(query, vars)   POST {graphql}: {"data": ...} or {"errors": [{"message"}]}
    Api.rest(method, path)     {rest}/pods...: JSON, or {"error": ...} with its HTTP status
    refusal(message)           no capacity or the offer gone: ``CapacityError`` (the next
                               offer is tried); a bid refused: one for spot; out of credit
                               and a refused key: a ``ProvisionError`` that says what to do

No SDK: the official ``runpod`` package brings a serverless worker's dependencies (aiohttp,
boto3, fastapi, ...) for the five calls used here. The key travels in an ``Authorization``
header, never in a URL.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skyward._errors import ProvisionError
from skyward.client.futures import settle
from skyward.providers.cloud.capacity import CapacityError

GRAPHQL = "https://api.runpod.io/graphql"
REST = "https://rest.runpod.io/v1"
ENV = "RUNPOD_API_KEY"
CONSOLE = "https://www.runpod.io/console/user/settings"
# RunPod's words for a place that cannot take the pod now: the next offer may.
_CAPACITY = ("no longer any instances available", "not enough free gpus", "not have the resources")
_CREDIT = ("balance", "funds", "credit")
_AGAIN = {429, 500, 502, 503, 504}  # worth another try, a second apart


def config_file(home: Path) -> Path:
    return home / ".runpod" / "config.toml"


def api_key(
    given: str | None, env: Mapping[str, str] = os.environ, home: Path | None = None
) -> str:
    """The API key: ``given``, ``RUNPOD_API_KEY``, or ``api_key`` of the ``[default]``
    profile in ``~/.runpod/config.toml`` (``runpod config`` writes it); a
    ``ProvisionError`` saying where to put one when there is none."""
    if given or env.get(ENV):
        return given or env[ENV]
    path = config_file(home or Path.home())
    try:
        profile = tomllib.loads(path.read_text()).get("default", {})
    except (OSError, tomllib.TOMLDecodeError):
        profile = {}
    key = profile.get("api_key") if isinstance(profile, dict) else None
    if isinstance(key, str) and key:
        return key
    raise ProvisionError(
        f"no RunPod API key: set {ENV}, run `runpod config`, or pass sky.RunPod(api_key=...) "
        f"(make one at {CONSOLE})"
    )


class Api:
    """One account's APIs, at RunPod or at ``endpoint_url`` (``/graphql`` and ``/v1`` under
    it: a private endpoint, a test server)."""

    def __init__(self, key: str, endpoint_url: str | None = None, timeout: float = 30.0) -> None:
        self._key = key
        base = endpoint_url.rstrip("/") if endpoint_url else None
        self.graphql_url = f"{base}/graphql" if base else GRAPHQL
        self.rest_url = f"{base}/v1" if base else REST
        self.timeout = timeout

    def graphql(self, query: str, variables: Mapping[str, Any], doing: str) -> dict[str, Any]:
        """The query's ``data``; its first error, translated."""
        body = {"query": query, "variables": dict(variables)}
        answer = self._ask(
            "POST", self.graphql_url, doing, body, tries=1 if "mutation" in query else 3
        )
        errors = answer.get("errors") if isinstance(answer, dict) else None
        if errors:
            raise refusal(doing, str(errors[0].get("message", errors[0])))
        return dict(answer.get("data") or {})

    def rest(self, method: str, path: str, doing: str, *, tries: int = 3) -> Any:
        """``method`` on ``{rest}{path}``: its JSON (``None`` for 404: not there)."""
        return self._ask(method, self.rest_url + path, doing, None, tries=tries)

    def _ask(self, method: str, url: str, doing: str, body: object, *, tries: int) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self._key}", "Content-Type": "application/json"}
        for attempt in range(tries):
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    text = response.read()
                return json.loads(text) if text.strip() else None
            except urllib.error.HTTPError as exc:
                said = _said(exc)
                if exc.code in (401, 403):
                    raise ProvisionError(
                        f"{doing}: RunPod refused the API key (HTTP {exc.code}: {said}). Check "
                        f"{ENV} or sky.RunPod(api_key=...); keys are at {CONSOLE}"
                    ) from None
                if exc.code == 404 and body is None:  # REST: no such pod
                    return None
                if exc.code not in _AGAIN or attempt + 1 == tries:
                    raise refusal(doing, f"HTTP {exc.code}: {said}") from None
            except OSError as exc:  # refused, reset, timed out
                if attempt + 1 == tries:
                    raise ProvisionError(
                        f"{doing}: cannot reach RunPod at {url} ({exc}); check the network"
                    ) from exc
            time.sleep(1.0 + attempt)
        raise AssertionError("unreachable")


def _said(exc: urllib.error.HTTPError) -> str:
    """What an HTTP error's body says: REST's ``{"error": ...}``, GraphQL's ``errors``."""
    text = exc.read().decode("utf-8", "replace")
    try:
        body = json.loads(text)
        return str(body.get("error") or body["errors"][0]["message"])
    except (ValueError, LookupError, TypeError, AttributeError):
        return text.strip()[:200] or str(exc.reason)


def refusal(doing: str, message: str) -> ProvisionError:
    """RunPod's refusal as the start takes it: ``CapacityError`` where another offer may
    serve (no machine left with that GPU, a bid below the current minimum)."""
    said = message.lower()
    if any(words in said for words in _CAPACITY):
        return CapacityError(f"{doing}: no capacity ({message})")
    if "bid" in said:
        return CapacityError(f"{doing}: spot bid refused ({message})", refusal="spot")
    if any(words in said for words in _CREDIT):
        return ProvisionError(
            f"{doing}: RunPod refused for lack of credit ({message}); nothing was rented. "
            f"Add credit at https://www.runpod.io/console/user/billing"
        )
    return ProvisionError(f"{doing}: RunPod said: {message}")


# ── the calls ─────────────────────────────────────────────────────────────────────────────

_MYSELF = "query Myself { myself { id } }"
_GPU_TYPES = """query GpuTypes($lowest: GpuLowestPriceInput) {
  gpuTypes { id displayName memoryInGb secureCloud communityCloud
    lowestPrice(input: $lowest) { minimumBidPrice uninterruptablePrice stockStatus } } }"""
_DEPLOY = """mutation Deploy($input: PodFindAndDeployOnDemandInput!) {
  podFindAndDeployOnDemand(input: $input) { id costPerHr machineId } }"""
_RENT = """mutation Rent($input: PodRentInterruptableInput!) {
  podRentInterruptable(input: $input) { id costPerHr machineId } }"""


def whoami(api: Api) -> str:
    """The account's id: the key works (``ProvisionError`` when it does not)."""
    return str(api.graphql(_MYSELF, {}, "checking the RunPod API key")["myself"]["id"])


def gpu_types(api: Api, lowest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every GPU type, with the lowest prices (per GPU) and stock for ``lowest``
    (``gpuCount``, ``secureCloud``, ``dataCenterId``, ...)."""
    data = api.graphql(_GPU_TYPES, {"lowest": dict(lowest)}, "reading RunPod's GPU types")
    return list(data.get("gpuTypes") or [])


def deploy(api: Api, spec: Mapping[str, Any], *, spot: bool, doing: str) -> str:
    """Rent one pod (``spec``: the mutation's input; spot: with its ``bidPerGpu``): its id."""
    field = "podRentInterruptable" if spot else "podFindAndDeployOnDemand"
    data = api.graphql(_RENT if spot else _DEPLOY, {"input": dict(spec)}, doing)
    return str(data[field]["id"])


def pod(api: Api, id: str, *, quick: bool = False) -> dict[str, Any] | None:
    """The pod (REST v1), or ``None`` when RunPod no longer has it."""
    found = api.rest("GET", f"/pods/{id}", f"reading pod {id}", tries=1 if quick else 3)
    return dict(found) if found else None


def pods(api: Api) -> list[dict[str, Any]]:
    return list(api.rest("GET", "/pods", "listing RunPod pods") or [])


def terminate(api: Api, ids: Sequence[str]) -> list[str]:
    """Terminate the pods and their disks, all at once (one already gone counts as done):
    those that could not be, as ``"pod ID (why)"``."""
    ended = settle(lambda id: api.rest("DELETE", f"/pods/{id}", f"terminating pod {id}"), ids)
    failed = [(id, f.exception()) for id, f in zip(ids, ended, strict=True)]
    return [f"pod {id} ({exc})" for id, exc in failed if exc is not None]
