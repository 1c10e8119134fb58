"""``sky.plugins.cuml()`` and ``sky.plugins.mps()``: their image changes, their lifecycle
commands against a stand-in ``nvidia-cuda-mps-control``, and their refusal on CPU pools.
(Running them for real needs a GPU.)"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

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
    from skyward.plugins._nvidia import node_directory

    assert not os.path.exists(node_directory(info))  # the run's directory went with it


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


# ── one daemon per node with several workers, on a local pool with a stand-in program ─────

_FAKE_MPS_CONTROL = """#!/bin/sh
# A stand-in for NVIDIA's nvidia-cuda-mps-control: records each call with the caller's pid.
# -d starts a "daemon" (a sleep in a session of its own, as the real one leaves its caller's)
# and writes its pid file where the real one does; it refuses a second daemon on one pipe
# directory, as the real one does; "quit" on stdin ends it, a moment after the command has
# returned (the real one, too, is still shutting down when its control command is back).
pipe="$CUDA_MPS_PIPE_DIRECTORY"
pidfile="$pipe/nvidia-cuda-mps-control.pid"
if [ "$1" = "-d" ]; then
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "refused $pipe $PPID" >> {record}
    echo "An instance of this daemon is already running" >&2
    exit 1
  fi
  setsid sleep 600 </dev/null >/dev/null 2>&1 &
  echo $! > "$pidfile"
  echo $! >> {daemons}
  echo "start $pipe $PPID ${{CUDA_VISIBLE_DEVICES-unset}}" >> {record}
  exit 0
fi
command=$(cat)
echo "$command $pipe $PPID" >> {record}
if [ "$command" = "quit" ]; then
  daemon=$(cat "$pidfile")
  (sleep 0.3; rm -f "$pidfile"; kill "$daemon") </dev/null >/dev/null 2>&1 &
fi
"""


def _worker_info(**changes: Any) -> InstanceInfo:
    """Worker 0 of node 0 in a 1-node pool, as a worker sees itself, with ``changes``."""
    fields: dict[str, Any] = {
        "node": 0,
        "total_nodes": 1,
        "head_addr": "h",
        "head_port": 1,
        "peers": ("h",),
        "hostname": "h",
        "accelerators": 1,
        "worker": 0,
        "workers_per_node": 1,
        "job_id": "run-1",
    }
    return InstanceInfo(**(fields | changes))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@sky.compute
def mps_view() -> tuple[int, int, int, str, int | None]:
    """(pid, node, local worker, pipe directory, the daemon's pid if it runs) on a worker."""
    from skyward.plugins._nvidia import daemon_pid

    info = sky.instance_info()
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    return os.getpid(), info.node, info.worker, pipe, daemon_pid(pipe)


@pytest.mark.timeout(120)
def test_each_node_runs_one_daemon_started_by_its_worker_0_kept_through_a_gang_restart(
    tmp_path: Path,
) -> None:
    record, daemons = tmp_path / "calls", tmp_path / "daemons"
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    fake.write_text(_FAKE_MPS_CONTROL.format(record=record, daemons=daemons))
    fake.chmod(0o755)
    # The local pool refuses accelerators, and mps refuses a pool without one: its worker
    # hooks, as they are, in a plugin without the image check.
    hooks = sky.plugins.mps(active_thread_percentage=50)
    plugin = sky.Plugin(name="mps", around_app=hooks.around_app)
    tied = sky.Plugin(name="tied", gang=True)  # a lost worker restarts every worker
    image = sky.Image(env={"PATH": f"{fake.parent}:{os.environ['PATH']}"})
    try:
        with sky.ComputePool(
            nodes=2, workers_per_node=2, plugins=[plugin, tied], image=image, console="off"
        ) as pool:
            before = pool.broadcast(mps_view)
            starts = [line.split() for line in record.read_text().splitlines()]
            # One start per node, by that node's worker 0, seen by both of its workers.
            worker0 = {node: pid for pid, node, local, _, _ in before if local == 0}
            pipes = {node: pipe for _, node, _, pipe, _ in before}
            assert sorted((s[0], s[1], int(s[2])) for s in starts) == sorted(
                ("start", pipes[node], worker0[node]) for node in (0, 1)
            )
            assert pipes[0] != pipes[1]
            for _, node, _, pipe, daemon in before:
                assert pipe == pipes[node] and daemon is not None and _alive(daemon)
            daemon_of = {node: daemon for _, node, _, _, daemon in before}
            assert daemon_of[0] != daemon_of[1]

            os.kill(before[0][0], signal.SIGKILL)  # node 0's worker 0: the gang restarts
            while pool.statistics().workers_replaced < 4:
                time.sleep(0.05)
            after = pool.broadcast(mps_view)
            assert not {pid for pid, *_ in after} & {pid for pid, *_ in before}
            # The daemons outlived the workers they served, and the new ones use them.
            assert {node: daemon for _, node, _, _, daemon in after} == daemon_of
            assert len(record.read_text().splitlines()) == 2  # no start, no refusal
        calls = [line.split() for line in record.read_text().splitlines()]
        # Stopped once per node, by the last of its workers to leave.
        assert sorted((c[0], c[1]) for c in calls[2:]) == [("quit", pipes[0]), ("quit", pipes[1])]
        assert not any(_alive(d) for d in daemon_of.values())
    finally:
        for line in daemons.read_text().split() if daemons.exists() else ():
            if _alive(int(line)):
                os.kill(int(line), signal.SIGKILL)


def test_a_worker_the_pool_replaces_leaves_the_daemon_to_the_next_and_a_closing_one_quits_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gang restart tells each worker it is replaced before killing it: leaving then, the
    node's last worker must not quit the daemon (the quit would race the kill, and the new
    worker 0 joins the daemon it finds). The next worker to leave on a close quits it."""
    import shutil

    from skyward.plugins._nvidia import daemon_pid, node_directory
    from skyward.worker import hooks

    record, daemons = tmp_path / "calls", tmp_path / "daemons"
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    fake.write_text(_FAKE_MPS_CONTROL.format(record=record, daemons=daemons))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(hooks, "_replaced", False)
    # A node directory of its own: a kept daemon's files must not meet another test's.
    info = _worker_info(job_id=f"replaced-{os.getpid()}-{time.time_ns()}")
    base = node_directory(info)
    plugin = sky.plugins.mps()
    assert plugin.around_app is not None
    try:
        with plugin.around_app(info):
            pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
            daemon = daemon_pid(pipe)
            hooks.replacing()  # what the worker does on the pool's Shutdown(replaced=True)
        assert [line.split()[0] for line in record.read_text().splitlines()] == ["start"]
        assert daemon is not None and daemon_pid(pipe) == daemon

        monkeypatch.setattr(hooks, "_replaced", False)  # the next worker, closed normally
        with plugin.around_app(info):
            assert daemon_pid(os.environ["CUDA_MPS_PIPE_DIRECTORY"]) == daemon
        assert [line.split()[0] for line in record.read_text().splitlines()] == [
            "start",
            "quit",
        ]
        assert daemon_pid(pipe) is None
        assert not os.path.exists(base)  # gone with the daemon; kept through the restart
    finally:
        for line in daemons.read_text().splitlines() if daemons.exists() else []:
            if _alive(int(line)):
                os.kill(int(line), signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


def test_mps_must_come_before_plugins_that_start_cuda() -> None:
    spec = _gpu_spec(sky.plugins.torch(), sky.plugins.mps())
    plugin = spec.plugins[1]
    assert plugin.transform is not None
    with pytest.raises(sky.PluginError, match=r"must come before torch"):
        plugin.transform(sky.Image(), spec)
    first = _gpu_spec(sky.plugins.mps(), sky.plugins.torch())
    assert first.plugins[0].transform is not None
    first.plugins[0].transform(sky.Image(), first)


def test_with_several_workers_a_worker_names_its_gpus_as_the_nodes_daemon_numbers_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVIDIA: a daemon started with CUDA_VISIBLE_DEVICES set renumbers those GPUs from 0 for
    its clients. The daemon gets the node's list; worker 0 of 2, owning the node's first two
    GPUs (4 and 5 here), names them 0,1."""
    record = tmp_path / "calls"
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    fake.write_text(
        f'#!/bin/sh\necho "$* visible=$CUDA_VISIBLE_DEVICES mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'
        f' stdin=$(cat)" >> {record}\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    # What the worker leaves for worker 0 of 2 on a node Slurm gave GPUs 4-7.
    monkeypatch.setenv("SKYWARD_NODE_CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
        monkeypatch.delenv(key, raising=False)
    info = _worker_info(accelerators=4, workers_per_node=2, devices=(0, 1))
    plugin = sky.plugins.mps(pinned_memory_limit="2G")
    assert plugin.around_app is not None
    with plugin.around_app(info):
        [start] = record.read_text().splitlines()
        assert start.startswith("-d visible=4,5,6,7 mem=0=2G,1=2G,2=2G,3=2G")
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2G,1=2G"
    assert record.read_text().splitlines()[1].endswith("stdin=quit")


def test_a_daemon_kept_for_a_replacement_that_never_comes_is_quit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gang restart whose replacement fails to start: the replaced worker kept the node's
    daemon for it, and no worker is left on the node to quit it. The keeper it left quits
    the daemon once nobody has joined it in time."""
    import shutil

    from skyward.plugins import _nvidia
    from skyward.plugins._nvidia import daemon_pid, node_directory
    from skyward.worker import hooks

    record, daemons = tmp_path / "calls", tmp_path / "daemons"
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    fake.write_text(_FAKE_MPS_CONTROL.format(record=record, daemons=daemons))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(hooks, "_replaced", False)
    monkeypatch.setattr(_nvidia, "_KEPT_FOR", 1.0)  # how long the replacement may take
    info = _worker_info(job_id=f"never-replaced-{os.getpid()}-{time.time_ns()}")
    base = node_directory(info)
    plugin = sky.plugins.mps()
    assert plugin.around_app is not None
    try:
        with plugin.around_app(info):
            pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
            daemon = daemon_pid(pipe)
            hooks.replacing()
        assert daemon is not None
        # No worker comes: the daemon is quit, once, with nobody on the node.
        deadline = time.monotonic() + 60
        while _alive(daemon) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(daemon), record.read_text()
        assert [line.split()[0] for line in record.read_text().splitlines()] == [
            "start",
            "quit",
        ]
        # A replacement that comes after all starts a daemon of its own, and quits it.
        monkeypatch.setattr(hooks, "_replaced", False)
        with plugin.around_app(info):
            again = daemon_pid(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
            assert again is not None and again != daemon
        assert not _alive(again)
    finally:
        for line in daemons.read_text().splitlines() if daemons.exists() else []:
            if _alive(int(line)):
                os.kill(int(line), signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)
