"""The Compute Engine resources of one pool, made and unmade: two firewall rules, the instances.

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
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.base import TAG_POOL
from skyward.providers.cloud.boot import release_script
from skyward.providers.cloud.start import delete_each, unique_name
from skyward.providers.gcp.api import Api, is_not_found

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
