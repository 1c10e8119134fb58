"""More of the public skyward project's names, as its docs write them: ``LogConfig(level=
"TRACE")``, ``DEFAULT_IMAGE``, ``PoolSpec(...)`` with no provider, ``InstanceInfo.current()``,
``redirect_output`` / ``CallbackWriter``, ``sky.App``, ``reconcile_tick_interval=``,
``AWS(instance_profile_arn=)`` and ``Custom(..., cuda_min=)``. Construct-only where a cloud
would be needed; on a local pool where a node is involved."""

from __future__ import annotations

import doctest
import logging
from pathlib import Path

import pydantic
import pytest

import skyward as sky
from skyward.accelerators import Custom
from skyward.console.logs import recent_pools
from skyward.pool.spec import PoolSpec, image_cuda


@sky.compute
def captured() -> tuple[list[str], str, str, bool]:
    lines: list[str] = []
    with sky.redirect_output(lines.append) as (out, err):
        print("to the callback")
        import sys

        sys.stderr.write("an error line\n")
    return lines, out.getvalue(), err.getvalue(), sky.InstanceInfo.current() == sky.instance_info()


@sky.compute
def node() -> int:
    return sky.InstanceInfo.current().node


@pytest.mark.timeout(60)
def test_redirect_output_and_current_info_on_a_worker() -> None:
    with sky.ComputePool(nodes=2, quiet=True) as pool:
        lines, out, err, same = captured() >> pool
        assert node() @ pool == [0, 1]
    assert lines == ["to the callback", "\n", "an error line\n"]
    assert (out, err, same) == ("to the callback\n", "an error line\n", True)


def test_redirect_output_as_the_public_docs_write_it() -> None:
    lines: list[str] = []
    with sky.redirect_output(lines.append):
        print("captured")
    assert "captured\n" in "".join(lines)
    writer = sky.CallbackWriter(lines.append)
    assert writer.write("x") == 1 and writer.getvalue() == "x" and writer.writable()


def test_current_outside_a_pool_describes_this_process() -> None:
    info = sky.InstanceInfo.current()
    assert info == sky.instance_info() and info.pool is None


def test_default_image_is_the_image_a_pool_gets() -> None:
    assert sky.Image() == sky.DEFAULT_IMAGE
    assert sky.ComputePool().image.pip == sky.DEFAULT_IMAGE.pip


@pytest.mark.timeout(60)
def test_trace_is_a_level_below_debug_that_shows_each_metrics_sample(tmp_path: Path) -> None:
    config = sky.LogConfig(level="TRACE", file=tmp_path / "sky.log", console=False)
    assert config.level == "TRACE" and logging.getLevelName(5) == "TRACE"
    image = sky.Image(metrics=[sky.metrics.Memory(interval=0.2)])
    with sky.ComputePool(nodes=1, image=image, logging=config, quiet=True) as pool:
        assert logging.getLogger("skyward").getEffectiveLevel() == 5
        node() >> pool
        import time

        time.sleep(0.5)
    text = (tmp_path / "sky.log").read_text()
    assert " TRACE skyward: node 0 metrics {'mem': " in text
    assert logging.getLogger("skyward").level != 5  # put back at close


def test_pool_spec_without_a_provider_runs_its_docstring_examples() -> None:
    results = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(PoolSpec, globs={"sky": sky, "PoolSpec": PoolSpec}):
        results.run(test)
    summary = results.summarize(verbose=False)
    assert summary.attempted >= 3 and summary.failed == 0


def test_pool_spec_region_is_the_providers_and_is_refused_where_there_is_none() -> None:
    spec = PoolSpec(nodes=4, accelerator="H100", region="us-east-1", allocation="spot-if-available")
    assert spec.resolve(sky.AWS()).provider.region == "us-east-1"
    with pytest.raises(ValueError, match="contradicts the provider's region='eu-west-1'"):
        spec.resolve(sky.AWS(region="eu-west-1"))
    with pytest.raises(ValueError, match="provider local has no region; leave region out"):
        spec.resolve(sky.Local())


@pytest.mark.timeout(60)
def test_an_app_gives_its_pools_one_console_setting_and_one_log_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SKYWARD_LOG_DIR", str(tmp_path))
    with sky.App(console=False) as app:
        with sky.ComputePool(nodes=1) as a, sky.ComputePool(nodes=1, console="plain") as b:
            node() >> a
            node() >> b
    assert (a._console.mode, b._console.mode) == ("off", "plain")
    assert a.log_dir is not None and b.log_dir is not None
    assert a.log_dir.parent == b.log_dir.parent == app.log_dir
    assert app.log_dir.parent == tmp_path and app.log_dir.name.startswith("app-")
    assert {a.name, b.name} <= {p["name"] for p in recent_pools()}  # skyward logs finds them
    assert sky.ComputePool()._console.mode == "auto"  # outside the app again
    with pytest.raises(ValueError, match=r"App\(console=\.\.\.\)"):
        sky.App(console="loud")  # type: ignore[arg-type]


def test_reconcile_tick_interval_sets_the_autoscalers_tick() -> None:
    pool = sky.ComputePool(nodes=(1, 3), reconcile_tick_interval=0.05)
    assert pool.spec.reconcile_tick_interval == 0.05
    assert pool._autoscaler is not None and pool._autoscaler._tick == 0.05
    assert sky.ComputePool(nodes=2, reconcile_tick_interval=15.0).spec.nodes == 2
    with pytest.raises(pydantic.ValidationError, match="reconcile_tick_interval"):
        sky.ComputePool(reconcile_tick_interval=0)


def test_aws_instance_profile_arn_is_iam_instance_profile_and_auto_is_refused() -> None:
    arn = "arn:aws:iam::123456789012:instance-profile/reader"
    assert sky.AWS(instance_profile_arn=arn).iam_instance_profile == arn
    with pytest.raises(pydantic.ValidationError, match="never creates IAM resources"):
        sky.AWS(instance_profile_arn="auto")
    with pytest.raises(pydantic.ValidationError, match="give one of them"):
        sky.AWS(instance_profile_arn=arn, iam_instance_profile="other")


def test_custom_cuda_min_is_checked_against_the_images_cuda() -> None:
    gpu = Custom("H100-Custom", memory="80GB", count=8, cuda_min="12.0")
    assert str(gpu) == "H100-Custom-80GB:8"
    hosts = sky.SSH(hosts=["127.0.0.1"])
    ok = sky.ComputePool(hosts, accelerator=gpu, plugins=[sky.plugins.torch(cuda="12.6")])
    assert ok.spec.cuda_min == "12.0" and image_cuda(ok.image) == (12, 6)
    with pytest.raises(ValueError, match=r"needs CUDA 12\.8 or newer .* built for CUDA 12\.6"):
        sky.ComputePool(
            hosts,
            accelerator=Custom("B200-Custom", cuda_min="12.8"),
            plugins=[sky.plugins.torch(cuda="12.6")],
        )
    # An image that names no CUDA build leaves it to the node's driver.
    assert sky.ComputePool(hosts, accelerator=gpu).spec.cuda_min == "12.0"
    with pytest.raises(ValueError, match="cuda_min is a version"):
        Custom("X", cuda_min="twelve")


@pytest.mark.parametrize("name", ["Trainium2", "Inferentia2"])
def test_neuron_accelerators_say_what_works_instead(name: str) -> None:
    with pytest.raises(ValueError, match=r"no provider here offers AWS (trn2|inf2)") as caught:
        getattr(sky.accelerators, name)()
    # what it says to write instead is a pool that is built without complaint
    written = str(caught.value).split("image=", 1)[1]
    image = eval(written, {"sky": sky})
    pool = sky.ComputePool(
        sky.SSH(hosts=["127.0.0.1"]), accelerator=Custom(name, count=16), image=image
    )
    assert pool.spec.accelerator == f"{name}:16"
