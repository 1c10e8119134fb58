"""``sky.Spec`` and fallback across providers: the pool tries its specs in order (or cheapest
first) and runs on the first whose machines are made; a spec that fails leaves nothing
behind, and its reason is kept.

The failing specs are real: AWS against moto, whose instances are created and then cannot be
reached (moto invents their addresses, and the network guard refuses them) or are refused
for capacity by the tests' EC2 proxy; and an SSH host whose port nobody listens on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError
from support.clouds.aws.fake import MotoServer
from support.clouds.aws.pools import held, nothing, provider
from support.clouds.aws.proxy import Ec2Proxy
from support.sshhosts import USER, Hosts

import skyward as sky


@sky.compute
def where() -> str:
    return sky.instance_info().provider


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[Ec2Proxy]:
    with Ec2Proxy(moto.url) as running:
        yield running


def _instances(moto: MotoServer, pool: str) -> list[dict[str, Any]]:
    ec2 = moto.client("ec2")
    tag = [{"Name": "tag:skyward-pool", "Values": [pool]}]
    return [i for r in ec2.describe_instances(Filters=tag)["Reservations"] for i in r["Instances"]]


def _unreachable_ssh(hosts: Hosts) -> sky.SSH:
    """A host on the test bridge where nothing listens: connections are refused at once."""
    return sky.SSH(
        hosts=[f"{USER}@{hosts.bridge_address}:1"],
        key=hosts.client_key,
        known_hosts=hosts.known_hosts,
        connect_timeout=2.0,
    )


# ── falling back ───────────────────────────────────────────────────────────────────────


@pytest.mark.timeout(180)
def test_instances_that_cannot_be_reached_are_destroyed_and_the_next_spec_runs_the_pool(
    moto: MotoServer,
) -> None:
    aws = provider(moto, boot_timeout=1.0)
    with sky.ComputePool(sky.Spec(aws), sky.Spec(sky.Local()), nodes=2, quiet=True) as pool:
        assert where() @ pool == ["local", "local"]
        assert pool.spec.provider_kind == "local"
        first, used = pool.attempts
        assert first.spec.provider_kind == "aws" and isinstance(first.error, sky.ProvisionError)
        assert used.error is None and used.spec is pool.spec
        # The AWS spec made its machines, and destroyed them before the local one started.
        made = _instances(moto, pool.name)
        assert len(made) == 2
        assert {i["State"]["Name"] for i in made} <= {"shutting-down", "terminated"}
        assert nothing(held(moto, pool.name))


@pytest.mark.timeout(120)
def test_a_spec_without_capacity_gives_way_to_the_next_with_its_reason_kept(
    moto: MotoServer, proxy: Ec2Proxy
) -> None:
    proxy.refuse("RunInstances", "InsufficientInstanceCapacity", "no capacity here", status=500)
    aws = provider(moto, endpoint_url=proxy.url)
    with sky.ComputePool(sky.Spec(aws, accelerator="L4"), sky.Spec(), quiet=True) as pool:
        assert where() >> pool == "local"
        assert "no capacity here" in str(pool.attempts[0].error)
        assert pool.spec.accelerator is None  # the spec used, not the pool's first
    assert nothing(held(moto, pool.name))


@pytest.mark.timeout(120)
def test_an_unreachable_ssh_host_gives_way_to_the_local_pool(ssh_hosts: Hosts) -> None:
    specs = (sky.Spec(_unreachable_ssh(ssh_hosts)), sky.Spec(sky.Local()))
    with sky.ComputePool(*specs, quiet=True) as pool:
        assert where() >> pool == "local"
        assert [a.spec.provider_kind for a in pool.attempts] == ["ssh", "local"]
        assert "refused" in str(pool.attempts[0].error).lower()


@pytest.mark.timeout(180)
def test_when_every_spec_fails_one_error_lists_each_and_why_and_nothing_is_left(
    moto: MotoServer, proxy: Ec2Proxy, ssh_hosts: Hosts
) -> None:
    proxy.refuse("RunInstances", "InsufficientInstanceCapacity", "no capacity here", status=500)
    pool = sky.ComputePool(
        sky.Spec(provider(moto, endpoint_url=proxy.url), accelerator="L4"),
        sky.Spec(_unreachable_ssh(ssh_hosts)),
        quiet=True,
    )
    with pytest.raises(sky.NoSpecStarted) as caught:
        pool.start()
    message = str(caught.value)
    assert "1. aws, 1 node(s), L4" in message and "no capacity here" in message
    assert "2. ssh, 1 node(s): failed" in message
    assert [a.spec.provider_kind for a in caught.value.attempts] == ["aws", "ssh"]
    assert isinstance(caught.value, sky.ProvisionError)
    assert nothing(held(moto, pool.name))
    assert len(pool.attempts) == 2


def test_the_keyword_form_is_one_spec_and_fails_as_it_always_did(ssh_hosts: Hosts) -> None:
    pool = sky.ComputePool(provider=_unreachable_ssh(ssh_hosts), quiet=True)
    with pytest.raises(sky.ProvisionError) as caught:
        pool.start()
    assert not isinstance(caught.value, sky.NoSpecStarted)


# ── choosing the order ─────────────────────────────────────────────────────────────────


def test_cheapest_orders_the_specs_by_estimated_price_machines_you_have_first(
    moto: MotoServer,
) -> None:
    aws = provider(moto)
    pool = sky.ComputePool(
        sky.Spec(aws, accelerator="H100"),
        sky.Spec(aws, accelerator="T4"),
        sky.Spec(sky.Local()),
        selection="cheapest",
    )
    order = [(c.spec.provider_kind, c.spec.accelerator) for c in pool._choices.candidates]
    assert order == [("local", None), ("aws", "T4"), ("aws", "H100")]
    first = sky.ComputePool(sky.Spec(aws, accelerator="H100"), sky.Spec(sky.Local()))
    assert [c.spec.provider_kind for c in first._choices.candidates] == ["aws", "local"]


def test_a_spec_takes_the_pools_keywords_for_what_it_leaves_out(moto: MotoServer) -> None:
    pool = sky.ComputePool(
        sky.Spec(provider(moto), accelerator="L4"),
        sky.Spec(sky.Local(), accelerator=None),
        nodes=3,
        accelerator="T4",
    )
    specs = [c.spec for c in pool._choices.candidates]
    assert [(s.nodes, s.accelerator) for s in specs] == [(3, "L4"), (3, None)]
    assert specs[0].name == specs[1].name == pool.name


# ── refused when the pool is built, before anything is created ─────────────────────────


def test_a_wrong_later_spec_is_refused_before_the_first_creates_anything(
    moto: MotoServer,
) -> None:
    with pytest.raises(ValueError, match="the local pool has no A100") as caught:
        sky.ComputePool(sky.Spec(provider(moto)), sky.Spec(sky.Local(), accelerator="A100"))
    assert any("sky.Spec 2" in note for note in caught.value.__notes__)
    assert not moto.client("ec2").describe_instances()["Reservations"]


def test_specs_with_different_node_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="same nodes"):
        sky.ComputePool(sky.Spec(sky.Local(), nodes=2), sky.Spec(sky.Local(), nodes=4))


@pytest.mark.parametrize(
    ("arguments", "options", "message"),
    [
        ((sky.Spec(), sky.Local()), {}, "argument 2 is a Local"),
        ((sky.Spec(),), {"provider": sky.Local()}, "multiple values for argument 'provider'"),
    ],
)
def test_a_spec_mixed_with_a_bare_provider_is_a_type_error(
    arguments: tuple[Any, ...], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        sky.ComputePool(*arguments, **options)


def test_a_wrong_spec_value_is_a_validation_error_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="nodes"):
        sky.ComputePool(sky.Spec(sky.Local(), nodes=0), sky.Spec(sky.Local()))
    with pytest.raises(ValueError, match="selection"):
        sky.ComputePool(sky.Spec(), sky.Spec(), selection="fastest")  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    ("field", "hint"), [("region", "sky.AWS(region="), ("ttl", "idle_timeout")]
)
def test_a_05_spec_field_we_lack_says_what_to_write(field: str, hint: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(hint)):
        sky.Spec(sky.Local(), **{field: "x"})
