"""Plugins as skyward 0.5's plugin docs write them: ``from skyward.plugins import Plugin``,
the ``Plugin.create(...)`` builder, ``dataclasses.replace`` on the image, and the per-call
``decorate`` hook beside ``around_app``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import wraps
from typing import Any

import pytest

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
