"""The boto3 boundary: clients, and every SDK error translated into one that says what to do.

Every EC2 and SSM call of the AWS provider goes through ``Api.call``, so no botocore error
crosses into skyward untranslated: missing or expired credentials, a missing IAM permission
(named as the IAM action), no capacity for a type in a zone (with the zones that offer it),
a vCPU quota (named, with its code in Service Quotas), an unknown AMI.

Through them, the EC2 resources of one pool are made and unmade: key pair, security group,
instances.

::

    import_key_pair     the pool key's public half, tagged
    create_group        SSH from one CIDR only; everything from members of the same group
                        (and, for EFA, everything to them: EFA needs the egress rule too)
    create_placement    a cluster placement group, for multi-node pools on EFA types
    launch              one run_instances for every node: all or nothing, tagged, IMDSv2,
                        shutdown = terminate, root volume deleted with the instance
    delete              instances first (and wait), then security groups (retried while in
                        use), placement groups, key pairs; returns what is still there

Waits poll with ``Deadline.sleep``, never boto3's waiters, whose sleeps a closing pool could
not cut short.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from skyward._errors import ProvisionError
from skyward.client.extras import require
from skyward.providers.cloud.api import Boundary, Refusals
from skyward.providers.cloud.start import unique_name

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ssm import SSMClient

POLICY_HINT = "the minimal IAM policy is in docs/providers.md (AWS)"

# vCPU quotas by instance family, as Service Quotas names them: (name, code).
_ON_DEMAND_QUOTAS = {
    "p": ("Running On-Demand P instances", "L-417A185B"),
    "g": ("Running On-Demand G and VT instances", "L-DB2E81BA"),
    "standard": ("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", "L-1216C47A"),
}
_SPOT_QUOTAS = {
    "p": ("All P Spot Instance Requests", "L-7212CCBC"),
    "g": ("All G and VT Spot Instance Requests", "L-3819A6DF"),
    "standard": ("All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests", "L-34B43A08"),
}
_CREDENTIALS = {
    "AuthFailure",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "UnrecognizedClientException",
}
_DENIED = {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "UnauthorizedAccess"}


@dataclass(frozen=True)
class Api(Boundary):
    """EC2 and SSM clients of one region. ``call`` translates errors; nothing else here does
    I/O. Thread-safe (boto3 clients are)."""

    ec2: EC2Client
    ssm: SSMClient
    region: str

    @staticmethod
    def session(*, region: str | None, profile: str | None) -> Any:
        """A boto3 session with a region; reads only the environment and ~/.aws."""
        boto3 = require("boto3", feature="sky.AWS")
        try:
            session = boto3.session.Session(profile_name=profile, region_name=region)
        except Exception as exc:
            raise translate(exc, "opening an AWS session", region or "") from exc
        if not session.region_name:
            raise ProvisionError(
                "no AWS region: pass sky.AWS(region='us-east-1'), set AWS_DEFAULT_REGION, or "
                "set a region in ~/.aws/config"
            )
        check_region(session)
        return session

    @classmethod
    def connect(cls, *, region: str | None, profile: str | None, endpoint_url: str | None) -> Api:
        session = cls.session(region=region, profile=profile)
        return cls.in_region(session, str(session.region_name), endpoint_url=endpoint_url)

    @classmethod
    def in_region(cls, session: Any, region: str, *, endpoint_url: str | None) -> Api:
        """Clients of ``region`` made from an existing session (cheap after the first: the
        session keeps botocore's models). Not thread-safe: make them one at a time."""
        from botocore.config import Config

        config = Config(
            retries={"mode": "standard", "max_attempts": 5},
            connect_timeout=10,
            read_timeout=60,
        )
        ec2 = session.client("ec2", region_name=region, endpoint_url=endpoint_url, config=config)
        ssm = session.client("ssm", region_name=region, endpoint_url=endpoint_url, config=config)
        return cls(ec2=ec2, ssm=ssm, region=region)

    def raised_by_sdk(self, exc: BaseException) -> bool:
        return _is_sdk_error(exc)

    def translate(self, exc: BaseException, doing: str, request: Any) -> ProvisionError:
        return translate(exc, doing, self.region, dict(request))

    def zones_offering(self, instance_type: str) -> list[str]:
        """The zones of this region that offer ``instance_type`` (empty if unknown)."""
        found = self.zones_offering_each([instance_type])
        return sorted(found.get(instance_type, set())) if found is not None else []

    def zones_offering_each(self, instance_types: list[str]) -> dict[str, set[str]] | None:
        """Per type, the zones of this region that offer it; ``None`` when EC2 cannot be
        asked (a missing permission): then the launch itself says where a type is missing."""
        found: dict[str, set[str]] = {t: set() for t in instance_types}
        try:
            pages = self.ec2.get_paginator("describe_instance_type_offerings").paginate(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": list(instance_types)}],
            )
            for page in pages:
                for offering in page["InstanceTypeOfferings"]:
                    found.setdefault(offering["InstanceType"], set()).add(offering["Location"])
        except Exception as exc:
            if _is_sdk_error(exc):
                return None
            raise
        return found

    def vpc_ranges(self, vpc: str) -> list[str]:
        """The address ranges of ``vpc`` (who may reach SSH from inside it)."""
        described = self.call(self.ec2.describe_vpcs, "reading the VPC", VpcIds=[vpc])["Vpcs"][0]
        return [str(a["CidrBlock"]) for a in described["CidrBlockAssociationSet"]]

    def efa_cards(self, instance_types: list[str]) -> dict[str, int]:
        """Per type that supports EFA, its number of network cards (an EFA interface goes
        on each); types without EFA are left out, and so is everything when EC2 cannot be
        asked (the pool then runs on plain interfaces)."""
        found: dict[str, int] = {}
        try:
            answer = self.ec2.describe_instance_types(InstanceTypes=cast(Any, instance_types))
        except Exception as exc:
            if _is_sdk_error(exc):
                return found
            raise
        for described in answer["InstanceTypes"]:
            network = described["NetworkInfo"]
            if network["EfaSupported"]:
                found[str(described["InstanceType"])] = int(network["MaximumNetworkCards"])
        return found

    def spot_prices(self, instance_types: list[str]) -> dict[tuple[str, str], float]:
        """The current spot price per (type, zone) for Linux; empty when EC2 cannot be asked
        (an estimate only: the launch does not depend on it)."""
        try:
            return self.spot_price_history(instance_types)
        except ProvisionError:
            return {}

    def spot_price_history(self, instance_types: list[str]) -> dict[tuple[str, str], float]:
        """The current spot price per (type, zone) for Linux; ``ProvisionError`` saying why
        when EC2 cannot be asked (no credentials, no network, a permission)."""
        import datetime

        answer = self.call(
            self.ec2.describe_spot_price_history,
            f"asking for the spot prices in {self.region}",
            InstanceTypes=cast(Any, instance_types),
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            StartTime=datetime.datetime.now(datetime.UTC),
        )
        prices: dict[tuple[str, str], float] = {}
        newest: dict[tuple[str, str], Any] = {}
        for entry in answer["SpotPriceHistory"]:
            key = (str(entry["InstanceType"]), str(entry["AvailabilityZone"]))
            if key not in newest or entry["Timestamp"] > newest[key]:
                newest[key] = entry["Timestamp"]
                prices[key] = float(entry["SpotPrice"])
        return prices


def known_regions(session: Any) -> set[str]:
    """Every EC2 region of every partition botocore knows (no network call)."""
    found: set[str] = set()
    for partition in session.get_available_partitions():
        found.update(session.get_available_regions("ec2", partition_name=partition))
    return found


NO_CREDENTIALS = (
    "no AWS credentials found. Run `aws configure` (or `aws sso login`), set AWS_PROFILE or "
    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or pass sky.AWS(profile='...')"
)


def check_credentials(session: Any, *, profile: str | None) -> None:
    """A ``ProvisionError`` naming what to set when boto3 finds no credentials: said when
    the pool is built, as a missing region is, not when it starts. Reads what boto3 reads
    (the environment, ~/.aws, an SSO cache, a credential process; on EC2 the instance's
    role), and makes no call to AWS itself."""
    try:
        credentials = session.get_credentials()
    except Exception as exc:
        if _is_sdk_error(exc):
            raise translate(exc, "reading the AWS credentials", str(session.region_name)) from exc
        raise
    if credentials is None:
        which = f" for profile {profile!r}" if profile else ""
        raise ProvisionError(NO_CREDENTIALS.replace("found", f"found{which}", 1))


def check_region(session: Any) -> None:
    """A ``ProvisionError`` for a region no partition has, naming the nearest ones: a typo
    must not read as a network failure later."""
    import difflib

    region = str(session.region_name)
    known = known_regions(session)
    if not known or region in known:
        return
    near = difflib.get_close_matches(region, sorted(known), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    import botocore

    raise ProvisionError(
        f"unknown AWS region {region!r}{hint} (botocore {botocore.__version__} knows "
        f"{len(known)} EC2 regions; a region newer than it needs a newer boto3)"
    )


# Refusals after which another zone, machine type or market may still take the pool (the
# spot quota among them: on-demand, which has its own, may still work).
REFUSALS = Refusals(
    cloud="AWS",
    renew="renew them (`aws sso login`, new keys) and try again",
    grant="Add {action} to its IAM policy",
    roles=POLICY_HINT,
    capacity=frozenset(
        {
            "InsufficientInstanceCapacity",
            "InsufficientHostCapacity",
            "InsufficientCapacityOnHost",
            "InsufficientReservedInstanceCapacity",
        }
    ),
    unsupported=frozenset({"Unsupported"}),
    spot=frozenset({"SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded", "VcpuLimitExceeded"}),
)


def error_code(exc: BaseException | None) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _is_sdk_error(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.startswith(("botocore", "boto3"))


def translate(
    exc: BaseException, doing: str, region: str, request: dict[str, Any] | None = None
) -> ProvisionError:
    """A ``ProvisionError`` that says what went wrong in ``doing`` and what to do about it."""
    name = type(exc).__name__
    code = error_code(exc)
    message = _message(exc)
    request = request or {}
    if not code and not isinstance(getattr(exc, "response", None), dict):
        return _without_response(exc, doing, region)
    if code in _CREDENTIALS:
        return REFUSALS.credentials_refused(doing, f"{code}: {message}")
    if code in _DENIED:
        return REFUSALS.denied(doing, iam_action(exc), f"in {region}", code)
    if code == "InsufficientInstanceCapacity":
        kind, zone = request.get("InstanceType", "?"), _zone(request, message)
        return ProvisionError(
            f"{doing}: AWS has no capacity for {kind} in {zone or region} right now "
            f"({message}). Try again later, another zone (subnet_id=...), another region, "
            f"spot={not _spot(request)}, or another accelerator"
        )
    if code == "Unsupported" and "InstanceType" in request:
        return ProvisionError(
            f"{doing}: {request['InstanceType']} is not offered where it was asked for "
            f"({message}); choose another subnet_id (zone) or region"
        )
    if code in ("VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"):
        kind = str(request.get("InstanceType", ""))
        quota, quota_code = quota_for(kind, spot=_spot(request) or code.startswith("MaxSpot"))
        return REFUSALS.quota(
            doing,
            f"vCPU quota '{quota}' ({quota_code})",
            region,
            detail=message.rstrip("."),
            ask=f"in the Service Quotas console: EC2, {quota_code}",
        )
    if code == "InvalidInstanceType":
        return ProvisionError(
            f"{doing}: EC2 has no instance type {request.get('InstanceTypes', ['?'])[0]!r} "
            f"in {region} ({message}); check sky.AWS(instance_type=...) for a typo, or leave "
            f"it out and pass accelerator=/vcpus=/memory_gb="
        )
    if code.startswith("InvalidAMIID"):
        return ProvisionError(
            f"{doing}: unknown AMI in {region} ({code}: {message}); AMIs are per region: "
            f"check sky.AWS(ami=...) or ami_parameter=..."
        )
    if code == "ParameterNotFound":
        return ProvisionError(
            f"{doing}: the SSM parameter {request.get('Name', '')!r} does not exist in "
            f"{region}; check sky.AWS(ami_parameter=...) or pass ami='ami-...'"
        )
    if code:
        return REFUSALS.said(doing, code, message)
    return ProvisionError(f"{doing}: {name}: {exc}")


# botocore errors raised before any answer came (no ``response``): what each means.
_NO_ANSWER = {
    "EndpointConnectionError": "cannot reach AWS",
    "ConnectTimeoutError": "cannot reach AWS (connecting timed out)",
    "ConnectionClosedError": "AWS closed the connection before answering",
    "ReadTimeoutError": "AWS did not answer in time",
    "ProxyConnectionError": "cannot reach AWS through the proxy",
    "SSLError": "the TLS connection to AWS failed",
    "ConnectionError": "the connection to AWS failed",
    "HTTPClientError": "the HTTP connection to AWS failed",
}


def _message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        text = response.get("Error", {}).get("Message", "")
        if text:
            return str(text)
    return str(exc)


def _without_response(exc: BaseException, doing: str, region: str) -> ProvisionError:
    """A botocore error raised before AWS answered (a connection closed, a timeout, a
    request botocore refused to send): what happened and what to do."""
    name = type(exc).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return ProvisionError(f"{doing}: {NO_CREDENTIALS}")
    if name == "ProfileNotFound":
        return ProvisionError(f"{doing}: {exc}; check sky.AWS(profile=...) and ~/.aws/config")
    if name == "NoRegionError":
        return ProvisionError(
            f"{doing}: no AWS region; pass sky.AWS(region='us-east-1') or set AWS_DEFAULT_REGION"
        )
    if name == "ResponseParserError":
        # An answer that is not EC2's XML: a proxy's or a broken endpoint's page. Its body
        # is not the user's to read; its title or first line says what it was.
        return ProvisionError(
            f"{doing}: the endpoint did not answer as EC2 does ({_gist(str(exc))}); check "
            f"sky.AWS(endpoint_url=...) or AWS_ENDPOINT_URL, a proxy (HTTPS_PROXY), and try "
            f"again"
        )
    if name == "ParamValidationError":
        return ProvisionError(
            f"{doing}: botocore refused the request before sending it ({exc}); this is a "
            f"Skyward bug: please report it with this message"
        )
    for kind, words in _NO_ANSWER.items():
        if any(c.__name__ == kind for c in type(exc).__mro__):
            return REFUSALS.unreachable(
                doing,
                f"{exc}; the request was retried",
                what=f"{words} in {region or 'the default region'}",
                check="the network, a proxy (HTTPS_PROXY) or sky.AWS(endpoint_url=...), "
                "and try again",
            )
    return ProvisionError(f"{doing}: {name}: {exc}")


def _gist(text: str) -> str:
    """A page's ``<title>``, else its first line: what an unexpected answer was."""
    title = re.search(r"<title>([^<]*)</title>", text, re.IGNORECASE)
    if title:
        return title.group(1).strip()
    return text.strip().splitlines()[0][:160] if text.strip() else "an empty answer"


def iam_action(exc: BaseException) -> str:
    """``ec2:RunInstances`` from the refused call, or from AWS's message when it names one."""
    message = _message(exc) if isinstance(getattr(exc, "response", None), dict) else ""
    named = re.search(r"\b(?:perform|to perform):?\s*([a-z0-9-]+:[A-Za-z0-9]+)", message)
    if named:
        return named.group(1)
    operation = getattr(exc, "operation_name", "") or "?"
    service = "ssm" if operation in ("GetParameter", "GetParameters") else "ec2"
    return f"{service}:{operation}"


def quota_for(instance_type: str, *, spot: bool) -> tuple[str, str]:
    family = instance_type[:1].lower()
    bucket = family if family in ("p", "g") else "standard"
    return (_SPOT_QUOTAS if spot else _ON_DEMAND_QUOTAS)[bucket]


def _spot(request: dict[str, Any]) -> bool:
    return bool(request.get("InstanceMarketOptions", {}).get("MarketType") == "spot")


def _zone(request: dict[str, Any], message: str) -> str:
    placement = request.get("Placement", {}).get("AvailabilityZone")
    if placement:
        return str(placement)
    found = re.search(r"\b([a-z]{2}-[a-z]+-\d[a-z])\b", message)
    return found.group(1) if found else ""


def spot_prices_in(region: str, types: list[str]) -> dict[tuple[str, str], float]:
    """EC2's current spot prices in ``region``, per (type, zone): the catalog's lookup
    (``skyward catalog --spot``), with boto3's usual credentials and endpoint;
    ``ProvisionError`` saying why when EC2 cannot be asked."""
    return Api.connect(region=region, profile=None, endpoint_url=None).spot_price_history(types)


# ── the pool's resources ──────────────────────────────────────────────────────────────────

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
