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
from skyward.client.extras import require
from skyward.client.futures import Deadline
from skyward.providers.cloud.api import Boundary, Refusals, cause, poll
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
REFUSALS = Refusals(
    cloud="Compute Engine",
    identity="Google",
    renew="renew them (`gcloud auth application-default login`) or check "
    "GOOGLE_APPLICATION_CREDENTIALS",
    grant="Grant a role that has {action}",
    roles=ROLES_HINT,
    capacity=frozenset(_CAPACITY),
)


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
class Api(Boundary):
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

    def call(self, operation: Callable[..., Any], doing: str, /, *args: Any, **kwargs: Any) -> Any:
        """A read (``get``, ``list``): retried on 429/5xx for 30 s at most, then translated."""
        kwargs.setdefault("retry", _read_retry())
        kwargs.setdefault("timeout", 60.0)

        def read() -> Any:
            result = operation(*args, **kwargs)
            # A list pages lazily: read every page here, inside the translation.
            return list(result) if hasattr(result, "pages") else result

        return super().call(read, doing)

    def translate(self, exc: BaseException, doing: str, request: Any) -> ProvisionError:
        return translate(exc, doing, self.project)

    def start(self, operation: Callable[..., Any], doing: str, /, **kwargs: Any) -> Any:
        """Ask for a change (insert, delete); its operation. Not retried: a timed-out insert
        may have happened (the caller deletes by name)."""
        return super().call(operation, doing, retry=None, timeout=60.0, **kwargs)

    def run(
        self, operation: Callable[..., Any], doing: str, deadline: Deadline, /, **kwargs: Any
    ) -> None:
        """A change and its operation, waited for within ``deadline``."""
        self.wait(self.start(operation, doing, **kwargs), doing, deadline)

    def wait(self, operation: Any, doing: str, deadline: Deadline) -> None:
        """Poll ``operation`` on this endpoint until it is done; raise its error, translated."""
        found = re.search(r"/(?:zones/([^/]+)|global)/operations/([^/]+)$", operation.self_link)
        if found is None:
            raise ProvisionError(f"{doing}: Compute Engine answered no operation")
        zone, name = found.groups()
        where = {"project": self.project, "operation": name}
        pending = [operation]

        def probe() -> Any:
            if pending:  # the operation as the change answered it: done already?
                current = pending.pop()
            elif zone:
                current = self.call(self.zone_operations.get, doing, zone=zone, **where)
            else:
                current = self.call(self.global_operations.get, doing, **where)
            return current if done(current) else None

        current = poll(probe, doing, deadline)
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

    def status(error: BaseException) -> int | None:
        code = getattr(error, "code", None)
        return code if isinstance(code, int) else None

    return cause(exc, status)


def is_not_found(exc: BaseException | None) -> bool:
    return status_of(exc) == 404


def is_invalid(exc: BaseException | None) -> bool:
    """A 400 (GCE's answer to a zone that does not exist: "Unknown zone")."""
    return status_of(exc) == 400


def translate(exc: BaseException, doing: str, project: str) -> ProvisionError:
    """A ``ProvisionError`` (``CapacityError`` for capacity) saying what to do about ``exc``."""
    name = type(exc).__name__
    if name in ("RefreshError", "DefaultCredentialsError", "TransportError"):
        return REFUSALS.credentials_refused(doing, f"could not refresh them: {exc}")
    if name in ("ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout"):
        return REFUSALS.unreachable(doing, str(exc))
    status = getattr(exc, "code", None)
    if not isinstance(status, int):
        return ProvisionError(f"{doing}: {name}: {exc}")
    message = str(getattr(exc, "message", "") or exc)
    return failure(doing, project, status=status, reason=error_reason(exc), message=message)


def failure(doing: str, project: str, *, status: int, reason: str, message: str) -> ProvisionError:
    """The error for a refusal of Compute Engine (HTTP status, GCE's reason, its message)."""
    if REFUSALS.refusal(reason, spot=False):
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
        ask = f"in the console: IAM & Admin > Quotas: Compute Engine API, {named}, {where}"
        return REFUSALS.quota(
            doing, f"Compute Engine quota {named}", where, detail=message, ask=ask
        )
    if reason in ("accessNotConfigured", "SERVICE_DISABLED") or "has not been used" in message:
        return ProvisionError(
            f"{doing}: the Compute Engine API is not enabled in project {project}. Enable it: "
            f"gcloud services enable compute.googleapis.com --project {project}"
        )
    permission = re.search(r"'((?:compute|iam)\.[A-Za-z.]+)'", message)
    if status == 403 and permission:
        return REFUSALS.denied(doing, permission.group(1), f"in project {project}")
    if status == 401:
        return REFUSALS.credentials_refused(doing, message)
    if status == 404 and "/images/" in message:
        return ProvisionError(
            f"{doing}: the image does not exist ({message}); check sky.GCP(image=...) (a "
            f"family is 'projects/PROJECT/global/images/family/FAMILY')"
        )
    return REFUSALS.said(doing, f"{status} {reason}", message)
