"""Helpers for the AWS tests: a provider pointed at moto, a request, a deadline that stops at a
named step (a Ctrl-C at that step, injected at skyward's own boundary), and what moto holds
for a pool."""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

import skyward as sky
from skyward.client.futures import Deadline
from skyward.providers.base import ProvisionRequest, identity_tags
from support.clouds.aws.fake import AMI_PARAMETER, MotoServer
from support.clouds.aws.standins import StandInCloud
from support.sshhosts import USER

LIVE = ["pending", "running", "shutting-down", "stopping", "stopped"]


def provider(moto: MotoServer, **options: Any) -> sky.AWS:
    """``sky.AWS`` against moto, with the seeded AMI parameter and a fixed SSH range (no
    public-address lookup), unless ``options`` say otherwise."""
    settings: dict[str, Any] = {
        "endpoint_url": moto.url,
        "region": moto.region,
        "ami_parameter": AMI_PARAMETER,
        "ssh_cidr": "10.123.0.0/16",
        "release_timeout": 30.0,
        **options,
    }
    return sky.AWS(**settings)


def standin_provider(cloud: StandInCloud, **options: Any) -> sky.AWS:
    """``sky.AWS`` for the stand-ins: their subnet, reached at private addresses, logging in
    as the test hosts' user."""
    settings: dict[str, Any] = {
        "subnet_id": cloud.subnet,
        "connect": "private",
        "username": USER,
        **options,
    }
    return provider(cloud.moto, **settings)


class Checkpoint(Deadline):
    """A deadline that, at the ``nth`` check whose step contains ``step`` (once ``when()`` holds,
    if given), calls ``reached`` (to look at moto mid-provision) and raises ``error``: a
    Ctrl-C, or a failure, exactly where the provider says it is."""

    def __init__(
        self,
        step: str,
        *,
        error: BaseException | None = None,
        nth: int = 1,
        reached: Callable[[], None] | None = None,
        when: Callable[[], bool] | None = None,
        seconds: float = 120.0,
    ) -> None:
        super().__init__(seconds, f"provision_timeout ({seconds:g} s)")
        self.step = step
        self.error = error if error is not None else KeyboardInterrupt()
        self.nth = nth
        self.seen = 0
        self.steps: list[str] = []
        self.reached = reached
        self.when = when

    def check(self, doing: str) -> None:
        self.steps.append(doing)
        if self.step in doing and (self.when is None or self.when()):
            self.seen += 1
            if self.seen == self.nth:
                if self.reached is not None:
                    self.reached()
                raise self.error
        super().check(doing)


def request(
    nodes: int = 2,
    *,
    accelerator: str | None = None,
    deadline: Deadline | None = None,
    image: sky.Image | None = None,
    pool: str | None = None,
) -> ProvisionRequest:
    name = pool or f"pool-{secrets.token_hex(3)}"
    return ProvisionRequest(
        pool=name,
        nodes=nodes,
        accelerator=accelerator,
        image=image or sky.Image(),
        tags=identity_tags(name),
        deadline=deadline or Deadline(120.0, "provision_timeout (120 s)"),
    )


def held(moto: MotoServer, pool: str) -> dict[str, list[str]]:
    """What moto still holds for ``pool``: live instances, security groups, key pairs,
    placement groups (those of moto's front: a test's own proxy keeps its own)."""
    ec2 = moto.client("ec2")
    tag = [{"Name": "tag:skyward-pool", "Values": [pool]}]
    instances = [
        i["InstanceId"]
        for r in ec2.describe_instances(
            Filters=[*tag, {"Name": "instance-state-name", "Values": LIVE}]
        )["Reservations"]
        for i in r["Instances"]
    ]
    groups = [g["GroupId"] for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]]
    keys = [k["KeyName"] for k in ec2.describe_key_pairs(Filters=tag)["KeyPairs"]]
    placed = ec2.describe_placement_groups(Filters=tag)["PlacementGroups"]
    return {
        "instances": instances,
        "security groups": groups,
        "key pairs": keys,
        "placement groups": [str(g["GroupName"]) for g in placed],
    }


def nothing(holdings: dict[str, list[str]]) -> bool:
    return not any(holdings.values())


def key_file_of(public: str, root: Path | None = None) -> Path | None:
    """The pool key file on this machine (under ``root``, default the temporary directory)
    whose public half is ``public``."""
    for candidate in (root or Path(tempfile.gettempdir())).glob("skyward-key-*/id_ed25519"):
        try:
            key = serialization.load_ssh_private_key(candidate.read_bytes(), password=None)
        except (OSError, ValueError):
            continue
        mine = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        if mine.decode() == public.strip():
            return candidate
    return None


def pool_key_of(moto: MotoServer, pool: str, root: Path | None = None) -> Path | None:
    """The pool key file on this machine behind ``pool``'s key pair in moto."""
    ec2 = moto.client("ec2")
    tag = [{"Name": "tag:skyward-pool", "Values": [pool]}]
    keys = ec2.describe_key_pairs(Filters=tag, IncludePublicKey=True)["KeyPairs"]
    return key_file_of(keys[0]["PublicKey"], root) if keys else None
