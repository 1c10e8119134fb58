"""``AWS(...)``: nodes are EC2 instances that the pool creates and always destroys.

A start is every cloud's (``CloudOptions.provision``, ``cloud/options.py``); AWS's steps::

    check       region known to botocore, credentials found, an image for the GPUs
    offers      the instance type described by EC2, the zones of the region that offer
                each type and have a subnet, spot prices when spot is asked
    prepare     the image, a key pair, a security group (SSH from ssh_cidr only, all
                traffic within the group), EFA; a launch is one run_instances for every node
    started     wait running
    terminate   terminate the instances and wait, delete the group (retried while in use)
                and the key pair, after sweeping by key pair and by the allocation's tag
    inventory   everything tagged skyward-pool, in every enabled region unless one is named

Every resource carries the pool's tags. boto3 is imported only when a pool uses AWS; the
calls and their error messages live in ``aws/api.py``, the resources in
``aws/resources.py``, what one pool made in ``aws/allocation.py``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from functools import partial
from typing import ClassVar

from pydantic import Field, model_validator

from skyward._errors import ProvisionError
from skyward.client.phases import Reporter
from skyward.providers.aws import resources as ec2
from skyward.providers.aws.allocation import AWSAllocation
from skyward.providers.aws.api import REFUSALS, Api, check_credentials, error_code
from skyward.providers.aws.inventory import AWSInventory
from skyward.providers.base import Inventory, ProvisionRequest
from skyward.providers.cloud import capacity, catalog
from skyward.providers.cloud.allocation import TAG_ALLOCATION
from skyward.providers.cloud.capacity import Offer
from skyward.providers.cloud.catalog import Cloud, Machine
from skyward.providers.cloud.options import CloudOptions, Launch, prices
from skyward.providers.ssh.hosts import HostTarget

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
        check_credentials(session, profile=self.profile)
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

    def allocation(self, request: ProvisionRequest) -> AWSAllocation:
        api = Api.connect(region=self.region, profile=self.profile, endpoint_url=self.endpoint_url)
        return AWSAllocation(api, request, **self.allocation_options)

    def inventory(self) -> Inventory | None:
        """This region's leftovers (``region=None``: every enabled region's)."""
        return AWSInventory(
            region=self.region,
            profile=self.profile,
            endpoint_url=self.endpoint_url,
            release_timeout=self.release_timeout,
        )

    # ── the steps ──────────────────────────────────────────────────────────────────────

    def offers(self, made: AWSAllocation, reporter: Reporter) -> tuple[list[Offer], str]:
        """The types (an ``instance_type`` described by EC2), the zones with a subnet that
        offer each, and their prices (spot ones asked of EC2 when spot is allowed)."""
        request, api, deadline = made.request, made.api, made.request.deadline
        deadline.check("checking the machine types")
        machines = self._described(api, request)
        deadline.check("finding the network")
        made.vpc, made.subnets = self._network(api)
        zones = self._zones(api, machines, made.subnets)
        strategy = self.strategy(request)
        wanted = "spot" in capacity.markets(strategy)
        spot = api.spot_prices([m.type for m in machines]) if wanted else {}
        # Unknown spot price: on-demand is its ceiling (the default maximum price).
        price = prices(
            lambda machine, zone: catalog.price("aws", machine.type, api.region),
            lambda machine, zone: spot.get((machine.type, zone)),
        )
        return capacity.plan(machines, zones, strategy=strategy, price=price), api.region

    def prepare(self, made: AWSAllocation, offers: Sequence[Offer], reporter: Reporter) -> Launch:
        request, api, deadline = made.request, made.api, made.request.deadline
        subnets, first = made.subnets, offers[0]
        deadline.check("finding the image")
        image, root_device, snapshot_gb = self._image(api, first.machine, request)
        gpu = request.accelerator is not None or first.machine.accelerator is not None
        if snapshot_gb > self.disk_gb:
            raise ProvisionError(
                f"disk_gb={self.disk_gb} is smaller than the image's root snapshot "
                f"({snapshot_gb} GB of {image}); ask for at least {snapshot_gb}"
            )
        cidrs = self.ssh_cidrs(lambda: api.vpc_ranges(made.vpc))
        # ── creating ──
        deadline.check("importing the key pair")
        name = made.name
        key, host_key = self.pool_keys(
            made,
            region=api.region,
            name=name,
            endpoint=self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL", ""),
            gpus=(first.machine.count or None) if gpu else None,
            machine_type=first.machine.type,
            instance_profile=self.iam_instance_profile is not None,
        )
        tags = {**request.tags, TAG_ALLOCATION: name, "Name": f"skyward {request.pool}"}
        made.record("key pair", name)  # before the call: an answer lost in flight still counts
        ec2.import_key_pair(api, name, key.public, tags)
        reporter.status(f"key pair {name}")
        deadline.check("creating the security group")
        group = ec2.create_group(api, name, made.vpc, tags, partial(made.record, "security group"))
        ec2.allow(api, group, cidrs, tags)
        reporter.status(f"security group {group}: SSH from {', '.join(cidrs)}")
        efa = self._efa(api, offers, request.nodes, reporter)
        if efa:
            ec2.allow_efa(api, group, tags)
        template = ec2.LaunchSpec(
            instance_type=first.machine.type,
            image_id=image,
            root_device=root_device,
            disk_gb=self.disk_gb,
            subnet_id=subnets[first.zone],
            zone=first.zone,
            security_group=group,
            key_name=name,
            user_data=self.boot(host_key, key),
            public_ip=self.connect == "public",
            spot=first.market == "spot",
            tags=tags,
            iam_instance_profile=self.iam_instance_profile,
        )
        placed: dict[str, str] = {}  # zone -> the pool's cluster placement group there

        def launch(offer: Offer) -> ec2.LaunchSpec:
            cards = efa.get(offer.machine.type, 0)
            if cards and offer.zone not in placed:  # a cluster group stays in one zone
                made.placing = True
                placed[offer.zone] = ec2.create_placement(
                    api, f"{name}-{offer.zone}", tags, partial(made.record, "placement group")
                )
            spec = dataclasses.replace(
                template,
                instance_type=offer.machine.type,
                subnet_id=subnets[offer.zone],
                zone=offer.zone,
                spot=offer.market == "spot",
                placement_group=placed.get(offer.zone) if cards else None,
                efa_cards=cards if self.connect == "private" else min(cards, 1),
            )
            made.adopt_instances(self._launch(api, spec, request.nodes))
            return spec

        return launch

    def started(
        self, made: AWSAllocation, offer: Offer, launched: ec2.LaunchSpec, reporter: Reporter
    ) -> list[HostTarget]:
        public = self.connect == "public"
        described = ec2.wait_running(made.api, made.instances, made.request.deadline, public=public)
        return [made.target(instance) for instance in described]

    def _efa(
        self, api: Api, offers: Sequence[Offer], nodes: int, reporter: Reporter
    ) -> dict[str, int]:
        """Per type of the offers that gets EFA (and a cluster placement group), its
        network cards: multi-node pools only, and only when asked."""
        if nodes < 2 or not self.cluster_network:
            return {}
        types = sorted({o.machine.type for o in offers})
        efa = api.efa_cards(types)
        for kind, cards in efa.items():
            if cards > 1 and self.connect != "private":
                reporter.status(
                    f"{kind}: EFA on 1 of its {cards} network cards (a public address allows "
                    f"one interface); connect='private' gives every card one"
                )
        return efa

    def _described(self, api: Api, request: ProvisionRequest) -> list[Machine]:
        """The machines to try; an ``instance_type`` is described by EC2 first, so that a
        typo is an error before the key pair exists."""
        machines = self.machines_for(request, api.region)
        if self.instance_type is None:
            return machines
        answer = api.call(
            api.ec2.describe_instance_types,
            f"checking instance type {self.instance_type}",
            InstanceTypes=[self.instance_type],
        )
        if machines:
            return machines
        info = answer["InstanceTypes"][0]
        gpus = info.get("GpuInfo", {}).get("Gpus", [])
        return self.described(
            request,
            accelerator=str(gpus[0]["Name"]) if gpus else None,
            count=int(gpus[0]["Count"]) if gpus else 0,
            memory_gb=round(gpus[0]["MemoryInfo"]["SizeInMiB"] / 1024) if gpus else 0,
            vcpus=int(info["VCpuInfo"]["DefaultVCpus"]),
            ram_gb=info["MemoryInfo"]["SizeInMiB"] / 1024,
            arch=str(info.get("ProcessorInfo", {}).get("SupportedArchitectures", ["x86_64"])[0]),
        )

    def _zones(
        self, api: Api, machines: Sequence[Machine], subnets: dict[str, str]
    ) -> dict[str, list[str]]:
        """Per type, the zones that offer it and where the pool has a subnet, in subnet
        order. When EC2 cannot say (a permission), every subnet's zone: a launch where the
        type is missing is refused and the failover moves on."""
        # A subnet the user named is taken as it is: EC2 itself says if the type is missing.
        offered = None if self.subnet_id else api.zones_offering_each([m.type for m in machines])

        def refusal(machine: Machine, zone: str) -> str | None:
            where = offered.get(machine.type) if offered is not None else None
            return None if where is None or zone in where else "not offered there"

        have = ", ".join(subnets) or "none"
        nowhere = (
            f"no zone of {api.region} with a subnet here ({have}) offers "
            f"{', '.join(m.type for m in machines)}; pass another subnet_id or region"
        )
        return capacity.offered(machines, list(subnets), refusal, nowhere=nowhere)[0]

    def _launch(self, api: Api, spec: ec2.LaunchSpec, count: int) -> list[str]:
        """One run_instances for every node (all or none); ``CapacityError`` when another
        zone, type or market may still work."""
        return capacity.failover(
            lambda: ec2.launch(api, spec, count),
            lambda exc: REFUSALS.refusal(error_code(exc.__cause__), spot=spec.spot),
        )

    def _image(self, api: Api, machine: Machine, request: ProvisionRequest) -> tuple[str, str, int]:
        """The AMI id, its root device name and its root snapshot's size in GB."""
        # Graviton types run arm64 images; EC2 lists x86 types as ("i386", "x86_64").
        architecture = "arm64" if machine.arch == "arm64" else "x86_64"
        instance_type = machine.type
        image = self.ami
        if image is None:
            gpu = request.accelerator is not None or machine.accelerator is not None
            defaults = GPU_AMI_PARAMETERS if gpu else CPU_AMI_PARAMETERS
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

    def _network(self, api: Api) -> tuple[str, dict[str, str]]:
        """The VPC, and the subnet to use in each of its zones (one zone with subnet_id)."""
        if self.subnet_id is not None:
            subnets = api.call(
                api.ec2.describe_subnets, "finding the subnet", SubnetIds=[self.subnet_id]
            )["Subnets"]
            subnet = subnets[0]
            if self.vpc_id is not None and subnet["VpcId"] != self.vpc_id:
                raise ProvisionError(
                    f"subnet {self.subnet_id} is in {subnet['VpcId']}, not in {self.vpc_id}"
                )
            return str(subnet["VpcId"]), {str(subnet["AvailabilityZone"]): self.subnet_id}
        vpc = self.vpc_id or self._default_vpc(api)
        subnets = api.call(
            api.ec2.describe_subnets,
            "finding subnets",
            Filters=[{"Name": "vpc-id", "Values": [vpc]}],
        )["Subnets"]
        if not subnets:
            raise ProvisionError(f"{vpc} has no subnet; pass subnet_id=...")
        # Default subnets first (they give public addresses), then by zone name; one per zone.
        subnets.sort(key=lambda s: (not s.get("DefaultForAz", False), s["AvailabilityZone"]))
        by_zone: dict[str, str] = {}
        for subnet in subnets:
            by_zone.setdefault(str(subnet["AvailabilityZone"]), str(subnet["SubnetId"]))
        return vpc, dict(sorted(by_zone.items()))

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
