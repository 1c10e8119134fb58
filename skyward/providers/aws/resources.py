"""The EC2 resources of one pool, made and unmade: key pair, security group, instances.

::

    import_key_pair     the pool key's public half, tagged
    create_group        SSH from one CIDR only; everything from members of the same group
                        (and, for EFA, everything to them: EFA needs the egress rule too)
    create_placement    a cluster placement group, for multi-node pools on EFA types
    launch              one run_instances for every node: all or nothing, tagged, IMDSv2,
                        shutdown = terminate, root volume deleted with the instance
    wait_running        bounded by the pool's deadline; a node that dies on the way fails it
    delete              instances first (and wait), then security groups (retried while in
                        use), placement groups, key pairs; returns what is still there

Waits poll with ``Deadline.sleep``, never boto3's waiters, whose sleeps a closing pool could
not cut short.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.providers.aws.api import Api, error_code
from skyward.providers.cloud import api as cloud
from skyward.providers.cloud.start import unique_name

POLL = 2.0  # seconds between describe calls while waiting on EC2
_LIVE = ["pending", "running", "shutting-down", "stopping", "stopped"]


def aws_tags(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def tag_specs(tags: Mapping[str, str], *kinds: str) -> list[dict[str, Any]]:
    return [{"ResourceType": kind, "Tags": aws_tags(tags)} for kind in kinds]


def resource_name(pool: str) -> str:
    """A name for the pool's key pair and group: unique, in the characters AWS accepts."""
    return unique_name(pool, unsafe=r"[^A-Za-z0-9._-]", length=80)


def import_key_pair(api: Api, name: str, public_key: str, tags: Mapping[str, str]) -> None:
    api.call(
        api.ec2.import_key_pair,
        f"importing key pair {name}",
        KeyName=name,
        PublicKeyMaterial=public_key.encode(),
        TagSpecifications=tag_specs(tags, "key-pair"),
    )


def create_group(api: Api, name: str, vpc_id: str, tags: Mapping[str, str], on_created: Any) -> str:
    """The pool's security group; ``on_created(group_id)`` is called as soon as it exists,
    before its rules, so a failure while adding them still deletes it."""
    group = api.call(
        api.ec2.create_security_group,
        f"creating security group {name}",
        GroupName=name,
        Description="Skyward pool: SSH from the client only; all traffic within the pool",
        VpcId=vpc_id,
        TagSpecifications=tag_specs(tags, "security-group"),
    )["GroupId"]
    on_created(group)
    return str(group)


def allow(api: Api, group: str, ssh_cidrs: Sequence[str], tags: Mapping[str, str]) -> None:
    v4 = [{"CidrIp": c, "Description": "Skyward client"} for c in ssh_cidrs if ":" not in c]
    v6 = [{"CidrIpv6": c, "Description": "Skyward client"} for c in ssh_cidrs if ":" in c]
    api.call(
        api.ec2.authorize_security_group_ingress,
        f"opening SSH in security group {group}",
        GroupId=group,
        IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": v4, "Ipv6Ranges": v6},
            # The JAX coordinator, NCCL and gloo reach each other; nobody else does.
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]},
        ],
        TagSpecifications=tag_specs(tags, "security-group-rule"),
    )


def allow_efa(api: Api, group: str, tags: Mapping[str, str]) -> None:
    """EFA traffic must be allowed out to the group as well as in from it."""
    api.call(
        api.ec2.authorize_security_group_egress,
        f"allowing EFA traffic out of security group {group}",
        GroupId=group,
        IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}],
        TagSpecifications=tag_specs(tags, "security-group-rule"),
    )


def create_placement(api: Api, name: str, tags: Mapping[str, str], on_created: Any) -> str:
    """A cluster placement group (all instances close together on the network: what
    multi-node NCCL over EFA wants); ``on_created(name)`` as soon as it exists."""
    api.call(
        api.ec2.create_placement_group,
        f"creating placement group {name}",
        GroupName=name,
        Strategy="cluster",
        TagSpecifications=tag_specs(tags, "placement-group"),
    )
    on_created(name)
    return name


@dataclass(frozen=True)
class LaunchSpec:
    """Everything ``run_instances`` needs, kept so that a lost node is replaced alike."""

    instance_type: str
    image_id: str
    root_device: str
    disk_gb: int
    subnet_id: str
    zone: str
    security_group: str
    key_name: str
    user_data: str
    public_ip: bool
    spot: bool
    tags: Mapping[str, str]
    # A cluster placement group in this zone, EFA interfaces on this many network cards
    # (0: one ordinary interface), and an instance profile (ARN or name) for the nodes' role.
    placement_group: str | None = None
    efa_cards: int = 0
    iam_instance_profile: str | None = None


def interfaces(spec: LaunchSpec) -> list[dict[str, Any]]:
    """The network interfaces a node gets: one ENA interface, or an EFA interface on each
    network card the type has (device 0 on card 0, device 1 on the others, as AWS's EFA
    guide lays them out). A public address only fits a single interface."""
    common = {"SubnetId": spec.subnet_id, "Groups": [spec.security_group]}
    if not spec.efa_cards:
        return [
            {
                "DeviceIndex": 0,
                **common,
                "AssociatePublicIpAddress": spec.public_ip,
                "DeleteOnTermination": True,
            }
        ]
    made: list[dict[str, Any]] = []
    for card in range(spec.efa_cards):
        interface: dict[str, Any] = {
            "DeviceIndex": 0 if card == 0 else 1,
            "NetworkCardIndex": card,
            "InterfaceType": "efa",
            **common,
            "DeleteOnTermination": True,
        }
        if card == 0 and spec.efa_cards == 1:
            interface["AssociatePublicIpAddress"] = spec.public_ip
        made.append(interface)
    return made


def launch(api: Api, spec: LaunchSpec, count: int) -> list[str]:
    """Start ``count`` instances in one request, all or none; their ids, in launch order."""
    options: dict[str, Any] = {}
    if spec.spot:
        options["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            },
        }
    kinds = ["instance", "volume", "network-interface"]
    if spec.spot:
        kinds.append("spot-instances-request")
    if spec.placement_group is not None:
        options["Placement"] = {"GroupName": spec.placement_group, "AvailabilityZone": spec.zone}
    if spec.iam_instance_profile is not None:
        profile = spec.iam_instance_profile
        options["IamInstanceProfile"] = (
            {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
        )
    answer = api.call(
        api.ec2.run_instances,
        f"launching {count} {spec.instance_type} instance(s) in {spec.zone}",
        ImageId=spec.image_id,
        InstanceType=spec.instance_type,
        MinCount=count,
        MaxCount=count,
        KeyName=spec.key_name,
        UserData=spec.user_data,
        # A machine that powers itself off (the idle watchdog) is deleted, not kept.
        InstanceInitiatedShutdownBehavior="terminate",
        MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
        BlockDeviceMappings=[
            {
                "DeviceName": spec.root_device,
                "Ebs": {
                    "VolumeSize": spec.disk_gb,
                    "VolumeType": "gp3",
                    "DeleteOnTermination": True,
                },
            }
        ],
        NetworkInterfaces=cast(Any, interfaces(spec)),
        # Retries of this very request (a timeout) must not start a second set of machines.
        ClientToken=secrets.token_hex(16),
        TagSpecifications=tag_specs(spec.tags, *kinds),
        **options,
    )
    return [str(i["InstanceId"]) for i in answer["Instances"]]


def wait_running(
    api: Api, ids: Sequence[str], deadline: Deadline, *, public: bool, poll: float = POLL
) -> list[dict[str, Any]]:
    """Each instance once it runs and has its address (public or private), in ``ids``'
    order. One that ends on the way (spot capacity withdrawn) fails the wait, with why."""
    doing = f"waiting for {len(ids)} instance(s) to run"

    def probe() -> list[dict[str, Any]] | None:
        try:
            answer = api.call(api.ec2.describe_instances, doing, InstanceIds=list(ids))
        except ProvisionError as exc:
            if error_code(exc.__cause__) != "InvalidInstanceID.NotFound":
                raise
            answer = {"Reservations": []}  # just launched, not visible yet
        found = {i["InstanceId"]: i for r in answer["Reservations"] for i in r["Instances"]}
        for instance in found.values():
            state = instance["State"]["Name"]
            if state in ("shutting-down", "terminated", "stopping", "stopped"):
                raise ProvisionError(
                    f"{doing}: instance {instance['InstanceId']} is {state}: "
                    f"{describe_reason(instance)}"
                )
        ready = [found.get(i) for i in ids]
        address = "PublicIpAddress" if public else "PrivateIpAddress"
        if all(i is not None and i["State"]["Name"] == "running" and i.get(address) for i in ready):
            return [i for i in ready if i is not None]
        return None

    deadline.check(doing)
    return cloud.poll(probe, doing, deadline, pause=poll, most=poll)


def describe_reason(instance: Mapping[str, Any]) -> str:
    """Why an instance stopped, in words: EC2's state reason, spot interruptions named."""
    reason = instance.get("StateReason") or {}
    code = str(reason.get("Code", ""))
    if code.startswith("Server.SpotInstance"):
        return "reclaimed by AWS (spot interruption)"
    if code == "Client.InstanceInitiatedShutdown":
        return "it powered itself off (the idle watchdog, or a shutdown run on it)"
    if code == "Client.UserInitiatedShutdown":
        return "terminated through the API or the console"
    if code == "Server.InsufficientInstanceCapacity":
        return "AWS ran out of capacity for it while it started"
    message = reason.get("Message") or instance.get("StateTransitionReason") or "no reason given"
    return str(message)


@dataclass
class Swept:
    """What the sweeps found of one allocation, and the sweeps that failed (with why)."""

    instances: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    key_pairs: list[str] = field(default_factory=list)
    placement_groups: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def sweep(
    api: Api,
    *,
    key_name: str | None,
    tag: tuple[str, str] | None,
    placement_groups: bool = False,
) -> Swept:
    """Everything of one allocation that EC2 has, found two ways: instances launched with
    its key pair, and instances, groups and key pairs carrying its tag (``(key, value)``).
    Either finds what a launch whose answer never arrived made (interrupted in flight); the
    second also finds a group or key pair (or, with ``placement_groups``, a placement group)
    whose create call was cut off the same way. A sweep that fails is named in ``failed``,
    never dropped."""
    found = Swept()
    live: Any = {"Name": "instance-state-name", "Values": _LIVE}
    searches: list[tuple[str, list[Any]]] = []
    if key_name is not None:
        searches.append((f"key pair {key_name}", [{"Name": "key-name", "Values": [key_name]}]))
    if tag is not None:
        by_tag = [{"Name": f"tag:{tag[0]}", "Values": [tag[1]]}]
        searches.append((f"tag {tag[0]}={tag[1]}", by_tag))
    for label, filters in searches:
        try:
            answer = api.ec2.describe_instances(Filters=[*filters, live])
        except Exception as exc:
            found.failed.append(f"the search for instances by {label} failed ({_why(exc)})")
            continue
        for reservation in answer["Reservations"]:
            for instance in reservation["Instances"]:
                if instance["InstanceId"] not in found.instances:
                    found.instances.append(str(instance["InstanceId"]))
    if tag is not None:
        tagged: list[Any] = [{"Name": f"tag:{tag[0]}", "Values": [tag[1]]}]
        try:
            groups = api.ec2.describe_security_groups(Filters=tagged)["SecurityGroups"]
            found.groups += [str(g["GroupId"]) for g in groups]
        except Exception as exc:
            found.failed.append(f"the search for security groups by tag failed ({_why(exc)})")
        try:
            keys = api.ec2.describe_key_pairs(Filters=tagged)["KeyPairs"]
            found.key_pairs += [str(k["KeyName"]) for k in keys]
        except Exception as exc:
            found.failed.append(f"the search for key pairs by tag failed ({_why(exc)})")
        try:
            placed = (
                api.ec2.describe_placement_groups(Filters=tagged)["PlacementGroups"]
                if placement_groups
                else []
            )
            found.placement_groups += [str(g["GroupName"]) for g in placed]
        except Exception as exc:
            found.failed.append(f"the search for placement groups by tag failed ({_why(exc)})")
    return found


def _why(exc: BaseException) -> str:
    return error_code(exc) or f"{type(exc).__name__}: {exc}"


def delete(
    api: Api,
    *,
    instances: Sequence[str] = (),
    groups: Sequence[str] = (),
    key_pairs: Sequence[str] = (),
    placement_groups: Sequence[str] = (),
    timeout: float = 600.0,
    poll: float = POLL,
) -> list[str]:
    """Delete, in dependency order; what could not be deleted, as ``"kind id (why)"``."""
    left: list[str] = []
    end = time.monotonic() + timeout
    instances = _not_terminated(api, instances)
    if instances:
        asked = _terminate(api, instances, left)
        if asked:
            left += _wait_terminated(api, asked, end, poll)
    for group in groups:
        while True:
            try:
                api.ec2.delete_security_group(GroupId=group)
                break
            except Exception as exc:
                code = error_code(exc)
                if code == "InvalidGroup.NotFound":
                    break
                # In use until the instances' network interfaces are gone, a minute or so
                # after they terminate.
                if code == "DependencyViolation" and time.monotonic() + poll < end:
                    time.sleep(poll)
                    continue
                left.append(f"security group {group} ({code or exc})")
                break
    for name in placement_groups:
        try:
            api.ec2.delete_placement_group(GroupName=name)
        except Exception as exc:
            if error_code(exc) != "InvalidPlacementGroup.Unknown":
                left.append(f"placement group {name} ({error_code(exc) or exc})")
    for name in key_pairs:
        try:
            api.ec2.delete_key_pair(KeyName=name)
        except Exception as exc:
            if error_code(exc) != "InvalidKeyPair.NotFound":
                left.append(f"key pair {name} ({error_code(exc) or exc})")
    return left


def _not_terminated(api: Api, ids: Sequence[str]) -> list[str]:
    """``ids`` less those already terminated (terminating one again is an error on some
    endpoints); all of them if EC2 cannot be asked."""
    if not ids:
        return []
    try:
        answer = api.ec2.describe_instances(InstanceIds=list(ids))
    except Exception as exc:
        if error_code(exc) == "InvalidInstanceID.NotFound" and len(ids) > 1:
            return [i for one in ids for i in _not_terminated(api, [one])]
        return [] if error_code(exc) == "InvalidInstanceID.NotFound" else list(ids)
    ended = {
        i["InstanceId"]
        for r in answer["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] == "terminated"
    }
    return [i for i in ids if i not in ended]


def _terminate(api: Api, ids: Sequence[str], left: list[str]) -> list[str]:
    """Ask EC2 to terminate ``ids``; those it accepted. One unknown id fails a whole call,
    so after such a failure each is asked for alone."""
    for batch in ([list(ids)], [[i] for i in ids]):
        asked: list[str] = []
        for group in batch:
            try:
                api.call(api.ec2.terminate_instances, "terminating instances", InstanceIds=group)
                asked += group
            except ProvisionError as exc:
                if error_code(exc.__cause__) == "InvalidInstanceID.NotFound":
                    if len(group) > 1:
                        break  # try them one by one
                    continue  # gone already
                left += [f"instance {i} ({exc})" for i in group]
        else:
            return asked
    return []


def _wait_terminated(api: Api, ids: Sequence[str], end: float, poll: float) -> list[str]:
    while True:
        try:
            answer = api.ec2.describe_instances(InstanceIds=list(ids))
        except Exception as exc:
            if error_code(exc) == "InvalidInstanceID.NotFound":
                return []  # gone for good
            if time.monotonic() + poll >= end:
                return [f"instance {i} (could not check: {exc})" for i in ids]
            time.sleep(poll)
            continue
        described = [i for r in answer["Reservations"] for i in r["Instances"]]
        states = {i["InstanceId"]: i["State"]["Name"] for i in described}
        pending = [i for i in ids if states.get(i, "terminated") != "terminated"]
        if not pending:
            return []
        if time.monotonic() + poll >= end:
            return [f"instance {i} (still {states[i]})" for i in pending]
        time.sleep(poll)
