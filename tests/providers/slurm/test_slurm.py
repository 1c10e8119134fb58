"""``sky.Slurm`` on a real Slurm cluster (``support.slurm``): a pool is one job, each worker a
job step; JAX across two nodes, GPUs through gres, a queue that makes it wait, errors from
Slurm's own words, and no job or worker left on any path. One cluster serves the module."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pydantic
import pytest
from click.testing import CliRunner
from support import ROOT
from support.dispositions import as_from_a_terminal
from support.processes import worker_processes
from support.slurm import GPU_PARTITION, SlurmCluster
from support.sshhosts import PackageIndex

import skyward as sky
from skyward.cli import main as cli
from skyward.providers.base import ProvisionRequest, identity_tags
from skyward.providers.cloud import warm
from skyward.providers.slurm import gres_for
from skyward.providers.slurm.job import holder_script

_ROOT = str(ROOT)


def slurm(cluster: SlurmCluster, **options: Any) -> sky.Slurm:
    """The cluster through its login host over SSH, as a user elsewhere reaches it."""
    login = cluster.login
    return sky.Slurm(login=login.target, key=login.key, known_hosts=login.known_hosts, **options)


def pool(
    cluster: SlurmCluster, slurm_index: PackageIndex, *, slurm_options: Any = None, **options: Any
) -> sky.ComputePool:
    image = options.pop("image", None) or sky.Image()
    return sky.ComputePool(
        provider=slurm(cluster, **(slurm_options or {})),
        image=image.model_copy(update={"index_url": slurm_index.url}),
        **{"nodes": 2, "quiet": True, **options},
    )


def queue(cluster: SlurmCluster) -> list[str]:
    """Every job in the queue: ``id name state``."""
    return cluster.run("squeue", "-h", "-o", "%i %j %T", user="root").stdout.splitlines()


def workers_on_hosts(cluster: SlurmCluster, *, hosts: list[str] | None = None) -> list[str]:
    """Every process on the hosts that names skyward.worker: the workers on the compute
    nodes, and the srun (and its shell) for each on the login host."""
    found = []
    for host in hosts or [h.name for h in cluster.hosts]:
        for pid in cluster.processes(host):
            try:
                line = " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                continue
            if "skyward.worker" in line:
                found.append(f"{host}: {pid} {line}")
    return found


def assert_nothing_left(cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + 10
    while (queue(cluster) or workers_on_hosts(cluster)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert queue(cluster) == []
    assert workers_on_hosts(cluster) == []


@contextmanager
def blocker(cluster: SlurmCluster) -> Iterator[str]:
    """A job of another user's kind that holds every node until the block ends."""
    job = cluster.run(
        "sbatch", "--parsable", "--exclusive", "-N2", "-J", "blocker", "-o", "/dev/null",
        "--wrap", "sleep 600",
    ).stdout.strip()  # fmt: skip
    try:
        cluster.wait_job_state(job, {"RUNNING"}, timeout=20)
        yield job
    finally:
        cluster.run("scancel", job, check=False)
        cluster.wait_job_state(job, {None}, timeout=20)


def job_of(cluster: SlurmCluster, pool_name: str) -> str:
    """The id of the pool's job (``skyward-<pool>``)."""
    out = cluster.run("squeue", "-h", "--name", f"skyward-{pool_name}", "-o", "%i").stdout
    return out.strip()


# ── configuration, offline ────────────────────────────────────────────────────────────────


def test_bad_settings_are_validation_errors_naming_the_field() -> None:
    for bad, field in [
        ({"login": "a b@"}, "login"),
        ({"time_limit": "soon"}, "time_limit"),
        ({"partition": "gpu nodes"}, "partition"),
        ({"sbatch_options": {"nodes": 3}}, "sbatch_options"),
        ({"sbatch_options": {"-x": True}}, "sbatch_options"),
        ({"workdir": "relative/dir"}, "workdir"),
        ({"modules": ["cuda 12"]}, "modules"),
        ({"idle_timeout": 0}, "idle_timeout"),
    ]:
        with pytest.raises(pydantic.ValidationError, match=field):
            sky.Slurm(**bad)


def test_the_ssh_options_read_as_sky_ssh_reads_them(tmp_path: Path) -> None:
    key = tmp_path / "id_test"
    key.write_text("not read here")
    given: dict[str, Any] = {
        "key": key,
        "known_hosts": "~/known",
        "accept_new_hosts": True,
        "python": "python3.12",
        "workdir": "/scratch/skyward/",
        "connect_timeout": 3,
        "keepalive": 2,
        "link_timeout": 9,
    }
    assert sky.Slurm(**given).access == sky.SSH(hosts=("h",), **given).access
    assert sky.Slurm(**given).workdir == "/scratch/skyward"
    for field, bad in [
        ("key", "~nobody-here-skyward/id"),
        ("known_hosts", "~nobody-here-skyward/known"),
        ("key", tmp_path / "missing"),
        ("workdir", "relative/dir"),
        ("keepalive", 0.5),
    ]:
        for make in (sky.Slurm, lambda **o: sky.SSH(hosts=("h",), **o)):
            with pytest.raises(pydantic.ValidationError, match=field):
                make(**{field: bad})


def test_accelerators_become_gres_per_node() -> None:
    assert gres_for("A100:4") == "gpu:a100:4"
    assert gres_for("h100") == "gpu:h100:1"
    assert gres_for("GPU:2") == "gpu:2"
    assert gres_for(None) is None
    with pytest.raises(ValueError, match="gres="):
        gres_for("A100-80GB:8")


def test_the_job_asks_for_what_the_pool_and_the_options_say() -> None:
    request = ProvisionRequest(
        pool="p",
        nodes=2,
        accelerator="A100:2",
        image=sky.Image(),
        tags=identity_tags("p"),
        deadline=None,  # type: ignore[arg-type]
        vcpus=7.5,
        memory_gb=16,
    )
    options = sky.Slurm(
        partition="gpu",
        account="lab42",
        time_limit=90 * 60 + 1,
        sbatch_options={"exclusive": True, "--mem-per-gpu": "40G", "requeue-me": False},
    ).sbatch_arguments(request)
    assert options == [
        "--partition=gpu",
        "--account=lab42",
        "--time=0-01:31:00",
        "--gres=gpu:a100:2",
        "--cpus-per-task=8",
        "--mem=15259M",
        "--exclusive",
        "--mem-per-gpu=40G",
    ]
    assert "--gres=gpu:a100:1" in sky.Slurm(gres="gpu:a100:1").sbatch_arguments(request)


def test_the_holder_script_is_posix_sh() -> None:
    done = subprocess.run(["sh", "-n"], input=holder_script("p", 300), text=True, timeout=10)
    assert done.returncode == 0


# ── JAX across two Slurm nodes ────────────────────────────────────────────────────────────


def _toy() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4, 2), ("i", "j"))
    array = jax.device_put(np.arange(32).reshape((4, 8)), NamedSharding(mesh, P("i", "j")))
    info = sky.instance_info()
    return {
        "result": float(jnp.sum(jnp.sin(array))),
        "devices": (jax.local_device_count(), jax.device_count(), jax.process_count()),
        "host": os.uname().nodename,
        "step": os.environ.get("SLURM_STEP_ID"),
        "job": os.environ.get("SLURM_JOB_ID"),
        "peers": info.peers,
        "provider": info.provider,
    }


@pytest.mark.timeout(600)
def test_jax_multicontroller_toy_across_two_slurm_nodes_through_a_remote_login(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    with pool(slurm_cluster, slurm_index, plugins=[sky.plugins.jax(cpu_devices=4)]) as jax_pool:
        results = jax_pool.broadcast(_toy)
        job = job_of(slurm_cluster, jax_pool.name)
    assert [r["result"] for r in results] == [-0.12398731708526611] * 2
    assert [r["devices"] for r in results] == [(4, 8, 2)] * 2
    assert [r["host"] for r in results] == ["node0", "node1"]
    # Each worker is a step of the pool's one job; peers are where the nodes reach each other.
    assert {r["job"] for r in results} == {job}
    assert len({r["step"] for r in results}) == 2
    addresses = tuple(h.address for h in slurm_cluster.nodes)
    assert [r["peers"] for r in results] == [addresses] * 2
    assert {r["provider"] for r in results} == {"slurm"}
    assert_nothing_left(slurm_cluster)


def _peers() -> tuple[str, ...]:
    return sky.instance_info().peers


@pytest.mark.timeout(120)
def test_nodes_slurm_knows_by_name_are_peers_at_the_address_the_other_nodes_resolve(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    nodes = slurm_cluster.nodes
    for node in nodes:
        slurm_cluster.run("scontrol", "update", f"NodeName={node.name}",
                          f"NodeAddr={node.name}", user="root")  # fmt: skip
    try:
        with pool(slurm_cluster, slurm_index) as named:
            seen = named.broadcast(_peers)
    finally:
        for node in nodes:
            slurm_cluster.run("scontrol", "update", f"NodeName={node.name}",
                              f"NodeAddr={node.address}", user="root")  # fmt: skip
    assert seen == [tuple(node.address for node in nodes)] * 2
    assert_nothing_left(slurm_cluster)


# ── GPUs through gres ─────────────────────────────────────────────────────────────────────


def _gpus() -> tuple[str, int, str]:
    info = sky.instance_info()
    return os.environ.get("CUDA_VISIBLE_DEVICES", "unset"), info.accelerators, os.uname().nodename


@pytest.mark.timeout(120)
def test_an_accelerator_reaches_slurm_as_gres_and_the_workers_see_their_gpus(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    with pool(
        slurm_cluster, slurm_index, accelerator="A100:1", slurm_options={"partition": GPU_PARTITION}
    ) as gpu_pool:
        seen = gpu_pool.broadcast(_gpus)
        job = job_of(slurm_cluster, gpu_pool.name)
        shown = slurm_cluster.run("scontrol", "-o", "show", "job", job).stdout
    assert seen == [("0", 1, "node0"), ("0", 1, "node1")]
    assert "TresPerNode=gres:gpu:a100:1" in shown
    assert f"Partition={GPU_PARTITION}" in shown
    assert_nothing_left(slurm_cluster)


# ── the queue ─────────────────────────────────────────────────────────────────────────────


@pytest.mark.timeout(120)
def test_a_pool_behind_another_job_shows_why_it_waits_then_starts(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="skyward")
    waiting = pool(slurm_cluster, slurm_index)
    with blocker(slurm_cluster):
        errors: list[BaseException] = []
        starter = threading.Thread(target=lambda: _start(waiting, errors))
        starter.start()
        deadline = time.monotonic() + 30
        while not re.search(r"pending \((Resources|Priority)", caplog.text):
            assert time.monotonic() < deadline, caplog.text
            assert starter.is_alive(), errors
            time.sleep(0.05)
        [line] = [x for x in queue(slurm_cluster) if x.split()[1] == f"skyward-{waiting.name}"]
        assert line.endswith("PENDING")
    starter.join(60)
    assert not starter.is_alive() and errors == []
    try:
        assert len(waiting.broadcast(os.getpid)) == 2
    finally:
        waiting.close()
    shown = [r.getMessage() for r in caplog.records if "pending (" in r.getMessage()]
    assert any("waiting for nodes to become free" in s or "Priority" in s for s in shown), shown
    assert_nothing_left(slurm_cluster)


@pytest.mark.timeout(120)
def test_close_from_another_thread_while_pending_cancels_the_job(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    waiting = pool(slurm_cluster, slurm_index)
    with blocker(slurm_cluster):
        errors: list[BaseException] = []
        starter = threading.Thread(target=lambda: _start(waiting, errors))
        starter.start()
        deadline = time.monotonic() + 30
        while not job_of(slurm_cluster, waiting.name):
            assert time.monotonic() < deadline and starter.is_alive(), errors
            time.sleep(0.05)
        waiting.close()
        starter.join(30)
        assert not starter.is_alive()
        [error] = errors
        assert isinstance(error, sky.PoolClosed), error
        assert [x for x in queue(slurm_cluster) if waiting.name in x] == []
    assert_nothing_left(slurm_cluster)


def _start(pool_: sky.ComputePool, errors: list[BaseException]) -> None:
    try:
        pool_.start()
    except BaseException as error:
        errors.append(error)


# ── errors in Slurm's own words, before anything waits ────────────────────────────────────


@pytest.mark.timeout(60)
def test_an_unknown_partition_fails_fast_with_slurms_reason_and_the_partitions(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    started = time.monotonic()
    with pytest.raises(sky.ProvisionError) as caught:
        with pool(slurm_cluster, slurm_index, slurm_options={"partition": "nope"}):
            pass
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "Invalid partition name specified" in message
    assert "cpu*" in message and "gpu" in message
    assert_nothing_left(slurm_cluster)


@pytest.mark.timeout(60)
def test_a_gres_the_partition_lacks_is_refused_by_sbatch_and_named(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    with pytest.raises(sky.ProvisionError) as caught:
        with pool(
            slurm_cluster,
            slurm_index,
            accelerator="H100:1",
            slurm_options={"partition": GPU_PARTITION},
        ):
            pass
    message = str(caught.value)
    assert "Requested node configuration is not available" in message
    assert "--gres=gpu:h100:1" in message and "gpu:a100:2" in message
    assert_nothing_left(slurm_cluster)


@pytest.mark.timeout(60)
def test_a_time_limit_above_the_partitions_fails_at_once_with_its_max_time(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    slurm_cluster.run("scontrol", "update", f"PartitionName={GPU_PARTITION}", "MaxTime=10",
                      user="root")  # fmt: skip
    try:
        started = time.monotonic()
        with pytest.raises(sky.ProvisionError) as caught:
            with pool(
                slurm_cluster,
                slurm_index,
                slurm_options={"partition": GPU_PARTITION, "time_limit": "1:00:00"},
            ):
                pass
        assert time.monotonic() - started < 10
    finally:
        slurm_cluster.run("scontrol", "update", f"PartitionName={GPU_PARTITION}",
                          "MaxTime=INFINITE", user="root")  # fmt: skip
    message = str(caught.value)
    assert "never start" in message and "MaxTime=00:10:00" in message, message
    assert re.search(r"Partition(TimeLimit|Config)", message)
    assert_nothing_left(slurm_cluster)


# ── workers lost, in Slurm's words ────────────────────────────────────────────────────────


def _sleep_on_node_1() -> str:
    if sky.instance_info().node == 1:
        time.sleep(60)
    return "done"


@pytest.mark.timeout(120)
def test_a_cancelled_step_is_worker_lost_naming_the_node_and_slurms_reason(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    with pool(slurm_cluster, slurm_index) as lossy:
        job = job_of(slurm_cluster, lossy.name)
        caught: list[BaseException] = []
        call = threading.Thread(target=lambda: _broadcast(lossy, caught))
        call.start()
        step = _worker_step(slurm_cluster, job, rank=1)
        slurm_cluster.run("scancel", step)
        call.join(60)
    [error] = caught
    assert isinstance(error, sky.WorkerLost) and error.node == 1
    message = str(error)
    assert "node1" in message and "CANCELLED" in message, message
    assert f"job {job} is RUNNING" in message, message
    assert_nothing_left(slurm_cluster)


def _broadcast(pool_: sky.ComputePool, caught: list[BaseException]) -> None:
    try:
        pool_.broadcast(_sleep_on_node_1)
    except BaseException as error:
        caught.append(error)


def _worker_step(cluster: SlurmCluster, job: str, rank: int) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        out = cluster.run("squeue", "-h", "-s", "-j", job, "-o", "%i %j").stdout
        for line in out.splitlines():
            step, name = line.split()
            if name == f"skyward-worker-{rank}":
                return step
        time.sleep(0.05)
    raise AssertionError(f"no worker step of rank {rank} in job {job}")


@pytest.mark.timeout(120)
def test_a_node_taken_down_is_worker_lost_with_the_jobs_node_failure(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    with pool(slurm_cluster, slurm_index) as lossy:
        job = job_of(slurm_cluster, lossy.name)
        caught: list[BaseException] = []
        call = threading.Thread(target=lambda: _broadcast(lossy, caught))
        call.start()
        _worker_step(slurm_cluster, job, rank=1)
        time.sleep(0.5)  # the call is on its way
        slurm_cluster.run("scontrol", "update", "NodeName=node1", "State=DOWN",
                          "Reason=disk-replacement", user="root")  # fmt: skip
        try:
            call.join(60)
        finally:
            _resume(slurm_cluster, "node1")
    assert caught, "the broadcast did not fail"
    message = str(caught[0])
    assert isinstance(caught[0], sky.WorkerLost), message
    # slurmstepd's words, then what scontrol says of the job (NODE_FAIL once the controller
    # has handled the failure, RUNNING a moment before) and of the node
    assert "node1" in message and "DUE TO NODE FAILURE" in message, message
    assert re.search(r"Slurm: job \d+ is \w+", message), message
    assert_nothing_left(slurm_cluster)


@pytest.mark.timeout(120)
def test_a_login_link_that_drops_loses_the_workers_and_teardown_reaches_the_login_again(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    dropped = pool(slurm_cluster, slurm_index, slurm_options={"keepalive": 1, "link_timeout": 3})
    with dropped:
        job = job_of(slurm_cluster, dropped.name)
        slurm_cluster.link_down("login")
        try:
            with pytest.raises(sky.WorkerLost, match=r"SSH connection .* dropped"):
                dropped.broadcast(_sleep_on_node_1)
        finally:
            slurm_cluster.link_up("login")
        assert slurm_cluster.job_state(job) == "RUNNING"
    assert slurm_cluster.job_state(job) is None
    assert_nothing_left(slurm_cluster)


def _resume(cluster: SlurmCluster, node: str) -> None:
    cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME", user="root",
                check=False)  # fmt: skip
    deadline = time.monotonic() + 30
    while "idle" not in cluster.run("sinfo", "-h", "-n", node, "-o", "%t").stdout:
        assert time.monotonic() < deadline, "node did not come back"
        time.sleep(0.1)


# ── the leak matrix ───────────────────────────────────────────────────────────────────────


@contextmanager
def _fails_around_app(info: sky.InstanceInfo) -> Iterator[None]:
    raise RuntimeError("this plugin fails on purpose")
    yield


@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", ["normal", "exception", "bootstrap fails", "plugin fails"])
def test_no_job_and_no_worker_is_left_on_any_path(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex, path: str
) -> None:
    if path == "normal":
        with pool(slurm_cluster, slurm_index) as used:
            assert used.broadcast(os.getpid)
    elif path == "exception":
        with pytest.raises(KeyError), pool(slurm_cluster, slurm_index):
            raise KeyError("the user's own error")
    elif path == "bootstrap fails":
        image = sky.Image(setup=["echo doomed; exit 3"])
        with pytest.raises(sky.BootstrapError, match="exit 3"):
            with pool(slurm_cluster, slurm_index, image=image):
                pass
    else:
        plugin = sky.Plugin(name="failing", around_app=_fails_around_app)
        with pytest.raises(sky.StartError, match="fails on purpose"):
            with pool(slurm_cluster, slurm_index, plugins=[plugin]):
                pass
    assert_nothing_left(slurm_cluster)


_CLIENT = """
import sys, time
import skyward as sky
slurm = sky.Slurm(login={login!r}, key={key!r}, known_hosts={known!r}, idle_timeout={idle})
pool = sky.ComputePool(provider=slurm, nodes=2, name={name!r}, console="off",
                       image=sky.Image(index_url={slurm_index!r}))
with pool:
    print("ready", flush=True)
    time.sleep(600)
"""


def _client(cluster: SlurmCluster, slurm_index: PackageIndex, name: str, idle: float = 300) -> Any:
    login = cluster.login
    script = _CLIENT.format(
        login=login.target, key=str(login.key), known=str(login.known_hosts), idle=idle,
        name=name, slurm_index=slurm_index.url,
    )  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": _ROOT},
        preexec_fn=as_from_a_terminal,  # Ctrl-C reaches it, however this run was started
    )


@pytest.mark.timeout(120)
def test_ctrl_c_while_the_job_is_pending_cancels_it(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    name = f"pending-{os.getpid()}"
    with blocker(slurm_cluster):
        client = _client(slurm_cluster, slurm_index, name)
        try:
            deadline = time.monotonic() + 30
            while not job_of(slurm_cluster, name):
                assert time.monotonic() < deadline and client.poll() is None
                time.sleep(0.05)
            assert slurm_cluster.job_state(job_of(slurm_cluster, name)) == "PENDING"
            client.send_signal(signal.SIGINT)
            _, err = client.communicate(timeout=60)
        finally:
            client.kill()
            client.wait()
            left = [x for x in queue(slurm_cluster) if name in x]
            # Whatever happened, the job does not stay pending for the tests after this one.
            slurm_cluster.run("scancel", "--name", f"skyward-{name}", check=False)
        assert "KeyboardInterrupt" in err
        assert left == []
    assert_nothing_left(slurm_cluster)


@pytest.mark.timeout(120)
def test_a_sigkilled_clients_job_ends_itself_within_idle_timeout(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    name = f"killed-{os.getpid()}"
    idle = 3.0
    client = _client(slurm_cluster, slurm_index, name, idle=idle)
    try:
        assert client.stdout is not None and client.stdout.readline() == "ready\n"
        job = job_of(slurm_cluster, name)
        assert slurm_cluster.job_state(job) == "RUNNING"
        assert len(workers_on_hosts(slurm_cluster, hosts=slurm_cluster.node_names)) == 2
        client.kill()
        killed = time.monotonic()
    finally:
        client.kill()
        client.wait()
    slurm_cluster.wait_job_state(job, {None}, timeout=idle + 20)
    ended = time.monotonic() - killed
    # the workers' steps end with their link (a second or so), then the holder waits
    # idle_timeout, looking once a second
    assert ended < idle + 8, ended
    assert_nothing_left(slurm_cluster)


# ── skyward ls / down ─────────────────────────────────────────────────────────────────────


@pytest.mark.timeout(60)
def test_ls_lists_skywards_jobs_and_down_cancels_them(slurm_cluster: SlurmCluster) -> None:
    comment = "skyward pool=orphan owner=someone@laptop created=2026-01-02T03:04:05Z"
    job = slurm_cluster.run(
        "sbatch", "--parsable", "-J", "skyward-orphan", f"--comment={comment}", "-o",
        "/dev/null", "--wrap", "sleep 300",
    ).stdout.strip()  # fmt: skip
    other = slurm_cluster.run(
        "sbatch", "--parsable", "-J", "not-ours", "-o", "/dev/null", "--wrap", "sleep 300"
    ).stdout.strip()
    login = slurm_cluster.login
    where = ["--slurm", login.target, "--ssh-key", str(login.key)]
    where += ["--known-hosts", str(login.known_hosts)]
    try:
        listed = CliRunner().invoke(cli, ["ls", *where])
        assert listed.exit_code == 0, listed.output
        [row] = [line for line in listed.output.splitlines() if "orphan" in line]
        assert row.split()[:4] == ["slurm", login.target, "orphan", "job"]
        assert job in row and "someone@laptop" in row
        assert "not-ours" not in listed.output
        down = CliRunner().invoke(cli, ["down", "--pool", "orphan", "--yes", *where])
        assert down.exit_code == 0, down.output
        assert slurm_cluster.job_state(job) is None
        assert slurm_cluster.job_state(other) is not None
        again = CliRunner().invoke(cli, ["ls", *where])
        assert "Nothing left by Skyward" in again.output
    finally:
        slurm_cluster.run("scancel", job, other, check=False)


# ── keep_warm: a closed pool's job kept for the next pool like it ─────────────────────────


def _job_and_step() -> tuple[str | None, str | None]:
    return os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")


def _kept_jobs() -> list[str]:
    return [str(w.record["job"]) for w in warm.kept() if w.cloud == "slurm"]


# A client that closes its pool with keep_warm and never comes back; another spec than the
# test's pools (idle_timeout).
_KEEPS = """
import skyward as sky
slurm = sky.Slurm(login={login!r}, key={key!r}, known_hosts={known!r}, idle_timeout=298)
with sky.ComputePool(provider=slurm, nodes=2, name={name!r}, console="off", keep_warm={keep},
                     image=sky.Image(index_url={slurm_index!r})) as pool:
    pool.broadcast(abs, 1)
print("kept", flush=True)
import time; time.sleep(600)
"""


def _kept_by_a_client_that_never_returns(
    cluster: SlurmCluster, slurm_index: PackageIndex, keep: float
) -> str:
    """Its job's id, once the client that kept it is SIGKILLed."""
    login = cluster.login
    script = _KEEPS.format(
        login=login.target, key=str(login.key), known=str(login.known_hosts),
        name=f"kept-{os.getpid()}", keep=keep, slurm_index=slurm_index.url,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": _ROOT}
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        assert client.stdout is not None and client.stdout.readline() == b"kept\n"
    finally:
        client.kill()
        client.wait()
    return job_of(cluster, f"kept-{os.getpid()}")


@pytest.mark.timeout(300)
def test_a_job_kept_warm_is_adopted_by_the_next_pool_like_it_and_by_no_other(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex, caplog: pytest.LogCaptureFixture
) -> None:
    login = slurm_cluster.login
    where = ["--slurm", login.target, "--ssh-key", str(login.key)]
    where += ["--known-hosts", str(login.known_hosts)]
    try:
        with pool(slurm_cluster, slurm_index, keep_warm=300) as first:
            [job] = {j for j, _ in first.broadcast(_job_and_step)}
            assert job is not None
        # closed: the workers' steps are gone, the job runs on, marked and recorded
        assert slurm_cluster.job_state(job) == "RUNNING"
        assert workers_on_hosts(slurm_cluster, hosts=slurm_cluster.node_names) == []
        assert _kept_jobs() == [job]
        listed = CliRunner().invoke(cli, ["ls", *where])
        assert listed.exit_code == 0, listed.output
        [row] = [line for line in listed.output.splitlines() if line.startswith("slurm ")]
        assert job in row and "warm," in row and "min left" in row
        assert "Warm machines" in listed.output

        # another spec starts its own job (its client, killed, leaves it kept 3 s)
        other_job = _kept_by_a_client_that_never_returns(slurm_cluster, slurm_index, keep=3)
        assert other_job not in ("", job)
        assert slurm_cluster.job_state(job) == "RUNNING"
        for kept in warm.kept():
            if kept.record.get("job") == other_job:
                warm.forget(kept.id)

        # the same spec adopts it: no new job, fresh steps, the environment not rebuilt
        caplog.set_level(logging.DEBUG, logger="skyward")
        caplog.clear()
        with pool(slurm_cluster, slurm_index, keep_warm=300) as second:
            ours = [x for x in queue(slurm_cluster) if "skyward-" in x and other_job not in x]
            assert ours == [f"{job} skyward-{second.name} RUNNING"]
            adopted = second.broadcast(_job_and_step)
            assert {j for j, _ in adopted} == {job} and len({s for _, s in adopted}) == 2
            assert _kept_jobs() == []  # the record is the pool's now
        log = caplog.text
        assert "already installed" in log and not re.search(r"image \w+ installed", log)
        assert _kept_jobs() == [job]  # kept again by the second pool's close
        # the killed client's job: its holder ended it once the keep was over, long before
        # its idle_timeout (298 s)
        slurm_cluster.wait_job_state(other_job, {None}, timeout=30)

        # a kept job that is cancelled is dropped, and a new one submitted
        slurm_cluster.run("scancel", job)
        slurm_cluster.wait_job_state(job, {None})
        with pool(slurm_cluster, slurm_index, keep_warm=300) as third:
            [new_job] = {j for j, _ in third.broadcast(_job_and_step)}
        assert new_job not in (job, other_job)
        assert _kept_jobs() == [new_job]

        # `skyward down` cancels the kept job and forgets its record
        down = CliRunner().invoke(cli, ["down", "--pool", third.name, "--yes", *where])
        assert down.exit_code == 0, down.output
        assert slurm_cluster.job_state(new_job) is None
        assert _kept_jobs() == []
    finally:
        slurm_cluster.run("scancel", "--me", check=False)
        for kept in warm.kept():
            if kept.cloud == "slurm":
                warm.forget(kept.id)
    assert_nothing_left(slurm_cluster)


# ── on the login node itself ──────────────────────────────────────────────────────────────

_ON_LOGIN = """
import os, sys
import skyward as sky
image = sky.Image(pip=["packaging"], index_url={slurm_index!r})
slurm = sky.Slurm(modules=["skyward-test"])
with sky.ComputePool(provider=slurm, nodes=2, image=image, console="off") as pool:
    print(pool.broadcast(lambda: (
        sky.instance_info().node, os.uname().nodename, os.environ.get("SKYWARD_TEST_MODULE")
    )))
"""
# A module system of the simplest kind: $MODULESHOME/init/sh defines `module`, and loading a
# module sources its file, which sets a variable and notes where it ran.
_MODULE_INIT = """module() {
  [ "$1" = load ] || return 1; shift
  for m in "$@"; do . "$MODULESHOME/modulefiles/$m" || return 1; done
}
"""
_MODULE_FILE = """SKYWARD_TEST_MODULE=loaded; export SKYWARD_TEST_MODULE
echo "$(hostname) $SLURM_STEP_ID" >> "$HOME/modules-loaded"
"""


@pytest.mark.timeout(120)
def test_a_client_on_the_login_node_runs_slurms_commands_itself_and_loads_modules(
    slurm_cluster: SlurmCluster, slurm_index: PackageIndex
) -> None:
    # The client runs on the login host as the cluster's user, with an interpreter a pool
    # bootstraps on the shared home (with packaging, it has what a client needs).
    with pool(slurm_cluster, slurm_index, image=sky.Image(pip=["packaging"])) as remote:
        [python] = set(remote.broadcast(lambda: sys.executable))
    modules = slurm_cluster.home / "modules"
    (modules / "init").mkdir(parents=True, exist_ok=True)
    (modules / "modulefiles").mkdir(exist_ok=True)
    (modules / "init" / "sh").write_text(_MODULE_INIT)
    (modules / "modulefiles" / "skyward-test").write_text(_MODULE_FILE)
    done = slurm_cluster.run(
        "env", f"PYTHONPATH={_ROOT}", "MODULESHOME=/home/skytest/modules", python, "-c",
        _ON_LOGIN.format(slurm_index=slurm_index.url), timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[(0, 'node0', 'loaded'), (1, 'node1', 'loaded')]"
    # loaded in the bootstrap's steps (on node0, the shared home's first node) and in each
    # worker's step, never in the login host's own processes
    loaded = [
        line.split()[0] for line in (slurm_cluster.home / "modules-loaded").read_text().splitlines()
    ]
    assert loaded.count("node1") == 1 and loaded.count("node0") >= 2, loaded
    assert set(loaded) == {"node0", "node1"}
    assert_nothing_left(slurm_cluster)


def test_no_worker_outlives_the_module(slurm_cluster: SlurmCluster) -> None:
    assert worker_processes() == []
    assert queue(slurm_cluster) == []


@pytest.mark.timeout(120)
def test_start_timeline_of_a_two_node_pool_on_an_idle_queue(
    slurm_cluster: SlurmCluster,
    slurm_index: PackageIndex,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Measures (prints) where the time goes from ComputePool(...) to ready, environment
    already bootstrapped; asserts only that it starts."""
    with pool(slurm_cluster, slurm_index):
        pass  # the image's environment is there from now on
    caplog.set_level(logging.INFO, logger="skyward")
    caplog.clear()
    begin = time.time()
    with pool(slurm_cluster, slurm_index) as timed:
        ready = time.time()
        assert len(timed.broadcast(os.getpid)) == 2
    marks = [
        (r.created, r.getMessage()) for r in caplog.records if r.getMessage().startswith("node 0")
    ]

    def first(pattern: str) -> float:
        return next(t for t, m in marks if re.search(pattern, m))

    phases = [
        ("login (SSH, find Slurm's commands)", begin, first("submitting")),
        ("sbatch", first("submitting"), first(r"pending|runs on")),
        ("queue: until RUNNING is seen", first(r"pending|runs on"), first("runs on")),
        ("nodes and probe (2 steps)", first("runs on"), first("bootstrapping")),
        ("bootstrap + package check (2 steps)", first("bootstrapping"), first("starting")),
        ("workers: srun, Hello, Ready", first("starting"), ready),
    ]
    with capsys.disabled():
        print(f"\nSlurm pool, 2 nodes, idle queue: ready in {ready - begin:.2f} s")
        for what, start, end in phases:
            print(f"  {what:40s} {end - start:6.2f} s")
