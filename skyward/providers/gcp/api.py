"""The google-cloud-compute boundary: clients for one project, operations waited with our own
bounds, and every SDK error translated into one that says what to do.

Three traps of the SDK, avoided here (see TESTBED.md):

- ``operation.result()`` polls through an operations client built without our endpoint:
  operations are polled with our own ``ZoneOperationsClient`` / ``GlobalOperationsClient``,
  between ``Deadline.sleep``s that a closing pool wakes.
- An operation that finished with an error but without an HTTP status makes ``result()``
  return ``None``: the operation's ``error.errors`` is read instead.
- ``get`` and ``list`` retry a 503 for 600 s: reads are given a bounded retry.

Errors that say what to do: a quota (named, with its region), a zone without capacity or
without the machine type (``CapacityError``: the pool moves on to the next place), a missing
permission (named), the API not enabled, an image that does not exist, no credentials.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from skyward._errors import ProvisionError
from skyward._extras import require
from skyward._futures import Deadline
from skyward.providers.cloud.capacity import CapacityError

SCOPE = "https://www.googleapis.com/auth/compute"
ROLES_HINT = "the minimal IAM roles are in docs/providers.md (GCP)"
_CAPACITY = {
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_POOL_EXHAUSTED",
    "resourcePoolExhausted",
}
_QUOTA = {"QUOTA_EXCEEDED", "quotaExceeded", "QUOTA_LIMIT_EXCEEDED"}
_POLL_MAX = 2.0  # seconds between polls of an operation, at most


def credentials_and_project(project: str | None, credentials: Any) -> tuple[Any, str]:
    """The credentials to use and the project; ``ProvisionError`` saying what to set when
    either cannot be found. Reads the environment and gcloud's files only (and, on a VM,
    its metadata server, as every Google client does)."""
    if credentials is None:
        auth = require("google.auth", feature="sky.GCP")
        try:
            credentials, found = auth.default(scopes=[SCOPE])
        except Exception as exc:  # DefaultCredentialsError, a bad key file
            raise ProvisionError(
                f"no Google Cloud credentials ({exc}). Run `gcloud auth application-default "
                f"login`, set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, "
                f"or pass sky.GCP(credentials=...)"
            ) from exc
        project = project or found
    project = (
        project
        or getattr(credentials, "project_id", None)
        or os.environ.get("GOOGLE_CLOUD_PROJECT")
        or os.environ.get("CLOUDSDK_CORE_PROJECT")
    )
    if not project:
        raise ProvisionError(
            "no GCP project: pass sky.GCP(project='my-project'), set GOOGLE_CLOUD_PROJECT, "
            "or run `gcloud config set project my-project` and "
            "`gcloud auth application-default login`"
        )
    return credentials, str(project)


@dataclass(frozen=True)
class Api:
    """The Compute clients of one project, at one endpoint. ``call`` and ``run`` translate
    errors; nothing else here does I/O. Thread-safe (the clients are)."""

    project: str
    endpoint: str | None
    instances: Any
    firewalls: Any
    zone_operations: Any
    global_operations: Any
    machine_types: Any
    accelerator_types: Any
    images: Any
    regions: Any

    @classmethod
    def connect(cls, *, project: str, credentials: Any, endpoint: str | None) -> Api:
        compute = require("google.cloud.compute_v1", feature="sky.GCP")
        from google.api_core.client_options import ClientOptions

        # An endpoint with its scheme keeps it (http for a local fake); without, https.
        options = ClientOptions(api_endpoint=endpoint) if endpoint else None

        def make(kind: Any) -> Any:
            return kind(credentials=credentials, client_options=options)

        return cls(
            project=project,
            endpoint=endpoint,
            instances=make(compute.InstancesClient),
            firewalls=make(compute.FirewallsClient),
            zone_operations=make(compute.ZoneOperationsClient),
            global_operations=make(compute.GlobalOperationsClient),
            machine_types=make(compute.MachineTypesClient),
            accelerator_types=make(compute.AcceleratorTypesClient),
            images=make(compute.ImagesClient),
            regions=make(compute.RegionsClient),
        )

    def call(self, operation: Callable[..., Any], doing: str, /, **kwargs: Any) -> Any:
        """A read (``get``, ``list``): retried on 429/5xx for 30 s at most, then translated."""
        kwargs.setdefault("retry", _read_retry())
        kwargs.setdefault("timeout", 60.0)
        try:
            result = operation(**kwargs)
            # A list pages lazily: read every page here, inside the translation.
            return list(result) if hasattr(result, "pages") else result
        except Exception as exc:
            raise translate(exc, doing, self.project) from exc

    def listed(self, operation: Callable[..., Any], doing: str, request: dict[str, Any]) -> Any:
        """A list with a ``filter``, read again without it where the endpoint refuses the
        filter's syntax (an emulator's subset of Google's): every caller checks what it
        lists itself, so the filter only saves traffic."""
        try:
            return self.call(operation, doing, request=request)
        except ProvisionError as exc:
            if "filter" not in request or status_of(exc) != 400:
                raise
        unfiltered = {k: v for k, v in request.items() if k != "filter"}
        return self.call(operation, doing, request=unfiltered)

    def start(self, operation: Callable[..., Any], doing: str, /, **kwargs: Any) -> Any:
        """Ask for a change (insert, delete); its operation. Not retried: a timed-out insert
        may have happened (the caller deletes by name)."""
        try:
            return operation(retry=None, timeout=60.0, **kwargs)
        except Exception as exc:
            raise translate(exc, doing, self.project) from exc

    def run(
        self, operation: Callable[..., Any], doing: str, deadline: Deadline, /, **kwargs: Any
    ) -> None:
        """A change and its operation, waited for within ``deadline``."""
        self.wait(self.start(operation, doing, **kwargs), doing, deadline)

    def wait(self, operation: Any, doing: str, deadline: Deadline) -> None:
        """Poll ``operation`` on this endpoint until it is done; raise its error, translated."""
        found = re.search(r"/(?:zones/([^/]+)|global)/operations/([^/]+)$", operation.self_link)
        if found is not None:
            zone, name = found.groups()
        else:  # an endpoint that leaves selfLink out: the operation's own name and zone
            name, zone = operation.name, operation.zone.rsplit("/", 1)[-1] or None
            if not name:
                raise ProvisionError(f"{doing}: Compute Engine answered no operation")
        pause = 0.1
        current = operation
        while not done(current):
            deadline.check(doing)
            deadline.sleep(pause)
            pause = min(pause * 1.5, _POLL_MAX)
            if zone:
                current = self.call(
                    self.zone_operations.get, doing, project=self.project, zone=zone, operation=name
                )
            else:
                current = self.call(
                    self.global_operations.get, doing, project=self.project, operation=name
                )
        errors = list(current.error.errors) if current.error else []
        if errors:
            first = errors[0]
            raise failure(
                doing,
                self.project,
                status=int(current.http_error_status_code or 0),
                reason=str(first.code),
                message=str(first.message),
            )


def _read_retry() -> Any:
    from google.api_core import exceptions
    from google.api_core.retry import Retry, if_exception_type

    transient = if_exception_type(
        exceptions.ServiceUnavailable,
        exceptions.InternalServerError,
        exceptions.TooManyRequests,
        exceptions.BadGateway,
    )
    return Retry(predicate=transient, initial=0.5, maximum=4.0, multiplier=2.0, timeout=30.0)


def error_reason(exc: BaseException) -> str:
    """``errors[0].reason`` of an SDK error (``quotaExceeded``), or ``""``."""
    errors = getattr(exc, "errors", None) or []
    first = errors[0] if errors else {}
    if isinstance(first, dict):
        return str(first.get("reason", ""))
    return str(getattr(first, "reason", "") or getattr(first, "code", ""))


def done(operation: Any) -> bool:
    return getattr(operation.status, "name", str(operation.status)) == "DONE"


def status_of(exc: BaseException | None) -> int | None:
    """The HTTP status of an SDK error, or of the one a ``ProvisionError`` was made of."""
    while exc is not None:
        code = getattr(exc, "code", None)
        if isinstance(code, int):
            return code
        exc = exc.__cause__
    return None


def is_not_found(exc: BaseException | None) -> bool:
    return status_of(exc) == 404


def not_served(exc: BaseException | None) -> bool:
    """Whether the endpoint answered that it has no such call (404, 405, 501), as an
    emulator or a private endpoint may for calls the public API has."""
    return status_of(exc) in (404, 405, 501)


def is_invalid(exc: BaseException | None) -> bool:
    """A 400 (GCE's answer to a zone that does not exist: "Unknown zone")."""
    return status_of(exc) == 400


def translate(exc: BaseException, doing: str, project: str) -> ProvisionError:
    """A ``ProvisionError`` (``CapacityError`` for capacity) saying what to do about ``exc``."""
    name = type(exc).__name__
    if name in ("RefreshError", "DefaultCredentialsError", "TransportError"):
        return ProvisionError(
            f"{doing}: Google refused or could not refresh the credentials ({exc}). Renew "
            f"them (`gcloud auth application-default login`) or check "
            f"GOOGLE_APPLICATION_CREDENTIALS"
        )
    if name in ("ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout"):
        return ProvisionError(f"{doing}: cannot reach Compute Engine ({exc}); check the network")
    status = getattr(exc, "code", None)
    if not isinstance(status, int):
        return ProvisionError(f"{doing}: {name}: {exc}")
    message = str(getattr(exc, "message", "") or exc)
    return failure(doing, project, status=status, reason=error_reason(exc), message=message)


def failure(doing: str, project: str, *, status: int, reason: str, message: str) -> ProvisionError:
    """The error for a refusal of Compute Engine (HTTP status, GCE's reason, its message)."""
    if reason in _CAPACITY:
        return CapacityError(f"{doing}: no capacity there right now ({message})")
    if "does not exist in zone" in message or (
        reason == "invalid" and "is not available in" in message
    ):
        return CapacityError(f"{doing}: not offered there ({message})", refusal="unsupported")
    if reason in _QUOTA:
        quota = re.search(r"Quota '([^']+)'", message)
        region = re.search(r"in region ([a-z0-9-]+)", message)
        named = quota.group(1) if quota else "?"
        where = region.group(1) if region else "the region"
        return ProvisionError(
            f"{doing}: your Compute Engine quota {named} in {where} is too small ({message}). "
            f"Ask for more in the console (IAM & Admin > Quotas: Compute Engine API, {named}, "
            f"{where}), or ask for fewer or smaller nodes"
        )
    if reason in ("accessNotConfigured", "SERVICE_DISABLED") or "has not been used" in message:
        return ProvisionError(
            f"{doing}: the Compute Engine API is not enabled in project {project}. Enable it: "
            f"gcloud services enable compute.googleapis.com --project {project}"
        )
    permission = re.search(r"'((?:compute|iam)\.[A-Za-z.]+)'", message)
    if status == 403 and permission:
        return ProvisionError(
            f"{doing}: your Google identity lacks the permission {permission.group(1)} in "
            f"project {project}. Grant a role that has it; {ROLES_HINT}"
        )
    if status == 401:
        return ProvisionError(
            f"{doing}: Google refused the credentials ({message}). Renew them "
            f"(`gcloud auth application-default login`)"
        )
    if status == 404 and "/images/" in message:
        return ProvisionError(
            f"{doing}: the image does not exist ({message}); check sky.GCP(image=...) (a "
            f"family is 'projects/PROJECT/global/images/family/FAMILY')"
        )
    return ProvisionError(f"{doing}: Compute Engine said {status} {reason}: {message}")
