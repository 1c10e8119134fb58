"""``sky.AWS``: the options of a pool on EC2, checked when the pool is built, and the pool's
``AWSMachines`` (``machines.py``) with its API connected."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from pydantic import Field, model_validator

from skyward.providers.aws.api import Api, check_credentials
from skyward.providers.aws.inventory import AWSInventory
from skyward.providers.aws.machines import AWSMachines
from skyward.providers.base import Inventory, ProvisionRequest
from skyward.providers.cloud import catalog
from skyward.providers.cloud.catalog import Cloud
from skyward.providers.cloud.options import CloudOptions

# NVIDIA's open kernel modules, the only driver on those images, run Turing and newer GPUs
# only. These families have older ones (V100, M60, K80): the driver AWS offers for them is the
# proprietary one on the Amazon Linux 2 Deep Learning AMI (another login user, yum, no apt,
# an OS past its end of life), so they get no default image rather than one that boots and
# shows no GPU.
_PRE_TURING = ("p2.", "p3.", "p3dn.", "g3.", "g3s.")


class AWS(CloudOptions):
    """Run the pool's nodes on EC2 instances made for it, in one region.

    - ``region``: by default boto3's (``AWS_DEFAULT_REGION``, the profile's region).
    - ``instance_type``: wins over the pool's ``accelerator``, which otherwise picks it from
      the catalog (``"A100"`` is a p4d.24xlarge, 8 GPUs; with ``vcpus=``/``memory_gb=``, the
      cheapest machine of that kind that has them). A type smaller than the pool's
      ``vcpus``/``memory_gb`` is refused.
    - ``ami`` or ``ami_parameter`` (an SSM parameter holding an AMI id): by default AWS's Deep
      Learning Base OSS Nvidia Driver AMI for GPU machines, Canonical's Ubuntu for CPU ones,
      for the type's architecture (arm64 on Graviton). Types with GPUs older than Turing
      (V100) have no default: that driver does not run them.
    - ``spot``: spot instances (interruptible, cheaper): the default when the pool gives no
      ``allocation=`` (which is ``"on-demand"``, ``"spot"``, ``"spot-if-available"`` or
      ``"cheapest"``).
    - ``subnet_id`` / ``vpc_id``: where the instances go; by default the subnets of the
      region's default VPC, one per zone: the pool starts in the first zone that offers the
      type and has capacity (all nodes in one zone). ``subnet_id`` pins one zone.
    - ``ssh_cidr``: who may reach the SSH port. ``"auto"``: this machine's public address
      (asked of ``ip_lookup_url``), or with ``connect="private"`` the VPC's own range.
    - ``connect``: reach the nodes at their ``"public"`` or ``"private"`` address (from inside
      the VPC, a VPN, a peered network). Private instances get no public address.
    - ``username``: the image's login user. ``disk_gb``: the root volume.
    - ``iam_instance_profile``: an instance profile (ARN or name) the nodes run as, for S3
      (data, checkpoints); none by default. Skyward never creates one.
      ``instance_profile_arn`` is skyward 0.5's name for it (its ``"auto"`` is refused).
    - ``cluster_network``: multi-node pools on types with EFA get a cluster placement group
      (made for the pool, deleted with it) and EFA interfaces (on every network card with
      ``connect="private"``; on the first one with ``"public"``, which allows one interface).
      ``False`` asks for plain instances.
    - ``endpoint_url``, ``profile``: where boto3 sends its calls, and with which credentials.
    - ``idle_timeout``: a node with no SSH client for this long powers itself off and is
      deleted (the watchdog): a crashed client's machines do not run on.
    - ``boot_timeout``: how long SSH is retried while an instance boots.
    - ``release_timeout``: how long teardown waits for instances to end and groups to free.
    """

    cloud: ClassVar[Cloud] = "aws"
    machine_option: ClassVar[str] = "instance_type"
    ssh_rule: ClassVar[str] = "the security group"
    needs: ClassVar[tuple[str, ...]] = ("boto3",)

    region: str | None = Field(default=None, min_length=1)
    instance_type: str | None = Field(default=None, pattern=r"^[a-z0-9-]+\.[a-z0-9-]+$")
    ami: str | None = Field(default=None, pattern=r"^ami-[0-9a-f]{8,17}$")
    ami_parameter: str | None = Field(default=None, pattern=r"^/.+")
    subnet_id: str | None = Field(default=None, pattern=r"^subnet-[0-9a-f]+$")
    vpc_id: str | None = Field(default=None, pattern=r"^vpc-[0-9a-f]+$")
    username: str = Field(default="ubuntu", pattern=r"^[a-z_][a-z0-9_-]*$")
    disk_gb: int = Field(default=100, ge=8, le=16384)
    endpoint_url: str | None = None
    profile: str | None = Field(default=None, min_length=1)
    iam_instance_profile: str | None = Field(
        default=None, pattern=r"^(arn:aws[\w-]*:iam::.+|[\w+=,.@-]+)$"
    )
    cluster_network: bool = True
    # skyward 0.5's spelling of iam_instance_profile; moved there when the options are made,
    # so it always reads None here.
    instance_profile_arn: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _instance_profile_arn(cls, options: Any) -> Any:
        """``instance_profile_arn=ARN`` is ``iam_instance_profile=ARN``; ``"auto"`` (0.5 made
        a profile) is refused: Skyward never creates IAM roles."""
        if not isinstance(options, dict) or options.get("instance_profile_arn") is None:
            return options
        arn = options["instance_profile_arn"]
        if arn == "auto":
            raise ValueError(
                "instance_profile_arn='auto' asked skyward 0.5 to create an IAM role and "
                "instance profile; Skyward never creates IAM resources. Give an existing "
                "profile: AWS(iam_instance_profile='arn:aws:iam::<account>:instance-profile/"
                "<name>') (or its name)"
            )
        given = options.get("iam_instance_profile")
        if given is not None and given != arn:
            raise ValueError(
                f"instance_profile_arn={arn!r} contradicts iam_instance_profile={given!r}; "
                f"give one of them"
            )
        return {**options, "iam_instance_profile": arn, "instance_profile_arn": None}

    @model_validator(mode="after")
    def _one_image(self) -> AWS:
        if self.ami is not None and self.ami_parameter is not None:
            raise ValueError("give ami or ami_parameter, not both")
        return self

    def instance_type_for(self, accelerator: str | None) -> str:
        """The instance type a pool with ``accelerator`` gets (``ValueError`` if none)."""
        return self.instance_type or catalog.choose("aws", accelerator).type

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is touched."""
        super().check(request)
        # Reads only the environment and ~/.aws: an unknown profile, no region at all, or a
        # region no partition has is said now, not after the pool has started.
        session = Api.session(region=self.region, profile=self.profile)
        keyless = [v.bucket for v in request.volumes if not v.explicit_credentials]
        if keyless and self.iam_instance_profile is None:
            raise ValueError(
                f"the volume {keyless[0]} has no credentials, and the nodes run as no instance "
                f"profile: give AWS(iam_instance_profile=...) a profile that may read it, or "
                f"the Volume access_key_id= and secret_access_key="
            )
        machines = self.machines_for(request, session.region_name)
        if (
            self.ami is None
            and self.ami_parameter is None
            and machines
            and all(m.type.startswith(_PRE_TURING) for m in machines)
        ):
            raise ValueError(
                f"{machines[0].type} has GPUs older than Turing, which the default image's "
                f"driver (NVIDIA's open kernel modules) does not run: choose a newer "
                f"accelerator, or give ami=... / ami_parameter=... of an image with NVIDIA's "
                f"proprietary driver (and its login user with username=...)"
            )
        self.refuse_above(request, machines, [str(session.region_name)])
        # Last: what the request asks for is judged first, so a count AWS does not sell is
        # said on a machine that has no credentials yet, as on one that has them.
        check_credentials(session, profile=self.profile)

    def machines(self, request: ProvisionRequest) -> AWSMachines:
        api = Api.connect(region=self.region, profile=self.profile, endpoint_url=self.endpoint_url)
        endpoint = self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL", "")
        return AWSMachines(self, api, request.pool, endpoint)

    def inventory(self) -> Inventory | None:
        """This region's leftovers (``region=None``: every enabled region's)."""
        return AWSInventory(
            region=self.region,
            profile=self.profile,
            endpoint_url=self.endpoint_url,
            release_timeout=self.release_timeout,
        )
