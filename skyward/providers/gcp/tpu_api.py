"""The google-cloud-tpu boundary (``tpu_v2``, REST): one project's TPU client, its calls
with our own deadlines and retries, its operations polled on our endpoint, and its errors in
words that say what to do. Imported only when a pool asks for a TPU type.

The Compute Engine traps (TESTBED.md) hold here too, and are avoided the same way: a
long-running operation is polled with ``get_operation`` on this client (never
``operation.result()``, whose operations client was not built with our endpoint), its
``error`` is read from the operation itself, and reads get a bounded retry, never the SDK's
defaults.

::

    TpuApi.connect(project, credentials, endpoint)   the client (tpu_endpoint= or Google's)
    call / start / wait                              a read (retried 30 s), a change (not
                                                     retried), an operation polled to its end
    queued_resource(...)                             the QueuedResource body: one slice
                                                     (node_id) or k slices (multisliceParams),
                                                     spot, and the queue's validity bound
    failure(...)                                     a refusal in our words: no capacity
                                                     (``CapacityError``), a quota, a missing
                                                     permission, the API not enabled, an
                                                     unknown runtime version
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skyward._errors import ProvisionError
from skyward.client.extras import require
from skyward.client.futures import Deadline
from skyward.providers.cloud.api import Boundary, Refusals, poll
from skyward.providers.cloud.capacity import CapacityError
from skyward.providers.cloud.start import delete_each
from skyward.providers.gcp.api import (
    ROLES_HINT,
    TAGS_KEY,
    is_not_found,
    status_of,
    whole_read,
)

GOOGLE_TPU_API = "https://tpu.googleapis.com"
SCOPE_CLOUD = "https://www.googleapis.com/auth/cloud-platform"
REFUSALS = Refusals(
    cloud="Cloud TPU",
    identity="Google",
    renew="renew them (`gcloud auth application-default login`) or check "
    "GOOGLE_APPLICATION_CREDENTIALS",
    grant="Grant a role that has {action} (roles/tpu.admin has every TPU permission)",
    roles=ROLES_HINT,
)
# google.rpc.Code -> HTTP status, for errors read from an operation or a queued resource.
HTTP_OF_RPC = {3: 400, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400, 10: 409, 13: 500, 14: 503, 16: 401}
_STOCKOUT = re.compile(
    r"no more capacity|stockout|insufficient capacity|resource[_ ]pool[_ ]exhausted|"
    r"not enough resources|capacity is not available",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class TpuApi(Boundary):
    """The Cloud TPU client of one project, at one endpoint. Thread-safe (the client is)."""

    project: str
    endpoint: str | None
    client: Any

    @classmethod
    def connect(cls, *, project: str, credentials: Any, endpoint: str | None) -> TpuApi:
        tpu = require("google.cloud.tpu_v2", feature="a TPU pool on sky.GCP")
        from google.api_core.client_options import ClientOptions

        # An endpoint with its scheme keeps it (http for a local fake); without, https.
        options = ClientOptions(api_endpoint=endpoint) if endpoint else None
        client = tpu.TpuClient(credentials=credentials, client_options=options, transport="rest")
        return cls(project=project, endpoint=endpoint, client=client)

    def parent(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    def call(self, operation: Callable[..., Any], doing: str, /, *args: Any, **kwargs: Any) -> Any:
        """A read (``get``, ``list``): retried on 429/5xx for 30 s at most, then translated."""
        return super().call(whole_read(operation, *args, **kwargs), doing)

    def start(self, operation: Callable[..., Any], doing: str, /, **kwargs: Any) -> str:
        """Ask for a change; the name of its operation. Not retried: a create that timed out
        may have happened (the caller deletes by name)."""
        started = super().call(operation, doing, retry=None, timeout=60.0, **kwargs)
        return str(started.operation.name)

    def wait(self, name: str, doing: str, deadline: Deadline) -> None:
        """Poll operation ``name`` on this endpoint until it is done; raise its error."""

        def probe() -> Any:
            found = self.call(self.client.get_operation, doing, request={"name": name})
            return found if found.done else None

        done = poll(probe, doing, deadline)
        if done.HasField("error") and done.error.code:
            raise failure(
                doing,
                self.project,
                status=HTTP_OF_RPC.get(done.error.code, 500),
                message=done.error.message,
            )

    def translate(self, exc: BaseException, doing: str, request: Any) -> ProvisionError:
        name = type(exc).__name__
        if name in ("RefreshError", "DefaultCredentialsError", "TransportError"):
            return REFUSALS.credentials_refused(doing, f"could not refresh them: {exc}")
        if name in ("ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout"):
            return REFUSALS.unreachable(doing, str(exc))
        status = getattr(exc, "code", None)
        if not isinstance(status, int):
            return ProvisionError(f"{doing}: {name}: {exc}")
        message = str(getattr(exc, "message", "") or exc)
        return failure(doing, self.project, status=status, message=message, reason=_reason(exc))


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason) if reason else ""


def failure(
    doing: str, project: str, *, status: int, message: str, reason: str = ""
) -> ProvisionError:
    """The error for a refusal of Cloud TPU (HTTP status, Google's message)."""
    if _STOCKOUT.search(message):
        return CapacityError(f"{doing}: no TPU capacity there right now ({message})")
    if "is not available in zone" in message or "not offered in" in message:
        return CapacityError(f"{doing}: not offered there ({message})", refusal="unsupported")
    if "quota" in message.lower():
        named = re.search(r"[Qq]uota (?:limit |metric )?'?([A-Za-z0-9_./-]+)'?", message)
        what = f"Cloud TPU quota {named.group(1)}" if named else "Cloud TPU quota"
        ask = "in the console: IAM & Admin > Quotas, service Cloud TPU API"
        return REFUSALS.quota(doing, what, "this zone", detail=message, ask=ask)
    if reason == "SERVICE_DISABLED" or "has not been used" in message or "is disabled" in message:
        return ProvisionError(
            f"{doing}: the Cloud TPU API is not enabled in project {project}. Enable it: "
            f"gcloud services enable tpu.googleapis.com --project {project}"
        )
    if "runtime" in message.lower() and status in (400, 404):
        return ProvisionError(
            f"{doing}: Cloud TPU does not know that runtime version ({message}). Pass "
            f"sky.GCP(tpu_runtime=...) with one of `gcloud compute tpus versions list "
            f"--zone ZONE`, or leave it out for the generation's default"
        )
    permission = re.search(r"'((?:tpu|compute|iam)\.[A-Za-z.]+)'", message)
    if status == 403 and permission:
        return REFUSALS.denied(doing, permission.group(1), f"in project {project}")
    if status == 401:
        return REFUSALS.credentials_refused(doing, message)
    return REFUSALS.said(doing, str(status), message)


# ── the pool's slices ───────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class SliceSpec:
    """Everything a pool's slices are made from, kept so a lost slice is made again alike."""

    accelerator_type: str
    runtime: str
    network: str
    subnetwork: str | None
    public: bool
    tag: str
    labels: Mapping[str, str]
    metadata: Mapping[str, str]
    service_account: str | None


def queued_resource(
    api: TpuApi,
    spec: SliceSpec,
    *,
    zone: str,
    node_id: str,
    slices: int,
    spot: bool,
    valid_for: float,
) -> Any:
    """A QueuedResource of ``slices`` slices of ``spec`` in ``zone``: ``node_id`` names the
    one slice, or prefixes the k slices of a multislice (``<node_id>-0``, ``-1``...); the
    queue gives up after ``valid_for`` seconds (the pool's provision deadline)."""
    from google.cloud import tpu_v2

    network = tpu_v2.NetworkConfig(
        network=f"projects/{api.project}/global/networks/{spec.network}",
        enable_external_ips=spec.public,
    )
    if spec.subnetwork:
        region = zone.rsplit("-", 1)[0]
        network.subnetwork = (
            f"projects/{api.project}/regions/{region}/subnetworks/{spec.subnetwork}"
        )
    node = tpu_v2.Node(
        accelerator_type=spec.accelerator_type,
        runtime_version=spec.runtime,
        network_config=network,
        tags=[spec.tag],
        labels=dict(spec.labels),
        metadata=dict(spec.metadata),
        scheduling_config=tpu_v2.SchedulingConfig(spot=spot),
    )
    if spec.service_account:
        node.service_account = tpu_v2.ServiceAccount(
            email=spec.service_account, scope=[SCOPE_CLOUD]
        )
    node_spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=api.parent(zone), node=node)
    if slices == 1:
        node_spec.node_id = node_id
    else:
        node_spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
            node_count=slices, node_id_prefix=node_id
        )
    made = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[node_spec]),
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration={"seconds": max(60, int(valid_for))}
        ),
    )
    if spot:
        made.spot = tpu_v2.QueuedResource.Spot()
    return made


def delete_queued(api: TpuApi, queued: Sequence[tuple[str, str]], deadline: Deadline) -> list[str]:
    """Delete queued resources ((zone, id)) with ``force`` (their nodes go with them), all
    at once, each waited for within ``deadline`` (``Deadline(0)``: not waited for). What
    could not be deleted, as ``"queued resource ID in ZONE (why)"``; gone counts as done."""

    def deleting(zone: str, name: str) -> tuple[str, Callable[[], None]]:
        doing = f"deleting queued resource {name} in {zone}"
        request = {"name": f"{api.parent(zone)}/queuedResources/{name}", "force": True}

        def run() -> None:
            operation = api.start(api.client.delete_queued_resource, doing, request=request)
            if deadline.remaining() > 0:
                api.wait(operation, doing, deadline)

        return f"queued resource {name} in {zone}", run

    deletions = [deleting(zone, name) for zone, name in dict.fromkeys(queued)]
    return delete_each(deletions, gone=is_not_found)


def live_queued(api: TpuApi, zones: Sequence[str]) -> list[tuple[str, Any]]:
    """(zone, queued resource) for every queued resource of the project in ``zones`` (the
    TPU zones: queued resources carry no labels, and are listed zone by zone)."""
    found = []
    for zone in zones:
        doing = f"listing queued resources in {zone}"
        try:
            listed = api.call(api.client.list_queued_resources, doing, parent=api.parent(zone))
        except ProvisionError as exc:
            if status_of(exc) in (400, 404):  # a zone this project cannot use
                continue
            raise
        found += [(zone, q) for q in listed]
    return found


def tags_of_queued(queued: Any) -> dict[str, str] | None:
    """The tags a pool's queued resource carries (its node's metadata); ``None``: not ours."""
    for spec in queued.tpu.node_spec:
        text = spec.node.metadata.get(TAGS_KEY)
        if text:
            try:
                found = json.loads(text)
            except ValueError:
                return None
            return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else None
    return None


def slice_names(node_id: str, slices: int) -> list[str]:
    """The node ids a queued resource makes: ``node_id`` itself, or Google's multislice
    names ``<prefix>-0`` .. ``<prefix>-<k-1>``."""
    return [node_id] if slices == 1 else [f"{node_id}-{i}" for i in range(slices)]


def self_delete_script(endpoint: str | None) -> str:
    """The watchdog's hook on a TPU VM (``boot.release_script``): delete this slice's queued
    resource, with ``force`` (its nodes go with it), through the API before the host powers
    off; a stopped TPU still holds its capacity and is billed. Needs the node's service
    account with ``tpu.queuedResources.delete``; without it the host says so and only
    powers off (``skyward down`` removes the slice)."""
    from skyward.providers.cloud.boot import release_script

    api = (endpoint or GOOGLE_TPU_API).rstrip("/")
    return release_script(
        metadata="http://metadata.google.internal/computeMetadata/v1",
        header="Metadata-Flavor: Google",
        token="instance/service-accounts/default/token",
        find="project=$(metadata project/project-id)\n"
        "zone=$(metadata instance/zone)\n"
        f"queued=$(metadata instance/attributes/{QUEUED_KEY})",
        steps=[
            (
                "DELETE",
                f"{api}/v2/projects/$project/locations/${{zone##*/}}/queuedResources/$queued"
                "?force=true",
                "deleting queued resource $queued",
            )
        ],
    )


QUEUED_KEY = "skyward-queued-resource"  # the node metadata item naming its queued resource
