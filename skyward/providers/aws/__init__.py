"""``AWS(...)``: nodes are EC2 instances that the pool creates and always destroys.

::

    provision   per pool: the pool's own SSH key → a key pair → a security group (SSH from
                ssh_cidr only, all traffic within the group) → one run_instances for every
                node (user data: the host key we made, the idle watchdog) → wait running →
                reach each node over SSH with that host key pinned, retrying while it boots
                (``_hosts``: bootstrap, upload skyward, workers)
    terminate   close the nodes → terminate the instances and wait → delete the group
                (retried while in use) → delete the key pair; what is left is named, with
                ``skyward down --pool NAME``
    inventory   everything tagged skyward-pool in the region (``skyward ls`` / ``down``)

Every resource carries the pool's tags. boto3 is imported only when a pool uses AWS; the
calls and their error messages live in ``api``, the resources in ``resources``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import threading
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skyward._errors import HostKeyError, ProvisionError
from skyward._extras import check
from skyward._phases import Phase, Reporter
from skyward.providers import catalog
from skyward.providers.aws import resources as ec2
from skyward.providers.aws.allocation import AWSAllocation
from skyward.providers.aws.api import Api, error_code
from skyward.providers.aws.inventory import AWSInventory
from skyward.providers.base import Allocation, Inventory, ProvisionRequest
from skyward.providers.cloud import (
    DEFAULT_IP_LOOKUP,
    HostKey,
    WatchedDeadline,
    client_cidr,
    open_or_destroy,
    user_data,
)
from skyward.providers.ssh.connection import PoolKey
from skyward.providers.ssh.hosts import Access, HostNode, open_hosts

# AWS's public SSM parameters for the newest images, by the machine's architecture: the Deep
# Learning Base AMI with NVIDIA's open driver for GPU machines, Canonical's Ubuntu for CPU
# ones (all Ubuntu 24.04, login user "ubuntu", cloud-init at boot, /usr/bin/python3 = 3.12).
_DLAMI = "/aws/service/deeplearning/ami/{}/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
_UBUNTU = "/aws/service/canonical/ubuntu/server/24.04/stable/current/{}/hvm/ebs-gp3/ami-id"
GPU_AMI_PARAMETERS = {"x86_64": _DLAMI.format("x86_64"), "arm64": _DLAMI.format("arm64")}
CPU_AMI_PARAMETERS = {"x86_64": _UBUNTU.format("amd64"), "arm64": _UBUNTU.format("arm64")}
# NVIDIA's open kernel modules, the only driver on those images, run Turing and newer GPUs
# only. These families have older ones (V100, M60, K80): the driver AWS offers for them is the
# proprietary one on the Amazon Linux 2 Deep Learning AMI (another login user, yum, no apt,
# an OS past its end of life), so they get no default image rather than one that boots and
# shows no GPU.
_PRE_TURING = ("p2.", "p3.", "p3dn.", "g3.", "g3s.")
_MAX_SECONDS = 7 * 24 * 3600.0


class AWS(BaseModel):
    """Run the pool's nodes on EC2 instances made for it, in one region.

    - ``region``: by default boto3's (``AWS_DEFAULT_REGION``, the profile's region).
    - ``instance_type``: wins over the pool's ``accelerator``, which otherwise picks it from
      the catalog (``"A100"`` is a p4d.24xlarge, 8 GPUs).
    - ``ami`` or ``ami_parameter`` (an SSM parameter holding an AMI id): by default AWS's Deep
      Learning Base OSS Nvidia Driver AMI for GPU machines, Canonical's Ubuntu for CPU ones,
      for the type's architecture (arm64 on Graviton). Types with GPUs older than Turing
      (V100) have no default: that driver does not run them.
    - ``spot``: spot instances (interruptible, cheaper).
    - ``subnet_id`` / ``vpc_id``: where the instances go; by default a subnet of the region's
      default VPC in a zone that offers the instance type.
    - ``ssh_cidr``: who may reach the SSH port. ``"auto"``: this machine's public address
      (asked of ``ip_lookup_url``), or with ``connect="private"`` the VPC's own range.
    - ``connect``: reach the nodes at their ``"public"`` or ``"private"`` address (from inside
      the VPC, a VPN, a peered network). Private instances get no public address.
    - ``username``: the image's login user. ``disk_gb``: the root volume.
    - ``endpoint_url``, ``profile``: where boto3 sends its calls, and with which credentials.
    - ``idle_timeout``: a node with no SSH client for this long powers itself off and is
      deleted (the watchdog): a crashed client's machines do not run on.
    - ``boot_timeout``: how long SSH is retried while an instance boots.
    - ``release_timeout``: how long teardown waits for instances to end and groups to free.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    region: str | None = Field(default=None, min_length=1)
    instance_type: str | None = Field(default=None, pattern=r"^[a-z0-9-]+\.[a-z0-9-]+$")
    ami: str | None = Field(default=None, pattern=r"^ami-[0-9a-f]{8,17}$")
    ami_parameter: str | None = Field(default=None, pattern=r"^/.+")
    spot: bool = False
    subnet_id: str | None = Field(default=None, pattern=r"^subnet-[0-9a-f]+$")
    vpc_id: str | None = Field(default=None, pattern=r"^vpc-[0-9a-f]+$")
    ssh_cidr: str = "auto"
    connect: Literal["public", "private"] = "public"
    username: str = Field(default="ubuntu", pattern=r"^[a-z_][a-z0-9_-]*$")
    disk_gb: int = Field(default=100, ge=8, le=16384)
    endpoint_url: str | None = None
    profile: str | None = Field(default=None, min_length=1)
    idle_timeout: float = Field(default=1800.0, gt=0, le=_MAX_SECONDS)
    boot_timeout: float = Field(default=600.0, gt=0, le=_MAX_SECONDS)
    release_timeout: float = Field(default=600.0, gt=0, le=_MAX_SECONDS)
    ip_lookup_url: str = DEFAULT_IP_LOOKUP
    python: str | None = Field(default=None, min_length=1)
    workdir: str = Field(default="~/.cache/skyward", pattern=r"^(/|~/|~$)")

    @field_validator("ssh_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        if value == "auto":
            return value
        try:
            return str(ipaddress.ip_network(value, strict=False))
        except ValueError as exc:
            message = "ssh_cidr must be 'auto' or a network such as '203.0.113.7/32'"
            raise ValueError(message) from exc

    @model_validator(mode="after")
    def _one_image(self) -> AWS:
        if self.ami is not None and self.ami_parameter is not None:
            raise ValueError("give ami or ami_parameter, not both")
        return self

    @property
    def kind(self) -> str:
        return "aws"

    def instance_type_for(self, accelerator: str | None) -> str:
        """The instance type a pool with ``accelerator`` gets (``ValueError`` if none)."""
        return self.instance_type or catalog.choose("aws", accelerator).type

    def check(self, request: ProvisionRequest) -> None:
        """Called when the pool is built, before anything is touched."""
        check("boto3", feature="sky.AWS")
        check("paramiko", feature="sky.AWS")
        instance_type = self.instance_type_for(request.accelerator)
        if (
            self.ami is None
            and self.ami_parameter is None
            and instance_type.startswith(_PRE_TURING)
        ):
            raise ValueError(
                f"{instance_type} has GPUs older than Turing, which the default image's driver "
                f"(NVIDIA's open kernel modules) does not run: choose a newer accelerator, or "
                f"give ami=... / ami_parameter=... of an image with NVIDIA's proprietary driver "
                f"(and its login user with username=...)"
            )
        # Reads only the environment and ~/.aws: an unknown profile or no region at all is
        # said now, not after the pool has started.
        Api.session(region=self.region, profile=self.profile)

    def provision(self, request: ProvisionRequest, reporter: Reporter) -> Allocation:
        self.check(request)
        api = Api.connect(region=self.region, profile=self.profile, endpoint_url=self.endpoint_url)
        allocation = AWSAllocation(
            api,
            request,
            connect=self.connect,
            username=self.username,
            release_timeout=self.release_timeout,
        )
        return open_or_destroy(allocation, lambda made: self._build(made, reporter))

    def inventory(self) -> Inventory | None:
        return AWSInventory(
            region=self.region,
            profile=self.profile,
            endpoint_url=self.endpoint_url,
            release_timeout=self.release_timeout,
        )

    # ── the steps ──────────────────────────────────────────────────────────────────────

    def _build(self, made: AWSAllocation, reporter: Reporter) -> None:
        request, api, deadline = made.request, made.api, made.request.deadline
        instance_type = self.instance_type_for(request.accelerator)
        for rank in range(request.nodes):
            reporter.phase(rank, "provisioning", f"{instance_type} in {api.region}")
        deadline.check("finding the image")
        architecture, gpus = _machine(api, instance_type)
        image, root_device, snapshot_gb = self._image(api, instance_type, architecture, gpus)
        if snapshot_gb > self.disk_gb:
            raise ProvisionError(
                f"disk_gb={self.disk_gb} is smaller than the image's root snapshot "
                f"({snapshot_gb} GB of {image}); ask for at least {snapshot_gb}"
            )
        deadline.check("finding the network")
        vpc, subnet, zone = self._network(api, instance_type)
        cidrs = self._ssh_cidrs(api, vpc)
        deadline.check("importing the key pair")
        key = PoolKey()
        made.adopt_pool_key(key)
        name = ec2.resource_name(request.pool)
        tags = {**request.tags, "Name": f"skyward {request.pool}"}
        ec2.import_key_pair(api, name, key.public, tags)
        made.adopt_key_pair(name)
        reporter.status(f"key pair {name}")
        deadline.check("creating the security group")
        group = ec2.create_group(api, name, vpc, tags, made.adopt_group)
        ec2.allow(api, group, cidrs, tags)
        reporter.status(f"security group {group}: SSH from {', '.join(cidrs)}")
        host_key = HostKey.generate()
        made.host_key = host_key.public
        made.access = Access(
            key_file=key.path,
            python=self.python,
            workdir=self.workdir,
            boot_timeout=self.boot_timeout,
            gpus=gpus or None,
            machine_type=instance_type,
        )
        made.spec = ec2.LaunchSpec(
            instance_type=instance_type,
            image_id=image,
            root_device=root_device,
            disk_gb=self.disk_gb,
            subnet_id=subnet,
            zone=zone,
            security_group=group,
            key_name=name,
            user_data=user_data(
                host_key=host_key,
                authorized_key=key.public,
                idle_timeout=self.idle_timeout,
                # A machine waits for its first client as long as the client waits for it.
                first_client_timeout=self.boot_timeout,
            ),
            public_ip=self.connect == "public",
            spot=self.spot,
            tags=tags,
        )
        deadline.check(f"launching {request.nodes} instance(s)")
        made.adopt_instances(self._launch(api, made.spec, request.nodes))
        for rank, instance in enumerate(made.instances):
            reporter.phase(rank, "provisioning", f"{instance} ({instance_type}, {zone})")
        described = ec2.wait_running(api, made.instances, deadline, public=self.connect == "public")
        made.nodes = list(self._open(made, described, reporter))

    def _open(
        self, made: AWSAllocation, described: list[dict[str, Any]], reporter: Reporter
    ) -> list[HostNode]:
        """Reach every instance over SSH and prepare it: the shared remote-host layer."""
        assert made.access is not None
        targets = [made.target(instance) for instance in described]
        watched = _Reached(reporter)
        # An instance that ends while it is being reached (a spot reclaim, its watchdog)
        # fails the start at once, with EC2's reason, rather than after boot_timeout.
        deadline = WatchedDeadline(made.request.deadline)
        stop = threading.Event()
        threading.Thread(
            target=_watch_instances,
            args=(made.api, list(made.instances), deadline, stop),
            name="skyward-aws-watch",
            daemon=True,
        ).start()
        try:
            request = dataclasses.replace(made.request, deadline=deadline)
            return open_hosts(targets, made.access, request, watched)
        except (ProvisionError, TimeoutError) as exc:
            silent = [t.target.host for r, t in enumerate(targets) if r not in watched.reached]
            if silent and deadline.failure is None and not isinstance(exc, HostKeyError):
                exc.add_note(
                    f"Instances {', '.join(silent)} are running, but SSH did not answer from "
                    f"here: check that this machine's address is inside the security "
                    f"group's SSH range (ssh_cidr={self.ssh_cidr!r}) and that their "
                    f"{self.connect} addresses are reachable from this network."
                )
            raise
        finally:
            stop.set()

    def _launch(self, api: Api, spec: ec2.LaunchSpec, count: int) -> list[str]:
        try:
            return ec2.launch(api, spec, count)
        except ProvisionError as exc:
            if error_code(exc.__cause__) != "InsufficientInstanceCapacity":
                raise
            others = [z for z in api.zones_offering(spec.instance_type) if z != spec.zone]
            if not others:
                raise
            raise ProvisionError(
                f"{exc} Zones of {api.region} that offer {spec.instance_type}: "
                f"{', '.join(others)} (choose one with subnet_id=...)"
            ) from exc.__cause__

    def _image(
        self, api: Api, instance_type: str, architecture: str, gpus: int
    ) -> tuple[str, str, int]:
        """The AMI id, its root device name and its root snapshot's size in GB."""
        image = self.ami
        if image is None:
            defaults = GPU_AMI_PARAMETERS if gpus else CPU_AMI_PARAMETERS
            parameter = self.ami_parameter or defaults[architecture]
            image = str(
                api.call(api.ssm.get_parameter, f"reading {parameter}", Name=parameter)[
                    "Parameter"
                ]["Value"]
            )
        found = api.call(api.ec2.describe_images, f"finding AMI {image}", ImageIds=[image])
        if not found["Images"]:
            raise ProvisionError(f"AMI {image} does not exist in {api.region}")
        described = found["Images"][0]
        built_for = described.get("Architecture")
        if built_for and built_for != architecture:
            raise ProvisionError(
                f"AMI {image} is built for {built_for}, but {instance_type} runs {architecture}: "
                f"give an {architecture} image (or leave ami and ami_parameter out for the default)"
            )
        root = str(described.get("RootDeviceName") or "/dev/sda1")
        size = 0
        for mapping in described.get("BlockDeviceMappings", []):
            if mapping.get("DeviceName") == root:
                size = int(mapping.get("Ebs", {}).get("VolumeSize", 0))
        return image, root, size

    def _network(self, api: Api, instance_type: str) -> tuple[str, str, str]:
        """(VPC, subnet, zone) for the instances."""
        if self.subnet_id is not None:
            subnets = api.call(
                api.ec2.describe_subnets, "finding the subnet", SubnetIds=[self.subnet_id]
            )["Subnets"]
            subnet = subnets[0]
            if self.vpc_id is not None and subnet["VpcId"] != self.vpc_id:
                raise ProvisionError(
                    f"subnet {self.subnet_id} is in {subnet['VpcId']}, not in {self.vpc_id}"
                )
            return str(subnet["VpcId"]), str(subnet["SubnetId"]), str(subnet["AvailabilityZone"])
        vpc = self.vpc_id or self._default_vpc(api)
        subnets = api.call(
            api.ec2.describe_subnets,
            "finding subnets",
            Filters=[{"Name": "vpc-id", "Values": [vpc]}],
        )["Subnets"]
        offered = set(api.zones_offering(instance_type))
        usable = [s for s in subnets if not offered or s["AvailabilityZone"] in offered]
        if not usable:
            raise ProvisionError(
                f"no subnet of {vpc} is in a zone that offers {instance_type} "
                f"(zones that do: {', '.join(sorted(offered)) or 'none'}); pass subnet_id=..."
            )
        # Default subnets first (they give public addresses), then by zone name.
        usable.sort(key=lambda s: (not s.get("DefaultForAz", False), s["AvailabilityZone"]))
        chosen = usable[0]
        return vpc, str(chosen["SubnetId"]), str(chosen["AvailabilityZone"])

    def _default_vpc(self, api: Api) -> str:
        vpcs = api.call(
            api.ec2.describe_vpcs,
            "finding the default VPC",
            Filters=[{"Name": "isDefault", "Values": ["true"]}],
        )["Vpcs"]
        if not vpcs:
            raise ProvisionError(
                f"{api.region} has no default VPC; pass sky.AWS(subnet_id='subnet-...')"
            )
        return str(vpcs[0]["VpcId"])

    def _ssh_cidrs(self, api: Api, vpc: str) -> list[str]:
        if self.ssh_cidr != "auto" or self.connect == "public":
            return [client_cidr(self.ssh_cidr, lookup_url=self.ip_lookup_url)]
        described = api.call(api.ec2.describe_vpcs, "reading the VPC", VpcIds=[vpc])["Vpcs"][0]
        ranges = [a["CidrBlock"] for a in described.get("CidrBlockAssociationSet", [])]
        return ranges or [str(described["CidrBlock"])]


def _machine(api: Api, instance_type: str) -> tuple[str, int]:
    """The type's architecture (``"x86_64"`` or ``"arm64"``: Graviton) and its NVIDIA GPUs."""
    described = api.call(
        api.ec2.describe_instance_types,
        f"describing {instance_type}",
        InstanceTypes=[instance_type],
    )["InstanceTypes"]
    if not described:
        raise ProvisionError(f"{instance_type} is not an instance type of {api.region}")
    supported = described[0].get("ProcessorInfo", {}).get("SupportedArchitectures", [])
    if "x86_64" in supported or not supported:
        architecture = "x86_64"
    elif "arm64" in supported:
        architecture = "arm64"
    else:
        raise ProvisionError(
            f"{instance_type} runs {', '.join(supported)}, which Skyward has no image for"
        )
    gpus = described[0].get("GpuInfo", {}).get("Gpus", [])
    return architecture, sum(
        int(g.get("Count", 0)) for g in gpus if g.get("Manufacturer") == "NVIDIA"
    )


class _Reached:
    """A reporter that also remembers which nodes got past connecting (SSH answered)."""

    def __init__(self, reporter: Reporter) -> None:
        self._reporter = reporter
        self.reached: set[int] = set()

    def phase(self, node: int, phase: Phase, detail: str = "") -> None:
        if phase not in ("provisioning", "connecting"):
            self.reached.add(node)
        self._reporter.phase(node, phase, detail)

    def log(self, node: int, line: str) -> None:
        self._reporter.log(node, line)

    def status(self, line: str) -> None:
        self._reporter.status(line)


def _watch_instances(
    api: Api, ids: list[str], deadline: WatchedDeadline, stop: threading.Event
) -> None:
    """Fail ``deadline`` as soon as one of ``ids`` stops running (until ``stop``)."""
    while not stop.wait(ec2.POLL):
        try:
            answer = api.ec2.describe_instances(InstanceIds=ids)
        except Exception:
            continue  # a hint only; the connections' own bounds still hold
        for reservation in answer["Reservations"]:
            for instance in reservation["Instances"]:
                if instance["State"]["Name"] not in ("pending", "running"):
                    deadline.fail(
                        f"instance {instance['InstanceId']} is {instance['State']['Name']}: "
                        f"{ec2.describe_reason(instance)}"
                    )
                    return
