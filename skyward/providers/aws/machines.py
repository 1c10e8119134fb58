"""One AWS pool's machines: the cloud contract's calls (``cloud/contract.py``) on EC2.

::

    offers      the instance type described by EC2, the zones of the region that offer
                each type and have a subnet, spot prices when spot is asked
    prepare     the image, a key pair, a security group (SSH from ssh_cidr only, all
                traffic within the group), EFA; the launch template with the boot payload
                as cloud-init user data
    launch      one run_instances for every node (all or none), in a cluster placement
                group made for the zone when the type has EFA
    describe    describe_instances: state, addresses, EC2's state reason
    delete      terminate the instances and wait, delete the group (retried while in use),
                the placement groups and the key pair, after sweeping by key pair and by
                the allocation's tag for what a create cut off in flight made

Resources are recorded the moment they exist (the key pair's name, which we choose, even
before it is asked for), so a failure or a Ctrl-C at any point releases what was made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal, Protocol

from skyward._errors import ProvisionError
from skyward.client.futures import Deadline
from skyward.client.phases import Reporter
from skyward.providers.aws import api as ec2
from skyward.providers.aws.api import REFUSALS, Api, error_code
from skyward.providers.base import ProvisionRequest
from skyward.providers.cloud import capacity, catalog
from skyward.providers.cloud.boot import Boot
from skyward.providers.cloud.capacity import Offer
from skyward.providers.cloud.catalog import Machine
from skyward.providers.cloud.contract import Described, Offers, Reach, State, Want
from skyward.providers.cloud.options import prices
from skyward.providers.cloud.record import Record
from skyward.providers.cloud.start import TAG_ALLOCATION

# AWS's public SSM parameters for the newest images, by the machine's architecture: the Deep
# Learning Base AMI with NVIDIA's open driver for GPU machines, Canonical's Ubuntu for CPU
# ones (all Ubuntu 24.04, login user "ubuntu", cloud-init at boot, /usr/bin/python3 = 3.12).
_DLAMI = "/aws/service/deeplearning/ami/{}/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
_UBUNTU = "/aws/service/canonical/ubuntu/server/24.04/stable/current/{}/hvm/ebs-gp3/ami-id"
GPU_AMI_PARAMETERS = {"x86_64": _DLAMI.format("x86_64"), "arm64": _DLAMI.format("arm64")}
CPU_AMI_PARAMETERS = {"x86_64": _UBUNTU.format("amd64"), "arm64": _UBUNTU.format("arm64")}
_STATES: dict[str, State] = {
    "pending": "starting",
    "running": "running",
    "shutting-down": "ended",
    "terminated": "ended",
    "stopping": "ended",
    "stopped": "ended",
}


class Settings(Protocol):
    """What the machines read of ``sky.AWS`` (``options.py``)."""

    @property
    def instance_type(self) -> str | None: ...
    @property
    def ami(self) -> str | None: ...
    @property
    def ami_parameter(self) -> str | None: ...
    @property
    def subnet_id(self) -> str | None: ...
    @property
    def vpc_id(self) -> str | None: ...
    @property
    def disk_gb(self) -> int: ...
    @property
    def endpoint_url(self) -> str | None: ...
    @property
    def iam_instance_profile(self) -> str | None: ...
    @property
    def cluster_network(self) -> bool: ...
    @property
    def connect(self) -> Literal["public", "private"]: ...
    @property
    def release_timeout(self) -> float: ...

    def machines_for(self, request: ProvisionRequest, region: str | None = None) -> list[Machine]:
        """The catalog's machines for the request."""
        ...

    def described(self, request: ProvisionRequest, **facts: Any) -> list[Machine]: ...
    def ssh_cidrs(
        self, private_ranges: Sequence[str] | Callable[[], Sequence[str]]
    ) -> list[str]: ...


class AWSMachines:
    """A pool's key pair, security group, placement groups and instances in one region."""

    noun = "instance"
    prefix = "node-"  # names only in messages: EC2 gives ids

    def __init__(self, options: Settings, api: Api, pool: str, endpoint: str) -> None:
        self.options = options
        self.api = api
        self.endpoint = endpoint
        self.instance_profile = options.iam_instance_profile is not None
        # Unique per provision: the key pair's and group's name, and the value of the
        # skyward-allocation tag on everything made (the sweep's handle).
        self.name = ec2.resource_name(pool)
        # Found by offers, before anything is made: the VPC and each zone's subnet.
        self._vpc = ""
        self._subnets: dict[str, str] = {}
        # Made by prepare, read by launch: the template, the EFA cards per type, and the
        # pool's cluster placement group per zone.
        self._template: ec2.LaunchSpec | None = None
        self._efa: dict[str, int] = {}
        self._placed: dict[str, str] = {}
        self._placing = False  # a placement group may have been asked for: sweep for them

    @property
    def scope(self) -> tuple[str, str]:
        return f" in {self.api.region}", f"--region {self.api.region}"

    def key_label(self, first: Offer) -> tuple[str, str, str]:
        return self.api.region, self.name, self.endpoint

    def resume(self, name: str) -> None:
        # The key pair's and group's name, and the sweep's skyward-allocation tag.
        self.name = name

    # ── before anything is made ────────────────────────────────────────────────────────

    def offers(self, want: Want) -> Offers:
        """The types (an ``instance_type`` described by EC2), the zones with a subnet that
        offer each, and their prices (spot ones asked of EC2 when spot is allowed)."""
        api, deadline = self.api, want.deadline
        deadline.check("checking the machine types")
        machines = self._described(want.request)
        deadline.check("finding the network")
        self._vpc, self._subnets = self._network()
        zones = self._zones(machines)
        wanted = "spot" in capacity.markets(want.strategy)
        spot = api.spot_prices([m.type for m in machines]) if wanted else {}
        # Unknown spot price: on-demand is its ceiling (the default maximum price).
        price = prices(
            lambda machine, zone: catalog.price("aws", machine.type, api.region),
            lambda machine, zone: spot.get((machine.type, zone)),
        )
        return Offers(
            capacity.plan(machines, zones, strategy=want.strategy, price=price), api.region
        )

    def _described(self, request: ProvisionRequest) -> list[Machine]:
        """The machines to try; an ``instance_type`` is described by EC2 first, so that a
        typo is an error before the key pair exists."""
        options, api = self.options, self.api
        machines = options.machines_for(request, api.region)
        if options.instance_type is None:
            return machines
        answer = api.call(
            api.ec2.describe_instance_types,
            f"checking instance type {options.instance_type}",
            InstanceTypes=[options.instance_type],
        )
        if machines:
            return machines
        info = answer["InstanceTypes"][0]
        gpus = info.get("GpuInfo", {}).get("Gpus", [])
        return options.described(
            request,
            accelerator=str(gpus[0]["Name"]) if gpus else None,
            count=int(gpus[0]["Count"]) if gpus else 0,
            memory_gb=round(gpus[0]["MemoryInfo"]["SizeInMiB"] / 1024) if gpus else 0,
            vcpus=int(info["VCpuInfo"]["DefaultVCpus"]),
            ram_gb=info["MemoryInfo"]["SizeInMiB"] / 1024,
            arch=str(info["ProcessorInfo"]["SupportedArchitectures"][0]),
        )

    def _zones(self, machines: Sequence[Machine]) -> dict[str, list[str]]:
        """Per type, the zones that offer it and where the pool has a subnet, in subnet
        order. When EC2 cannot say (a permission), every subnet's zone: a launch where the
        type is missing is refused and the failover moves on."""
        api, subnets = self.api, self._subnets
        # A subnet the user named is taken as it is: EC2 itself says if the type is missing.
        named = self.options.subnet_id is not None
        offered = None if named else api.zones_offering_each([m.type for m in machines])

        def refusal(machine: Machine, zone: str) -> str | None:
            where = offered.get(machine.type) if offered is not None else None
            return None if where is None or zone in where else "not offered there"

        have = ", ".join(subnets) or "none"
        nowhere = (
            f"no zone of {api.region} with a subnet here ({have}) offers "
            f"{', '.join(m.type for m in machines)}; pass another subnet_id or region"
        )
        return capacity.offered(machines, list(subnets), refusal, nowhere=nowhere)[0]

    def _network(self) -> tuple[str, dict[str, str]]:
        """The VPC, and the subnet to use in each of its zones (one zone with subnet_id)."""
        api, subnet_id, vpc_id = self.api, self.options.subnet_id, self.options.vpc_id
        if subnet_id is not None:
            subnets = api.call(
                api.ec2.describe_subnets, "finding the subnet", SubnetIds=[subnet_id]
            )["Subnets"]
            subnet = subnets[0]
            if vpc_id is not None and subnet["VpcId"] != vpc_id:
                raise ProvisionError(f"subnet {subnet_id} is in {subnet['VpcId']}, not in {vpc_id}")
            return str(subnet["VpcId"]), {str(subnet["AvailabilityZone"]): subnet_id}
        vpc = vpc_id or self._default_vpc()
        subnets = api.call(
            api.ec2.describe_subnets,
            "finding subnets",
            Filters=[{"Name": "vpc-id", "Values": [vpc]}],
        )["Subnets"]
        if not subnets:
            raise ProvisionError(f"{vpc} has no subnet; pass subnet_id=...")
        # Default subnets first (they give public addresses), then by zone name; one per zone.
        subnets.sort(key=lambda s: (not s["DefaultForAz"], s["AvailabilityZone"]))
        by_zone: dict[str, str] = {}
        for subnet in subnets:
            by_zone.setdefault(str(subnet["AvailabilityZone"]), str(subnet["SubnetId"]))
        return vpc, dict(sorted(by_zone.items()))

    def _default_vpc(self) -> str:
        api = self.api
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

    # ── making ─────────────────────────────────────────────────────────────────────────

    def prepare(self, want: Want, offers: Sequence[Offer], boot: Boot, record: Record) -> None:
        options, api, deadline, request = self.options, self.api, want.deadline, want.request
        first, reporter = offers[0], want.reporter
        deadline.check("finding the image")
        image, root_device, snapshot_gb = self._image(first.machine, request)
        if snapshot_gb > options.disk_gb:
            raise ProvisionError(
                f"disk_gb={options.disk_gb} is smaller than the image's root snapshot "
                f"({snapshot_gb} GB of {image}); ask for at least {snapshot_gb}"
            )
        cidrs = options.ssh_cidrs(lambda: api.vpc_ranges(self._vpc))
        deadline.check("importing the key pair")
        name = self.name
        tags = {**request.tags, TAG_ALLOCATION: name, "Name": f"skyward {request.pool}"}
        record.add("key pair", name)  # before the call: an answer lost in flight still counts
        ec2.import_key_pair(api, name, boot.authorized_key, tags)
        reporter.status(f"key pair {name}")
        deadline.check("creating the security group")
        group = ec2.create_group(api, name, self._vpc, tags, partial(record.add, "security group"))
        ec2.allow(api, group, cidrs, tags)
        reporter.status(f"security group {group}: SSH from {', '.join(cidrs)}")
        self._efa = self._efa_cards(offers, request.nodes, reporter)
        if self._efa:
            ec2.allow_efa(api, group, tags)
        self._template = ec2.LaunchSpec(
            instance_type=first.machine.type,
            image_id=image,
            root_device=root_device,
            disk_gb=options.disk_gb,
            subnet_id=self._subnets[first.zone],
            zone=first.zone,
            security_group=group,
            key_name=name,
            user_data=boot.cloud_config(),
            public_ip=options.connect == "public",
            spot=first.market == "spot",
            tags=tags,
            iam_instance_profile=options.iam_instance_profile,
        )

    def launch(
        self, offer: Offer, names: Sequence[str], record: Record, deadline: Deadline
    ) -> list[str]:
        """One run_instances for every node (all or none); ``CapacityError`` when another
        zone, type or market may still work."""
        assert self._template is not None, "prepare comes first"
        cards = self._efa.get(offer.machine.type, 0)
        if cards and offer.zone not in self._placed:  # a cluster group stays in one zone
            self._placing = True
            self._placed[offer.zone] = ec2.create_placement(
                self.api,
                f"{self.name}-{offer.zone}",
                self._template.tags,
                partial(record.add, "placement group"),
            )
        spec = dataclasses.replace(
            self._template,
            instance_type=offer.machine.type,
            subnet_id=self._subnets[offer.zone],
            zone=offer.zone,
            spot=offer.market == "spot",
            placement_group=self._placed.get(offer.zone) if cards else None,
            efa_cards=cards if self.options.connect == "private" else min(cards, 1),
        )
        return capacity.failover(
            lambda: ec2.launch(self.api, spec, len(names)),
            lambda exc: REFUSALS.refusal(error_code(exc.__cause__), spot=spec.spot),
        )

    def _efa_cards(self, offers: Sequence[Offer], nodes: int, reporter: Reporter) -> dict[str, int]:
        """Per type of the offers that gets EFA (and a cluster placement group), its
        network cards: multi-node pools only, and only when asked."""
        if nodes < 2 or not self.options.cluster_network:
            return {}
        types = sorted({o.machine.type for o in offers})
        efa = self.api.efa_cards(types)
        for kind, cards in efa.items():
            if cards > 1 and self.options.connect != "private":
                reporter.status(
                    f"{kind}: EFA on 1 of its {cards} network cards (a public address allows "
                    f"one interface); connect='private' gives every card one"
                )
        return efa

    def _image(self, machine: Machine, request: ProvisionRequest) -> tuple[str, str, int]:
        """The AMI id, its root device name and its root snapshot's size in GB."""
        options, api = self.options, self.api
        # Graviton types run arm64 images; EC2 lists x86 types as ("i386", "x86_64").
        architecture = "arm64" if machine.arch == "arm64" else "x86_64"
        image = options.ami
        if image is None:
            gpu = request.accelerator is not None or machine.accelerator is not None
            defaults = GPU_AMI_PARAMETERS if gpu else CPU_AMI_PARAMETERS
            parameter = options.ami_parameter or defaults[architecture]
            found_parameter = api.call(
                api.ssm.get_parameter, f"reading {parameter}", Name=parameter
            )
            image = str(found_parameter["Parameter"]["Value"])
        found = api.call(api.ec2.describe_images, f"finding AMI {image}", ImageIds=[image])
        if not found["Images"]:
            raise ProvisionError(f"AMI {image} does not exist in {api.region}")
        described = found["Images"][0]
        built_for = described["Architecture"]
        if built_for != architecture:
            raise ProvisionError(
                f"AMI {image} is built for {built_for}, but {machine.type} runs {architecture}: "
                f"give an {architecture} image (or leave ami and ami_parameter out for the default)"
            )
        root = str(described["RootDeviceName"])
        size = 0
        for mapping in described["BlockDeviceMappings"]:
            if mapping["DeviceName"] == root:
                size = int(mapping.get("Ebs", {}).get("VolumeSize", 0))
        return image, root, size

    # ── the machines ───────────────────────────────────────────────────────────────────

    def describe(self, place: str, ids: Sequence[str], *, quick: bool = False) -> list[Described]:
        api, doing = self.api, f"reading {len(ids)} instance(s)"
        try:
            answer = api.call(api.ec2.describe_instances, doing, InstanceIds=list(ids))
        except ProvisionError as exc:
            if error_code(exc.__cause__) != "InvalidInstanceID.NotFound":
                raise
            answer = {"Reservations": []}  # just launched, not visible yet
        found = {i["InstanceId"]: i for r in answer["Reservations"] for i in r["Instances"]}
        return [self._one(found.get(id)) for id in ids]

    def _one(self, instance: dict[str, Any] | None) -> Described:
        if instance is None:
            return Described("starting", "not visible yet")
        status = str(instance["State"]["Name"])
        state = _STATES.get(status, "starting")
        if state == "ended":
            return Described(state, status, why=ec2.describe_reason(instance))
        private = str(instance.get("PrivateIpAddress") or "")
        public = str(instance.get("PublicIpAddress") or "")
        host = public if self.options.connect == "public" else private
        if state != "running" or not host:
            return Described("starting", status)
        return Described(state, status, Reach(host=host, peer=private))

    def discard(self, place: str, ids: Sequence[str], deadline: Deadline) -> list[str]:
        return ec2.delete(self.api, instances=list(ids), timeout=max(deadline.remaining(), 0))

    def delete(self, record: Record, deadline: Deadline) -> list[str]:
        """Terminate every instance and wait, then delete the groups and the key pair,
        after sweeping for what a create cut off in flight made."""
        instances = [id for _, id in record.machines()]
        groups, keys = record.resources("security group"), record.resources("key pair")
        placed = record.resources("placement group")
        swept = ec2.sweep(
            self.api,
            key_name=keys[0] if keys else None,
            tag=(TAG_ALLOCATION, self.name),
            placement_groups=self._placing,
        )
        left = ec2.delete(
            self.api,
            instances=[*instances, *(i for i in swept.instances if i not in instances)],
            groups=[*groups, *(g for g in swept.groups if g not in groups)],
            key_pairs=[*keys, *(k for k in swept.key_pairs if k not in keys)],
            placement_groups=[*placed, *(g for g in swept.placement_groups if g not in placed)],
            timeout=max(deadline.remaining(), 1.0),
        )
        return left + swept.failed
