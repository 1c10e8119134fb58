"""Asking EC2 for machines the way a real account answers: no capacity in a zone, spot refused,
a price limit, a typo in a region or a type, an answer lost in flight. moto never refuses
anything, so a proxy of the tests' own (``support.clouds.aws.proxy``) stands between the provider
and moto and answers some calls with EC2's own errors; nothing is patched inside boto3."""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import Checkpoint, held, nothing, provider, request
from support.clouds.aws.proxy import CREATES, Ec2Proxy, in_subnet, of_type, spot
from support.reporter import Recorder

import skyward as sky
from skyward._errors import ProvisionError
from skyward.providers.aws.api import Api
from skyward.providers.cloud.capacity import CapacityError

pytestmark = pytest.mark.timeout(180)

_NO_CAPACITY = (
    "We currently do not have sufficient {type} capacity in the Availability Zone you "
    "requested ({zone}). Our system will be working on provisioning additional capacity."
)


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[Ec2Proxy]:
    with Ec2Proxy(moto.url) as running:
        yield running


def _aws(proxy: Ec2Proxy, moto: MotoServer, **options: Any) -> sky.AWS:
    return provider(moto, endpoint_url=proxy.url, **options)


def _subnets(moto: MotoServer) -> dict[str, str]:
    """The default VPC's subnet in each zone, as the provider will pick them."""
    subnets = moto.client("ec2").describe_subnets(
        Filters=[{"Name": "default-for-az", "Values": ["true"]}]
    )["Subnets"]
    return {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}


def _launched(moto: MotoServer, pool: str) -> list[dict[str, Any]]:
    ec2 = moto.client("ec2")
    tag = [{"Name": "tag:skyward-pool", "Values": [pool]}]
    return [i for r in ec2.describe_instances(Filters=tag)["Reservations"] for i in r["Instances"]]


def _stop_after_launch(aws: sky.AWS, moto: MotoServer, **options: Any) -> tuple[Any, Recorder]:
    """Provision until the instances exist, look at them, then stop (a Ctrl-C there)."""
    seen: dict[str, Any] = {}
    made = request(
        deadline=Checkpoint("waiting for", reached=lambda: seen.update(i=_launched(moto, name))),
        **options,
    )
    name = made.pool
    recorder = Recorder()
    with pytest.raises(KeyboardInterrupt):
        aws.provision(made, recorder)
    assert nothing(held(moto, made.pool))
    return seen["i"], recorder


# ── capacity failover ──────────────────────────────────────────────────────────────────


def test_no_capacity_in_one_zone_moves_the_whole_pool_to_the_next(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    subnets = _subnets(moto)
    first = sorted(subnets)[0]
    proxy.refuse(
        "RunInstances",
        "InsufficientInstanceCapacity",
        _NO_CAPACITY.format(type="m7i.xlarge", zone=first),
        when=in_subnet(subnets[first]),
        status=500,  # EC2's capacity errors are server errors
    )
    instances, recorder = _stop_after_launch(_aws(proxy, moto), moto, nodes=3)
    zones = {i["Placement"]["AvailabilityZone"] for i in instances}
    assert len(instances) == 3 and zones == {sorted(subnets)[1]}  # all in one placement
    tried = [p["NetworkInterface.1.SubnetId"] for p in proxy.calls("RunInstances")]
    assert tried[0] == subnets[first] and tried[-1] == subnets[sorted(subnets)[1]]
    assert any(f"m7i.xlarge on-demand in {first}" in s and "trying" in s for s in recorder.statuses)


def test_when_every_zone_refuses_the_error_lists_each_and_nothing_is_left(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    proxy.refuse("RunInstances", "InsufficientInstanceCapacity", "no capacity here")
    made = request(accelerator="L4:4")
    with pytest.raises(CapacityError) as caught:
        _aws(proxy, moto).provision(made, Recorder())
    message = str(caught.value)
    zones = sorted(_subnets(moto))
    offered = [z for z in zones if f"g6.12xlarge on-demand in {z}" in message]
    assert len(offered) >= 2, message
    assert "g6.24xlarge on-demand in" in message  # the next type with 4 L4s was tried too
    assert "no capacity here" in message
    assert nothing(held(moto, made.pool))


def test_a100_40gb_without_capacity_moves_to_80gb(moto: MotoServer, proxy: Ec2Proxy) -> None:
    proxy.refuse("RunInstances", "InsufficientInstanceCapacity", when=of_type("p4d.24xlarge"))
    instances, _ = _stop_after_launch(_aws(proxy, moto), moto, accelerator="A100:8")
    assert {i["InstanceType"] for i in instances} == {"p4de.24xlarge"}


def test_a100_pinned_to_40gb_does_not_move(moto: MotoServer, proxy: Ec2Proxy) -> None:
    proxy.refuse("RunInstances", "InsufficientInstanceCapacity", when=of_type("p4d.24xlarge"))
    made = request(accelerator="A100-40GB:8")
    with pytest.raises(CapacityError) as caught:
        _aws(proxy, moto).provision(made, Recorder())
    assert "p4de" not in str(caught.value)
    assert not proxy.calls("RunInstances") or all(
        p["InstanceType"] == "p4d.24xlarge" for p in proxy.calls("RunInstances")
    )
    assert nothing(held(moto, made.pool))


def test_a_type_a_zone_does_not_offer_moves_on(moto: MotoServer, proxy: Ec2Proxy) -> None:
    subnets = _subnets(moto)
    first = sorted(subnets)[0]
    proxy.refuse(
        "RunInstances",
        "Unsupported",
        "Your requested instance type (m7i.xlarge) is not supported in your requested "
        f"Availability Zone ({first}).",
        when=in_subnet(subnets[first]),
    )
    instances, _ = _stop_after_launch(_aws(proxy, moto), moto)
    assert {i["Placement"]["AvailabilityZone"] for i in instances} == {sorted(subnets)[1]}


def test_a_quota_is_not_a_capacity_problem_and_stops_at_once(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    proxy.refuse("RunInstances", "VcpuLimitExceeded", "You have requested more vCPU capacity")
    made = request()
    with pytest.raises(ProvisionError, match="L-1216C47A") as caught:
        _aws(proxy, moto).provision(made, Recorder())
    assert not isinstance(caught.value, CapacityError)
    assert len(proxy.calls("RunInstances")) == 1
    assert nothing(held(moto, made.pool))


# ── allocation= ────────────────────────────────────────────────────────────────────────


def _request(**options: Any) -> Any:
    allocation = options.pop("allocation", None)
    vcpus = options.pop("vcpus", None)
    memory_gb = options.pop("memory_gb", None)
    max_hourly_cost = options.pop("max_hourly_cost", None)
    made = request(**options)
    return dataclasses.replace(
        made,
        allocation=allocation,
        vcpus=vcpus,
        memory_gb=memory_gb,
        max_hourly_cost=max_hourly_cost,
    )


def _stop_request_after_launch(
    aws: sky.AWS, moto: MotoServer, **options: Any
) -> tuple[list[dict[str, Any]], Recorder, Any]:
    seen: dict[str, Any] = {}
    made = _request(**options)
    made = dataclasses.replace(
        made,
        deadline=Checkpoint(
            "waiting for", reached=lambda: seen.update(i=_launched(moto, made.pool))
        ),
    )
    recorder = Recorder()
    with pytest.raises(KeyboardInterrupt):
        aws.provision(made, recorder)
    assert nothing(held(moto, made.pool))
    return seen["i"], recorder, made


def test_spot_if_available_falls_back_to_on_demand_when_spot_is_refused(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    proxy.refuse("RunInstances", "InsufficientInstanceCapacity", "no spot capacity", when=spot)
    instances, recorder, _ = _stop_request_after_launch(
        _aws(proxy, moto), moto, allocation="spot-if-available"
    )
    assert {i.get("InstanceLifecycle") for i in instances} == {None}  # on-demand
    markets = {p.get("InstanceMarketOptions.MarketType") for p in proxy.calls("RunInstances")}
    assert markets == {"spot", None}
    assert any("trying m7i.xlarge on-demand" in s for s in recorder.statuses)


def test_spot_if_available_takes_spot_when_there_is_some(moto: MotoServer, proxy: Ec2Proxy) -> None:
    instances, _, _ = _stop_request_after_launch(
        _aws(proxy, moto), moto, allocation="spot-if-available"
    )
    assert {i.get("InstanceLifecycle") for i in instances} == {"spot"}


def test_spot_means_spot_only(moto: MotoServer, proxy: Ec2Proxy) -> None:
    proxy.refuse("RunInstances", "InsufficientInstanceCapacity", "no spot capacity", when=spot)
    made = _request(allocation="spot")
    with pytest.raises(CapacityError):
        _aws(proxy, moto).provision(made, Recorder())
    assert all(spot(p) for p in proxy.calls("RunInstances"))
    assert nothing(held(moto, made.pool))


def test_cheapest_takes_the_cheapest_fitting_type_and_market(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    # moto's spot prices are near zero: spot of the smallest fitting type wins.
    instances, _, _ = _stop_request_after_launch(
        _aws(proxy, moto), moto, allocation="cheapest", vcpus=8
    )
    assert {i["InstanceType"] for i in instances} == {"m7i.2xlarge"}
    assert {i.get("InstanceLifecycle") for i in instances} == {"spot"}


def test_vcpus_and_memory_pick_the_machine(moto: MotoServer, proxy: Ec2Proxy) -> None:
    instances, _, _ = _stop_request_after_launch(
        _aws(proxy, moto), moto, allocation="spot", vcpus=64, memory_gb=256
    )
    assert {i["InstanceType"] for i in instances} == {"m7i.16xlarge"}
    assert {i.get("InstanceLifecycle") for i in instances} == {"spot"}


def test_an_instance_type_that_contradicts_the_request_is_refused_at_construction(
    moto: MotoServer,
) -> None:
    with pytest.raises(ValueError, match="fewer than vcpus=64"):
        sky.ComputePool(
            provider=provider(moto, instance_type="m7i.xlarge"), vcpus=64, nodes=1, quiet=True
        )
    with pytest.raises(ValueError, match="contradicts allocation='on-demand'"):
        sky.ComputePool(
            provider=provider(moto, spot=True), allocation="on-demand", nodes=1, quiet=True
        )


# ── prices up front ────────────────────────────────────────────────────────────────────


def test_the_choice_where_and_price_are_said_before_anything_is_created(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    _, recorder, _ = _stop_request_after_launch(_aws(proxy, moto), moto, accelerator="L4", nodes=2)
    announced = next(s for s in recorder.statuses if "about $" in s)
    assert "2 x g6.xlarge" in announced and "us-east-1" in announced
    assert "about $1.61/h for the pool" in announced  # 2 x $0.8048 in us-east-1
    # Said before the key pair was made.
    assert recorder.statuses.index(announced) < next(
        i for i, s in enumerate(recorder.statuses) if s.startswith("key pair")
    )


def test_max_hourly_cost_refuses_an_on_demand_pool_when_it_is_built(moto: MotoServer) -> None:
    with pytest.raises(ProvisionError) as caught:
        sky.ComputePool(
            provider=provider(moto),
            accelerator="H100:8",
            nodes=2,
            max_hourly_cost=50,
            quiet=True,
        )
    assert "about $110.08/h" in str(caught.value)  # 2 x p5.48xlarge at $55.04
    assert "max_hourly_cost=$50" in str(caught.value)


def test_max_hourly_cost_refuses_a_spot_pool_before_anything_is_created(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    made = _request(allocation="spot", accelerator="H100:8", max_hourly_cost=1e-9)
    with pytest.raises(ProvisionError, match="above max_hourly_cost"):
        _aws(proxy, moto).provision(made, Recorder())
    assert not set(proxy.actions()) & set(CREATES), proxy.actions()
    assert "DescribeSpotPriceHistory" in proxy.actions()


# ── validation before creation ─────────────────────────────────────────────────────────


def test_an_unknown_instance_type_is_refused_before_the_key_pair_exists(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    made = request()
    with pytest.raises(ProvisionError, match=r"no instance type 'm7i\.huge'"):
        _aws(proxy, moto, instance_type="m7i.huge").provision(made, Recorder())
    assert "DescribeInstanceTypes" in proxy.actions()
    assert not set(proxy.actions()) & set(CREATES), proxy.actions()


def test_a_mistyped_region_names_the_near_ones_and_touches_nothing(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    with pytest.raises(ProvisionError) as caught:
        sky.ComputePool(provider=_aws(proxy, moto, region="us-eats-1"), nodes=1, quiet=True)
    assert "unknown AWS region 'us-eats-1'" in str(caught.value)
    assert "'us-east-1'" in str(caught.value)
    with pytest.raises(ProvisionError, match="unknown AWS region 'xx-fake-1'"):
        sky.ComputePool(provider=_aws(proxy, moto, region="xx-fake-1"), nodes=1, quiet=True)
    assert proxy.actions() == []


# ── an answer lost in flight ───────────────────────────────────────────────────────────


@pytest.mark.parametrize("action", ["ImportKeyPair", "CreateSecurityGroup", "RunInstances"])
def test_ctrl_c_while_a_create_call_is_in_flight_leaves_nothing(
    moto: MotoServer, proxy: Ec2Proxy, action: str
) -> None:
    # EC2 makes the thing, and the client is interrupted before the answer arrives: it
    # never learns the id. The clean-up's sweeps (key pair, allocation tag) find it.
    proxy.hold(action)
    main = threading.get_ident()

    def interrupt_when_held() -> None:
        if proxy.reached.wait(60):
            signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt_when_held, daemon=True).start()
    made = request()
    try:
        with pytest.raises(KeyboardInterrupt):
            _aws(proxy, moto).provision(made, Recorder())
    finally:
        proxy.release()
    assert nothing(held(moto, made.pool))


def test_a_sweep_that_fails_is_named_with_the_down_command(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    proxy.refuse(
        "DescribeInstances",
        "UnauthorizedOperation",
        "You are not authorized to perform this operation.",
        when=lambda params: "key-name" in params.values(),
    )
    made = request(deadline=Checkpoint("launching"))
    with pytest.raises(KeyboardInterrupt) as caught:
        _aws(proxy, moto).provision(made, Recorder())
    notes = "".join(getattr(caught.value, "__notes__", []))
    assert "the search for instances by key pair" in notes, notes
    assert f"skyward down --pool {made.pool} --region us-east-1" in notes
    assert nothing(held(moto, made.pool))  # the sweep by tag still did its part


# ── errors without an answer ───────────────────────────────────────────────────────────


def test_a_connection_closed_without_an_answer_is_a_readable_error(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    proxy.drop("DescribeVpcs")
    api = Api.connect(region="us-east-1", profile=None, endpoint_url=proxy.url)
    with pytest.raises(ProvisionError) as caught:
        api.call(api.ec2.describe_vpcs, "finding the default VPC")
    message = str(caught.value)
    assert message.startswith("finding the default VPC: ")
    assert "AWS closed the connection before answering" in message or "cannot reach" in message
    assert "AttributeError" not in message


# ── multi-node GPUs: placement group, EFA, instance profile ───────────────────────────


def _interfaces(params: dict[str, str]) -> list[dict[str, str]]:
    """RunInstances' NetworkInterface.N.* parameters, as one dict per interface."""
    found: dict[int, dict[str, str]] = {}
    for key, value in params.items():
        if key.startswith("NetworkInterface."):
            _, index, field = key.split(".", 2)
            found.setdefault(int(index), {})[field] = value
    return [found[i] for i in sorted(found)]


@pytest.mark.parametrize(
    ("accelerator", "connect", "cards"),
    [("A100:8", "private", 4), ("H100:8", "private", 32), ("A100:8", "public", 1)],
)
def test_a_multi_node_efa_pool_gets_a_cluster_group_and_efa_on_each_card(
    moto: MotoServer, proxy: Ec2Proxy, accelerator: str, connect: str, cards: int
) -> None:
    moto.client("iam").create_instance_profile(InstanceProfileName="skyward-nodes")
    options: dict[str, Any] = {"connect": connect, "iam_instance_profile": "skyward-nodes"}
    if connect == "private":
        options["ssh_cidr"] = "10.0.0.0/8"
    seen: dict[str, Any] = {}

    def look() -> None:
        ec2 = moto.client("ec2")
        tag = [{"Name": "tag:skyward-pool", "Values": [made.pool]}]
        seen["placement"] = dict(proxy.placement_groups)  # moto has none: the proxy keeps them
        seen["group"] = ec2.describe_security_groups(Filters=tag)["SecurityGroups"][0]

    made = request(accelerator=accelerator, deadline=Checkpoint("waiting for", reached=look))
    recorder = Recorder()
    with pytest.raises(KeyboardInterrupt):
        _aws(proxy, moto, **options).provision(made, recorder)
    (launch,) = proxy.calls("RunInstances")
    interfaces = _interfaces(launch)
    assert len(interfaces) == cards
    assert all(i["InterfaceType"] == "efa" for i in interfaces)
    assert [i["NetworkCardIndex"] for i in interfaces] == [str(c) for c in range(cards)]
    assert [i["DeviceIndex"] for i in interfaces] == ["0"] + ["1"] * (cards - 1)
    (((region, group_name), (strategy, tags)),) = seen["placement"].items()
    assert region == "us-east-1"
    assert launch["Placement.GroupName"] == group_name
    assert strategy == "cluster" and tags["skyward-pool"] == made.pool
    assert launch["IamInstanceProfile.Name"] == "skyward-nodes"
    egress = [r for r in seen["group"]["IpPermissionsEgress"] if r.get("UserIdGroupPairs")]
    assert egress[0]["UserIdGroupPairs"][0]["GroupId"] == seen["group"]["GroupId"]
    if connect == "public":
        assert any("EFA on 1 of its 4 network cards" in s for s in recorder.statuses)
    assert nothing(held(moto, made.pool))
    assert proxy.placement_groups == {}  # deleted at teardown


@pytest.mark.parametrize(
    ("accelerator", "nodes", "options"),
    [("A100:8", 1, {}), ("L4:1", 2, {}), ("A100:8", 2, {"cluster_network": False}), (None, 2, {})],
    ids=["one-node", "no-efa-type", "asked-not-to", "cpu"],
)
def test_single_nodes_and_types_without_efa_get_plain_instances(
    moto: MotoServer, proxy: Ec2Proxy, accelerator: str | None, nodes: int, options: dict[str, Any]
) -> None:
    made = request(nodes=nodes, accelerator=accelerator, deadline=Checkpoint("waiting for"))
    with pytest.raises(KeyboardInterrupt):
        _aws(proxy, moto, **options).provision(made, Recorder())
    (launch,) = proxy.calls("RunInstances")
    assert [i.get("InterfaceType") for i in _interfaces(launch)] == [None]
    assert "Placement.GroupName" not in launch
    assert "CreatePlacementGroup" not in proxy.actions()
    assert "IamInstanceProfile.Name" not in launch
    assert nothing(held(moto, made.pool))


def test_an_instance_profile_arn_is_passed_as_an_arn(moto: MotoServer, proxy: Ec2Proxy) -> None:
    profile = moto.client("iam").create_instance_profile(InstanceProfileName="skyward-nodes")
    arn = profile["InstanceProfile"]["Arn"]
    made = request(nodes=1, deadline=Checkpoint("waiting for"))
    with pytest.raises(KeyboardInterrupt):
        _aws(proxy, moto, iam_instance_profile=arn).provision(made, Recorder())
    assert proxy.calls("RunInstances")[0]["IamInstanceProfile.Arn"] == arn
