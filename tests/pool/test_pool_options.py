"""Pool options from skyward 0.5's documented API: ``vcpus=``, ``memory_gb=``,
``allocation=``, ``nodes=(min, max)``. Each is honoured, refused with a reason, or a
documented no-op; none is an unknown keyword."""

from __future__ import annotations

import ast
import inspect
import itertools
import os
import re
import types
from collections.abc import Sequence
from typing import Literal, Union, get_args, get_origin, get_type_hints

import pydantic
import pytest
from support import ROOT
from support.pools import ssh_provider
from support.sshhosts import Hosts

import skyward as sky
from skyward.accelerators import Accelerator
from skyward.pool.spec import PoolOptions, PoolSpec


def test_the_documented_keywords_are_accepted_by_the_local_pool() -> None:
    # skyward 0.5's distributed-collections example, with the provider swapped
    pool = sky.ComputePool(nodes=4, vcpus=1, memory_gb=0.5, allocation="spot-if-available")
    assert (pool.spec.vcpus, pool.spec.memory_gb, pool.spec.allocation) == (
        1,
        0.5,
        "spot-if-available",
    )
    request = pool.spec.request(pool.image)
    assert (request.vcpus, request.memory_gb, request.allocation) == (1, 0.5, "spot-if-available")


@pytest.mark.parametrize("allocation", ["on-demand", "spot-if-available", "cheapest"])
def test_allocations_that_can_mean_this_machine_run_here(allocation: str) -> None:
    with sky.ComputePool(allocation=allocation, quiet=True) as pool:  # type: ignore[arg-type]
        assert pool.run(os.getpid) != os.getpid()


def test_spot_is_refused_by_the_local_provider_with_why() -> None:
    with pytest.raises(ValueError, match="allocation='spot' cannot be honoured: the local"):
        sky.ComputePool(allocation="spot")


def test_an_unknown_allocation_names_the_field() -> None:
    with pytest.raises(pydantic.ValidationError, match="allocation"):
        sky.ComputePool(allocation="preemptible")  # type: ignore[arg-type]


def test_more_cpus_or_memory_than_this_machine_has_is_refused() -> None:
    with pytest.raises(ValueError, match=r"vcpus=4096 per node, but this machine has \d+ CPU"):
        sky.ComputePool(vcpus=4096)
    with pytest.raises(ValueError, match="memory_gb=1e\\+06 per node"):
        sky.ComputePool(memory_gb=1_000_000)
    with pytest.raises(pydantic.ValidationError, match="vcpus"):
        sky.ComputePool(vcpus=0)


def test_ssh_refuses_spot_and_leaves_sizes_to_the_hosts(ssh_hosts: Hosts) -> None:
    provider = ssh_provider(ssh_hosts)
    with pytest.raises(ValueError, match="SSH runs on hosts you already have"):
        sky.ComputePool(provider=provider, allocation="spot")
    sky.ComputePool(provider=provider, vcpus=64, memory_gb=512, allocation="on-demand")


@pytest.mark.timeout(60)
def test_a_node_range_starts_the_minimum_and_says_it_autoscales(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sky.ComputePool(nodes=(1, 3), console="plain") as pool:
        assert pool.spec.nodes == 3 and pool.spec.min_nodes == 1
        assert pool.current_nodes() == 1  # tests/pool/test_autoscale.py: how it grows
        assert pool.broadcast(lambda: sky.instance_info().total_nodes) == [1]
    assert "starting 1 node(s), growing to 3 while calls wait" in capsys.readouterr().err


@pytest.mark.parametrize("nodes", [(3, 1), (0, 2), (1, 2, 3)])
def test_a_wrong_node_range_is_refused(nodes: tuple[int, ...]) -> None:
    with pytest.raises(pydantic.ValidationError, match="nodes"):
        sky.ComputePool(nodes=nodes)  # type: ignore[arg-type]


# ── each option spelled once: PoolOptions (names, types) against PoolSpec (defaults) ───────

# PoolSpec fields no keyword sets directly: what the caller's options unfold into.
_UNFOLDED = {
    "provider": "the positional argument",
    "min_nodes": "nodes=",
    "executor": "worker=",
    "region": "skyward 0.5's PoolSpec(region=), given to the provider by PoolSpec.resolve",
    "cuda_min": "accelerator=Custom(..., cuda_min=)",
}
# Where an option takes more than its field keeps (PoolOptions' docstring says the same).
_WIDER: dict[str, set[object]] = {
    "nodes": {tuple[int, int]},
    "image": {type(None)},
    "name": {type(None)},
    "concurrency": {type(None)},
    "accelerator": {Accelerator},  # sky.accelerators.A100(count=8): kept as "A100:8"
    "logging": {bool},  # skyward 0.5's logging=True / False
}
_OPTIONS = get_type_hints(PoolOptions)
_ROOT = ROOT


def _members(annotation: object) -> set[object]:
    """A union's or a Literal's members, one type or literal value each."""
    if get_origin(annotation) in (Union, types.UnionType):
        return set().union(*(_members(a) for a in get_args(annotation)))
    if get_origin(annotation) is Literal:
        return {Literal[value] for value in get_args(annotation)}  # type: ignore[valid-type]
    return {annotation}


def _field_members(name: str) -> set[object]:
    members = _members(PoolSpec.model_fields[name].annotation)
    # A tuple field takes any sequence of its items: the option's Sequence[...] stands for it.
    return {Sequence[get_args(m)[0]] if get_origin(m) is tuple else m for m in members}


def test_every_option_sets_a_pool_spec_field_and_every_field_has_an_option() -> None:
    fields = set(PoolSpec.model_fields)
    assert set(_OPTIONS) - fields == {"worker"}  # an alias the spec's validator unfolds
    assert fields - set(_OPTIONS) == set(_UNFOLDED)
    spec = sky.ComputePool(nodes=(2, 3), worker=sky.Worker(executor="process")).spec
    assert (spec.min_nodes, spec.executor) == (2, "process")


@pytest.mark.parametrize("name", sorted(set(_OPTIONS) - {"worker"}))
def test_an_option_takes_what_its_field_takes_and_only_the_documented_more(name: str) -> None:
    given, kept = _members(_OPTIONS[name]), _field_members(name)
    assert kept <= given, f"{name}: PoolSpec takes {kept - given} that the option does not"
    assert given - kept == _WIDER.get(name, set())


@pytest.mark.parametrize("name", sorted(n for n, wider in _WIDER.items() if type(None) in wider))
def test_none_for_an_option_whose_field_takes_no_none_means_the_default(name: str) -> None:
    default = sky.ComputePool().spec
    chosen = sky.ComputePool(**{name: None}).spec  # type: ignore[misc]
    if name == "name":  # made afresh for each pool
        assert chosen.name.startswith("pool-") and chosen.name != default.name
    else:
        assert getattr(chosen, name) == getattr(default, name)


def test_the_signature_shows_each_option_with_pool_spec_default() -> None:
    parameters = inspect.signature(sky.ComputePool).parameters
    assert list(parameters) == ["provider", "specs", *_OPTIONS]  # specs: more sky.Spec
    for name in _OPTIONS:
        field = PoolSpec.model_fields.get(name)
        if field is not None and field.default_factory is None:
            assert parameters[name].default == field.default, name
        else:  # a default made afresh (the name, the image) or an alias (worker)
            assert parameters[name].default is None, name
        assert parameters[name].annotation == _OPTIONS[name], name


def test_a_misspelled_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"ComputePool\(\) got an unexpected keyword .*'node'"):
        sky.ComputePool(node=2)  # type: ignore[call-arg]


def test_every_option_has_a_docstring() -> None:
    tree = ast.parse(inspect.getsource(PoolOptions))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = {
        target.target.id
        for target, after in itertools.pairwise(body)
        if isinstance(target, ast.AnnAssign)
        and isinstance(target.target, ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
    }
    assert documented == set(_OPTIONS)


def test_the_api_guide_lists_every_option_with_its_default() -> None:
    guide = (_ROOT / "docs" / "api.md").read_text()
    block = guide.split("sky.ComputePool(\n", 1)[1].split("\n)\n", 1)[0]
    listed: dict[str, object] = {}
    for line in block.splitlines():
        match = re.match(r"\s*(\w+)=(.*?),\s*(#.*)?$", line)
        if match:
            listed[match.group(1)] = eval(match.group(2), {"sky": sky})
    assert list(listed) == ["provider", *_OPTIONS]
    shown = inspect.signature(sky.ComputePool).parameters
    for name, value in listed.items():
        field = PoolSpec.model_fields.get(name)
        made_afresh = field is not None and field.default_factory is not None
        assert value == shown[name].default or (
            made_afresh and value == field.default_factory()  # type: ignore[union-attr,call-arg,misc]
        ), name
