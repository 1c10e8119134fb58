"""``pool.profile(directory)``: a jax.profiler trace of every node lands on the client."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import skyward as sky


@sky.compute
def step() -> float:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))

    def sine_sum(v: jax.Array) -> jax.Array:
        return jnp.sum(jnp.sin(v))

    return float(jax.jit(sine_sum)(x))


@pytest.mark.timeout(180)
def test_profile_leaves_one_trace_per_node_on_the_client(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    plugins = [sky.plugins.jax(cpu_devices=2)]
    with sky.ComputePool(nodes=2, plugins=plugins, quiet=True) as pool:
        with pool.profile(traces) as profile:
            results = step() @ pool
        assert results[0] == results[1]
        after = pool.broadcast(
            lambda: __import__("skyward.worker.profile").worker.profile._trace_dir
        )
    assert after == [None, None]  # tracing stopped, the nodes' own copies deleted
    assert sorted(profile.files) == [0, 1]
    for node in (0, 1):
        files = {p.name: p for p in profile.files[node]}
        [xplane] = [p for name, p in files.items() if name.endswith(".xplane.pb")]
        assert xplane.is_relative_to(traces / f"node-{node}" / "plugins" / "profile")
        assert xplane.stat().st_size > 0
        trace = json.loads(gzip.decompress(files["perfetto_trace.json.gz"].read_bytes()))
        names = {event.get("name", "") for event in trace["traceEvents"]}
        # the call made inside the block is in it: its jitted function ran on both devices
        runs = [n for n in names if "Execute" in n and "jit_sine_sum" in n]
        assert len(runs) >= 2, sorted(n for n in names if "jit" in n)


@pytest.mark.timeout(120)
def test_a_pool_without_jax_profiles_nothing_and_says_why(tmp_path: Path) -> None:
    with sky.ComputePool(nodes=1, quiet=True) as pool:
        blocked = pool.run(lambda: __import__("sys").modules.setdefault("jax", None))
        assert blocked is None
        with pytest.raises(ImportError):
            with pool.profile(tmp_path):
                pass
    assert not list(tmp_path.iterdir())
