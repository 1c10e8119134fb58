"""The azure-mgmt boundary: clients, long-running operations waited within our own bounds,
and every SDK error translated into one that says what to do.

::

    Api.connect(...)      three management clients (resources, network, compute) sharing one
                          credential, base URL, CA bundle and polling interval
    api.call(op, doing)   one request; an SDK error becomes a ProvisionError about `doing`
    api.wait(op, doing,   a long-running operation (begin_*), polled by the SDK's own thread
             deadline)    while we wait in short slices, so a closing pool or the start's
                          deadline ends the wait at once (the SDK's result() would not)

Errors arrive as ``HttpResponseError`` (every 409 is a ``ResourceExistsError``, a 404 a
``ResourceNotFoundError``); ``error.code`` says what happened. ``failure_code`` reads it back
from a translated error, for the failover's choices.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skyward._errors import ProvisionError
from skyward.client.extras import require
from skyward.client.futures import Deadline
from skyward.providers.cloud.api import Boundary, Refusals, cause, poll

if TYPE_CHECKING:
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.network import NetworkManagementClient
    from azure.mgmt.resource.resources import ResourceManagementClient

PUBLIC_CLOUD = "https://management.azure.com"
ROLE_HINT = "the roles a pool needs are in docs/providers.md (Azure)"
_WAIT_SLICE = 0.5  # seconds between looks at the deadline while an operation runs

# Codes that mean "no room for this size here now": the failover moves on.
CAPACITY = frozenset(
    {
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "SpotMaxPriceTooLow",
    }
)
# Codes of a refused spot request that on-demand may not meet: the spot quota.
_SPOT_QUOTA = frozenset({"OperationNotAllowed", "QuotaExceeded"})
REFUSALS = Refusals(
    cloud="Azure",
    renew="`az login` again, or renew the service principal's secret",
    grant="Give it a role that includes {action}",
    roles=ROLE_HINT,
    capacity=CAPACITY,
    spot=_SPOT_QUOTA,
)
_CREDENTIALS = frozenset(
    {
        "InvalidAuthenticationToken",
        "InvalidAuthenticationTokenTenant",
        "ExpiredAuthenticationToken",
        "AuthenticationFailed",
    }
)
_QUOTA = re.compile(
    r"approved (?P<family>.+?) Cores quota.*?Location: (?P<location>[\w-]+).*?"
    r"Current Limit: (?P<limit>\d+).*?Current Usage: (?P<usage>\d+).*?"
    r"Additional Required: (?P<need>\d+)",
    re.S,
)
_ACTION = re.compile(r"perform action '(?P<action>[^']+)' over scope '(?P<scope>[^']+)'")


def audience(base_url: str | None) -> str:
    """The token audience for an ARM endpoint: the public cloud's unless another is given
    (a sovereign cloud, Azure Stack Hub, the tests' fake)."""
    return (base_url or PUBLIC_CLOUD).rstrip("/") + "/"


@dataclass(frozen=True)
class Api(Boundary):
    """The management clients of one subscription. ``call`` and ``wait`` translate errors;
    nothing else here does I/O. Thread-safe (the SDK's clients are)."""

    resource: ResourceManagementClient
    network: NetworkManagementClient
    compute: ComputeManagementClient
    subscription: str
    base_url: str
    credential: Any

    @classmethod
    def connect(
        cls,
        *,
        subscription: str,
        credential: Any,
        base_url: str | None,
        connection_verify: str | None,
        polling_interval: float,
    ) -> Api:
        """Clients for ``subscription``. ``credential`` None: ``DefaultAzureCredential``
        (environment, workload identity, managed identity, the Azure CLI's login...)."""
        compute = require("azure.mgmt.compute", feature="sky.Azure")
        network = require("azure.mgmt.network", feature="sky.Azure")
        resources = require("azure.mgmt.resource.resources", feature="sky.Azure")
        if credential is None:
            identity = require("azure.identity", feature="sky.Azure")
            credential = identity.DefaultAzureCredential()
        url = (base_url or PUBLIC_CLOUD).rstrip("/")
        options: dict[str, Any] = {
            "base_url": url,
            "credential_scopes": [audience(base_url) + ".default"],
            "polling_interval": polling_interval,
            # A few retries for a dropped connection or a 429/5xx, not the SDK's ten with
            # backoff: a start that cannot get through says so within a minute.
            "retry_total": 3,
        }
        if connection_verify is not None:
            options["connection_verify"] = connection_verify
        return cls(
            resource=resources.ResourceManagementClient(credential, subscription, **options),
            network=network.NetworkManagementClient(credential, subscription, **options),
            compute=compute.ComputeManagementClient(credential, subscription, **options),
            subscription=subscription,
            base_url=url,
            credential=credential,
        )

    def sign_in(self) -> None:
        """Ask for a token now: missing or expired credentials are said before anything
        is created (the clients would ask only with their first request)."""
        try:
            self.credential.get_token(audience(self.base_url) + ".default")
        except Exception as exc:
            raise translate(exc, "signing in to Azure") from exc

    def raised_by_sdk(self, exc: BaseException) -> bool:
        return is_sdk_error(exc)

    def translate(self, exc: BaseException, doing: str, request: Any) -> ProvisionError:
        return translate(exc, doing)

    def wait(
        self,
        operation: Callable[..., Any],
        doing: str,
        deadline: Deadline | None,
        /,
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Start a long-running operation (``begin_*``) and wait for its result, within
        ``deadline``, or without one ``timeout`` seconds (600 when not given). An operation
        left behind keeps running in Azure; whoever stopped waiting deletes what it made."""
        if deadline is not None:
            deadline.check(doing)  # a closed pool starts nothing more
        poller = self.call(operation, doing, *args, **kwargs)
        # Polled by the SDK's own thread; we look in short slices, so that our bound ends it.
        bound = deadline or Deadline(timeout or 600.0, f"{timeout or 600.0:g} s")
        poll(lambda: poller.done() or None, doing, bound, pause=0.02, most=_WAIT_SLICE)
        return self.call(poller.result, doing)


def is_sdk_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("azure.", "msrest"))


def failure_code(exc: BaseException | None) -> str:
    """The ARM error code behind an error (or its cause): ``"SkuNotAvailable"``, or ``""``."""
    code = cause(exc, lambda e: getattr(getattr(e, "error", None), "code", None) or None)
    return "" if code is None else str(code)


def _message(exc: BaseException) -> str:
    error = getattr(exc, "error", None)
    message = getattr(error, "message", None)
    return str(message or getattr(exc, "message", None) or exc).strip()


def translate(exc: BaseException, doing: str) -> ProvisionError:
    """A ``ProvisionError`` that says what went wrong in ``doing`` and what to do."""
    name = type(exc).__name__
    code = failure_code(exc)
    message = _message(exc)
    if name in ("ClientAuthenticationError", "CredentialUnavailableError"):
        return ProvisionError(
            f"{doing}: no usable Azure credentials ({message.splitlines()[0][:300]}). Run "
            f"`az login`, set AZURE_CLIENT_ID / AZURE_TENANT_ID / AZURE_CLIENT_SECRET, or pass "
            f"sky.Azure(credential=...)"
        )
    if name in ("ServiceRequestError", "ServiceRequestTimeoutError", "ServiceResponseError"):
        return REFUSALS.unreachable(doing, message)
    if code in _CREDENTIALS:
        return REFUSALS.credentials_refused(doing, f"{code}: {message}")
    if code == "AuthorizationFailed":
        found = _ACTION.search(message)
        where = f"on {found['scope'] if found else '?'}"
        return REFUSALS.denied(doing, found["action"] if found else "?", where, code)
    if code in _SPOT_QUOTA and "quota" in message.lower():
        found = _QUOTA.search(message)
        if found:
            return REFUSALS.quota(
                doing,
                f"'{found['family']}' vCPU quota",
                found["location"],
                limit=found["limit"],
                detail=f"{found['usage']} in use, {found['need']} more needed",
                ask="portal: Quotas > Compute, or `az quota update`",
                more=", or another location",
            )
        return ProvisionError(f"{doing}: a quota is too small ({code}: {message})")
    if code == "SkuNotAvailable":
        return ProvisionError(f"{doing}: this VM size is not available there now ({message})")
    if code in CAPACITY:
        return ProvisionError(f"{doing}: Azure has no capacity for it there now ({message})")
    if code in ("SubscriptionNotFound", "InvalidSubscriptionId"):
        return ProvisionError(
            f"{doing}: Azure does not know the subscription ({code}: {message}); check "
            f"sky.Azure(subscription_id=...) or AZURE_SUBSCRIPTION_ID"
        )
    if code in ("LocationNotAvailableForResourceType", "NoRegisteredProviderFound"):
        return ProvisionError(
            f"{doing}: the location is wrong or not enabled for it ({code}: {message}); "
            f"check sky.Azure(location=...)"
        )
    if code == "MissingSubscriptionRegistration":
        return ProvisionError(
            f"{doing}: a resource provider is not registered in the subscription ({message}). "
            f"Register it once: az provider register --namespace <the namespace named above>"
        )
    if code:
        return REFUSALS.said(doing, code, message)
    return ProvisionError(f"{doing}: {name}: {message}")
