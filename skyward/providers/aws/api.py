"""The boto3 boundary: clients, and every SDK error translated into one that says what to do.

Every EC2 and SSM call of the AWS provider goes through ``Api.call``, so no botocore error
crosses into skyward untranslated: missing or expired credentials, a missing IAM permission
(named as the IAM action), no capacity for a type in a zone (with the zones that offer it),
a vCPU quota (named, with its code in Service Quotas), an unknown AMI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from skyward._errors import ProvisionError
from skyward.client.extras import require
from skyward.providers.cloud.api import Boundary, Refusals

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
        import datetime

        prices: dict[tuple[str, str], float] = {}
        try:
            answer = self.ec2.describe_spot_price_history(
                InstanceTypes=cast(Any, instance_types),
                ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                StartTime=datetime.datetime.now(datetime.UTC),
            )
        except Exception as exc:
            if _is_sdk_error(exc):
                return prices
            raise
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
    (``skyward catalog --spot``), with boto3's usual credentials and endpoint."""
    return Api.connect(region=region, profile=None, endpoint_url=None).spot_prices(types)
