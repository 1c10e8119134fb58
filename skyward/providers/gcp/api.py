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

Through them, the Compute Engine resources of one pool are made and unmade: two firewall
rules, the instances.

::

    Names(pool)       skyward-<pool>-<6 hex>: the network tag, and the prefix of the rules'
                      and the instances' names (GCE names: lower case, 63 characters)
    open_firewalls    TCP 22 from the client's networks to the tag; everything from the tag
                      to the tag (the JAX coordinator, NCCL); nothing else
    instance()        a node's Instance: labels, the tag, ``ssh-keys`` and ``user-data``
                      metadata, a boot disk deleted with it, spot with DELETE, GPUs with
                      on_host_maintenance=TERMINATE
    ended             why an instance stopped or vanished, from GCE's operations
    delete            instances (all asked at once, then waited for), then the rules; what
                      could not be deleted

Labels are GCE's (lower-case keys and values of 63 characters at most): the pool's tags
are mapped by ``label_value``. Firewall rules take no labels: they carry the tags, as JSON,
in their description, and are found by their ``skyward-`` name.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skyward._errors import ProvisionError
from skyward.client.extras import require
from skyward.client.futures import Deadline
from skyward.providers.base import TAG_POOL
from skyward.providers.cloud.api import Boundary, Refusals, cause, poll
from skyward.providers.cloud.boot import release_script
from skyward.providers.cloud.capacity import CapacityError
from skyward.providers.cloud.start import delete_each, unique_name

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
        return super().call(whole_read(operation, *args, **kwargs), doing)

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


def read_retry() -> Any:
    """Our retry of a read (Compute Engine's and Cloud TPU's alike): the transient answers
    only, a few times within 30 s, never the SDK's default."""
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


def whole_read(operation: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Callable[[], Any]:
    """A Google SDK read as one call: retried on 429/5xx for 30 s at most, with a timeout,
    and every page of a list read in it (a list pages lazily: its later pages would
    otherwise be fetched outside the caller's error translation)."""
    kwargs.setdefault("retry", read_retry())
    kwargs.setdefault("timeout", 60.0)

    def read() -> Any:
        result = operation(*args, **kwargs)
        return list(result) if hasattr(result, "pages") else result

    return read


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


# ── the pool's resources ──────────────────────────────────────────────────────────────────

GOOGLE_API = "https://compute.googleapis.com"
_DESCRIPTION = "Skyward pool "
TAGS_KEY = "skyward-tags"  # the metadata item that keeps an instance's tags as they are


def label_value(text: str) -> str:
    """A tag's value as a GCE label value: lower case; ``[a-z0-9_-]`` only; 63 at most."""
    return re.sub(r"[^a-z0-9_-]", "_", text.lower())[:63]


def labels(tags: Mapping[str, str]) -> dict[str, str]:
    return {label_value(key): label_value(value) for key, value in tags.items()}


def pool_filter(pool: str | None) -> str:
    """The list filter for one pool's instances, or for every Skyward instance."""
    if pool is None:
        return f"labels.{TAG_POOL}:*"
    return f'labels.{TAG_POOL} = "{label_value(pool)}"'


@dataclass(frozen=True)
class Names:
    """The names of one pool's things: unique per pool, valid GCE names."""

    base: str

    @classmethod
    def of(cls, pool: str) -> Names:
        return cls(unique_name(pool.lower(), unsafe=r"[^a-z0-9-]+", length=36))

    @property
    def tag(self) -> str:
        return self.base

    @property
    def instances(self) -> str:
        """The prefix of the instances' names: ``<base>-n0``, ``<base>-n1-r1``..."""
        return f"{self.base}-n"

    @property
    def ssh_rule(self) -> str:
        return f"{self.base}-ssh"

    @property
    def pool_rule(self) -> str:
        return f"{self.base}-pool"


def open_firewalls(
    api: Api,
    names: Names,
    *,
    network: str,
    ssh_cidrs: Sequence[str],
    tags: Mapping[str, str],
    deadline: Deadline,
    adopt: Any,
) -> None:
    """The pool's two rules; ``adopt(name)`` is called before each is asked for, so a rule
    whose answer is lost (Ctrl-C in flight) is still deleted."""
    from google.cloud import compute_v1

    description = _DESCRIPTION + json.dumps(dict(tags), sort_keys=True)
    rules = [
        compute_v1.Firewall(
            name=names.ssh_rule,
            description=description,
            network=f"global/networks/{network}",
            direction="INGRESS",
            allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
            source_ranges=list(ssh_cidrs),
            target_tags=[names.tag],
        ),
        compute_v1.Firewall(
            name=names.pool_rule,
            description=description,
            network=f"global/networks/{network}",
            direction="INGRESS",
            allowed=[compute_v1.Allowed(I_p_protocol="all")],
            source_tags=[names.tag],
            target_tags=[names.tag],
        ),
    ]
    started = []
    for rule in rules:
        adopt(rule.name)
        doing = f"creating firewall rule {rule.name}"
        operation = api.start(
            api.firewalls.insert, doing, project=api.project, firewall_resource=rule
        )
        started.append((operation, doing))
    for operation, doing in started:  # both at once: GCE takes seconds over each
        api.wait(operation, doing, deadline)


def tags_of_rule(rule: Any) -> dict[str, str] | None:
    """The tags a pool's rule carries in its description; ``None`` for another rule."""
    text = str(rule.description or "")
    if not text.startswith(_DESCRIPTION):
        return None
    try:
        found = json.loads(text[len(_DESCRIPTION) :])
    except ValueError:
        return None
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else None


def tags_of_instance(instance: Any) -> dict[str, str]:
    """The tags an instance was made with (its metadata), else its labels."""
    for item in instance.metadata.items:
        if item.key == TAGS_KEY:
            try:
                return {str(k): str(v) for k, v in json.loads(item.value).items()}
            except (ValueError, AttributeError):
                break
    return dict(instance.labels)


@dataclass(frozen=True)
class InstanceSpec:
    """Everything a node's ``Instance`` is made from, kept so a lost node is replaced alike."""

    machine_type: str
    attach: tuple[str, int] | None  # N1: (accelerator type, count)
    gpu: bool
    image: str  # the image's selfLink, resolved once for every node
    disk_gb: int
    network: str
    subnetwork: str | None
    tag: str
    labels: Mapping[str, str]
    metadata: Mapping[str, str]
    public: bool
    spot: bool
    service_account: str | None


def instance(spec: InstanceSpec, name: str, zone: str) -> Any:
    from google.cloud import compute_v1

    interface = compute_v1.NetworkInterface(network=f"global/networks/{spec.network}")
    if spec.subnetwork:
        region = zone.rsplit("-", 1)[0]
        interface.subnetwork = f"regions/{region}/subnetworks/{spec.subnetwork}"
    if spec.public:
        interface.access_configs = [
            compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")
        ]
    scheduling = compute_v1.Scheduling(
        # GPUs cannot live-migrate; spot VMs must not restart and are deleted when reclaimed.
        on_host_maintenance="TERMINATE" if spec.gpu or spec.spot else "MIGRATE",
        automatic_restart=not spec.spot,
    )
    if spec.spot:
        scheduling.provisioning_model = "SPOT"
        scheduling.instance_termination_action = "DELETE"
    made = compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{spec.machine_type}",
        labels=dict(spec.labels),
        tags=compute_v1.Tags(items=[spec.tag]),
        metadata=compute_v1.Metadata(
            items=[compute_v1.Items(key=k, value=v) for k, v in spec.metadata.items()]
        ),
        scheduling=scheduling,
        network_interfaces=[interface],
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=spec.image,
                    disk_size_gb=spec.disk_gb,
                    disk_type=f"zones/{zone}/diskTypes/{_disk_type(spec.machine_type)}",
                ),
            )
        ],
    )
    if spec.attach is not None:
        kind, count = spec.attach
        made.guest_accelerators = [
            compute_v1.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{kind}", accelerator_count=count
            )
        ]
    if spec.service_account:
        made.service_accounts = [
            compute_v1.ServiceAccount(email=spec.service_account, scopes=[SCOPE_COMPUTE])
        ]
    return made


SCOPE_COMPUTE = "https://www.googleapis.com/auth/compute"


def _disk_type(machine_type: str) -> str:
    # A3 Ultra (H200) machines take Hyperdisk only; every other catalog type takes pd-balanced.
    return "hyperdisk-balanced" if machine_type.startswith("a3-ultragpu") else "pd-balanced"


def self_delete_script(endpoint: str | None) -> str:
    """The watchdog's hook on a GCE machine (``boot.release_script``): delete this instance
    through the API before it powers off; a powered-off instance is kept, and its disk
    billed, until deleted. Needs the instance's service account and
    ``compute.instances.delete``; without them it says so and the machine only powers off."""
    api = (endpoint or GOOGLE_API).rstrip("/")
    return release_script(
        metadata="http://metadata.google.internal/computeMetadata/v1",
        header="Metadata-Flavor: Google",
        token="instance/service-accounts/default/token",
        find="project=$(metadata project/project-id)\n"
        "zone=$(metadata instance/zone)\n"
        "name=$(metadata instance/name)",
        steps=[
            (
                "DELETE",
                f"{api}/compute/v1/projects/$project/zones/${{zone##*/}}/instances/$name",
                "deleting $name",
            )
        ],
    )


def ended(api: Api, zone: str, name: str) -> str:
    """Why an instance stopped or vanished, in words, from the operations that ended it."""
    try:
        wanted = " OR ".join(
            f'(operationType = "{kind}")'
            for kind in (
                "compute.instances.preempted",
                "compute.instances.guestTerminate",
                "delete",
            )
        )
        operations = api.call(
            api.zone_operations.list,
            "reading operations",
            request={"project": api.project, "zone": zone, "filter": wanted},
        )
    except ProvisionError:
        return "no reason given (the operations could not be read)"
    kinds = {o.operation_type for o in operations if o.target_link.endswith(f"/instances/{name}")}
    if "compute.instances.preempted" in kinds:
        return "reclaimed by GCP (spot preemption)"
    if "compute.instances.guestTerminate" in kinds:
        return "it powered itself off (the idle watchdog, or a shutdown run on it)"
    if "delete" in kinds:
        return "deleted through the API or the console"
    return "no reason given"


def live(api: Api, pool: str | None) -> list[tuple[str, Any]]:
    """(zone, instance) for every instance labelled with ``pool`` (every pool's for None),
    in every zone of the project: one aggregated list."""
    request = {"project": api.project, "filter": pool_filter(pool)}
    return [
        (scope.rsplit("/", 1)[-1], instance)
        for scope, scoped in api.call(
            api.instances.aggregated_list, "listing instances", request=request
        )
        for instance in scoped.instances
    ]


def zones_of(api: Api, region: str) -> list[str]:
    """The zones of ``region``, sorted (``regions.get``)."""
    described = api.call(
        api.regions.get, f"reading region {region}", project=api.project, region=region
    )
    return sorted(z.rsplit("/", 1)[-1] for z in described.zones)


def delete(
    api: Api,
    *,
    instances: Sequence[tuple[str, str]] = (),
    firewalls: Sequence[str] = (),
    deadline: Deadline,
) -> list[str]:
    """Delete instances ((zone, name)) and firewall rules (GCE orders nothing between them):
    all at once, each waited for. What could not be deleted, as ``"kind name (why)"``;
    already gone counts as done."""

    def deleting(named: str, call: Any, **where: str) -> tuple[str, Callable[[], None]]:
        doing = f"deleting {named}"
        return named, lambda: api.run(call, doing, deadline, project=api.project, **where)

    deletions = [
        deleting(f"instance {name} in {zone}", api.instances.delete, zone=zone, instance=name)
        for zone, name in dict.fromkeys(instances)
    ]
    deletions += [
        deleting(f"firewall rule {r}", api.firewalls.delete, firewall=r) for r in firewalls
    ]
    return delete_each(deletions, gone=is_not_found)
