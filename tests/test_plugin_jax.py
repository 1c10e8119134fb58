"""The jax plugin: what it asks for on each accelerator, and real multi-process JAX on CPU."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata

import numpy as np
import pytest
from support.processes import shared_pool, worker_processes

import skyward as sky
from skyward.plugins._jax import distributed

# ── the transform, offline ───────────────────────────────────────────────────────────────


def _image(
    accelerator: str | None = None, image: sky.Image | None = None, **options: object
) -> sky.Image:
    # A provider that is never started: the transform runs when the pool is built. (The
    # local pool refuses accelerators.)
    pool = sky.ComputePool(
        provider=sky.SSH(hosts=["h1"]),
        accelerator=accelerator,
        image=image,
        plugins=[sky.plugins.jax(**options)],  # type: ignore[arg-type]
    )
    return pool.image


def _extras(requirement: str) -> set[str]:
    match = re.search(r"\[(.*)\]", requirement)
    return {e.strip() for e in match.group(1).split(",")} if match else set()


@pytest.mark.parametrize(
    ("accelerator", "cuda"),
    [(None, None), ("A100", None), ("H100", "13"), ("L4", "cu124"), ("v5e", None), ("v4-8", None)],
)
def test_requested_extras_exist_in_the_installed_jax_metadata(
    accelerator: str | None, cuda: str | None
) -> None:
    provided = {
        re.sub(r"[-_.]+", "-", e).lower()
        for e in metadata.metadata("jax").get_all("Provides-Extra") or []
    }
    options = {"cuda": cuda} if cuda else {}
    [requirement] = [r for r in _image(accelerator, **options).pip if r.startswith("jax")]
    assert _extras(requirement) <= provided, (requirement, sorted(provided))


@pytest.mark.parametrize(
    ("accelerator", "options", "expected"),
    [
        (None, {}, "jax"),
        ("cpu", {"version": "0.10.2"}, "jax==0.10.2"),
        ("A100", {}, "jax[cuda12]"),
        ("H100", {"cuda": "cu124"}, "jax[cuda12]"),
        ("H100", {"cuda": 13}, "jax[cuda13]"),
        ("B200", {"cuda": "cuda13.0", "version": "0.10.2"}, "jax[cuda13]==0.10.2"),
        ("A100", {"version": ">=0.6,<0.11"}, "jax[cuda12]>=0.6,<0.11"),
        ("v5e", {}, "jax[tpu]"),
        ("TPU-v6e", {}, "jax[tpu]"),
    ],
)
def test_the_requirement_fits_the_accelerator(
    accelerator: str | None, options: dict[str, object], expected: str
) -> None:
    assert _image(accelerator, **options).pip == (expected,)


def test_nvidia_pools_get_nvidias_performance_defaults() -> None:
    env = _image("H100").env
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in env["XLA_FLAGS"].split()
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "XLA_FLAGS" not in _image("H100", gpu_defaults=False).env
    assert "XLA_FLAGS" not in _image(None).env  # CPU pools get none of it


def test_the_users_xla_flags_and_variables_win() -> None:
    user = sky.Image(
        env={
            "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/d",
            "CUDA_DEVICE_MAX_CONNECTIONS": "8",
        }
    )
    env = _image("A100", image=user).env
    flags = env["XLA_FLAGS"].split()
    assert "--xla_gpu_enable_latency_hiding_scheduler=false" in flags
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" not in flags
    assert "--xla_dump_to=/tmp/d" in flags
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("accelerator", ["H100", "B200"])
def test_the_gpu_flags_exist_in_the_installed_xla(accelerator: str) -> None:
    # XLA parses every GPU flag even on CPU, and an unknown one (the async-collective flags
    # older NVIDIA guides list were removed) kills the process when the backend starts.
    env = {**os.environ, **_image(accelerator).env, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.numpy.ones(2).sum())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "2.0"


def test_an_index_is_scoped_to_jaxs_own_packages() -> None:
    page = "https://storage.googleapis.com/jax-releases/jax_cuda_releases.html"
    [index] = _image("A100", index_url=page).pip_indexes
    assert index.find_links is True
    assert set(index.packages) == {"jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"}
    [mirror] = _image(None, index_url="https://mirror.example/simple").pip_indexes
    assert mirror.find_links is False
    assert set(mirror.packages) == {"jax", "jaxlib"}


def test_cpu_devices_sets_the_device_count_and_refuses_a_conflicting_image() -> None:
    assert _image(None, cpu_devices=4).env["JAX_NUM_CPU_DEVICES"] == "4"
    preset = sky.Image(env={"JAX_NUM_CPU_DEVICES": "3"})
    assert _image(None, image=preset).env["JAX_NUM_CPU_DEVICES"] == "3"
    with pytest.raises(sky.PluginError, match="JAX_NUM_CPU_DEVICES=3"):
        _image(None, image=preset, cpu_devices=2)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: sky.plugins.jax(cuda="cu118"), "cuda='cu118'"),
        (lambda: sky.plugins.jax(cpu_devices=0), "cpu_devices"),
        (lambda: sky.plugins.jax(heartbeat_timeout=0), "heartbeat_timeout"),
        (lambda: _image("trainium"), "trainium"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(make: object, message: str) -> None:
    with pytest.raises(sky.PluginError, match=re.escape(message)):
        make()  # type: ignore[operator]
    assert not worker_processes()


def test_a_loopback_coordinator_is_refused_when_nodes_are_on_different_hosts() -> None:
    info = sky.InstanceInfo(
        node=1,
        total_nodes=2,
        head_addr="127.0.0.1",
        head_port=1234,
        peers=("127.0.0.1", "10.123.0.12"),
        hostname="h",
    )
    with (
        pytest.raises(sky.PluginError, match="loopback"),
        distributed(info, initialization_timeout=1, heartbeat_timeout=1, shutdown_timeout=1),
    ):
        pass


# ── real multi-process JAX on CPU ────────────────────────────────────────────────────────


@sky.compute
def toy() -> dict[str, object]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4, 2), ("i", "j"))
    global_data = np.arange(32).reshape((4, 8))
    array = jax.device_put(global_data, NamedSharding(mesh, P("i", "j")))
    result = jnp.sum(jnp.sin(array))
    return {
        "result": float(result),
        "dtype": str(result.dtype),
        "devices": (jax.local_device_count(), jax.device_count(), jax.process_count()),
        "rows": sorted(row for s in array.addressable_shards for row in s.data[:, 0].tolist()),
        "gathered": sky.gather(array).tolist(),
        "mine": sky.shard(list(range(10))),
    }


@pytest.fixture(scope="module")
def jax_pool() -> Iterator[sky.ComputePool]:
    with shared_pool(nodes=4, plugins=[sky.plugins.jax(cpu_devices=2)]) as pool:
        yield pool


@pytest.mark.timeout(180)
def test_the_multicontroller_toy_gives_jaxs_documented_result(jax_pool: sky.ComputePool) -> None:
    results = toy() @ jax_pool
    for node, out in enumerate(results):
        assert out["result"] == -0.12398731708526611
        assert out["dtype"] == "float32"
        assert out["devices"] == (2, 8, 4)
        # node i holds rows [8i..8i+3] and [8i+4..8i+7]: two devices, one row of 8 each
        assert out["rows"] == [8 * node, 8 * node + 4]
        assert out["gathered"] == np.arange(32).reshape((4, 8)).tolist()
    assert [out["mine"] for out in results] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]


@pytest.mark.timeout(120)
def test_initialize_is_idempotent_on_a_worker(jax_pool: sky.ComputePool) -> None:
    def again() -> bool:
        import jax

        with distributed(
            sky.instance_info(), initialization_timeout=5, heartbeat_timeout=5, shutdown_timeout=5
        ):
            pass
        return bool(jax.distributed.is_initialized()) and jax.process_count() == 4

    assert jax_pool.broadcast(again) == [True] * 4


@pytest.mark.timeout(120)
def test_an_image_that_sets_the_cpu_device_count_keeps_working() -> None:
    image = sky.Image(env={"JAX_NUM_CPU_DEVICES": "3"})
    with sky.ComputePool(image=image, plugins=[sky.plugins.jax()], quiet=True) as pool:
        assert pool.run(lambda: __import__("jax").local_device_count()) == 3


@sky.compute
def collectives_forever() -> None:
    import jax
    import jax.numpy as jnp

    total = jax.jit(lambda x: jnp.sum(x))
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    array = jax.device_put(np.ones(jax.device_count()), NamedSharding(mesh, P("d")))
    while True:
        total(array).block_until_ready()


@pytest.mark.timeout(120)
def test_killing_a_rank_fails_every_call_and_restarts_the_pool_as_one(
    capfd: pytest.CaptureFixture[str],
) -> None:
    plugin = sky.plugins.jax(cpu_devices=1, heartbeat_timeout=10)
    with sky.ComputePool(nodes=3, plugins=[plugin]) as pool:
        pids = pool.broadcast(os.getpid)
        running = pool._broadcast_call(collectives_forever())
        time.sleep(1.0)
        before = pool.statistics().failed
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(sky.WorkerLost) as caught:
            running.result(timeout=60)
        assert caught.value.node == 1 and caught.value.exit_status == -signal.SIGKILL
        # the survivors were stuck in the collective: their calls must fail too, not hang
        deadline = time.monotonic() + 60
        while pool.statistics().failed - before < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pool.statistics().failed - before == 3, "every rank's call must fail"
        # then every node gets a new worker, together, in a new distributed runtime
        after = pool.broadcast(lambda: (os.getpid(), __import__("jax").process_count()))
        assert {count for _, count in after} == {3}
        assert not {pid for pid, _ in after} & set(pids)
        assert pool.statistics().workers_replaced == 3
    err = capfd.readouterr().err
    assert "node 1 was lost, and plugin jax ties every node into one runtime" in err


@pytest.mark.timeout(120)
def test_a_worker_that_cannot_join_fails_the_start_with_the_reason() -> None:
    @contextlib.contextmanager
    def squat_on_the_coordinator_port(info: sky.InstanceInfo) -> Iterator[None]:
        with socket.socket() as sock:
            if info.node == 0:
                sock.bind(("", info.head_port))
                sock.listen()
            yield

    plugins = [
        sky.Plugin(name="squatter", around_app=squat_on_the_coordinator_port),
        sky.plugins.jax(cpu_devices=1, initialization_timeout=5),
    ]
    with pytest.raises(sky.StartError) as caught:
        with sky.ComputePool(nodes=2, plugins=plugins, quiet=True):
            pass
    message = str(caught.value)
    assert "node 0" in message and "cannot start the JAX coordinator on port" in message
    assert "Address already in use" in message
    assert not worker_processes()
