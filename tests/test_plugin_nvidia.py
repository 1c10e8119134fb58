"""``sky.plugins.cuml()`` and ``sky.plugins.mps()``: their image changes, their lifecycle
commands against a stand-in ``nvidia-cuda-mps-control``, and their refusal on CPU pools.
(Running them for real needs a GPU.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import skyward as sky
from skyward._info import InstanceInfo
from skyward.pool.spec import PoolSpec


def _gpu_spec(*plugins: sky.Plugin) -> PoolSpec:
    return PoolSpec.model_construct(plugins=plugins, accelerator="A100", nodes=2)


def test_cuml_comes_from_nvidias_index_scoped_to_rapids() -> None:
    plugin = sky.plugins.cuml(cuda="12", version="25.10")
    assert plugin.transform is not None
    image = plugin.transform(sky.Image(), _gpu_spec(plugin))
    assert image.pip == ("cuml-cu12==25.10",)
    [index] = image.pip_indexes
    assert index.url == "https://pypi.nvidia.com"
    assert "cuml-cu12" in index.packages and "cudf-cu12" in index.packages


@pytest.mark.parametrize("plugin", [sky.plugins.cuml, sky.plugins.mps])
def test_gpu_only_plugins_refuse_a_pool_without_an_accelerator(plugin: object) -> None:
    with pytest.raises(sky.PluginError, match="needs NVIDIA GPUs"):
        sky.ComputePool(plugins=[plugin()], console="off")  # type: ignore[operator]


def test_bad_options_are_refused_when_the_plugin_is_made() -> None:
    with pytest.raises(sky.PluginError, match="CUDA 12 and 13"):
        sky.plugins.cuml(cuda=11)
    with pytest.raises(ValueError, match="active_thread_percentage"):
        sky.plugins.mps(active_thread_percentage=0)
    with pytest.raises(ValueError, match="pinned_memory_limit"):
        sky.plugins.mps(pinned_memory_limit="lots")


def test_mps_starts_the_daemon_before_the_workers_code_and_quits_it_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "calls"
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE '
        f'mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT stdin=$(cat)" >> {record}\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        monkeypatch.delenv(key, raising=False)
    plugin = sky.plugins.mps(active_thread_percentage=50, pinned_memory_limit="8G")
    info = InstanceInfo(
        node=0, total_nodes=1, head_addr="127.0.0.1", head_port=0, peers=("x",), hostname="h0"
    )
    assert plugin.around_app is not None
    with plugin.around_app(info):
        started = record.read_text().splitlines()
        assert len(started) == 1 and started[0].startswith("args=-d pipe=")
        assert "pct=50 mem=0=8G" in started[0]
        assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] in started[0]  # the worker's clients too
    stopped = record.read_text().splitlines()[1]
    assert stopped.startswith("args= ") and stopped.endswith("stdin=quit")


def test_mps_without_the_control_program_says_where_it_comes_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    info = InstanceInfo(
        node=3, total_nodes=4, head_addr="h", head_port=1, peers=("a",) * 4, hostname="h3"
    )
    plugin = sky.plugins.mps()
    assert plugin.around_app is not None
    with pytest.raises(sky.PluginError, match="node 3 has no nvidia-cuda-mps-control"):
        with plugin.around_app(info):
            pass
