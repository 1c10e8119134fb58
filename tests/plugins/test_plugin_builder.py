"""Plugins as skyward 0.5's plugin docs write them: ``from skyward.plugins import Plugin``,
the ``Plugin.create(...)`` builder, ``dataclasses.replace`` on the image, and the per-call
``decorate`` hook beside ``around_app``."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import wraps
from pathlib import Path
from typing import Any

import pydantic
import pytest
from support.pools import ssh_provider
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.plugins import Plugin


def my_framework(log: str) -> Plugin:
    """The docs' custom plugin, with a log file standing in for setup_my_framework()."""

    def transform(image: sky.Image, cluster: Any) -> sky.Image:
        return replace(image, env={**image.env, "MY_FRAMEWORK": "1"})

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with open(log, "a") as f:
                f.write(f"setup for {fn.__name__}\n")
            return fn(*args, **kwargs)

        return wrapper

    return Plugin.create("my-framework").with_image_transform(transform).with_decorator(decorate)


@sky.compute
def my_task(x: int) -> tuple[int, str | None]:
    return x * 2, os.environ.get("MY_FRAMEWORK")


def test_plugin_is_importable_from_skyward_plugins() -> None:
    assert Plugin is sky.Plugin


def test_the_builder_returns_new_plugins_and_leaves_the_old_alone() -> None:
    base = Plugin.create("p")
    with_app = base.with_around_app(lambda info: contextlib.nullcontext())
    assert base.around_app is None and with_app.around_app is not None
    assert with_app.with_decorator(lambda fn: fn).around_app is with_app.around_app


def test_replace_on_an_image_makes_a_validated_image() -> None:
    image = sky.Image(pip=["numpy"])
    assert replace(image, pip=(*image.pip, "my-lib")).pip == ("numpy", "my-lib")
    with pytest.raises(ValueError):
        replace(image, python="2.7")


@pytest.mark.timeout(60)
def test_the_docs_custom_plugin_runs_its_transform_and_decorates_every_call(
    tmp_path: Any,
) -> None:
    log = str(tmp_path / "log")
    with sky.ComputePool(nodes=2, plugins=[my_framework(log)], quiet=True) as pool:
        assert my_task(21) >> pool == (42, "1")
        assert my_task(1) @ pool == [(2, "1"), (2, "1")]
    with open(log) as f:
        assert f.read().splitlines() == ["setup for my_task"] * 3


def tagger(tag: str, log: str) -> Plugin:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with open(log, "a") as f:
                f.write(f"{tag} before\n")
            try:
                return fn(*args, **kwargs)
            finally:
                with open(log, "a") as f:
                    f.write(f"{tag} after\n")

        return wrapper

    @contextlib.contextmanager
    def around(info: sky.InstanceInfo) -> Iterator[None]:
        with open(log, "a") as f:
            f.write(f"{tag} app\n")
        yield

    return Plugin.create(tag).with_decorator(decorate).with_around_app(around)


@pytest.mark.timeout(60)
def test_decorators_nest_first_plugin_outermost_inside_around_app(tmp_path: Any) -> None:
    log = str(tmp_path / "log")
    with sky.ComputePool(plugins=[tagger("a", log), tagger("b", log)], quiet=True) as pool:
        pool.run(lambda: None)
    with open(log) as f:
        assert f.read().splitlines() == [
            "a app",
            "b app",
            "a before",
            "b before",
            "b after",
            "a after",
        ]


def test_an_image_is_a_dataclass_to_dataclasses_functions() -> None:
    from dataclasses import asdict, fields

    image = sky.Image(pip=["numpy"], env={"A": "1"})
    assert "pip" in [f.name for f in fields(image)]
    assert asdict(image)["pip"] == ("numpy",) and asdict(image)["env"] == {"A": "1"}


# ── with_bootstrap: shell steps on remote nodes' bootstraps ─────────────────────────────


@sky.compute
def read_marker(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


@pytest.mark.timeout(180)
def test_bootstrap_steps_run_on_an_ssh_node_after_its_installs(
    ssh_hosts: Hosts, package_index: PackageIndex, tmp_path: Path
) -> None:
    marker = tmp_path / "bootstrapped"
    # A function of the spec, as 0.5's factories of the cluster were; the step runs with the
    # node's environment first on PATH, so its python is the workers' own.
    steps = Plugin.create("marks").with_bootstrap(
        lambda spec: [
            f"python -c 'import sys, cloudpickle; print(sys.prefix)' > {marker}",
            f"echo nodes={spec.nodes} >> {marker}",
        ]
    )
    image = sky.Image(index_url=package_index.url)
    provider = ssh_provider(ssh_hosts, ssh_hosts.hosts[0].target)
    with sky.ComputePool(provider=provider, image=image, plugins=[steps], quiet=True) as pool:
        assert pool.image.setup[-1] == f"echo nodes=1 >> {marker}"
        prefix, nodes = (read_marker(str(marker)) >> pool).splitlines()
        assert nodes == "nodes=1"
        assert pool.run(lambda: sys.prefix) == prefix


def test_bootstrap_steps_follow_the_plugins_in_order_after_the_images_setup() -> None:
    first = Plugin.create("first").with_bootstrap(["echo 1"])
    second = Plugin.create("second").with_bootstrap(lambda spec: ("echo 2",))
    pool = sky.ComputePool(
        provider=sky.SSH(hosts=["h"]),
        image=sky.Image(setup=["echo 0"]),
        plugins=[first, second],
    )
    assert pool.image.setup == ("echo 0", "echo 1", "echo 2")


def test_a_local_pool_refuses_bootstrap_steps_naming_the_plugin() -> None:
    plugin = Plugin.create("drivers").with_bootstrap(["apt-get install -y foo"])
    with pytest.raises(sky.PluginError, match="plugin 'drivers' adds bootstrap steps"):
        sky.ComputePool(plugins=[plugin])


@pytest.mark.parametrize(
    "steps", ["echo one string", lambda spec: "echo one string", lambda spec: [""], [3]]
)
def test_bootstrap_steps_are_commands_or_the_plugin_is_refused(steps: Any) -> None:
    with pytest.raises((sky.PluginError, pydantic.ValidationError)):
        plugin = Plugin.create("bad").with_bootstrap(steps)
        sky.ComputePool(provider=sky.SSH(hosts=["h"]), plugins=[plugin])


# ── with_around_client: a context around the running pool, on the client ──────────────


def client_hook(name: str, events: list[str], fail: bool = False) -> Plugin:
    lock = threading.Lock()  # unpicklable: the client's hooks never travel to workers

    @contextlib.contextmanager
    def around(pool: sky.ComputePool, spec: sky.PoolSpec) -> Iterator[None]:
        with lock:
            events.append(f"{name} enter {pool.statistics().state} {spec.nodes}")
        if fail:
            raise RuntimeError(f"{name} cannot start")
        try:
            yield
        except BaseException as exc:
            events.append(f"{name} saw {type(exc).__name__}")
            raise
        finally:
            events.append(f"{name} exit {pool.statistics().state}")

    return Plugin.create(name).with_around_client(around)


@sky.compute
def one() -> int:
    return 1


@pytest.mark.timeout(60)
def test_around_client_wraps_the_running_pool_first_plugin_outermost() -> None:
    events: list[str] = []
    plugins = [client_hook("a", events), client_hook("b", events)]
    with sky.ComputePool(nodes=2, plugins=plugins, quiet=True) as pool:
        assert one() >> pool == 1
        events.append("body")
    assert events == [
        "a enter running 2",
        "b enter running 2",
        "body",
        "b exit running",
        "a exit running",
    ]
    assert pool.statistics().state == "closed"


@pytest.mark.timeout(60)
def test_around_client_sees_the_error_that_ends_the_block_and_the_pool_still_closes() -> None:
    events: list[str] = []
    with pytest.raises(ZeroDivisionError):
        with sky.ComputePool(plugins=[client_hook("a", events)], quiet=True) as pool:
            _ = 1 / 0
    assert events == ["a enter running 1", "a saw ZeroDivisionError", "a exit running"]
    assert pool.statistics().state == "closed"


@pytest.mark.timeout(60)
def test_a_failing_around_client_closes_the_pool_and_exits_the_ones_entered() -> None:
    events: list[str] = []
    plugins = [client_hook("a", events), client_hook("b", events, fail=True)]
    pool = sky.ComputePool(plugins=plugins, quiet=True)
    with pytest.raises(sky.PluginError, match="plugin 'b': around_client failed: b cannot start"):
        pool.start()
    assert events == [
        "a enter running 1",
        "b enter running 1",
        "a saw PluginError",
        "a exit running",
    ]
    assert pool.statistics().state == "closed"


@pytest.mark.timeout(60)
def test_close_leaves_around_client_once_in_a_notebook_too() -> None:
    events: list[str] = []
    pool = sky.ComputePool(plugins=[client_hook("a", events)], quiet=True).start()
    pool.close()
    pool.close()
    assert events == ["a enter running 1", "a exit running"]
