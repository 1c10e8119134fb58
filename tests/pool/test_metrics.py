"""Live metrics (``sky.Image(metrics=...)``) on a 2-node local pool: the samples come at the
interval asked, labelled by node, into ``pool.metrics()`` and the pool's ``metrics.jsonl``,
stop when the pool closes, and draw a PNG with a panel per metric. GPU values are read
through NVML: here a stand-in ``pynvml`` module on the workers' path, as no GPU is present."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import skyward as sky
from skyward.console.metrics_view import line
from skyward.pool.metrics import as_table

FAKE_NVML = textwrap.dedent(
    """
    # A stand-in for nvidia-ml-py: two GPUs with fixed readings.
    from types import SimpleNamespace

    NVML_TEMPERATURE_GPU = 0
    def nvmlInit(): pass
    def nvmlDeviceGetCount(): return 2
    def nvmlDeviceGetHandleByIndex(i): return i
    def nvmlDeviceGetUtilizationRates(h): return SimpleNamespace(gpu=40 + h, memory=0)
    def nvmlDeviceGetMemoryInfo(h):
        return SimpleNamespace(used=(1 + h) * 2**30, total=80 * 2**30, free=0)
    def nvmlDeviceGetTemperature(h, sensor): return 60 + h
    """
)


@sky.compute
def hold(seconds: float) -> int:
    time.sleep(seconds)
    return sky.instance_info().node


def _rows(pool: sky.ComputePool) -> list[dict[str, Any]]:
    """``pool.metrics()`` as plain rows: from its DataFrame, times back in epoch seconds and
    each row without the metrics it lacks."""
    table = pool.metrics()
    if isinstance(table, list):
        return table
    table["time"] = table["time"].astype("int64") / 1e9
    return [
        {k: v for k, v in row.items() if v == v}  # NaN: not sampled that tick
        for row in table.to_dict("records")
    ]


@pytest.mark.timeout(60)
def test_samples_come_from_each_node_at_the_interval_asked_and_stop_at_close() -> None:
    image = sky.Image(metrics=[sky.metrics.CPU(interval=0.5), sky.metrics.Memory(interval=0.5)])
    with sky.ComputePool(nodes=2, image=image, quiet=True) as pool:
        assert hold(2.2) @ pool == [0, 1]
        log_dir = pool.log_dir
    rows = _rows(pool)
    assert {r["node"] for r in rows} == {0, 1}
    for node in (0, 1):
        times = sorted(r["time"] for r in rows if r["node"] == node and "mem" in r)
        assert len(times) >= 3, rows
        # No more samples than the interval asks for (the sampler keeps a fixed schedule: a
        # late tick is followed by one on time, so single gaps may be shorter); fewer only on
        # a loaded machine.
        assert len(times) <= (times[-1] - times[0]) / 0.5 + 2, times
        assert any(r["node"] == node and 0 <= r.get("cpu", -1) <= 100 for r in rows)
        assert all(0 < r["mem"] < 100 for r in rows if r["node"] == node and "mem" in r)
    kept = len(rows)
    time.sleep(1.2)  # two intervals: a sampler still running would have sent again
    assert len(_rows(pool)) == kept
    assert log_dir is not None
    written = [json.loads(x) for x in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert [w["node"] for w in written] == [r["node"] for r in rows]
    assert [w["time"] for w in written] == pytest.approx([r["time"] for r in rows], abs=1e-5)


@pytest.mark.timeout(60)
def test_metrics_none_sends_nothing() -> None:
    with sky.ComputePool(nodes=2, image=sky.Image(metrics=None), quiet=True) as pool:
        hold(1.0) @ pool
    assert _rows(pool) == []
    assert pool.log_dir is not None and not (pool.log_dir / "metrics.jsonl").exists()


@pytest.mark.timeout(60)
def test_gpu_values_are_read_through_nvml_per_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pynvml.py").write_text(FAKE_NVML)
    monkeypatch.syspath_prepend(str(tmp_path))  # the local workers get the client's path
    metrics = [
        sky.metrics.GPU(interval=0.2),
        sky.metrics.GPUMemory(interval=0.2),
        sky.metrics.GPUTemp(index=1, interval=0.2),
        sky.metrics.GPUMemoryTotal(),
    ]
    with sky.ComputePool(nodes=2, image=sky.Image(metrics=metrics), quiet=True) as pool:
        hold(0.8) @ pool
    rows = _rows(pool)
    got = {k: v for r in rows for k, v in r.items() if k.startswith("gpu")}
    assert got == {
        "gpu_util_0": 40.0,
        "gpu_util_1": 41.0,
        "gpu_mem_mb_0": 1024.0,
        "gpu_mem_mb_1": 2048.0,
        "gpu_temp_1": 61.0,
        "gpu_mem_total_mb_0": 81920.0,
        "gpu_mem_total_mb_1": 81920.0,
    }
    assert line(got) == "gpu 40% 41%  gpu mem 3.0/160 GB  61°C"


@pytest.mark.timeout(60)
def test_a_node_without_nvml_sends_its_other_values() -> None:
    metrics = [sky.metrics.GPU(interval=0.2), sky.metrics.Memory(interval=0.2)]
    with sky.ComputePool(nodes=1, image=sky.Image(metrics=metrics), quiet=True) as pool:
        hold(0.8) >> pool
    rows = _rows(pool)
    assert rows and all(set(r) == {"node", "time", "mem"} for r in rows)


@pytest.mark.timeout(90)
def test_the_plot_has_a_panel_per_metric_and_the_cli_draws_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image as Picture

    monkeypatch.setenv("SKYWARD_LOG_DIR", str(tmp_path / "logs"))
    metrics = [
        sky.metrics.CPU(interval=0.3),
        sky.metrics.Memory(interval=0.3),
        sky.metrics.Custom("answer", "echo 42", interval=0.3),
    ]
    with sky.ComputePool(nodes=2, image=sky.Image(metrics=metrics), quiet=True) as pool:
        hold(1.5) @ pool
    png = pool.plot_metrics(tmp_path / "m.png")
    assert png.stat().st_size > 10_000
    assert Picture.open(png).format == "PNG"
    figure = _figure_axes(pool)
    assert figure == 3
    assert {r["answer"] for r in _rows(pool) if "answer" in r} == {42.0}
    out = tmp_path / "cli.png"
    done = subprocess.run(
        [sys.executable, "-m", "skyward.cli", "logs", "--plot", pool.name, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "SKYWARD_LOG_DIR": str(tmp_path / "logs")},
    )
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 10_000


def _figure_axes(pool: sky.ComputePool) -> int:
    """How many panels the plot of ``pool``'s rows has (drawn again, counted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from skyward.console import metrics_plot

    made: list[Any] = []
    real = plt.subplots

    def counting(*args: Any, **kwargs: Any) -> Any:
        figure, axes = real(*args, **kwargs)
        made.append(axes)
        return figure, axes

    plt.subplots = counting
    try:
        metrics_plot.plot(_rows(pool), Path(pool.log_dir or ".") / "again.png")
    finally:
        plt.subplots = real
    return int(made[0].size)


def test_rows_become_a_dataframe_with_pandas() -> None:
    import pandas as pd

    rows = [{"node": 0, "time": 1.0, "cpu": 5.0}, {"node": 1, "time": 1.1, "mem": 7.0}]
    frame = as_table(rows)
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == ["node", "time", "cpu", "mem"]


def test_metrics_are_checked_when_made() -> None:
    with pytest.raises(ValueError, match="interval"):
        sky.metrics.CPU(interval=0)
    with pytest.raises(ValueError, match="more than once"):
        sky.Image(metrics=[sky.metrics.CPU(), sky.metrics.CPU(interval=1)])
    assert sky.Image().metrics == sky.metrics.Default()


def test_a_remote_nvidia_pool_installs_nvml_only_when_it_asks_for_gpu_metrics() -> None:
    host = sky.SSH(hosts=["127.0.0.1"])
    gpu = sky.Image(metrics=[sky.metrics.GPU(), sky.metrics.CPU()])
    assert sky.ComputePool(host, accelerator="A100", image=gpu).image.pip == ("nvidia-ml-py",)
    assert sky.ComputePool(host, accelerator="RTX_4090", image=gpu).image.pip == ("nvidia-ml-py",)
    assert sky.ComputePool(host, accelerator="v5e", image=gpu).image.pip == ()  # a TPU
    # The default reads GPUs where the node has nvidia-ml-py, and installs nothing.
    assert sky.ComputePool(host, accelerator="A100").image.pip == ()
    assert sky.ComputePool(host, accelerator="A100", image=sky.Image(metrics=None)).image.pip == ()
    cpu_only = sky.Image(metrics=[sky.metrics.CPU()])
    assert sky.ComputePool(host, accelerator="A100", image=cpu_only).image.pip == ()
    assert sky.ComputePool(host, image=gpu).image.pip == ()  # no GPU
    assert sky.ComputePool(nodes=2, image=gpu).image.pip == ()  # local: the client's own
