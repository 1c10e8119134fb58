"""The jax plugin: what it asks for on each accelerator, and real multi-process JAX on CPU."""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import get_type_hints

import numpy as np
import pydantic
import pytest
from support import ROOT
from support.markers import per_node, wait_for_markers
from support.pools import broadcast_in_background, ssh_provider
from support.processes import our_namespaces, shared_pool, worker_processes
from support.sshhosts import Hosts, PackageIndex

import skyward as sky
from skyward.plugins._jax import JaxOptions, _Options, collectives_address, distributed
from skyward.plugins._jax_output import GlooFilter, log_dir

_WHEEL_CACHE = Path.home() / ".cache" / "skyward-tests" / "wheels"

# ── the transform, offline ───────────────────────────────────────────────────────────────


def _image(
    accelerator: str | None = None, image: sky.Image | None = None, **options: object
) -> sky.Image:
    # A provider that is never started: the transform runs when the pool is built. (The
    # local pool refuses accelerators.)
    pool = sky.ComputePool(
        provider=sky.SSH(hosts=["h1"]),
        accelerator=accelerator,
        # No live metrics: on an NVIDIA pool they add nvidia-ml-py (tests/pool/test_metrics.py).
        image=image or sky.Image(metrics=None),
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
        (lambda: _image("trainium"), "trainium"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(make: object, message: str) -> None:
    with pytest.raises(sky.PluginError, match=re.escape(message)):
        make()  # type: ignore[operator]
    assert not worker_processes()


@pytest.mark.parametrize(
    "options",
    [
        {"cpu_devices": 0},
        {"cpu_devices": 2.5},
        {"cpu_devices": "2"},
        {"heartbeat_timeout": 0},
        {"heartbeat_timeout": "5"},
        {"version": True},
    ],
)
def test_options_of_the_wrong_type_or_range_name_the_option(options: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError, match=next(iter(options))):
        sky.plugins.jax(**options)  # type: ignore[arg-type]


# ── each option spelled once: JaxOptions (names, types) against _Options (defaults) ─────────

_JAX_OPTIONS = get_type_hints(JaxOptions)


def test_jax_options_name_and_type_every_field_of_the_options_model() -> None:
    # The model is strict, so what a caller may give is exactly what it keeps.
    fields = {name: field.annotation for name, field in _Options.model_fields.items()}
    assert fields == _JAX_OPTIONS


def test_the_jax_signature_shows_each_option_with_the_model_default() -> None:
    parameters = inspect.signature(sky.plugins.jax).parameters
    # cuda first, by position or keyword (skyward 0.5's jax("cu124")); the rest keyword-only.
    assert list(parameters) == ["cuda", *(n for n in _JAX_OPTIONS if n != "cuda")]
    for name, field in _Options.model_fields.items():
        assert parameters[name].default == field.default, name
        keyword = inspect.Parameter.KEYWORD_ONLY
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if name == "cuda" else keyword
        assert parameters[name].kind is kind, name


def test_a_misspelled_jax_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"jax\(\) got an unexpected keyword argument 'cpu_device'"):
        sky.plugins.jax(cpu_device=2)  # type: ignore[call-arg]


def test_every_jax_option_is_documented_with_its_default() -> None:
    doc = sky.plugins.jax.__doc__ or ""
    assert {name for name in _JAX_OPTIONS if f"``{name}``" not in doc} == set()
    page = (ROOT / "docs" / "plugins.md").read_text()
    section = page.split("## `sky.plugins.jax(...)`", 1)[1].split("\n\n**", 1)[0]
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]*) \|", section, re.M)
    }
    assert list(rows) == list(_JAX_OPTIONS)
    for name, field in _Options.model_fields.items():
        if field.default is not None:  # None reads "newest", "none", or the CUDA it picks
            assert str(field.default) in rows[name], name


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
        "gathered": sky.plugins.jax_gather(array).tolist(),
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
    assert [out["mine"] for out in results] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]


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
def collectives_forever(started: str = "") -> None:
    """Collectives until the worker goes; after the first, make ``{started}-{node}``."""
    import jax
    import jax.numpy as jnp

    total = jax.jit(lambda x: jnp.sum(x))
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    array = jax.device_put(np.ones(jax.device_count()), NamedSharding(mesh, P("d")))
    total(array).block_until_ready()
    if started:
        Path(f"{started}-{sky.instance_info().node}").touch()
    while True:
        total(array).block_until_ready()


@pytest.mark.timeout(120)
def test_killing_a_rank_fails_every_call_and_restarts_the_pool_as_one(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plugin = sky.plugins.jax(cpu_devices=1, heartbeat_timeout=10)
    with sky.ComputePool(nodes=3, plugins=[plugin]) as pool:
        pids = pool.broadcast(os.getpid)
        started = tmp_path / "in-the-collectives"
        running = broadcast_in_background(pool, collectives_forever, str(started))
        wait_for_markers(*per_node(started, 3))  # every rank is in the collective loop
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
    assert "node 1 was lost, and plugin jax ties every worker into one runtime" in err


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


# ── sky.shard(even=True) and a global mesh ───────────────────────────────────────────────

DOCS = ROOT / "docs"


def _info(node: int, nodes: int) -> sky.InstanceInfo:
    return sky.InstanceInfo(
        node=node,
        total_nodes=nodes,
        head_addr="127.0.0.1",
        head_port=1,
        peers=("127.0.0.1",) * nodes,
        hostname="h",
    )


@pytest.mark.parametrize(("nodes", "devices", "rows"), [(2, 2, 2048), (3, 4, 1364), (2, 1, 2049)])
def test_even_shards_are_equal_contiguous_and_split_by_every_device(
    nodes: int, devices: int, rows: int
) -> None:
    data = list(range(4099))
    shares = [
        sky.shard(data, even=True, devices=devices, info=_info(n, nodes)) for n in range(nodes)
    ]
    assert [len(share) for share in shares] == [rows] * nodes
    assert [row for share in shares for row in share] == data[: rows * nodes]  # in order, once
    assert 4099 - rows * nodes < nodes * devices  # only what no device could take is dropped


def _docs_example(page: str, marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.DOTALL)
    [block] = [b for b in blocks if marker in b]
    return str(block)


@pytest.mark.timeout(240)
def test_the_docs_data_parallel_example_runs_as_written_with_an_odd_row_count(
    tmp_path: Path,
) -> None:
    # 4,099 rows on 2 nodes x 2 CPU devices: an even split per node (2,049) is not one per
    # device, and jax.make_array_from_process_local_data refuses it.
    example = _docs_example("plugins.md", "even=True")
    assert "size=(4_099, 8)" in example and "cpu_devices=2" in example and "nodes=2" in example
    script = tmp_path / "example.py"
    script.write_text(example)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=220, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "(4096, 1) True"


# ── what a jax pool prints ───────────────────────────────────────────────────────────────

# What gloo wrote to fd 1 on two workers of a 4-node x 2-device pool, chunk by chunk as the
# forwarder read it (recorded): its pieces come one per write, two ranks' lines mixed.
_GLOO_RECORDED = [
    [
        b"[Gloo] Rank ",
        b"2 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3\n",
        b"[Gloo] Rank 2 is connected to 3 peer ranks. Expected number of connected peer ranks "
        b"is : 3\n",
        b"[Gloo] Rank ",
        b"5",
        b" is connected to ",
        b"7",
        b"[Gloo] Rank ",
        b" peer ranks. ",
        b"4",
        b"Expected number of connected peer ranks is : ",
        b" is connected to ",
        b"7",
        b"7",
        b" peer ranks. ",
        b"\n",
        b"Expected number of connected peer ranks is : ",
        b"7",
        b"\n",
        b"sum 8.0\n",
    ],
    [
        b"[Gloo] Rank ",
        b"7",
        b" is connected to ",
        b"7",
        b"[Gloo] Rank ",
        b" peer ranks. ",
        b"Expected number of connected peer ranks is : 7\n6 is connected to 7 peer ranks. "
        b"Expected number of connected peer ranks is : 7\n",
        b"sum 8.0\n",
    ],
    [
        b"[Gloo] Rank 4[Gloo] Rank  is connected to 57 is connected to  peer ranks. 7Expected "
        b"number of connected peer ranks is :  peer ranks. 7Expected number of connected peer "
        b"ranks is : 7\n\n",
        b"sum 8.0\n",
    ],
]


@pytest.mark.parametrize("chunks", _GLOO_RECORDED)
def test_gloos_connection_lines_are_dropped_even_when_cut_into_pieces(
    chunks: list[bytes],
) -> None:
    gloo = GlooFilter()
    assert b"".join(gloo(chunk) for chunk in chunks) == b"sum 8.0\n"


def test_the_users_own_lines_and_gloos_missing_peer_line_are_kept() -> None:
    gloo = GlooFilter()
    chunks = [
        b"12 steps\n",
        b"[Gloo] Rank 0 is connected to 2 peer ranks. Expected number of connected peer ranks "
        b"is : 3\n[Gloo] Rank 0 is NOT connected to: [3]\n",
        b"3 peer ranks are enough\n",
        b"\n",
    ]
    assert b"".join(gloo(chunk) for chunk in chunks) == (
        b"12 steps\n[Gloo] Rank 0 is NOT connected to: [3]\n3 peer ranks are enough\n\n"
    )


@sky.compute
def first_collective() -> float:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    total = float(jnp.sum(jax.device_put(jnp.ones(8), NamedSharding(mesh, P("d")))))
    print(f"node {sky.instance_info().node} has {total}")
    return total


@pytest.mark.timeout(120)
def test_a_jax_pools_first_call_prints_only_the_users_output(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with sky.ComputePool(nodes=4, plugins=[sky.plugins.jax(cpu_devices=2)], quiet=True) as pool:
        assert first_collective() @ pool == [8.0] * 4
    out, err = capfd.readouterr()
    assert sorted(out.splitlines()) == [f"[node {n}] node {n} has 8.0" for n in range(4)]
    assert "Gloo" not in err and "connected" not in err


@pytest.mark.timeout(120)
def test_verbose_shows_gloos_lines(capfd: pytest.CaptureFixture[str]) -> None:
    plugin = sky.plugins.jax(cpu_devices=1, verbose=True)
    with sky.ComputePool(nodes=2, plugins=[plugin], quiet=True) as pool:
        first_collective() @ pool
    out = capfd.readouterr().out
    assert "[node 1] [Gloo] Rank 1 is connected to 1 peer ranks" in out


@sky.compute
def announce_then_collectives_forever() -> None:
    print("in the collective loop")
    collectives_forever.local()


@pytest.mark.timeout(120)
def test_stopping_ranks_mid_collective_says_so_in_one_line_instead_of_jaxs_fatal_logs(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Ranks stopped inside a collective leave it at different moments; jax's coordination
    # service then ends the late ones with fatal errors and C++ stack traces (about 1 run in
    # 2 here). Whether or not it does, the terminal gets one line from the pool's side.
    plugin = sky.plugins.jax(cpu_devices=1, shutdown_timeout=2)
    pool = sky.ComputePool(nodes=2, plugins=[plugin], quiet=True)
    pool.start()
    try:
        running = broadcast_in_background(pool, announce_then_collectives_forever)
        seen = ""
        deadline = time.monotonic() + 60
        while seen.count("in the collective loop") < 2 and time.monotonic() < deadline:
            seen += capfd.readouterr().out
            time.sleep(0.05)
        assert seen.count("in the collective loop") == 2
    finally:
        pool.close(wait=False)
    with pytest.raises(sky.PoolClosed):
        running.result(timeout=30)
    out, err = capfd.readouterr()
    noise = [x for x in (out + err).splitlines() if x.strip() and "skyward" not in x]
    assert noise == [], noise
    [line] = [x for x in err.splitlines() if "stopping JAX in the middle of a call" in x]
    assert line.startswith("[node 0] skyward:") and "verbose=True" in line
    for log in Path(log_dir()).glob(f"{pool.name}-node*.log"):
        log.unlink()  # what jax logged while it stopped, when it did


@pytest.mark.timeout(120)
def test_a_pool_stopped_while_its_plugins_start_does_not_say_a_call_was_cut(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # JAX is up on every node, then a later plugin is still starting when the pool is
    # closed (a Ctrl-C in the start): no call ran, so none is said to be cut short.
    started = tmp_path / "started"

    @contextlib.contextmanager
    def slow_to_start(info: sky.InstanceInfo) -> Iterator[None]:
        Path(f"{started}-{info.node}").touch()
        time.sleep(60)
        yield

    plugins = [sky.plugins.jax(cpu_devices=1), sky.Plugin(name="slow", around_app=slow_to_start)]
    pool = sky.ComputePool(nodes=2, plugins=plugins, quiet=True)
    starting = ThreadPoolExecutor(1).submit(pool.start)
    wait_for_markers(*per_node(started, 2))
    pool.close(wait=False)
    with pytest.raises(sky.SkywardError):
        starting.result(timeout=60)
    out, err = capfd.readouterr()
    assert "in the middle of a call" not in out + err, err
    for log in Path(log_dir()).glob(f"{pool.name}-node*.log"):
        log.unlink()


# ── across hosts set up as workstations are ──────────────────────────────────────────────


@pytest.fixture(scope="module")
def workstations() -> Iterator[tuple[Hosts, PackageIndex]]:
    """Two SSH hosts with Debian's default /etc/hosts: each one's own name is 127.0.1.1."""
    hosts = Hosts.start(2, etc_hosts="debian-default")
    namespaces = [h.netns for h in hosts.hosts]
    our_namespaces.add(*namespaces)
    try:
        index = PackageIndex(hosts.root / "index", hosts.bridge_address)
        try:
            pins = [f"{n}=={metadata.version(n)}" for n in ("cloudpickle", "pydantic", "jax")]
            index.download([*pins, f"jaxlib=={metadata.version('jaxlib')}", "uv"], _WHEEL_CACHE)
            yield hosts, index
        finally:
            index.close()
    finally:
        hosts.close()
        our_namespaces.discard(*namespaces)
    assert not hosts.leftovers()


def _toy_and_where_my_name_points() -> tuple[float, str]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((4, 2), ("i", "j"))
    array = jax.device_put(np.arange(32).reshape((4, 8)), NamedSharding(mesh, P("i", "j")))
    return float(jnp.sum(jnp.sin(array))), socket.gethostbyname(socket.gethostname())


@pytest.mark.timeout(300)
def test_cpu_collectives_cross_hosts_whose_own_name_resolves_to_loopback(
    workstations: tuple[Hosts, PackageIndex],
) -> None:
    # gloo, left to itself, advertises what the hostname resolves to (127.0.1.1 here), and
    # the other rank's connection is refused; the plugin gives it the pool address instead.
    hosts, index = workstations
    with sky.ComputePool(
        provider=ssh_provider(hosts),
        nodes=2,
        image=sky.Image(index_url=index.url),
        plugins=[sky.plugins.jax(cpu_devices=4)],
        quiet=True,
    ) as pool:
        results = pool.broadcast(_toy_and_where_my_name_points)
    assert results == [(-0.12398731708526611, "127.0.1.1")] * 2


@pytest.mark.timeout(300)
def test_a_node_named_by_a_hostname_that_is_loopback_on_itself_listens_on_its_network_address(
    workstations: tuple[Hosts, PackageIndex],
) -> None:
    hosts, index = workstations
    h0, h1 = hosts.hosts
    head = h0.address

    def address_for_node_1_named_h1() -> str:
        info = sky.InstanceInfo(
            node=1, total_nodes=2, head_addr=head, head_port=1234, peers=(head, "h1"), hostname="h1"
        )
        return collectives_address(info)

    with sky.ComputePool(
        provider=ssh_provider(hosts, h1.target), image=sky.Image(index_url=index.url), quiet=True
    ) as pool:
        assert pool.run(address_for_node_1_named_h1) == h1.address


def test_a_node_with_an_efa_device_gets_libfabrics_efa_settings(tmp_path: Path) -> None:
    from skyward.plugins._jax import efa_environment

    assert efa_environment(str(tmp_path)) == {}  # no RDMA devices at all
    device = tmp_path / "class" / "infiniband" / "mlx5_0" / "device"
    device.mkdir(parents=True)
    (tmp_path / "bus" / "mlx5_core").mkdir(parents=True)
    (device / "driver").symlink_to(tmp_path / "bus" / "mlx5_core")
    assert efa_environment(str(tmp_path)) == {}  # an RDMA device, not EFA
    efa = tmp_path / "class" / "infiniband" / "rdmap16s27" / "device"
    efa.mkdir(parents=True)
    (tmp_path / "bus" / "efa").mkdir()
    (efa / "driver").symlink_to(tmp_path / "bus" / "efa")
    assert efa_environment(str(tmp_path)) == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}


def test_jaxs_stop_logs_follow_the_nodes_xdg_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from skyward.plugins._jax_output import stop_log_path

    info = sky.InstanceInfo(
        node=1, total_nodes=2, head_addr="127.0.0.1", head_port=1, peers=("a", "b"),
        hostname="h", pool="p",
    )  # fmt: skip
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert stop_log_path(info) == str(tmp_path / "cache" / "skyward" / "jax-logs" / "p-node1.log")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert stop_log_path(info).startswith(str(tmp_path / "home" / ".cache" / "skyward"))
